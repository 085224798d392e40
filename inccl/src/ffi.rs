//! C ABI (`include/inccl.h`). Every entry point catches panics, validates its
//! arguments, and reports failures as a negative return value (or NULL) with the
//! message in the calling thread's [`inccl_last_error`]. No function aborts the
//! process on a user error.
//!
//! A group or communicator must not be used from two threads at once; `inccl_test` and
//! `inccl_wait` may be called from any thread.
#![allow(non_camel_case_types)]

use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Once;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::config::{CommConfig, GroupConfig};
use crate::error::{Error, Result};
use crate::group::Out;
use crate::group::{Communicator, Group};
use crate::request::{Plan, RawBufMut, Shared};
use crate::types::{DataType, ReduceOp};

/// Opaque group handle.
#[derive(Debug)]
pub struct inccl_group(Group);

/// Opaque communicator handle.
#[derive(Debug)]
pub struct inccl_communicator(Communicator);

/// Return codes (`INCCL_E*` in the header).
pub const INCCL_OK: c_int = 0;
const E_INVALID: c_int = -1;
const E_CONFIG: c_int = -2;
const E_TIMEOUT: c_int = -3;
const E_PEER: c_int = -4;
const E_CONTROLLER: c_int = -5;
const E_IO: c_int = -6;
const E_COLLECTIVE: c_int = -7;
const E_UNAVAILABLE: c_int = -8;
const E_UNUSABLE: c_int = -9;
const E_INTERNAL: c_int = -10;

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_last_error(msg: &str) {
    let c = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = c);
}

fn code(e: &Error) -> c_int {
    match e {
        Error::InvalidArgument(_) => E_INVALID,
        Error::Config(_) => E_CONFIG,
        Error::Timeout { .. } => E_TIMEOUT,
        Error::Peer { .. } | Error::Aborted { .. } => E_PEER,
        Error::Controller { .. } => E_CONTROLLER,
        Error::Io { .. } => E_IO,
        Error::Collective { .. } => E_COLLECTIVE,
        Error::TransportUnavailable(_) => E_UNAVAILABLE,
        Error::Unusable(..) => E_UNUSABLE,
    }
}

/// `INCCL_LOG=<filter>` (e.g. `info`, `inccl=debug`) logs to stderr from C programs.
fn init_logging() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| inc_log::init_if_set("INCCL_LOG"));
}

/// Run `f`, turning errors and panics into `on_err` plus the thread's last error.
fn guard<T>(on_err: impl Fn(c_int) -> T, f: impl FnOnce() -> Result<T>) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "inccl call failed");
            set_last_error(&e.to_string());
            on_err(code(&e))
        }
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            set_last_error(&format!("internal error (bug in INCCL): {what}"));
            on_err(E_INTERNAL)
        }
    }
}

fn int_code(r: Result<()>) -> Result<c_int> {
    r.map(|()| INCCL_OK)
}

fn arg_str(p: *const c_char, what: &str) -> Result<String> {
    if p.is_null() {
        return Err(Error::InvalidArgument(format!("{what} is NULL")));
    }
    // Safety: the caller passes a NUL-terminated string (checked non-NULL above) that
    // stays valid for the call, as the header documents.
    let s = unsafe { CStr::from_ptr(p) };
    s.to_str()
        .map(str::to_string)
        .map_err(|_| Error::InvalidArgument(format!("{what} is not valid UTF-8")))
}

fn arg_u16(v: c_int, what: &str) -> Result<u16> {
    u16::try_from(v).map_err(|_| Error::InvalidArgument(format!("{what} {v} is out of range")))
}

/// The C enum values are the codes of the `inc-wire` tables.
fn dtype(v: c_int) -> Result<DataType> {
    u8::try_from(v).ok().and_then(DataType::from_code).ok_or_else(|| {
        let valid: Vec<String> = DataType::ALL
            .iter()
            .map(|d| format!("INCCL_{} ({})", d.name().to_uppercase(), d.code()))
            .collect();
        Error::InvalidArgument(format!("datatype {v} is not one of {}", valid.join(", ")))
    })
}

fn op(v: c_int) -> Result<ReduceOp> {
    u8::try_from(v)
        .ok()
        .and_then(ReduceOp::from_code)
        .filter(|o| *o != ReduceOp::Barrier)
        .ok_or_else(|| {
            let valid: Vec<String> = ReduceOp::reductions()
                .map(|o| format!("INCCL_{} ({})", o.name().to_uppercase(), o.code()))
                .collect();
            Error::InvalidArgument(format!("operator {v} is not one of {}", valid.join(", ")))
        })
}

fn byte_len(count: usize, dt: DataType, what: &str) -> Result<usize> {
    count
        .checked_mul(dt.size())
        .filter(|n| *n <= isize::MAX as usize)
        .ok_or_else(|| Error::InvalidArgument(format!("{what}: count {count} is too large")))
}

/// Borrow a C buffer of `len` bytes read-only.
///
/// Safety: `p` must be NULL only if `len` is 0, otherwise valid for reads of `len`
/// bytes for the call, not written through another pointer meanwhile.
unsafe fn buf_ref<'a>(p: *const c_void, len: usize, what: &str) -> Result<&'a [u8]> {
    if len == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(Error::InvalidArgument(format!("{what} is NULL")));
    }
    // Safety: guaranteed by the caller (see above).
    Ok(unsafe { std::slice::from_raw_parts(p.cast::<u8>(), len) })
}

/// Borrow a C buffer of `len` bytes mutably.
///
/// Safety: as [`buf_ref`], and not accessed through any other pointer for the call.
unsafe fn buf_mut<'a>(p: *mut c_void, len: usize, what: &str) -> Result<&'a mut [u8]> {
    if len == 0 {
        return Ok(&mut []);
    }
    if p.is_null() {
        return Err(Error::InvalidArgument(format!("{what} is NULL")));
    }
    // Safety: guaranteed by the caller (see above).
    Ok(unsafe { std::slice::from_raw_parts_mut(p.cast::<u8>(), len) })
}

/// Whether `a_len` bytes at `a` and `b_len` bytes at `b` share a byte.
fn overlap(a: *const c_void, a_len: usize, b: *const c_void, b_len: usize) -> bool {
    let (a, b) = (a as usize, b as usize);
    a_len > 0 && b_len > 0 && a < b.wrapping_add(b_len) && b < a.wrapping_add(a_len)
}

/// Handle to a communicator; errors if NULL.
///
/// Safety: `comm` is NULL or a live pointer from `inccl_communicator_create`.
unsafe fn comm_mut<'a>(comm: *mut inccl_communicator) -> Result<&'a mut Communicator> {
    // Safety: guaranteed by the caller (see above).
    unsafe { comm.as_mut() }
        .map(|c| &mut c.0)
        .ok_or_else(|| Error::InvalidArgument("communicator is NULL".into()))
}

/// Handle to a group; errors if NULL.
///
/// Safety: `group` is NULL or a live pointer from `inccl_group_create*`.
unsafe fn group_ref<'a>(group: *const inccl_group) -> Result<&'a Group> {
    // Safety: guaranteed by the caller (see above).
    unsafe { group.as_ref() }
        .map(|g| &g.0)
        .ok_or_else(|| Error::InvalidArgument("group is NULL".into()))
}

/// Takes back ownership of a handle for destruction; errors if NULL.
///
/// Safety: `handle` is NULL or a pointer created by `Box::into_raw` and not taken back
/// before.
unsafe fn take_handle<T>(handle: *mut T, what: &str) -> Result<Box<T>> {
    if handle.is_null() {
        return Err(Error::InvalidArgument(format!("{what} is NULL")));
    }
    // Safety: guaranteed by the caller (see above); ownership returns from the pointer
    // created by `Box::into_raw`.
    Ok(unsafe { Box::from_raw(handle) })
}

fn create_group(
    world_size: c_int,
    rank: c_int,
    master_addr: *const c_char,
    controller: *const c_char,
) -> Result<*mut inccl_group> {
    init_logging();
    let ws = arg_u16(world_size, "world size")?;
    let rank = arg_u16(rank, "rank")?;
    let master = arg_str(master_addr, "master address")?;
    let mut cfg = GroupConfig::from_env(ws, rank, master)?;
    if !controller.is_null() {
        cfg.controller = Some(arg_str(controller, "controller address")?);
    }
    Ok(Box::into_raw(Box::new(inccl_group(Group::create(cfg)?))))
}

/// Create a group (collective). The controller address comes from `INCCL_CONTROLLER`.
/// Returns NULL on error.
#[no_mangle]
pub extern "C" fn inccl_group_create(
    world_size: c_int,
    rank: c_int,
    master_addr: *const c_char,
) -> *mut inccl_group {
    guard(
        |_| std::ptr::null_mut(),
        || create_group(world_size, rank, master_addr, std::ptr::null()),
    )
}

/// Create a group with an explicit controller address (`host:port`; NULL = environment).
#[no_mangle]
pub extern "C" fn inccl_group_create_with_controller(
    world_size: c_int,
    rank: c_int,
    master_addr: *const c_char,
    controller_addr: *const c_char,
) -> *mut inccl_group {
    guard(|_| std::ptr::null_mut(), || create_group(world_size, rank, master_addr, controller_addr))
}

/// Destroy a group. The handle is freed even when an error is returned.
///
/// # Safety
/// `group` is NULL or a pointer from `inccl_group_create*` not destroyed before.
#[no_mangle]
pub unsafe extern "C" fn inccl_group_destroy(group: *mut inccl_group) -> c_int {
    guard(
        |c| c,
        || {
            // Safety: NULL or from `inccl_group_create*` (`Box::into_raw`) and not
            // destroyed before, per the contract above.
            let g = unsafe { take_handle(group, "group") }?;
            int_code(g.0.destroy())
        },
    )
}

/// Rank of this process in the group, or a negative error code.
///
/// # Safety
/// `group` is NULL or a live group pointer.
#[no_mangle]
pub unsafe extern "C" fn inccl_group_rank(group: *const inccl_group) -> c_int {
    guard(
        |c| c,
        || {
            // Safety: NULL or live, per the contract above.
            let g = unsafe { group_ref(group) }?;
            Ok(c_int::from(g.rank()))
        },
    )
}

/// World size of the group, or a negative error code.
///
/// # Safety
/// `group` is NULL or a live group pointer.
#[no_mangle]
pub unsafe extern "C" fn inccl_group_world_size(group: *const inccl_group) -> c_int {
    guard(
        |c| c,
        || {
            // Safety: NULL or live, per the contract above.
            let g = unsafe { group_ref(group) }?;
            Ok(c_int::from(g.world_size()))
        },
    )
}

/// Create a communicator (collective). `size_bytes` is a buffer-sizing hint, not a
/// limit. Returns NULL on error.
///
/// # Safety
/// `group` is NULL or a live group pointer.
#[no_mangle]
pub unsafe extern "C" fn inccl_communicator_create(
    group: *mut inccl_group,
    size_bytes: u32,
) -> *mut inccl_communicator {
    guard(
        |_| std::ptr::null_mut(),
        || {
            // Safety: NULL or live, per the contract above.
            let g = unsafe { group_ref(group) }?;
            let comm = g.communicator(CommConfig::from_env(u64::from(size_bytes))?)?;
            Ok(Box::into_raw(Box::new(inccl_communicator(comm))))
        },
    )
}

/// Destroy a communicator (collective). Refused (INCCL_EINVAL, the handle stays valid)
/// while requests are not waited for; otherwise the handle is freed even on error.
///
/// # Safety
/// `comm` is NULL or a pointer from `inccl_communicator_create` not destroyed before.
#[no_mangle]
pub unsafe extern "C" fn inccl_communicator_destroy(comm: *mut inccl_communicator) -> c_int {
    guard(
        |c| c,
        || {
            // Safety: NULL or live, per the contract above.
            let held = unsafe { comm_mut(comm) }?.progress().held();
            if held > 0 {
                return Err(Error::InvalidArgument(format!(
                    "{held} requests of this communicator are not waited for yet; \
                     inccl_wait them before destroying it"
                )));
            }
            // Safety: NULL or from `inccl_communicator_create` (`Box::into_raw`) and not
            // destroyed before, per the contract above.
            let c = unsafe { take_handle(comm, "communicator") }?;
            int_code(c.0.destroy())
        },
    )
}

/// Opaque request handle of a non-blocking collective. Its address is the request's
/// id, never dereferenced: a stale or made-up handle is an error, not a crash.
#[derive(Debug)]
pub struct inccl_request {
    _opaque: [u8; 0],
}

/// Live requests of the C API: id -> the progress state of their communicator.
static REQUESTS: Mutex<Option<HashMap<u64, Arc<Shared>>>> = Mutex::new(None);

fn requests() -> std::sync::MutexGuard<'static, Option<HashMap<u64, Arc<Shared>>>> {
    REQUESTS.lock().unwrap_or_else(|p| p.into_inner())
}

/// Runs a planned collective now (blocking call).
///
/// Safety: `comm` is NULL or live; `plan` builds a plan from buffers valid for the call.
unsafe fn blocking(
    comm: *mut inccl_communicator,
    plan: impl FnOnce(&Communicator) -> Result<Plan>,
) -> c_int {
    guard(
        |c| c,
        || {
            // Safety: NULL or live, per the contract above.
            let c = unsafe { comm_mut(comm) }?;
            let plan = plan(c)?;
            int_code(c.run(plan))
        },
    )
}

/// Starts a planned collective and stores its request in `*req`.
///
/// Safety: `comm` is NULL or live; `plan` builds a plan from buffers valid until the
/// request completes; `req` is NULL or writable.
unsafe fn start(
    comm: *mut inccl_communicator,
    req: *mut *mut inccl_request,
    plan: impl FnOnce(&Communicator) -> Result<Plan>,
) -> c_int {
    guard(
        |c| c,
        || {
            if req.is_null() {
                return Err(Error::InvalidArgument("request pointer is NULL".into()));
            }
            // Safety: NULL or live, per the contract above.
            let c = unsafe { comm_mut(comm) }?;
            let plan = plan(c)?;
            // Safety: the header makes the buffers the library's until the request
            // completes.
            let id = unsafe { c.progress().submit(plan) }?;
            requests().get_or_insert_with(HashMap::new).insert(id, c.progress().shared().clone());
            // Safety: `req` is writable (checked non-NULL above), per the contract.
            unsafe { *req = id as usize as *mut inccl_request };
            Ok(INCCL_OK)
        },
    )
}

/// The request behind a handle, if it is live.
fn request(req: *mut inccl_request) -> Result<(u64, Arc<Shared>)> {
    let id = req as usize as u64;
    if req.is_null() {
        return Err(Error::InvalidArgument("request is NULL".into()));
    }
    let live = requests().as_ref().and_then(|m| m.get(&id).cloned());
    live.map(|s| (id, s)).ok_or_else(|| {
        Error::InvalidArgument(format!(
            "request {id:#x} is not live (already waited for, or never started)"
        ))
    })
}

/// `src` and `dst` as the buffers of a collective: the same pointer is in place.
///
/// Safety: `src` holds `src_len` and `dst` `dst_len` bytes, valid for as long as the
/// plan built from them runs.
unsafe fn src_dst(
    what: &str,
    src: *const c_void,
    src_len: usize,
    dst: *mut c_void,
    dst_len: usize,
    in_place: bool,
) -> Result<Out> {
    if in_place {
        // Safety: the in-place buffer holds the larger of the two lengths, per the
        // contract above.
        let b = unsafe { buf_mut(dst, src_len.max(dst_len), &format!("{what} buffer")) }?;
        return Ok(Out::in_place(b));
    }
    if overlap(src, src_len, dst, dst_len) {
        return Err(Error::InvalidArgument(format!(
            "{what} src and dst overlap without being the in-place layout"
        )));
    }
    // Safety: disjoint buffers (checked above) of these lengths, per the contract.
    let (s, d) = unsafe {
        (
            buf_ref(src, src_len, &format!("{what} src"))?,
            buf_mut(dst, dst_len, &format!("{what} dst"))?,
        )
    };
    Ok(Out::separate(s, d))
}

/// Safety: as [`inccl_allreduce`].
unsafe fn plan_allreduce(
    c: &Communicator,
    src: *const c_void,
    dst: *mut c_void,
    count: usize,
    dtype: c_int,
    op_: c_int,
) -> Result<Plan> {
    let (dt, op) = (self::dtype(dtype)?, op(op_)?);
    let len = byte_len(count, dt, "allreduce")?;
    // Safety: forwarded contract.
    let out = unsafe { src_dst("allreduce", src, len, dst, len, std::ptr::eq(src, dst)) }?;
    c.plan_allreduce(out, dt, op)
}

/// Safety: as [`inccl_reduce`].
unsafe fn plan_reduce(
    c: &Communicator,
    src: *const c_void,
    dst: *mut c_void,
    count: usize,
    dtype: c_int,
    op_: c_int,
    root: c_int,
) -> Result<Plan> {
    let (dt, op) = (self::dtype(dtype)?, op(op_)?);
    let root = arg_u16(root, "root")?;
    let len = byte_len(count, dt, "reduce")?;
    if c.rank() != root {
        // Safety: `src` holds `len` bytes, per the contract.
        let s = unsafe { buf_ref(src, len, "reduce src") }?;
        return c.plan_reduce(Out::separate(s, &mut []), dt, op, root);
    }
    // Safety: forwarded contract.
    let out = unsafe { src_dst("reduce", src, len, dst, len, std::ptr::eq(src, dst)) }?;
    c.plan_reduce(out, dt, op, root)
}

/// Safety: as [`inccl_broadcast`].
unsafe fn plan_broadcast(
    c: &Communicator,
    buf: *mut c_void,
    count: usize,
    dtype: c_int,
    root: c_int,
) -> Result<Plan> {
    let dt = self::dtype(dtype)?;
    let root = arg_u16(root, "root")?;
    let len = byte_len(count, dt, "broadcast")?;
    // Safety: `buf` holds `len` bytes, per the contract.
    let b = unsafe { buf_mut(buf, len, "broadcast buffer") }?;
    c.plan_broadcast(RawBufMut::new(b), dt, root)
}

/// Safety: as [`inccl_reduce_scatter`].
unsafe fn plan_reduce_scatter(
    c: &Communicator,
    src: *const c_void,
    dst: *mut c_void,
    recvcount: usize,
    dtype: c_int,
    op_: c_int,
) -> Result<Plan> {
    let (dt, op) = (self::dtype(dtype)?, op(op_)?);
    let block = byte_len(recvcount, dt, "reduce-scatter")?;
    let whole = byte_len(recvcount, dt, "reduce-scatter")?
        .checked_mul(usize::from(c.world_size()))
        .ok_or_else(|| Error::InvalidArgument("reduce-scatter: count too large".into()))?;
    let in_place = dst as usize == (src as usize).wrapping_add(usize::from(c.rank()) * block);
    // Safety: forwarded contract; in place, the buffer starts at `src`.
    let out = unsafe {
        if in_place {
            src_dst("reduce-scatter", src, whole, src.cast_mut(), whole, true)
        } else {
            src_dst("reduce-scatter", src, whole, dst, block, false)
        }
    }?;
    c.plan_reduce_scatter(out, dt, op)
}

/// Safety: as [`inccl_allgather`].
unsafe fn plan_allgather(
    c: &Communicator,
    src: *const c_void,
    dst: *mut c_void,
    sendcount: usize,
    dtype: c_int,
) -> Result<Plan> {
    let dt = self::dtype(dtype)?;
    let block = byte_len(sendcount, dt, "allgather")?;
    let whole = block
        .checked_mul(usize::from(c.world_size()))
        .ok_or_else(|| Error::InvalidArgument("allgather: count too large".into()))?;
    let in_place = src as usize == (dst as usize).wrapping_add(usize::from(c.rank()) * block);
    // Safety: forwarded contract.
    let out = unsafe { src_dst("allgather", src, block, dst, whole, in_place) }?;
    c.plan_allgather(out, dt)
}

/// AllReduce `count` elements of `src` into `dst` (`src == dst` is in place).
///
/// # Safety
/// `comm` is NULL or live; `src`/`dst` hold `count` elements of `dtype`.
#[no_mangle]
pub unsafe extern "C" fn inccl_allreduce(
    comm: *mut inccl_communicator,
    src: *const c_void,
    dst: *mut c_void,
    count: usize,
    dtype: c_int,
    op: c_int,
) -> c_int {
    // Safety: forwarded contract.
    unsafe { blocking(comm, |c| plan_allreduce(c, src, dst, count, dtype, op)) }
}

/// Reduce to `root`; `dst` is used on the root only (may be NULL elsewhere).
///
/// # Safety
/// `comm` is NULL or live; `src` (and `dst` on the root) hold `count` elements.
#[no_mangle]
pub unsafe extern "C" fn inccl_reduce(
    comm: *mut inccl_communicator,
    src: *const c_void,
    dst: *mut c_void,
    count: usize,
    dtype: c_int,
    op: c_int,
    root: c_int,
) -> c_int {
    // Safety: forwarded contract.
    unsafe { blocking(comm, |c| plan_reduce(c, src, dst, count, dtype, op, root)) }
}

/// Broadcast `count` elements of `buf` from `root`.
///
/// # Safety
/// `comm` is NULL or live; `buf` holds `count` elements of `dtype`.
#[no_mangle]
pub unsafe extern "C" fn inccl_broadcast(
    comm: *mut inccl_communicator,
    buf: *mut c_void,
    count: usize,
    dtype: c_int,
    root: c_int,
) -> c_int {
    // Safety: forwarded contract.
    unsafe { blocking(comm, |c| plan_broadcast(c, buf, count, dtype, root)) }
}

/// ReduceScatter: `src` holds `world_size * recvcount` elements, `dst` receives the
/// reduction of block `rank`; in place when `dst == src + rank * recvcount` elements.
///
/// # Safety
/// `comm` is NULL or live; the buffers hold the elements said above.
#[no_mangle]
pub unsafe extern "C" fn inccl_reduce_scatter(
    comm: *mut inccl_communicator,
    src: *const c_void,
    dst: *mut c_void,
    recvcount: usize,
    dtype: c_int,
    op: c_int,
) -> c_int {
    // Safety: forwarded contract.
    unsafe { blocking(comm, |c| plan_reduce_scatter(c, src, dst, recvcount, dtype, op)) }
}

/// AllGather: `dst` (`world_size * sendcount` elements) receives block `r` from rank
/// `r`; in place when `src == dst + rank * sendcount` elements.
///
/// # Safety
/// `comm` is NULL or live; the buffers hold the elements said above.
#[no_mangle]
pub unsafe extern "C" fn inccl_allgather(
    comm: *mut inccl_communicator,
    src: *const c_void,
    dst: *mut c_void,
    sendcount: usize,
    dtype: c_int,
) -> c_int {
    // Safety: forwarded contract.
    unsafe { blocking(comm, |c| plan_allgather(c, src, dst, sendcount, dtype)) }
}

/// Barrier.
///
/// # Safety
/// `comm` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn inccl_barrier(comm: *mut inccl_communicator) -> c_int {
    // Safety: forwarded contract.
    unsafe { blocking(comm, |c| Ok(c.plan_barrier())) }
}

/// Starts [`inccl_allreduce`]; the buffers are the library's until the request completes.
///
/// # Safety
/// As `inccl_allreduce`, buffers valid until the request completes; `req` writable.
#[no_mangle]
pub unsafe extern "C" fn inccl_iallreduce(
    comm: *mut inccl_communicator,
    src: *const c_void,
    dst: *mut c_void,
    count: usize,
    dtype: c_int,
    op: c_int,
    req: *mut *mut inccl_request,
) -> c_int {
    // Safety: forwarded contract.
    unsafe { start(comm, req, |c| plan_allreduce(c, src, dst, count, dtype, op)) }
}

/// Starts [`inccl_reduce`].
///
/// # Safety
/// As `inccl_reduce`, buffers valid until the request completes; `req` writable.
#[no_mangle]
pub unsafe extern "C" fn inccl_ireduce(
    comm: *mut inccl_communicator,
    src: *const c_void,
    dst: *mut c_void,
    count: usize,
    dtype: c_int,
    op: c_int,
    root: c_int,
    req: *mut *mut inccl_request,
) -> c_int {
    // Safety: forwarded contract.
    unsafe { start(comm, req, |c| plan_reduce(c, src, dst, count, dtype, op, root)) }
}

/// Starts [`inccl_broadcast`].
///
/// # Safety
/// As `inccl_broadcast`, buffer valid until the request completes; `req` writable.
#[no_mangle]
pub unsafe extern "C" fn inccl_ibroadcast(
    comm: *mut inccl_communicator,
    buf: *mut c_void,
    count: usize,
    dtype: c_int,
    root: c_int,
    req: *mut *mut inccl_request,
) -> c_int {
    // Safety: forwarded contract.
    unsafe { start(comm, req, |c| plan_broadcast(c, buf, count, dtype, root)) }
}

/// Starts [`inccl_reduce_scatter`].
///
/// # Safety
/// As `inccl_reduce_scatter`, buffers valid until the request completes; `req` writable.
#[no_mangle]
pub unsafe extern "C" fn inccl_ireduce_scatter(
    comm: *mut inccl_communicator,
    src: *const c_void,
    dst: *mut c_void,
    recvcount: usize,
    dtype: c_int,
    op: c_int,
    req: *mut *mut inccl_request,
) -> c_int {
    // Safety: forwarded contract.
    unsafe { start(comm, req, |c| plan_reduce_scatter(c, src, dst, recvcount, dtype, op)) }
}

/// Starts [`inccl_allgather`].
///
/// # Safety
/// As `inccl_allgather`, buffers valid until the request completes; `req` writable.
#[no_mangle]
pub unsafe extern "C" fn inccl_iallgather(
    comm: *mut inccl_communicator,
    src: *const c_void,
    dst: *mut c_void,
    sendcount: usize,
    dtype: c_int,
    req: *mut *mut inccl_request,
) -> c_int {
    // Safety: forwarded contract.
    unsafe { start(comm, req, |c| plan_allgather(c, src, dst, sendcount, dtype)) }
}

/// Starts a Barrier.
///
/// # Safety
/// `comm` is NULL or live; `req` writable.
#[no_mangle]
pub unsafe extern "C" fn inccl_ibarrier(
    comm: *mut inccl_communicator,
    req: *mut *mut inccl_request,
) -> c_int {
    // Safety: forwarded contract.
    unsafe { start(comm, req, |c| Ok(c.plan_barrier())) }
}

/// `*done = 1` when the request completed (its outcome is then ready for
/// [`inccl_wait`], which returns at once), else 0. Never frees the request.
///
/// # Safety
/// `done` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn inccl_test(req: *mut inccl_request, done: *mut c_int) -> c_int {
    guard(
        |c| c,
        || {
            if done.is_null() {
                return Err(Error::InvalidArgument("done pointer is NULL".into()));
            }
            let (id, shared) = request(req)?;
            let d = shared.test(id)?;
            // Safety: `done` is writable (checked non-NULL above), per the contract.
            unsafe { *done = c_int::from(d) };
            Ok(INCCL_OK)
        },
    )
}

/// Waits for the request, frees it, and returns the collective's outcome.
#[no_mangle]
pub extern "C" fn inccl_wait(req: *mut inccl_request) -> c_int {
    guard(
        |c| c,
        || {
            let (id, shared) = request(req)?;
            let r = shared.wait(id);
            if let Some(m) = requests().as_mut() {
                m.remove(&id);
            }
            int_code(r)
        },
    )
}

/// Bytes per element of `dtype`; 0 (and `inccl_last_error` set) for an unknown type.
#[no_mangle]
pub extern "C" fn inccl_datatype_size(dtype: c_int) -> usize {
    guard(|_| 0, || self::dtype(dtype).map(DataType::size))
}

/// Message of the last failed call on this thread ("" if none). Valid until the next
/// INCCL call on the same thread.
#[no_mangle]
pub extern "C" fn inccl_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

/// Seed API: INT32 SUM AllReduce of `len` elements; failures set `inccl_last_error`.
///
/// # Safety
/// As `inccl_allreduce`.
#[no_mangle]
pub unsafe extern "C" fn inccl_allreduce_sendrecv(
    comm: *mut inccl_communicator,
    src: *mut i32,
    len: u32,
    dst: *mut i32,
) {
    // Safety: forwarded contract.
    let r = unsafe { inccl_allreduce(comm, src.cast(), dst.cast(), len as usize, 0, 1) };
    log_void("inccl_allreduce_sendrecv", r);
}

/// Seed API: INT32 SUM Reduce to `root`.
///
/// # Safety
/// As `inccl_reduce`.
#[no_mangle]
pub unsafe extern "C" fn inccl_reduce_sendrecv(
    comm: *mut inccl_communicator,
    src: *mut i32,
    len: u32,
    dst: *mut i32,
    root: c_int,
) {
    // Safety: forwarded contract.
    let r = unsafe { inccl_reduce(comm, src.cast(), dst.cast(), len as usize, 0, 1, root) };
    log_void("inccl_reduce_sendrecv", r);
}

/// Seed API: INT32 Broadcast from `root`.
///
/// # Safety
/// As `inccl_broadcast`.
#[no_mangle]
pub unsafe extern "C" fn inccl_broadcast_sendrecv(
    comm: *mut inccl_communicator,
    buf: *mut i32,
    len: u32,
    root: c_int,
) {
    // Safety: forwarded contract.
    let r = unsafe { inccl_broadcast(comm, buf.cast(), len as usize, 0, root) };
    log_void("inccl_broadcast_sendrecv", r);
}

fn log_void(name: &str, r: c_int) {
    if r != INCCL_OK {
        // The seed signatures return nothing: the error stays in inccl_last_error().
        LAST_ERROR.with(
            |e| tracing::error!(code = r, error = %e.borrow().to_string_lossy(), "{name} failed"),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn last() -> String {
        // Safety: inccl_last_error returns a valid NUL-terminated thread-local string.
        unsafe { CStr::from_ptr(inccl_last_error()) }.to_string_lossy().into_owned()
    }

    #[test]
    fn null_and_bad_arguments_are_errors_not_crashes() {
        // Safety: NULL handles are accepted and reported.
        unsafe {
            assert_eq!(inccl_barrier(std::ptr::null_mut()), E_INVALID);
            assert!(last().contains("communicator is NULL"));
            assert_eq!(inccl_group_destroy(std::ptr::null_mut()), E_INVALID);
            assert_eq!(inccl_communicator_destroy(std::ptr::null_mut()), E_INVALID);
            assert!(inccl_communicator_create(std::ptr::null_mut(), 0).is_null());
            inccl_allreduce_sendrecv(
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                4,
                std::ptr::null_mut(),
            );
            assert!(last().contains("NULL"));
        }
        assert!(inccl_group_create(4, 0, std::ptr::null()).is_null());
        assert!(last().contains("master address is NULL"));
        assert!(inccl_group_create(4, 7, c"127.0.0.1".as_ptr()).is_null());
        assert!(last().contains("rank 7"), "{}", last());
        assert!(inccl_group_create(-1, 0, c"127.0.0.1".as_ptr()).is_null());
        assert!(last().contains("world size -1"), "{}", last());
    }

    #[test]
    fn argument_checks() {
        let e = dtype(10).unwrap_err().to_string();
        assert!(e.contains("datatype 10") && e.contains("INCCL_BFLOAT16 (8)"), "{e}");
        assert_eq!(inccl_datatype_size(DataType::Float64.code().into()), 8);
        assert_eq!(inccl_datatype_size(DataType::Bfloat16.code().into()), 2);
        assert_eq!(inccl_datatype_size(-1), 0);
        assert!(op(0).unwrap_err().to_string().contains("INCCL_BXOR (8)"));
        assert_eq!(op(5).unwrap(), ReduceOp::Avg);
        assert!(op(0).unwrap_err().to_string().contains("operator 0"));
        assert!(byte_len(usize::MAX / 2, DataType::Int32, "x").is_err());
        let a = [0u8; 16];
        let p = a.as_ptr().cast::<c_void>();
        assert!(overlap(p, 16, p.wrapping_byte_add(4), 16));
        assert!(overlap(p, 16, p, 16));
        assert!(!overlap(p, 16, p.wrapping_byte_add(16), 16));
        assert!(!overlap(p, 0, p, 16));
    }

    #[test]
    fn panics_become_internal_errors() {
        let r = guard(|c| c, || -> Result<c_int> { panic!("boom") });
        assert_eq!(r, E_INTERNAL);
        assert!(last().contains("boom"));
    }
}
