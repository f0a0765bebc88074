//! The decode lanes of a pipeline as one value: the CPU lane alone, batch by batch (batches for the
//! CPU), or the CPU lane working ahead of the batches, with the GPU decode lane beside it when
//! asked for (hybrid decoding; batches for a GPU). The decode choice ([`DecodeOptions::lanes`]) is
//! read here, where the lanes are built, and nowhere else; the worker asks the lanes for a batch's
//! images and the output stage never learns who decoded them.
//!
//! [`DecodeOptions::lanes`]: crate::DecodeOptions::lanes

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;

use super::balance::Balance;
use super::hybrid::{
    opening_stopped, Epoch, GpuOpening, HybridFilled, HybridLanes, Opening, Unstaged,
    UnstagedWrites, Waits,
};
use crate::batch::DecodedBy;
use crate::cpu::{BatchRequest, CpuAhead, CpuLane, LaneCore, Staging, ThreadPriority};
use crate::cuda::Gpu;
use crate::error::{Error, Result};
use crate::geometry::Geometry;
use crate::gpu::{lookahead, GpuLane, GpuLaneConfig};
use crate::memory::MemoryBudget;
use crate::options::{Decode, Device, Options};
use crate::order::EpochOrder;
use crate::profile::{Stage, Stopwatch};
use crate::source::Source;

/// Cores the CPU lane leaves to the GPU lane's host threads (its submitting threads wait on the
/// engines most of the time) and the thread that hands the batches out, when the thread count is
/// left to the pipeline.
const CORES_FOR_THE_GPU_LANE: usize = 2;

/// Images an epoch needs for [`Decode::Auto`] to open the GPU lane: opening it takes a second or
/// two of a core and about a gigabyte of device memory, which fewer images than this (well under
/// a second of the CPU lane's work on 16 cores) do not repay, unless they are large
/// ([`AUTO_MIN_BYTES`]).
pub(crate) const AUTO_MIN_IMAGES: usize = 1024;

/// Encoded bytes an epoch of fewer than [`AUTO_MIN_IMAGES`] images needs for [`Decode::Auto`] to
/// open the GPU lane: about 500 Mpx of camera photos, two seconds of the CPU lane's work on 16
/// cores.
pub(crate) const AUTO_MIN_BYTES: u64 = 100 << 20;

/// Seconds of one core the CPU lane spends on an image besides its bytes, and on each encoded
/// byte: measured on the H200 machine (16 cores), 1.2 ms an image for 42 KB make-corpus files
/// and 35 ms for 2.5 MB camera photos.
const CPU_SECONDS_PER_IMAGE: f64 = 0.6e-3;
const CPU_SECONDS_PER_BYTE: f64 = 14e-9;

/// Seconds of one core the CPU lane spends on `images` images of `bytes` encoded bytes, about.
fn cpu_seconds(images: u64, bytes: u64) -> f64 {
    images as f64 * CPU_SECONDS_PER_IMAGE + bytes as f64 * CPU_SECONDS_PER_BYTE
}

/// Seconds the GPU lane's JPEG engines take to open, about (their decoders: 1.3-2.5 s measured).
const ENGINES_OPEN_SECONDS: f64 = 2.0;

/// A run the CPU lane alone would finish in fewer seconds opens the lane's assisted path alone:
/// the engines open beside the running batches, holding a core and the driver meanwhile, and
/// then need about as long again to repay that. Measured on the H100 machine: four epochs of
/// 8,192 make-corpus files (2.4 s of the CPU threads by the estimate, a 1.3 s run) ended before
/// the engines joined, and the assisted path alone gave 1.04x the run that opened them.
const ENGINES_REPAY_SECONDS: f64 = 2.0 * ENGINES_OPEN_SECONDS;

/// Seconds the GPU lane takes to begin with its assisted path, about (the CUDA device's
/// opening, then its first decoder set's buffers, 20-80 ms on the H200 machine, and its first
/// calls): a run the CPU lane finishes sooner stays on it.
const ASSISTED_OPEN_SECONDS: f64 = 0.3;

/// Mean encoded bytes of an epoch's files from which they count as large: about a megapixel
/// photo's at quality 75-90, the files the assisted path takes once the engines are open
/// (ImageNet's average about 110 KB). For large files the GPU lane opens all its assisted path's
/// threads even when it opens whole (a given share).
const LARGE_FILES_MIN_MEAN_BYTES: u64 = 192 << 10;

/// While the pipeline's device opens, the CPU lane works this fraction of the decode memory's
/// bytes of finished images into the first epoch (512 MiB by default): 3,566 images of 224 x 224,
/// about 0.3 s of 16 cores on ImageNet-sized files.
const BRING_UP_MEMORY_SHARE: u64 = 8;

/// What automatic decoding opens for a run.
#[derive(Debug, PartialEq)]
enum AutoLanes {
    /// The CPU lane alone, and why.
    Cpu(String),
    /// The GPU lane's assisted path beside the CPU lane, without the JPEG engines (the lane's
    /// description says why).
    AssistedAlone,
    /// The whole GPU lane beside the CPU lane.
    Whole,
}

/// What automatic decoding opens for epochs of `images` images of `epoch_bytes` encoded bytes,
/// `planned` of them if known, on `cores` cores, `assisted` saying whether the GPU lane has its
/// assisted path.
fn auto_lanes(
    images: usize,
    mut epoch_bytes: impl FnMut() -> u64,
    planned: Option<u64>,
    cores: usize,
    assisted: bool,
) -> AutoLanes {
    if images < AUTO_MIN_IMAGES && epoch_bytes() < AUTO_MIN_BYTES {
        return AutoLanes::Cpu(format!(
            "an epoch of {images} images does not repay opening the GPU decode lane (it takes \
             {AUTO_MIN_IMAGES}, or {} MB)",
            AUTO_MIN_BYTES >> 20
        ));
    }
    let Some(run) = PlannedRun::new(images, epoch_bytes, planned, cores) else {
        return AutoLanes::Whole;
    };
    let cpu_seconds = run.cpu_seconds;
    let opens_in = match assisted {
        true => ASSISTED_OPEN_SECONDS,
        false => ENGINES_OPEN_SECONDS,
    };
    if cpu_seconds < opens_in {
        return AutoLanes::Cpu(format!(
            "{run} ends before the GPU decode lane could open (about {opens_in} s)"
        ));
    }
    match run.repays_the_engines() {
        true => AutoLanes::Whole,
        false => AutoLanes::AssistedAlone,
    }
}

/// Whether hybrid decoding as asked leaves the JPEG engines closed: the run, `planned`, is too
/// short to repay their opening and the assisted path (`assisted`) stands in for them. (Automatic
/// decoding decides this in [`auto_lanes`].)
fn hybrid_short_run(assisted: bool, planned: Option<PlannedRun>) -> bool {
    assisted && planned.is_some_and(|run| !run.repays_the_engines())
}

/// A run of a planned number of epochs, and the CPU threads' time it takes, about.
struct PlannedRun {
    epochs: u64,
    bytes: u64,
    /// Seconds the CPU lane's threads alone would take.
    cpu_seconds: f64,
}

impl PlannedRun {
    /// The run of `planned` epochs (`None` if not planned) of `images` images of `epoch_bytes`
    /// encoded bytes, on `cores` cores.
    fn new(
        images: usize,
        mut epoch_bytes: impl FnMut() -> u64,
        planned: Option<u64>,
        cores: usize,
    ) -> Option<PlannedRun> {
        let epochs = planned?;
        let bytes = epoch_bytes().saturating_mul(epochs);
        let run_images = (images as u64).saturating_mul(epochs);
        Some(PlannedRun {
            epochs,
            bytes,
            cpu_seconds: cpu_seconds(run_images, bytes) / cores.max(1) as f64,
        })
    }

    /// Whether the run lasts long enough to repay opening the JPEG engines beside the batches.
    fn repays_the_engines(&self) -> bool {
        self.cpu_seconds >= ENGINES_REPAY_SECONDS
    }
}

impl std::fmt::Display for PlannedRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "a run of {} epoch{} ({} MB, about {:.1} s of the CPU threads)",
            self.epochs,
            if self.epochs == 1 { "" } else { "s" },
            self.bytes >> 20,
            self.cpu_seconds
        )
    }
}

/// The lanes a pipeline decodes with.
pub(crate) enum Lanes {
    /// The CPU lane alone, batch by batch; with the reason when another choice fell back to it.
    Cpu(CpuLane, DecodeWhy),
    /// The CPU lane working ahead of the batches (so that a batch's slowest images do not hold
    /// the next batch back: large photos in small batches), and the GPU decode lane beside it
    /// when asked for.
    Hybrid(Box<HybridLanes>, DecodeWhy),
}

/// Why the lanes are what they are, in words.
#[derive(Debug, Clone)]
pub(crate) struct DecodeWhy(String);

impl Lanes {
    /// The GPU lane's configuration when `options` may run it: hybrid or automatic decoding on
    /// a CUDA device. What depends on the epoch, the cores and the CPU lane (`large_files`,
    /// `short_run`, `coefficient_threads`, `decode_memory`) is set when the lanes open.
    fn gpu_config(options: &Options, stopwatch: &Arc<Stopwatch>) -> Option<GpuLaneConfig> {
        let wanted = matches!(options.decode.lanes, Decode::Hybrid | Decode::Auto);
        (wanted && options.runtime.device != Device::Cpu).then(|| GpuLaneConfig {
            stopwatch: stopwatch.clone(),
            geometry: Geometry::new(&options.resize),
            max_pixels: options.decode.max_pixels,
            batch_size: options.batching.batch_size,
            max_file_bytes: options.decode.max_file_bytes,
            exif_orientation: options.decode.exif_orientation,
            assisted_share: options.decode.assisted_share,
            large_files: false,
            small_files_assisted: options.decode.gpu_share.is_none_or(|share| share >= 1.0),
            short_run: false,
            coefficient_threads: 1,
            decode_memory: Arc::new(MemoryBudget::new(options.decode.memory_limit)),
        })
    }

    /// Device memory the lanes `options` ask for may take (the GPU lane's ring and buffers),
    /// for the output stage's check of what fits before anything is allocated.
    pub fn device_bytes(options: &Options) -> u128 {
        Lanes::gpu_config(options, &Arc::default())
            .map_or(0, |config| GpuLane::device_bytes(&config))
    }

    /// Starts the lanes `options` ask for, for epochs of `images`, as far as they go without
    /// the pipeline's device: [`LanesStarting::open`] finishes them once it is open. For a CUDA
    /// device the CPU lane works ahead of the batches, its threads started here; with hybrid or
    /// automatic decoding the GPU lane opens on a thread of its own once the device is open,
    /// joining the batches when ready; with a given share it opens before the first batch
    /// instead, so that every image goes to the same lane on every run. Automatic decoding
    /// opens it only for epochs of at least [`AUTO_MIN_IMAGES`] images or [`AUTO_MIN_BYTES`]
    /// (`epoch_bytes` estimates an epoch's encoded bytes).
    pub fn start(
        options: &Options,
        images: usize,
        epoch_bytes: impl FnOnce() -> u64,
        stopwatch: &Arc<Stopwatch>,
    ) -> Result<LanesStarting> {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        // Sampled once, when first needed.
        let (mut sample, mut sampled) = (Some(epoch_bytes), None);
        let mut epoch_bytes = || *sampled.get_or_insert_with(|| sample.take().map_or(0, |f| f()));
        let threads = match options.runtime.threads {
            0 => cores,
            given => given,
        };
        let auto = match options.decode.lanes {
            Decode::Auto => auto_lanes(
                images,
                &mut epoch_bytes,
                options.decode.planned_epochs,
                threads,
                options.decode.assisted_share > 0.0,
            ),
            _ => AutoLanes::Whole,
        };
        if options.runtime.device == Device::Cpu {
            let why = match options.decode.lanes {
                Decode::Cpu => "CPU decode, as asked".to_string(),
                _ => "automatic: CPU decode, as the batches go to the CPU".into(),
            };
            let threads = options.runtime.threads;
            let cpu = CpuLane::new(&options.decode, &options.resize, threads, stopwatch.clone())?;
            return Ok(LanesStarting::Ready(Lanes::Cpu(cpu, DecodeWhy(why))));
        }
        let config =
            Lanes::gpu_config(options, stopwatch).filter(|_| !matches!(auto, AutoLanes::Cpu(_)));
        let beside_gpu = match options.runtime.threads {
            0 if config.is_some() => cores.saturating_sub(CORES_FOR_THE_GPU_LANE).max(1),
            0 => cores,
            given => given,
        };
        let batch_size = options.batching.batch_size;
        let lookahead = lookahead(batch_size);
        let core = Arc::new(LaneCore::new(
            &options.decode,
            &options.resize,
            stopwatch.clone(),
        ));
        // Beside a GPU lane the CPU lane's threads yield the cores to its threads.
        let priority = match config {
            Some(_) => ThreadPriority::BelowTheGpuLane,
            None => ThreadPriority::Inherited,
        };
        let ahead = CpuAhead::start(&core, threads, lookahead, batch_size + lookahead, priority)?;
        let mean_bytes = match config {
            Some(_) => epoch_bytes() / images.max(1) as u64,
            None => 0,
        };
        let large_files = images > 0 && mean_bytes >= LARGE_FILES_MIN_MEAN_BYTES;
        // (Without a GPU lane, nothing to decide: the files are not looked at for it.)
        let short_run = match options.decode.lanes {
            Decode::Auto => auto == AutoLanes::AssistedAlone,
            _ if config.is_none() => false,
            _ => hybrid_short_run(
                options.decode.assisted_share > 0.0,
                PlannedRun::new(
                    images,
                    &mut epoch_bytes,
                    options.decode.planned_epochs,
                    threads,
                ),
            ),
        };
        let config = config.map(|config| GpuLaneConfig {
            large_files,
            short_run,
            coefficient_threads: beside_gpu,
            decode_memory: core.budget.clone(),
            ..config
        });
        // The CPU lane leaves the GPU lane's cores free from the start: opening the lane's
        // decoders is host work too, and on a core of its own it ends sooner.
        ahead.set_active_threads(match config {
            Some(_) => beside_gpu,
            None => threads,
        });
        let why = match (&config, options.decode.lanes, auto) {
            (Some(_), _, _) => Lanes::asked(options),
            (None, Decode::Auto, AutoLanes::Cpu(reason)) => {
                format!("automatic: CPU decode, as {reason}")
            }
            (None, _, _) => "CPU decode, as asked".to_string(),
        };
        let balance = Balance::new(
            options.decode.gpu_share,
            options.decode.min_gpu_share,
            stopwatch.clone(),
            cpu_seconds(1, mean_bytes),
            cores,
        );
        // While the device opens the CPU lane reaches this far into the first epoch: an eighth
        // of the decode memory (512 MiB by default) of finished images.
        let reach = (options.decode.memory_limit / BRING_UP_MEMORY_SHARE) as usize
            / core.options.geometry.image_bytes().max(1);
        Ok(LanesStarting::Ahead(Box::new(AheadStart {
            ahead,
            config,
            why: DecodeWhy(why),
            balance,
            lookahead,
            cores: (options.runtime.threads == 0).then_some(cores),
            reach: reach.max(lookahead),
            begun: None,
        })))
    }

    /// Why the GPU lane opens, in words.
    fn asked(options: &Options) -> String {
        match options.decode.lanes {
            Decode::Auto => "automatic".into(),
            _ => "hybrid, as asked".into(),
        }
    }

    /// The CPU lane alone, after the GPU lane could not open (with a given share).
    fn fall_back(options: &Options, reason: String, stopwatch: &Arc<Stopwatch>) -> Result<Lanes> {
        let cpu = CpuLane::new(
            &options.decode,
            &options.resize,
            options.runtime.threads,
            stopwatch.clone(),
        )?;
        let why = format!("hybrid, as asked: CPU decode, the GPU decode lane is off: {reason}");
        Ok(Lanes::Cpu(cpu, DecodeWhy(why)))
    }

    /// Which lanes decode, and why, in words: for the pipeline's reports.
    pub fn describe(&self) -> String {
        match self {
            Lanes::Cpu(_, why) => why.0.clone(),
            Lanes::Hybrid(hybrid, why) if hybrid.gpu_asked() => {
                format!("{}: {}", why.0, hybrid.describe())
            }
            Lanes::Hybrid(_, why) => why.0.clone(),
        }
    }

    /// The GPU lane's share in force; `None` while it does not run.
    pub fn gpu_share(&self) -> Option<f32> {
        match self {
            Lanes::Hybrid(hybrid, _) => hybrid.share(),
            Lanes::Cpu(..) => None,
        }
    }

    /// Keeps the GPU lane's share at `share` from now on (a resumed run's, which its state
    /// recorded), waiting for the lane to open if it is still opening; whether the share
    /// changed (then lanes begun on a coming epoch must be begun again).
    pub fn pin_share(&mut self, share: f32) -> bool {
        match self {
            Lanes::Hybrid(hybrid, _) => hybrid.pin_share(share),
            Lanes::Cpu(..) => false,
        }
    }

    /// Whether the lanes work ahead of the batches (and so are started on the next epoch before
    /// it is asked for).
    pub fn work_ahead(&self) -> bool {
        matches!(self, Lanes::Hybrid(..))
    }

    /// Starts the lanes on `order` (an epoch). The CPU lane alone needs no start: it works batch
    /// by batch.
    pub fn begin(
        &mut self,
        source: &Arc<Source>,
        order: &Arc<EpochOrder>,
        epoch: u64,
    ) -> Result<()> {
        match self {
            Lanes::Hybrid(hybrid, _) => hybrid.begin(source, order, epoch),
            Lanes::Cpu(..) => Ok(()),
        }
    }

    /// Fills a batch from the request's positions, the CPU lane's images written into `staging`.
    /// `Ok(None)` if `stop` was raised meanwhile.
    pub fn fill(
        &mut self,
        staging: &mut Staging<'_>,
        request: &BatchRequest<'_>,
        source: &Source,
        stop: &AtomicBool,
    ) -> Result<Option<HybridFilled>> {
        match self {
            Lanes::Hybrid(hybrid, _) => hybrid.fill(staging, request, source, stop),
            Lanes::Cpu(cpu, _) => {
                let started = Instant::now();
                let filled = cpu.fill(staging, request, source, stop)?;
                let waits = Waits {
                    cpu: started.elapsed(),
                    ..Waits::default()
                };
                Ok(filled.map(|filled| HybridFilled {
                    decoded_by: DecodedBy {
                        cpu: filled.indices.len(),
                        gpu: 0,
                        assisted: 0,
                    },
                    filled,
                    unstaged: Unstaged::default(),
                    waits,
                }))
            }
        }
    }

    /// Gives back the GPU lane's images of a batch that is not made after all.
    pub fn discard(&mut self, unstaged: Unstaged) -> Result<()> {
        match self {
            Lanes::Hybrid(hybrid, _) => hybrid.discard(unstaged),
            Lanes::Cpu(..) => Ok(()),
        }
    }

    /// The page-locked host memory the lanes hold (the CPU lane's images of their own).
    pub fn pinned_bytes(&self) -> usize {
        match self {
            Lanes::Hybrid(hybrid, _) => hybrid.pinned_bytes(),
            Lanes::Cpu(..) => 0,
        }
    }

    /// A batch's images that are not in its staging (the GPU lane's, the CPU lane's in
    /// page-locked images of their own), to be written into its places of the batch's device
    /// buffer by the output stage.
    pub fn device_writes(&mut self, unstaged: Unstaged) -> UnstagedWrites<'_> {
        match self {
            Lanes::Hybrid(hybrid, _) => hybrid.device_writes(unstaged),
            Lanes::Cpu(..) => UnstagedWrites {
                lane: None,
                unstaged,
                in_flight: None,
            },
        }
    }
}

/// The lanes while the pipeline's device opens ([`Lanes::start`]).
pub(crate) enum LanesStarting {
    /// Whole already: the CPU lane alone, batch by batch (batches for the CPU).
    Ready(Lanes),
    /// The CPU lane's threads working ahead of the batches; the GPU lane is asked for once the
    /// device is open.
    Ahead(Box<AheadStart>),
}

/// The CPU lane working ahead while the pipeline's device opens, and what the lanes need once it
/// is open.
pub(crate) struct AheadStart {
    ahead: CpuAhead,
    /// The GPU lane's configuration, when it is asked for.
    config: Option<GpuLaneConfig>,
    why: DecodeWhy,
    balance: Balance,
    lookahead: usize,
    /// The machine's cores when the thread count was left to the pipeline.
    cores: Option<usize>,
    /// Positions into the first epoch the CPU lane works while the device opens.
    reach: usize,
    /// The epoch the CPU lane began while the device opened.
    begun: Option<Epoch>,
}

impl LanesStarting {
    /// Starts the CPU lane on the first epoch, in the order `plan` makes, while the device
    /// opens, where the lanes work ahead and the share is not given (the GPU lane, not open yet,
    /// is offered nothing): the order, if it began. Meanwhile the lane works further ahead than
    /// its lookahead, up to an eighth of the decode memory of finished images, until the batches
    /// pass them.
    pub fn begin_early(
        &mut self,
        source: &Arc<Source>,
        epoch: u64,
        plan: impl FnOnce() -> Arc<EpochOrder>,
    ) -> Option<Arc<EpochOrder>> {
        let LanesStarting::Ahead(start) = self else {
            return None;
        };
        // A given share opens the GPU lane before the first batch instead.
        if start.balance.is_pinned() {
            return None;
        }
        let order = plan();
        start.begun = Some(Epoch::begin_cpu(&start.ahead, source, &order, epoch, 0.0));
        start.ahead.reach(start.reach);
        Some(order)
    }

    /// The lanes whole, on `gpu`: the pipeline's device, open (`None` for the CPU).
    pub fn open(
        self,
        options: &Options,
        gpu: Option<&Gpu>,
        stopwatch: &Arc<Stopwatch>,
    ) -> Result<Lanes> {
        let start = match (self, gpu) {
            (LanesStarting::Ready(lanes), _) => return Ok(lanes),
            (LanesStarting::Ahead(start), Some(gpu)) => (*start, gpu),
            (LanesStarting::Ahead(_), None) => {
                return Err(Error::Worker(
                    "the lanes of a CUDA device were opened without it".into(),
                ))
            }
        };
        let (
            AheadStart {
                ahead,
                config,
                why,
                balance,
                lookahead,
                cores,
                begun,
                ..
            },
            gpu,
        ) = start;
        let opening = match config {
            None => GpuOpening::NotAsked,
            Some(config) if balance.is_pinned() => {
                match stopwatch.time(Stage::GpuOpen, || GpuLane::open(gpu, &config)) {
                    Ok(lane) => GpuOpening::Open(Box::new(lane)),
                    Err(reason) => return Lanes::fall_back(options, reason.to_string(), stopwatch),
                }
            }
            Some(config) => {
                let device = gpu.clone();
                let watch = stopwatch.clone();
                let opening =
                    Opening::start("gpufeed-gpu-lane-open", opening_stopped, move |cancel| {
                        watch.time(Stage::GpuOpen, || {
                            GpuLane::open_unless(&device, &config, cancel)
                        })
                    })
                    .map_err(|e| Error::Worker(format!("cannot open the GPU lane: {e}")))?;
                GpuOpening::Pending(opening)
            }
        };
        let mut hybrid = HybridLanes::new(
            opening,
            ahead,
            balance,
            gpu.stream().clone(),
            lookahead,
            cores,
            begun,
        );
        hybrid.pin_cpu_images(options.batching.batch_size);
        Ok(Lanes::Hybrid(Box::new(hybrid), why))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KB: u64 = 1 << 10;

    #[test]
    fn automatic_decoding_leaves_small_epochs_and_short_runs_to_the_cpu() {
        let lanes = |images: usize, mean: u64, planned, cores, assisted| {
            auto_lanes(images, || images as u64 * mean, planned, cores, assisted)
        };
        let cpu = |lanes: AutoLanes| match lanes {
            AutoLanes::Cpu(why) => why,
            other => panic!("the CPU lane alone, not {other:?}"),
        };
        // Few small images: not worth the lane, whatever the run.
        let why = cpu(lanes(100, 10 * KB, None, 16, true));
        assert!(why.contains("does not repay"), "{why}");
        cpu(lanes(100, 10 * KB, Some(1_000), 16, true));
        // Few but large images are worth it.
        assert_eq!(lanes(100, 3 << 20, None, 16, true), AutoLanes::Whole);
        // A run of unknown length is taken to be long.
        assert_eq!(lanes(8_192, 110 * KB, None, 16, true), AutoLanes::Whole);
        // One epoch of 8,192 ImageNet-sized files is about a second of 16 cores: over before
        // the JPEG engines open, not before the assisted path does; without the assisted path it
        // stays on the CPU. Four epochs (4.4 s) repay the engines, and so does one on 4 cores;
        // four of smaller files (2.4 s) do not.
        assert_eq!(
            lanes(8_192, 110 * KB, Some(1), 16, true),
            AutoLanes::AssistedAlone
        );
        let why = cpu(lanes(8_192, 110 * KB, Some(1), 16, false));
        assert!(
            why.contains("a run of 1 epoch (880 MB, about 1.1 s") && why.contains("about 2 s"),
            "{why}"
        );
        assert_eq!(lanes(8_192, 110 * KB, Some(4), 16, true), AutoLanes::Whole);
        assert_eq!(
            lanes(8_192, 42 * KB, Some(4), 16, true),
            AutoLanes::AssistedAlone
        );
        assert_eq!(lanes(8_192, 110 * KB, Some(1), 4, true), AutoLanes::Whole);
        // A run shorter than even the assisted path's opening stays on the CPU.
        let why = cpu(lanes(2_048, 20 * KB, Some(1), 16, true));
        assert!(why.contains("about 0.3 s"), "{why}");
        // An epoch of 2,048 camera photos is seconds of work.
        assert_eq!(
            lanes(2_048, 2_500 * KB, Some(1), 16, true),
            AutoLanes::Whole
        );
        // A run of zero epochs decodes nothing: the CPU lane is enough.
        cpu(lanes(8_192, 110 * KB, Some(0), 16, true));
    }

    #[test]
    fn hybrid_decoding_as_asked_opens_the_engines_for_runs_that_repay_them() {
        let run = |images: usize, mean: u64, planned| {
            PlannedRun::new(images, || images as u64 * mean, planned, 16)
        };
        // One epoch of 8,192 ImageNet-sized files (about 1.1 s of 16 cores) ends before the
        // engines could repay their opening; the assisted path stands in for them.
        assert!(hybrid_short_run(true, run(8_192, 110 * KB, Some(1))));
        // Not without the assisted path: the engines are then the whole GPU lane.
        assert!(!hybrid_short_run(false, run(8_192, 110 * KB, Some(1))));
        // Four epochs (4.4 s) repay them, and so does a run of unknown length.
        assert!(!hybrid_short_run(true, run(8_192, 110 * KB, Some(4))));
        assert!(!hybrid_short_run(true, run(8_192, 110 * KB, None)));
        // Camera photos: an epoch of 2,048 is seconds of work.
        assert!(!hybrid_short_run(true, run(2_048, 2_500 * KB, Some(1))));
        let described = run(8_192, 110 * KB, Some(1)).map(|r| r.to_string());
        assert_eq!(
            described.as_deref(),
            Some("a run of 1 epoch (880 MB, about 1.1 s of the CPU threads)")
        );
    }
}
