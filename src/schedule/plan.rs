//! The decode choice of a pipeline, read once from its options ([`DecodePlan`]), and what it
//! opens for a run ([`DecodePlan::choose`]): the CPU lane alone, batch by batch (batches for the
//! CPU), or the CPU lane working ahead of the batches with the GPU decode lane beside it where
//! it is asked for and worth opening (whole, or its assisted path alone), and the policy that
//! schedules them.

use std::sync::Arc;

use super::mix::{EpochSample, WorkMix};
use super::policy::{GpuRun, LanePolicy};
use super::share::Balance;
use super::threads::{
    CORES_FOR_THE_GPU_LANE, VIEWS_CPU_THREADS_BESIDE, VIEWS_EXTRA_PREPARING_THREADS,
};
use crate::options::{Decode, Device, Options};
use crate::profile::Stopwatch;

/// Images a run of unknown length needs in an epoch (a planned run, in all its epochs) for
/// [`Decode::Auto`] to open the GPU lane: opening it takes a second or two of a core and about a
/// gigabyte of device memory, which fewer images than this (well under a second of the CPU lane's
/// work on 16 cores) do not repay, unless they are large ([`AUTO_MIN_BYTES`]). A planned run of
/// many epochs of a small folder does: on the H100 machine 300 epochs of 400 make-corpus files
/// ran at 25,819 images/s with the GPU lane and 8,115 on the CPU threads alone.
const AUTO_MIN_IMAGES: u64 = 1024;

/// Encoded bytes a run's epoch (a planned run's epochs) of fewer than [`AUTO_MIN_IMAGES`] images
/// needs for [`Decode::Auto`] to open the GPU lane: about 500 Mpx of camera photos, two seconds of
/// the CPU lane's work on 16 cores.
const AUTO_MIN_BYTES: u64 = 100 << 20;

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
    // A planned run counts all its epochs; a run of unknown length, one.
    let planned_run = PlannedRun::new(images, &mut epoch_bytes, planned, cores);
    let few = match &planned_run {
        Some(run) => (run.images < AUTO_MIN_IMAGES && run.bytes < AUTO_MIN_BYTES)
            .then(|| format!("a run of {} images", run.images)),
        None => ((images as u64) < AUTO_MIN_IMAGES && epoch_bytes() < AUTO_MIN_BYTES)
            .then(|| format!("an epoch of {images} images")),
    };
    if let Some(what) = few {
        return AutoLanes::Cpu(format!(
            "{what} does not repay opening the GPU decode lane (it takes {AUTO_MIN_IMAGES}, or \
             {} MB)",
            AUTO_MIN_BYTES >> 20
        ));
    }
    let Some(run) = planned_run else {
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
    images: u64,
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
        let images = (images as u64).saturating_mul(epochs);
        Some(PlannedRun {
            epochs,
            images,
            bytes,
            cpu_seconds: cpu_seconds(images, bytes) / cores.max(1) as f64,
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

/// The decode choice of a pipeline, read once from its options: which decoders may fill the
/// batches and where the batches go, the GPU lane's share given (or recorded by a resumed state)
/// and its floor, the assisted path's share, the run's planned epochs and the CPU threads asked
/// for. Everything the lanes' scheduling derives comes from this one value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct DecodePlan {
    lanes: Decode,
    /// Whether the batches go to a CUDA device.
    on_device: bool,
    given_share: Option<f32>,
    floor: Option<f32>,
    assisted_share: f32,
    /// The batches are views of each image ([`DecodePlan::for_views`]).
    views: bool,
    planned_epochs: Option<u64>,
    /// CPU threads asked for; 0: one per core.
    threads: usize,
}

/// What the lanes of a run are ([`DecodePlan::choose`]).
#[derive(Debug)]
pub(crate) enum LaneChoice {
    /// The CPU lane alone, batch by batch (batches for the CPU), with the threads asked for (0:
    /// one per core).
    Cpu {
        /// Why, in words.
        why: String,
        threads: usize,
    },
    /// The CPU lane working ahead of the batches, the GPU lane beside it where `gpu` says.
    Ahead {
        /// Why, in words.
        why: String,
        /// The run as the GPU lane sees it, when it opens.
        gpu: Option<GpuRun>,
        policy: Box<LanePolicy>,
    },
}

impl DecodePlan {
    /// The decode choice of `options`.
    pub fn new(options: &Options) -> DecodePlan {
        let decode = &options.decode;
        DecodePlan {
            lanes: decode.lanes,
            on_device: options.runtime.device != Device::Cpu,
            given_share: decode.gpu_share,
            floor: decode.min_gpu_share,
            assisted_share: decode.assisted_share,
            planned_epochs: decode.planned_epochs,
            threads: options.runtime.threads,
            views: false,
        }
    }

    /// The same choice for a pipeline of views, whose GPU lane plans about ten resizes an image
    /// on the host: it gets [`VIEWS_EXTRA_PREPARING_THREADS`] more preparing threads, and the CPU
    /// lane keeps [`VIEWS_CPU_THREADS_BESIDE`] threads beside it at least.
    pub fn for_views(self) -> DecodePlan {
        DecodePlan {
            views: true,
            ..self
        }
    }

    /// Preparing threads a GPU lane of this plan adds to its own.
    pub fn extra_preparing_threads(&self) -> usize {
        match self.views {
            true => VIEWS_EXTRA_PREPARING_THREADS,
            false => 0,
        }
    }

    /// The same choice with the batches on the CPU (a CUDA device that could not be used).
    pub fn on_the_cpu(self) -> DecodePlan {
        DecodePlan {
            on_device: false,
            ..self
        }
    }

    /// Whether the GPU decode lane may open: hybrid or automatic decoding on a CUDA device.
    pub fn gpu_wanted(&self) -> bool {
        matches!(self.lanes, Decode::Hybrid | Decode::Auto) && self.on_device
    }

    /// Whether a share between the lanes applies (any decoding but the CPU's alone).
    fn shares(&self) -> bool {
        self.lanes != Decode::Cpu
    }

    /// The share given, where a share applies: what a saved state's share is checked against.
    pub fn configured_share(&self) -> Option<f32> {
        self.given_share.filter(|_| self.shares())
    }

    /// Of a saved state's share, what applies here (none for the CPU's decoding alone).
    pub fn applying(&self, share: Option<f32>) -> Option<f32> {
        share.filter(|_| self.shares())
    }

    /// Keeps a saved state's share from the start, where it applies (every image then goes to
    /// the lane it went to), and returns it.
    pub fn resume_with(&mut self, share: Option<f32>) -> Option<f32> {
        let share = self.applying(share)?;
        self.given_share = Some(share);
        Some(share)
    }

    /// The epochs the run will take, when known: it ends before this one.
    pub fn planned_epochs(&self) -> Option<u64> {
        self.planned_epochs
    }

    /// The lanes for epochs of `images` images, whose encoded bytes and work mix `epoch_sample`
    /// estimates (called once at most, when first needed), on a machine of `cores` cores; the
    /// CPU lane's times go to `stopwatch`, where the share's rates are read. Automatic decoding
    /// opens the GPU lane only for runs of at least [`AUTO_MIN_IMAGES`] images or
    /// [`AUTO_MIN_BYTES`] (a run of unknown length: in an epoch), and only its assisted path for
    /// a run too short to repay the JPEG engines.
    pub fn choose<S: Into<EpochSample>>(
        &self,
        images: usize,
        epoch_sample: impl FnOnce() -> S,
        cores: usize,
        stopwatch: &Arc<Stopwatch>,
    ) -> LaneChoice {
        // Sampled once, when first needed.
        let (mut sample, mut sampled) = (Some(epoch_sample), None::<EpochSample>);
        let mut epoch = || {
            *sampled
                .get_or_insert_with(|| sample.take().map_or_else(Default::default, |f| f().into()))
        };
        let mut epoch_bytes = || epoch().bytes;
        let threads = match self.threads {
            0 => cores,
            given => given,
        };
        let auto = match self.lanes {
            Decode::Auto => auto_lanes(
                images,
                &mut epoch_bytes,
                self.planned_epochs,
                threads,
                self.assisted_share > 0.0,
            ),
            _ => AutoLanes::Whole,
        };
        if !self.on_device {
            let why = match self.lanes {
                Decode::Cpu => "CPU decode, as asked".to_string(),
                _ => "automatic: CPU decode, as the batches go to the CPU".into(),
            };
            return LaneChoice::Cpu {
                why,
                threads: self.threads,
            };
        }
        let gpu = self.gpu_wanted() && !matches!(auto, AutoLanes::Cpu(_));
        let beside_gpu = match self.threads {
            0 if gpu => cores.saturating_sub(CORES_FOR_THE_GPU_LANE).max(1),
            0 => cores,
            given => given,
        };
        let mean_bytes = match gpu {
            true => epoch_bytes() / images.max(1) as u64,
            false => 0,
        };
        // (Without a GPU lane, nothing to decide: the files are not looked at for it.)
        let short_run = match self.lanes {
            Decode::Auto => auto == AutoLanes::AssistedAlone,
            _ if !gpu => false,
            _ => hybrid_short_run(
                self.assisted_share > 0.0,
                PlannedRun::new(images, &mut epoch_bytes, self.planned_epochs, threads),
            ),
        };
        // Beside a GPU lane, an epoch whose work is mostly of files it cannot take keeps the
        // CPU lane as it is alone: every thread, at normal priority.
        let mix = match gpu {
            true => epoch().mix,
            false => WorkMix::default(),
        };
        let cpu_bound = mix.mostly_cpu_only();
        let mostly_cpu = match cpu_bound {
            true => format!(
                "; the CPU lane keeps every thread, {:.0}% of the work being files the GPU lane \
                 cannot take",
                mix.cpu_only_share() * 100.0
            ),
            false => String::new(),
        };
        let why = match (gpu, self.lanes, auto) {
            (true, Decode::Auto, _) => format!("automatic{mostly_cpu}"),
            (true, _, _) => format!("hybrid, as asked{mostly_cpu}"),
            (false, Decode::Auto, AutoLanes::Cpu(reason)) => {
                format!("automatic: CPU decode, as {reason}")
            }
            (false, _, _) => "CPU decode, as asked".to_string(),
        };
        let run = gpu.then(|| GpuRun {
            large_files: images > 0 && mean_bytes >= LARGE_FILES_MIN_MEAN_BYTES,
            short_run,
            assisted_share: self.assisted_share,
            small_files_assisted: self.given_share.is_none_or(|share| share >= 1.0),
            coefficient_threads: beside_gpu,
            cpu_only_work: mix.cpu_only > 0,
            requests: false,
            extra_preparing_threads: self.extra_preparing_threads(),
        });
        let balance = Balance::new(
            self.given_share,
            self.floor,
            stopwatch.clone(),
            cpu_seconds(1, mean_bytes),
            cores,
        );
        let policy = Box::new(LanePolicy {
            balance,
            gpu: run,
            threads,
            beside_gpu,
            least_beside_gpu: match self.views {
                true => VIEWS_CPU_THREADS_BESIDE,
                false => 1,
            },
            cores: (self.threads == 0).then_some(cores),
            cpu_bound,
        });
        LaneChoice::Ahead {
            why,
            gpu: run,
            policy,
        }
    }

    /// The lanes of a server of requests ([`crate::PatchServer`]) on a machine of `cores`
    /// cores. The CPU lane alone, all its threads on each request's images, where CPU decoding
    /// is asked for, the tokens go to the CPU, or the GPU lane's assisted path is off
    /// (`assisted_share` 0: the JPEG engines alone would not give the CPU threads' bytes).
    /// Otherwise the GPU lane, opened before the first request, beside the CPU lane: offered
    /// every image (a share of 1, kept), it decodes the JPEGs it takes on its assisted path
    /// alone, libjpeg-turbo's arithmetic, its engines closed; the CPU lane takes the others.
    pub fn for_requests(&self, cores: usize, stopwatch: &Arc<Stopwatch>) -> LaneChoice {
        let cpu = |why: &str| LaneChoice::Cpu {
            why: why.to_string(),
            threads: self.threads,
        };
        if !self.on_device {
            return cpu("CPU decode, as the tokens go to the CPU");
        }
        if !self.gpu_wanted() {
            return cpu("CPU decode, as asked");
        }
        if self.assisted_share <= 0.0 {
            return cpu(
                "CPU decode, as the GPU lane's assisted path is off (assisted_share 0) and the \
                 JPEG engines' bytes are not the CPU threads'",
            );
        }
        let (threads, beside_gpu) = match self.threads {
            0 => (cores, cores.saturating_sub(CORES_FOR_THE_GPU_LANE).max(1)),
            given => (given, given),
        };
        let run = GpuRun {
            large_files: true,
            short_run: true,
            assisted_share: 1.0,
            small_files_assisted: true,
            coefficient_threads: beside_gpu,
            cpu_only_work: false,
            requests: true,
            extra_preparing_threads: 0,
        };
        let balance = Balance::new(Some(1.0), None, stopwatch.clone(), cpu_seconds(1, 0), cores);
        LaneChoice::Ahead {
            why: "GPU decode of the JPEGs its assisted path takes, CPU decode of the others".into(),
            gpu: Some(run),
            policy: Box::new(LanePolicy {
                balance,
                gpu: Some(run),
                threads,
                beside_gpu,
                least_beside_gpu: 1,
                // The CPU threads at work stay as they start: between requests the GPU lane's
                // host threads are idle, and a request of PNGs wants its threads at once.
                cores: None,
                cpu_bound: false,
            }),
        }
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
        // Few small images: not worth the lane for a run of unknown length, nor for a short one.
        let why = cpu(lanes(100, 10 * KB, None, 16, true));
        assert!(
            why.contains("an epoch of 100 images does not repay"),
            "{why}"
        );
        let why = cpu(lanes(100, 10 * KB, Some(10), 16, true));
        assert!(why.contains("a run of 1000 images does not repay"), "{why}");
        // A planned run of many epochs of them is: 300 epochs of 400 ImageNet-sized files
        // (about 10 s of 16 cores) ran 3.2x faster with the lane on the H100 machine.
        assert_eq!(lanes(400, 50 * KB, Some(300), 16, true), AutoLanes::Whole);
        // Enough of them for the assisted path, not for the engines.
        assert_eq!(
            lanes(400, 50 * KB, Some(40), 16, true),
            AutoLanes::AssistedAlone
        );
        // And too few even for the assisted path's opening.
        let why = cpu(lanes(400, 50 * KB, Some(4), 16, true));
        assert!(why.contains("about 0.3 s"), "{why}");
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

    #[test]
    fn a_pipeline_of_views_gives_the_gpu_lane_more_preparing_threads_and_the_cpu_lane_more_beside()
    {
        use crate::options::{DecodeOptions, Options};
        let hybrid = Options::default().decode(DecodeOptions::default().lanes(Decode::Hybrid));
        for (plan, extra, least) in [
            (DecodePlan::new(&hybrid), 0, 1),
            (
                DecodePlan::new(&hybrid).for_views(),
                VIEWS_EXTRA_PREPARING_THREADS,
                VIEWS_CPU_THREADS_BESIDE,
            ),
        ] {
            assert_eq!(plan.extra_preparing_threads(), extra);
            let LaneChoice::Ahead { gpu, policy, .. } =
                plan.choose(8_192, || 1 << 30, 16, &Arc::default())
            else {
                panic!("hybrid decoding on a CUDA device opens the GPU lane");
            };
            let run = gpu.expect("the GPU lane's run");
            assert_eq!(run.extra_preparing_threads, extra);
            // The CPU lane keeps the threads that make the views of the files the lane refuses.
            assert_eq!(policy.least_beside_gpu, least);
        }
    }

    #[test]
    fn a_server_opens_the_assisted_path_alone_for_every_image_or_the_cpu_lane() {
        use crate::options::{DecodeOptions, Options, RuntimeOptions};
        use crate::schedule::EnginesOpen;
        let cuda = Options::default();
        let LaneChoice::Ahead { gpu, policy, .. } =
            DecodePlan::new(&cuda).for_requests(16, &Arc::default())
        else {
            panic!("a server on a CUDA device opens the GPU lane");
        };
        let run = gpu.expect("the GPU lane's run");
        assert!(run.requests && run.assisted_share == 1.0);
        assert!(policy.is_pinned() && policy.share() == 1.0);
        assert!(policy.opens_before_the_first_batch());
        assert!(matches!(policy.engines_open(), EnginesOpen::Never(_)));
        assert_eq!((policy.threads(), policy.working_threads()), (16, 14));
        let cpu_choice =
            |options: Options| match DecodePlan::new(&options).for_requests(16, &Arc::default()) {
                LaneChoice::Cpu { why, threads } => (why, threads),
                other => panic!("the CPU lane alone, not {other:?}"),
            };
        let asked = cuda.decode(DecodeOptions::default().lanes(Decode::Cpu));
        assert_eq!(cpu_choice(asked).0, "CPU decode, as asked");
        let off = cuda.decode(DecodeOptions::default().assisted_share(0.0));
        assert!(cpu_choice(off).0.contains("assisted_share 0"));
        let host = cuda.runtime(RuntimeOptions::default().device(Device::Cpu).threads(3));
        assert_eq!(
            cpu_choice(host),
            ("CPU decode, as the tokens go to the CPU".into(), 3)
        );
    }

    #[test]
    fn the_decode_choice_is_read_once_and_a_resumed_share_kept_where_shares_apply() {
        use crate::options::{DecodeOptions, Options};
        let decode = DecodeOptions::default()
            .lanes(Decode::Hybrid)
            .gpu_share(Some(0.5));
        let hybrid = Options::default().decode(decode);
        let mut plan = DecodePlan::new(&hybrid);
        assert!(plan.gpu_wanted());
        assert_eq!(plan.configured_share(), Some(0.5));
        assert_eq!(plan.resume_with(Some(0.25)), Some(0.25));
        assert_eq!(plan.configured_share(), Some(0.25));
        assert_eq!(plan.applying(None), None);
        // The CPU's decoding alone has no share to keep.
        let cpu = hybrid.decode(hybrid.decode.lanes(Decode::Cpu));
        let mut plan = DecodePlan::new(&cpu);
        assert!(!plan.gpu_wanted());
        assert_eq!(plan.configured_share(), None);
        assert_eq!(plan.resume_with(Some(0.25)), None);
        assert_eq!(plan.applying(Some(0.25)), None);
        // Batches on the CPU (a CUDA device that could not be used): the CPU lane alone.
        let fallback = DecodePlan::new(&hybrid).on_the_cpu();
        assert!(!fallback.gpu_wanted());
        let choice = fallback.choose(8_192, || 1 << 30, 16, &Arc::default());
        assert!(
            matches!(&choice, LaneChoice::Cpu { why, threads: 0 } if why.contains("CPU decode")),
            "{choice:?}"
        );
    }
}
