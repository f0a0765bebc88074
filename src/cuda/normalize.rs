//! `kernels/normalize.cu`: the fused u8 HWC -> f16 / bf16 / f32, NCHW or NHWC, RGB or BGR
//! normalize, compiled by NVRTC once per device (and tuning) in a process, launched once per batch.

use std::sync::Arc;

use cudarc::driver::{
    CudaFunction, CudaSlice, CudaStream, CudaView, DevicePtr, DeviceRepr, LaunchConfig,
    PushKernelArg,
};

use super::device::Gpu;
use super::kernel_cache::KernelSource;
use crate::error::{Error, Result};
use crate::options::{ChannelOrder, DType, Layout, NormalizeSpec};
use crate::tensor::{DeviceData, DeviceTensor};

/// The kernel source, embedded at build time.
const SOURCE: &str = include_str!("../../kernels/normalize.cu");

const THREADS_PER_BLOCK: u32 = 256;
/// How the kernel is compiled: the default is what measured best on an H100; the other values
/// exist to measure that again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct NormalizeTuning {
    /// 16-byte groups each thread of the NCHW entry point writes per channel plane, 1..=8
    /// (`GF_NCHW_GROUPS`; default 2).
    pub nchw_groups: u32,
    /// Evict-first stores (`GF_STREAMING_STORES`; default off).
    pub streaming_stores: bool,
}

impl Default for NormalizeTuning {
    fn default() -> Self {
        NormalizeTuning {
            nchw_groups: 2,
            streaming_stores: false,
        }
    }
}

impl NormalizeTuning {
    /// Sets [`NormalizeTuning::nchw_groups`].
    pub fn nchw_groups(mut self, groups: u32) -> Self {
        self.nchw_groups = groups;
        self
    }

    /// Sets [`NormalizeTuning::streaming_stores`].
    pub fn streaming_stores(mut self, on: bool) -> Self {
        self.streaming_stores = on;
        self
    }
}

/// `struct GfAffine` of the kernel source.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct GfAffine {
    scale: [f32; 3],
    bias: [f32; 3],
}

// SAFETY: `GfAffine` is `repr(C)` plain old data with the same layout as the kernel's struct
// (six consecutive floats), so it can be passed by value as a kernel parameter.
unsafe impl DeviceRepr for GfAffine {}

/// The three entry points of one output dtype.
#[derive(Debug)]
struct Entries {
    nchw: CudaFunction,
    nhwc: CudaFunction,
    pixel: CudaFunction,
    /// Pixels per thread of `nchw`: one 16-byte store per channel plane.
    nchw_pixels: usize,
    /// Input bytes (= output elements) per thread of `nhwc`: one 16-byte store.
    nhwc_bytes: usize,
}

/// The fused normalize kernel, compiled for one device: turns a u8 HWC batch in device memory
/// into the normalized tensor the model takes, in one pass. A pipeline runs it on every batch;
/// it is public for code that has u8 pixels on the device already.
#[derive(Debug)]
pub struct Normalizer {
    f32: Entries,
    f16: Entries,
    bf16: Entries,
    /// `GF_NCHW_GROUPS` the module was compiled with.
    nchw_groups: u32,
}

impl Normalizer {
    /// The kernel for the stream's device, compiled with the default tuning (once per device in
    /// a process; later calls take it from the cache).
    pub fn new(stream: &Arc<CudaStream>) -> Result<Normalizer> {
        Normalizer::with_tuning(stream, NormalizeTuning::default())
    }

    /// The kernel compiled with `tuning`.
    pub fn with_tuning(stream: &Arc<CudaStream>, tuning: NormalizeTuning) -> Result<Normalizer> {
        let nchw_groups = tuning.nchw_groups;
        if !(1..=8).contains(&nchw_groups) {
            return Err(Error::invalid("nchw_groups", "must be 1 to 8"));
        }
        let mut defines = vec![format!("GF_NCHW_GROUPS={nchw_groups}")];
        if tuning.streaming_stores {
            defines.push("GF_STREAMING_STORES".into());
        }
        let module = Gpu::from_stream(stream).module(&KernelSource {
            name: "normalize.cu",
            code: SOURCE,
            defines,
        })?;
        let load = |name: String| {
            module
                .load_function(&name)
                .map_err(|e| Error::cuda("finding a kernel entry point", e))
        };
        let entries = |dtype: DType| -> Result<Entries> {
            let name = dtype.name();
            Ok(Entries {
                nchw: load(format!("gpufeed_nchw_{name}"))?,
                nhwc: load(format!("gpufeed_nhwc_{name}"))?,
                pixel: load(format!("gpufeed_pixel_{name}"))?,
                nchw_pixels: 16 / dtype.size_of(),
                nhwc_bytes: 16 / dtype.size_of(),
            })
        };
        Ok(Normalizer {
            f32: entries(DType::F32)?,
            f16: entries(DType::F16)?,
            bf16: entries(DType::BF16)?,
            nchw_groups,
        })
    }

    /// Normalizes `n` images of `height` x `width` packed RGB8 pixels from `input` into a new
    /// device tensor, on `stream`.
    pub fn run(
        &self,
        stream: &Arc<CudaStream>,
        input: &CudaSlice<u8>,
        n: usize,
        height: usize,
        width: usize,
        spec: &NormalizeSpec,
    ) -> Result<DeviceTensor> {
        let shape = spec.layout.shape(n, height, width);
        let mut out = DeviceTensor::alloc(stream, spec.dtype, shape, spec.layout)?;
        self.run_into(stream, input, &mut out, spec)?;
        Ok(out)
    }

    /// Like [`Normalizer::run`], from a part of a device buffer (each group of a batch's views,
    /// say), which begins 16-byte aligned.
    pub fn run_view(
        &self,
        stream: &Arc<CudaStream>,
        input: &CudaView<'_, u8>,
        n: usize,
        height: usize,
        width: usize,
        spec: &NormalizeSpec,
    ) -> Result<DeviceTensor> {
        let (address, _read) = input.device_ptr(stream);
        if address % 16 != 0 {
            return Err(Error::Mismatch(format!(
                "normalize input at {address:#x}: not 16-byte aligned"
            )));
        }
        let shape = spec.layout.shape(n, height, width);
        let mut out = DeviceTensor::alloc(stream, spec.dtype, shape, spec.layout)?;
        self.run_into_view(stream, input, &mut out, spec)?;
        Ok(out)
    }

    /// Like [`Normalizer::run`], into an existing tensor whose shape, dtype and layout say what
    /// to produce (they must match `spec`).
    pub fn run_into(
        &self,
        stream: &Arc<CudaStream>,
        input: &CudaSlice<u8>,
        out: &mut DeviceTensor,
        spec: &NormalizeSpec,
    ) -> Result<()> {
        self.run_into_view(stream, &input.as_view(), out, spec)
    }

    fn run_into_view(
        &self,
        stream: &Arc<CudaStream>,
        input: &CudaView<'_, u8>,
        out: &mut DeviceTensor,
        spec: &NormalizeSpec,
    ) -> Result<()> {
        let shape = out.shape();
        let (n, height, width) = match out.layout() {
            Layout::Nchw => (shape[0], shape[2], shape[3]),
            Layout::Nhwc => (shape[0], shape[1], shape[2]),
        };
        if out.dtype() != spec.dtype || out.layout() != spec.layout {
            return Err(Error::Mismatch(
                "output tensor does not match the normalize spec".into(),
            ));
        }
        let hw = height * width;
        let pixels = n * hw;
        if pixels == 0 {
            return Ok(());
        }
        if input.len() < pixels * 3 {
            return Err(Error::Mismatch(format!(
                "device input holds {} bytes, the batch needs {}",
                input.len(),
                pixels * 3
            )));
        }
        if pixels > u32::MAX as usize / 2 {
            return Err(Error::Mismatch(format!(
                "{pixels} pixels in one batch: the kernel indexes pixels with 32 bits; use a \
                 smaller batch"
            )));
        }
        let entries = match spec.dtype {
            DType::F32 => &self.f32,
            DType::F16 => &self.f16,
            DType::BF16 => &self.bf16,
            other => return Err(other.not_an_output()),
        };
        let shape = LaunchShape {
            pixels,
            hw,
            affine: GfAffine {
                scale: spec.affine.scale,
                bias: spec.affine.bias,
            },
            bgr: i32::from(spec.channel_order == ChannelOrder::Bgr),
            layout: spec.layout,
            nchw_groups: self.nchw_groups,
        };
        match out.data_mut() {
            DeviceData::F32(s) => shape.launch(stream, entries, input, s),
            DeviceData::F16(s) => shape.launch(stream, entries, input, s),
            DeviceData::BF16(s) => shape.launch(stream, entries, input, s),
            DeviceData::I32(_) | DeviceData::I64(_) | DeviceData::U8(_) => {
                Err(out.dtype().not_an_output())
            }
        }
    }
}

/// Everything a launch needs besides the buffers.
struct LaunchShape {
    pixels: usize,
    hw: usize,
    affine: GfAffine,
    bgr: i32,
    layout: Layout,
    nchw_groups: u32,
}

impl LaunchShape {
    /// One thread per `per_thread` units.
    fn grid(units: usize, per_thread: u32) -> LaunchConfig {
        LaunchConfig {
            grid_dim: (
                (units as u32).div_ceil(THREADS_PER_BLOCK * per_thread),
                1,
                1,
            ),
            block_dim: (THREADS_PER_BLOCK, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    /// Picks the entry point and launches it. Each takes the parameters declared for it in
    /// kernels/normalize.cu, in that order.
    fn launch<T>(
        &self,
        stream: &Arc<CudaStream>,
        entries: &Entries,
        input: &CudaView<'_, u8>,
        out: &mut CudaSlice<T>,
    ) -> Result<()> {
        let hw = self.hw as u32;
        let nchw = i32::from(self.layout == Layout::Nchw);
        let count: u32;
        let groups_per_image: u32;
        let (mut builder, config) = match self.layout {
            Layout::Nchw if self.hw.is_multiple_of(entries.nchw_pixels) => {
                count = (self.pixels / entries.nchw_pixels) as u32;
                groups_per_image = (self.hw / entries.nchw_pixels) as u32;
                let mut b = stream.launch_builder(&entries.nchw);
                b.arg(input)
                    .arg(out)
                    .arg(&count)
                    .arg(&groups_per_image)
                    .arg(&hw)
                    .arg(&self.affine)
                    .arg(&self.bgr);
                (b, Self::grid(count as usize, self.nchw_groups))
            }
            Layout::Nhwc if (self.pixels * 3).is_multiple_of(entries.nhwc_bytes) => {
                count = (self.pixels * 3 / entries.nhwc_bytes) as u32;
                let mut b = stream.launch_builder(&entries.nhwc);
                b.arg(input)
                    .arg(out)
                    .arg(&count)
                    .arg(&self.affine)
                    .arg(&self.bgr);
                (b, Self::grid(count as usize, 1))
            }
            _ => {
                count = self.pixels as u32;
                let mut b = stream.launch_builder(&entries.pixel);
                b.arg(input)
                    .arg(out)
                    .arg(&count)
                    .arg(&hw)
                    .arg(&self.affine)
                    .arg(&self.bgr)
                    .arg(&nchw);
                (b, Self::grid(count as usize, 1))
            }
        };
        // SAFETY: the arguments match the chosen entry point's parameter list; `input` holds at
        // least `pixels * 3` bytes and `out` `pixels * 3` elements of the entry point's dtype
        // (checked by `run_into` and the tensor's shape); every thread checks its index against
        // `count`; the vectorized entry points need 16-byte aligned buffers, which device
        // allocations are (and a part given to `run_view` is checked to be), and are chosen
        // only when the pixel or byte counts divide evenly.
        unsafe { builder.launch(config) }
            .map(|_| ())
            .map_err(|e| Error::cuda("launching the normalize kernel", e))
    }
}

#[cfg(test)]
mod tests {
    use half::{bf16, f16};

    use super::*;
    use crate::cpu::normalize;
    use crate::options::{Affine, DecodeOptions, OutputOptions, ResizeOptions};
    use gpufeed_bench::upload::random_bytes;

    /// Fills the tensor with NaN bit patterns, so an element the kernel skips cannot pass.
    fn poison(stream: &Arc<CudaStream>, t: &mut DeviceTensor) {
        let len = t.len();
        match t.data_mut() {
            DeviceData::F16(s) => stream.memcpy_htod(&vec![f16::from_bits(0xFFFF); len], s),
            DeviceData::BF16(s) => stream.memcpy_htod(&vec![bf16::from_bits(0xFFFF); len], s),
            DeviceData::F32(s) => stream.memcpy_htod(&vec![f32::from_bits(u32::MAX); len], s),
            DeviceData::I32(s) => stream.memcpy_htod(&vec![i32::MIN; len], s),
            DeviceData::I64(s) => stream.memcpy_htod(&vec![i64::MIN; len], s),
            DeviceData::U8(s) => stream.memcpy_htod(&vec![0xA5u8; len], s),
        }
        .expect("poisoning the output");
    }

    fn first_mismatch(got: &[u8], want: &[u8], elem: usize) -> Option<usize> {
        got.chunks(elem)
            .zip(want.chunks(elem))
            .position(|(a, b)| a != b)
    }

    #[test]
    fn kernel_matches_reference_bit_for_bit() {
        let Some(gpu) = crate::cuda::test_gpu(module_path!()) else {
            return;
        };
        let stream = gpu.stream().clone();
        let stream = &stream;
        let kernel = Normalizer::new(stream).expect("compile");
        let real = ["assets/chelsea.png", "assets/rocket.jpg"];
        let imagenet = OutputOptions::default().affine();
        let odd = Affine {
            scale: [0.5, -1.25, 1.0 / 3.0],
            bias: [-7.0, 0.125, 100.0],
        };
        // (n, h, w): random pixels, with real photos in the 224x224 case.
        let shapes = [
            (3, 224, 224),
            (2, 5, 7),
            (4, 4, 4),
            (1, 1, 1),
            (5, 3, 16),
            (3, 17, 19),
        ];
        for (case, &(n, h, w)) in shapes.iter().enumerate() {
            let mut pixels = random_bytes(n * h * w * 3, case as u64 + 1);
            if (h, w) == (224, 224) {
                // Real photos in the first images, prepared by the CPU stage.
                for (path, slot) in real.iter().zip(pixels.chunks_mut(h * w * 3)) {
                    let bytes = std::fs::read(path).expect("photo");
                    crate::cpu::prepare_image(
                        &bytes,
                        &DecodeOptions::default(),
                        &ResizeOptions::default(),
                        slot,
                    )
                    .expect("prepare a real photo");
                }
            }
            let input = stream.clone_htod(&pixels).expect("upload");
            for dtype in [DType::F16, DType::BF16, DType::F32] {
                for layout in [Layout::Nchw, Layout::Nhwc] {
                    for channel_order in [ChannelOrder::Rgb, ChannelOrder::Bgr] {
                        for affine in [imagenet, odd] {
                            let spec = NormalizeSpec {
                                affine,
                                dtype,
                                layout,
                                channel_order,
                            };
                            let shape = layout.shape(n, h, w);
                            let mut out =
                                DeviceTensor::alloc(stream, dtype, shape, layout).expect("alloc");
                            poison(stream, &mut out);
                            kernel
                                .run_into(stream, &input, &mut out, &spec)
                                .expect("run");
                            let got = out.to_host().expect("download");
                            let want = normalize(&pixels, n, h, w, &spec);
                            assert_eq!(got.shape(), want.shape());
                            let (g, r) = (got.to_le_bytes(), want.to_le_bytes());
                            if let Some(i) = first_mismatch(&g, &r, dtype.size_of()) {
                                panic!(
                                    "{n}x{h}x{w} {dtype:?} {layout:?} {channel_order:?} \
                                     {affine:?}: element {i} is {} on the GPU, {} on the CPU",
                                    got.to_f32_vec()[i],
                                    want.to_f32_vec()[i]
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn a_part_of_a_buffer_normalizes_as_a_buffer_of_its_own() {
        let Some(gpu) = crate::cuda::test_gpu(module_path!()) else {
            return;
        };
        let stream = gpu.stream().clone();
        let stream = &stream;
        let kernel = Normalizer::new(stream).expect("compile");
        // Two blocks as a batch of views lays them out: 3 images of 96 x 96 at offset 0, then
        // 2 of 5 x 7 at the next multiple of 256.
        let first: usize = 3 * 96 * 96 * 3;
        let second_at = first.next_multiple_of(256);
        let pixels = random_bytes(second_at + 2 * 5 * 7 * 3, 41);
        let input = stream.clone_htod(&pixels).expect("upload");
        for dtype in [DType::F16, DType::BF16, DType::F32] {
            for layout in [Layout::Nchw, Layout::Nhwc] {
                let spec = OutputOptions::default().dtype(dtype).layout(layout).spec();
                for (range, n, side) in [
                    (0..first, 3, (96, 96)),
                    (second_at..pixels.len(), 2, (5, 7)),
                ] {
                    let part = input.slice(range.clone());
                    let got = kernel
                        .run_view(stream, &part, n, side.0, side.1, &spec)
                        .expect("run")
                        .to_host()
                        .expect("download");
                    let want = normalize(&pixels[range], n, side.0, side.1, &spec);
                    assert_eq!(got.shape(), want.shape());
                    assert!(
                        got.to_le_bytes() == want.to_le_bytes(),
                        "{dtype:?} {layout:?} {n}x{side:?}"
                    );
                }
            }
        }
        // A part that does not begin 16-byte aligned is refused.
        let spec = OutputOptions::default().spec();
        let part = input.slice(1..1 + 4 * 4 * 3);
        assert!(matches!(
            kernel.run_view(stream, &part, 1, 4, 4, &spec),
            Err(Error::Mismatch(_))
        ));
    }

    #[test]
    fn kernel_refuses_a_too_small_input() {
        let Some(gpu) = crate::cuda::test_gpu(module_path!()) else {
            return;
        };
        let stream = gpu.stream().clone();
        let stream = &stream;
        let kernel = Normalizer::new(stream).expect("compile");
        let input = stream.clone_htod(&[0u8; 10]).expect("upload");
        let spec = OutputOptions::default().spec();
        assert!(matches!(
            kernel.run(stream, &input, 1, 4, 4, &spec),
            Err(Error::Mismatch(_))
        ));
    }
}
