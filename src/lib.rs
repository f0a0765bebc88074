//! gpufeed feeds images to a GPU model as fast as the hardware allows.
//!
//! The CPU reads, decodes, resizes and centre-crops each image in parallel, keeping pixels `u8`
//! and writing them straight into a pinned staging buffer; the batch crosses PCIe as `u8`, a
//! quarter of the bytes of `f32`, asynchronously while the CPU already works on the next ones;
//! one NVRTC-compiled CUDA kernel then converts, normalizes and lays out the batch as
//! `f16`/`bf16`/`f32`, NCHW or NHWC. Defaults follow torchvision: `Resize(256)`,
//! `CenterCrop(224)`, ImageNet mean and std, NCHW.
//!
//! ```
//! use gpufeed::{DType, Device, Pipeline, Source};
//!
//! let mut pipeline = Pipeline::builder()
//!     .source(Source::directory("assets")?)
//!     .batch_size(4)
//!     .dtype(DType::F32)
//!     .device(Device::Cpu) // Device::Cuda(0) for the GPU
//!     .build()?;
//! while let Some(batch) = pipeline.next_batch()? {
//!     assert_eq!(batch.images().shape()[1..], [3, 224, 224]);
//!     println!("{} images: {:?}", batch.len(), batch.ids());
//! }
//! # Ok::<(), gpufeed::Error>(())
//! ```
//!
//! Data flows one way: [`Source`] (which images, in which order) -> decode -> resize into a
//! staging slot -> upload -> kernel -> [`Batch`].

#![warn(missing_docs)]
#![deny(unsafe_code)]

mod batch;
mod chart;
mod config;
mod decode;
mod error;
#[allow(unsafe_code)]
pub mod gpu;
mod pipeline;
mod prepare;
pub mod reference;
mod resize;
mod source;
mod tensor;

pub use batch::{Batch, EpochReport};
pub use config::{
    Affine, ChannelOrder, Config, DType, Device, Interpolation, LastBatch, Layout, OnError,
    ResizeMode, DEFAULT_MAX_PIXELS, IMAGENET_MEAN, IMAGENET_STD,
};
pub use error::{Error, ItemError, ItemErrorKind, Result};
pub use gpu::DeviceTensor;
pub use pipeline::{Pipeline, PipelineBuilder};
pub use source::{Source, IMAGE_EXTENSIONS};
pub use tensor::{HostData, HostTensor, Tensor};
