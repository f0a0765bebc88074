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
use crate::views::{gaussian_kernel, ViewLayout, ViewOp};

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

/// Bytes of shared memory a block's blur tile may take: with the hue tables and the unrolled
/// blurs' weights (about 3.5 KB), under the 48 KB a launch may ask without opting in. The
/// kernel's 64 registers a thread let a multiprocessor hold two blocks of 512 threads (88 KB
/// of tiles) or four of 256 (176 KB): within its 228 KB either way. A 96 x 96 view with a
/// blur of 9 fits whole, with its halo (10,816 words).
const TILE_BYTES: u32 = 44 << 10;

/// Packed pixels of the tile the blurs of `height` x `width` views read (`tile_words` of
/// `kernels/views.cu`), their largest kernel `largest_kernel` wide: the whole view with its halo
/// if it fits [`TILE_BYTES`], else as much as that holds; 0 (each blur reads the view) when not
/// even one row with its halo fits.
fn tile_words(height: usize, width: usize, largest_kernel: u32) -> u32 {
    let half = largest_kernel as usize / 2;
    let pitch = width + 2 * half;
    let budget = TILE_BYTES as usize / 4;
    if budget / pitch < 1 + 2 * half {
        return 0;
    }
    budget.min((height + 2 * half) * pitch) as u32
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

    /// What the compiled kernel holds per thread on this device, and how many of the blocks
    /// that colour views of `height` x `width` pixels one multiprocessor runs at once: what
    /// sets how many views are coloured together.
    pub fn footprint(&self, height: usize, width: usize) -> Result<KernelFootprint> {
        let threads = view_threads(height * width);
        let f = &self.function;
        let fail = |e| Error::cuda("reading the views' colour kernel's attributes", e);
        Ok(KernelFootprint {
            registers: f.num_regs().map_err(fail)?,
            local_bytes: f.local_size_bytes().map_err(fail)?,
            shared_bytes: f.shared_size_bytes().map_err(fail)?,
            threads,
            blocks_per_multiprocessor: f
                .occupancy_max_active_blocks_per_multiprocessor(threads, 0, None)
                .map_err(fail)?,
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
        let largest_blur = pack_plan(calls, height, width, &mut self.words)?;
        if bytes == 0 || calls.iter().all(|c| c.is_empty()) {
            return Ok(());
        }
        if views > i32::MAX as usize || height * width > (i32::MAX as usize) / 3 {
            return Err(Error::Mismatch(format!(
                "{views} views of {width}x{height} pixels: too many for one launch"
            )));
        }
        let scratch_bytes = if largest_blur.is_some() {
            views * bytes
        } else {
            1
        };
        let threads = view_threads(height * width);
        let tile = largest_blur.map_or(0, |k| tile_words(height, width, k));
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
        b.arg(images)
            .arg(scratch)
            .arg(plan)
            .arg(&h)
            .arg(&w)
            .arg(&tile);
        let config = LaunchConfig {
            grid_dim: (views as u32, 1, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: tile * 4,
        };
        // SAFETY: the arguments match `gpufeed_views_colour`'s parameters; block `k` reads and
        // writes view `k` of `images` (which holds `views` views, checked above) and, when the
        // plan holds a blur, of the scratch (`views` views' room, allocated above); it reads
        // plan words `plan[k]..plan[k + 1]` and a blur's weights, which `pack_plan` laid out
        // inside the plan it uploaded; its tile is the `tile` words of dynamic shared memory
        // the launch gives it.
        unsafe { b.launch(config) }
            .map(|_| ())
            .map_err(|e| Error::cuda("launching the views' colour kernel", e))
    }
}

/// A compiled kernel's resources on one device ([`ViewColourKernel::footprint`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelFootprint {
    /// Registers per thread.
    pub registers: i32,
    /// Local memory per thread, in bytes (spilled registers and arrays kept off registers).
    pub local_bytes: i32,
    /// Static shared memory per block, in bytes.
    pub shared_bytes: i32,
    /// Threads of a block for the asked views.
    pub threads: u32,
    /// Blocks of the asked views that one multiprocessor holds at once.
    pub blocks_per_multiprocessor: u32,
}

/// Threads of a block of the views' unpack.
const UNPACK_THREADS: u32 = 256;

/// The unpack of a batch's records of views into its groups' blocks on one device
/// (`gpufeed_views_unpack`): the lanes working ahead of the batches write each image's views as
/// one record ([`ViewLayout::record_bytes`]), the normalize reads each group's views packed as
/// `[count, n, size, size, 3]` ([`ViewLayout::packed`]).
#[derive(Debug)]
pub(crate) struct ViewUnpack {
    function: CudaFunction,
    /// Per view: its offset in a record, its group block's offset, its number in the group and
    /// its bytes.
    table: CudaSlice<u64>,
    views: u32,
    record_bytes: u64,
    /// Bytes of the groups' blocks for a full batch (what `blocks` must hold).
    blocks_bytes: usize,
    batch: usize,
}

impl ViewUnpack {
    /// The unpack of records laid out as `layout`'s, on `stream`'s device.
    pub fn new(stream: &Arc<CudaStream>, layout: &ViewLayout) -> Result<ViewUnpack> {
        let module = Gpu::from_stream(stream).module(&kernel_source())?;
        let function = module
            .load_function("gpufeed_views_unpack")
            .map_err(|e| Error::cuda("finding the views' unpack kernel", e))?;
        let table: Vec<u64> = layout
            .record_views()
            .flat_map(|(group, j, offset)| {
                let g = &layout.groups[group];
                [offset, g.offset, j, g.view_bytes()].map(|x| x as u64)
            })
            .collect();
        let views = layout.record.len();
        let table = stream
            .clone_htod(&table)
            .map_err(|e| Error::cuda("uploading the views' unpack table", e))?;
        Ok(ViewUnpack {
            function,
            table,
            views: u32::try_from(views).map_err(|_| Error::invalid("views", "too many views"))?,
            record_bytes: layout.record_bytes as u64,
            blocks_bytes: layout.slot_bytes(),
            batch: layout.batch,
        })
    }

    /// Queues on `stream` the copy of the `n` records of `records` (one a place, from the first)
    /// into `blocks`, each group's views packed for `n` images.
    pub fn run(
        &self,
        stream: &Arc<CudaStream>,
        records: &CudaSlice<u8>,
        blocks: &mut CudaSlice<u8>,
        n: usize,
    ) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        if n > self.batch
            || records.len() < n * self.record_bytes as usize
            || blocks.len() < self.blocks_bytes
        {
            return Err(Error::Mismatch(format!(
                "{n} records of views ({} bytes, blocks of {}) for a batch of {} ({} bytes each, \
                 blocks of {})",
                records.len(),
                blocks.len(),
                self.batch,
                self.record_bytes,
                self.blocks_bytes
            )));
        }
        let largest = self.blocks_bytes.min(u32::MAX as usize);
        let chunks = largest
            .div_ceil(16 * UNPACK_THREADS as usize * 64)
            .clamp(1, 16) as u32;
        let config = LaunchConfig {
            grid_dim: (chunks, self.views, n as u32),
            block_dim: (UNPACK_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let n32 = n as u32;
        let mut b = stream.launch_builder(&self.function);
        b.arg(records)
            .arg(blocks)
            .arg(&self.table)
            .arg(&self.record_bytes)
            .arg(&n32);
        // SAFETY: the arguments match `gpufeed_views_unpack`'s parameters; block (c, v, p) reads
        // view v of record p (inside `records`, which holds `n` records, checked above) and
        // writes its place in its group's block packed for `n` images, inside the first
        // `blocks_bytes` of `blocks` (checked above: a group's packed block for `n <= batch`
        // images lies inside its block for a full batch); the table holds 4 words a view.
        unsafe { b.launch(config) }
            .map(|_| ())
            .map_err(|e| Error::cuda("launching the views' unpack", e))
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
/// and gives the largest blur kernel among them (`None`: no blur); refuses a blur that
/// `apply_view_ops` would refuse on `height` x `width` views, and one of size 0.
fn pack_plan(
    calls: &[&[ViewOp]],
    height: usize,
    width: usize,
    words: &mut Vec<u64>,
) -> Result<Option<u32>> {
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
    Ok(blurs.iter().map(|&(_, k, _)| k as u32).max())
}

/// `F.adjust_hue`'s shift of the hue byte: `uint8(factor * 255)`, truncated toward zero,
/// wrapping.
fn hue_shift(factor: f32) -> u8 {
    (f64::from(factor) * 255.0) as i32 as u8
}

#[cfg(test)]
mod tests;
