//! The u8-vs-f32 upload bench: what crossing PCIe as u8 and normalizing on the GPU saves.
//!
//! For each batch size it measures, with timing-enabled CUDA events on one stream, warm-up
//! excluded, the median of `runs` repetitions:
//! - bytes per batch as u8, f16 and f32;
//! - host-to-device time of the u8 and the f32 batch, from pinned and from pageable memory;
//! - the fused kernel `kernels/normalize.cu`, u8 -> f16 and f32, NCHW and NHWC;
//! - three ways to get a normalized f16 NCHW batch onto the GPU: (a) this design, u8 upload + the
//!   fused kernel; (b) the usual way, f32 normalized on the CPU then uploaded; (c) u8 upload + a
//!   naive multi-pass conversion like PyTorch eager's (`kernels/baseline.cu`).
//!
//! Device buffers rotate through a set larger than the L2 cache, so repeated runs read from
//! device memory, not the cache. `gpufeed bench` and `cargo bench --bench upload` run this code.

use std::fmt::Write as _;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use gpufeed::cuda::{NormalizeTuning, Normalizer};
use gpufeed::cudarc::driver::sys::CUevent_flags;
use gpufeed::cudarc::driver::{CudaFunction, CudaSlice, CudaStream, LaunchConfig, PushKernelArg};
use gpufeed::cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions};
use gpufeed::{DType, DeviceTensor, Layout, NormalizeSpec, OutputOptions};

use crate::{cuda, median, BenchError, Result};

/// What to measure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BenchOptions {
    /// Batch sizes, one row each.
    pub batch_sizes: Vec<usize>,
    /// Image height.
    pub height: usize,
    /// Image width.
    pub width: usize,
    /// Timed repetitions per measurement (at least 30 for a stable median).
    pub runs: usize,
    /// CUDA device ordinal.
    pub device: usize,
    /// How the normalize kernel is compiled (the default is what the pipeline uses).
    pub tuning: NormalizeTuning,
}

impl Default for BenchOptions {
    fn default() -> Self {
        BenchOptions {
            batch_sizes: vec![32, 64, 128, 256],
            height: 224,
            width: 224,
            runs: 50,
            device: 0,
            tuning: NormalizeTuning::default(),
        }
    }
}

/// Median times of one batch size, in milliseconds.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchRow {
    /// Images per batch.
    pub batch: usize,
    /// Bytes of the batch as u8.
    pub u8_bytes: usize,
    /// Bytes as f16.
    pub f16_bytes: usize,
    /// Bytes as f32.
    pub f32_bytes: usize,
    /// u8 upload from pinned memory.
    pub h2d_u8_pinned_ms: f64,
    /// f32 upload from pinned memory.
    pub h2d_f32_pinned_ms: f64,
    /// u8 upload from pageable memory.
    pub h2d_u8_pageable_ms: f64,
    /// f32 upload from pageable memory.
    pub h2d_f32_pageable_ms: f64,
    /// Fused kernel, u8 -> f16 NCHW.
    pub kernel_f16_nchw_ms: f64,
    /// Fused kernel, u8 -> f16 NHWC.
    pub kernel_f16_nhwc_ms: f64,
    /// Fused kernel, u8 -> f32 NCHW.
    pub kernel_f32_nchw_ms: f64,
    /// Fused kernel, u8 -> f32 NHWC.
    pub kernel_f32_nhwc_ms: f64,
    /// Naive multi-pass conversion u8 -> f16 NCHW (device only).
    pub naive_f16_nchw_ms: f64,
    /// Device-to-device copy bandwidth (bytes read + written per second, TB/s), the roofline
    /// a one-pass kernel can approach.
    pub copy_tb_per_s: f64,
    /// (a) u8 pinned upload + fused kernel to f16 NCHW.
    pub way_a_ms: f64,
    /// (b) upload of the f32 NCHW batch normalized on the CPU (pinned).
    pub way_b_ms: f64,
    /// (c) u8 pinned upload + naive multi-pass conversion.
    pub way_c_ms: f64,
    /// Host time to normalize the batch to f32 NCHW on the CPU (all cores), which (b) also pays.
    pub cpu_normalize_ms: f64,
}

impl BenchRow {
    /// Effective bandwidth of a kernel in TB/s: bytes read plus bytes written over its time.
    pub fn kernel_tb_per_s(&self, out_bytes: usize, ms: f64) -> f64 {
        (self.u8_bytes + out_bytes) as f64 / (ms * 1e-3) / 1e12
    }

    /// Upload bandwidth in GB/s.
    pub fn gb_per_s(bytes: usize, ms: f64) -> f64 {
        bytes as f64 / (ms * 1e-3) / 1e9
    }
}

/// The bench's results.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchReport {
    /// Device, in words.
    pub device: String,
    /// Image height and width.
    pub image: (usize, usize),
    /// Timed repetitions per figure.
    pub runs: usize,
    /// One row per batch size.
    pub rows: Vec<BenchRow>,
}

/// Runs the bench on `options.device`.
pub fn run(options: &BenchOptions) -> Result<BenchReport> {
    if options.batch_sizes.is_empty() || options.height == 0 || options.width == 0 {
        return Err(BenchError::Nothing(
            "no batch size, or images of no pixels".into(),
        ));
    }
    let stream = gpufeed::cuda::new_stream(options.device)?;
    let kernel = Normalizer::with_tuning(&stream, options.tuning)?;
    let naive = NaiveKernels::compile(&stream)?;
    let runs = options.runs.max(3);
    let mut rows = Vec::new();
    for &batch in &options.batch_sizes {
        rows.push(measure_batch(
            &stream,
            &kernel,
            &naive,
            batch,
            options.height,
            options.width,
            runs,
        )?);
    }
    Ok(BenchReport {
        device: gpufeed::cuda::describe_device(options.device)?,
        image: (options.height, options.width),
        runs,
        rows,
    })
}

/// Times `f` with events on `stream`: a few warm-up calls, then the median of `runs`.
fn time_ms(
    stream: &Arc<CudaStream>,
    runs: usize,
    mut f: impl FnMut(usize) -> Result<()>,
) -> Result<f64> {
    let ctx = stream.context();
    let fail = cuda("timing with events");
    for i in 0..3 {
        f(i)?;
    }
    let mut times = Vec::with_capacity(runs);
    for i in 0..runs {
        let start = ctx
            .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(fail)?;
        let end = ctx
            .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(fail)?;
        start.record(stream).map_err(fail)?;
        f(i)?;
        end.record(stream).map_err(fail)?;
        end.synchronize().map_err(fail)?;
        times.push(start.elapsed_ms(&end).map_err(fail)? as f64);
    }
    Ok(median(&mut times))
}

/// Enough copies of a buffer of `bytes` that cycling through them overflows a 50 MB L2 cache
/// several times: at least 2, at most 16.
fn rotation(bytes: usize) -> usize {
    (256_000_000usize.div_ceil(bytes.max(1))).clamp(2, 16)
}

/// Deterministic pseudo-random bytes (xorshift), for inputs that are not all alike.
pub fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 32) as u8
        })
        .collect()
}

fn measure_batch(
    stream: &Arc<CudaStream>,
    kernel: &Normalizer,
    naive: &NaiveKernels,
    batch: usize,
    height: usize,
    width: usize,
    runs: usize,
) -> Result<BenchRow> {
    let fail = cuda;
    let elements = batch * height * width * 3;
    let pixels_u8 = random_bytes(elements, batch as u64);
    let output = OutputOptions::default();
    let spec = |dtype, layout| -> NormalizeSpec { output.dtype(dtype).layout(layout).spec() };

    // Host sources: pinned and pageable, u8 and f32 (the f32 batch is what the usual way uploads).
    let mut cpu_times = Vec::new();
    let mut normalized = Vec::new();
    for _ in 0..3 {
        let t = Instant::now();
        normalized = gpufeed::cpu::normalize(
            &pixels_u8,
            batch,
            height,
            width,
            &spec(DType::F32, Layout::Nchw),
        )
        .to_f32_vec();
        cpu_times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let cpu_normalize_ms = median(&mut cpu_times);
    let ctx = stream.context();
    // SAFETY: uninitialized pinned memory, fully written right below before any read.
    let mut pinned_u8 = unsafe { ctx.alloc_pinned_with_flags::<u8>(elements, 0) }
        .map_err(fail("allocating pinned memory"))?;
    pinned_u8
        .as_mut_slice()
        .map_err(fail("mapping pinned memory"))?
        .copy_from_slice(&pixels_u8);
    // SAFETY: as above.
    let mut pinned_f32 = unsafe { ctx.alloc_pinned_with_flags::<f32>(elements, 0) }
        .map_err(fail("allocating pinned memory"))?;
    pinned_f32
        .as_mut_slice()
        .map_err(fail("mapping pinned memory"))?
        .copy_from_slice(&normalized);
    let host_u8 = pinned_u8
        .as_slice()
        .map_err(fail("mapping pinned memory"))?;
    let host_f32 = pinned_f32
        .as_slice()
        .map_err(fail("mapping pinned memory"))?;

    // Device buffers, rotated.
    let k_in = rotation(elements);
    let k_out = rotation(elements * 4);
    let mut dev_u8: Vec<CudaSlice<u8>> = (0..k_in)
        .map(|_| stream.clone_htod(&pixels_u8))
        .collect::<std::result::Result<_, _>>()
        .map_err(fail("allocating device input"))?;
    let mut dev_f32_in: Vec<CudaSlice<f32>> = (0..k_in.min(4))
        .map(|_| stream.alloc_zeros::<f32>(elements))
        .collect::<std::result::Result<_, _>>()
        .map_err(fail("allocating device f32"))?;
    let outputs = |dtype, layout: Layout| -> Result<Vec<DeviceTensor>> {
        (0..k_out)
            .map(|_| {
                DeviceTensor::alloc(stream, dtype, layout.shape(batch, height, width), layout)
                    .map_err(BenchError::from)
            })
            .collect()
    };
    let mut out_f16_nchw = outputs(DType::F16, Layout::Nchw)?;
    let mut out_f16_nhwc = outputs(DType::F16, Layout::Nhwc)?;
    let mut out_f32_nchw = outputs(DType::F32, Layout::Nchw)?;
    let mut out_f32_nhwc = outputs(DType::F32, Layout::Nhwc)?;

    let upload_u8 = |dst: &mut CudaSlice<u8>, src: &[u8]| {
        stream.memcpy_htod(src, dst).map_err(cuda("uploading"))
    };
    let h2d_u8_pinned_ms = time_ms(stream, runs, |i| upload_u8(&mut dev_u8[i % k_in], host_u8))?;
    let h2d_u8_pageable_ms = time_ms(stream, runs, |i| {
        upload_u8(&mut dev_u8[i % k_in], &pixels_u8)
    })?;
    let k_f32 = dev_f32_in.len();
    let h2d_f32_pinned_ms = time_ms(stream, runs, |i| {
        stream
            .memcpy_htod(host_f32, &mut dev_f32_in[i % k_f32])
            .map_err(cuda("uploading"))
    })?;
    let h2d_f32_pageable_ms = time_ms(stream, runs, |i| {
        stream
            .memcpy_htod(&normalized, &mut dev_f32_in[i % k_f32])
            .map_err(cuda("uploading"))
    })?;

    let time_kernel = |outs: &mut Vec<DeviceTensor>, dtype, layout| {
        let s = spec(dtype, layout);
        time_ms(stream, runs, |i| {
            Ok(kernel.run_into(stream, &dev_u8[i % k_in], &mut outs[i % k_out], &s)?)
        })
    };
    let kernel_f16_nchw_ms = time_kernel(&mut out_f16_nchw, DType::F16, Layout::Nchw)?;
    let kernel_f16_nhwc_ms = time_kernel(&mut out_f16_nhwc, DType::F16, Layout::Nhwc)?;
    let kernel_f32_nchw_ms = time_kernel(&mut out_f32_nchw, DType::F32, Layout::Nchw)?;
    let kernel_f32_nhwc_ms = time_kernel(&mut out_f32_nhwc, DType::F32, Layout::Nhwc)?;

    // The roofline: a device-to-device copy of the f16 batch's size, read + written.
    let copy_bytes = elements * 2;
    let copy_buffers = |n: usize| -> Result<Vec<CudaSlice<u8>>> {
        (0..n)
            .map(|_| stream.alloc_zeros::<u8>(copy_bytes))
            .collect::<std::result::Result<_, _>>()
            .map_err(fail("allocating copy buffers"))
    };
    let copy_sources = copy_buffers(k_out)?;
    let mut copy_targets = copy_buffers(k_out)?;
    let copy_ms = time_ms(stream, runs, |i| {
        stream
            .memcpy_dtod(&copy_sources[i % k_out], &mut copy_targets[i % k_out])
            .map_err(cuda("copying on the device"))
    })?;
    drop((copy_sources, copy_targets));
    let copy_tb_per_s = 2.0 * copy_bytes as f64 / (copy_ms * 1e-3) / 1e12;

    let mut scratch_a = stream
        .alloc_zeros::<f32>(elements)
        .map_err(fail("allocating scratch"))?;
    let mut scratch_b = stream
        .alloc_zeros::<f32>(elements)
        .map_err(fail("allocating scratch"))?;
    let mut naive_out = stream
        .alloc_zeros::<u16>(elements)
        .map_err(fail("allocating scratch"))?;
    let hw = (height * width) as u32;
    let mut naive_pass = |input: &CudaSlice<u8>| {
        naive.run(
            stream,
            input,
            &mut scratch_a,
            &mut scratch_b,
            &mut naive_out,
            hw,
            &output,
        )
    };
    let naive_f16_nchw_ms = time_ms(stream, runs, |i| naive_pass(&dev_u8[i % k_in]))?;

    let f16_nchw = spec(DType::F16, Layout::Nchw);
    let way_a_ms = time_ms(stream, runs, |i| {
        upload_u8(&mut dev_u8[i % k_in], host_u8)?;
        Ok(kernel.run_into(
            stream,
            &dev_u8[i % k_in],
            &mut out_f16_nchw[i % k_out],
            &f16_nchw,
        )?)
    })?;
    let way_b_ms = h2d_f32_pinned_ms;
    let way_c_ms = time_ms(stream, runs, |i| {
        upload_u8(&mut dev_u8[i % k_in], host_u8)?;
        naive_pass(&dev_u8[i % k_in])
    })?;
    stream.synchronize().map_err(fail("synchronizing"))?;
    Ok(BenchRow {
        batch,
        u8_bytes: elements,
        f16_bytes: elements * 2,
        f32_bytes: elements * 4,
        h2d_u8_pinned_ms,
        h2d_f32_pinned_ms,
        h2d_u8_pageable_ms,
        h2d_f32_pageable_ms,
        kernel_f16_nchw_ms,
        kernel_f16_nhwc_ms,
        kernel_f32_nchw_ms,
        kernel_f32_nhwc_ms,
        naive_f16_nchw_ms,
        copy_tb_per_s,
        way_a_ms,
        way_b_ms,
        way_c_ms,
        cpu_normalize_ms,
    })
}

/// `kernels/baseline.cu`: one pass per step, like PyTorch eager.
struct NaiveKernels {
    cast_u8_f32: CudaFunction,
    scale: CudaFunction,
    sub_channel: CudaFunction,
    div_channel: CudaFunction,
    permute_nchw: CudaFunction,
    cast_f32_f16: CudaFunction,
}

impl NaiveKernels {
    fn compile(stream: &Arc<CudaStream>) -> Result<NaiveKernels> {
        let ctx = stream.context();
        let (major, minor) = ctx
            .compute_capability()
            .map_err(cuda("reading the compute capability"))?;
        let options = CompileOptions {
            options: vec![format!("--gpu-architecture=compute_{major}{minor}")],
            name: Some("baseline.cu".into()),
            ..Default::default()
        };
        let ptx = compile_ptx_with_opts(include_str!("../../../kernels/baseline.cu"), options)
            .map_err(|e| BenchError::Compile(format!("{e:?}")))?;
        let module = ctx
            .load_module(ptx)
            .map_err(cuda("loading the baseline kernels"))?;
        let load = |name: &str| {
            module
                .load_function(name)
                .map_err(cuda("finding a baseline kernel"))
        };
        Ok(NaiveKernels {
            cast_u8_f32: load("baseline_cast_u8_f32")?,
            scale: load("baseline_scale")?,
            sub_channel: load("baseline_sub_channel")?,
            div_channel: load("baseline_div_channel")?,
            permute_nchw: load("baseline_permute_nchw")?,
            cast_f32_f16: load("baseline_cast_f32_f16")?,
        })
    }

    /// u8 NHWC `input` -> f16 NCHW `out` in six passes through `a` and `b`.
    #[allow(clippy::too_many_arguments)]
    fn run(
        &self,
        stream: &Arc<CudaStream>,
        input: &CudaSlice<u8>,
        a: &mut CudaSlice<f32>,
        b: &mut CudaSlice<f32>,
        out: &mut CudaSlice<u16>,
        hw: u32,
        output: &OutputOptions,
    ) -> Result<()> {
        let n = a.len() as u32;
        let cfg = LaunchConfig::for_num_elems(n);
        let scale = 1.0f32 / 255.0;
        let [m0, m1, m2] = output.mean;
        let [s0, s1, s2] = output.std;
        let launch = |r: std::result::Result<_, gpufeed::cudarc::driver::DriverError>| {
            r.map(|_| ()).map_err(cuda("launching a baseline kernel"))
        };
        // SAFETY: each launch passes the parameters its kernel declares in baseline.cu; all
        // buffers hold `n` elements and every kernel checks its index against `n` (the permute
        // reads `in` at indices below `n` too).
        unsafe {
            launch(
                stream
                    .launch_builder(&self.cast_u8_f32)
                    .arg(input)
                    .arg(&mut *a)
                    .arg(&n)
                    .launch(cfg),
            )?;
            launch(
                stream
                    .launch_builder(&self.scale)
                    .arg(&mut *a)
                    .arg(&scale)
                    .arg(&n)
                    .launch(cfg),
            )?;
            launch(
                stream
                    .launch_builder(&self.sub_channel)
                    .arg(&mut *a)
                    .arg(&m0)
                    .arg(&m1)
                    .arg(&m2)
                    .arg(&n)
                    .launch(cfg),
            )?;
            launch(
                stream
                    .launch_builder(&self.div_channel)
                    .arg(&mut *a)
                    .arg(&s0)
                    .arg(&s1)
                    .arg(&s2)
                    .arg(&n)
                    .launch(cfg),
            )?;
            launch(
                stream
                    .launch_builder(&self.permute_nchw)
                    .arg(&*a)
                    .arg(&mut *b)
                    .arg(&hw)
                    .arg(&n)
                    .launch(cfg),
            )?;
            launch(
                stream
                    .launch_builder(&self.cast_f32_f16)
                    .arg(&*b)
                    .arg(out)
                    .arg(&n)
                    .launch(cfg),
            )?;
        }
        Ok(())
    }
}

impl BenchReport {
    /// The results as aligned text tables.
    pub fn table(&self) -> String {
        let mut s = String::new();
        let (h, w) = self.image;
        let _ = writeln!(
            s,
            "gpufeed bench: {} | images {h}x{w}x3 | median of {} runs, CUDA events",
            self.device, self.runs
        );
        let _ = writeln!(s, "\nBytes per batch and host-to-device time (ms, GB/s)");
        let _ = writeln!(
            s,
            "{:>6} {:>9} {:>9} {:>9} | {:>15} {:>15} {:>7} | {:>15} {:>15}",
            "batch",
            "u8 MB",
            "f16 MB",
            "f32 MB",
            "u8 pinned",
            "f32 pinned",
            "u8/f32",
            "u8 pageable",
            "f32 pageable"
        );
        for r in &self.rows {
            let cell = |bytes, ms| format!("{ms:.3} ({:.1})", BenchRow::gb_per_s(bytes, ms));
            let _ = writeln!(
                s,
                "{:>6} {:>9.2} {:>9.2} {:>9.2} | {:>15} {:>15} {:>7.3} | {:>15} {:>15}",
                r.batch,
                r.u8_bytes as f64 / 1e6,
                r.f16_bytes as f64 / 1e6,
                r.f32_bytes as f64 / 1e6,
                cell(r.u8_bytes, r.h2d_u8_pinned_ms),
                cell(r.f32_bytes, r.h2d_f32_pinned_ms),
                r.h2d_u8_pinned_ms / r.h2d_f32_pinned_ms,
                cell(r.u8_bytes, r.h2d_u8_pageable_ms),
                cell(r.f32_bytes, r.h2d_f32_pageable_ms),
            );
        }
        let _ = writeln!(
            s,
            "\nFused normalize kernel (ms, effective TB/s = bytes read + written) vs naive multi-pass"
        );
        let _ = writeln!(
            s,
            "{:>6} | {:>16} {:>16} {:>16} {:>16} | {:>10} {:>8}",
            "batch",
            "u8->f16 NCHW",
            "u8->f16 NHWC",
            "u8->f32 NCHW",
            "u8->f32 NHWC",
            "naive f16",
            "speedup"
        );
        for r in &self.rows {
            let cell = |out, ms| format!("{ms:.4} ({:.2})", r.kernel_tb_per_s(out, ms));
            let _ = writeln!(
                s,
                "{:>6} | {:>16} {:>16} {:>16} {:>16} | {:>10.4} {:>7.1}x | {:>9.2} {:>8.0}%",
                r.batch,
                cell(r.f16_bytes, r.kernel_f16_nchw_ms),
                cell(r.f16_bytes, r.kernel_f16_nhwc_ms),
                cell(r.f32_bytes, r.kernel_f32_nchw_ms),
                cell(r.f32_bytes, r.kernel_f32_nhwc_ms),
                r.naive_f16_nchw_ms,
                r.naive_f16_nchw_ms / r.kernel_f16_nchw_ms,
                r.copy_tb_per_s,
                100.0 * r.kernel_tb_per_s(r.f16_bytes, r.kernel_f16_nchw_ms) / r.copy_tb_per_s,
            );
        }
        let _ = writeln!(s, "\nNormalized f16 NCHW batch on the GPU, ms per batch");
        let _ = writeln!(
            s,
            "{:>6} | {:>22} {:>22} {:>22} | {:>6} | {:>18}",
            "batch",
            "(a) u8 up + fused",
            "(b) f32 made on CPU, up",
            "(c) u8 up + naive",
            "a/b",
            "CPU f32 normalize"
        );
        for r in &self.rows {
            let _ = writeln!(
                s,
                "{:>6} | {:>22.3} {:>22.3} {:>22.3} | {:>6.3} | {:>15.2} ms",
                r.batch,
                r.way_a_ms,
                r.way_b_ms,
                r.way_c_ms,
                r.way_a_ms / r.way_b_ms,
                r.cpu_normalize_ms
            );
        }
        s
    }

    /// The results as CSV, one row per batch size, times in ms.
    pub fn csv(&self) -> String {
        let mut s = String::from(
            "device,batch,height,width,u8_bytes,f16_bytes,f32_bytes,h2d_u8_pinned_ms,\
             h2d_f32_pinned_ms,h2d_u8_pageable_ms,h2d_f32_pageable_ms,kernel_f16_nchw_ms,\
             kernel_f16_nhwc_ms,kernel_f32_nchw_ms,kernel_f32_nhwc_ms,naive_f16_nchw_ms,\
             copy_tb_per_s,way_a_ms,way_b_ms,way_c_ms,cpu_normalize_ms\n",
        );
        for r in &self.rows {
            let _ = writeln!(
                s,
                "\"{}\",{},{},{},{},{},{},{:.5},{:.5},{:.5},{:.5},{:.5},{:.5},{:.5},{:.5},{:.5},{:.3},{:.5},{:.5},{:.5},{:.3}",
                self.device.replace('"', "'"),
                r.batch,
                self.image.0,
                self.image.1,
                r.u8_bytes,
                r.f16_bytes,
                r.f32_bytes,
                r.h2d_u8_pinned_ms,
                r.h2d_f32_pinned_ms,
                r.h2d_u8_pageable_ms,
                r.h2d_f32_pageable_ms,
                r.kernel_f16_nchw_ms,
                r.kernel_f16_nhwc_ms,
                r.kernel_f32_nchw_ms,
                r.kernel_f32_nhwc_ms,
                r.naive_f16_nchw_ms,
                r.copy_tb_per_s,
                r.way_a_ms,
                r.way_b_ms,
                r.way_c_ms,
                r.cpu_normalize_ms
            );
        }
        s
    }

    /// Draws time per batch against batch size for ways (a), (b) and (c) as an SVG file.
    pub fn write_svg(&self, path: &Path) -> Result<()> {
        let series = [
            (
                "(a) u8 upload + fused kernel",
                "#1b9e77",
                self.rows
                    .iter()
                    .map(|r| (r.batch, r.way_a_ms))
                    .collect::<Vec<_>>(),
            ),
            (
                "(b) f32 made on CPU, uploaded",
                "#d95f02",
                self.rows.iter().map(|r| (r.batch, r.way_b_ms)).collect(),
            ),
            (
                "(c) u8 upload + naive multi-pass",
                "#7570b3",
                self.rows.iter().map(|r| (r.batch, r.way_c_ms)).collect(),
            ),
        ];
        let svg = crate::chart::line_chart(
            &format!("Normalized f16 NCHW batch on the GPU: {}", self.device),
            "batch size (images)",
            "ms per batch",
            &series,
        );
        std::fs::write(path, svg).map_err(|source| BenchError::Write {
            path: path.to_path_buf(),
            source,
        })
    }
}
