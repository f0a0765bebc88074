//! `kernels/augment.cu`: the augmentations of training on the `u8` batch in device memory, the
//! mixing normalize and the soft labels, compiled by NVRTC once per device in a process,
//! launched on the pipeline's stream. Bit for bit the CPU rendition in `crate::augment`.

use std::sync::Arc;

use cudarc::driver::{
    CudaFunction, CudaSlice, CudaStream, DeviceRepr, LaunchConfig, PushKernelArg,
};

use super::device::{upload_reusing, Gpu};
use super::kernel_cache::KernelSource;
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
        (height, width): (usize, usize),
        spec: &NormalizeSpec,
        mix: &Mix,
    ) -> Result<DeviceTensor> {
        let shape = spec.layout.shape(n, height, width);
        let mut out = DeviceTensor::alloc(stream, spec.dtype, shape, spec.layout)?;
        self.mix_normalize_into(stream, input, &mut out, (height, width), spec, mix)?;
        Ok(out)
    }

    /// Like [`DeviceAugmenter::mix_normalize`], into `out`, whose shape says the batch size
    /// (its dtype and layout must be `spec`'s).
    pub fn mix_normalize_into(
        &self,
        stream: &Arc<CudaStream>,
        input: &CudaSlice<u8>,
        out: &mut DeviceTensor,
        (height, width): (usize, usize),
        spec: &NormalizeSpec,
        mix: &Mix,
    ) -> Result<()> {
        let n = out.shape()[0];
        if out.dtype() != spec.dtype
            || out.layout() != spec.layout
            || out.len() != n * height * width * 3
        {
            return Err(Error::Mismatch(
                "the output tensor does not match the normalize spec".into(),
            ));
        }
        let hw = height * width;
        let pixels = n * hw;
        if pixels == 0 {
            return Ok(());
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
            other => return Err(other.not_an_output()),
        };
        let mut b = stream.launch_builder(function);
        b.arg(input);
        match out.data_mut() {
            DeviceData::F32(s) => b.arg(s),
            DeviceData::F16(s) => b.arg(s),
            DeviceData::BF16(s) => b.arg(s),
            DeviceData::I32(_) | DeviceData::I64(_) | DeviceData::U8(_) => {
                return Err(spec.dtype.not_an_output())
            }
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
            .map_err(|e| Error::cuda("launching the mixing normalize kernel", e))
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

#[cfg(test)]
mod tests {
    use half::{bf16, f16};

    use super::*;
    use crate::augment::{
        augment_batch, mix_normalize, Augment, AugmentOptions, Augmenter, ColorJitter, Op,
        RandomErasing, Recipe,
    };
    use crate::options::OutputOptions;
    use crate::tensor::HostData;
    use gpufeed_bench::upload::random_bytes;

    /// Every call at several parameters, fills and edge cases.
    fn every_op() -> Vec<Op> {
        let fill = [255, 128, 7];
        let mut ops = vec![
            Op::Shear {
                x: 44.7,
                y: 0.0,
                fill,
            },
            Op::Shear {
                x: 0.0,
                y: -16.7,
                fill: [0; 3],
            },
            Op::Translate { x: 15, y: 0, fill },
            Op::Translate {
                x: 0,
                y: -32,
                fill: [0; 3],
            },
            Op::Rotate { angle: 90.0, fill },
            Op::Rotate { angle: -90.0, fill },
            Op::Rotate { angle: 180.0, fill },
            Op::Rotate { angle: 31.5, fill },
            Op::Rotate {
                angle: -130.5,
                fill: [0; 3],
            },
            Op::Brightness(0.37),
            Op::Brightness(1.99),
            Op::Saturation(0.0),
            Op::Saturation(1.6),
            Op::Contrast(0.25),
            Op::Contrast(1.9),
            Op::Sharpness(0.01),
            Op::Sharpness(1.99),
            Op::Hue(0.31),
            Op::Hue(-0.5),
            Op::Solarize(127.5),
            Op::Solarize(0.0),
            Op::AutoContrast,
            Op::Equalize,
            Op::Invert,
            Op::Erase {
                i: 3,
                j: 5,
                h: 9,
                w: 11,
                v: [1, 2, 3],
            },
        ];
        ops.extend((0..=8).map(Op::Posterize));
        ops
    }

    fn run_gpu(
        stream: &Arc<CudaStream>,
        kernels: &mut DeviceAugmenter,
        pixels: &[u8],
        h: usize,
        w: usize,
        plan: &AugmentPlan,
    ) -> Vec<u8> {
        let n = plan.starts.len() - 1;
        let mut batch = stream.clone_htod(pixels).expect("upload");
        kernels
            .augment(stream, &mut batch, n, h, w, plan)
            .expect("augment");
        stream.clone_dtoh(&batch).expect("download")
    }

    #[test]
    fn kernels_match_the_cpu_rendition_bit_for_bit() {
        let Some(gpu) = crate::cuda::test_gpu(module_path!()) else {
            return;
        };
        let stream = gpu.stream().clone();
        // Sizes: ImageNet's, odd, tiny, wide, tall, one pixel.
        for (case, &(h, w)) in [(224, 224), (29, 37), (3, 3), (17, 64), (64, 9), (1, 1)]
            .iter()
            .enumerate()
        {
            let ops = every_op();
            let n = ops.len();
            let image = h * w * 3;
            let mut kernels = DeviceAugmenter::new(&stream, n * image).expect("compile");
            // Poison the scratch: a read of it the kernel did not write first shows.
            stream
                .memcpy_htod(&vec![0xA5u8; n * image], &mut kernels.scratch)
                .expect("poison");
            let pixels = random_bytes(n * image, case as u64 + 7);
            // Row k: operation k alone.
            let mut kernel_ops = Vec::new();
            let mut starts = vec![0u32];
            for op in &ops {
                kernel_ops.extend(op.kernel(w, h));
                starts.push(kernel_ops.len() as u32);
            }
            let plan = AugmentPlan {
                rows: ops.iter().map(|&op| vec![op]).collect(),
                kernel_ops,
                starts,
                mix: None,
            };
            let got = run_gpu(&stream, &mut kernels, &pixels, h, w, &plan);
            let mut want = pixels.clone();
            augment_batch(&mut want, h, w, &plan);
            for (row, op) in ops.iter().enumerate() {
                let r = row * image..(row + 1) * image;
                assert!(
                    got[r.clone()] == want[r],
                    "{h}x{w} {op:?}: the kernel differs from the CPU"
                );
            }
        }
    }

    #[test]
    fn whole_recipes_match_the_cpu_rendition() {
        let Some(gpu) = crate::cuda::test_gpu(module_path!()) else {
            return;
        };
        let stream = gpu.stream().clone();
        let (h, w, n) = (224, 224, 48);
        let image = h * w * 3;
        let mut kernels = DeviceAugmenter::new(&stream, n * image).expect("compile");
        let jitter = ColorJitter {
            brightness: 0.4,
            contrast: 0.4,
            saturation: 0.4,
            hue: 0.1,
        };
        let recipes = [
            Recipe::TorchvisionImagenet.augment_options(),
            AugmentOptions::default()
                .policy(Augment::RandAugment {
                    num_ops: 8,
                    magnitude: 30,
                })
                .color_jitter(jitter),
            AugmentOptions::default()
                .policy(Augment::AutoAugment)
                .random_erasing(Some(RandomErasing::new(1.0))),
        ];
        for (k, options) in recipes.into_iter().enumerate() {
            let augmenter = Augmenter {
                options,
                seed: k as u64,
                width: w as u32,
                height: h as u32,
            };
            let indices: Vec<usize> = (0..n).collect();
            for epoch in 0..3 {
                let plan = augmenter.plan(&indices, epoch, 0);
                let pixels = random_bytes(n * image, 100 + epoch);
                let got = run_gpu(&stream, &mut kernels, &pixels, h, w, &plan);
                let mut want = pixels.clone();
                augment_batch(&mut want, h, w, &plan);
                assert!(
                    got == want,
                    "recipe {k} epoch {epoch}: the kernel differs from the CPU"
                );
            }
        }
    }

    #[test]
    fn mixing_normalize_and_soft_labels_match_the_cpu() {
        let Some(gpu) = crate::cuda::test_gpu(module_path!()) else {
            return;
        };
        let stream = gpu.stream().clone();
        let (h, w, n) = (31, 45, 7);
        let pixels = random_bytes(n * h * w * 3, 3);
        let input = stream.clone_htod(&pixels).expect("upload");
        let mut kernels = DeviceAugmenter::new(&stream, 1).expect("compile");
        let mixes = [
            Mix::MixUp { lam: 0.2871 },
            Mix::CutMix {
                x1: 3,
                y1: 0,
                x2: 40,
                y2: 17,
                lam: 0.5,
            },
            Mix::CutMix {
                x1: 0,
                y1: 0,
                x2: 45,
                y2: 31,
                lam: 0.0,
            },
        ];
        for mix in mixes {
            for dtype in [DType::F16, DType::BF16, DType::F32] {
                for layout in [Layout::Nchw, Layout::Nhwc] {
                    for order in [ChannelOrder::Rgb, ChannelOrder::Bgr] {
                        let spec = OutputOptions::default()
                            .dtype(dtype)
                            .layout(layout)
                            .channel_order(order)
                            .spec();
                        let mut out =
                            DeviceTensor::alloc(&stream, dtype, layout.shape(n, h, w), layout)
                                .expect("alloc");
                        let len = out.len();
                        // Poisoned: NaN everywhere before the kernel runs.
                        match out.data_mut() {
                            DeviceData::F16(s) => {
                                stream.memcpy_htod(&vec![f16::from_bits(0xFFFF); len], s)
                            }
                            DeviceData::BF16(s) => {
                                stream.memcpy_htod(&vec![bf16::from_bits(0xFFFF); len], s)
                            }
                            DeviceData::F32(s) => {
                                stream.memcpy_htod(&vec![f32::from_bits(u32::MAX); len], s)
                            }
                            DeviceData::I32(_) | DeviceData::I64(_) | DeviceData::U8(_) => {
                                unreachable!("the dtypes tried are floats")
                            }
                        }
                        .expect("poison");
                        kernels
                            .mix_normalize_into(&stream, &input, &mut out, (h, w), &spec, &mix)
                            .expect("mix");
                        let got = out.to_host().expect("download").to_le_bytes();
                        let mut data = match dtype {
                            DType::F16 => HostData::F16(vec![f16::ZERO; len]),
                            DType::BF16 => HostData::BF16(vec![bf16::ZERO; len]),
                            DType::F32 => HostData::F32(vec![0.0; len]),
                            other => unreachable!("{other} is not a float"),
                        };
                        mix_normalize(&pixels, n, h, w, &spec, &mix, &mut data);
                        let want =
                            crate::tensor::HostTensor::new(data, layout.shape(n, h, w), layout)
                                .expect("shape")
                                .to_le_bytes();
                        assert!(
                            got == want,
                            "{mix:?} {dtype:?} {layout:?} {order:?}: differs"
                        );
                    }
                }
            }
            let labels = [4u32, 0, 9, 9, 1, 3, 2];
            let soft = kernels
                .soft_labels(&stream, &labels, 10, &mix)
                .expect("soft labels");
            let got = soft.to_host().expect("download").to_f32_vec();
            assert_eq!(
                got,
                crate::augment::soft_labels(&labels, 10, mix.lam()),
                "{mix:?}"
            );
        }
    }
}
