//! One CUDA device as a pipeline uses it: the device's primary context, created once per process
//! and shared, the modules compiled for it, kept per context, and the pipeline's own stream.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{CudaContext, CudaModule, CudaSlice, CudaStream, DeviceRepr, DriverError};
use cudarc::nvrtc::{compile_ptx_with_opts, CompileError, CompileOptions, Ptx};

use super::{guarded, probe};
use crate::error::{CudaUnavailable, Error, Result};

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

/// A kernel source and the macros it is compiled with: the key of the module cache.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct KernelSource {
    /// File name under `kernels/`, for messages.
    pub name: &'static str,
    /// The CUDA C++ source.
    pub code: &'static str,
    /// `-D` definitions.
    pub defines: Vec<String>,
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
        let ctx = self.stream.context().clone();
        let (major, minor) = ctx
            .compute_capability()
            .map_err(|e| Error::cuda("reading the compute capability", e))?;
        let ptx = compile_ptx(source, major, minor)?;
        guarded("loading a compiled kernel", || ctx.load_module(ptx))
    }
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
