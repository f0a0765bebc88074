//! The decode lanes of a pipeline as one value: the CPU lane alone, batch by batch (batches for the
//! CPU), or the CPU lane working ahead of the batches, with the GPU decode lane beside it when
//! asked for (hybrid decoding; batches for a GPU). The lanes are built as the schedule's decode
//! plan chooses ([`DecodePlan::choose`]), read once from the options when the pipeline starts;
//! the worker asks the lanes for a batch's images and the output stage never learns who decoded
//! them.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;

use super::hybrid::{
    opening_stopped, Epoch, GpuOpening, HybridFilled, HybridLanes, Opening, Unstaged,
    UnstagedWrites, Waits,
};
use crate::batch::DecodedBy;
use crate::cpu::{BatchRequest, CpuAhead, CpuLane, LaneCore, Staging};
use crate::cuda::Gpu;
use crate::error::{Error, Result};
use crate::geometry::Geometry;
use crate::gpu::{lookahead, GpuLane, GpuLaneConfig};
use crate::options::Options;
use crate::order::EpochOrder;
use crate::profile::{Stage, Stopwatch};
use crate::schedule::{DecodePlan, EpochSample, LaneChoice, LanePolicy};
use crate::source::Source;

/// While the pipeline's device opens, the CPU lane works this fraction of the decode memory's
/// bytes of finished images into the first epoch (512 MiB by default): 3,566 images of 224 x 224,
/// about 0.3 s of 16 cores on ImageNet-sized files.
const BRING_UP_MEMORY_SHARE: u64 = 8;

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
    /// Device memory the lanes of `plan` may take (the GPU lane's ring and buffers) for outputs
    /// of `image_bytes` each (an image, or the record of an image's views) in batches of
    /// `batch_size`, for the output stage's check of what fits before anything is allocated.
    pub fn device_bytes(plan: &DecodePlan, image_bytes: usize, batch_size: usize) -> u128 {
        match plan.gpu_wanted() {
            true => GpuLane::device_bytes(
                image_bytes,
                batch_size,
                false,
                plan.extra_preparing_threads(),
            ),
            false => 0,
        }
    }

    /// Starts the lanes `plan` chooses (making `views` of each image, if given) for epochs of
    /// `images` (`epoch_bytes` estimates an epoch's encoded bytes and the mix of its work), as
    /// far as they go without the pipeline's device: [`LanesStarting::open`] finishes them once it is open. For a CUDA device the CPU lane
    /// works ahead of the batches, its threads started here; the GPU lane, where the plan opens
    /// it, opens on a thread of its own once the device is open, joining the batches when
    /// ready, or before the first batch where the policy says (with a given share, so that
    /// every image goes to the same lane on every run; for an epoch of large JPEGs).
    pub fn start(
        plan: &DecodePlan,
        options: &Options,
        (geometry, views): (Geometry, Option<Arc<crate::cpu::LaneViews>>),
        images: usize,
        epoch_bytes: impl FnOnce() -> EpochSample,
        stopwatch: &Arc<Stopwatch>,
    ) -> Result<LanesStarting> {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let (why, run, policy) = match plan.choose(images, epoch_bytes, cores, stopwatch) {
            LaneChoice::Cpu { why, threads } => {
                let cpu = CpuLane::new(&options.decode, geometry, threads, stopwatch.clone())?
                    .with_views(views);
                return Ok(LanesStarting::Ready(Lanes::Cpu(cpu, DecodeWhy(why))));
            }
            LaneChoice::Ahead { why, gpu, policy } => (why, gpu, *policy),
        };
        let batch_size = options.batching.batch_size;
        let lookahead = lookahead(batch_size);
        let core = Arc::new(
            LaneCore::new(&options.decode, geometry, stopwatch.clone()).with_views(views.clone()),
        );
        let ahead = CpuAhead::start(
            &core,
            policy.threads(),
            lookahead,
            batch_size + lookahead,
            policy.priority(),
        )?;
        let config = run.map(|run| GpuLaneConfig {
            stopwatch: stopwatch.clone(),
            geometry,
            max_pixels: options.decode.max_pixels,
            batch_size,
            max_file_bytes: options.decode.max_file_bytes,
            exif_orientation: options.decode.exif_orientation,
            assisted_share: run.assisted_share,
            large_files: run.large_files,
            small_files_assisted: run.small_files_assisted,
            coefficient_threads: run.coefficient_threads,
            decode_memory: core.budget.clone(),
            requests: false,
            views,
            extra_preparing_threads: run.extra_preparing_threads,
        });
        ahead.set_active_threads(policy.working_threads());
        // While the device opens the CPU lane reaches this far into the first epoch: an eighth
        // of the decode memory (512 MiB by default) of finished images.
        let reach = (options.decode.memory_limit / BRING_UP_MEMORY_SHARE) as usize
            / core.output_bytes().max(1);
        Ok(LanesStarting::Ahead(Box::new(AheadStart {
            ahead,
            config,
            why: DecodeWhy(why),
            policy,
            lookahead,
            reach: reach.max(lookahead),
            begun: None,
        })))
    }

    /// Device memory the lanes of a server of requests of up to `max_images` images of
    /// `geometry` may take ([`Lanes::for_requests`]), for the output stage's check.
    pub fn device_bytes_for_requests(
        options: &Options,
        geometry: &Geometry,
        max_images: usize,
    ) -> u128 {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        match DecodePlan::new(options).for_requests(cores, &Arc::default()) {
            LaneChoice::Ahead { gpu: Some(_), .. } => {
                GpuLane::device_bytes(geometry.image_bytes(), max_images, true, 0)
            }
            _ => 0,
        }
    }

    /// The lanes of a server of requests of up to `max_images` images each, on `gpu` (its
    /// device, open; `None` for the CPU), as the schedule chooses for requests
    /// ([`DecodePlan::for_requests`]): the CPU lane alone, batch by batch; or the GPU lane,
    /// opened now with all its decoders, beside the CPU lane's threads, every request an epoch
    /// of its own ([`Lanes::begin`]), all of its images offered to the GPU lane, which hands the
    /// CPU lane those it does not take. Where the GPU lane cannot open (or only with its JPEG
    /// engines, whose bytes are not the CPU threads'), the CPU lane alone, saying why.
    pub fn for_requests(
        options: &Options,
        geometry: Geometry,
        gpu: Option<&Gpu>,
        max_images: usize,
        stopwatch: &Arc<Stopwatch>,
    ) -> Result<Lanes> {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let (why, policy, gpu) =
            match (DecodePlan::new(options).for_requests(cores, stopwatch), gpu) {
                (LaneChoice::Cpu { why, threads }, _) => {
                    let cpu = CpuLane::new(&options.decode, geometry, threads, stopwatch.clone())?;
                    return Ok(Lanes::Cpu(cpu, DecodeWhy(why)));
                }
                (LaneChoice::Ahead { why, policy, .. }, Some(gpu)) => (why, policy, gpu),
                (LaneChoice::Ahead { .. }, None) => {
                    return Err(Error::Worker(
                        "the lanes of a CUDA device were opened without it".into(),
                    ))
                }
            };
        let core = Arc::new(LaneCore::new(&options.decode, geometry, stopwatch.clone()));
        let config = GpuLaneConfig {
            stopwatch: stopwatch.clone(),
            geometry,
            max_pixels: options.decode.max_pixels,
            batch_size: max_images,
            max_file_bytes: options.decode.max_file_bytes,
            exif_orientation: options.decode.exif_orientation,
            assisted_share: 1.0,
            large_files: true,
            small_files_assisted: true,
            coefficient_threads: policy.working_threads(),
            decode_memory: core.budget.clone(),
            requests: true,
            views: None,
            extra_preparing_threads: 0,
        };
        let opened = stopwatch.time(Stage::GpuOpen, || {
            GpuLane::open(gpu, &config, policy.engines_open(), &AtomicBool::new(false))
        });
        let lane = match opened {
            Ok(mut lane) => {
                // Every decoder at work before the first request.
                lane.wait_until_open();
                match lane.engines_closed() {
                    true => Ok(lane),
                    false => Err(format!(
                        "its assisted path could not open, and the JPEG engines' bytes are not \
                         the CPU threads' ({})",
                        lane.describe()
                    )),
                }
            }
            Err(reason) => Err(reason.to_string()),
        };
        let lane = match lane {
            Ok(lane) => lane,
            Err(reason) => {
                let threads = options.runtime.threads;
                let cpu = CpuLane::new(&options.decode, geometry, threads, stopwatch.clone())?;
                let why = format!("CPU decode, the GPU decode lane is off: {reason}");
                return Ok(Lanes::Cpu(cpu, DecodeWhy(why)));
            }
        };
        // A request is all the lanes' work: they look no further ahead than its images.
        let ahead = CpuAhead::start(
            &core,
            policy.threads(),
            max_images,
            max_images + policy.threads(),
            policy.priority(),
        )?;
        ahead.set_active_threads(policy.working_threads());
        let hybrid = HybridLanes::new(
            GpuOpening::Open(Box::new(lane)),
            ahead,
            *policy,
            gpu.stream().clone(),
            max_images,
            None,
        );
        Ok(Lanes::Hybrid(Box::new(hybrid), DecodeWhy(why)))
    }

    /// The CPU lane alone, after the GPU lane could not open (with a given share).
    fn fall_back(
        options: &Options,
        geometry: Geometry,
        reason: String,
        stopwatch: &Arc<Stopwatch>,
    ) -> Result<Lanes> {
        let cpu = CpuLane::new(
            &options.decode,
            geometry,
            options.runtime.threads,
            stopwatch.clone(),
        )?;
        let why = format!("hybrid, as asked: CPU decode, the GPU decode lane is off: {reason}");
        Ok(Lanes::Cpu(cpu, DecodeWhy(why)))
    }

    /// Lends each image of the next requests of `images` images the CPU lane's threads they
    /// leave idle, where it decodes them all ([`CpuLane::lend_threads`]): a server's.
    pub fn lend_threads(&self, images: usize) {
        if let Lanes::Cpu(cpu, _) = self {
            cpu.lend_threads(images);
        }
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
    policy: LanePolicy,
    lookahead: usize,
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
        // A given share (or an epoch of large JPEGs) opens the GPU lane before the first batch
        // instead.
        if start.policy.opens_before_the_first_batch() {
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
                policy,
                lookahead,
                begun,
                ..
            },
            gpu,
        ) = start;
        let engines = policy.engines_open();
        let opening = match config {
            None => GpuOpening::NotAsked,
            Some(config) if policy.opens_before_the_first_batch() => {
                let opened = stopwatch.time(Stage::GpuOpen, || {
                    GpuLane::open(gpu, &config, engines, &AtomicBool::new(false))
                });
                match opened {
                    Ok(lane) => GpuOpening::Open(Box::new(lane)),
                    Err(reason) => {
                        let reason = reason.to_string();
                        return Lanes::fall_back(options, config.geometry, reason, stopwatch);
                    }
                }
            }
            Some(config) => {
                let device = gpu.clone();
                let watch = stopwatch.clone();
                let opening =
                    Opening::start("gpufeed-gpu-lane-open", opening_stopped, move |cancel| {
                        watch.time(Stage::GpuOpen, || {
                            GpuLane::open(&device, &config, engines, cancel)
                        })
                    })
                    .map_err(|e| Error::Worker(format!("cannot open the GPU lane: {e}")))?;
                GpuOpening::Pending(opening)
            }
        };
        let mut hybrid = HybridLanes::new(
            opening,
            ahead,
            policy,
            gpu.stream().clone(),
            lookahead,
            begun,
        );
        hybrid.pin_cpu_images(options.batching.batch_size);
        Ok(Lanes::Hybrid(Box::new(hybrid), why))
    }
}
