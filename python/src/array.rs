//! A batch column handed to Python without a copy: numpy reads it through
//! `__array_interface__`, torch through DLPack (`__dlpack__`,
//! `__dlpack_device__`). Either keeps the column alive for as long as the
//! array or tensor made from it lives.
//!
//! ```text
//! numpy.asarray(col)      # view; col stays alive as the array's base
//! torch.from_dlpack(col)  # capsule owns a reference to the buffer
//! ```
use std::ffi::{c_void, CStr};
use std::sync::Arc;

use ferrofeed_core::{DType, Tensor};
use pyo3::exceptions::{PyBufferError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

/// One tensor of a batch, shared with numpy or torch.
#[pyclass(module = "ferrofeed._ferrofeed", frozen)]
pub struct Array {
    tensor: Arc<Tensor>,
}

impl Array {
    pub fn new(tensor: Tensor) -> Self {
        Array {
            tensor: Arc::new(tensor),
        }
    }
}

fn typestr(d: DType) -> &'static str {
    d.numpy_descr()
}

/// DLPack's data type code and bits for a dtype.
fn dl_dtype(d: DType) -> DLDataType {
    let (code, bits) = match d {
        DType::U8 => (1, 8),
        DType::I16 => (0, 16),
        DType::I32 => (0, 32),
        DType::I64 => (0, 64),
        DType::F32 => (2, 32),
        DType::F64 => (2, 64),
    };
    DLDataType {
        code,
        bits,
        lanes: 1,
    }
}

#[pymethods]
impl Array {
    /// The shape, as a tuple.
    #[getter]
    fn shape(&self) -> Vec<usize> {
        self.tensor.shape().to_vec()
    }

    /// numpy's name of the element type (`uint8`, `int64`, `float32`, …).
    #[getter]
    fn dtype(&self) -> &'static str {
        self.tensor.dtype().name()
    }

    /// Whether the memory is page-locked (pinned).
    #[getter]
    fn is_pinned(&self) -> bool {
        self.tensor.is_pinned()
    }

    /// numpy's array interface (version 3): a read-write view of the
    /// buffer, kept alive by this object.
    #[getter]
    fn __array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("version", 3)?;
        d.set_item("shape", PyTuple::new(py, self.tensor.shape())?)?;
        d.set_item("typestr", typestr(self.tensor.dtype()))?;
        let ptr = self.tensor.as_bytes().as_ptr() as usize;
        d.set_item("data", (ptr, false))?;
        d.set_item("strides", py.None())?;
        Ok(d)
    }

    /// `(device type, device id)`: host memory, pinned or not, is DLPack's
    /// CPU device (1, 0).
    fn __dlpack_device__(&self) -> (i32, i32) {
        (K_DL_CPU, 0)
    }

    /// A DLPack capsule of the buffer (no copy). The data is ready when the
    /// batch is handed out, so `stream` needs no synchronisation; a copy or
    /// another device is refused (`BufferError`), as the protocol asks.
    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__(
        &self,
        py: Python<'_>,
        stream: Option<Bound<'_, PyAny>>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Py<PyAny>> {
        let _ = (stream, max_version);
        if let Some(dev) = dl_device {
            if dev != (K_DL_CPU, 0) {
                return Err(PyBufferError::new_err(format!(
                    "the batch is in host memory; device {dev:?} needs a copy"
                )));
            }
        }
        if copy == Some(true) {
            return Err(PyBufferError::new_err(
                "copy=True: the batch is shared, not copied; copy the tensor made from it",
            ));
        }
        capsule(py, Arc::clone(&self.tensor))
    }

    fn __len__(&self) -> usize {
        self.tensor.shape().first().copied().unwrap_or(0)
    }

    fn __repr__(&self) -> String {
        format!(
            "ferrofeed.Array(shape={:?}, dtype={})",
            self.tensor.shape(),
            self.tensor.dtype().name()
        )
    }
}

const K_DL_CPU: i32 = 1;

#[repr(C)]
#[derive(Clone, Copy)]
struct DLDevice {
    device_type: i32,
    device_id: i32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct DLDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

#[repr(C)]
struct DLTensor {
    data: *mut c_void,
    device: DLDevice,
    ndim: i32,
    dtype: DLDataType,
    shape: *mut i64,
    strides: *mut i64,
    byte_offset: u64,
}

#[repr(C)]
struct DLManagedTensor {
    dl_tensor: DLTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

/// What a capsule owns: the managed tensor (first, so a pointer to it is a
/// pointer to this), its shape, and a reference to the buffer.
#[repr(C)]
struct Owned {
    managed: DLManagedTensor,
    shape: Vec<i64>,
    tensor: Arc<Tensor>,
}

unsafe extern "C" fn delete_owned(m: *mut DLManagedTensor) {
    if !m.is_null() {
        // SAFETY: `m` is the first field of an `Owned` made by `capsule`
        // with Box::into_raw, and the protocol calls the deleter once.
        drop(unsafe { Box::from_raw(m.cast::<Owned>()) });
    }
}

const NAME: &CStr = c"dltensor";

unsafe extern "C" fn capsule_destructor(cap: *mut pyo3::ffi::PyObject) {
    // A consumer renames the capsule to "used_dltensor" and owns the tensor
    // from then on; an unconsumed one still holds it.
    // SAFETY: called by Python with the capsule being destroyed.
    unsafe {
        if pyo3::ffi::PyCapsule_IsValid(cap, NAME.as_ptr()) == 1 {
            let m = pyo3::ffi::PyCapsule_GetPointer(cap, NAME.as_ptr()).cast::<DLManagedTensor>();
            delete_owned(m);
        }
    }
}

fn capsule(py: Python<'_>, tensor: Arc<Tensor>) -> PyResult<Py<PyAny>> {
    let mut shape: Vec<i64> = tensor
        .shape()
        .iter()
        .map(|&n| i64::try_from(n))
        .collect::<Result<_, _>>()
        .map_err(|_| PyValueError::new_err("a dimension is too large for DLPack"))?;
    let data = tensor.as_bytes().as_ptr() as *mut c_void;
    let ndim = i32::try_from(shape.len()).map_err(|_| PyValueError::new_err("too many dims"))?;
    let shape_ptr = shape.as_mut_ptr();
    let owned = Box::new(Owned {
        managed: DLManagedTensor {
            dl_tensor: DLTensor {
                data,
                device: DLDevice {
                    device_type: K_DL_CPU,
                    device_id: 0,
                },
                ndim,
                dtype: dl_dtype(tensor.dtype()),
                shape: shape_ptr,
                strides: std::ptr::null_mut(),
                byte_offset: 0,
            },
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(delete_owned),
        },
        shape,
        tensor,
    });
    let raw = Box::into_raw(owned);
    // SAFETY: `raw` is a live Box pointer; the capsule's destructor (or the
    // consumer, through the deleter) frees it exactly once.
    unsafe {
        let cap = pyo3::ffi::PyCapsule_New(raw.cast(), NAME.as_ptr(), Some(capsule_destructor));
        if cap.is_null() {
            delete_owned(raw.cast());
            return Err(PyErr::fetch(py));
        }
        Ok(Bound::from_owned_ptr(py, cap).unbind())
    }
}
