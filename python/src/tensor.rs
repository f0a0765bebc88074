//! `gpufeed.Tensor`: a batch's images, exported through the DLPack protocol of the array API
//! standard (`__dlpack__`, `__dlpack_device__`), zero-copy.
//!
//! Streams follow the standard: the consumer passes the stream it will read on (`None` or `1`
//! the legacy default stream, `2` the per-thread default stream, a handle, or `-1` for no
//! synchronization); the batch's stream is made to wait... the other way round: the consumer's
//! stream waits for the batch by event, and the batch's memory is freed only after the work the
//! consumer's stream had queued when the last reference went (see `gpufeed::dlpack`).

use std::ffi::{c_void, CStr};
use std::sync::Arc;

use gpufeed::dlpack::{
    self, ConsumerStream, DLManagedTensor, DLManagedTensorVersioned, DEVICE_CPU, FLAG_IS_COPIED,
};
use pyo3::exceptions::PyBufferError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use crate::to_py_err;

const VERSIONED: &CStr = c"dltensor_versioned";
const LEGACY: &CStr = c"dltensor";

/// A batch's images, on a CUDA device or in host memory. Hand it to `torch.from_dlpack` or
/// `numpy.from_dlpack`: no copy is made.
#[pyclass(module = "gpufeed", frozen)]
pub struct Tensor {
    inner: Arc<gpufeed::Tensor>,
}

impl Tensor {
    pub(crate) fn new(inner: Arc<gpufeed::Tensor>) -> Tensor {
        Tensor { inner }
    }
}

#[pymethods]
impl Tensor {
    /// Exports the tensor as a DLPack capsule (versioned when `max_version >= (1, 0)`).
    #[pyo3(signature = (stream=None, *, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__<'py>(
        &self,
        py: Python<'py>,
        stream: Option<i64>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let own = dlpack::device(&self.inner);
        let to_host = match dl_device {
            None => false,
            Some((kind, id)) if (kind, id) == (own.device_type, own.device_id) => false,
            Some((DEVICE_CPU, 0)) => true,
            Some(other) => {
                return Err(PyBufferError::new_err(format!(
                    "cannot export a tensor on DLPack device {:?} to device {other:?}",
                    (own.device_type, own.device_id)
                )))
            }
        };
        let (tensor, copied) = if to_host {
            if copy == Some(false) {
                return Err(PyBufferError::new_err(
                    "copy=False, but a host tensor of device memory needs a copy",
                ));
            }
            let host = py.detach(|| self.inner.to_host()).map_err(to_py_err)?;
            (Arc::new(gpufeed::Tensor::Host(host)), true)
        } else if copy == Some(true) {
            match &*self.inner {
                gpufeed::Tensor::Host(t) => (Arc::new(gpufeed::Tensor::Host(t.clone())), true),
                gpufeed::Tensor::Device(_) => {
                    return Err(PyBufferError::new_err(
                        "copy=True on the device is not supported: the export is zero-copy \
                         (dl_device=(1, 0) gives a host copy)",
                    ))
                }
            }
        } else {
            (self.inner.clone(), false)
        };
        let consumer = match &*tensor {
            // SAFETY: under the array API standard, a stream value above 2 is the handle of a
            // live stream of the tensor's device that the consumer owns and keeps for as long
            // as it uses the tensor.
            gpufeed::Tensor::Device(_) => {
                unsafe { ConsumerStream::from_array_api(stream) }.map_err(to_py_err)?
            }
            gpufeed::Tensor::Host(_) => match stream {
                None | Some(-1) => ConsumerStream::unordered(),
                Some(other) => {
                    return Err(PyBufferError::new_err(format!(
                        "stream={other} for a host tensor: only None or -1"
                    )))
                }
            },
        };
        if max_version.is_some_and(|(major, _)| major >= 1) {
            let mut export = dlpack::export_versioned(&tensor, &consumer).map_err(to_py_err)?;
            if copied {
                export.set_flags(FLAG_IS_COPIED);
            }
            let ptr = export.as_ptr() as *mut c_void;
            let capsule = new_capsule(py, ptr, VERSIONED, destroy_versioned)?;
            // The capsule owns the export now.
            let _ = export.into_raw();
            Ok(capsule)
        } else {
            let export = dlpack::export_legacy(&tensor, &consumer).map_err(to_py_err)?;
            let ptr = export.as_ptr() as *mut c_void;
            let capsule = new_capsule(py, ptr, LEGACY, destroy_legacy)?;
            let _ = export.into_raw();
            Ok(capsule)
        }
    }

    /// `(device_type, device_id)`: `(2, ordinal)` for CUDA (kDLCUDA), `(1, 0)` for the host.
    fn __dlpack_device__(&self) -> (i32, i32) {
        let device = dlpack::device(&self.inner);
        (device.device_type, device.device_id)
    }

    /// `(N, C, H, W)` or `(N, H, W, C)` for images; other ranks for a patch sequence's tokens
    /// and side tensors.
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.inner.shape())
    }

    /// Distance in elements between neighbours along each axis (dense, C order).
    #[getter]
    fn strides<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.inner.strides())
    }

    /// `"float16"`, `"bfloat16"`, `"float32"`, `"int32"` or `"int64"`.
    #[getter]
    fn dtype(&self) -> &'static str {
        match self.inner.dtype() {
            gpufeed::DType::F16 => "float16",
            gpufeed::DType::BF16 => "bfloat16",
            gpufeed::DType::I32 => "int32",
            gpufeed::DType::I64 => "int64",
            gpufeed::DType::U8 => "uint8",
            _ => "float32",
        }
    }

    /// `"nchw"` or `"nhwc"`.
    #[getter]
    fn layout(&self) -> String {
        self.inner.layout().to_string()
    }

    /// `"cuda:N"` or `"cpu"`, as PyTorch writes devices.
    #[getter]
    fn device(&self) -> String {
        self.inner.device().to_string()
    }

    /// Bytes of the elements.
    #[getter]
    fn nbytes(&self) -> usize {
        self.inner.len() * self.inner.dtype().size_of()
    }

    /// The `CUstream` handle the tensor was written on (`None` in host memory).
    #[getter]
    fn cuda_stream(&self) -> Option<usize> {
        self.inner
            .as_device()
            .map(|t| t.stream().cu_stream() as usize)
    }

    fn __len__(&self) -> usize {
        self.inner.shape()[0]
    }

    fn __repr__(&self) -> String {
        format!(
            "gpufeed.Tensor(shape={:?}, dtype={}, layout={}, device={})",
            self.inner.shape(),
            self.dtype(),
            self.layout(),
            self.device()
        )
    }
}

/// A capsule named `name` holding `ptr`, whose destructor is `destructor`.
fn new_capsule<'py>(
    py: Python<'py>,
    ptr: *mut c_void,
    name: &'static CStr,
    destructor: unsafe extern "C" fn(*mut ffi::PyObject),
) -> PyResult<Bound<'py, PyAny>> {
    // SAFETY: `ptr` is a live managed tensor, `name` a static C string that outlives the
    // capsule, and `destructor` frees the tensor only while the capsule still has that name
    // (a consumer that takes the tensor renames the capsule and calls the deleter itself).
    unsafe {
        let capsule = ffi::PyCapsule_New(ptr, name.as_ptr(), Some(destructor));
        Bound::from_owned_ptr_or_err(py, capsule)
    }
}

/// Calls the tensor's deleter if no consumer took it (the capsule kept its name).
///
/// # Safety
/// `capsule` is a capsule made by [`new_capsule`] with `name` over a managed tensor of type `M`
/// whose deleter is `deleter(m)`.
unsafe fn destroy<M>(
    capsule: *mut ffi::PyObject,
    name: &CStr,
    deleter: impl FnOnce(&M) -> Option<unsafe extern "C" fn(*mut M)>,
) {
    // SAFETY: per this function's contract; `PyCapsule_IsValid` sets no error, and with the
    // name checked `PyCapsule_GetPointer` cannot fail.
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, name.as_ptr()) != 1 {
            return;
        }
        let managed = ffi::PyCapsule_GetPointer(capsule, name.as_ptr()) as *mut M;
        if let Some(delete) = managed.as_ref().and_then(deleter) {
            delete(managed);
        }
    }
}

unsafe extern "C" fn destroy_versioned(capsule: *mut ffi::PyObject) {
    // SAFETY: only registered on capsules named `VERSIONED` over a versioned tensor.
    unsafe { destroy::<DLManagedTensorVersioned>(capsule, VERSIONED, |m| m.deleter) }
}

unsafe extern "C" fn destroy_legacy(capsule: *mut ffi::PyObject) {
    // SAFETY: only registered on capsules named `LEGACY` over a legacy tensor.
    unsafe { destroy::<DLManagedTensor>(capsule, LEGACY, |m| m.deleter) }
}
