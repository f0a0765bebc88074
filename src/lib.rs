#![doc = include_str!("../README.md")]
#![warn(missing_docs)]
#![deny(unsafe_code)]

mod batch;
pub mod bench;
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
pub use prepare::prepare_image;
pub use source::{Source, IMAGE_EXTENSIONS};
pub use tensor::{HostData, HostTensor, Tensor};
