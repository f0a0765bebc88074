//! `kernels/resize.cu`: the batched Pillow resize, compiled by NVRTC for the stream's device and
//! launched over a planned batch ([`super::plan`]): the first pass (skipped when no image
//! resamples both axes), then the last pass that writes every byte of every slot a job names.
//!
//! cudarc loads libcuda and NVRTC at run time and panics when they are missing: call
//! `cudarc::driver::sys::is_culib_present()` and `cudarc::nvrtc::sys::is_culib_present()` before
//! anything here (src/bin/resize_check.rs shows how).
// The whole of what it ports is kept, used by the pipeline or not (tests, other filters).
#![allow(dead_code)]

use std::borrow::Cow;
use std::sync::Arc;

use cudarc::driver::{
    CudaFunction, CudaSlice, CudaStream, DevicePtrMut, DeviceRepr, DriverError, LaunchConfig,
    PushKernelArg,
};
use cudarc::nvrtc::{compile_ptx_with_opts, CompileError, CompileOptions, Ptx};
use thiserror::Error;

#[cfg(test)]
mod host;
pub(crate) mod plan;

use plan::{BatchError, BatchPlan, ResizeDescriptor, THREADS_PER_BLOCK};

/// The kernel source, embedded at build time.
pub const SOURCE: &str = include_str!("../../../kernels/resize.cu");

// SAFETY: `ResizeDescriptor` is `repr(C)` plain old data (integers only, no padding: 4 u64 then
// 26 u32, two of them nested `PassDescriptor`s of 6; 136 bytes) laid out as the kernel's
// `GfResizeImage` (batch.rs's tests compare the two field by field, the kernel static_asserts the
// sizes), so its bytes can be copied to the device as they are.
unsafe impl DeviceRepr for ResizeDescriptor {}

/// What can go wrong on the device side.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum GpuError {
    /// A CUDA driver call failed.
    #[error("CUDA failed {context}: {source}")]
    Driver {
        /// What was being done.
        context: &'static str,
        /// The driver's error.
        #[source]
        source: DriverError,
    },
    /// NVRTC rejected the kernel source.
    #[error("NVRTC could not compile kernels/resize.cu: {0}")]
    Compile(String),
    /// The batch could not be planned.
    #[error(transparent)]
    Plan(#[from] BatchError),
    /// The output buffer is smaller than the slots the batch writes.
    #[error("the output holds {actual} bytes, the batch writes up to byte {needed}")]
    OutputTooSmall {
        /// Bytes the batch's slots span.
        needed: u64,
        /// Bytes of the output.
        actual: u64,
    },
}

impl GpuError {
    fn driver(context: &'static str) -> impl FnOnce(DriverError) -> GpuError {
        move |source| GpuError::Driver { context, source }
    }
}

/// kernels/resize.cu compiled by NVRTC to PTX for compute capability `major.minor`
/// (`--gpu-architecture=compute_XY`). Needs NVRTC only, no device.
pub fn compile(major: i32, minor: i32) -> Result<Ptx, GpuError> {
    let options = CompileOptions {
        options: vec![format!("--gpu-architecture=compute_{major}{minor}")],
        name: Some("resize.cu".into()),
        ..Default::default()
    };
    // cudarc panics when NVRTC cannot be loaded; that becomes an error here.
    let compiled = std::panic::catch_unwind(|| compile_ptx_with_opts(SOURCE, options))
        .map_err(|_| GpuError::Compile("NVRTC could not be loaded".into()))?;
    compiled.map_err(|e| {
        GpuError::Compile(match e {
            CompileError::CompileError { nvrtc, log, .. } => {
                format!("{nvrtc:?}: {}", log.to_string_lossy())
            }
            other => format!("{other:?}"),
        })
    })
}

/// The two entry points of kernels/resize.cu, compiled for one device.
#[derive(Debug)]
pub struct BatchResizer {
    first: CudaFunction,
    last: CudaFunction,
}

/// A planned batch in device memory: descriptors, coefficients and the intermediate buffer.
/// Reusable: launching it again recomputes the same slots.
#[derive(Debug)]
pub struct DevicePlan {
    descriptors: CudaSlice<ResizeDescriptor>,
    coefficients: CudaSlice<i32>,
    intermediate: CudaSlice<u8>,
    images: u32,
    first_pass_blocks: u32,
    last_pass_grid: (u32, u32),
    out_width: u32,
    out_height: u32,
    output_bytes: u64,
}

impl DevicePlan {
    /// Bytes of output the batch writes into (slots `0..plan.slots`).
    pub fn output_bytes(&self) -> u64 {
        self.output_bytes
    }

    /// Replaces the batch with `plan`, on `stream`, reusing the device buffers where they are
    /// large enough (a pipeline's steady state allocates nothing).
    pub fn update(&mut self, stream: &Arc<CudaStream>, plan: &BatchPlan) -> Result<(), GpuError> {
        let descriptors = descriptors_of(plan);
        refill(
            stream,
            &descriptors,
            &mut self.descriptors,
            "uploading the descriptors",
        )?;
        let coefficients = &plan.coefficients;
        refill(
            stream,
            coefficients,
            &mut self.coefficients,
            "uploading the coefficients",
        )?;
        let intermediate = intermediate_len(plan)?;
        if self.intermediate.len() < intermediate {
            self.intermediate = stream
                .alloc_zeros::<u8>(intermediate)
                .map_err(GpuError::driver("allocating the intermediate"))?;
        }
        self.images = plan.descriptors.len() as u32;
        self.first_pass_blocks = plan.first_pass_blocks;
        self.last_pass_grid = plan.last_pass_grid();
        self.out_width = plan.out_width;
        self.out_height = plan.out_height;
        self.output_bytes = plan.output_bytes();
        Ok(())
    }
}

/// The descriptors to upload: one unused one for an empty batch, so the buffer is never empty.
fn descriptors_of(plan: &BatchPlan) -> Cow<'_, [ResizeDescriptor]> {
    if plan.descriptors.is_empty() {
        Cow::Owned(vec![ResizeDescriptor::default()])
    } else {
        Cow::Borrowed(&plan.descriptors)
    }
}

/// Bytes to allocate for the plan's intermediate (at least 1).
fn intermediate_len(plan: &BatchPlan) -> Result<usize, GpuError> {
    usize::try_from(plan.intermediate_bytes.max(1))
        .map_err(|_| GpuError::Plan(BatchError::TooLarge("intermediate bytes")))
}

/// Copies `data` into `slice`, reallocating it first when it is too small.
fn refill<T: DeviceRepr>(
    stream: &Arc<CudaStream>,
    data: &[T],
    slice: &mut CudaSlice<T>,
    context: &'static str,
) -> Result<(), GpuError> {
    if slice.len() < data.len() {
        *slice = stream.clone_htod(data).map_err(GpuError::driver(context))?;
        return Ok(());
    }
    stream
        .memcpy_htod(data, slice)
        .map_err(GpuError::driver(context))
}

impl BatchResizer {
    /// Compiles the kernels with NVRTC for the stream's device (`compute_XY` of its compute
    /// capability) and loads them.
    pub fn new(stream: &Arc<CudaStream>) -> Result<BatchResizer, GpuError> {
        let ctx = stream.context();
        let (major, minor) = ctx
            .compute_capability()
            .map_err(GpuError::driver("reading the compute capability"))?;
        let ptx = compile(major, minor)?;
        let module = ctx
            .load_module(ptx)
            .map_err(GpuError::driver("loading the compiled kernels"))?;
        let load = |name: &str| {
            module
                .load_function(name)
                .map_err(GpuError::driver("finding a kernel entry point"))
        };
        Ok(BatchResizer {
            first: load("gpufeed_resize_first")?,
            last: load("gpufeed_resize_last")?,
        })
    }

    /// The kernels of a module compiled from [`SOURCE`] (the device's module cache keeps it).
    pub fn from_module(module: &Arc<cudarc::driver::CudaModule>) -> Result<BatchResizer, GpuError> {
        let load = |name: &str| {
            module
                .load_function(name)
                .map_err(GpuError::driver("finding a kernel entry point"))
        };
        Ok(BatchResizer {
            first: load("gpufeed_resize_first")?,
            last: load("gpufeed_resize_last")?,
        })
    }

    /// Copies `plan`'s descriptors and coefficients to the device and allocates its
    /// intermediate, on `stream`.
    pub fn upload(
        &self,
        stream: &Arc<CudaStream>,
        plan: &BatchPlan,
    ) -> Result<DevicePlan, GpuError> {
        let descriptors = stream
            .clone_htod(&*descriptors_of(plan))
            .map_err(GpuError::driver("uploading the descriptors"))?;
        let coefficients = stream
            .clone_htod(&plan.coefficients)
            .map_err(GpuError::driver("uploading the coefficients"))?;
        let intermediate = stream
            .alloc_zeros::<u8>(intermediate_len(plan)?)
            .map_err(GpuError::driver("allocating the intermediate"))?;
        Ok(DevicePlan {
            descriptors,
            coefficients,
            intermediate,
            images: plan.descriptors.len() as u32,
            first_pass_blocks: plan.first_pass_blocks,
            last_pass_grid: plan.last_pass_grid(),
            out_width: plan.out_width,
            out_height: plan.out_height,
            output_bytes: plan.output_bytes(),
        })
    }

    /// Plans `jobs` into slots of `out_width` x `out_height`, uploads and launches: the whole
    /// batch resize in one call. See [`BatchResizer::launch`] for the safety contract.
    ///
    /// # Safety
    ///
    /// As for [`BatchResizer::launch`]: every job's source must be device memory of the stream's
    /// context holding the image it describes, alive and unchanged until the stream has run the
    /// kernels.
    pub unsafe fn resize(
        &self,
        stream: &Arc<CudaStream>,
        jobs: &[plan::ResizeJob],
        out_width: u32,
        out_height: u32,
        out: &mut CudaSlice<u8>,
    ) -> Result<DevicePlan, GpuError> {
        let plan = plan::plan_batch(jobs, out_width, out_height)?;
        let mut device = self.upload(stream, &plan)?;
        // SAFETY: the caller guarantees the sources, as this function's contract says.
        unsafe { self.launch(stream, &mut device, out) }?;
        Ok(device)
    }

    /// Launches both passes of `plan` on `stream`, writing every byte of every slot a job of the
    /// batch names in `out` (slot `s` at `s * out_height * out_width * 3`); other slots are left
    /// as they are.
    ///
    /// # Safety
    ///
    /// The kernels read the sources at the addresses the plan was made with, which cudarc cannot
    /// check: each must be device memory of the stream's context holding at least the rows and
    /// pitches its [`crate::SourceImage`] describes, alive and not written until the stream has
    /// run these kernels (same stream, or an event in between).
    pub unsafe fn launch(
        &self,
        stream: &Arc<CudaStream>,
        plan: &mut DevicePlan,
        out: &mut CudaSlice<u8>,
    ) -> Result<(), GpuError> {
        let len = out.len() as u64;
        let (address, _written) = out.device_ptr_mut(stream);
        // SAFETY: `address` is `out`'s start, `len` bytes, borrowed (and its write recorded on
        // `stream`) while the guard lives; the sources are the caller's promise.
        unsafe { self.launch_at(stream, plan, address, len) }
    }

    /// [`BatchResizer::launch`] into `out_len` bytes of device memory at `out`.
    ///
    /// # Safety
    ///
    /// As [`BatchResizer::launch`], and `[out, out + out_len)` must be device memory of the
    /// stream's context that nothing else uses until the stream has run these kernels.
    pub unsafe fn launch_at(
        &self,
        stream: &Arc<CudaStream>,
        plan: &mut DevicePlan,
        out: u64,
        out_len: u64,
    ) -> Result<(), GpuError> {
        if out_len < plan.output_bytes {
            return Err(GpuError::OutputTooSmall {
                needed: plan.output_bytes,
                actual: out_len,
            });
        }
        if plan.images == 0 {
            return Ok(());
        }
        if plan.first_pass_blocks > 0 {
            let config = LaunchConfig {
                grid_dim: (plan.first_pass_blocks, 1, 1),
                block_dim: (THREADS_PER_BLOCK, 1, 1),
                shared_mem_bytes: 0,
            };
            let mut builder = stream.launch_builder(&self.first);
            builder
                .arg(&plan.descriptors)
                .arg(&plan.images)
                .arg(&plan.coefficients)
                .arg(&mut plan.intermediate);
            // SAFETY: the arguments match gpufeed_resize_first's parameters in order
            // (descriptors, their count, coefficients, intermediate). The planner (plan_batch)
            // made every descriptor's coefficient offsets point inside `coefficients`, its
            // intermediate range inside `intermediate` (plan.intermediate_bytes), the grid the
            // prefix sum of the images' blocks with threads past an image's pixels returning
            // early, and the source rows and columns read those of its checked plans; the
            // sources themselves are the caller's promise (this function's contract).
            unsafe { builder.launch(config) }
                .map_err(GpuError::driver("launching the first pass"))?;
        }
        let (blocks_per_slot, images) = plan.last_pass_grid;
        let config = LaunchConfig {
            grid_dim: (blocks_per_slot, images, 1),
            block_dim: (THREADS_PER_BLOCK, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut builder = stream.launch_builder(&self.last);
        builder
            .arg(&plan.descriptors)
            .arg(&plan.coefficients)
            .arg(&plan.intermediate)
            .arg(&out)
            .arg(&plan.out_width)
            .arg(&plan.out_height);
        // SAFETY: the arguments match gpufeed_resize_last's parameters in order. The grid's y is
        // the descriptor count and each thread checks its pixel against the slot's size; every
        // slot a descriptor names lies inside `out` (checked above against plan.output_bytes);
        // coefficient offsets and intermediate ranges are in bounds by construction
        // (plan_batch), and the bounds only name intermediate pixels the first pass wrote
        // before it on this stream, or source pixels of the checked plans (the caller's promise
        // for the memory behind them).
        unsafe { builder.launch(config) }.map_err(GpuError::driver("launching the last pass"))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Compiles the kernels for a Hopper and an Ampere device wherever NVRTC can be loaded (no
    /// device needed), so a syntax error shows before the GPU machine.
    #[test]
    fn the_kernels_compile_with_nvrtc() {
        // SAFETY: `is_culib_present` only tries to dlopen NVRTC by its usual names and reports
        // whether that worked; it calls nothing inside it.
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            use std::io::Write as _;
            // Past the test harness's capture, so the skip shows.
            let _ = writeln!(
                std::io::stderr(),
                "skipped: the_kernels_compile_with_nvrtc: NVRTC not found"
            );
            return;
        }
        for (major, minor) in [(9, 0), (8, 0)] {
            let ptx =
                compile(major, minor).unwrap_or_else(|e| panic!("compute_{major}{minor}: {e}"));
            let text = ptx.to_src();
            assert!(
                text.contains("gpufeed_resize_first"),
                "compute_{major}{minor}"
            );
            assert!(
                text.contains("gpufeed_resize_last"),
                "compute_{major}{minor}"
            );
        }
    }
}
