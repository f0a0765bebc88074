//! Where and how a pipeline runs: the device, the CPU threads, the prefetch depth.

use std::fmt;
use std::str::FromStr;

use super::ParseOptionError;
use crate::error::{Error, Result};

/// Where the output tensor lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Device {
    /// The CUDA device with this ordinal: u8 upload and the NVRTC kernel.
    Cuda(usize),
    /// Host memory: the same CPU stage, normalized on the CPU. Works anywhere.
    Cpu,
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cuda(ordinal) => write!(f, "cuda:{ordinal}"),
            Device::Cpu => f.write_str("cpu"),
        }
    }
}

impl FromStr for Device {
    type Err = ParseOptionError;

    /// `cpu`, `cuda` (device 0) or `cuda:N`, as PyTorch writes devices.
    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        let s = s.trim();
        let fail = || ParseOptionError {
            what: "device",
            given: s.to_string(),
            expected: "cpu, cuda, cuda:N".to_string(),
        };
        if s.eq_ignore_ascii_case("cpu") {
            return Ok(Device::Cpu);
        }
        if s.eq_ignore_ascii_case("cuda") {
            return Ok(Device::Cuda(0));
        }
        let (prefix, ordinal) = s.split_once(':').ok_or_else(fail)?;
        if !prefix.eq_ignore_ascii_case("cuda") {
            return Err(fail());
        }
        ordinal.parse().map(Device::Cuda).map_err(|_| fail())
    }
}

/// Where and how the pipeline runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct RuntimeOptions {
    /// Where the output lives (default `Device::Cuda(0)`).
    pub device: Device,
    /// Threads of the CPU stage (default 0: one per core, less the GPU decode lane's
    /// submitting threads when hybrid decoding runs).
    pub threads: usize,
    /// Batches prepared ahead of the consumer (default 2). One of them waits in the prefetch
    /// thread until the next is made (so that images skipped at the end of an epoch are listed
    /// on its last batch), so a depth of 1 holds two as well.
    pub prefetch: usize,
    /// With a CUDA [`RuntimeOptions::device`] that cannot be used for want of the driver,
    /// NVRTC or the device (a [`crate::CudaUnavailable`] error), run on the CPU instead of
    /// failing: [`crate::Pipeline::cpu_fallback`] then says why (default off). The CPU threads
    /// start before the device is looked for, so the driver's start (about 0.1 s) overlaps their
    /// work instead of coming before it.
    pub cpu_fallback: bool,
}

impl Default for RuntimeOptions {
    fn default() -> Self {
        RuntimeOptions {
            device: Device::Cuda(0),
            threads: 0,
            prefetch: 2,
            cpu_fallback: false,
        }
    }
}

/// The most batches a pipeline prepares ahead of its consumer.
pub const MAX_PREFETCH: usize = 1024;

/// The most CPU threads a pipeline starts: eight per core, and at least 64.
pub fn max_threads() -> usize {
    std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .saturating_mul(8)
        .max(64)
}

impl RuntimeOptions {
    /// Sets [`RuntimeOptions::device`].
    pub fn device(mut self, device: Device) -> Self {
        self.device = device;
        self
    }

    /// Sets [`RuntimeOptions::cpu_fallback`].
    pub fn cpu_fallback(mut self, fall_back: bool) -> Self {
        self.cpu_fallback = fall_back;
        self
    }

    /// Sets [`RuntimeOptions::threads`].
    pub fn threads(mut self, threads: usize) -> Self {
        self.threads = threads;
        self
    }

    /// Sets [`RuntimeOptions::prefetch`].
    pub fn prefetch(mut self, depth: usize) -> Self {
        self.prefetch = depth;
        self
    }

    pub(super) fn validate(&self) -> Result<()> {
        if self.prefetch == 0 || self.prefetch > MAX_PREFETCH {
            return Err(Error::invalid(
                "prefetch",
                format!("{} batches: must be 1 to {MAX_PREFETCH}", self.prefetch),
            ));
        }
        let max = max_threads();
        if self.threads > max {
            return Err(Error::invalid(
                "threads",
                format!(
                    "{} threads is over the limit of {max} (eight per core, at least 64); 0 \
                     means one per core",
                    self.threads
                ),
            ));
        }
        Ok(())
    }
}
