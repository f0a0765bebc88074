//! `kernels/augment.cu`: the augmentations of training on the `u8` batch in device memory, the
//! mixing normalize and the soft labels, compiled by NVRTC once per device in a process,
//! launched on the pipeline's stream. Bit for bit the CPU rendition in `crate::augment`.

use std::sync::Arc;

use cudarc::driver::{
    CudaFunction, CudaSlice, CudaStream, DeviceRepr, LaunchConfig, PushKernelArg,
};

use super::device::{upload_reusing, Gpu, KernelSource};
use crate::augment::{AugmentPlan, KernelOp, Mix};
use crate::error::{Error, Result};
use crate::options::{ChannelOrder, DType, Layout, NormalizeSpec};
use crate::tensor::{DeviceData, DeviceTensor};

/// The kernel source, embedded at build time.
const SOURCE: &str = include_str!("../../kernels/augment.cu");

/// Threads of the block that augments one image.
const IMAGE_THREADS: u32 = 512;

/// Threads per block of the per-element kernels.
const THREADS: u32 = 256;

// SAFETY: `KernelOp` is `repr(C)`: six `i32` then six `f32`, the layout of the kernel's
// `struct GfOp`; any bit pattern is a valid value.
unsafe impl DeviceRepr for KernelOp {}

/// `struct GfMixAffine` of the kernel source.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct GfMixAffine {
    scale: [f32; 3],
    bias: [f32; 3],
}

// SAFETY: `repr(C)`, six consecutive floats, as the kernel's struct.
unsafe impl DeviceRepr for GfMixAffine {}

/// The augmentation kernels for one device, with the buffers they reuse batch after batch.
#[derive(Debug)]
pub(crate) struct DeviceAugmenter {
    augment: CudaFunction,
    mix_f32: CudaFunction,
    mix_f16: CudaFunction,
    mix_bf16: CudaFunction,
    soft_labels: CudaFunction,
    /// One image's room per batch row: what an operation that reads other pixels copies from.
    scratch: CudaSlice<u8>,
    ops: Option<CudaSlice<KernelOp>>,
    starts: Option<CudaSlice<u32>>,
    labels: Option<CudaSlice<u32>>,
}

impl DeviceAugmenter {
    /// Compiles the kernels for the stream's device and allocates the scratch of a batch of
    /// `batch_bytes`.
    pub fn new(stream: &Arc<CudaStream>, batch_bytes: usize) -> Result<DeviceAugmenter> {
        let module = Gpu::from_stream(stream).module(&KernelSource {
            name: "augment.cu",
            code: SOURCE,
            defines: Vec::new(),
        })?;
        let load = |name: &str| {
            module
                .load_function(name)
                .map_err(|e| Error::cuda("finding an augmentation kernel", e))
        };
        // SAFETY: u8 has no invalid bit patterns; the kernel writes each image's scratch before
        // it reads it.
        let scratch = unsafe { stream.alloc::<u8>(batch_bytes.max(1)) }
            .map_err(|e| Error::cuda("allocating the augmentation scratch", e))?;
        Ok(DeviceAugmenter {
            augment: load("gpufeed_augment")?,
            mix_f32: load("gpufeed_mix_f32")?,
            mix_f16: load("gpufeed_mix_f16")?,
            mix_bf16: load("gpufeed_mix_bf16")?,
            soft_labels: load("gpufeed_soft_labels")?,
            scratch,
            ops: None,
            starts: None,
            labels: None,
        })
    }

    /// Bytes of device memory held besides the kernels' small buffers.
    pub fn device_bytes(batch_bytes: usize) -> u128 {
        batch_bytes as u128
    }

    /// Applies each row's operations of `plan` to the first `n` images of `height` x `width`
    /// in `batch`, in place.
    pub fn augment(
        &mut self,
        stream: &Arc<CudaStream>,
        batch: &mut CudaSlice<u8>,
        n: usize,
        height: usize,
        width: usize,
        plan: &AugmentPlan,
    ) -> Result<()> {
        if !plan.has_image_ops() || n == 0 {
            return Ok(());
        }
        let image = height * width * 3;
        if plan.starts.len() != n + 1 || batch.len() < n * image || self.scratch.len() < n * image {
            return Err(Error::Mismatch(format!(
                "augmenting {n} images of {image} bytes: the plan has {} rows, the batch {} \
                 bytes, the scratch {}",
                plan.starts.len().saturating_sub(1),
                batch.len(),
                self.scratch.len()
            )));
        }
        let fail = |e| Error::cuda("uploading the augmentation plan", e);
        let ops = upload_reusing(stream, &plan.kernel_ops, &mut self.ops).map_err(fail)?;
        let starts = upload_reusing(stream, &plan.starts, &mut self.starts).map_err(fail)?;
        let (h, w) = (height as i32, width as i32);
        let mut b = stream.launch_builder(&self.augment);
        b.arg(batch)
            .arg(&mut self.scratch)
            .arg(ops)
            .arg(starts)
            .arg(&h)
            .arg(&w);
        let config = LaunchConfig {
            grid_dim: (n as u32, 1, 1),
            block_dim: (IMAGE_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the arguments match `gpufeed_augment`'s parameters; block `i` reads and
        // writes image `i` of `batch` and of the scratch (both hold `n` images, checked above),
        // and reads ops `starts[i]..starts[i + 1]`, which the plan keeps inside `ops` (its
        // starts are offsets into its own op list, the last its length).
        unsafe { b.launch(config) }
            .map(|_| ())
            .map_err(|e| Error::cuda("launching the augmentation kernel", e))
    }

    /// Normalizes the first `n` images of `input` into a new tensor as `spec` asks, mixed as
    /// `mix` says.
    pub fn mix_normalize(
        &self,
        stream: &Arc<CudaStream>,
        input: &CudaSlice<u8>,
        n: usize,
        height: usize,
        width: usize,
        spec: &NormalizeSpec,
        mix: &Mix,
    ) -> Result<DeviceTensor> {
        let hw = height * width;
        let pixels = n * hw;
        let shape = spec.layout.shape(n, height, width);
        let mut out = DeviceTensor::alloc(stream, spec.dtype, shape, spec.layout)?;
        if pixels == 0 {
            return Ok(out);
        }
        if input.len() < pixels * 3 || pixels > u32::MAX as usize / 2 {
            return Err(Error::Mismatch(format!(
                "mixing {pixels} pixels from an input of {} bytes",
                input.len()
            )));
        }
        let (kind, box_) = match *mix {
            Mix::MixUp { .. } => (1i32, [0i32; 4]),
            Mix::CutMix { x1, y1, x2, y2, .. } => (2, [x1 as i32, y1 as i32, x2 as i32, y2 as i32]),
        };
        let lam = mix.lam() as f32;
        let one_minus_lam = (1.0 - mix.lam()) as f32;
        let affine = GfMixAffine {
            scale: spec.affine.scale,
            bias: spec.affine.bias,
        };
        let bgr = i32::from(spec.channel_order == ChannelOrder::Bgr);
        let nchw = i32::from(spec.layout == Layout::Nchw);
        let (pixels_u, hw_u, rows, width_u) = (pixels as u32, hw as u32, n as u32, width as u32);
        let function = match spec.dtype {
            DType::F32 => &self.mix_f32,
            DType::F16 => &self.mix_f16,
            DType::BF16 => &self.mix_bf16,
        };
        let mut b = stream.launch_builder(function);
        b.arg(input);
        match out.data_mut() {
            DeviceData::F32(s) => b.arg(s),
            DeviceData::F16(s) => b.arg(s),
            DeviceData::BF16(s) => b.arg(s),
        };
        b.arg(&pixels_u)
            .arg(&hw_u)
            .arg(&rows)
            .arg(&width_u)
            .arg(&affine)
            .arg(&bgr)
            .arg(&nchw)
            .arg(&kind)
            .arg(&lam)
            .arg(&one_minus_lam)
            .arg(&box_[0])
            .arg(&box_[1])
            .arg(&box_[2])
            .arg(&box_[3]);
        // SAFETY: the arguments match `gpufeed_mix_<dtype>`'s parameters, the output slice is
        // of that dtype (chosen from the same spec); `input` holds `pixels * 3` bytes and the
        // output `pixels * 3` elements; every thread checks its pixel against `pixels`, and a
        // row's partner is another row of the batch.
        unsafe { b.launch(grid(pixels)) }
            .map(|_| ())
            .map_err(|e| Error::cuda("launching the mixing normalize kernel", e))?;
        Ok(out)
    }

    /// The soft labels `[n, classes, 1, 1]` float32 of a batch with `labels`, mixed as `mix`
    /// says.
    pub fn soft_labels(
        &mut self,
        stream: &Arc<CudaStream>,
        labels: &[u32],
        classes: usize,
        mix: &Mix,
    ) -> Result<DeviceTensor> {
        let n = labels.len();
        let mut out = DeviceTensor::alloc(stream, DType::F32, [n, classes, 1, 1], Layout::Nchw)?;
        let count = n * classes;
        if count == 0 {
            return Ok(out);
        }
        if count > u32::MAX as usize {
            return Err(Error::Mismatch(format!(
                "{n} rows of {classes} soft labels: too many for one launch"
            )));
        }
        let labels = upload_reusing(stream, labels, &mut self.labels)
            .map_err(|e| Error::cuda("uploading the labels", e))?;
        let (rows, classes_u) = (n as u32, classes as u32);
        let lam = mix.lam() as f32;
        let one_minus_lam = (1.0 - mix.lam()) as f32;
        let DeviceData::F32(slice) = out.data_mut() else {
            return Err(Error::Mismatch("soft labels are float32".into()));
        };
        let mut b = stream.launch_builder(&self.soft_labels);
        b.arg(labels)
            .arg(slice)
            .arg(&rows)
            .arg(&classes_u)
            .arg(&lam)
            .arg(&one_minus_lam);
        // SAFETY: the arguments match `gpufeed_soft_labels`' parameters; `labels` holds `n`
        // values (uploaded above), the output `n * classes` floats; every thread checks its
        // element against `n * classes`.
        unsafe { b.launch(grid(count)) }
            .map(|_| ())
            .map_err(|e| Error::cuda("launching the soft labels kernel", e))?;
        Ok(out)
    }
}

/// One thread per element.
fn grid(count: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: ((count as u32).div_ceil(THREADS), 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}
