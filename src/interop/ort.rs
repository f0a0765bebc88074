//! A batch as an ONNX Runtime input, zero-copy (feature `ort`, ONNX Runtime loaded at run time
//! with `ort`'s `load-dynamic`).
//!
//! `IoBinding::bind_input` copies its input; these views do not: ONNX Runtime reads the
//! batch's own memory, host or device.
//!
//! # Streams (CUDA batches)
//! ONNX Runtime's CUDA execution provider runs a session's kernels on its compute stream.
//! - Give it the pipeline's stream ([`compute_stream`] with `CUDA::with_compute_stream`):
//!   the session then reads each batch in the order the pipeline wrote it, and [`input`] needs
//!   nothing more. `examples/ort_cuda.rs` shows it.
//! - Or let it use a stream of its own and pass that stream to [`input_on`]: the stream waits
//!   for the batch (an event, no host sync) and the batch's memory outlives the work queued on
//!   it ([`DeviceTensor::use_on`](crate::DeviceTensor::use_on)).
//!
//! Either way `Session::run` returns once its outputs are ready (ONNX Runtime synchronizes its
//! compute stream at the end of a run unless told otherwise), so the batch may be dropped then.

use std::sync::Arc;

use ::ort::memory::{AllocationDevice, AllocatorType, MemoryInfo, MemoryType};
use ::ort::session::SessionInputValue;
use ::ort::value::{Shape, TensorRef, TensorRefMut};
use cudarc::driver::CudaStream;
use half::{bf16, f16};

use crate::error::{Error, Result};
use crate::tensor::{DeviceData, DeviceTensor, HostData, HostTensor, Tensor};

fn fail(what: &str, e: ::ort::Error) -> Error {
    Error::Export(format!("ONNX Runtime refused {what}: {e}"))
}

/// The batch as an ONNX Runtime input of its shape and dtype (f16, bf16, f32; i32 and i64 for a
/// patch sequence's side tensors), reading the
/// batch's memory in place. A host batch goes to any execution provider; a CUDA batch must be
/// read on the pipeline's stream (see the module documentation), or use [`input_on`].
pub fn input(tensor: &Tensor) -> Result<SessionInputValue<'_>> {
    match tensor {
        Tensor::Host(t) => host_input(t),
        Tensor::Device(t) => device_input(t),
    }
}

/// [`input`] for a session whose CUDA execution provider runs on `stream` rather than the
/// pipeline's: `stream` waits for the batch, and the batch's memory outlives the work queued on
/// it ([`DeviceTensor::use_on`]). A host batch ignores `stream`.
pub fn input_on<'a>(tensor: &'a Tensor, stream: &Arc<CudaStream>) -> Result<SessionInputValue<'a>> {
    if let Tensor::Device(t) = tensor {
        t.use_on(stream)?;
    }
    input(tensor)
}

/// The handle to give `CUDA::with_compute_stream` so that a session runs on `stream` (the
/// pipeline's: [`crate::Pipeline::cuda_stream`]). The stream must outlive the session.
pub fn compute_stream(stream: &CudaStream) -> *mut () {
    stream.cu_stream() as *mut ()
}

fn dims(tensor_shape: &[usize]) -> Shape {
    Shape::new(tensor_shape.iter().map(|&d| d as i64))
}

fn host_input(t: &HostTensor) -> Result<SessionInputValue<'_>> {
    let shape: Vec<i64> = t.shape().iter().map(|&d| d as i64).collect();
    let value =
        match t.data() {
            HostData::F16(v) => TensorRef::<f16>::from_array_view((shape, v.as_slice()))
                .map(|r| r.into_dyn().into()),
            HostData::BF16(v) => TensorRef::<bf16>::from_array_view((shape, v.as_slice()))
                .map(|r| r.into_dyn().into()),
            HostData::F32(v) => TensorRef::<f32>::from_array_view((shape, v.as_slice()))
                .map(|r| r.into_dyn().into()),
            HostData::I32(v) => TensorRef::<i32>::from_array_view((shape, v.as_slice()))
                .map(|r| r.into_dyn().into()),
            HostData::I64(v) => TensorRef::<i64>::from_array_view((shape, v.as_slice()))
                .map(|r| r.into_dyn().into()),
            HostData::U8(v) => {
                TensorRef::<u8>::from_array_view((shape, v.as_slice())).map(|r| r.into_dyn().into())
            }
        };
    value.map_err(|e| fail("a host batch", e))
}

fn device_input(t: &DeviceTensor) -> Result<SessionInputValue<'_>> {
    let memory = MemoryInfo::new(
        AllocationDevice::CUDA,
        t.ordinal() as i32,
        AllocatorType::Device,
        MemoryType::Default,
    )
    .map_err(|e| fail("CUDA memory", e))?;
    let address = t.address() as *mut ::ort::sys::c_void;
    let shape = dims(t.shape());
    // SAFETY: `address` is the start of the tensor's device allocation on device `ordinal`,
    // which holds `shape`'s elements of the matching type; the view borrows `t`, so the memory
    // outlives it; ONNX Runtime only reads its inputs. Ordering with the session's stream is
    // the caller's, as documented.
    let value =
        unsafe {
            match t.data() {
                DeviceData::F16(_) => TensorRefMut::<f16>::from_raw(memory, address, shape)
                    .map(|r| r.into_dyn().into()),
                DeviceData::BF16(_) => TensorRefMut::<bf16>::from_raw(memory, address, shape)
                    .map(|r| r.into_dyn().into()),
                DeviceData::F32(_) => TensorRefMut::<f32>::from_raw(memory, address, shape)
                    .map(|r| r.into_dyn().into()),
                DeviceData::I32(_) => TensorRefMut::<i32>::from_raw(memory, address, shape)
                    .map(|r| r.into_dyn().into()),
                DeviceData::I64(_) => TensorRefMut::<i64>::from_raw(memory, address, shape)
                    .map(|r| r.into_dyn().into()),
                DeviceData::U8(_) => TensorRefMut::<u8>::from_raw(memory, address, shape)
                    .map(|r| r.into_dyn().into()),
            }
        };
    value.map_err(|e| fail("a CUDA batch", e))
}
