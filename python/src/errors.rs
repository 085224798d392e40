//! `inccl.Error` and its subclasses: one per kind of INCCL error, each carrying
//! INCCL's message. Some also derive from the matching built-in exception
//! (`InvalidArgumentError` is a `ValueError`, `TimeoutError` a `TimeoutError`), so
//! code that catches the built-in catches them too.

use pyo3::exceptions::{PyException, PyOSError, PyTimeoutError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple, PyType};

/// The exception classes, created once when the module is imported.
#[derive(Debug)]
struct Classes {
    invalid_argument: Py<PyType>,
    config: Py<PyType>,
    timeout: Py<PyType>,
    peer: Py<PyType>,
    controller: Py<PyType>,
    io: Py<PyType>,
    collective: Py<PyType>,
    transport_unavailable: Py<PyType>,
    unusable: Py<PyType>,
}

static CLASSES: PyOnceLock<Classes> = PyOnceLock::new();

/// `type(name, bases, {...})` in module `inccl`.
fn new_class<'py>(
    py: Python<'py>,
    name: &str,
    bases: Vec<Bound<'py, PyType>>,
    doc: &str,
) -> PyResult<Bound<'py, PyType>> {
    let ns = PyDict::new(py);
    ns.set_item("__module__", "inccl")?;
    ns.set_item("__doc__", doc)?;
    let bases = PyTuple::new(py, bases)?;
    Ok(py.get_type::<PyType>().call1((name, bases, ns))?.cast_into::<PyType>()?)
}

/// Create the classes and add them to `m`.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    let base = new_class(
        py,
        "Error",
        vec![py.get_type::<PyException>()],
        "Base class of every error INCCL reports; the message is INCCL's.",
    )?;
    m.add("Error", &base)?;
    let sub = |name: &str, builtin: Option<Bound<'_, PyType>>, doc: &str| -> PyResult<Py<PyType>> {
        let mut bases = vec![base.clone()];
        bases.extend(builtin);
        let c = new_class(py, name, bases, doc)?;
        m.add(name, &c)?;
        Ok(c.unbind())
    };
    let classes = Classes {
        invalid_argument: sub(
            "InvalidArgumentError",
            Some(py.get_type::<PyValueError>()),
            "INCCL refused an argument (rank, root, world size, type and operator).",
        )?,
        config: sub(
            "ConfigError",
            None,
            "Unusable configuration: an environment variable, interface or address.",
        )?,
        timeout: sub(
            "TimeoutError",
            Some(py.get_type::<PyTimeoutError>()),
            "A bounded wait expired; the message names who did not show up.",
        )?,
        peer: sub("PeerError", None, "Another rank misbehaved, went away or aborted the setup.")?,
        controller: sub(
            "ControllerError",
            None,
            "The controller could not be reached or refused a request.",
        )?,
        io: sub("IoError", Some(py.get_type::<PyOSError>()), "A socket or system call failed.")?,
        collective: sub(
            "CollectiveError",
            None,
            "The data path failed (stall, broken connection to the switch); the \
             communicator is unusable afterwards.",
        )?,
        transport_unavailable: sub(
            "TransportUnavailableError",
            None,
            "The requested transport is not built in or not usable on this host.",
        )?,
        unusable: sub(
            "UnusableError",
            None,
            "The object was used after a fatal error or after destroy().",
        )?,
    };
    CLASSES
        .set(py, classes)
        .map_err(|_| PyException::new_err("inccl: exception classes initialised twice"))
}

/// The Python exception of an INCCL error.
pub(crate) fn to_py(py: Python<'_>, e: inccl::Error) -> PyErr {
    let Some(c) = CLASSES.get(py) else {
        return PyException::new_err(e.to_string());
    };
    let class = match &e {
        inccl::Error::InvalidArgument(_) => &c.invalid_argument,
        inccl::Error::Config(_) => &c.config,
        inccl::Error::Timeout { .. } => &c.timeout,
        inccl::Error::Peer { .. } | inccl::Error::Aborted { .. } => &c.peer,
        inccl::Error::Controller { .. } => &c.controller,
        inccl::Error::Io { .. } => &c.io,
        inccl::Error::Collective { .. } => &c.collective,
        inccl::Error::TransportUnavailable(_) => &c.transport_unavailable,
        inccl::Error::Unusable(..) => &c.unusable,
    };
    PyErr::from_type(class.bind(py).clone(), e.to_string())
}
