//! `inccl._inccl`: the Python bindings of INCCL. A thin layer: arguments are checked
//! and turned into the byte-level collectives of [`inccl::Communicator`] (the same path
//! as the C ABI), on the caller's buffers without a copy, with the GIL released.
//!
//! Ctrl-C: a collective runs on the calling thread to its end, which INCCL bounds (no
//! progress for the communicator's op timeout fails it), and the pending signal is
//! raised as soon as it returns. So a call that is blocked returns within the op
//! timeout (`INCCL_OP_TIMEOUT_MS`, 10 s, or `communicator(op_timeout=...)`); group
//! creation within the bootstrap timeout (`INCCL_TIMEOUT_MS`, 30 s, or `timeout=`).

mod buffer;
mod errors;

use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use inccl::{CommConfig, Communicator, DataType, Group, GroupConfig, ReduceOp};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyString;

use buffer::{overlap, type_name, Buffer};

/// Size hint given to INCCL for staging (it never limits a call).
const SIZE_HINT: u64 = 1 << 20;

/// A reduction operator (`inccl.SUM`, `inccl.MAX`, ...).
#[pyclass(module = "inccl", name = "Op", frozen, eq, hash)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Op {
    op: ReduceOp,
}

#[pymethods]
impl Op {
    /// Lower-case name (`"sum"`, `"bxor"`, ...).
    #[getter]
    fn name(&self) -> &'static str {
        self.op.name()
    }

    fn __repr__(&self) -> String {
        format!("inccl.{}", self.op.name().to_uppercase())
    }
}

/// `inccl.IN_PLACE`: pass as `send` to reduce into `recv` in place.
#[pyclass(module = "inccl", name = "InPlace", frozen)]
#[derive(Debug)]
struct InPlace;

#[pymethods]
impl InPlace {
    fn __repr__(&self) -> &'static str {
        "inccl.IN_PLACE"
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic inside INCCL reaches Python as pyo3's PanicException; the communicator
    // behind the poisoned lock is as INCCL left it (marked failed if its data path broke).
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// `op` argument: an [`Op`] or its name.
fn parse_op(op: Option<&Bound<'_, PyAny>>) -> PyResult<ReduceOp> {
    let Some(op) = op else { return Ok(ReduceOp::Sum) };
    if let Ok(o) = op.cast::<Op>() {
        return Ok(o.get().op);
    }
    let Ok(name) = op.cast::<PyString>() else {
        return Err(PyTypeError::new_err(format!(
            "op: expected inccl.SUM, MAX, MIN, PROD, AVG, BAND, BOR, BXOR or a name, got {}",
            type_name(op)
        )));
    };
    let name = name.to_str()?;
    name.to_ascii_lowercase()
        .parse::<ReduceOp>()
        .ok()
        .filter(|o| *o != ReduceOp::Barrier)
        .ok_or_else(|| {
            let names: Vec<&str> = ReduceOp::reductions().map(|o| o.name()).collect();
            PyValueError::new_err(format!("op: unknown operator '{name}' ({})", names.join(", ")))
        })
}

/// `dtype=` argument: a type name, or anything whose `str()` is one (`numpy.dtype`,
/// `torch.bfloat16`).
fn parse_dtype(dtype: Option<&Bound<'_, PyAny>>) -> PyResult<Option<DataType>> {
    let Some(d) = dtype else { return Ok(None) };
    let s = d.str()?.to_string();
    let name = s.strip_prefix("torch.").unwrap_or(&s);
    name.parse::<DataType>().map(Some).map_err(|_| {
        let names: Vec<&str> = DataType::ALL.iter().map(|d| d.name()).collect();
        PyValueError::new_err(format!("dtype: unknown datatype '{s}' ({})", names.join(", ")))
    })
}

fn check_op(op: ReduceOp, dtype: DataType) -> PyResult<()> {
    op.check(dtype).map_err(|e| PyValueError::new_err(format!("op: {e}")))
}

/// `what` as a rank in `0..size`.
fn rank_arg(v: i64, what: &str, size: u16) -> PyResult<u16> {
    u16::try_from(v).ok().filter(|r| *r < size).ok_or_else(|| {
        PyValueError::new_err(format!("{what}: {v} is out of range for size {size}"))
    })
}

fn seconds_arg(v: Option<f64>, what: &str) -> PyResult<Option<Duration>> {
    v.map(|s| {
        Duration::try_from_secs_f64(s).ok().filter(|d| !d.is_zero()).ok_or_else(|| {
            PyValueError::new_err(format!("{what}: {s} is not a positive number of seconds"))
        })
    })
    .transpose()
}

/// Send and receive buffers of one reduction, checked against each other.
fn pair(send: &Buffer, recv: &Buffer) -> PyResult<()> {
    if send.dtype() != recv.dtype() {
        return Err(PyTypeError::new_err(format!(
            "recv: datatype {} does not match send's {}",
            recv.dtype(),
            send.dtype()
        )));
    }
    if send.len() != recv.len() {
        return Err(PyValueError::new_err(format!(
            "recv: {} elements ({} bytes), but send has {} ({} bytes)",
            recv.count(),
            recv.len(),
            send.count(),
            send.len()
        )));
    }
    if overlap(send, recv) && send.addr() != recv.addr() {
        return Err(PyValueError::new_err(
            "send and recv overlap partially (pass inccl.IN_PLACE as send to reduce in place)",
        ));
    }
    Ok(())
}

/// Send and receive buffers of a blockwise collective: the same type, and `whole`
/// (named `whole_arg`) holding `size` blocks of `block`'s length.
fn blocks(block: &Buffer, whole: &Buffer, whole_arg: &str, size: u16) -> PyResult<()> {
    if block.dtype() != whole.dtype() {
        return Err(PyTypeError::new_err(format!(
            "recv: datatype {} does not match send's {}",
            whole.dtype(),
            block.dtype()
        )));
    }
    if whole.len() != block.len() * usize::from(size) {
        return Err(PyValueError::new_err(format!(
            "{whole_arg}: {} elements, expected {size} blocks (the size) of {}",
            whole.count(),
            block.count()
        )));
    }
    if overlap(block, whole) {
        return Err(PyValueError::new_err(
            "send and recv overlap (pass inccl.IN_PLACE as send for the in-place form)",
        ));
    }
    Ok(())
}

/// A set of ranks that know each other: `Group(world_size, rank, master_addr)`.
///
/// Creation is collective: every rank calls it with the same world size and master
/// address. Rank 0 listens on the master address (port `INCCL_MASTER_PORT`, default
/// 52223, unless the address has one) and registers the group with the controller.
#[pyclass(module = "inccl", name = "Group", frozen)]
#[derive(Debug)]
struct PyGroup {
    inner: Mutex<Option<Group>>,
    rank: u16,
    size: u16,
}

impl PyGroup {
    fn create(py: Python<'_>, cfg: GroupConfig) -> PyResult<PyGroup> {
        let (rank, size) = (cfg.rank, cfg.world_size);
        let group = py.detach(move || Group::create(cfg));
        py.check_signals()?;
        let group = group.map_err(|e| errors::to_py(py, e))?;
        Ok(PyGroup { inner: Mutex::new(Some(group)), rank, size })
    }
}

/// An environment variable, or `ConfigError` naming it.
fn env_var(py: Python<'_>, name: &str) -> PyResult<String> {
    std::env::var(name).ok().map(|v| v.trim().to_string()).filter(|v| !v.is_empty()).ok_or_else(
        || {
            errors::to_py(
                py,
                inccl::Error::Config(format!(
                    "environment variable {name} is not set (Group.from_env reads RANK, \
                     WORLD_SIZE, MASTER_ADDR and MASTER_PORT, as torchrun and scripts/demo \
                     --exec set them)"
                )),
            )
        },
    )
}

fn env_u16(py: Python<'_>, name: &str) -> PyResult<u16> {
    let v = env_var(py, name)?;
    v.parse::<u16>().map_err(|e| {
        errors::to_py(py, inccl::Error::Config(format!("environment variable {name}=`{v}`: {e}")))
    })
}

#[pymethods]
impl PyGroup {
    #[new]
    #[pyo3(signature = (world_size, rank, master_addr, controller = None, *, timeout = None))]
    fn new(
        py: Python<'_>,
        world_size: i64,
        rank: i64,
        master_addr: String,
        controller: Option<String>,
        timeout: Option<f64>,
    ) -> PyResult<PyGroup> {
        let ws = u16::try_from(world_size).map_err(|_| {
            PyValueError::new_err(format!("world_size: {world_size} is out of range"))
        })?;
        let r = u16::try_from(rank)
            .map_err(|_| PyValueError::new_err(format!("rank: {rank} is out of range")))?;
        let mut cfg =
            GroupConfig::from_env(ws, r, master_addr).map_err(|e| errors::to_py(py, e))?;
        if controller.is_some() {
            cfg.controller = controller;
        }
        if let Some(t) = seconds_arg(timeout, "timeout")? {
            cfg.timeout = t;
        }
        PyGroup::create(py, cfg)
    }

    /// The group of the launcher's environment: `RANK`, `WORLD_SIZE`, `MASTER_ADDR`,
    /// the bootstrap port `INCCL_MASTER_PORT`, else `MASTER_PORT`, else 52223, and the
    /// `INCCL_*` variables (`INCCL_CONTROLLER`, `INC_CONTROLLER_TOKEN`, `INCCL_IFACE`, ...).
    #[staticmethod]
    #[pyo3(signature = (*, timeout = None))]
    fn from_env(py: Python<'_>, timeout: Option<f64>) -> PyResult<PyGroup> {
        let rank = env_u16(py, "RANK")?;
        let world = env_u16(py, "WORLD_SIZE")?;
        let master = env_var(py, "MASTER_ADDR")?;
        let mut cfg =
            GroupConfig::from_env(world, rank, master).map_err(|e| errors::to_py(py, e))?;
        if std::env::var_os("INCCL_MASTER_PORT").is_none()
            && std::env::var_os("MASTER_PORT").is_some()
        {
            cfg.master_port = env_u16(py, "MASTER_PORT")?;
        }
        if let Some(t) = seconds_arg(timeout, "timeout")? {
            cfg.timeout = t;
        }
        PyGroup::create(py, cfg)
    }

    /// This process's rank.
    #[getter]
    fn rank(&self) -> u16 {
        self.rank
    }

    /// Number of ranks.
    #[getter]
    fn size(&self) -> u16 {
        self.size
    }

    /// Create a communicator (collective: every rank, in the same order). `op_timeout`
    /// (seconds) bounds a collective that makes no progress; default
    /// `INCCL_OP_TIMEOUT_MS` or 10 s. It is also how long Ctrl-C can take to interrupt
    /// a blocked call.
    #[pyo3(signature = (*, op_timeout = None))]
    fn communicator(&self, py: Python<'_>, op_timeout: Option<f64>) -> PyResult<PyComm> {
        let mut cfg = CommConfig::from_env(SIZE_HINT).map_err(|e| errors::to_py(py, e))?;
        if let Some(t) = seconds_arg(op_timeout, "op_timeout")? {
            cfg.op_timeout = t;
        }
        let comm = py.detach(|| match lock(&self.inner).as_ref() {
            Some(g) => g.communicator(cfg),
            None => Err(inccl::Error::Unusable("group", "it was destroyed".into())),
        });
        py.check_signals()?;
        let comm = comm.map_err(|e| errors::to_py(py, e))?;
        Ok(PyComm { inner: Mutex::new(Some(comm)), rank: self.rank, size: self.size })
    }

    /// Destroy the group (collective; rank 0 removes it from the controller). Later
    /// calls raise `inccl.UnusableError`; destroying twice does nothing.
    fn destroy(&self, py: Python<'_>) -> PyResult<()> {
        let Some(g) = lock(&self.inner).take() else { return Ok(()) };
        py.detach(|| g.destroy()).map_err(|e| errors::to_py(py, e))
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    /// Destroys the group; if the block raised, its exception wins over a failed destroy.
    fn __exit__(
        &self,
        py: Python<'_>,
        exc_type: Option<&Bound<'_, PyAny>>,
        _exc: Option<&Bound<'_, PyAny>>,
        _tb: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        exit_with(self.destroy(py), exc_type)
    }

    fn __repr__(&self) -> String {
        let state = if lock(&self.inner).is_some() { "" } else { ", destroyed" };
        format!("inccl.Group(rank={}, size={}{state})", self.rank, self.size)
    }
}

/// A communicator: collectives computed by the switches. Buffer methods as in
/// mpi4py: numpy arrays or any C-contiguous buffer, used in place (no copy); the
/// datatype comes from the buffer's format unless `dtype=` names one.
#[pyclass(module = "inccl", name = "Communicator", frozen)]
#[derive(Debug)]
struct PyComm {
    inner: Mutex<Option<Communicator>>,
    rank: u16,
    size: u16,
}

/// The `send` argument's buffer, or None for `inccl.IN_PLACE`.
fn send_buffer(send: &Bound<'_, PyAny>, dtype: Option<DataType>) -> PyResult<Option<Buffer>> {
    if send.is_instance_of::<InPlace>() {
        return Ok(None);
    }
    Buffer::get(send, "send", false, dtype).map(Some)
}

impl PyComm {
    /// Run `f` on the communicator with the GIL released; a signal that arrived
    /// meanwhile (Ctrl-C) is raised first, with INCCL's error (if any) as its cause.
    fn run<F>(&self, py: Python<'_>, f: F) -> PyResult<()>
    where
        F: FnOnce(&mut Communicator) -> inccl::Result<()> + Send,
    {
        let r = py.detach(|| match lock(&self.inner).as_mut() {
            Some(c) => f(c),
            None => Err(destroyed_communicator()),
        });
        if let Err(sig) = py.check_signals() {
            if let Err(e) = r {
                sig.set_cause(py, Some(errors::to_py(py, e)));
            }
            return Err(sig);
        }
        r.map_err(|e| errors::to_py(py, e))
    }
}

#[pymethods]
impl PyComm {
    /// This process's rank.
    #[getter]
    fn rank(&self) -> u16 {
        self.rank
    }

    /// Number of ranks.
    #[getter]
    fn size(&self) -> u16 {
        self.size
    }

    /// mpi4py's spelling of `rank`.
    #[pyo3(name = "Get_rank")]
    fn get_rank(&self) -> u16 {
        self.rank
    }

    /// mpi4py's spelling of `size`.
    #[pyo3(name = "Get_size")]
    fn get_size(&self) -> u16 {
        self.size
    }

    /// AllReduce `send` into `recv` (same type and length) with `op` (default SUM).
    /// `send=inccl.IN_PLACE` reduces `recv` in place.
    #[pyo3(name = "Allreduce", signature = (send, recv, op = None, *, dtype = None))]
    fn allreduce(
        &self,
        py: Python<'_>,
        send: &Bound<'_, PyAny>,
        recv: &Bound<'_, PyAny>,
        op: Option<&Bound<'_, PyAny>>,
        dtype: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let (op, dtype) = (parse_op(op)?, parse_dtype(dtype)?);
        let Some(s) = send_buffer(send, dtype)? else {
            let mut r = Buffer::get(recv, "recv", true, dtype)?;
            let dt = r.dtype();
            check_op(op, dt)?;
            let buf = r.bytes_mut();
            return self.run(py, move |c| c.allreduce_bytes_in_place(buf, dt, op));
        };
        let mut r = Buffer::get(recv, "recv", true, dtype)?;
        let dt = r.dtype();
        pair(&s, &r)?;
        check_op(op, dt)?;
        if s.addr() == r.addr() {
            let buf = r.bytes_mut();
            return self.run(py, move |c| c.allreduce_bytes_in_place(buf, dt, op));
        }
        let (src, dst) = (s.bytes(), r.bytes_mut());
        self.run(py, move |c| c.allreduce_bytes(src, dst, dt, op))
    }

    /// Reduce `send` to `root`'s `recv` with `op` (default SUM). `recv` is used on
    /// the root only (None elsewhere is fine). `send=inccl.IN_PLACE`: the root reduces
    /// in `recv`, the other ranks send their `recv`.
    #[pyo3(name = "Reduce", signature = (send, recv = None, op = None, root = 0, *, dtype = None))]
    fn reduce(
        &self,
        py: Python<'_>,
        send: &Bound<'_, PyAny>,
        recv: Option<&Bound<'_, PyAny>>,
        op: Option<&Bound<'_, PyAny>>,
        root: i64,
        dtype: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let (op, dtype) = (parse_op(op)?, parse_dtype(dtype)?);
        let root = rank_arg(root, "root", self.size)?;
        let is_root = self.rank == root;
        let recv = recv.filter(|r| !r.is_none());
        let Some(s) = send_buffer(send, dtype)? else {
            let recv = recv.ok_or_else(|| {
                PyTypeError::new_err("recv: required with send=inccl.IN_PLACE (it is the data)")
            })?;
            let mut b = Buffer::get(recv, "recv", is_root, dtype)?;
            let dt = b.dtype();
            check_op(op, dt)?;
            if is_root {
                let buf = b.bytes_mut();
                return self.run(py, move |c| c.reduce_bytes_in_place(buf, dt, op, root));
            }
            let src = b.bytes();
            return self.run(py, move |c| c.reduce_bytes(src, &mut [], dt, op, root));
        };
        let dt = s.dtype();
        if !is_root {
            check_op(op, dt)?;
            let src = s.bytes();
            return self.run(py, move |c| c.reduce_bytes(src, &mut [], dt, op, root));
        }
        let recv = recv.ok_or_else(|| {
            PyTypeError::new_err(format!("recv: required on the root (rank {root})"))
        })?;
        let mut r = Buffer::get(recv, "recv", true, dtype)?;
        pair(&s, &r)?;
        check_op(op, dt)?;
        if s.addr() == r.addr() {
            let buf = r.bytes_mut();
            return self.run(py, move |c| c.reduce_bytes_in_place(buf, dt, op, root));
        }
        let (src, dst) = (s.bytes(), r.bytes_mut());
        self.run(py, move |c| c.reduce_bytes(src, dst, dt, op, root))
    }

    /// Broadcast `buf` from `root` (default 0) to every rank, in place.
    #[pyo3(name = "Bcast", signature = (buf, root = 0, *, dtype = None))]
    fn bcast(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        root: i64,
        dtype: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let dtype = parse_dtype(dtype)?;
        let root = rank_arg(root, "root", self.size)?;
        let mut b = Buffer::get(buf, "buf", true, dtype)?;
        let dt = b.dtype();
        let bytes = b.bytes_mut();
        self.run(py, move |c| c.broadcast_bytes(bytes, dt, root))
    }

    /// ReduceScatter: `send` holds `size` blocks of `len(recv)` elements; `recv`
    /// receives the reduction (`op`, default SUM) of block `rank`, computed by the
    /// switches. `send=inccl.IN_PLACE`: `recv` holds the `size` blocks and its first
    /// block receives the result (mpi4py's `Reduce_scatter_block`).
    #[pyo3(name = "Reduce_scatter_block", signature = (send, recv, op = None, *, dtype = None))]
    fn reduce_scatter_block(
        &self,
        py: Python<'_>,
        send: &Bound<'_, PyAny>,
        recv: &Bound<'_, PyAny>,
        op: Option<&Bound<'_, PyAny>>,
        dtype: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let (op, dtype) = (parse_op(op)?, parse_dtype(dtype)?);
        let mut r = Buffer::get(recv, "recv", true, dtype)?;
        let dt = r.dtype();
        check_op(op, dt)?;
        let Some(s) = send_buffer(send, dtype)? else {
            let n = usize::from(self.size);
            if r.count() % n != 0 {
                return Err(PyValueError::new_err(format!(
                    "recv: {} elements are not {n} blocks (the size)",
                    r.count()
                )));
            }
            let (block, at) = (r.len() / n, usize::from(self.rank) * (r.len() / n));
            let buf = r.bytes_mut();
            return self.run(py, move |c| {
                c.reduce_scatter_bytes_in_place(buf, dt, op)?;
                buf.copy_within(at..at + block, 0);
                Ok(())
            });
        };
        blocks(&r, &s, "send", self.size)?;
        let (src, dst) = (s.bytes(), r.bytes_mut());
        self.run(py, move |c| c.reduce_scatter_bytes(src, dst, dt, op))
    }

    /// AllGather: `recv` (`size` blocks of `len(send)` elements) receives block `r`
    /// from rank `r`, replicated by the switches. `send=inccl.IN_PLACE`: this rank's
    /// block of `recv` holds its input.
    #[pyo3(name = "Allgather", signature = (send, recv, *, dtype = None))]
    fn allgather(
        &self,
        py: Python<'_>,
        send: &Bound<'_, PyAny>,
        recv: &Bound<'_, PyAny>,
        dtype: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let dtype = parse_dtype(dtype)?;
        let mut r = Buffer::get(recv, "recv", true, dtype)?;
        let dt = r.dtype();
        let Some(s) = send_buffer(send, dtype)? else {
            let buf = r.bytes_mut();
            return self.run(py, move |c| c.allgather_bytes_in_place(buf, dt));
        };
        blocks(&s, &r, "recv", self.size)?;
        let (src, dst) = (s.bytes(), r.bytes_mut());
        self.run(py, move |c| c.allgather_bytes(src, dst, dt))
    }

    /// Starts an AllReduce as `Allreduce` does and returns at once: an
    /// `inccl.Request` whose `Wait()` returns when it completed. The buffers must not
    /// be touched until then (the request keeps them alive). Requests run in start
    /// order; start them in the same order on every rank.
    #[pyo3(name = "Iallreduce", signature = (send, recv, op = None, *, dtype = None))]
    fn iallreduce(
        &self,
        send: &Bound<'_, PyAny>,
        recv: &Bound<'_, PyAny>,
        op: Option<&Bound<'_, PyAny>>,
        dtype: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyRequest> {
        let py = send.py();
        let (op, dtype) = (parse_op(op)?, parse_dtype(dtype)?);
        let s = send_buffer(send, dtype)?;
        let mut r = Buffer::get(recv, "recv", true, dtype)?;
        let dt = r.dtype();
        if let Some(s) = &s {
            pair(s, &r)?;
        }
        check_op(op, dt)?;
        let src = s.as_ref().filter(|s| s.addr() != r.addr()).map(Buffer::bytes);
        let guard = lock(&self.inner);
        let comm = guard.as_ref().ok_or_else(|| errors::to_py(py, destroyed_communicator()))?;
        // Safety: the request owns both buffer views (so the exporters keep the memory)
        // until it completed: its Wait or Drop waits for the collective.
        let req = unsafe { comm.iallreduce_bytes_unscoped(src, r.bytes_mut(), dt, op) }
            .map_err(|e| errors::to_py(py, e))?;
        Ok(PyRequest { inner: Mutex::new(Some((req, s, r))) })
    }

    /// Barrier through the switches.
    #[pyo3(name = "Barrier")]
    fn barrier(&self, py: Python<'_>) -> PyResult<()> {
        self.run(py, |c| c.barrier())
    }

    /// Destroy the communicator (collective; rank 0 removes its rules from the
    /// switches). Later calls raise `inccl.UnusableError`; destroying twice does nothing.
    fn destroy(&self, py: Python<'_>) -> PyResult<()> {
        let mut guard = lock(&self.inner);
        if let Some(n) = guard.as_ref().map(Communicator::pending_requests).filter(|n| *n > 0) {
            let why = format!("{n} requests are not waited for yet; Wait() them first");
            return Err(errors::to_py(py, inccl::Error::InvalidArgument(why)));
        }
        let Some(c) = guard.take() else { return Ok(()) };
        drop(guard);
        py.detach(|| c.destroy()).map_err(|e| errors::to_py(py, e))
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    /// Destroys the communicator; if the block raised, its exception wins over a
    /// failed destroy.
    fn __exit__(
        &self,
        py: Python<'_>,
        exc_type: Option<&Bound<'_, PyAny>>,
        _exc: Option<&Bound<'_, PyAny>>,
        _tb: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        exit_with(self.destroy(py), exc_type)
    }

    fn __repr__(&self) -> String {
        let state = if lock(&self.inner).is_some() { "" } else { ", destroyed" };
        format!("inccl.Communicator(rank={}, size={}{state})", self.rank, self.size)
    }
}

/// A started non-blocking collective (`Communicator.Iallreduce`).
#[pyclass(module = "inccl", name = "Request", frozen)]
struct PyRequest {
    /// The request and the buffer views it uses; `None` once waited for.
    inner: Mutex<Option<(inccl::UnscopedRequest, Option<Buffer>, Buffer)>>,
}

impl std::fmt::Debug for PyRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Request").field("waited", &lock(&self.inner).is_none()).finish()
    }
}

/// How long a `Wait` sleeps between looks at pending signals (Ctrl-C).
const SIGNAL_POLL: Duration = Duration::from_millis(50);

#[pymethods]
impl PyRequest {
    /// True when the collective completed (then `Wait()` returns at once). A request
    /// already waited for counts as completed.
    #[pyo3(name = "Test")]
    fn test(&self, py: Python<'_>) -> PyResult<bool> {
        match lock(&self.inner).as_ref() {
            Some((req, ..)) => req.test().map_err(|e| errors::to_py(py, e)),
            None => Ok(true),
        }
    }

    /// Waits for the collective (GIL released) and raises its error, if any. Ctrl-C
    /// interrupts the wait (the collective keeps running; `Wait()` again to finish).
    /// Waiting again after it returned does nothing.
    #[pyo3(name = "Wait")]
    fn wait(&self, py: Python<'_>) -> PyResult<()> {
        loop {
            let outcome = {
                let guard = lock(&self.inner);
                let Some((req, ..)) = guard.as_ref() else { return Ok(()) };
                py.detach(|| req.wait_timeout(SIGNAL_POLL))
            };
            if let Some(r) = outcome {
                // Collected: the views can go.
                lock(&self.inner).take();
                return r.map_err(|e| errors::to_py(py, e));
            }
            py.check_signals()?;
        }
    }

    fn __repr__(&self) -> &'static str {
        if lock(&self.inner).is_some() {
            "inccl.Request(pending)"
        } else {
            "inccl.Request(done)"
        }
    }
}

impl Drop for PyRequest {
    fn drop(&mut self) {
        // The buffer views must outlive the collective: wait (bounded by the
        // communicator's op timeout per queued collective) before releasing them. The
        // outcome of a request nobody waited for is not reported, as in mpi4py.
        if let Some((req, send, recv)) = lock(&self.inner).take() {
            let _ = req.wait();
            drop((send, recv));
        }
    }
}

/// The error of a call on a communicator after `destroy()`.
fn destroyed_communicator() -> inccl::Error {
    inccl::Error::Unusable("communicator", "it was destroyed".into())
}

/// `__exit__`'s answer after destroying: the destroy's error only if the `with` block
/// itself did not raise (its exception wins); never swallows the block's exception.
fn exit_with(destroyed: PyResult<()>, exc_type: Option<&Bound<'_, PyAny>>) -> PyResult<bool> {
    if exc_type.is_none_or(|t| t.is_none()) {
        destroyed?;
    }
    Ok(false)
}

/// The native part of the `inccl` package (see `inccl/__init__.py`).
#[pymodule]
fn _inccl(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<PyGroup>()?;
    m.add_class::<PyComm>()?;
    m.add_class::<PyRequest>()?;
    m.add_class::<Op>()?;
    m.add_class::<InPlace>()?;
    m.add("IN_PLACE", InPlace)?;
    for op in ReduceOp::reductions() {
        m.add(op.name().to_uppercase().as_str(), Op { op })?;
    }
    errors::register(m)
}
