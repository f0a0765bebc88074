//! `kernels/views.cu`: the colour calls of many views ([`ViewOp`]: `ImageEnhance`'s brightness,
//! contrast and saturation, the HSV hue shift, grayscale, the float32 Gaussian blur, solarize)
//! on their `u8` pixels in device memory, each view's calls in its drawn order, in one launch.
//! Byte for byte the CPU rendition, [`apply_view_ops`](crate::views::apply_view_ops).

use std::sync::Arc;

use cudarc::driver::{
    CudaFunction, CudaSlice, CudaStream, CudaViewMut, LaunchConfig, PushKernelArg,
};

use super::device::{upload_reusing, Gpu};
use super::kernel_cache::KernelSource;
use crate::error::{Error, Result};
use crate::views::{gaussian_kernel, ViewOp};

/// The kernel source, embedded at build time.
const SOURCE: &str = include_str!("../../kernels/views.cu");

/// Threads of the block that colours one view: more for large views (DINOv2's 512 global
/// views of a 256-image batch fill an H200 with 512 threads each).
/// (At most the kernel's `__launch_bounds__`.)
fn view_threads(pixels: usize) -> u32 {
    if pixels >= 128 * 128 {
        512
    } else {
        256
    }
}

/// The call kinds of the kernel source (`GF_VIEW_*`).
const BRIGHTNESS: u64 = 1;
const CONTRAST: u64 = 2;
const SATURATION: u64 = 3;
const HUE: u64 = 4;
const GRAYSCALE: u64 = 5;
const BLUR: u64 = 6;
const SOLARIZE: u64 = 7;

/// The views' colour calls on the GPU for one device: the kernel, compiled once per device in a
/// process, with the buffers it reuses call after call (the plan of the calls and a scratch of
/// one view's room per view that a blur reads from), grown only when a call needs more.
///
/// ```no_run
/// # fn main() -> gpufeed::Result<()> {
/// use gpufeed::views::ViewOp;
/// let stream = gpufeed::cuda::new_stream(0)?;
/// let mut colour = gpufeed::cuda::ViewColourKernel::new(&stream)?;
/// // Two 96 x 96 views, one after the other.
/// let mut images = stream.clone_htod(&vec![128u8; 2 * 96 * 96 * 3]).expect("upload");
/// let first = [ViewOp::Brightness(1.2), ViewOp::Blur { kernel_size: 9, sigma: 0.8 }];
/// let second = [ViewOp::Grayscale, ViewOp::Solarize(128)];
/// colour.apply(&mut images.slice_mut(..), 96, 96, &[&first, &second])?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct ViewColourKernel {
    stream: Arc<CudaStream>,
    function: CudaFunction,
    /// The plan as the kernel reads it, kept between calls.
    words: Vec<u64>,
    plan: Option<CudaSlice<u64>>,
    scratch: Option<CudaSlice<u8>>,
}

impl ViewColourKernel {
    /// The kernel for the stream's device (compiled once per device in a process, or found in
    /// the kernel cache); its launches go to `stream`.
    pub fn new(stream: &Arc<CudaStream>) -> Result<ViewColourKernel> {
        let module = Gpu::from_stream(stream).module(&kernel_source())?;
        let function = module
            .load_function("gpufeed_views_colour")
            .map_err(|e| Error::cuda("finding the views' colour kernel", e))?;
        Ok(ViewColourKernel {
            stream: stream.clone(),
            function,
            words: Vec::new(),
            plan: None,
            scratch: None,
        })
    }

    /// Applies `calls[k]` (view `k`'s colour calls, in order) to view `k` of `images`, in place:
    /// `calls.len()` views of `height` x `width` packed RGB8 pixels, view `k` at byte
    /// `k * height * width * 3`. The same bytes as
    /// [`apply_view_ops`](crate::views::apply_view_ops) on each view. Asynchronous: the work is
    /// queued on the stream; `images` holds the result once the stream reaches it.
    ///
    /// Errors: `images` too short for the views, a blur kernel too large for the views (as
    /// `apply_view_ops` refuses it) or of size 0, a driver failure.
    pub fn apply(
        &mut self,
        images: &mut CudaViewMut<'_, u8>,
        height: usize,
        width: usize,
        calls: &[&[ViewOp]],
    ) -> Result<()> {
        let views = calls.len();
        let bytes = height * width * 3;
        if images.len() < views * bytes {
            return Err(Error::Mismatch(format!(
                "{views} views of {width}x{height} RGB pixels need {} bytes; the images hold {}",
                views * bytes,
                images.len()
            )));
        }
        let blurs = pack_plan(calls, height, width, &mut self.words)?;
        if bytes == 0 || calls.iter().all(|c| c.is_empty()) {
            return Ok(());
        }
        if views > i32::MAX as usize || height * width > (i32::MAX as usize) / 3 {
            return Err(Error::Mismatch(format!(
                "{views} views of {width}x{height} pixels: too many for one launch"
            )));
        }
        let scratch_bytes = if blurs { views * bytes } else { 1 };
        if self
            .scratch
            .as_ref()
            .is_none_or(|s| s.len() < scratch_bytes)
        {
            self.scratch = None;
            // SAFETY: u8 has no invalid bit patterns; the kernel writes a view's room of the
            // scratch (its blur's output) before it reads it.
            let fresh = unsafe { self.stream.alloc::<u8>(scratch_bytes) }
                .map_err(|e| Error::cuda("allocating the views' colour scratch", e))?;
            self.scratch = Some(fresh);
        }
        let Some(scratch) = self.scratch.as_mut() else {
            return Err(Error::Mismatch(
                "the views' colour scratch is missing".into(),
            ));
        };
        let plan = upload_reusing(&self.stream, &self.words, &mut self.plan)
            .map_err(|e| Error::cuda("uploading the views' colour calls", e))?;
        let (h, w) = (height as i32, width as i32);
        let mut b = self.stream.launch_builder(&self.function);
        b.arg(images).arg(scratch).arg(plan).arg(&h).arg(&w);
        let config = LaunchConfig {
            grid_dim: (views as u32, 1, 1),
            block_dim: (view_threads(height * width), 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the arguments match `gpufeed_views_colour`'s parameters; block `k` reads and
        // writes view `k` of `images` (which holds `views` views, checked above) and, when the
        // plan holds a blur, of the scratch (`views` views' room, allocated above); it reads
        // plan words `plan[k]..plan[k + 1]` and a blur's weights, which `pack_plan` laid out
        // inside the plan it uploaded.
        unsafe { b.launch(config) }
            .map(|_| ())
            .map_err(|e| Error::cuda("launching the views' colour kernel", e))
    }
}

/// The kernel source and its definitions.
fn kernel_source() -> KernelSource {
    KernelSource {
        name: "views.cu",
        code: SOURCE,
        defines: Vec::new(),
    }
}

/// Lays out the plan of `calls` (one entry per view) in `words` as `kernels/views.cu` reads it,
/// and says whether a blur is among them; refuses a blur that `apply_view_ops` would refuse on
/// `height` x `width` views, and one of size 0.
fn pack_plan(
    calls: &[&[ViewOp]],
    height: usize,
    width: usize,
    words: &mut Vec<u64>,
) -> Result<bool> {
    let views = calls.len();
    words.clear();
    words.resize(views + 1, 0);
    let mut blurs = Vec::new();
    for (v, ops) in calls.iter().enumerate() {
        words[v] = words.len() as u64;
        for op in ops.iter() {
            let (kind, arg, body) = match *op {
                ViewOp::Brightness(f) => (BRIGHTNESS, 0, u64::from(f.to_bits())),
                ViewOp::Contrast(f) => (CONTRAST, 0, u64::from(f.to_bits())),
                ViewOp::Saturation(f) => (SATURATION, 0, u64::from(f.to_bits())),
                ViewOp::Hue(f) => (HUE, u64::from(hue_shift(f)), 0),
                ViewOp::Grayscale => (GRAYSCALE, 0, 0),
                ViewOp::Blur { kernel_size, sigma } => {
                    let k = kernel_size as usize;
                    if k == 0 || k / 2 >= height.min(width) {
                        return Err(Error::Mismatch(format!(
                            "a {width}x{height} view is too small for a blur kernel of {k}"
                        )));
                    }
                    blurs.push((words.len() + 1, k, sigma));
                    (BLUR, u64::from(kernel_size), 0)
                }
                ViewOp::Solarize(t) => (SOLARIZE, u64::from(t), 0),
            };
            words.push(kind | (arg << 32));
            words.push(body);
        }
    }
    words[views] = words.len() as u64;
    // The blurs' weights after the calls; each blur's second word points at its own.
    for &(at, k, sigma) in &blurs {
        words[at] = words.len() as u64;
        let k1 = gaussian_kernel(k, sigma);
        let quarter = &k1[..=k / 2];
        for &a in quarter {
            for &b in quarter {
                words.push(f64::from(a * b).to_bits());
            }
        }
    }
    Ok(!blurs.is_empty())
}

/// `F.adjust_hue`'s shift of the hue byte: `uint8(factor * 255)`, truncated toward zero,
/// wrapping.
fn hue_shift(factor: f32) -> u8 {
    (f64::from(factor) * 255.0) as i32 as u8
}

#[cfg(test)]
mod tests;
