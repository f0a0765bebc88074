//! Device tensors: the batches the kernel writes, owned by the [`crate::Batch`] that carries them.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use half::{bf16, f16};

use super::driver_error;
use crate::config::{DType, Layout};
use crate::error::Result;
use crate::tensor::{HostData, HostTensor};

/// Elements of a device tensor, as cudarc slices.
#[derive(Debug)]
pub enum DeviceData {
    /// Half precision.
    F16(CudaSlice<f16>),
    /// bfloat16.
    BF16(CudaSlice<bf16>),
    /// Single precision.
    F32(CudaSlice<f32>),
}

/// A batch of normalized images in GPU memory.
///
/// It was written on the pipeline's stream ([`DeviceTensor::stream`]): work queued on that stream
/// sees it complete; cudarc orders work on other streams through the slice's events.
#[derive(Debug)]
pub struct DeviceTensor {
    pub(crate) data: DeviceData,
    pub(crate) shape: [usize; 4],
    pub(crate) layout: Layout,
}

impl DeviceTensor {
    /// Allocates an uninitialized tensor of `shape` on `stream`.
    pub(crate) fn alloc(
        stream: &Arc<CudaStream>,
        dtype: DType,
        shape: [usize; 4],
        layout: Layout,
    ) -> Result<DeviceTensor> {
        let len: usize = shape.iter().product();
        let len = len.max(1);
        let fail = |e| driver_error("allocating the output batch", e);
        // SAFETY: the memory is left uninitialized; the kernel writes every element of the
        // `shape` before the tensor is handed out.
        let data = unsafe {
            match dtype {
                DType::F16 => DeviceData::F16(stream.alloc::<f16>(len).map_err(fail)?),
                DType::BF16 => DeviceData::BF16(stream.alloc::<bf16>(len).map_err(fail)?),
                DType::F32 => DeviceData::F32(stream.alloc::<f32>(len).map_err(fail)?),
            }
        };
        Ok(DeviceTensor {
            data,
            shape,
            layout,
        })
    }

    /// `[N, C, H, W]` or `[N, H, W, C]`, per [`DeviceTensor::layout`].
    pub fn shape(&self) -> [usize; 4] {
        self.shape
    }

    /// Memory layout.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        match self.data {
            DeviceData::F16(_) => DType::F16,
            DeviceData::BF16(_) => DType::BF16,
            DeviceData::F32(_) => DType::F32,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    /// Whether the tensor has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The cudarc slice holding the elements, to hand to your own kernels or libraries.
    pub fn data(&self) -> &DeviceData {
        &self.data
    }

    /// The stream the tensor was written on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        match &self.data {
            DeviceData::F16(s) => s.stream(),
            DeviceData::BF16(s) => s.stream(),
            DeviceData::F32(s) => s.stream(),
        }
    }

    /// The raw device address of the first element (a `CUdeviceptr`), for frameworks that take
    /// pointers. Valid while this tensor lives; use it on [`DeviceTensor::stream`].
    pub fn device_ptr(&self) -> u64 {
        let stream = self.stream();
        match &self.data {
            DeviceData::F16(s) => s.device_ptr(stream).0,
            DeviceData::BF16(s) => s.device_ptr(stream).0,
            DeviceData::F32(s) => s.device_ptr(stream).0,
        }
    }

    /// Waits until the kernel that writes this tensor (and everything queued before it on its
    /// stream) has finished.
    pub fn synchronize(&self) -> Result<()> {
        self.stream()
            .synchronize()
            .map_err(|e| driver_error("waiting for a batch", e))
    }

    /// Copies the tensor to host memory (waits for the stream).
    pub fn to_host(&self) -> Result<HostTensor> {
        let len = self.len();
        let stream = self.stream().clone();
        let fail = |e| driver_error("copying a batch to the host", e);
        let data = match &self.data {
            DeviceData::F16(s) => HostData::F16(stream.clone_dtoh(&s.slice(..len)).map_err(fail)?),
            DeviceData::BF16(s) => {
                HostData::BF16(stream.clone_dtoh(&s.slice(..len)).map_err(fail)?)
            }
            DeviceData::F32(s) => HostData::F32(stream.clone_dtoh(&s.slice(..len)).map_err(fail)?),
        };
        stream.synchronize().map_err(fail)?;
        Ok(HostTensor {
            data,
            shape: self.shape,
            layout: self.layout,
        })
    }
}
