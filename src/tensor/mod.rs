//! Output tensors: [`HostTensor`] in host memory, [`DeviceTensor`] on a CUDA device, and
//! [`Tensor`], which is one or the other. The stages produce them; this module imports none of
//! the stages.

/// The accessors both tensors have from their `shape`, `layout` and `data` fields, one set for
/// [`HostTensor`] and [`DeviceTensor`] (each counts its own elements: [`HostTensor::len`],
/// [`DeviceTensor::len`]).
macro_rules! dense_accessors {
    ($tensor:literal) => {
        #[doc = concat!(
                    "The sizes of the axes: `[N, C, H, W]` or `[N, H, W, C]` for images (per [`",
                    $tensor,
                    "::layout`]),\nany rank for other tensors (a patch sequence's tokens, its side tensors)."
                )]
        pub fn shape(&self) -> &[usize] {
            &self.shape
        }

        /// Number of axes.
        pub fn rank(&self) -> usize {
            self.shape.len()
        }

        #[doc = concat!(
                    "Distance in elements between neighbours along each axis of [`",
                    $tensor,
                    "::shape`]: the\ntensor is dense and row-major (C order), whatever its layout."
                )]
        pub fn strides(&self) -> Vec<usize> {
            crate::tensor::row_major_strides(&self.shape)
        }

        /// Memory layout of an image batch (other tensors are plain row-major and report
        /// [`Layout::Nchw`](crate::Layout::Nchw)).
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
pub(crate) fn row_major_strides(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![1; shape.len()];
    for axis in (0..shape.len().saturating_sub(1)).rev() {
        strides[axis] = strides[axis + 1] * shape[axis + 1];
    }
    strides
}

/// The element count of `shape`, `None` on overflow.
pub(crate) fn element_count(shape: &[usize]) -> Option<usize> {
    shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d))
}

// Exports (DLPack) share tensors across threads and drop them on any thread.
const _: fn() = || {
    fn shared_across_threads<T: Send + Sync>() {}
    shared_across_threads::<Tensor>();
};

/// A tensor of a batch (its images, a patch sequence's tokens or side tensors), on the GPU or in
/// host memory depending on [`crate::Device`].
#[derive(Debug)]
pub enum Tensor {
    /// On a CUDA device, written by the pipeline's stream.
    Device(DeviceTensor),
    /// In host memory ([`crate::Device::Cpu`]).
    Host(HostTensor),
}

impl Tensor {
    /// The sizes of the axes: `[N, C, H, W]` or `[N, H, W, C]` for images, any rank for other
    /// tensors.
    pub fn shape(&self) -> &[usize] {
        match self {
            Tensor::Device(t) => t.shape(),
            Tensor::Host(t) => t.shape(),
        }
    }

    /// Distance in elements between neighbours along each axis: dense, row-major.
    pub fn strides(&self) -> Vec<usize> {
        row_major_strides(self.shape())
    }

    /// Number of axes.
    pub fn rank(&self) -> usize {
        self.shape().len()
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
