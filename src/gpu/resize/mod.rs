//! `kernels/resize.cu`: the batched Pillow resize, compiled through the device's module cache
//! ([`crate::cuda::Gpu::module`]) and launched over a planned batch ([`plan`]): the first pass
//! (skipped when no image resamples both axes), then the last pass that writes every byte of
//! every slot a job names.

use std::borrow::Cow;
use std::sync::Arc;

use cudarc::driver::{
    CudaFunction, CudaSlice, CudaStream, DeviceRepr, DriverError, LaunchConfig, PushKernelArg,
};
use thiserror::Error;

use crate::cuda::KernelSource;

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
pub enum ResizeError {
    /// A CUDA driver call failed.
    #[error("CUDA failed {context}: {source}")]
    Driver {
        /// What was being done.
        context: &'static str,
        /// The driver's error.
        #[source]
        source: DriverError,
    },
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

impl ResizeError {
    fn driver(context: &'static str) -> impl FnOnce(DriverError) -> ResizeError {
        move |source| ResizeError::Driver { context, source }
    }
}

/// The kernel source as the module cache compiles it.
pub(crate) fn kernel_source() -> KernelSource {
    KernelSource {
        name: "resize.cu",
        code: SOURCE,
        defines: Vec::new(),
    }
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
    slot_len: u64,
    output_bytes: u64,
}

impl DevicePlan {
    /// Replaces the batch with `plan`, on `stream`, reusing the device buffers where they are
    /// large enough (a pipeline's steady state allocates nothing).
    pub fn update(
        &mut self,
        stream: &Arc<CudaStream>,
        plan: &BatchPlan,
    ) -> Result<(), ResizeError> {
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
                .map_err(ResizeError::driver("allocating the intermediate"))?;
        }
        self.images = plan.descriptors.len() as u32;
        self.first_pass_blocks = plan.first_pass_blocks;
        self.last_pass_grid = plan.last_pass_grid();
        self.slot_len = plan.slot_len;
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
fn intermediate_len(plan: &BatchPlan) -> Result<usize, ResizeError> {
    usize::try_from(plan.intermediate_bytes.max(1))
        .map_err(|_| ResizeError::Plan(BatchError::TooLarge("intermediate bytes")))
}

/// Copies `data` into `slice`, reallocating it first when it is too small.
fn refill<T: DeviceRepr>(
    stream: &Arc<CudaStream>,
    data: &[T],
    slice: &mut CudaSlice<T>,
    context: &'static str,
) -> Result<(), ResizeError> {
    if slice.len() < data.len() {
        *slice = stream
            .clone_htod(data)
            .map_err(ResizeError::driver(context))?;
        return Ok(());
    }
    stream
        .memcpy_htod(data, slice)
        .map_err(ResizeError::driver(context))
}

impl BatchResizer {
    /// The kernels of a module compiled from [`SOURCE`] (the device's module cache keeps it).
    pub fn from_module(
        module: &Arc<cudarc::driver::CudaModule>,
    ) -> Result<BatchResizer, ResizeError> {
        let load = |name: &str| {
            module
                .load_function(name)
                .map_err(ResizeError::driver("finding a kernel entry point"))
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
    ) -> Result<DevicePlan, ResizeError> {
        let descriptors = stream
            .clone_htod(&*descriptors_of(plan))
            .map_err(ResizeError::driver("uploading the descriptors"))?;
        let coefficients = stream
            .clone_htod(&plan.coefficients)
            .map_err(ResizeError::driver("uploading the coefficients"))?;
        let intermediate = stream
            .alloc_zeros::<u8>(intermediate_len(plan)?)
            .map_err(ResizeError::driver("allocating the intermediate"))?;
        Ok(DevicePlan {
            descriptors,
            coefficients,
            intermediate,
            images: plan.descriptors.len() as u32,
            first_pass_blocks: plan.first_pass_blocks,
            last_pass_grid: plan.last_pass_grid(),
            slot_len: plan.slot_len,
            output_bytes: plan.output_bytes(),
        })
    }

    /// Launches both passes of `plan` on `stream` (for the tests: the lane launches at an address,
    /// [`BatchResizer::launch_at`]), writing every byte of every slot a job of the
    /// batch names in `out` (slot `s` at `s * plan.slot_len`); other slots are left
    /// as they are.
    ///
    /// # Safety
    ///
    /// The kernels read the sources at the addresses the plan was made with, which cudarc cannot
    /// check: each must be device memory of the stream's context holding at least the rows and
    /// pitches its [`SourceImage`](plan::SourceImage) describes, alive and not written until the
    /// stream has run these kernels (same stream, or an event in between).
    #[cfg(test)]
    pub unsafe fn launch(
        &self,
        stream: &Arc<CudaStream>,
        plan: &mut DevicePlan,
        out: &mut CudaSlice<u8>,
    ) -> Result<(), ResizeError> {
        use cudarc::driver::DevicePtrMut;
        let len = out.len() as u64;
        let (address, _written) = out.device_ptr_mut(stream);
        // SAFETY: `address` is `out`'s start, `len` bytes, borrowed (and its write recorded on
        // `stream`) while the guard lives; the sources are the caller's promise.
        unsafe { self.launch_at(stream, plan, address, len) }
    }

    /// Launches both passes of `plan` on `stream` into `out_len` bytes of device memory at `out`,
    /// writing every byte of every slot a job of the batch names (slot `s` at
    /// `s * plan.slot_len` from `out`); other slots are left as they are.
    ///
    /// # Safety
    ///
    /// The kernels read the sources at the addresses the plan was made with, which cudarc cannot
    /// check: each must be device memory of the stream's context holding at least the rows and
    /// pitches its [`SourceImage`](plan::SourceImage) describes, alive and not written until the
    /// stream has run these kernels (same stream, or an event in between). `[out, out + out_len)`
    /// must be device memory of the stream's context that nothing else uses until then too.
    pub unsafe fn launch_at(
        &self,
        stream: &Arc<CudaStream>,
        plan: &mut DevicePlan,
        out: u64,
        out_len: u64,
    ) -> Result<(), ResizeError> {
        if out_len < plan.output_bytes {
            return Err(ResizeError::OutputTooSmall {
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
                .map_err(ResizeError::driver("launching the first pass"))?;
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
            .arg(&plan.slot_len);
        // SAFETY: the arguments match gpufeed_resize_last's parameters in order. The grid's y is
        // the descriptor count and each thread checks its pixel against its image's size, whose
        // bytes the planner checked fit a slot; every slot a descriptor names lies inside `out`
        // (checked above against plan.output_bytes);
        // coefficient offsets and intermediate ranges are in bounds by construction
        // (plan_batch), and the bounds only name intermediate pixels the first pass wrote
        // before it on this stream, or source pixels of the checked plans (the caller's promise
        // for the memory behind them).
        unsafe { builder.launch(config) }
            .map_err(ResizeError::driver("launching the last pass"))?;
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
            let ptx = crate::cuda::compile_ptx(&kernel_source(), major, minor)
                .unwrap_or_else(|e| panic!("compute_{major}{minor}: {e}"));
            let text = ptx.to_src();
            for kernel in [
                "gpufeed_resize_first",
                "gpufeed_resize_last",
                "gpufeed_gather",
            ] {
                assert!(text.contains(kernel), "{kernel} for compute_{major}{minor}");
            }
        }
    }
}
