//! Zero-copy access to Python buffers (numpy arrays, bytearray, memoryview, array.array,
//! anything with the buffer protocol): the bytes INCCL reads and writes in place, and
//! the element type their format names.

use std::ffi::CStr;

use inc_wire::dtype::Class;
use inccl::DataType;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;

/// One exported buffer, released when dropped. Checked on creation: C-contiguous,
/// writable if asked, and a whole number of elements of [`Buffer::dtype`].
pub(crate) struct Buffer {
    /// Boxed: the exporter may keep pointers into the view until it is released.
    view: Box<ffi::Py_buffer>,
    dtype: DataType,
}

impl std::fmt::Debug for Buffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Buffer").field("len", &self.view.len).field("dtype", &self.dtype).finish()
    }
}

impl Buffer {
    /// Export `obj`'s buffer; `arg` names the argument in every error. `dtype`
    /// overrides the type the format names (the buffer is then taken as raw bytes).
    pub(crate) fn get(
        obj: &Bound<'_, PyAny>,
        arg: &str,
        writable: bool,
        dtype: Option<DataType>,
    ) -> PyResult<Buffer> {
        let py = obj.py();
        let mut view = Box::new(ffi::Py_buffer::new());
        // Strides and format: contiguity and the element type are checked here, so
        // the errors name the argument (exporters' own messages do not).
        // Safety: `obj` is a live object and `view` a writable Py_buffer; on success
        // the view is released exactly once, in Drop.
        let rc =
            unsafe { ffi::PyObject_GetBuffer(obj.as_ptr(), &mut *view, ffi::PyBUF_RECORDS_RO) };
        if rc != 0 {
            let cause = PyErr::fetch(py);
            let err = PyTypeError::new_err(format!(
                "{arg}: {} object does not support the buffer protocol (pass a numpy array, \
                 bytearray, memoryview or another writable buffer)",
                type_name(obj)
            ));
            err.set_cause(py, Some(cause));
            return Err(err);
        }
        let mut buf = Buffer { view, dtype: DataType::Uint8 };
        if writable && buf.view.readonly != 0 {
            return Err(PyValueError::new_err(format!("{arg}: buffer is read-only")));
        }
        // Safety: the view was filled by a successful PyObject_GetBuffer.
        if unsafe { ffi::PyBuffer_IsContiguous(&*buf.view, b'C' as _) } == 0 {
            return Err(PyValueError::new_err(format!(
                "{arg}: buffer is not C-contiguous (numpy.ascontiguousarray copies it into one)"
            )));
        }
        buf.dtype = match dtype {
            Some(d) => d,
            None => buf.format_dtype(arg)?,
        };
        if buf.len() % buf.dtype.size() != 0 {
            return Err(PyValueError::new_err(format!(
                "{arg}: {} bytes are not a whole number of {} elements ({} bytes each)",
                buf.len(),
                buf.dtype,
                buf.dtype.size()
            )));
        }
        Ok(buf)
    }

    /// The INCCL type of the buffer's format: by class (signed, unsigned, float) and
    /// item size, so `i`, `l`, `q` map by their size on this platform.
    fn format_dtype(&self, arg: &str) -> PyResult<DataType> {
        let format = if self.view.format.is_null() {
            "B".to_string()
        } else {
            // Safety: a non-NULL format of a filled view is a NUL-terminated string
            // valid until the view is released.
            unsafe { CStr::from_ptr(self.view.format) }.to_string_lossy().into_owned()
        };
        let itemsize = usize::try_from(self.view.itemsize).unwrap_or(0);
        let (order, code) = match format.chars().next() {
            Some(c @ ('@' | '=' | '<' | '>' | '!')) => (Some(c), &format[1..]),
            _ => (None, format.as_str()),
        };
        let native = match order {
            Some('<') => cfg!(target_endian = "little"),
            Some('>' | '!') => cfg!(target_endian = "big"),
            _ => true,
        };
        let class = match code {
            "b" | "h" | "i" | "l" | "q" | "n" => Some(Class::Signed),
            "B" | "H" | "I" | "L" | "Q" | "N" => Some(Class::Unsigned),
            "e" | "f" | "d" => Some(Class::Float),
            _ => None,
        };
        let found = class.filter(|_| native || itemsize == 1).and_then(|class| {
            DataType::ALL.iter().copied().find(|d| d.class() == class && d.size() == itemsize)
        });
        found.ok_or_else(|| {
            let names: Vec<&str> = DataType::ALL.iter().map(|d| d.name()).collect();
            PyTypeError::new_err(format!(
                "{arg}: buffer format '{format}' ({itemsize}-byte items) is not an INCCL \
                 datatype (native-endian {}; dtype= reinterprets the bytes)",
                names.join(", ")
            ))
        })
    }

    /// Element type.
    pub(crate) fn dtype(&self) -> DataType {
        self.dtype
    }

    /// Length in bytes.
    pub(crate) fn len(&self) -> usize {
        usize::try_from(self.view.len).unwrap_or(0)
    }

    /// Element count.
    pub(crate) fn count(&self) -> usize {
        self.len() / self.dtype.size()
    }

    /// Start address (for overlap checks).
    pub(crate) fn addr(&self) -> usize {
        self.view.buf as usize
    }

    /// The bytes, read-only.
    pub(crate) fn bytes(&self) -> &[u8] {
        if self.len() == 0 {
            return &[];
        }
        // Safety: a contiguous view of `len` bytes at `buf`, alive until Drop.
        unsafe { std::slice::from_raw_parts(self.view.buf.cast::<u8>(), self.len()) }
    }

    /// The bytes, writable: only for a buffer exported writable (checked in `get`).
    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        debug_assert_eq!(self.view.readonly, 0);
        if self.len() == 0 {
            return &mut [];
        }
        // Safety: a contiguous writable view of `len` bytes at `buf`, alive until Drop;
        // `&mut self` makes this the only slice of it from this Buffer.
        unsafe { std::slice::from_raw_parts_mut(self.view.buf.cast::<u8>(), self.len()) }
    }
}

// Safety: a view is plain data (pointers into memory its exporter keeps alive until
// the release); it is released with the GIL held whichever thread drops it (Drop
// below), and `bytes_mut` needs `&mut self`, so moving or sharing it between threads
// adds no unsynchronised access. A `Request` keeps its views while the progress thread
// runs the collective.
unsafe impl Send for Buffer {}
// Safety: as for Send; `&Buffer` only reads the view's fields.
unsafe impl Sync for Buffer {}

impl Drop for Buffer {
    fn drop(&mut self) {
        // Safety: the view was filled by PyObject_GetBuffer and is released once, with
        // the GIL held (attach is a no-op where it already is).
        Python::attach(|_| unsafe { ffi::PyBuffer_Release(&mut *self.view) });
    }
}

/// Whether two buffers share memory.
pub(crate) fn overlap(a: &Buffer, b: &Buffer) -> bool {
    a.len() > 0 && b.len() > 0 && a.addr() < b.addr() + b.len() && b.addr() < a.addr() + a.len()
}

/// Name of `obj`'s type, for messages.
pub(crate) fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type().name().map(|n| n.to_string()).unwrap_or_else(|_| "object".to_string())
}
