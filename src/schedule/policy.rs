//! The one policy that schedules the two decode lanes of a pipeline whose CPU lane works ahead
//! of the batches ([`LanePolicy`]): the GPU lane's share (given and kept, or following the
//! lanes' measured rates, never below its floor), when its JPEG engines open, and how many of
//! the CPU lane's threads work beside it and at what priority. The pipeline tells it what the
//! lanes did and asks; the lanes carry out its decisions and decide nothing themselves.

use super::share::{Balance, LaneActivity};
use super::threads::{cpu_threads_beside, ThreadPriority, GPU_LANE_HOST_THREADS};

/// The run as the GPU lane sees it, decided when the lanes start.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct GpuRun {
    /// Whether the epoch's files are large on average (camera photos): the lane's calls are cut
    /// for them, and the assisted path takes them.
    pub large_files: bool,
    /// Whether the run ends before the JPEG engines could repay their opening (a second or two):
    /// a lane opened beside running batches then opens its assisted path alone.
    pub short_run: bool,
    /// Of the large baseline images, the share the assisted path takes (0: none).
    pub assisted_share: f32,
    /// Whether the assisted path takes its share of the files under 1 Mpx beside the engines:
    /// unless a share below 1 is given, where the CPU lane's fixed part sets the pace and the
    /// assisted path's host work would slow it.
    pub small_files_assisted: bool,
    /// Threads that decode progressive files' coefficients for the assisted path: the CPU
    /// lane's count beside the GPU lane, as they do the work the CPU lane's threads would do
    /// otherwise.
    pub coefficient_threads: usize,
    /// Whether the lane serves requests one at a time (a [`crate::PatchServer`]'s): its JPEG
    /// engines then stay closed, so that every image it decodes (on its assisted path, which is
    /// libjpeg-turbo's arithmetic) has the bytes the CPU lane would give it.
    pub requests: bool,
    /// Whether some of the epoch's work (a sample of its files) is of files the GPU lane cannot
    /// take (PNG, WebP and the like): the CPU lane then has work of its own from the first
    /// image.
    pub cpu_only_work: bool,
    /// Preparing threads the lane adds to its own ([`super::threads::VIEWS_EXTRA_PREPARING_THREADS`]
    /// in a pipeline of views, else 0).
    pub extra_preparing_threads: usize,
}

/// When a GPU lane's JPEG engines open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EnginesOpen {
    /// Before the lane is handed over: every image goes where the files say from the start.
    BeforeTheLane,
    /// On a thread of their own once the lane runs with its assisted path.
    BesideTheLane,
    /// Not at all, for the reason given (a run that ends before they could open, or an epoch of
    /// large files, which the assisted path takes): the assisted path alone.
    Never(&'static str),
}

/// The scheduling of a CPU lane working ahead of the batches and of the GPU lane beside it
/// ([`super::DecodePlan::choose`] makes it).
#[derive(Debug)]
pub(crate) struct LanePolicy {
    pub(super) balance: Balance,
    /// The run as the GPU lane sees it; `None` where no GPU lane is asked for.
    pub(super) gpu: Option<GpuRun>,
    /// The CPU lane's threads...
    pub(super) threads: usize,
    /// ...and those that work beside a GPU lane...
    pub(super) beside_gpu: usize,
    /// ...at least, with the thread count left to the pipeline: more than one beside a lane of
    /// views ([`super::threads::VIEWS_CPU_THREADS_BESIDE`]).
    pub(super) least_beside_gpu: usize,
    /// The machine's cores when the thread count was left to the pipeline: once the GPU lane
    /// runs, the CPU lane leaves it the cores its host threads keep busy (`None`: the count was
    /// given, and kept).
    pub(super) cores: Option<usize>,
    /// Whether most of the epoch's work is of files the GPU lane cannot take
    /// ([`super::WorkMix::mostly_cpu_only`]): the CPU lane then keeps every thread, at normal
    /// priority, beside the GPU lane, as it has them alone.
    pub(super) cpu_bound: bool,
}

/// What a complete window of the lanes' measurements changes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Decision {
    /// The GPU lane's share from the first position neither lane has looked at, where it moved.
    pub share: Option<f32>,
    /// The CPU lane's threads to keep working from now on, where that changed.
    pub cpu_threads: Option<usize>,
}

impl LanePolicy {
    /// The CPU lane's threads.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Whether the CPU lane yields to a GPU lane beside it: unless most of the epoch's work is
    /// of files the GPU lane cannot take (PNG, WebP...), where the CPU lane sets the pace.
    fn yields(&self) -> bool {
        self.gpu.is_some() && !self.cpu_bound
    }

    /// The priority of the CPU lane's threads: beside a GPU lane they yield the cores to its
    /// threads, unless the CPU lane's work is most of the epoch's.
    pub fn priority(&self) -> ThreadPriority {
        match self.yields() {
            true => ThreadPriority::BelowTheGpuLane,
            false => ThreadPriority::Inherited,
        }
    }

    /// The CPU lane's threads that work from the start: beside a GPU lane it leaves the lane's
    /// cores free (opening the lane's decoders is host work too, and on a core of its own it
    /// ends sooner); alone, or with most of the epoch's work its own, all of them.
    pub fn working_threads(&self) -> usize {
        match self.yields() {
            true => self.beside_gpu,
            false => self.threads,
        }
    }

    /// The CPU lane's threads that work once the GPU lane could not open: all of them.
    pub fn threads_without_gpu(&self) -> usize {
        self.threads
    }

    /// Whether the GPU lane opens before the first batch: with a given share, so that every
    /// image goes to the same lane on every run; and for an epoch of large JPEGs that the
    /// assisted path takes whole, where the CPU lane, started while the device opened, would
    /// decode the first two batches' photos whole (25 ms of a thread each) and those batches
    /// would wait on it. Measured on the one-GPU H100 machine (16 cores, 2,048 baseline photos
    /// of 2-12 Mpx an epoch, batch 256, in turn): the first epoch at 2,244-2,276 images/s with
    /// the lane joining the running batches, 2,561-2,717 with it open before them, 3-epoch runs
    /// 1.10-1.13x faster; a mix with progressive files 0.92-1.03x by round, median 0.99
    /// (docs/figures.md, 2026-12-07, at last). Otherwise it opens on a thread of its own and
    /// joins the running batches, the CPU lane working meanwhile.
    pub fn opens_before_the_first_batch(&self) -> bool {
        self.balance.is_pinned()
            || self.gpu.is_some_and(|run| {
                run.large_files && run.assisted_share >= 1.0 && !run.cpu_only_work
            })
    }

    /// When the GPU lane's JPEG engines open: with the lane when it opens before the first
    /// batch, else beside it once it runs; not at all for a run too short to repay them (the
    /// assisted path stands in for them), nor for an epoch of large files the assisted path
    /// takes whole (the engines would only take its few small files, and opening them holds the
    /// driver and a core for one to two seconds), nor, with the share following the lanes'
    /// rates in a process alone on its machine (no floor), for small files the assisted path
    /// may take whole (its share 1, the default). Measured on the one-GPU machines (16 cores,
    /// 8,192 ImageNet-sized files, 16 epochs): on an H100 the one-crop `--train` epochs ran at
    /// 55,000-67,000 images/s before the engines joined and at 39,000-45,000 once they took
    /// one small file in four; on an H200, in turn with the engines joining, the engines kept
    /// closed gave 1.31-1.33x with `--train`, 1.18-1.32x with the fixed crop, 1.29-1.40x with
    /// Qwen2-VL's patches and 1.14-1.21x with DINOv2's views (docs/figures.md, 2026-12-06,
    /// night again).
    pub fn engines_open(&self) -> EnginesOpen {
        let Some(run) = self.gpu else {
            return EnginesOpen::Never("no GPU lane is asked for");
        };
        if run.requests {
            return EnginesOpen::Never(
                "a server's images have the CPU threads' bytes: the assisted path decodes them",
            );
        }
        if run.large_files && run.assisted_share >= 1.0 {
            return EnginesOpen::Never("the assisted path takes the epoch's large files");
        }
        match (self.opens_before_the_first_batch(), run.short_run) {
            (true, _) => EnginesOpen::BeforeTheLane,
            (false, true) => EnginesOpen::Never("the run ends before they could"),
            // Small files the assisted path takes whole (its share 1), the share following the
            // rates on a machine of the process's own (no floor): the assisted path alone.
            (false, false) if run.assisted_share >= 1.0 && self.floor().is_none() => {
                EnginesOpen::Never("the assisted path alone decodes small files faster")
            }
            (false, false) => EnginesOpen::BesideTheLane,
        }
    }

    /// The GPU lane's share in force.
    pub fn share(&self) -> f32 {
        self.balance.share()
    }

    /// Whether the share was given (or recorded by a resumed state), and is kept.
    pub fn is_pinned(&self) -> bool {
        self.balance.is_pinned()
    }

    /// The least the share following the rates falls to.
    pub fn floor(&self) -> Option<f32> {
        self.balance.floor()
    }

    /// Keeps `share` from now on.
    pub fn pin(&mut self, share: f32) {
        self.balance.pin(share);
    }

    /// Starts the measurements afresh from the GPU lane's `activity` now (when it begins to be
    /// offered images).
    pub fn restart(&mut self, activity: LaneActivity) {
        self.balance.restart(activity);
    }

    /// Takes the GPU lane's `activity` now, with `working` of the CPU lane's threads working:
    /// once a window of measurements is complete, the share moves towards the rates' share
    /// (unless it is kept), and with the thread count left to the pipeline the CPU lane leaves
    /// the GPU lane's host threads the cores they kept busy, or with a share following the
    /// rates their part of the cores they need ([`cpu_threads_beside`]); with most of the
    /// epoch's work its own, the CPU lane keeps every thread.
    pub fn observe(&mut self, activity: LaneActivity, working: usize) -> Option<Decision> {
        let observed = self.balance.observe(activity, working)?;
        let share = observed.moved.then(|| self.balance.share());
        let cpu_threads = self
            .cores
            .filter(|_| !self.cpu_bound)
            .map(|cores| {
                let extra = self.gpu.map_or(0, |g| g.extra_preparing_threads);
                cpu_threads_beside(
                    cores,
                    (observed.gpu_cores, observed.gpu_fraction),
                    self.threads,
                    (GPU_LANE_HOST_THREADS + extra, self.least_beside_gpu),
                )
            })
            .filter(|&beside| beside != working);
        Some(Decision { share, cpu_threads })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::super::share::MIN_WINDOW;
    use super::super::{DecodePlan, EpochSample, LaneChoice, WorkMix};
    use super::*;
    use crate::options::{Decode, DecodeOptions, Options};
    use crate::profile::Stopwatch;

    const KB: u64 = 1 << 10;

    /// The GPU lane's run and the policy `options` make for epochs of `images` files of `mean`
    /// bytes on `cores` cores.
    fn policy(
        options: Options,
        images: usize,
        mean: u64,
        cores: usize,
    ) -> (Option<GpuRun>, LanePolicy) {
        let plan = DecodePlan::new(&options);
        match plan.choose(images, || images as u64 * mean, cores, &Arc::default()) {
            LaneChoice::Ahead { gpu, policy, .. } => (gpu, *policy),
            LaneChoice::Cpu { why, .. } => panic!("the CPU lane alone: {why}"),
        }
    }

    /// A GPU lane's activity since it began: `decoded` and `refused` results, its preparing
    /// threads (three) and its assisted path's threads (four) each busy `busy` of `seconds`.
    fn activity(decoded: u64, refused: u64, busy: f64, seconds: f64) -> LaneActivity {
        LaneActivity {
            decoded,
            refused,
            preparing: Duration::from_secs_f64(3.0 * busy * seconds * 0.5),
            preparing_threads: 3,
            calls: [
                Duration::ZERO,
                Duration::from_secs_f64(4.0 * busy * seconds),
            ],
            call_threads: [0, 4],
            coefficients: Duration::ZERO,
        }
    }

    #[test]
    fn the_engines_open_beside_the_batches_before_them_with_a_given_share_or_not_at_all() {
        let hybrid = Options::default().decode(DecodeOptions::default().lanes(Decode::Hybrid));
        // A run of unknown length of ImageNet-sized files, the share following the rates: the
        // assisted path alone takes them...
        let (_, alone) = policy(hybrid, 8_192, 110 * KB, 16);
        assert!(!alone.opens_before_the_first_batch());
        assert_eq!(
            alone.engines_open(),
            EnginesOpen::Never("the assisted path alone decodes small files faster")
        );
        // ...unless it takes a part of them only, or the share has a floor (ranks sharing the
        // machine's cores): then the engines open beside the running batches.
        let part = hybrid.decode(hybrid.decode.assisted_share(0.75));
        let (_, open) = policy(part, 8_192, 110 * KB, 16);
        assert_eq!(open.engines_open(), EnginesOpen::BesideTheLane);
        let floored = hybrid.decode(hybrid.decode.ranks_on_machine(4));
        let (_, open) = policy(floored, 8_192, 110 * KB, 16);
        assert!(open.floor().is_some());
        assert_eq!(open.engines_open(), EnginesOpen::BesideTheLane);
        // A given share: the lane opens whole before the first batch.
        let given = hybrid.decode(hybrid.decode.gpu_share(Some(0.5)));
        let (_, open) = policy(given, 8_192, 110 * KB, 16);
        assert!(open.opens_before_the_first_batch());
        assert_eq!(open.engines_open(), EnginesOpen::BeforeTheLane);
        // One epoch of them (about 1.1 s of 16 cores) does not repay the engines: the assisted
        // path stands in for them; a given share still opens them before the first batch.
        let one = hybrid.decode(hybrid.decode.planned_epochs(Some(1)));
        let (run, short) = policy(one, 8_192, 110 * KB, 16);
        assert!(run.is_some_and(|run| run.short_run));
        assert_eq!(
            short.engines_open(),
            EnginesOpen::Never("the run ends before they could")
        );
        let given_one = one.decode(one.decode.gpu_share(Some(1.0)));
        assert_eq!(
            policy(given_one, 8_192, 110 * KB, 16).1.engines_open(),
            EnginesOpen::BeforeTheLane
        );
        // Camera photos the assisted path takes whole: never, the share given or not...
        for options in [hybrid, given] {
            let (run, photos) = policy(options, 2_048, 2_500 * KB, 16);
            assert!(run.is_some_and(|run| run.large_files));
            assert_eq!(
                photos.engines_open(),
                EnginesOpen::Never("the assisted path takes the epoch's large files")
            );
        }
        // ...unless it takes a part of them only.
        let part = hybrid.decode(hybrid.decode.assisted_share(0.5));
        assert_eq!(
            policy(part, 2_048, 2_500 * KB, 16).1.engines_open(),
            EnginesOpen::BesideTheLane
        );
    }

    #[test]
    fn the_gpu_lane_opens_before_the_first_batch_for_large_jpegs_it_takes_whole() {
        let auto = Options::default();
        // Camera photos, the share following the rates: the lane opens before the first batch,
        // the share still not given...
        let (_, photos) = policy(auto, 2_048, 2_500 * KB, 16);
        assert!(photos.opens_before_the_first_batch());
        assert!(!photos.is_pinned());
        // ...not for small files, which the CPU lane decodes while the device opens...
        let (_, small) = policy(auto, 8_192, 110 * KB, 16);
        assert!(!small.opens_before_the_first_batch());
        // ...nor where the assisted path takes a part of the photos only (the engines open
        // beside the lane for the rest)...
        let part = auto.decode(auto.decode.assisted_share(0.5));
        assert!(!policy(part, 2_048, 2_500 * KB, 16)
            .1
            .opens_before_the_first_batch());
        // ...nor where some of the work is of files only the CPU lane decodes.
        assert!(mixed(auto, 0).opens_before_the_first_batch());
        assert!(!mixed(auto, 100).opens_before_the_first_batch());
    }

    #[test]
    fn beside_a_gpu_lane_the_cpu_threads_yield_and_leave_it_its_cores() {
        let auto = Options::default();
        let (run, beside) = policy(auto, 8_192, 110 * KB, 16);
        assert_eq!(run.map(|run| run.coefficient_threads), Some(14));
        assert_eq!(beside.priority(), ThreadPriority::BelowTheGpuLane);
        assert_eq!(
            (
                beside.threads(),
                beside.working_threads(),
                beside.threads_without_gpu()
            ),
            (16, 14, 16)
        );
        // A thread count given is kept.
        let given = auto.runtime(auto.runtime.threads(8));
        let (_, kept) = policy(given, 8_192, 110 * KB, 16);
        assert_eq!((kept.threads(), kept.working_threads()), (8, 8));
        // Without a GPU lane (automatic decoding of a small epoch), every thread works, at the
        // priority of the thread that starts them.
        let (run, alone) = policy(auto, 100, 10 * KB, 16);
        assert!(run.is_none());
        assert_eq!(alone.priority(), ThreadPriority::Inherited);
        assert_eq!((alone.threads(), alone.working_threads()), (16, 16));
    }

    /// The policy `options` make on 16 cores for an epoch of 1,000 files of 500 kB, `pngs` of
    /// them PNGs and the rest JPEGs.
    fn mixed(options: Options, pngs: usize) -> LanePolicy {
        let names: Vec<String> = (0..1000)
            .map(|i| format!("{i}.{}", if i < pngs { "png" } else { "jpg" }))
            .collect();
        let mix = WorkMix::of(names.iter().map(|name| (name.as_str(), 500 * KB)));
        let sample = EpochSample {
            bytes: 1000 * 500 * KB,
            mix,
        };
        match DecodePlan::new(&options).choose(1000, || sample, 16, &Arc::default()) {
            LaneChoice::Ahead { policy, .. } => *policy,
            LaneChoice::Cpu { why, .. } => panic!("the CPU lane alone: {why}"),
        }
    }

    #[test]
    fn with_most_of_the_work_its_own_the_cpu_lane_keeps_every_thread_at_normal_priority() {
        let hybrid = Options::default().decode(DecodeOptions::default().lanes(Decode::Hybrid));
        // 60% PNGs (as much of the work): all 16 threads, at normal priority, kept when
        // the lanes' rates come in.
        let cpu_bound = mixed(hybrid, 600);
        assert_eq!(cpu_bound.priority(), ThreadPriority::Inherited);
        assert_eq!((cpu_bound.threads(), cpu_bound.working_threads()), (16, 16));
        // All JPEGs, or a few PNGs among them: today's numbers exactly, the same as an epoch
        // whose mix is unknown.
        for pngs in [0, 100] {
            let jpegs = mixed(hybrid, pngs);
            assert_eq!(jpegs.priority(), ThreadPriority::BelowTheGpuLane);
            assert_eq!((jpegs.threads(), jpegs.working_threads()), (16, 14));
        }
        let (_, unknown) = policy(hybrid, 1000, 500 * KB, 16);
        assert_eq!(unknown.priority(), ThreadPriority::BelowTheGpuLane);
        assert_eq!((unknown.threads(), unknown.working_threads()), (16, 14));
        // A thread count given is kept either way.
        let given = hybrid.runtime(hybrid.runtime.threads(8));
        assert_eq!(mixed(given, 600).working_threads(), 8);
        assert_eq!(mixed(given, 0).working_threads(), 8);
    }

    #[test]
    fn with_most_of_the_work_its_own_the_rates_move_no_cpu_thread_away() {
        let seconds = MIN_WINDOW.as_secs_f64() * 1.05;
        let decoded = (2000.0 * seconds) as u64;
        let hybrid = Options::default().decode(DecodeOptions::default().lanes(Decode::Hybrid));
        for pngs in [600, 0] {
            let mut policy = mixed(hybrid, pngs);
            policy.restart(LaneActivity::default());
            std::thread::sleep(MIN_WINDOW);
            let working = policy.working_threads();
            assert_eq!(
                policy.observe(activity(decoded, 0, 1.0, seconds), working),
                None
            );
            std::thread::sleep(MIN_WINDOW);
            let decision = policy
                .observe(activity(2 * decoded, 0, 1.0, 2.0 * seconds), working)
                .expect("a complete window");
            // 600 PNGs: every thread kept; JPEGs alone: threads left to the GPU lane's.
            match pngs {
                0 => assert!(
                    decision.cpu_threads.is_some_and(|t| t < working),
                    "{decision:?}"
                ),
                _ => assert_eq!(decision.cpu_threads, None),
            }
        }
    }

    #[test]
    fn the_lanes_rates_move_the_share_and_the_cpu_threads() {
        let seconds = MIN_WINDOW.as_secs_f64() * 1.05;
        let decoded = (2000.0 * seconds) as u64;
        let decide = |options: Options| {
            let stopwatch = Arc::new(Stopwatch::default());
            let plan = DecodePlan::new(&options);
            let images = 8_192;
            let LaneChoice::Ahead { mut policy, .. } =
                plan.choose(images, || images as u64 * 110 * KB, 16, &stopwatch)
            else {
                panic!("the lanes of a CUDA device work ahead");
            };
            policy.restart(LaneActivity::default());
            // The first window is the lane's warm-up: it only marks where the next begins.
            std::thread::sleep(MIN_WINDOW);
            assert_eq!(policy.observe(activity(decoded, 0, 1.0, seconds), 14), None);
            // Then the GPU lane fully busy at 2,000 images a second, the CPU lane's 14 threads
            // at the estimate of 2.2 ms an image (6,400 a second).
            std::thread::sleep(MIN_WINDOW);
            let decision = policy.observe(activity(2 * decoded, 0, 1.0, 2.0 * seconds), 14);
            (policy, decision.expect("a complete window"))
        };
        // Half way from every image towards about a quarter.
        let (following, decision) = decide(Options::default());
        let share = following.share();
        assert!(share > 0.55 && share < 0.7, "{share}");
        assert_eq!(decision.share, Some(share));
        // The GPU lane's host threads kept about 5.5 cores busy, and it decodes about 0.65 of
        // the images: the CPU lane leaves it its part of its 12 cores, eight of 16.
        assert_eq!(decision.cpu_threads, Some(8));
        // A given share is kept; a thread count given too.
        let given = Options::default().decode(DecodeOptions::default().gpu_share(Some(0.3)));
        let (kept, decision) = decide(given.runtime(given.runtime.threads(14)));
        assert_eq!((kept.share(), decision.share), (0.3, None));
        assert_eq!(decision.cpu_threads, None);
    }
}
