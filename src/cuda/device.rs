//! One CUDA device as a pipeline uses it: the device's primary context, created once per process
//! and shared, the modules compiled for it, kept per context, and the pipeline's own stream.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;

use cudarc::driver::{
    sys, CudaContext, CudaModule, CudaSlice, CudaStream, DeviceRepr, DriverError,
};
use cudarc::nvrtc::{compile_ptx_with_opts, CompileError, CompileOptions, Ptx};

use super::kernel_cache::{CacheKey, KernelCache, KernelSource, Toolchain};
use super::probe;
use crate::error::{guarded, CudaUnavailable, Error, Result};
use crate::Device;

/// The device's primary context, created once per process and kept: pipelines built one after
/// another (train and validation, one per epoch) then pay the context's creation (~0.3 s) once,
/// and nothing the driver keeps per context is set up again and again.
fn shared_context(ordinal: usize) -> Result<Arc<CudaContext>> {
    static CONTEXTS: OnceLock<Mutex<HashMap<usize, Arc<CudaContext>>>> = OnceLock::new();
    let mut contexts = CONTEXTS
        .get_or_init(|| Mutex::new(HashMap::new()))
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(context) = contexts.get(&ordinal) {
        return Ok(context.clone());
    }
    let context = guarded("creating the CUDA context", || CudaContext::new(ordinal))?;
    contexts.insert(ordinal, context.clone());
    Ok(context)
}

/// A CUDA device's context being made on a thread of its own ([`Device::open_early`]); dropping
/// it waits for the thread, so that no driver call is left under way.
#[must_use = "dropping it waits for the context"]
#[derive(Debug)]
pub struct DeviceOpening {
    thread: Option<JoinHandle<()>>,
}

impl Drop for DeviceOpening {
    fn drop(&mut self) {
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Device {
    /// Starts making this device's CUDA context on a thread of its own, so that a pipeline built
    /// on it later finds the context made: the driver's start and the context take about a
    /// quarter of a second, which a caller can spend listing its source (a large folder, a
    /// bucket). Keep the value until the pipeline is built. Nothing to do for the CPU; where
    /// CUDA cannot be used, nothing happens here and the pipeline's build says why.
    ///
    /// ```
    /// use gpufeed::{Device, Pipeline, Source};
    ///
    /// let device = Device::Cpu; // Device::Cuda(0) for the GPU
    /// let opening = device.open_early();
    /// let source = Source::directory("assets")?;
    /// let pipeline = Pipeline::builder().source(source).device(device).build()?;
    /// drop(opening);
    /// # Ok::<(), gpufeed::Error>(())
    /// ```
    pub fn open_early(self) -> DeviceOpening {
        let thread = match self {
            Device::Cuda(ordinal) => std::thread::Builder::new()
                .name("gpufeed-device-open".into())
                .spawn(move || {
                    if probe().is_ok_and(|info| ordinal < info.device_count) {
                        let _ = shared_context(ordinal);
                    }
                })
                .ok(),
            Device::Cpu => None,
        };
        DeviceOpening { thread }
    }
}

/// Copies `data` into `buffer` on `stream`, allocating the buffer first when there is none or it
/// is too small, so that a kernel's descriptors cost no allocation in the steady state.
pub(crate) fn upload_reusing<'b, T: DeviceRepr>(
    stream: &Arc<CudaStream>,
    data: &[T],
    buffer: &'b mut Option<CudaSlice<T>>,
) -> std::result::Result<&'b CudaSlice<T>, DriverError> {
    let filled = match buffer.take() {
        Some(mut d) if d.len() >= data.len() => {
            stream.memcpy_htod(data, &mut d)?;
            d
        }
        _ => stream.clone_htod(data)?,
    };
    Ok(buffer.insert(filled))
}

/// One CUDA device and the stream all uploads and kernels of one pipeline go to.
#[derive(Debug, Clone)]
pub(crate) struct Gpu {
    stream: Arc<CudaStream>,
    ordinal: usize,
}

impl Gpu {
    /// Opens device `ordinal` after [`probe`] found CUDA usable, with a new stream.
    pub fn open(ordinal: usize) -> Result<Gpu> {
        let info = probe()?;
        if ordinal >= info.device_count {
            return Err(CudaUnavailable::NoSuchDevice {
                ordinal,
                count: info.device_count,
            }
            .into());
        }
        let context = shared_context(ordinal)?;
        let stream = guarded("creating a stream", || context.new_stream())?;
        Ok(Gpu { stream, ordinal })
    }

    /// The stream of a [`Gpu`] opened elsewhere (a caller's own stream).
    pub fn from_stream(stream: &Arc<CudaStream>) -> Gpu {
        Gpu {
            ordinal: stream.context().ordinal(),
            stream: stream.clone(),
        }
    }

    /// The pipeline's stream.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Free and total device memory, in bytes.
    pub fn memory(&self) -> Result<(usize, usize)> {
        self.stream
            .context()
            .mem_get_info()
            .map_err(|e| Error::cuda("reading device memory", e))
    }

    /// Keeps at least `bytes` of the memory freed into the device's stream-ordered pool (where
    /// batches are allocated: `cuMemAllocAsync`) in the pool across synchronizations, instead of
    /// handing it back to the driver: a server that frees each response's tokens then takes the
    /// next response's from the pool, with no allocation from the driver. Raises the pool's
    /// release threshold, never lowers it; nothing to do without stream-ordered allocation.
    pub fn keep_pool_memory(&self, bytes: u64) -> Result<()> {
        let context = self.stream.context();
        if !context.has_async_alloc() {
            return Ok(());
        }
        let attribute = sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD;
        guarded("keeping device memory in the pool", || {
            context.bind_to_thread()?;
            let device = cudarc::driver::result::device::get(self.ordinal as i32)?;
            let mut pool = std::mem::MaybeUninit::<sys::CUmemoryPool>::uninit();
            // SAFETY: `pool` is a valid place for the handle; `device` is a device the driver
            // just named.
            unsafe { sys::cuDeviceGetMemPool(pool.as_mut_ptr(), device) }.result()?;
            // SAFETY: written by the successful call above.
            let pool = unsafe { pool.assume_init() };
            let mut current: u64 = 0;
            // SAFETY: the release threshold is a `cuuint64_t`, read into a `u64` that lives
            // across the call.
            unsafe {
                sys::cuMemPoolGetAttribute(pool, attribute, (&mut current as *mut u64).cast())
            }
            .result()?;
            if current >= bytes {
                return Ok(());
            }
            let mut value = bytes;
            // SAFETY: as above, a `u64` the driver reads during the call.
            unsafe { sys::cuMemPoolSetAttribute(pool, attribute, (&mut value as *mut u64).cast()) }
                .result()
        })
    }

    /// Device name and compute capability, for reports.
    pub fn describe(&self) -> String {
        let ctx = self.stream.context();
        let name = ctx.name().unwrap_or_else(|_| "CUDA device".into());
        match ctx.compute_capability() {
            Ok((major, minor)) => format!("{name} (sm_{major}{minor})"),
            Err(_) => name,
        }
    }

    /// `source` compiled with NVRTC for this device and loaded: compiled once per device and
    /// set of definitions in a process, then taken from the cache.
    pub fn module(&self, source: &KernelSource) -> Result<Arc<CudaModule>> {
        type Cache = HashMap<(usize, KernelSource), Arc<CudaModule>>;
        static MODULES: OnceLock<Mutex<Cache>> = OnceLock::new();
        let key = (self.ordinal, source.clone());
        let cache = MODULES.get_or_init(|| Mutex::new(HashMap::new()));
        if let Some(module) = cache
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .get(&key)
        {
            return Ok(module.clone());
        }
        // Compiled outside the lock: two pipelines racing compile twice, harmlessly.
        let module = self.compile(source)?;
        cache
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .insert(key, module.clone());
        Ok(module)
    }

    fn compile(&self, source: &KernelSource) -> Result<Arc<CudaModule>> {
        static DISK: OnceLock<KernelCache> = OnceLock::new();
        let disk = DISK.get_or_init(KernelCache::from_environment);
        compile_through(self.stream.context(), source, disk).map(|(module, _)| module)
    }
}

/// Where a module came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Compiled {
    /// NVRTC compiled it (and it was kept in the disk cache, if there is one).
    ByNvrtc,
    /// The disk cache had it.
    FromDisk,
}

/// `source` for `ctx`'s device: from `disk` when it holds it, else compiled by NVRTC and kept
/// there.
pub(crate) fn compile_through(
    ctx: &Arc<CudaContext>,
    source: &KernelSource,
    disk: &KernelCache,
) -> Result<(Arc<CudaModule>, Compiled)> {
    let toolchain = toolchain(ctx)?;
    let key = CacheKey::new(source, toolchain);
    if let Some(ptx) = disk.load(&key) {
        // PTX the driver refuses (another driver's, say) is compiled afresh below.
        if let Ok(module) = guarded("loading a cached kernel", || {
            ctx.load_module(Ptx::from_src(ptx))
        }) {
            return Ok((module, Compiled::FromDisk));
        }
    }
    let (major, minor) = toolchain.compute;
    let ptx = compile_ptx(source, major, minor)?.to_src();
    // The cache is an optimisation: a folder it cannot write to leaves every kernel compiled
    // afresh, as without it.
    let _ = disk.store(&key, &ptx);
    let module = guarded("loading a compiled kernel", || {
        ctx.load_module(Ptx::from_src(ptx))
    })?;
    Ok((module, Compiled::ByNvrtc))
}

/// The device's compute capability and the versions of NVRTC and the driver.
fn toolchain(ctx: &Arc<CudaContext>) -> Result<Toolchain> {
    let compute = ctx
        .compute_capability()
        .map_err(|e| Error::cuda("reading the compute capability", e))?;
    let driver = guarded("reading the driver's version", || {
        let mut version = 0;
        // SAFETY: the driver writes one int through the pointer, which outlives the call.
        unsafe { sys::cuDriverGetVersion(&mut version) }.result()?;
        Ok(version)
    })?;
    let nvrtc = std::panic::catch_unwind(|| {
        let (mut major, mut minor) = (0, 0);
        // SAFETY: NVRTC writes one int through each pointer, which outlive the call.
        let status = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
        (status == cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS).then_some((major, minor))
    })
    .ok()
    .flatten()
    .ok_or(CudaUnavailable::Broken {
        context: "reading NVRTC's version",
        message: "NVRTC did not say its version".into(),
    })?;
    Ok(Toolchain {
        compute,
        nvrtc,
        driver,
    })
}

/// `source` compiled by NVRTC to PTX for compute capability `major.minor`
/// (`--gpu-architecture=compute_XY`): the crate's one call of NVRTC. Needs NVRTC, no device.
pub(crate) fn compile_ptx(source: &KernelSource, major: i32, minor: i32) -> Result<Ptx> {
    let mut flags = vec![format!("--gpu-architecture=compute_{major}{minor}")];
    flags.extend(source.defines.iter().map(|d| format!("-D{d}")));
    let options = CompileOptions {
        options: flags,
        name: Some(source.name.into()),
        ..Default::default()
    };
    std::panic::catch_unwind(|| compile_ptx_with_opts(source.code, options))
        .map_err(|panic| CudaUnavailable::Broken {
            context: "calling NVRTC",
            message: crate::error::panic_message(panic.as_ref()),
        })?
        .map_err(|e| Error::KernelCompile {
            kernel: source.name,
            log: match e {
                CompileError::CompileError { nvrtc, log, .. } => {
                    format!("{nvrtc:?}: {}", log.to_string_lossy())
                }
                other => format!("{other:?}"),
            },
        })
}
