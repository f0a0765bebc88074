//! The GPU side of the path: `kernels/idct.cu` compiled once per device, and a [`GpuDecoder`]
//! that takes a batch of packed images into pinned staging memory, uploads it and queues both
//! kernels on one stream. Every buffer is sized once from a [`Budget`]; a batch allocates
//! nothing (the descriptor vectors keep their capacity).
//!
//! Ordering: everything is queued on the decoder's stream. [`GpuDecoder::add`] waits (once a
//! batch) for the previous batch's upload to have left the staging memory; the rendered windows
//! of a batch stay in [`GpuDecoder::output`] until the next [`GpuDecoder::transform`], so work
//! queued on the same stream in between (the resize) reads them safely.

use std::sync::Arc;

use cudarc::driver::{
    CudaEvent, CudaFunction, CudaSlice, CudaStream, DeviceRepr, LaunchConfig, PinnedHostSlice,
    PushKernelArg,
};

use super::batch::{
    footprint, BatchPlan, ColorJob, IdctJob, Rendered, COLOR_THREADS, IDCT_THREADS,
};
use super::pack::PackedImage;
use super::Error;
use crate::cuda::{Gpu, KernelSource};

/// The kernel source, embedded at build time.
pub const SOURCE: &str = include_str!("../../kernels/idct.cu");

// SAFETY: `IdctJob` and `ColorJob` are `repr(C)` plain integers laid out as the kernel's
// `GfIdctJob` and `GfColorJob` (40 and 160 bytes, no padding: batch.rs's test and the kernel's
// static_asserts check the sizes), so their bytes can be copied to the device as they are.
unsafe impl DeviceRepr for IdctJob {}
// SAFETY: as above.
unsafe impl DeviceRepr for ColorJob {}

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
}

impl Budget {
    /// A budget for batches of up to `megapixels` of windows in up to `images` images: planes
    /// and outputs at 3 bytes a pixel (4:4:4 colour, the most), packed coefficients at 2 bytes a
    /// pixel (four times what camera photos at quality 90 take; a batch that does not fit is
    /// cut short by [`GpuDecoder::fits`], never overrun).
    pub fn for_megapixels(megapixels: f64, images: usize) -> Budget {
        let pixels = (megapixels.max(0.0) * 1e6) as usize;
        Budget {
            coefficient_bytes: 2 * pixels,
            plane_bytes: 3 * pixels + images * 3 * 1024,
            output_bytes: 3 * pixels + images * 256,
            images,
        }
    }

    /// Device bytes the budget takes (besides the descriptors).
    pub fn device_bytes(&self) -> usize {
        self.coefficient_bytes + self.plane_bytes + self.output_bytes
    }
}

/// The path's kernels and buffers on one stream.
pub struct GpuDecoder {
    stream: Arc<CudaStream>,
    budget: Budget,
    idct: CudaFunction,
    color: CudaFunction,
    staging: PinnedHostSlice<u8>,
    /// Recorded after the last upload from `staging`.
    uploaded: Option<CudaEvent>,
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
        let ctx = stream.context();
        // SAFETY: uninitialized u8 memory; `add` writes every byte it stages before the upload
        // reads it, and u8 has no invalid bit patterns. Flags 0: ordinary page-locked memory.
        let staging =
            unsafe { ctx.alloc_pinned_with_flags::<u8>(budget.coefficient_bytes.max(8), 0) }
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
        Ok(GpuDecoder {
            stream: stream.clone(),
            budget,
            idct,
            color,
            staging,
            uploaded: None,
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
        if let Some(event) = self.uploaded.take() {
            event
                .synchronize()
                .map_err(device("waiting for the previous upload"))?;
        }
        let staging = self
            .staging
            .as_mut_slice()
            .map_err(device("mapping pinned staging memory"))?;
        staging[self.staged..self.staged + bytes.len()].copy_from_slice(bytes);
        let (planes, output) = footprint(image);
        self.images.push((*image, self.staged as u64));
        self.staged += bytes.len();
        self.planes_used += planes;
        self.output_used += output;
        Ok(self.images.len() - 1)
    }

    /// Queues the upload of the batch's packed coefficients on the stream.
    pub fn upload(&mut self) -> Result<(), Error> {
        if self.staged == 0 {
            return Ok(());
        }
        let staging = self
            .staging
            .as_slice()
            .map_err(device("mapping pinned staging memory"))?;
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
            .arg(&mut self.planes)
            .arg(&self.idct_jobs);
        // SAFETY: the arguments match gpufeed_idct_islow's (coefficients, planes, jobs). The
        // grid's y is the number of jobs uploaded just before on this stream; each job's section
        // lies in the coefficients uploaded before it (the packer's offsets inside an image's
        // bytes, the image at its staging offset, all below `staged`), and its plane (blocks *
        // 64 bytes from its offset) inside `plane_bytes`, checked against the buffer above.
        // Threads past a job's blocks do nothing.
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
            .map_err(device("poisoning the output"))
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
