//! Non-blocking collectives: a progress thread per communicator runs the collectives
//! started on it, in start order, while the caller computes; the userspace transport
//! keeps up to [`inccl_engine::MAX_IN_FLIGHT`] of them on the wire at once.
//!
//! A collective is first checked and turned into a [`Plan`] (its spec and the caller's
//! buffers as raw pointers), then either executed at once on the caller's thread
//! (blocking calls, after every earlier request finished: one order for both) or queued
//! for the progress thread ([`Progress::submit`]). The thread is started by the first
//! non-blocking call, so programs that never use one never pay for it.
//!
//! The buffers of a queued plan belong to the library until its request completes. The
//! Rust API ([`crate::Communicator::scope`]) enforces that with lifetimes (the scope
//! waits for every request before it returns); the C API documents it.

use std::collections::{HashMap, VecDeque};
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use inccl_engine::{CollectiveKind, CollectiveSpec, OpBuffers};
use tracing::warn;

use crate::error::{Error, Result};
use crate::group::GroupShared;
use crate::transport::{Feed, Transport};
use crate::types::{DataType, ReduceOp};

/// Requests a communicator may have started and not yet had collected (queued, running
/// or completed and not waited for).
pub const MAX_PENDING: usize = 256;

/// A caller's read-only buffer, as a pointer: valid for as long as the creator of the
/// [`Plan`] holding it promised (see [`Core::execute`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct RawBuf {
    ptr: *const u8,
    len: usize,
}

/// A caller's writable buffer, as a pointer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RawBufMut {
    ptr: *mut u8,
    len: usize,
}

impl RawBuf {
    pub(crate) fn new(b: &[u8]) -> Self {
        RawBuf { ptr: b.as_ptr(), len: b.len() }
    }
    pub(crate) fn len(&self) -> usize {
        self.len
    }
    /// # Safety
    /// The buffer is alive and not written by anyone else for `'a`.
    unsafe fn get<'a>(self) -> &'a [u8] {
        if self.len == 0 {
            return &[];
        }
        // Safety: a live buffer of `len` bytes, per this function's contract.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl RawBufMut {
    pub(crate) fn new(b: &mut [u8]) -> Self {
        RawBufMut { ptr: b.as_mut_ptr(), len: b.len() }
    }
    pub(crate) fn len(&self) -> usize {
        self.len
    }
    pub(crate) fn as_const(self) -> RawBuf {
        RawBuf { ptr: self.ptr, len: self.len }
    }
    /// # Safety
    /// The buffer is alive and used by nobody else for `'a`.
    unsafe fn get<'a>(self) -> &'a mut [u8] {
        if self.len == 0 {
            return &mut [];
        }
        // Safety: a live, unshared buffer of `len` bytes, per this function's contract.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

/// [`OpBuffers`] as pointers.
#[derive(Debug, Clone, Copy)]
pub(crate) enum RawBufs {
    Separate { src: RawBuf, dst: RawBufMut },
    InPlace(RawBufMut),
    SendOnly(RawBuf),
    RecvOnly(RawBufMut),
    None,
}

/// A checked collective, ready to run.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    pub(crate) spec: CollectiveSpec,
    pub(crate) bufs: RawBufs,
    /// AVG's final divide by the world size, on this byte range of the result.
    pub(crate) finalize: Option<(ReduceOp, Range<usize>)>,
}

// Safety: a plan is only a description of the caller's buffers; whoever creates one
// promises the buffers stay valid and untouched until it has run (see `Core::execute`),
// whichever thread runs it.
unsafe impl Send for Plan {}

/// What runs a communicator's collectives: its transport and failure state.
#[derive(Debug)]
pub(crate) struct Core {
    pub(crate) rank: u16,
    pub(crate) world_size: u16,
    pub(crate) transport: Box<dyn Transport>,
    /// Set after a data-path failure: the QP state is unknown, so later calls fail fast.
    pub(crate) failed: Option<String>,
    /// The group, to name ranks that lost their bootstrap connection in failures.
    pub(crate) group: Arc<GroupShared>,
}

impl Core {
    /// Runs `plan` to completion (bounded by the transport's timeouts).
    ///
    /// # Safety
    /// The plan's buffers are alive and used by nobody else until this returns.
    pub(crate) unsafe fn execute(&mut self, plan: &Plan) -> Result<()> {
        let mut one = OnePlan { plan: Some(plan.clone()), outcome: None };
        // Safety: forwarded contract.
        unsafe { self.execute_all(&mut one) };
        one.outcome.unwrap_or_else(|| Err(Error::Unusable("collective", "it never ran".into())))
    }

    /// Runs every plan `source` hands out, in its order, several on the wire at once
    /// where the transport can, and gives each outcome back.
    ///
    /// # Safety
    /// Each plan's buffers are alive and used by nobody else from when `source` hands
    /// it out until its outcome is given back.
    unsafe fn execute_all(&mut self, source: &mut dyn PlanSource) {
        let Core { rank, world_size, transport, failed, group } = self;
        let mut feed = PlanFeed {
            rank: *rank,
            world_size: *world_size,
            failed,
            group,
            source,
            running: VecDeque::new(),
        };
        transport.run_pipelined(&mut feed);
    }
}

/// Where [`Core::execute_all`] takes plans from and leaves their outcomes.
trait PlanSource {
    /// The next plan and an id for `done`.
    fn next(&mut self) -> Option<(u64, Plan)>;
    fn done(&mut self, id: u64, r: Result<()>);
}

/// One plan, for the blocking path.
struct OnePlan {
    plan: Option<Plan>,
    outcome: Option<Result<()>>,
}

impl PlanSource for OnePlan {
    fn next(&mut self) -> Option<(u64, Plan)> {
        self.plan.take().map(|p| (0, p))
    }
    fn done(&mut self, _: u64, r: Result<()>) {
        self.outcome = Some(r);
    }
}

/// Plans turned into the transport's collectives: the buffers before (AllGather's own
/// block), the failure state and AVG's divide after.
struct PlanFeed<'c> {
    rank: u16,
    world_size: u16,
    failed: &'c mut Option<String>,
    group: &'c Arc<GroupShared>,
    source: &'c mut dyn PlanSource,
    /// Plans handed to the transport, oldest first.
    running: VecDeque<(u64, Plan)>,
}

// The buffers' lifetime is the plans' contract (see `Core::execute_all`), not one the
// compiler can see: any lifetime of the caller's choice.
impl<'p> Feed<'p> for PlanFeed<'_> {
    fn next(&mut self) -> Option<(u64, CollectiveSpec, OpBuffers<'p>)> {
        loop {
            let (id, plan) = self.source.next()?;
            if let Some(why) = &self.failed {
                self.source.done(id, Err(Error::Unusable("communicator", why.clone())));
                continue;
            }
            // Safety: alive and unshared until its outcome, per `execute_all`'s contract.
            let bufs = unsafe {
                match plan.bufs {
                    RawBufs::Separate { src, dst } => {
                        let (src, dst) = (src.get(), dst.get());
                        if plan.spec.kind == CollectiveKind::AllGather {
                            // The network never sends a rank its own block.
                            let at = usize::from(self.rank) * src.len();
                            dst[at..at + src.len()].copy_from_slice(src);
                        }
                        OpBuffers::Separate { src, dst }
                    }
                    RawBufs::InPlace(b) => OpBuffers::InPlace(b.get()),
                    RawBufs::SendOnly(b) => OpBuffers::SendOnly(b.get()),
                    RawBufs::RecvOnly(b) => OpBuffers::RecvOnly(b.get()),
                    RawBufs::None => OpBuffers::None,
                }
            };
            let spec = plan.spec;
            self.running.push_back((id, plan));
            return Some((id, spec, bufs));
        }
    }

    fn done(&mut self, id: u64, r: Result<()>) {
        let at = self.running.iter().position(|(i, _)| *i == id);
        let Some((_, plan)) = at.and_then(|at| self.running.remove(at)) else {
            return;
        };
        let r = match r {
            Ok(()) => {
                if let Some((op, range)) = &plan.finalize {
                    if let RawBufs::Separate { dst: b, .. }
                    | RawBufs::InPlace(b)
                    | RawBufs::RecvOnly(b) = plan.bufs
                    {
                        // Safety: as in `next`; the transport no longer holds the buffer.
                        let result = unsafe { b.get() };
                        inc_wire::reduce::finalize_native(
                            *op,
                            plan.spec.dtype,
                            &mut result[range.clone()],
                            self.world_size,
                        );
                    }
                }
                Ok(())
            }
            Err(Error::Collective { rank, comm_id, mut reason }) => {
                let dead = self.group.boot().dead_peers();
                if !dead.is_empty() {
                    reason.push_str(&format!(
                        "; ranks {dead:?} lost their bootstrap connection (process dead?)"
                    ));
                }
                warn!(rank, comm_id, %reason, "collective failed");
                self.failed.get_or_insert_with(|| reason.clone());
                Err(Error::Collective { rank, comm_id, reason })
            }
            Err(e) => Err(e),
        };
        self.source.done(id, r);
    }
}

/// Request ids are unique in the process (the C API hands them out as handles).
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

#[derive(Debug, Default)]
struct Queue {
    jobs: VecDeque<(u64, Plan)>,
    /// Handed to the transport, not finished.
    running: Vec<u64>,
    /// Outcomes not yet collected by `wait`.
    done: HashMap<u64, Result<()>>,
    shutdown: bool,
}

impl Queue {
    fn in_flight(&self) -> usize {
        self.jobs.len() + self.running.len()
    }
    fn is_pending(&self, id: u64) -> bool {
        self.running.contains(&id) || self.jobs.iter().any(|(j, _)| *j == id)
    }
}

/// The progress thread of one communicator and its queue.
#[derive(Debug)]
pub(crate) struct Progress {
    shared: Arc<Shared>,
    worker: Mutex<Option<JoinHandle<()>>>,
}

#[derive(Debug)]
pub(crate) struct Shared {
    core: Mutex<Core>,
    queue: Mutex<Queue>,
    changed: Condvar,
}

fn relock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section leaves the state whole, so poisoning is ignored.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Progress {
    pub(crate) fn new(core: Core) -> Self {
        Progress {
            shared: Arc::new(Shared {
                core: Mutex::new(core),
                queue: Mutex::new(Queue::default()),
                changed: Condvar::new(),
            }),
            worker: Mutex::new(None),
        }
    }

    /// Runs `plan` on the calling thread after every earlier request has finished.
    ///
    /// # Safety
    /// As [`Core::execute`].
    pub(crate) unsafe fn run_now(&self, plan: &Plan) -> Result<()> {
        self.shared.drain();
        // Safety: forwarded contract.
        unsafe { relock(&self.shared.core).execute(plan) }
    }

    /// Queues `plan` for the progress thread; returns the request id.
    ///
    /// # Safety
    /// The plan's buffers stay alive and unused by the caller until the request
    /// completes (`wait` or `test` says so).
    pub(crate) unsafe fn submit(&self, plan: Plan) -> Result<u64> {
        let mut q = relock(&self.shared.queue);
        let held = q.in_flight() + q.done.len();
        if held >= MAX_PENDING {
            return Err(Error::InvalidArgument(format!(
                "{held} requests are started and not yet waited for (at most {MAX_PENDING})"
            )));
        }
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        q.jobs.push_back((id, plan));
        drop(q);
        self.shared.changed.notify_all();
        let mut worker = relock(&self.worker);
        if worker.is_none() {
            let shared = self.shared.clone();
            let thread = std::thread::Builder::new()
                .name("inccl-progress".into())
                .spawn(move || shared.work())
                .map_err(|e| Error::io("starting the INCCL progress thread", e))?;
            *worker = Some(thread);
        }
        Ok(id)
    }

    /// The shared state, for handles that outlive a borrow of the communicator (C).
    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Requests started and not yet collected.
    pub(crate) fn held(&self) -> usize {
        let q = relock(&self.shared.queue);
        q.in_flight() + q.done.len()
    }

    /// Waits for every request, then drops the outcomes nobody collected (logged).
    pub(crate) fn finish_all(&self) {
        self.shared.drain();
        for (id, r) in relock(&self.shared.queue).done.drain() {
            if let Err(e) = r {
                warn!(request = id, "a request nobody waited for failed: {e}");
            }
        }
    }
}

impl Shared {
    fn work(&self) {
        loop {
            {
                let mut q = relock(&self.queue);
                while q.jobs.is_empty() && !q.shutdown {
                    q = self.changed.wait(q).unwrap_or_else(|p| p.into_inner());
                }
                if q.shutdown {
                    return;
                }
            }
            // Safety: `submit`'s caller keeps the buffers for us until the request is
            // reported complete, which only `QueueSource::done` does.
            unsafe { relock(&self.core).execute_all(&mut QueueSource { shared: self }) };
        }
    }

    /// Waits until nothing is queued or running.
    fn drain(&self) {
        let mut q = relock(&self.queue);
        while q.in_flight() > 0 {
            q = self.changed.wait(q).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Whether request `id` completed; an error if it is not a request of this
    /// communicator that was not collected yet.
    pub(crate) fn test(&self, id: u64) -> Result<bool> {
        let q = relock(&self.queue);
        if q.done.contains_key(&id) {
            Ok(true)
        } else if q.is_pending(id) {
            Ok(false)
        } else {
            Err(unknown(id))
        }
    }

    /// Waits for request `id` and collects its outcome (the request is gone after).
    pub(crate) fn wait(&self, id: u64) -> Result<()> {
        let mut q = relock(&self.queue);
        loop {
            if let Some(r) = q.done.remove(&id) {
                return r;
            }
            if !q.is_pending(id) {
                return Err(unknown(id));
            }
            q = self.changed.wait(q).unwrap_or_else(|p| p.into_inner());
        }
    }
}

impl Shared {
    /// Waits up to `limit` for request `id`; its outcome (collected) if it completed.
    pub(crate) fn wait_timeout(&self, id: u64, limit: std::time::Duration) -> Option<Result<()>> {
        let deadline = std::time::Instant::now() + limit;
        let mut q = relock(&self.queue);
        loop {
            if let Some(r) = q.done.remove(&id) {
                return Some(r);
            }
            if !q.is_pending(id) {
                return Some(Err(unknown(id)));
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return None;
            }
            q = self.changed.wait_timeout(q, left).unwrap_or_else(|p| p.into_inner()).0;
        }
    }
}

/// The progress thread's plans: the queue's requests in start order, taken while the
/// transport has room for them, so later ones join the collectives on the wire.
struct QueueSource<'s> {
    shared: &'s Shared,
}

impl PlanSource for QueueSource<'_> {
    fn next(&mut self) -> Option<(u64, Plan)> {
        let mut q = relock(&self.shared.queue);
        if q.shutdown {
            return None;
        }
        let (id, plan) = q.jobs.pop_front()?;
        q.running.push(id);
        Some((id, plan))
    }

    fn done(&mut self, id: u64, r: Result<()>) {
        let mut q = relock(&self.shared.queue);
        q.running.retain(|r| *r != id);
        q.done.insert(id, r);
        drop(q);
        self.shared.changed.notify_all();
    }
}

/// A request started outside a [`crate::Scope`], for language bindings that keep the
/// buffers alive themselves (see [`crate::Communicator::iallreduce_bytes_unscoped`]).
#[derive(Debug)]
pub struct UnscopedRequest {
    pub(crate) id: u64,
    pub(crate) shared: Arc<Shared>,
}

impl UnscopedRequest {
    /// Whether the collective completed.
    pub fn test(&self) -> Result<bool> {
        self.shared.test(self.id)
    }

    /// Waits at most `limit`; the outcome once it completed (then the request is
    /// collected: later calls report it as unknown).
    pub fn wait_timeout(&self, limit: std::time::Duration) -> Option<Result<()>> {
        self.shared.wait_timeout(self.id, limit)
    }

    /// Waits and returns the outcome.
    pub fn wait(self) -> Result<()> {
        self.shared.wait(self.id)
    }
}

fn unknown(id: u64) -> Error {
    Error::InvalidArgument(format!("request {id} was already waited for, or never started"))
}

impl Drop for Progress {
    fn drop(&mut self) {
        let mut q = relock(&self.shared.queue);
        q.shutdown = true;
        // Requests that never ran fail, so nobody waits for them forever.
        while let Some((id, _)) = q.jobs.pop_front() {
            let why = "its communicator was dropped before it ran".to_string();
            q.done.insert(id, Err(Error::Unusable("request", why)));
        }
        drop(q);
        self.shared.changed.notify_all();
        if let Some(t) = relock(&self.worker).take() {
            // The thread finishes the collective it runs (bounded by the transport's
            // timeouts) and leaves the rest.
            let _ = t.join();
        }
    }
}

/// Element count of a native buffer of `len` bytes; errors if it is not a whole number
/// of elements.
pub(crate) fn elements(len: usize, dtype: DataType, what: &str) -> Result<u64> {
    if len % dtype.size() != 0 {
        return Err(Error::InvalidArgument(format!(
            "{what} length {len} bytes is not a multiple of the {dtype} element size {}",
            dtype.size()
        )));
    }
    Ok((len / dtype.size()) as u64)
}
