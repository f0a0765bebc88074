//! Feed images to a GPU model as fast as the hardware allows.
//!
//! The CPU reads, decodes (only the part of a JPEG the resize reads), resizes and crops each image
//! in parallel, pixels kept `u8`, straight into pinned staging; the batch crosses PCIe as `u8`, a
//! quarter of the bytes of `f32`, on the pipeline's own stream while the CPU prepares the next
//! batches; one NVRTC-compiled kernel converts, normalizes and lays the batch out as
//! `f16`/`bf16`/`f32`, NCHW or NHWC. Defaults follow torchvision's evaluation transform
//! (`Resize(256)` + `CenterCrop(224)`, ImageNet mean and std, NCHW). With [`Decode::Hybrid`] the
//! GPU's hardware JPEG engines decode beside the CPU threads; [`ResizeMode::RandomResizedCrop`]
//! and [`PipelineBuilder::horizontal_flip`] are torchvision's training transforms; shards
//! ([`PipelineBuilder::shard`], [`Launch`]) and tar shards ([`Source::webdataset`]) serve many
//! processes; [`Pipeline::state`] and [`PipelineBuilder::resume`] checkpoint a run and go on
//! exactly where it stopped ([`PipelineState`]).
//! With the feature `object-store`, `Source::url` reads shards and images from S3, GCS, Azure
//! or HTTP(S) URLs (see `docs/object-storage.md`).
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
//! The data flows one way, and the modules follow it: [`source`](Source) and [`order`](Options)
//! -> the decode lanes, siblings: the CPU lane ([`cpu`]: decode, resize, stage) and the GPU
//! decode lane (the JPEG engines through nvJPEG, the GPU resize; its errors are
//! [`GpuLaneError`]) -> the device stage ([`cuda`]: staging ring, upload, normalize kernel) ->
//! [`Tensor`] -> [`Batch`] -> [`interop`] (DLPack, ONNX Runtime).
//! Options are grouped by the stage that uses them ([`Options`]). A batch on the GPU is read by
//! other streams under the rules of [`DeviceTensor::use_on`]. The README and the pages under
//! `docs/` have the figures, the command line, the Python package and the design.

#![warn(missing_docs)]
#![deny(unsafe_code)]

pub mod augment;
mod background;
mod batch;
pub mod coefficients;
pub mod cpu;
#[allow(unsafe_code)]
pub mod cuda;
mod error;
mod geometry;
#[allow(unsafe_code)]
mod gpu;
#[allow(unsafe_code)]
pub mod interop;
mod launch;
#[allow(unsafe_code)]
mod memory;
mod options;
mod order;
pub mod patches;
mod pipeline;
mod profile;
mod random;
mod resample;
mod schedule;
mod source;
pub mod targets;
#[allow(unsafe_code)]
mod tensor;
pub mod views;

pub use augment::{
    Augment, AugmentOptions, ColorJitter, Mix, Op as AugmentOp, RandomErasing, Recipe,
};
pub use batch::{Batch, BatchPatches, EpochReport};
pub use cpu::{prepare_image, CpuStage, PreparedBatch};
pub use cuda::CudaInfo;
pub use error::{
    CudaUnavailable, Error, ItemError, ItemErrorKind, OptionDifference, Result, ResumeError,
};
pub use geometry::CropDraw;
pub use gpu::{GpuLaneError, NvjpegError, NvjpegStatus, NvjpegUnavailable};
pub use interop::dlpack;
pub use launch::{Launch, Launcher};
pub use options::{
    Affine, BatchOptions, ChannelOrder, DType, Decode, DecodeOptions, Device, DrawRange, Gray16,
    Interpolation, LastBatch, Layout, NormalizeSpec, OnError, Options, OutputOptions,
    ParseOptionError, ResizeMode, ResizeOptions, RuntimeOptions, Shard, ShardBalance,
    DEFAULT_ASSISTED_SHARE, DEFAULT_DECODE_MEMORY, DEFAULT_MAX_FILE_BYTES, DEFAULT_MAX_PIXELS,
    IMAGENET_MEAN, IMAGENET_STD, RANDOM_CROP_RATIO, RANDOM_CROP_SCALE, RANDOM_FLIP_CHANCE,
    SHARED_MACHINE_MIN_GPU_SHARE, SHARED_MACHINE_MIN_RANKS,
};
pub use order::PipelineState;
pub use pipeline::{
    epoch_order, PatchServer, PatchServerBuilder, Pipeline, PipelineBuilder, RequestImage,
    WaitedBatch,
};
pub use profile::{Profile, Stage, StageTime};
#[cfg(feature = "parquet")]
pub use source::{ExtraValue, Extras, ParquetOptions, DEFAULT_PARQUET_BUDGET};
#[cfg(feature = "object-store")]
pub use source::{Interrupt, RemoteOptions, UrlLayout, DEFAULT_READ_BUDGET};
pub use source::{ReadReport, Source, DECODED_EXTENSIONS, IMAGE_EXTENSIONS};
pub use tensor::{DeviceData, DeviceTensor, Element, HostData, HostTensor, Tensor};

/// Whether CUDA can be used on this machine: the driver library and NVRTC load and the driver
/// reports at least one device ([`CudaInfo`] says how many). The error says which piece is
/// missing ([`CudaUnavailable`] inside [`Error::CudaUnavailable`]). Checked once a process
/// (loading the libraries takes about 10 ms), never panicking.
///
/// ```
/// match gpufeed::cuda_status() {
///     Ok(info) => println!("{} CUDA device(s)", info.device_count),
///     Err(why) => println!("the CPU device, then: {why}"),
/// }
/// ```
pub fn cuda_status() -> Result<CudaInfo> {
    cuda::probe()
}

/// The cudarc this crate was built with: name its types (streams, slices, events) through this,
/// so their versions always match the batches'.
pub use cudarc;
/// The `half` crate of the `f16` and `bf16` element types.
pub use half;

/// The README's examples, compiled and run as doc tests so they cannot fall behind the API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeExamples;

/// The examples of the pages under `docs/`, compiled as doc tests too.
#[cfg(doctest)]
mod docs_examples {
    #[doc = include_str!("../docs/library.md")]
    struct Library;
    #[doc = include_str!("../docs/how-it-works.md")]
    struct HowItWorks;
    #[doc = include_str!("../docs/training.md")]
    struct Training;
    #[doc = include_str!("../docs/many-processes.md")]
    struct ManyProcesses;
    #[doc = include_str!("../docs/interop.md")]
    struct Interop;
    #[doc = include_str!("../docs/resume.md")]
    struct Resume;
    #[doc = include_str!("../docs/patches.md")]
    struct Patches;
    #[doc = include_str!("../docs/views.md")]
    struct Views;
    #[doc = include_str!("../docs/targets.md")]
    struct Targets;
}

/// The object-storage page's examples, compiled as doc tests.
#[cfg(all(doctest, feature = "object-store"))]
#[doc = include_str!("../docs/object-storage.md")]
struct ObjectStorageExamples;

/// The Parquet page's examples, compiled as doc tests.
#[cfg(all(doctest, feature = "parquet", feature = "object-store"))]
#[doc = include_str!("../docs/parquet.md")]
struct ParquetExamples;
