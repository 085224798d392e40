//! [`Group`] and [`Communicator`]: the Rust API.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use inc_ctrl_proto::HostEndpoint;
use inccl_engine::{CollectiveKind, CollectiveSpec};
use tracing::info;

use crate::bootstrap::{Bootstrap, Phase};
use crate::config::{CommConfig, GroupConfig};
use crate::error::{Error, Result};
use crate::iface::{self, DataPlane};
use crate::request::{elements, Core, Plan, Progress, RawBuf, RawBufMut, RawBufs, UnscopedRequest};
use crate::transport;
use crate::types::{DataType, Element, ReduceOp};

#[derive(Debug)]
pub(crate) struct GroupShared {
    rank: u16,
    world_size: u16,
    group_id: u64,
    data_plane: DataPlane,
    boot: Mutex<Bootstrap>,
    /// Communicators are numbered in creation order, which must be the same on every rank.
    next_tag: AtomicU32,
}

impl GroupShared {
    pub(crate) fn boot(&self) -> MutexGuard<'_, Bootstrap> {
        // A panic while holding the lock leaves the bootstrap in a consistent state
        // (every step is a complete message exchange), so poisoning is ignored.
        self.boot.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A set of ranks that know each other (the seed's `inccl_group`).
///
/// Creation is collective: every rank calls [`Group::create`] with the same world size
/// and master address. Rank 0 listens on the master address and talks to the controller.
#[derive(Debug)]
pub struct Group {
    shared: Arc<GroupShared>,
}

impl Group {
    /// Create a group with the `INCCL_*` environment applied (see [`crate::config`]).
    pub fn new(world_size: u16, rank: u16, master_addr: &str) -> Result<Group> {
        Group::create(GroupConfig::from_env(world_size, rank, master_addr)?)
    }

    /// Create a group from an explicit configuration (no environment is read).
    pub fn create(cfg: GroupConfig) -> Result<Group> {
        cfg.validate()?;
        let data_plane = iface::resolve(&cfg)?;
        info!(rank = cfg.rank, ip = %data_plane.ip, iface = ?data_plane.iface, "data plane");
        let boot = Bootstrap::create(&cfg, data_plane.ip)?;
        Ok(Group {
            shared: Arc::new(GroupShared {
                rank: boot.rank(),
                world_size: boot.world_size(),
                group_id: boot.group_id(),
                data_plane,
                boot: Mutex::new(boot),
                next_tag: AtomicU32::new(0),
            }),
        })
    }

    /// This process's rank.
    pub fn rank(&self) -> u16 {
        self.shared.rank
    }

    /// Number of ranks.
    pub fn world_size(&self) -> u16 {
        self.shared.world_size
    }

    /// Controller-assigned group id.
    pub fn group_id(&self) -> u64 {
        self.shared.group_id
    }

    /// Data-plane address of this rank.
    pub fn data_plane(&self) -> &DataPlane {
        &self.shared.data_plane
    }

    /// Create a communicator (collective: every rank, same order). `INCCL_TRANSPORT`,
    /// if set, overrides `cfg.transport`; the other fields are as given (use
    /// [`CommConfig::from_env`] for the other environment overrides).
    pub fn communicator(&self, mut cfg: CommConfig) -> Result<Communicator> {
        if let Some(t) = crate::config::transport_override()? {
            cfg.transport = t;
        }
        let sh = &self.shared;
        let tag = sh.next_tag.fetch_add(1, Ordering::Relaxed);
        let mut transport = transport::open(&cfg, &sh.data_plane, sh.rank)?;
        let mut boot = sh.boot();
        let endpoint =
            boot.create_communicator(tag, transport.local_endpoint(), cfg.mtu, cfg.window)?;
        transport.connect(&endpoint, sh.world_size)?;
        boot.barrier(tag, Phase::QpUp)?;
        drop(boot);
        info!(
            rank = sh.rank,
            comm_id = endpoint.comm_id,
            switch = endpoint.switch_id,
            switch_ip = %endpoint.switch_ip,
            mtu = endpoint.mtu,
            window = endpoint.window,
            transport = ?cfg.transport,
            "communicator ready"
        );
        let core = Core {
            rank: sh.rank,
            world_size: sh.world_size,
            transport,
            failed: None,
            group: sh.clone(),
        };
        Ok(Communicator { group: sh.clone(), tag, endpoint, progress: Progress::new(core) })
    }

    /// Destroy the group (rank 0 removes it and its communicators from the controller).
    pub fn destroy(self) -> Result<()> {
        self.shared.boot().destroy()
    }
}

/// One communicator: a QP to the leaf switch and the collectives over it.
///
/// Blocking calls take `&mut self`; non-blocking ones are started inside
/// [`Communicator::scope`], which waits for all of them before it returns.
#[derive(Debug)]
pub struct Communicator {
    group: Arc<GroupShared>,
    tag: u32,
    endpoint: HostEndpoint,
    progress: Progress,
}

/// Where a collective's result goes: a separate buffer or the input's own.
pub(crate) enum Out {
    Separate(RawBuf, RawBufMut),
    InPlace(RawBufMut),
}

impl Out {
    pub(crate) fn separate(src: &[u8], dst: &mut [u8]) -> Out {
        Out::Separate(RawBuf::new(src), RawBufMut::new(dst))
    }

    pub(crate) fn in_place(buf: &mut [u8]) -> Out {
        Out::InPlace(RawBufMut::new(buf))
    }
}

impl Communicator {
    /// This process's rank.
    pub fn rank(&self) -> u16 {
        self.group.rank
    }

    /// Number of ranks.
    pub fn world_size(&self) -> u16 {
        self.group.world_size
    }

    /// Controller-assigned communicator id.
    pub fn comm_id(&self) -> u32 {
        self.endpoint.comm_id
    }

    /// Connection parameters of this rank's QP (switch, QPNs, MTU, window).
    pub fn endpoint(&self) -> &HostEndpoint {
        &self.endpoint
    }

    /// AllReduce of `src` into `dst` (same length).
    pub fn allreduce<T: Element>(&mut self, src: &[T], dst: &mut [T], op: ReduceOp) -> Result<()> {
        self.allreduce_bytes(bytemuck::cast_slice(src), bytemuck::cast_slice_mut(dst), T::DTYPE, op)
    }

    /// In-place AllReduce.
    pub fn allreduce_in_place<T: Element>(&mut self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        self.allreduce_bytes_in_place(bytemuck::cast_slice_mut(buf), T::DTYPE, op)
    }

    /// Reduce to `root`: `dst` is written on the root only (pass an empty slice elsewhere).
    pub fn reduce<T: Element>(
        &mut self,
        src: &[T],
        dst: &mut [T],
        op: ReduceOp,
        root: u16,
    ) -> Result<()> {
        self.reduce_bytes(
            bytemuck::cast_slice(src),
            bytemuck::cast_slice_mut(dst),
            T::DTYPE,
            op,
            root,
        )
    }

    /// Broadcast `buf` from `root` to every rank.
    pub fn broadcast<T: Element>(&mut self, buf: &mut [T], root: u16) -> Result<()> {
        self.broadcast_bytes(bytemuck::cast_slice_mut(buf), T::DTYPE, root)
    }

    /// ReduceScatter: `src` holds `world_size` blocks of `dst.len()` elements; `dst`
    /// receives the reduction of block `rank` (MPI's `Reduce_scatter_block`).
    pub fn reduce_scatter<T: Element>(
        &mut self,
        src: &[T],
        dst: &mut [T],
        op: ReduceOp,
    ) -> Result<()> {
        self.reduce_scatter_bytes(
            bytemuck::cast_slice(src),
            bytemuck::cast_slice_mut(dst),
            T::DTYPE,
            op,
        )
    }

    /// In-place ReduceScatter: `buf` holds `world_size` blocks; block `rank` receives
    /// its reduction, the other blocks are left as they were.
    pub fn reduce_scatter_in_place<T: Element>(
        &mut self,
        buf: &mut [T],
        op: ReduceOp,
    ) -> Result<()> {
        self.reduce_scatter_bytes_in_place(bytemuck::cast_slice_mut(buf), T::DTYPE, op)
    }

    /// AllGather: `dst` (`world_size` blocks of `src.len()` elements) receives block
    /// `r` from rank `r`.
    pub fn allgather<T: Element>(&mut self, src: &[T], dst: &mut [T]) -> Result<()> {
        self.allgather_bytes(bytemuck::cast_slice(src), bytemuck::cast_slice_mut(dst), T::DTYPE)
    }

    /// In-place AllGather: `buf` holds `world_size` blocks, this rank's block filled.
    pub fn allgather_in_place<T: Element>(&mut self, buf: &mut [T]) -> Result<()> {
        self.allgather_bytes_in_place(bytemuck::cast_slice_mut(buf), T::DTYPE)
    }

    /// Barrier through the switches.
    pub fn barrier(&mut self) -> Result<()> {
        let plan = self.plan_barrier();
        self.run(plan)
    }

    /// AllReduce on native-endian byte buffers of `dtype` elements.
    pub fn allreduce_bytes(
        &mut self,
        src: &[u8],
        dst: &mut [u8],
        dtype: DataType,
        op: ReduceOp,
    ) -> Result<()> {
        let plan = self.plan_allreduce(Out::separate(src, dst), dtype, op)?;
        self.run(plan)
    }

    /// In-place AllReduce on a native-endian byte buffer.
    pub fn allreduce_bytes_in_place(
        &mut self,
        buf: &mut [u8],
        dtype: DataType,
        op: ReduceOp,
    ) -> Result<()> {
        let plan = self.plan_allreduce(Out::in_place(buf), dtype, op)?;
        self.run(plan)
    }

    /// Reduce on byte buffers; `dst` is used on the root only.
    pub fn reduce_bytes(
        &mut self,
        src: &[u8],
        dst: &mut [u8],
        dtype: DataType,
        op: ReduceOp,
        root: u16,
    ) -> Result<()> {
        let plan = self.plan_reduce(Out::separate(src, dst), dtype, op, root)?;
        self.run(plan)
    }

    /// In-place Reduce on the root (`buf` is both input and result there).
    pub fn reduce_bytes_in_place(
        &mut self,
        buf: &mut [u8],
        dtype: DataType,
        op: ReduceOp,
        root: u16,
    ) -> Result<()> {
        let plan = self.plan_reduce(Out::in_place(buf), dtype, op, root)?;
        self.run(plan)
    }

    /// Broadcast on a byte buffer.
    pub fn broadcast_bytes(&mut self, buf: &mut [u8], dtype: DataType, root: u16) -> Result<()> {
        let plan = self.plan_broadcast(RawBufMut::new(buf), dtype, root)?;
        self.run(plan)
    }

    /// ReduceScatter on byte buffers (`src` = `world_size` blocks of `dst.len()` bytes).
    pub fn reduce_scatter_bytes(
        &mut self,
        src: &[u8],
        dst: &mut [u8],
        dtype: DataType,
        op: ReduceOp,
    ) -> Result<()> {
        let plan = self.plan_reduce_scatter(Out::separate(src, dst), dtype, op)?;
        self.run(plan)
    }

    /// In-place ReduceScatter on a byte buffer of `world_size` blocks.
    pub fn reduce_scatter_bytes_in_place(
        &mut self,
        buf: &mut [u8],
        dtype: DataType,
        op: ReduceOp,
    ) -> Result<()> {
        let plan = self.plan_reduce_scatter(Out::in_place(buf), dtype, op)?;
        self.run(plan)
    }

    /// AllGather on byte buffers (`dst` = `world_size` blocks of `src.len()` bytes).
    pub fn allgather_bytes(&mut self, src: &[u8], dst: &mut [u8], dtype: DataType) -> Result<()> {
        let plan = self.plan_allgather(Out::separate(src, dst), dtype)?;
        self.run(plan)
    }

    /// In-place AllGather on a byte buffer of `world_size` blocks.
    pub fn allgather_bytes_in_place(&mut self, buf: &mut [u8], dtype: DataType) -> Result<()> {
        let plan = self.plan_allgather(Out::in_place(buf), dtype)?;
        self.run(plan)
    }

    /// Runs non-blocking collectives: `f` starts them through the [`Scope`] (in the
    /// same order on every rank) and may compute meanwhile; they complete in start
    /// order, driven by this communicator's progress thread. Every request has
    /// completed when `scope` returns, so the buffers lent to them are free again; the
    /// outcome of a request not waited for is logged if it failed.
    pub fn scope<'env, R>(&'env mut self, f: impl for<'s> FnOnce(&'s Scope<'s, 'env>) -> R) -> R {
        let scope = Scope { comm: self, _env: std::marker::PhantomData };
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&scope)));
        // The requests may still use the buffers: wait for them even when `f` panicked.
        self.progress.finish_all();
        r.unwrap_or_else(|p| std::panic::resume_unwind(p))
    }

    /// Destroy the communicator (collective; rank 0 removes its rules from the
    /// switches). Fails, leaving the communicator as it was, while requests started
    /// through the C API are not all waited for.
    pub fn destroy(self) -> Result<()> {
        let held = self.progress.held();
        if held > 0 {
            return Err(Error::InvalidArgument(format!(
                "communicator {}: {held} requests are not waited for yet; wait for them \
                 before destroying it",
                self.comm_id()
            )));
        }
        let mut boot = self.group.boot();
        let barrier = boot.barrier(self.tag, Phase::Destroy);
        let removed = boot.destroy_communicator(self.endpoint.comm_id);
        barrier.and(removed)
    }

    /// Starts an AllReduce (in place when `src` is `None`) outside a [`Scope`], for
    /// language bindings.
    ///
    /// # Safety
    /// `src` and `dst` stay alive and are neither read nor written by anyone else until
    /// the request reports completion (`test` true, or `wait`/`wait_timeout` returned
    /// its outcome); dropping the request does not wait.
    pub unsafe fn iallreduce_bytes_unscoped(
        &self,
        src: Option<&[u8]>,
        dst: &mut [u8],
        dtype: DataType,
        op: ReduceOp,
    ) -> Result<UnscopedRequest> {
        let out = match src {
            Some(s) => Out::separate(s, dst),
            None => Out::in_place(dst),
        };
        let plan = self.plan_allreduce(out, dtype, op)?;
        // Safety: forwarded contract.
        let id = unsafe { self.progress.submit(plan) }?;
        Ok(UnscopedRequest { id, shared: self.progress.shared().clone() })
    }

    /// Requests started and not yet collected by a wait (a destroy is refused while
    /// there are any).
    pub fn pending_requests(&self) -> usize {
        self.progress.held()
    }

    pub(crate) fn progress(&self) -> &Progress {
        &self.progress
    }

    pub(crate) fn run(&mut self, plan: Plan) -> Result<()> {
        // Safety: the plan's buffers are borrowed by our caller for this whole call.
        unsafe { self.progress.run_now(&plan) }
    }

    /// The collective, or `InvalidArgument` naming the type and operator when `op`
    /// cannot reduce `dtype` (refused before anything is sent, the same way on every
    /// rank).
    fn spec(
        &self,
        kind: CollectiveKind,
        op: ReduceOp,
        dtype: DataType,
        count: u64,
    ) -> Result<CollectiveSpec> {
        if !matches!(kind, CollectiveKind::Broadcast { .. } | CollectiveKind::AllGather) {
            if let Some(why) = crate::types::refuse(op, dtype) {
                return Err(Error::InvalidArgument(why));
            }
        }
        Ok(CollectiveSpec { kind, op, dtype, count })
    }

    fn check_root(&self, root: u16) -> Result<()> {
        if root >= self.world_size() {
            return Err(Error::InvalidArgument(format!(
                "root rank {root} is out of range for world size {}",
                self.world_size()
            )));
        }
        Ok(())
    }

    pub(crate) fn plan_barrier(&self) -> Plan {
        let spec = CollectiveSpec {
            kind: CollectiveKind::Barrier,
            op: inc_wire::Operator::Barrier,
            dtype: inc_wire::DataType::Int32,
            count: 0,
        };
        Plan { spec, bufs: RawBufs::None, finalize: None }
    }

    pub(crate) fn plan_allreduce(&self, out: Out, dtype: DataType, op: ReduceOp) -> Result<Plan> {
        let (count, bufs, len) = match out {
            Out::Separate(src, dst) => {
                if dst.len() != src.len() {
                    return Err(Error::InvalidArgument(format!(
                        "allreduce destination holds {} bytes, source {} bytes",
                        dst.len(),
                        src.len()
                    )));
                }
                (elements(src.len(), dtype, "source")?, RawBufs::Separate { src, dst }, dst.len())
            }
            Out::InPlace(b) => (elements(b.len(), dtype, "buffer")?, RawBufs::InPlace(b), b.len()),
        };
        let spec = self.spec(CollectiveKind::AllReduce, op, dtype, count)?;
        Ok(Plan { spec, bufs, finalize: Some((op, 0..len)) })
    }

    pub(crate) fn plan_reduce(
        &self,
        out: Out,
        dtype: DataType,
        op: ReduceOp,
        root: u16,
    ) -> Result<Plan> {
        self.check_root(root)?;
        let me = self.rank() == root;
        let (count, bufs) = match out {
            Out::Separate(src, dst) => {
                if me && dst.len() != src.len() {
                    return Err(Error::InvalidArgument(format!(
                        "reduce destination on root {root} holds {} bytes, source {} bytes",
                        dst.len(),
                        src.len()
                    )));
                }
                let bufs = if me { RawBufs::Separate { src, dst } } else { RawBufs::SendOnly(src) };
                (elements(src.len(), dtype, "source")?, bufs)
            }
            Out::InPlace(b) => {
                let bufs = if me { RawBufs::InPlace(b) } else { RawBufs::SendOnly(b.as_const()) };
                (elements(b.len(), dtype, "buffer")?, bufs)
            }
        };
        let spec = self.spec(CollectiveKind::Reduce { root }, op, dtype, count)?;
        let len = count as usize * dtype.size();
        Ok(Plan { spec, bufs, finalize: me.then_some((op, 0..len)) })
    }

    pub(crate) fn plan_broadcast(
        &self,
        buf: RawBufMut,
        dtype: DataType,
        root: u16,
    ) -> Result<Plan> {
        self.check_root(root)?;
        let count = elements(buf.len(), dtype, "buffer")?;
        // The operator field of a Broadcast is not used for arithmetic.
        let spec = self.spec(CollectiveKind::Broadcast { root }, ReduceOp::Sum, dtype, count)?;
        let bufs = if self.rank() == root {
            RawBufs::SendOnly(buf.as_const())
        } else {
            RawBufs::RecvOnly(buf)
        };
        Ok(Plan { spec, bufs, finalize: None })
    }

    /// `whole` bytes as `world_size` blocks: elements per block.
    fn blocks(&self, whole: usize, dtype: DataType, what: &str) -> Result<u64> {
        let n = usize::from(self.world_size());
        if whole % (n * dtype.size()) != 0 {
            return Err(Error::InvalidArgument(format!(
                "{what} holds {whole} bytes, not {n} blocks (the world size) of whole {dtype} elements"
            )));
        }
        Ok((whole / n / dtype.size()) as u64)
    }

    pub(crate) fn plan_reduce_scatter(
        &self,
        out: Out,
        dtype: DataType,
        op: ReduceOp,
    ) -> Result<Plan> {
        let n = usize::from(self.world_size());
        let (count, bufs, result) = match out {
            Out::Separate(src, dst) => {
                let count = elements(dst.len(), dtype, "reduce-scatter destination")?;
                if src.len() != n * dst.len() {
                    return Err(Error::InvalidArgument(format!(
                        "reduce-scatter source holds {} bytes, expected {n} blocks (the world \
                         size) of the destination's {} bytes",
                        src.len(),
                        dst.len()
                    )));
                }
                (count, RawBufs::Separate { src, dst }, 0..dst.len())
            }
            Out::InPlace(b) => {
                let count = self.blocks(b.len(), dtype, "reduce-scatter buffer")?;
                let block = b.len() / n;
                let at = usize::from(self.rank()) * block;
                (count, RawBufs::InPlace(b), at..at + block)
            }
        };
        let spec = self.spec(CollectiveKind::ReduceScatter, op, dtype, count)?;
        Ok(Plan { spec, bufs, finalize: Some((op, result)) })
    }

    pub(crate) fn plan_allgather(&self, out: Out, dtype: DataType) -> Result<Plan> {
        let n = usize::from(self.world_size());
        let (count, bufs) = match out {
            Out::Separate(src, dst) => {
                let count = elements(src.len(), dtype, "allgather source")?;
                if dst.len() != n * src.len() {
                    return Err(Error::InvalidArgument(format!(
                        "allgather destination holds {} bytes, expected {n} blocks (the world \
                         size) of the source's {} bytes",
                        dst.len(),
                        src.len()
                    )));
                }
                (count, RawBufs::Separate { src, dst })
            }
            Out::InPlace(b) => {
                (self.blocks(b.len(), dtype, "allgather buffer")?, RawBufs::InPlace(b))
            }
        };
        let spec = self.spec(CollectiveKind::AllGather, ReduceOp::Sum, dtype, count)?;
        Ok(Plan { spec, bufs, finalize: None })
    }
}

/// Where non-blocking collectives are started (see [`Communicator::scope`]). Buffers
/// are lent for `'env`: the scope waits for every request before it returns.
pub struct Scope<'s, 'env: 's> {
    comm: &'s Communicator,
    _env: std::marker::PhantomData<&'env mut &'env ()>,
}

impl std::fmt::Debug for Scope<'_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scope").field("comm_id", &self.comm.comm_id()).finish()
    }
}

/// A started non-blocking collective.
#[derive(Debug)]
#[must_use = "a request's outcome is known only through wait() or test()"]
pub struct Request<'s> {
    id: u64,
    progress: &'s Progress,
}

impl Request<'_> {
    /// Whether the collective completed (its outcome is then ready for [`Self::wait`]).
    pub fn test(&self) -> Result<bool> {
        self.progress.shared().test(self.id)
    }

    /// Waits for the collective and returns its outcome.
    pub fn wait(self) -> Result<()> {
        self.progress.shared().wait(self.id)
    }
}

impl<'s, 'env> Scope<'s, 'env> {
    fn start(&self, plan: Result<Plan>) -> Result<Request<'s>> {
        let progress = self.comm.progress();
        // Safety: the plan's buffers are borrowed for 'env, and `Communicator::scope`
        // waits for every request before 'env can end.
        let id = unsafe { progress.submit(plan?) }?;
        Ok(Request { id, progress })
    }

    /// Starts an AllReduce of `src` into `dst`.
    pub fn iallreduce<T: Element>(
        &self,
        src: &'env [T],
        dst: &'env mut [T],
        op: ReduceOp,
    ) -> Result<Request<'s>> {
        let out = Out::separate(bytemuck::cast_slice(src), bytemuck::cast_slice_mut(dst));
        self.start(self.comm.plan_allreduce(out, T::DTYPE, op))
    }

    /// Starts an in-place AllReduce.
    pub fn iallreduce_in_place<T: Element>(
        &self,
        buf: &'env mut [T],
        op: ReduceOp,
    ) -> Result<Request<'s>> {
        let out = Out::in_place(bytemuck::cast_slice_mut(buf));
        self.start(self.comm.plan_allreduce(out, T::DTYPE, op))
    }

    /// Starts a Reduce to `root` (`dst` is used on the root only).
    pub fn ireduce<T: Element>(
        &self,
        src: &'env [T],
        dst: &'env mut [T],
        op: ReduceOp,
        root: u16,
    ) -> Result<Request<'s>> {
        let out = Out::separate(bytemuck::cast_slice(src), bytemuck::cast_slice_mut(dst));
        self.start(self.comm.plan_reduce(out, T::DTYPE, op, root))
    }

    /// Starts a Broadcast of `buf` from `root`.
    pub fn ibroadcast<T: Element>(&self, buf: &'env mut [T], root: u16) -> Result<Request<'s>> {
        self.start(self.comm.plan_broadcast(
            RawBufMut::new(bytemuck::cast_slice_mut(buf)),
            T::DTYPE,
            root,
        ))
    }

    /// Starts a ReduceScatter (`src` = `world_size` blocks of `dst.len()` elements).
    pub fn ireduce_scatter<T: Element>(
        &self,
        src: &'env [T],
        dst: &'env mut [T],
        op: ReduceOp,
    ) -> Result<Request<'s>> {
        let out = Out::separate(bytemuck::cast_slice(src), bytemuck::cast_slice_mut(dst));
        self.start(self.comm.plan_reduce_scatter(out, T::DTYPE, op))
    }

    /// Starts an AllGather (`dst` = `world_size` blocks of `src.len()` elements).
    pub fn iallgather<T: Element>(
        &self,
        src: &'env [T],
        dst: &'env mut [T],
    ) -> Result<Request<'s>> {
        let out = Out::separate(bytemuck::cast_slice(src), bytemuck::cast_slice_mut(dst));
        self.start(self.comm.plan_allgather(out, T::DTYPE))
    }

    /// Starts a Barrier.
    pub fn ibarrier(&self) -> Result<Request<'s>> {
        self.start(Ok(self.comm.plan_barrier()))
    }
}
