//! Tensors in GPU memory: the batches the normalize kernel writes, owned by the
//! [`crate::Batch`] that carries them.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use half::{bf16, f16};

use super::host::{HostData, HostTensor};
use crate::error::{Error, Result};
use crate::options::{DType, Layout};

/// Elements of a device tensor, as cudarc slices (`gpufeed::cudarc` is the cudarc this crate
/// was built with).
#[derive(Debug)]
pub enum DeviceData {
    /// Half precision.
    F16(CudaSlice<f16>),
    /// bfloat16.
    BF16(CudaSlice<bf16>),
    /// Single precision.
    F32(CudaSlice<f32>),
}

impl DeviceData {
    /// The stream the memory was allocated and written on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        match self {
            DeviceData::F16(s) => s.stream(),
            DeviceData::BF16(s) => s.stream(),
            DeviceData::F32(s) => s.stream(),
        }
    }
}

/// A batch of normalized images in GPU memory.
///
/// It was written on the pipeline's stream ([`DeviceTensor::stream`]): work queued on that stream
/// sees it complete.
#[derive(Debug)]
pub struct DeviceTensor {
    data: DeviceData,
    shape: [usize; 4],
    layout: Layout,
}

impl DeviceTensor {
    /// Allocates a tensor of `shape` (in `layout` order) on `stream`, uninitialized: whoever
    /// allocates it writes every element before reading any.
    pub fn alloc(
        stream: &Arc<CudaStream>,
        dtype: DType,
        shape: [usize; 4],
        layout: Layout,
    ) -> Result<DeviceTensor> {
        let len = shape
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(d))
            .ok_or_else(|| Error::Mismatch(format!("a tensor of shape {shape:?} is too large")))?
            .max(1);
        let fail = |e| Error::cuda("allocating a device tensor", e);
        // SAFETY: the memory is left uninitialized, which the caller is told above; f16, bf16
        // and f32 have no invalid bit patterns, so reading unwritten elements is wrong but not
        // undefined behaviour.
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

    /// The cudarc slice holding the elements.
    pub fn data(&self) -> &DeviceData {
        &self.data
    }

    /// The cudarc slice holding the elements, writable (the normalize kernel writes through it).
    pub fn data_mut(&mut self) -> &mut DeviceData {
        &mut self.data
    }

    /// The stream the tensor was written on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        self.data.stream()
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
            .map_err(|e| Error::cuda("waiting for a batch", e))
    }

    /// Copies the tensor to host memory (waits for the stream).
    pub fn to_host(&self) -> Result<HostTensor> {
        let len = self.len();
        let stream = self.stream().clone();
        let fail = |e| Error::cuda("copying a batch to the host", e);
        let data = match &self.data {
            DeviceData::F16(s) => HostData::F16(stream.clone_dtoh(&s.slice(..len)).map_err(fail)?),
            DeviceData::BF16(s) => {
                HostData::BF16(stream.clone_dtoh(&s.slice(..len)).map_err(fail)?)
            }
            DeviceData::F32(s) => HostData::F32(stream.clone_dtoh(&s.slice(..len)).map_err(fail)?),
        };
        stream.synchronize().map_err(fail)?;
        HostTensor::new(data, self.shape, self.layout)
            .ok_or_else(|| Error::Mismatch("a downloaded batch does not match its shape".into()))
    }
}
