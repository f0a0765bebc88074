//! Output tensors: [`HostTensor`] in host memory, and [`Tensor`], which is either that or a
//! [`crate::DeviceTensor`] on the GPU.

use half::{bf16, f16};

use crate::config::{DType, Layout};
use crate::error::Result;
use crate::gpu::DeviceTensor;

/// Elements of a host tensor.
#[derive(Debug, Clone, PartialEq)]
pub enum HostData {
    /// Half precision.
    F16(Vec<f16>),
    /// bfloat16.
    BF16(Vec<bf16>),
    /// Single precision.
    F32(Vec<f32>),
}

/// A batch of images in host memory.
#[derive(Debug, Clone, PartialEq)]
pub struct HostTensor {
    pub(crate) data: HostData,
    pub(crate) shape: [usize; 4],
    pub(crate) layout: Layout,
}

impl HostTensor {
    /// Wraps `data` with its `shape` (in `layout` order); the element count must match.
    pub fn new(data: HostData, shape: [usize; 4], layout: Layout) -> Option<HostTensor> {
        let t = HostTensor {
            data,
            shape,
            layout,
        };
        (t.len() == shape.iter().product::<usize>()).then_some(t)
    }

    /// `[N, C, H, W]` or `[N, H, W, C]`, per [`HostTensor::layout`].
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
            HostData::F16(_) => DType::F16,
            HostData::BF16(_) => DType::BF16,
            HostData::F32(_) => DType::F32,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match &self.data {
            HostData::F16(v) => v.len(),
            HostData::BF16(v) => v.len(),
            HostData::F32(v) => v.len(),
        }
    }

    /// Whether the tensor has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The elements.
    pub fn data(&self) -> &HostData {
        &self.data
    }

    /// Every element widened to f32 (exact for all three dtypes).
    pub fn to_f32_vec(&self) -> Vec<f32> {
        match &self.data {
            HostData::F16(v) => v.iter().map(|x| x.to_f32()).collect(),
            HostData::BF16(v) => v.iter().map(|x| x.to_f32()).collect(),
            HostData::F32(v) => v.clone(),
        }
    }

    /// The elements as little-endian bytes, in memory order (what a `.npy` file holds).
    pub fn to_le_bytes(&self) -> Vec<u8> {
        match &self.data {
            HostData::F16(v) => v.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect(),
            HostData::BF16(v) => v.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect(),
            HostData::F32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        }
    }
}

/// A batch of images, on the GPU or in host memory depending on [`crate::Device`].
#[derive(Debug)]
pub enum Tensor {
    /// On a CUDA device, written by the pipeline's stream.
    Device(DeviceTensor),
    /// In host memory ([`crate::Device::Cpu`]).
    Host(HostTensor),
}

impl Tensor {
    /// `[N, C, H, W]` or `[N, H, W, C]`.
    pub fn shape(&self) -> [usize; 4] {
        match self {
            Tensor::Device(t) => t.shape(),
            Tensor::Host(t) => t.shape(),
        }
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        match self {
            Tensor::Device(t) => t.dtype(),
            Tensor::Host(t) => t.dtype(),
        }
    }

    /// Memory layout.
    pub fn layout(&self) -> Layout {
        match self {
            Tensor::Device(t) => t.layout(),
            Tensor::Host(t) => t.layout(),
        }
    }

    /// The device tensor, if this lives on a GPU.
    pub fn as_device(&self) -> Option<&DeviceTensor> {
        match self {
            Tensor::Device(t) => Some(t),
            Tensor::Host(_) => None,
        }
    }

    /// The host tensor, if this lives in host memory.
    pub fn as_host(&self) -> Option<&HostTensor> {
        match self {
            Tensor::Device(_) => None,
            Tensor::Host(t) => Some(t),
        }
    }

    /// Waits until the tensor is complete (a no-op in host memory).
    pub fn synchronize(&self) -> Result<()> {
        match self {
            Tensor::Device(t) => t.synchronize(),
            Tensor::Host(_) => Ok(()),
        }
    }

    /// A host copy (waits for the GPU when on a device).
    pub fn to_host(&self) -> Result<HostTensor> {
        match self {
            Tensor::Device(t) => t.to_host(),
            Tensor::Host(t) => Ok(t.clone()),
        }
    }
}
