//! `kernels/normalize.cu`: compiled once per pipeline by NVRTC for the device's compute
//! capability, launched once per batch.

use std::sync::Arc;

use cudarc::driver::{
    CudaFunction, CudaModule, CudaSlice, CudaStream, DeviceRepr, LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions};

use super::tensor::{DeviceData, DeviceTensor};
use super::{driver_error, guarded};
use crate::config::{ChannelOrder, DType, Layout};
use crate::error::{Error, Result};
use crate::reference::NormalizeSpec;

/// The kernel source, embedded at build time.
pub(crate) const SOURCE: &str = include_str!("../../kernels/normalize.cu");

/// Compiles CUDA C++ `source` with NVRTC for the stream's device and loads it.
pub(crate) fn compile_module(
    stream: &Arc<CudaStream>,
    source: &str,
    name: &str,
) -> Result<Arc<CudaModule>> {
    let ctx = stream.context().clone();
    let (major, minor) = ctx
        .compute_capability()
        .map_err(|e| driver_error("reading the compute capability", e))?;
    let options = CompileOptions {
        options: vec![format!("--gpu-architecture=compute_{major}{minor}")],
        name: Some(name.into()),
        ..Default::default()
    };
    let ptx = std::panic::catch_unwind(|| compile_ptx_with_opts(source, options))
        .map_err(|_| Error::CudaUnavailable("NVRTC could not be called".into()))?
        .map_err(|e| Error::KernelCompile(format!("{name}: {e}")))?;
    guarded("loading a compiled kernel", || ctx.load_module(ptx))
}

/// Pixels each thread of the fast kernels handles.
const PIXELS_PER_THREAD: usize = 16;
const THREADS_PER_BLOCK: u32 = 256;

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
    nchw16: CudaFunction,
    nhwc16: CudaFunction,
    pixel: CudaFunction,
}

/// The compiled normalize kernel.
#[derive(Debug)]
pub(crate) struct NormalizeKernel {
    f32: Entries,
    f16: Entries,
    bf16: Entries,
}

impl NormalizeKernel {
    /// Compiles the kernel source for the stream's device and loads it.
    pub fn compile(stream: &Arc<CudaStream>) -> Result<NormalizeKernel> {
        let module = compile_module(stream, SOURCE, "normalize.cu")?;
        let load = |name: String| {
            module
                .load_function(&name)
                .map_err(|e| driver_error("finding a kernel entry point", e))
        };
        let entries = |dtype: &str| -> Result<Entries> {
            Ok(Entries {
                nchw16: load(format!("gpufeed_nchw16_{dtype}"))?,
                nhwc16: load(format!("gpufeed_nhwc16_{dtype}"))?,
                pixel: load(format!("gpufeed_pixel_{dtype}"))?,
            })
        };
        Ok(NormalizeKernel {
            f32: entries("f32")?,
            f16: entries("f16")?,
            bf16: entries("bf16")?,
        })
    }

    /// Normalizes `n` images of `height` x `width` u8 HWC pixels from `input` into a new device
    /// tensor, on `stream`.
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

    /// Like [`NormalizeKernel::run`], into an existing tensor whose shape, dtype and layout say
    /// what to produce.
    pub fn run_into(
        &self,
        stream: &Arc<CudaStream>,
        input: &CudaSlice<u8>,
        out: &mut DeviceTensor,
        spec: &NormalizeSpec,
    ) -> Result<()> {
        let (n, height, width) = match out.layout {
            Layout::Nchw => (out.shape[0], out.shape[2], out.shape[3]),
            Layout::Nhwc => (out.shape[0], out.shape[1], out.shape[2]),
        };
        if out.dtype() != spec.dtype || out.layout != spec.layout {
            return Err(Error::Config(
                "output tensor does not match the normalize spec".into(),
            ));
        }
        let hw = height * width;
        let pixels = n * hw;
        if pixels == 0 {
            return Ok(());
        }
        if input.len() < pixels * 3 {
            return Err(Error::Config(format!(
                "device input holds {} bytes, the batch needs {}",
                input.len(),
                pixels * 3
            )));
        }
        if pixels > u32::MAX as usize / 2 {
            return Err(Error::Config(format!(
                "{pixels} pixels in one batch: the kernel indexes pixels with 32 bits; use a \
                 smaller batch"
            )));
        }
        let entries = match spec.dtype {
            DType::F32 => &self.f32,
            DType::F16 => &self.f16,
            DType::BF16 => &self.bf16,
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
        };
        match &mut out.data {
            DeviceData::F32(s) => shape.launch(stream, entries, input, s),
            DeviceData::F16(s) => shape.launch(stream, entries, input, s),
            DeviceData::BF16(s) => shape.launch(stream, entries, input, s),
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
}

impl LaunchShape {
    fn grid(units: usize) -> LaunchConfig {
        LaunchConfig {
            grid_dim: ((units as u32).div_ceil(THREADS_PER_BLOCK), 1, 1),
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
        input: &CudaSlice<u8>,
        out: &mut CudaSlice<T>,
    ) -> Result<()> {
        let hw = self.hw as u32;
        let nchw = i32::from(self.layout == Layout::Nchw);
        let count: u32;
        let groups_per_image: u32;
        let (mut builder, config) = match self.layout {
            Layout::Nchw if self.hw % PIXELS_PER_THREAD == 0 => {
                count = (self.pixels / PIXELS_PER_THREAD) as u32;
                groups_per_image = (self.hw / PIXELS_PER_THREAD) as u32;
                let mut b = stream.launch_builder(&entries.nchw16);
                b.arg(input)
                    .arg(out)
                    .arg(&count)
                    .arg(&groups_per_image)
                    .arg(&hw)
                    .arg(&self.affine)
                    .arg(&self.bgr);
                (b, Self::grid(count as usize))
            }
            Layout::Nhwc if self.pixels % PIXELS_PER_THREAD == 0 => {
                count = (self.pixels / PIXELS_PER_THREAD) as u32;
                let mut b = stream.launch_builder(&entries.nhwc16);
                b.arg(input)
                    .arg(out)
                    .arg(&count)
                    .arg(&self.affine)
                    .arg(&self.bgr);
                (b, Self::grid(count as usize))
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
                (b, Self::grid(count as usize))
            }
        };
        // SAFETY: the arguments match the chosen entry point's parameter list; `input` holds at
        // least `pixels * 3` bytes and `out` `pixels * 3` elements of the entry point's dtype
        // (checked by `run_into` and the tensor's shape); every thread checks its index against
        // `count`; the 16-pixel entry points need 16-byte aligned buffers, which device
        // allocations are, and are chosen only when the pixel counts divide by 16.
        unsafe { builder.launch(config) }
            .map(|_| ())
            .map_err(|e| driver_error("launching the normalize kernel", e))
    }
}
