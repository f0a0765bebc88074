//! Where a pipeline's time goes: each stage's time, summed over the threads that ran it, and how
//! many times it ran. The stages record into one [`Stopwatch`] shared by the pipeline; the
//! consumer reads a [`Profile`] of it at any time ([`crate::Pipeline::profile`]).

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A stage of the pipeline whose time is counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Stage {
    /// The CPU lane reading an image's file (header, then bytes).
    CpuRead,
    /// The CPU lane decoding an image.
    CpuDecode,
    /// The CPU lane resizing and cropping an image.
    CpuResize,
    /// Opening the GPU decode lane (its decoders, pools, kernels and ring).
    GpuOpen,
    /// The GPU lane's preparing threads reading, screening and planning an image.
    GpuPrepare,
    /// The GPU lane's coefficient threads entropy-decoding and packing a progressive JPEG for
    /// its assisted path.
    GpuCoefficients,
    /// The GPU lane's submitting threads on a call: the engines' decode, the colour conversion
    /// and the resize, as the host sees them.
    GpuCall,
    /// Within [`Stage::GpuCall`], a call's decode: the engines' decode, or the assisted path's
    /// queued decode and the wait for its entropy decoding's verdicts.
    GpuDecode,
    /// Within [`Stage::GpuCall`], a call's colour conversion (the engines') and resize planned
    /// and queued.
    GpuResize,
    /// The batch waiting for the CPU lane's images.
    WaitCpu,
    /// The batch waiting for the GPU lane's images.
    WaitGpu,
    /// Copying the CPU lane's images into the staging, counted by image: those it prepared
    /// into ordinary memory, while the device opened or every page-locked image of its own was
    /// in use (the others upload from where it wrote them).
    StagingCopy,
    /// Queuing a batch's upload, the GPU lane's gather and the normalize kernel (or, on the
    /// CPU device, handing the normalized batch over).
    Finish,
    /// The prefetch thread waiting for room: every batch ahead is made and not taken yet.
    WaitConsumer,
    /// The consumer waiting in `next_batch` for a batch.
    WaitBatch,
}

impl Stage {
    /// Every stage, in the order of the data flow.
    pub const ALL: [Stage; 15] = [
        Stage::CpuRead,
        Stage::CpuDecode,
        Stage::CpuResize,
        Stage::GpuOpen,
        Stage::GpuPrepare,
        Stage::GpuCoefficients,
        Stage::GpuCall,
        Stage::GpuDecode,
        Stage::GpuResize,
        Stage::WaitCpu,
        Stage::WaitGpu,
        Stage::StagingCopy,
        Stage::Finish,
        Stage::WaitConsumer,
        Stage::WaitBatch,
    ];

    /// The stage's name in reports (the JSON summary's keys).
    pub fn name(self) -> &'static str {
        match self {
            Stage::CpuRead => "cpu_read",
            Stage::CpuDecode => "cpu_decode",
            Stage::CpuResize => "cpu_resize",
            Stage::GpuOpen => "gpu_open",
            Stage::GpuPrepare => "gpu_prepare",
            Stage::GpuCoefficients => "gpu_coefficients",
            Stage::GpuCall => "gpu_call",
            Stage::GpuDecode => "gpu_call_decode",
            Stage::GpuResize => "gpu_call_resize",
            Stage::WaitCpu => "wait_cpu_lane",
            Stage::WaitGpu => "wait_gpu_lane",
            Stage::StagingCopy => "staging_copy",
            Stage::Finish => "upload_and_kernel",
            Stage::WaitConsumer => "wait_consumer",
            Stage::WaitBatch => "consumer_wait",
        }
    }

    fn slot(self) -> usize {
        Stage::ALL.iter().position(|&s| s == self).unwrap_or(0)
    }
}

/// The counters the stages add their times to.
#[derive(Debug, Default)]
pub(crate) struct Stopwatch {
    nanos: [AtomicU64; Stage::ALL.len()],
    counts: [AtomicU64; Stage::ALL.len()],
}

impl Stopwatch {
    /// Adds `elapsed` to `stage`, once.
    pub fn add(&self, stage: Stage, elapsed: Duration) {
        self.add_many(stage, elapsed, 1);
    }

    /// Adds `elapsed` to `stage` for `count` pieces of work.
    pub fn add_many(&self, stage: Stage, elapsed: Duration, count: u64) {
        let nanos = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        self.nanos[stage.slot()].fetch_add(nanos, Ordering::Relaxed);
        self.counts[stage.slot()].fetch_add(count, Ordering::Relaxed);
    }

    /// Runs `work`, adding its time to `stage`.
    pub fn time<T>(&self, stage: Stage, work: impl FnOnce() -> T) -> T {
        let started = Instant::now();
        let result = work();
        self.add(stage, started.elapsed());
        result
    }

    /// The time `stage` has taken so far, summed over threads.
    pub fn total(&self, stage: Stage) -> Duration {
        Duration::from_nanos(self.nanos[stage.slot()].load(Ordering::Relaxed))
    }

    /// How many times `stage` has run so far.
    pub fn count(&self, stage: Stage) -> u64 {
        self.counts[stage.slot()].load(Ordering::Relaxed)
    }

    /// What the counters hold now.
    pub fn profile(&self) -> Profile {
        Profile {
            stages: Stage::ALL
                .iter()
                .map(|&stage| StageTime {
                    stage,
                    seconds: self.total(stage).as_secs_f64(),
                    count: self.count(stage),
                })
                .collect(),
        }
    }
}

/// One stage's time: summed over the threads that ran it (so it can exceed the wall time), and
/// how many times it ran (images, calls or batches).
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct StageTime {
    /// The stage.
    pub stage: Stage,
    /// Seconds spent in it, summed over threads.
    pub seconds: f64,
    /// Times it ran.
    pub count: u64,
}

/// Where a pipeline's time went since it was built: every stage's time and count.
#[derive(Debug, Clone, PartialEq)]
pub struct Profile {
    /// Every stage, in the order of the data flow.
    pub stages: Vec<StageTime>,
}

impl Profile {
    /// The time and count of `stage`.
    pub fn get(&self, stage: Stage) -> StageTime {
        self.stages
            .iter()
            .copied()
            .find(|s| s.stage == stage)
            .unwrap_or(StageTime {
                stage,
                seconds: 0.0,
                count: 0,
            })
    }
}

impl fmt::Display for Profile {
    /// A table: stage, seconds (summed over threads), times run, milliseconds each.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{:<20} {:>10} {:>10} {:>10}",
            "stage", "seconds", "times", "ms each"
        )?;
        for s in self.stages.iter().filter(|s| s.count > 0) {
            writeln!(
                f,
                "{:<20} {:>10.3} {:>10} {:>10.3}",
                s.stage.name(),
                s.seconds,
                s.count,
                1e3 * s.seconds / s.count as f64
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stages_add_up_and_show_in_the_table() {
        let watch = Stopwatch::default();
        watch.add(Stage::CpuDecode, Duration::from_millis(3));
        watch.add(Stage::CpuDecode, Duration::from_millis(5));
        let answer = watch.time(Stage::Finish, || 42);
        assert_eq!(answer, 42);
        let profile = watch.profile();
        let decode = profile.get(Stage::CpuDecode);
        assert_eq!(decode.count, 2);
        assert!((decode.seconds - 0.008).abs() < 1e-9);
        assert_eq!(profile.get(Stage::Finish).count, 1);
        assert_eq!(profile.get(Stage::GpuCall).count, 0);
        let table = profile.to_string();
        assert!(table.contains("cpu_decode") && table.contains("upload_and_kernel"));
        assert!(
            !table.contains("gpu_call"),
            "stages that never ran are left out"
        );
        let names: std::collections::HashSet<_> = Stage::ALL.iter().map(|s| s.name()).collect();
        assert_eq!(names.len(), Stage::ALL.len());
    }
}
