//! `kernels/ycc.cu`: the Y, Cb and Cr planes the JPEG engines decode, made RGB exactly as
//! libjpeg-turbo makes them (its "fancy" chroma upsampling and fixed-point colour conversion),
//! for a whole batch in one launch. The GPU lane then differs from the CPU lane only where the
//! engines' inverse DCT differs from libjpeg's.

use std::sync::Arc;

use cudarc::driver::{
    CudaFunction, CudaSlice, CudaStream, DeviceRepr, LaunchConfig, PushKernelArg,
};

use crate::cuda::{upload_reusing, Gpu, KernelSource};
use crate::error::{Error, Result};

/// The kernel source, embedded at build time.
pub(crate) const SOURCE: &str = include_str!("../../kernels/ycc.cu");

/// How the chroma planes are subsampled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ChromaSampling {
    /// 4:4:4: full size.
    Full,
    /// 4:2:2: halved across.
    HalfWidth,
    /// 4:2:0: halved both ways.
    HalfBoth,
    /// 4:4:0: halved down.
    HalfHeight,
}

/// One image to convert: its planes and where its RGB goes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct YccJob {
    pub y: u64,
    pub cb: u64,
    pub cr: u64,
    pub y_pitch: u32,
    pub c_pitch: u32,
    pub width: u32,
    pub height: u32,
    pub c_width: u32,
    pub c_height: u32,
    pub sampling: ChromaSampling,
    /// Where the RGB goes: `width * 3` bytes a row.
    pub out: u64,
}

/// `struct GfYccImage` of kernels/ycc.cu.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct GfYccImage {
    y: u64,
    cb: u64,
    cr: u64,
    out: u64,
    y_pitch: u32,
    c_pitch: u32,
    width: u32,
    height: u32,
    c_width: u32,
    c_height: u32,
    kind: u32,
    unused: u32,
}

// SAFETY: `GfYccImage` is `repr(C)` plain old data laid out as the kernel's struct (four u64,
// then eight u32: 64 bytes, no padding), so its bytes can be copied to the device as they are.
unsafe impl DeviceRepr for GfYccImage {}

const THREADS: u32 = 256;
/// Blocks per image along x: each thread loops over its share of the image's pixels.
const BLOCKS_PER_IMAGE: u32 = 32;

/// The compiled conversion and its descriptor buffer.
#[derive(Debug)]
pub(crate) struct YccConverter {
    function: CudaFunction,
    descriptors: Option<CudaSlice<GfYccImage>>,
}

impl YccConverter {
    /// The kernel for `gpu`'s device (compiled once per device in a process).
    pub fn new(gpu: &Gpu) -> Result<YccConverter> {
        let module = gpu.module(&KernelSource {
            name: "ycc.cu",
            code: SOURCE,
            defines: Vec::new(),
        })?;
        let function = module
            .load_function("gpufeed_ycc_to_rgb")
            .map_err(|e| Error::cuda("finding the colour conversion kernel", e))?;
        Ok(YccConverter {
            function,
            descriptors: None,
        })
    }

    /// Queues the conversion of `jobs` on `stream`.
    ///
    /// # Safety
    ///
    /// Every job's planes must be device memory of the stream's context holding the samples it
    /// describes, and its output `width * height * 3` writable bytes, all alive and not used by
    /// other work until the stream has run this kernel.
    pub unsafe fn convert(&mut self, stream: &Arc<CudaStream>, jobs: &[YccJob]) -> Result<()> {
        if jobs.is_empty() {
            return Ok(());
        }
        let images: Vec<GfYccImage> = jobs
            .iter()
            .map(|j| GfYccImage {
                y: j.y,
                cb: j.cb,
                cr: j.cr,
                out: j.out,
                y_pitch: j.y_pitch,
                c_pitch: j.c_pitch,
                width: j.width,
                height: j.height,
                c_width: j.c_width.max(1),
                c_height: j.c_height.max(1),
                kind: match j.sampling {
                    ChromaSampling::Full => 0,
                    ChromaSampling::HalfWidth => 1,
                    ChromaSampling::HalfBoth => 2,
                    ChromaSampling::HalfHeight => 3,
                },
                unused: 0,
            })
            .collect();
        let descriptors = upload_reusing(stream, &images, &mut self.descriptors)
            .map_err(|e| Error::cuda("uploading the colour conversion's descriptors", e))?;
        let config = LaunchConfig {
            grid_dim: (BLOCKS_PER_IMAGE, images.len() as u32, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut builder = stream.launch_builder(&self.function);
        builder.arg(descriptors);
        // SAFETY: the kernel takes one argument, the descriptor array, which holds at least
        // `images.len()` entries (the grid's y), each naming memory the caller vouches for (this
        // function's contract); every thread stays inside its image's `width * height` pixels.
        unsafe { builder.launch(config) }
            .map(|_| ())
            .map_err(|e| Error::cuda("launching the colour conversion", e))
    }
}
