//! The GPU side of the path: `kernels/idct.cu` and `kernels/entropy.cu` compiled once per
//! device, and a [`GpuDecoder`] that takes a batch of images into pinned staging memory, uploads
//! it and queues the kernels on one stream. An image comes packed (its coefficients decoded by
//! libjpeg-turbo on the CPU, [`GpuDecoder::add`]) or entropy-coded (a baseline JPEG parsed by
//! [`super::entropy::parse`], [`GpuDecoder::add_entropy_coded`]: the GPU decodes its Huffman
//! data into dense coefficients first); a batch may mix both. Every buffer is sized once from a
//! [`Budget`]; a batch allocates nothing (the descriptor vectors keep their capacity).
//!
//! Ordering: everything is queued on the decoder's stream. [`GpuDecoder::add`] waits (once a
//! batch) for the previous batch's upload to have left the staging memory; the rendered windows
//! of a batch stay in [`GpuDecoder::output`] until the next [`GpuDecoder::transform`], so work
//! queued on the same stream in between (the resize) reads them safely.

use std::sync::Arc;

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{
    CudaEvent, CudaFunction, CudaSlice, CudaStream, DeviceRepr, LaunchConfig, PushKernelArg,
};

use super::batch::{
    footprint, BatchPlan, ColorJob, IdctJob, Rendered, COLOR_THREADS, IDCT_THREADS,
};
use super::entropy::ParsedJpeg;
use super::entropy_batch::{
    entropy_footprint, stage, staged_len, subsequences, DensePlanes, EntropyPlan, HuffImage,
    HuffInterval, HuffSub, BASE_BYTES, EXIT_BYTES, GROUP_SUBS, HUFF_THREADS, PASSES,
    QUANT_SECTIONS,
};
use super::pack::PackedImage;
use super::sync_passes::{size_class, Settled, SyncPasses};
use super::{Error, Layout, Window};
use crate::cuda::{Gpu, KernelSource};
use crate::memory::PageLocked;

/// The kernel source, embedded at build time.
pub const SOURCE: &str = include_str!("../../kernels/idct.cu");
/// The entropy decoder's kernel source.
pub const ENTROPY_SOURCE: &str = include_str!("../../kernels/entropy.cu");

// SAFETY: `IdctJob` and `ColorJob` are `repr(C)` plain integers laid out as the kernel's
// `GfIdctJob` and `GfColorJob` (40 and 160 bytes, no padding: batch.rs's test and the kernel's
// static_asserts check the sizes), so their bytes can be copied to the device as they are.
unsafe impl DeviceRepr for IdctJob {}
// SAFETY: as above.
unsafe impl DeviceRepr for ColorJob {}
// SAFETY: `HuffImage`, `HuffSub` and `HuffInterval` are `repr(C)` plain integers laid out as the
// entropy kernel's `GfHuffImage`, `GfHuffSub` and `GfHuffInterval` (128, 24 and 24 bytes, no
// padding: entropy_batch.rs's test and the kernel's static_asserts check the sizes).
unsafe impl DeviceRepr for HuffImage {}
// SAFETY: as above.
unsafe impl DeviceRepr for HuffSub {}
// SAFETY: as above.
unsafe impl DeviceRepr for HuffInterval {}

/// The memory of a [`GpuDecoder`], allocated once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// Packed coefficient bytes a batch holds: pinned host memory, and as much on the device.
    pub coefficient_bytes: usize,
    /// Bytes of component planes a batch holds on the device.
    pub plane_bytes: usize,
    /// Bytes of rendered windows a batch holds on the device.
    pub output_bytes: usize,
    /// Images a batch holds.
    pub images: usize,
    /// Bytes of dense coefficients (`i16`, whole images) a batch's entropy-coded images hold on
    /// the device.
    pub dense_bytes: usize,
    /// Subsequences of entropy-coded data a batch holds (about one per 128 bytes of data, at
    /// least one per restart interval); about 140 device bytes each.
    pub subsequences: usize,
}

impl Budget {
    /// A budget for batches of up to `megapixels` of windows in up to `images` images: planes
    /// and outputs at 3 bytes a pixel (4:4:4 colour, the most), packed coefficients at 2 bytes a
    /// pixel (four times what camera photos at quality 90 take; a batch that does not fit is
    /// cut short by [`GpuDecoder::fits`], never overrun). Entropy-coded images get dense
    /// coefficients for `megapixels` of whole 4:4:4 images (6 bytes a pixel) and a subsequence
    /// for every 64 bytes of staging.
    pub fn for_megapixels(megapixels: f64, images: usize) -> Budget {
        let pixels = (megapixels.max(0.0) * 1e6) as usize;
        Budget {
            coefficient_bytes: 2 * pixels,
            plane_bytes: 3 * pixels + images * 3 * 1024,
            output_bytes: 3 * pixels + images * 256,
            images,
            dense_bytes: 6 * pixels + images * 3 * 2048,
            subsequences: 2 * pixels / 64 + images * 16,
        }
    }

    /// Device bytes the budget takes (besides the descriptors).
    pub fn device_bytes(&self) -> usize {
        self.coefficient_bytes
            + self.plane_bytes
            + self.output_bytes
            + self.dense_bytes
            + self.subsequences * (2 * EXIT_BYTES + BASE_BYTES + 48 + 2)
    }
}

/// The path's kernels and buffers on one stream.
pub struct GpuDecoder {
    stream: Arc<CudaStream>,
    budget: Budget,
    idct: CudaFunction,
    color: CudaFunction,
    staging: PageLocked,
    /// Recorded after the last upload from `staging`.
    uploaded: Option<CudaEvent>,
    /// Recorded after a batch's kernels, for a thread to wait on without spinning: a batch of
    /// camera photos keeps the GPU busy for milliseconds, a core's worth of time the CPU
    /// threads decoding the next files have a use for.
    finished: CudaEvent,
    staged: usize,
    planes_used: u64,
    output_used: u64,
    images: Vec<(PackedImage, u64)>,
    plan: BatchPlan,
    coefficients: CudaSlice<u8>,
    planes: CudaSlice<u8>,
    output: CudaSlice<u8>,
    idct_jobs: CudaSlice<IdctJob>,
    color_jobs: CudaSlice<ColorJob>,
    entropy: Entropy,
}

/// The entropy decoder's kernels, plan and buffers.
struct Entropy {
    zero: CudaFunction,
    sync: CudaFunction,
    group: CudaFunction,
    scan: CudaFunction,
    expand: CudaFunction,
    write: CudaFunction,
    plan: EntropyPlan,
    /// Per entropy-coded image: its index in the batch.
    batch_index: Vec<usize>,
    /// Per entropy-coded image: its index in the batch and its planes (kept for its capacity).
    dense_jobs: Vec<(usize, DensePlanes)>,
    dense: CudaSlice<i16>,
    images: CudaSlice<HuffImage>,
    subs: CudaSlice<HuffSub>,
    intervals: CudaSlice<HuffInterval>,
    exits: CudaSlice<u8>,
    bases: CudaSlice<u8>,
    /// Per group of subsequences: its sums (an exit's layout) and its first block and DC
    /// predictors (a base's).
    groups: CudaSlice<u8>,
    group_bases: CudaSlice<u8>,
    changed: CudaSlice<u32>,
    status: CudaSlice<u32>,
    /// Synchronisation passes to launch, from the recent batches' outcomes.
    passes: SyncPasses,
    /// Passes the last batch launched.
    launched: u32,
    /// The last batch's size class while its outcome is still to be read.
    unread: Option<u8>,
    /// The last batch's per-pass flags, read back with its status.
    changed_host: Vec<u32>,
    /// The last batch's status words, read back (one an image).
    status_host: Vec<u32>,
}

impl std::fmt::Debug for GpuDecoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuDecoder")
            .field("budget", &self.budget)
            .field("images", &self.images.len())
            .finish_non_exhaustive()
    }
}

fn allocated<T>(r: Result<T, cudarc::driver::DriverError>) -> Result<T, Error> {
    r.map_err(device("allocating the path's device memory"))
}

fn device(context: &'static str) -> impl FnOnce(cudarc::driver::DriverError) -> Error {
    move |e| Error::Device(Box::new(crate::Error::cuda(context, e)))
}

impl GpuDecoder {
    /// Compiles the kernels for `stream`'s device (once per device in a process) and allocates
    /// the buffers of `budget`.
    pub fn new(stream: &Arc<CudaStream>, budget: Budget) -> Result<GpuDecoder, Error> {
        let gpu = Gpu::from_stream(stream);
        let module = gpu
            .module(&KernelSource {
                name: "idct.cu",
                code: SOURCE,
                defines: Vec::new(),
            })
            .map_err(|e| Error::Device(Box::new(e)))?;
        let load = |name: &str| {
            module
                .load_function(name)
                .map_err(device("finding a kernel of idct.cu"))
        };
        let idct = load("gpufeed_idct_islow")?;
        let color = load("gpufeed_upsample_color")?;
        let module = gpu
            .module(&KernelSource {
                name: "entropy.cu",
                code: ENTROPY_SOURCE,
                defines: Vec::new(),
            })
            .map_err(|e| Error::Device(Box::new(e)))?;
        let load = |name: &str| {
            module
                .load_function(name)
                .map_err(device("finding a kernel of entropy.cu"))
        };
        let (zero, sync, group, scan, expand, write) = (
            load("gpufeed_huff_zero")?,
            load("gpufeed_huff_sync")?,
            load("gpufeed_huff_group")?,
            load("gpufeed_huff_scan")?,
            load("gpufeed_huff_expand")?,
            load("gpufeed_huff_write")?,
        );
        let ctx = stream.context();
        let staging = PageLocked::new(ctx, budget.coefficient_bytes.max(8))
            .map_err(device("allocating pinned staging memory"))?;
        // SAFETY: device memory left uninitialized: the kernels read only coefficients uploaded
        // before them, planes the IDCT wrote before, and the descriptors uploaded before them.
        let (coefficients, planes, output, idct_jobs, color_jobs) = unsafe {
            (
                stream.alloc::<u8>(budget.coefficient_bytes.max(8)),
                stream.alloc::<u8>(budget.plane_bytes.max(8)),
                stream.alloc::<u8>(budget.output_bytes.max(8)),
                stream.alloc::<IdctJob>(3 * budget.images.max(1)),
                stream.alloc::<ColorJob>(budget.images.max(1)),
            )
        };
        let subs = budget.subsequences.max(1);
        // SAFETY: device memory left uninitialized: the entropy kernels read only descriptors
        // uploaded before them, flags and status words zeroed before them, exits and bases
        // written by the launches before them, and they zero the dense planes before writing.
        let groups = subs.div_ceil(GROUP_SUBS);
        let (dense, images, subs_buf, intervals, exits, bases, changed, status) = unsafe {
            (
                stream.alloc::<i16>((budget.dense_bytes / 2).max(64)),
                stream.alloc::<HuffImage>(budget.images.max(1)),
                stream.alloc::<HuffSub>(subs),
                stream.alloc::<HuffInterval>(subs),
                stream.alloc::<u8>(2 * subs * EXIT_BYTES),
                stream.alloc::<u8>(subs * BASE_BYTES),
                stream.alloc::<u32>(PASSES as usize),
                stream.alloc::<u32>(budget.images.max(1)),
            )
        };
        // SAFETY: as above: the group kernels write these before the scans read them.
        let (group_sums, group_bases) = unsafe {
            (
                stream.alloc::<u8>(groups * EXIT_BYTES),
                stream.alloc::<u8>(groups * BASE_BYTES),
            )
        };
        let entropy = Entropy {
            zero,
            sync,
            group,
            scan,
            expand,
            write,
            plan: EntropyPlan::default(),
            batch_index: Vec::with_capacity(budget.images),
            dense_jobs: Vec::with_capacity(budget.images),
            dense: allocated(dense)?,
            images: allocated(images)?,
            subs: allocated(subs_buf)?,
            intervals: allocated(intervals)?,
            exits: allocated(exits)?,
            bases: allocated(bases)?,
            groups: allocated(group_sums)?,
            group_bases: allocated(group_bases)?,
            changed: allocated(changed)?,
            status: allocated(status)?,
            passes: SyncPasses::new(),
            launched: 0,
            unread: None,
            changed_host: vec![0; PASSES as usize],
            status_host: vec![0; budget.images.max(1)],
        };
        Ok(GpuDecoder {
            stream: stream.clone(),
            budget,
            idct,
            color,
            staging,
            uploaded: None,
            finished: stream
                .context()
                .new_event(Some(CUevent_flags::CU_EVENT_BLOCKING_SYNC))
                .map_err(device("creating the decoder's event"))?,
            staged: 0,
            planes_used: 0,
            output_used: 0,
            images: Vec::with_capacity(budget.images),
            plan: BatchPlan::default(),
            coefficients: allocated(coefficients)?,
            planes: allocated(planes)?,
            output: allocated(output)?,
            idct_jobs: allocated(idct_jobs)?,
            color_jobs: allocated(color_jobs)?,
            entropy,
        })
    }

    /// The budget the buffers were sized from.
    pub fn budget(&self) -> &Budget {
        &self.budget
    }

    /// The stream everything is queued on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Starts a new batch (the images added so far are forgotten).
    pub fn clear(&mut self) {
        self.images.clear();
        self.staged = 0;
        self.planes_used = 0;
        self.output_used = 0;
        self.entropy.plan.clear();
        self.entropy.batch_index.clear();
    }

    /// Images in the batch.
    pub fn len(&self) -> usize {
        self.images.len()
    }

    /// Whether the batch is empty.
    pub fn is_empty(&self) -> bool {
        self.images.is_empty()
    }

    /// Packed bytes staged for the batch.
    pub fn staged_bytes(&self) -> usize {
        self.staged
    }

    /// Whether `image` fits in the batch's budget beside the images added.
    pub fn fits(&self, image: &PackedImage) -> bool {
        let (planes, output) = footprint(image);
        self.images.len() < self.budget.images
            && self.staged + image.bytes <= self.budget.coefficient_bytes
            && self.planes_used + planes <= self.budget.plane_bytes as u64
            && self.output_used + output <= self.budget.output_bytes as u64
    }

    /// Adds `image` (with `bytes`, its packed bytes as [`super::pack::pack`] wrote them) to
    /// the batch: a copy into pinned memory. Returns its index in the batch. The first image of
    /// a batch waits until the previous batch's upload has left the staging memory.
    pub fn add(&mut self, image: &PackedImage, bytes: &[u8]) -> Result<usize, Error> {
        if bytes.len() != image.bytes {
            return Err(Error::Request(format!(
                "{} packed bytes for an image of {}",
                bytes.len(),
                image.bytes
            )));
        }
        if !self.fits(image) {
            return Err(Error::Request(format!(
                "the image does not fit in the batch's budget ({:?}; {} images, {} coefficient \
                 bytes staged)",
                self.budget,
                self.images.len(),
                self.staged
            )));
        }
        let at = self.staged;
        self.staging_free()?[at..at + bytes.len()].copy_from_slice(bytes);
        let (planes, output) = footprint(image);
        self.images.push((*image, self.staged as u64));
        self.staged += bytes.len();
        self.planes_used += planes;
        self.output_used += output;
        Ok(self.images.len() - 1)
    }

    /// The staging memory, once the previous batch's upload has left it.
    fn staging_free(&mut self) -> Result<&mut [u8], Error> {
        if let Some(event) = self.uploaded.take() {
            event
                .synchronize()
                .map_err(device("waiting for the previous upload"))?;
        }
        Ok(self.staging.as_mut_slice())
    }

    /// What an entropy-coded image stages: per component its multiplier table (128 bytes), its
    /// Huffman tables, its data padded to 8 bytes; and the image as the IDCT plan sees it.
    fn entropy_image(
        parsed: &ParsedJpeg,
        layout: &Layout,
        window: &Window,
    ) -> Result<PackedImage, Error> {
        let consistent = layout.width == parsed.width
            && layout.height == parsed.height
            && layout.components.len() == parsed.components.len()
            && layout
                .components
                .iter()
                .zip(&parsed.components)
                .all(|(l, p)| {
                    l.blocks_wide <= p.plane_blocks_wide && l.blocks_high <= p.plane_blocks_high
                });
        if !consistent {
            return Err(Error::Request("the layout is not the parsed JPEG's".into()));
        }
        PackedImage::dense(layout, window, QUANT_SECTIONS, staged_len(parsed))
    }

    /// Whether the baseline JPEG `parsed` (with `layout`, its [`Layout`], and `window`, what
    /// to render of it) fits in the batch's budget beside the images added.
    pub fn fits_entropy_coded(
        &self,
        parsed: &ParsedJpeg,
        layout: &Layout,
        window: &Window,
    ) -> bool {
        Self::entropy_image(parsed, layout, window)
            .is_ok_and(|image| self.fits(&image) && self.entropy_fits(parsed))
    }

    /// Whether the entropy decoder's buffers take `parsed` beside the images added.
    fn entropy_fits(&self, parsed: &ParsedJpeg) -> bool {
        let plan = &self.entropy.plan;
        let (_, _, coefficients) = entropy_footprint(parsed);
        (plan.coefficients + coefficients) * 2 <= self.budget.dense_bytes as u64
            && plan.subs.len() as u64 + subsequences(parsed) <= self.budget.subsequences as u64
            && plan.intervals.len() + parsed.intervals.len() <= self.budget.subsequences
    }

    /// Adds the baseline JPEG `parsed` ([`super::entropy::parse`]) to the batch, to be
    /// entropy-decoded on the GPU: its data and tables are copied into pinned memory. `layout`
    /// is its [`Layout`] (from its headers), `window` what to render of it. Returns its index in
    /// the batch. After [`GpuDecoder::transform`], [`GpuDecoder::entropy_failures`] says whether
    /// its decode was exact; a failed image's window holds no meaningful pixels (decode that
    /// file on the CPU).
    pub fn add_entropy_coded(
        &mut self,
        parsed: &ParsedJpeg,
        layout: &Layout,
        window: &Window,
    ) -> Result<usize, Error> {
        let image = Self::entropy_image(parsed, layout, window)?;
        if !self.fits(&image) || !self.entropy_fits(parsed) {
            return Err(Error::Request(format!(
                "the image does not fit in the batch's budget ({:?}; {} images, {} bytes \
                 staged, {} subsequences, {} dense coefficients)",
                self.budget,
                self.images.len(),
                self.staged,
                self.entropy.plan.subs.len(),
                self.entropy.plan.coefficients
            )));
        }
        let at = self.staged;
        let staged = stage(parsed, &mut self.staging_free()?[at..at + image.bytes])?;
        // Planned last: on an error the batch is as it was.
        self.entropy.plan.push(
            parsed,
            (at + staged.data) as u64 / 4,
            (at + staged.tables) as u64 / 4,
        )?;
        let (planes, output) = footprint(&image);
        self.images.push((image, at as u64));
        self.staged += image.bytes;
        self.planes_used += planes;
        self.output_used += output;
        self.entropy.batch_index.push(self.images.len() - 1);
        Ok(self.images.len() - 1)
    }

    /// The entropy-coded images of the last transformed batch whose GPU decode was not exact,
    /// with their status bits ([`super::entropy_batch::status`]): a code no table holds, a run
    /// past coefficient 63, data cut short or corrupt, no synchronisation (by the last pass
    /// launched). Waits for the stream, and tells the pass policy ([`SyncPasses`]) how many
    /// passes the batch needed.
    pub fn entropy_failures(&mut self) -> Result<Vec<(usize, u32)>, Error> {
        let n = self.entropy.batch_index.len();
        if n == 0 {
            return Ok(Vec::new());
        }
        self.finished
            .record(&self.stream)
            .map_err(device("recording the entropy decode's end"))?;
        self.finished
            .synchronize()
            .map_err(device("waiting for the entropy decode"))?;
        let e = &mut self.entropy;
        let Some(status) = e.status_host.get_mut(..n) else {
            return Err(Error::Request(format!(
                "{n} entropy-coded images in a batch of at most {}",
                e.status_host.len()
            )));
        };
        self.stream
            .memcpy_dtoh(&e.status.slice(..n), status)
            .map_err(device("downloading the entropy decode's status"))?;
        let failures = e
            .batch_index
            .iter()
            .zip(status.iter())
            .filter(|(_, &s)| s != 0)
            .map(|(&i, &s)| (i, s))
            .collect();
        self.settled()?;
        Ok(failures)
    }

    /// Reads the last batch's per-pass flags (the stream has finished it) and tells the pass
    /// policy how many passes it needed.
    fn settled(&mut self) -> Result<(), Error> {
        let e = &mut self.entropy;
        let Some(class) = e.unread.take() else {
            return Ok(());
        };
        let launched = e.launched as usize;
        let flags = &mut e.changed_host[..launched];
        self.stream
            .memcpy_dtoh(&e.changed.slice(..launched), flags)
            .map_err(device("downloading the synchronisation flags"))?;
        e.passes.record(class, Settled::from_flags(flags));
        Ok(())
    }

    /// Queues the upload of the batch's packed coefficients on the stream.
    pub fn upload(&mut self) -> Result<(), Error> {
        if self.staged == 0 {
            return Ok(());
        }
        let staging = self.staging.as_slice();
        let mut dst = self.coefficients.slice_mut(..self.staged);
        // From a plain slice of page-locked memory the copy is asynchronous and cudarc does not
        // track it; the event below does, and `add` waits for it before writing again.
        self.stream
            .memcpy_htod(&staging[..self.staged], &mut dst)
            .map_err(device("uploading packed coefficients"))?;
        self.uploaded = Some(
            self.stream
                .record_event(None)
                .map_err(device("recording an upload"))?,
        );
        Ok(())
    }

    /// Plans the batch and queues both kernels on the stream (after [`GpuDecoder::upload`]).
    /// Afterwards [`GpuDecoder::rendered`] says where each image's window is in
    /// [`GpuDecoder::output`].
    pub fn transform(&mut self) -> Result<(), Error> {
        self.plan.plan(&self.images)?;
        if self.images.is_empty() {
            return Ok(());
        }
        let plan = &self.plan;
        if plan.plane_bytes > self.budget.plane_bytes as u64
            || plan.output_bytes > self.budget.output_bytes as u64
        {
            return Err(Error::Request(format!(
                "the batch needs {} plane and {} output bytes, the budget has {} and {}",
                plan.plane_bytes,
                plan.output_bytes,
                self.budget.plane_bytes,
                self.budget.output_bytes
            )));
        }
        self.point_at_dense_planes();
        self.decode_entropy()?;
        let plan = &self.plan;
        let mut idct_jobs = self.idct_jobs.slice_mut(..plan.idct.len());
        self.stream
            .memcpy_htod(&plan.idct, &mut idct_jobs)
            .map_err(device("uploading the IDCT jobs"))?;
        let mut color_jobs = self.color_jobs.slice_mut(..plan.color.len());
        self.stream
            .memcpy_htod(&plan.color, &mut color_jobs)
            .map_err(device("uploading the colour jobs"))?;

        let config = LaunchConfig {
            grid_dim: (plan.idct_grid_x, plan.idct.len() as u32, 1),
            block_dim: (IDCT_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut builder = self.stream.launch_builder(&self.idct);
        builder
            .arg(&self.coefficients)
            .arg(&self.entropy.dense)
            .arg(&mut self.planes)
            .arg(&self.idct_jobs);
        // SAFETY: the arguments match gpufeed_idct_islow's (coefficients, dense, planes, jobs).
        // The grid's y is the number of jobs uploaded just before on this stream; each job's
        // section lies in the coefficients uploaded before it (the packer's offsets inside an
        // image's bytes, or an entropy-coded image's multiplier tables, the image at its staging
        // offset, all below `staged`); a dense job's blocks lie in its image's planes in `dense`
        // (the window's block rectangle inside the plane, checked by `add_entropy_coded`, the
        // planes inside `dense_bytes`, checked by `entropy_fits`), written by the entropy
        // kernels before it on this stream; its plane (blocks * 64 bytes from its offset) lies
        // inside `plane_bytes`, checked against the buffer above. Threads past a job's blocks
        // do nothing.
        unsafe { builder.launch(config) }.map_err(device("launching the inverse DCT"))?;

        let config = LaunchConfig {
            grid_dim: (plan.color_grid_x, plan.color.len() as u32, 1),
            block_dim: (COLOR_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut builder = self.stream.launch_builder(&self.color);
        builder
            .arg(&self.planes)
            .arg(&mut self.output)
            .arg(&self.color_jobs);
        // SAFETY: the arguments match gpufeed_upsample_color's (planes, out, jobs). The grid's y
        // is the number of jobs uploaded before on this stream; every plane sample a job reads
        // is inside its component's plane (the window's samples with their context, clamped to
        // the component's real samples, lie in the block rectangle the planner gave the plane),
        // written by the IDCT before it on this stream; every pixel it writes lies in its
        // window's `height * out_pitch` bytes from `out`, inside `output_bytes`, checked above.
        unsafe { builder.launch(config) }.map_err(device("launching upsampling and colour"))?;
        Ok(())
    }

    /// Points the IDCT jobs of the entropy-coded images at their dense planes.
    fn point_at_dense_planes(&mut self) {
        let dense = &mut self.entropy.dense_jobs;
        dense.clear();
        dense.extend(
            self.entropy
                .batch_index
                .iter()
                .copied()
                .zip(self.entropy.plan.planes.iter().copied()),
        );
        self.plan.point_at_dense(&self.images, dense);
    }

    /// Queues the entropy decoder's launches for the batch's entropy-coded images.
    fn decode_entropy(&mut self) -> Result<(), Error> {
        let e = &mut self.entropy;
        let plan = &e.plan;
        if plan.images.is_empty() {
            return Ok(());
        }
        let mut images = e.images.slice_mut(..plan.images.len());
        self.stream
            .memcpy_htod(&plan.images, &mut images)
            .map_err(device("uploading the entropy images"))?;
        let mut subs = e.subs.slice_mut(..plan.subs.len());
        self.stream
            .memcpy_htod(&plan.subs, &mut subs)
            .map_err(device("uploading the subsequences"))?;
        let mut intervals = e.intervals.slice_mut(..plan.intervals.len());
        self.stream
            .memcpy_htod(&plan.intervals, &mut intervals)
            .map_err(device("uploading the restart intervals"))?;
        self.stream
            .memset_zeros(&mut e.changed)
            .map_err(device("clearing the synchronisation flags"))?;
        self.stream
            .memset_zeros(&mut e.status)
            .map_err(device("clearing the entropy status"))?;

        let words = plan.coefficients / 2;
        let config = LaunchConfig {
            grid_dim: (
                words.div_ceil(u64::from(HUFF_THREADS)).clamp(1, 4096) as u32,
                1,
                1,
            ),
            block_dim: (HUFF_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut builder = self.stream.launch_builder(&e.zero);
        builder.arg(&mut e.dense).arg(&words);
        // SAFETY: gpufeed_huff_zero(coef, words) writes u32 words 0..words of `dense`, which
        // holds `plan.coefficients` i16 values (`entropy_fits` keeps them inside `dense_bytes`).
        unsafe { builder.launch(config) }.map_err(device("launching the zeroing of planes"))?;

        let n = plan.subs.len() as u32;
        let per_sub = thread_each(n);
        let longest = plan.intervals.iter().map(|iv| iv.subs).max().unwrap_or(0);
        let class = size_class(longest);
        let passes = e.passes.launch(class);
        e.launched = passes;
        e.unread = Some(class);
        for pass in 0..passes {
            let mut builder = self.stream.launch_builder(&e.sync);
            builder
                .arg(&self.coefficients)
                .arg(&self.coefficients)
                .arg(&e.images)
                .arg(&e.subs)
                .arg(&n)
                .arg(&mut e.exits)
                .arg(&mut e.changed)
                .arg(&pass);
            // SAFETY: the arguments match gpufeed_huff_sync's (data, tables, images, subs, n,
            // exits, changed, pass); data and tables are the staged bytes (each image's data and
            // tables at the word offsets `add_entropy_coded` planned, below `staged`, uploaded
            // before on this stream; the kernel reads no data word past an image's `words`).
            // Thread i < n reads subsequence i and its image (uploaded above), exits i - 1 and i
            // of one half of `exits` and writes exit i of the other (2 * n exits fit: n is at
            // most `subsequences`), and flag `pass` < passes <= PASSES.
            unsafe { builder.launch(per_sub) }.map_err(device("launching a sync pass"))?;
        }

        let n_groups = n.div_ceil(GROUP_SUBS as u32);
        let per_group = thread_each(n_groups);
        let mut builder = self.stream.launch_builder(&e.group);
        builder
            .arg(&e.images)
            .arg(&e.subs)
            .arg(&n)
            .arg(&e.exits)
            .arg(&e.changed)
            .arg(&passes)
            .arg(&mut e.groups);
        // SAFETY: the arguments match gpufeed_huff_group's (images, subs, n, exits, changed,
        // passes, groups); thread g < ceil(n / 32) reads the subsequences and final exits of its
        // group (all below n) and writes group g (ceil(subsequences / 32) of them fit).
        unsafe { builder.launch(per_group) }.map_err(device("launching the group sums"))?;

        let n_intervals = plan.intervals.len() as u32;
        let config = thread_each(n_intervals);
        let mut builder = self.stream.launch_builder(&e.scan);
        builder
            .arg(&e.images)
            .arg(&e.intervals)
            .arg(&n_intervals)
            .arg(&n)
            .arg(&e.exits)
            .arg(&e.changed)
            .arg(&passes)
            .arg(&e.groups)
            .arg(&mut e.group_bases)
            .arg(&mut e.bases)
            .arg(&mut e.status);
        // SAFETY: the arguments match gpufeed_huff_scan's (images, intervals, n_intervals, n,
        // exits, changed, passes, groups, group_bases, bases, status); thread t < n_intervals
        // reads interval t, its image, the exits and whole groups of its subsequences (all below
        // n, groups below ceil(n / 32)) and writes their bases (n and ceil(n / 32) fit) and its
        // image's status word (one per image of the batch, at most `images`).
        unsafe { builder.launch(config) }.map_err(device("launching the block scan"))?;

        let mut builder = self.stream.launch_builder(&e.expand);
        builder
            .arg(&e.images)
            .arg(&e.subs)
            .arg(&n)
            .arg(&e.exits)
            .arg(&e.changed)
            .arg(&passes)
            .arg(&e.group_bases)
            .arg(&mut e.bases);
        // SAFETY: the arguments match gpufeed_huff_expand's (images, subs, n, exits, changed,
        // passes, group_bases, bases); thread g reads its whole group's base and exits and writes
        // the bases of its subsequences, all below n.
        unsafe { builder.launch(per_group) }.map_err(device("launching the group expansion"))?;

        let mut builder = self.stream.launch_builder(&e.write);
        builder
            .arg(&self.coefficients)
            .arg(&self.coefficients)
            .arg(&e.images)
            .arg(&e.subs)
            .arg(&e.intervals)
            .arg(&n)
            .arg(&e.exits)
            .arg(&e.changed)
            .arg(&passes)
            .arg(&e.bases)
            .arg(&mut e.dense)
            .arg(&mut e.status);
        // SAFETY: the arguments match gpufeed_huff_write's (data, tables, images, subs,
        // intervals, n, exits, changed, passes, bases, coef, status). It reads as the sync
        // passes do, and writes coefficients only of blocks below its interval's end, located
        // from the block's index alone inside its image's planes (inside `dense`, see the zeroing
        // above), and bits of its image's status word.
        unsafe { builder.launch(per_sub) }.map_err(device("launching the entropy decode"))?;
        Ok(())
    }

    /// The policy that picks how many synchronisation passes the next batch launches.
    #[cfg(test)]
    pub(crate) fn sync_passes(&mut self) -> &mut SyncPasses {
        &mut self.entropy.passes
    }

    /// Synchronisation passes the last batch launched.
    #[cfg(test)]
    pub(crate) fn sync_passes_launched(&self) -> u32 {
        self.entropy.launched
    }

    /// The dense coefficients the entropy kernels wrote for the batch's entropy-coded image `h`
    /// (in the order they were added): per component, its plane's blocks per row and values.
    #[cfg(test)]
    pub(crate) fn dense_planes(&self, h: usize) -> Result<Vec<(u32, Vec<i16>)>, Error> {
        let planes = self
            .entropy
            .plan
            .planes
            .get(h)
            .ok_or_else(|| Error::Request(format!("no entropy-coded image {h}")))?;
        let mut out = Vec::new();
        for c in 0..planes.components {
            let start = planes.offset[c] as usize;
            let len = planes.blocks_wide[c] as usize * planes.blocks_high[c] as usize * 64;
            let values = self
                .stream
                .clone_dtoh(&self.entropy.dense.slice(start..start + len))
                .map_err(device("downloading dense coefficients"))?;
            out.push((planes.blocks_wide[c], values));
        }
        Ok(out)
    }

    /// Where each image of the last transformed batch is in [`GpuDecoder::output`].
    pub fn rendered(&self) -> &[Rendered] {
        &self.plan.rendered
    }

    /// The rendered windows of the last transformed batch.
    pub fn output(&self) -> &CudaSlice<u8> {
        &self.output
    }

    /// Fills the plane and output buffers with `value`, so a test can tell what a launch wrote.
    #[cfg(test)]
    pub(crate) fn poison(&mut self, value: u8) -> Result<(), Error> {
        let planes = vec![value; self.planes.len()];
        self.stream
            .memcpy_htod(&planes, &mut self.planes)
            .map_err(device("poisoning the planes"))?;
        let output = vec![value; self.output.len()];
        self.stream
            .memcpy_htod(&output, &mut self.output)
            .map_err(device("poisoning the output"))?;
        let dense = vec![i16::from_le_bytes([value, value]); self.entropy.dense.len()];
        self.stream
            .memcpy_htod(&dense, &mut self.entropy.dense)
            .map_err(device("poisoning the dense coefficients"))
    }
}

/// A launch of the entropy kernels with one thread for each of `count` items, in blocks of
/// [`HUFF_THREADS`].
fn thread_each(count: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (count.div_ceil(HUFF_THREADS), 1, 1),
        block_dim: (HUFF_THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

impl Drop for GpuDecoder {
    fn drop(&mut self) {
        // The pinned memory must outlive the copy still reading it.
        if let Some(event) = &self.uploaded {
            let _ = event.synchronize();
        }
    }
}
