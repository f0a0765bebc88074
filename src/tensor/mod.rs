//! Output tensors: [`HostTensor`] in host memory, [`DeviceTensor`] on a CUDA device, and
//! [`Tensor`], which is one or the other. The stages produce them; this module imports none of
//! the stages.

/// The accessors both tensors have from their `shape`, `layout` and `data` fields, one set for
/// [`HostTensor`] and [`DeviceTensor`] (each counts its own elements: [`HostTensor::len`],
/// [`DeviceTensor::len`]).
macro_rules! dense_accessors {
    ($tensor:literal) => {
        #[doc = concat!("`[N, C, H, W]` or `[N, H, W, C]`, per [`", $tensor, "::layout`].")]
        pub fn shape(&self) -> [usize; 4] {
            self.shape
        }

        #[doc = concat!(
                    "Distance in elements between neighbours along each axis of [`",
                    $tensor,
                    "::shape`]: the\ntensor is dense and row-major (C order), whatever its layout."
                )]
        pub fn strides(&self) -> [usize; 4] {
            crate::tensor::row_major_strides(self.shape)
        }

        /// Memory layout.
        pub fn layout(&self) -> crate::options::Layout {
            self.layout
        }

        /// Element type.
        pub fn dtype(&self) -> crate::options::DType {
            self.data.dtype()
        }

        /// Whether the tensor has no elements.
        pub fn is_empty(&self) -> bool {
            self.len() == 0
        }
    };
}

mod device;
mod element;
mod host;

pub use device::{DeviceData, DeviceTensor};
pub use element::Element;
pub use host::{HostData, HostTensor};
pub(crate) use host::{HostPool, NormalizedSlot};

use crate::error::Result;
use crate::options::{DType, Device, Layout};

/// Strides in elements of a dense row-major tensor of `shape`.
pub(crate) fn row_major_strides(shape: [usize; 4]) -> [usize; 4] {
    [
        shape[1] * shape[2] * shape[3],
        shape[2] * shape[3],
        shape[3],
        1,
    ]
}

// Exports (DLPack) share tensors across threads and drop them on any thread.
const _: fn() = || {
    fn shared_across_threads<T: Send + Sync>() {}
    shared_across_threads::<Tensor>();
};

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

    /// Distance in elements between neighbours along each axis: dense, row-major.
    pub fn strides(&self) -> [usize; 4] {
        row_major_strides(self.shape())
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        match self {
            Tensor::Device(t) => t.dtype(),
            Tensor::Host(t) => t.dtype(),
        }
    }

    /// Where the elements are: `Device::Cuda(ordinal)` or `Device::Cpu`.
    pub fn device(&self) -> Device {
        match self {
            Tensor::Device(t) => Device::Cuda(t.ordinal()),
            Tensor::Host(_) => Device::Cpu,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.shape().iter().product()
    }

    /// Whether the tensor has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
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
