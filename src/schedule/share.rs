//! The share between the lanes in hybrid decoding: given and kept, or following the lanes'
//! measured rates.
//!
//! Each lane's rate is what it decodes per second of working: the CPU lane's images over its
//! threads' read, decode and resize time (divided among its threads), the GPU lane's images over
//! the time of its busiest kind of thread (preparing, or submitting on one path; a submitting
//! thread's time includes waiting for the device, so a lane bound by the device shows it). A
//! lane waiting for work does not count that time, so a rate holds whatever share the lane had
//! when it was measured. Of the images offered to the GPU lane it decodes a fraction and hands
//! the rest (CMYK files and the like) back to the CPU lane.
//!
//! Both lanes also draw on the same cores: the CPU lane a whole decode and resize an image, the
//! GPU lane its preparing and coefficient threads' time (reading, parsing, and a progressive
//! file's entropy decoding). And the one thread that puts the batches together copies each of
//! the CPU lane's images into the staging. The share is the one at which the lanes, together,
//! decode the most images a second within all four limits: the GPU lane's rate, the CPU lane's
//! threads, the cores, and that thread's copies ([`LaneRates::share`]). Where neither the cores
//! nor the copies are the limit, that is the share at which both lanes finish together,
//! `gpu / ((gpu + cpu) * fraction)`; where the cores are (camera photos, whose progressive
//! files take the coefficient threads' time), images move to the lane that costs the cores
//! less, and where the copies are (many CPU threads), to the GPU lane. The share moves towards
//! it after each window of measurements.
//!
//! The same windows say how many cores the GPU lane's host threads keep busy, which the CPU
//! lane leaves to them when the thread count is left to the pipeline
//! ([`cpu_threads_beside`](super::threads::cpu_threads_beside)).

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::profile::{Stage, Stopwatch};

/// Shares move in steps of 1/64.
const SHARE_STEPS: f32 = 64.0;

/// The share the GPU lane starts from once it is open, before the rates say more: every image.
/// The rates then take it down to the share at which both lanes finish together, a window at a
/// time. Started lower, the share climbed while the run was slower. On the H200 machine (16
/// cores, 8,192 ImageNet-sized files, in turn on one start), against a start at 0.75: one epoch
/// from process start to exit in 0.53-0.59 s against 0.61-0.64 s; four epochs (the assisted
/// path alone) at 39,500-40,000 images/s against 30,700-31,500; 16 epochs (the JPEG engines
/// joining) at 35,600-36,800 against 32,800-33,900, the later half the same (36,500-37,900:
/// the rates settle at 0.89-0.91 either way). The rates found 0.89-0.91 on baseline camera
/// photos too and 0.98-1.0 on a mix with progressive files; on large files the CPU lane's whole
/// decode costs the cores about twice the assisted path's work, and the cores are what they run
/// short of.
const INITIAL_SHARE: f32 = 1.0;

/// The part of its time the thread that puts the batches together may spend copying the CPU
/// lane's images into the staging: the rest goes to taking each image's result, queueing the
/// uploads and handing the batches out (about 10 µs an image on the 4-H200 machine). With 64
/// CPU threads beside the GPU lane, the rates alone moved the share to 0.41-0.47, the thread
/// spent half its time copying (32-36 µs an image) and hybrid decoding ran 0.66-0.82x as fast
/// as on 16 threads.
const BATCH_THREAD_COPYING: f64 = 0.5;

/// The batch thread's time copying an image is measured again once it copied this many.
const MIN_COPIED_IMAGES: u64 = 64;

/// A window of measurements lasts at least this long...
pub(super) const MIN_WINDOW: Duration = Duration::from_millis(250);

/// ...and until the GPU lane has published this many results in it (decoded or refused).
const MIN_GPU_RESULTS: u64 = 32;

/// The CPU lane's rate is measured again once it decoded this many images since it was last
/// measured (over as many windows as that takes, the warm-up and the images it decoded before
/// the GPU lane began included); until then the last rate measured (or the estimate it started
/// from) stands. Where the GPU lane takes nearly every image (large files) the CPU lane decodes
/// a few a window, and a rate left at the estimate (from the files' sizes: a third of a
/// progressive photo's cost) pulled the share down on its own.
const MIN_CPU_IMAGES: u64 = 8;

/// The share moves this fraction of the way to the share a window's rates call for: rates
/// measured at one share shift a little at another (the lanes share the host's cores and memory
/// bandwidth, and a lane just begun is still filling its pipeline), so the share closes in
/// rather than jumps.
const GAIN: f32 = 0.5;

/// The share between the lanes: given and kept, or following the lanes' rates.
#[derive(Debug)]
pub(crate) struct Balance {
    share: f32,
    pinned: bool,
    /// The least the share falls to.
    floor: Option<f32>,
    meter: RateMeter,
}

impl Balance {
    /// A given share, kept; or (`None`) one that starts at [`INITIAL_SHARE`] and follows the
    /// lanes' rates read from `stopwatch` (the CPU lane's times) and the GPU lane's activity,
    /// never below `floor`.
    /// `cpu_seconds_per_image` is the estimate of one image's time on one CPU thread that
    /// stands until the CPU lane has decoded enough images to be measured.
    /// `cores` is the machine's.
    pub fn new(
        given: Option<f32>,
        floor: Option<f32>,
        stopwatch: Arc<Stopwatch>,
        cpu_seconds_per_image: f64,
        cores: usize,
    ) -> Balance {
        Balance {
            share: given.unwrap_or(INITIAL_SHARE),
            pinned: given.is_some(),
            floor,
            meter: RateMeter::new(stopwatch, cpu_seconds_per_image, cores),
        }
    }

    /// The share in force.
    pub fn share(&self) -> f32 {
        self.share
    }

    /// Whether the share was given.
    pub fn is_pinned(&self) -> bool {
        self.pinned
    }

    /// The least the share following the rates falls to.
    pub fn floor(&self) -> Option<f32> {
        self.floor.filter(|_| !self.pinned)
    }

    /// Keeps `share` from now on.
    pub fn pin(&mut self, share: f32) {
        self.share = share;
        self.pinned = true;
    }

    /// Starts the measurements afresh from the GPU lane's `activity` now (when it begins to be
    /// offered images).
    pub fn restart(&mut self, activity: LaneActivity) {
        self.meter.restart(activity);
    }

    /// Takes the GPU lane's `activity` now, with `cpu_threads` of the CPU lane working: once a
    /// window is complete, the cores the GPU lane's host threads kept busy in it, and whether
    /// the share moved (towards the rates' share, unless it is pinned).
    pub fn observe(&mut self, activity: LaneActivity, cpu_threads: usize) -> Option<Observed> {
        let rates = self.meter.measure(activity, cpu_threads)?;
        let mut moved = false;
        if !self.pinned {
            let mut next = self.share;
            if let Some(target) = rates.share() {
                let toward = self.share + (target - self.share) * GAIN;
                next = (toward.clamp(0.0, 1.0) * SHARE_STEPS).round() / SHARE_STEPS;
            }
            // The floor holds from the start: until the engines join, the assisted path takes
            // the files in their place (with four ranks on the 4-H200 machine, 30,400-33,000
            // images/s a rank on small files, against 15,000-27,000 at the rates' share).
            if let Some(floor) = self.floor {
                next = next.max(floor);
            }
            moved = next != self.share;
            self.share = next;
        }
        // A given share leaves the CPU lane the threads its part needs.
        let gpu_fraction = match self.pinned {
            true => 0.0,
            false => f64::from(self.share) * rates.gpu_takes,
        };
        Some(Observed {
            moved,
            gpu_cores: rates.gpu_cores,
            gpu_fraction,
        })
    }
}

/// What a complete window of measurements said.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Observed {
    /// Whether the share moved.
    pub moved: bool,
    /// Cores the GPU lane's host threads kept busy (their working time over the window's).
    pub gpu_cores: f64,
    /// Of the images, the fraction the GPU lane decodes at the share now (0 where the share is
    /// given), for [`cpu_threads_beside`](super::threads::cpu_threads_beside).
    pub gpu_fraction: f64,
}

/// The lanes' rates over one window.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct LaneRates {
    /// The CPU lane's threads working.
    pub cpu_threads: f64,
    /// Images a second the GPU lane decodes with its busiest threads working; `None` if it did
    /// not decode in the window.
    pub gpu: Option<f64>,
    /// Of the images offered to the GPU lane, the fraction it decoded.
    pub gpu_takes: f64,
    /// Cores the GPU lane's host threads kept busy.
    pub gpu_cores: f64,
    /// Seconds of a core one image takes on the CPU lane...
    pub cpu_core_seconds: f64,
    /// ...and on the GPU lane's preparing and coefficient threads, per image it decoded.
    pub gpu_core_seconds: f64,
    /// The cores both lanes' threads share: the machine's, or more where the threads working
    /// outnumbered them in the window (their times then stretch alike, and so does this).
    pub cores: f64,
    /// Seconds the batch thread takes to copy one of the CPU lane's images into the staging
    /// (zero until measured).
    pub copy_seconds: f64,
}

impl LaneRates {
    /// Images a second the CPU lane decodes with its threads working.
    pub fn cpu(&self) -> f64 {
        self.cpu_threads / self.cpu_core_seconds.max(1e-6)
    }

    /// The share at which the lanes decode the most images a second: the GPU lane decodes
    /// `share * gpu_takes` of the images, the CPU lane the rest, each at most at its rate, both
    /// together at most the cores' seconds, and the CPU lane's at most what the batch thread
    /// copies in [`BATCH_THREAD_COPYING`] of its time. Of equal rates, the lowest share.
    pub fn share(&self) -> Option<f32> {
        let gpu = self.gpu?;
        let cpu = self.cpu();
        if self.gpu_takes <= 0.0 || gpu + cpu <= 0.0 {
            return None;
        }
        let rate = |share: f64| {
            let on_gpu = share * self.gpu_takes;
            let on_cpu = 1.0 - on_gpu;
            let limit = |rate: f64, fraction: f64| match fraction > 0.0 {
                true => rate / fraction,
                false => f64::INFINITY,
            };
            let core_seconds = on_cpu * self.cpu_core_seconds + on_gpu * self.gpu_core_seconds;
            let copies = match self.copy_seconds > 0.0 {
                true => limit(BATCH_THREAD_COPYING / self.copy_seconds, on_cpu),
                false => f64::INFINITY,
            };
            limit(gpu, on_gpu)
                .min(limit(cpu, on_cpu))
                .min(limit(self.cores, core_seconds))
                .min(copies)
        };
        let mut best = (0.0f32, rate(0.0));
        for step in 1..=SHARE_STEPS as u32 {
            let share = step as f32 / SHARE_STEPS;
            let images = rate(share as f64);
            if images > best.1 * (1.0 + 1e-9) {
                best = (share, images);
            }
        }
        Some(best.0)
    }
}

/// How busy the lane has been since it started, for the share between the lanes: what its
/// threads decoded and refused, and the time each kind of thread spent working (not waiting
/// for work), summed over its threads.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct LaneActivity {
    /// Offered positions decoded.
    pub decoded: u64,
    /// Offered positions refused (not for the lane's decoders, or failed there).
    pub refused: u64,
    /// The preparing threads' time reading and planning, and how many of them run.
    pub preparing: Duration,
    pub preparing_threads: usize,
    /// Each path's (the engines', then the assisted path's) submitting threads' time on calls,
    /// and how many of them run.
    pub calls: [Duration; 2],
    pub call_threads: [usize; 2],
    /// The coefficient threads' time decoding progressive files.
    pub coefficients: Duration,
}

/// Where a window began: the counters then.
#[derive(Debug, Clone, Copy)]
struct Mark {
    at: Instant,
    cpu_busy: Duration,
    cpu_images: u64,
    /// The batch thread's time copying the CPU lane's images, and the images copied.
    copying: (Duration, u64),
    gpu: LaneActivity,
}

/// The counters now: the CPU lane's times in `stopwatch`, the GPU lane's `gpu`.
fn mark(stopwatch: &Stopwatch, gpu: LaneActivity) -> Mark {
    let busy = [Stage::CpuRead, Stage::CpuDecode, Stage::CpuResize]
        .iter()
        .map(|&stage| stopwatch.total(stage))
        .sum();
    Mark {
        at: Instant::now(),
        cpu_busy: busy,
        cpu_images: stopwatch.count(Stage::CpuDecode),
        copying: (
            stopwatch.total(Stage::StagingCopy),
            stopwatch.count(Stage::StagingCopy),
        ),
        gpu,
    }
}

/// Measures the lanes' rates over windows of at least [`MIN_WINDOW`]. The first window after
/// the GPU lane begins is its warm-up (its threads' first calls, buffers growing, the CPU lane
/// finishing what it had looked at) and only marks where the next one starts.
#[derive(Debug)]
struct RateMeter {
    stopwatch: Arc<Stopwatch>,
    /// Where the current window began.
    start: Mark,
    /// Whether the current window is the warm-up.
    warming_up: bool,
    /// The CPU lane's time for one image on one thread: estimated, then measured.
    cpu: PerImage,
    /// The batch thread's time copying one of the CPU lane's images: zero, then measured.
    copies: PerImage,
    /// The machine's cores.
    cores: usize,
}

/// A time an image, measured over at least a number of images, however many windows they take;
/// until then the last one measured (or the value it started from) stands.
#[derive(Debug)]
struct PerImage {
    seconds: f64,
    /// Images it is measured over, at least.
    min_images: u64,
    /// The time and images added since it was last measured.
    unmeasured: (Duration, u64),
}

impl PerImage {
    fn new(seconds: f64, min_images: u64) -> PerImage {
        PerImage {
            seconds,
            min_images,
            unmeasured: (Duration::ZERO, 0),
        }
    }

    /// Adds `time` spent on `images`, and measures once the images reach the minimum.
    fn add(&mut self, time: Duration, images: u64) {
        let (total, counted) = &mut self.unmeasured;
        *total += time;
        *counted += images;
        if *counted >= self.min_images && !total.is_zero() {
            self.seconds = total.as_secs_f64() / *counted as f64;
            self.unmeasured = (Duration::ZERO, 0);
        }
    }
}

impl RateMeter {
    fn new(stopwatch: Arc<Stopwatch>, cpu_seconds_per_image: f64, cores: usize) -> RateMeter {
        RateMeter {
            start: mark(&stopwatch, LaneActivity::default()),
            stopwatch,
            warming_up: true,
            cpu: PerImage::new(cpu_seconds_per_image, MIN_CPU_IMAGES),
            copies: PerImage::new(0.0, MIN_COPIED_IMAGES),
            cores,
        }
    }

    fn restart(&mut self, gpu: LaneActivity) {
        let now = mark(&self.stopwatch, gpu);
        self.measure_costs(&now);
        self.start = now;
        self.warming_up = true;
    }

    /// Adds the CPU lane's work and the batch thread's copies from the window's start to `now`
    /// to their times an image ([`MIN_CPU_IMAGES`] and [`MIN_COPIED_IMAGES`] at least).
    fn measure_costs(&mut self, now: &Mark) {
        self.cpu.add(
            now.cpu_busy.saturating_sub(self.start.cpu_busy),
            now.cpu_images.saturating_sub(self.start.cpu_images),
        );
        self.copies.add(
            now.copying.0.saturating_sub(self.start.copying.0),
            now.copying.1.saturating_sub(self.start.copying.1),
        );
    }

    /// The rates since the window began, once it is complete (a new one then begins); the CPU
    /// lane had `cpu_threads` threads working.
    fn measure(&mut self, gpu: LaneActivity, cpu_threads: usize) -> Option<LaneRates> {
        let (start, now) = (self.start, mark(&self.stopwatch, gpu));
        let window = now.at.duration_since(start.at);
        let decoded = now.gpu.decoded.saturating_sub(start.gpu.decoded);
        let refused = now.gpu.refused.saturating_sub(start.gpu.refused);
        if window < MIN_WINDOW || decoded + refused < MIN_GPU_RESULTS {
            return None;
        }
        self.measure_costs(&now);
        self.start = now;
        if std::mem::take(&mut self.warming_up) {
            return None;
        }
        let cpu_busy = now.cpu_busy.saturating_sub(start.cpu_busy);
        let seconds = window.as_secs_f64();
        let preparing = now.gpu.preparing.saturating_sub(start.gpu.preparing);
        let calls = [0, 1].map(|p| now.gpu.calls[p].saturating_sub(start.gpu.calls[p]));
        // The busiest kind of thread: the fraction of the window its threads worked.
        let busy = |time: Duration, threads: usize| match threads {
            0 => 0.0,
            n => time.as_secs_f64() / (n as f64 * seconds),
        };
        let busiest = [
            busy(preparing, now.gpu.preparing_threads),
            busy(calls[0], now.gpu.call_threads[0]),
            busy(calls[1], now.gpu.call_threads[1]),
        ]
        .into_iter()
        .fold(0.0f64, f64::max);
        let gpu = (decoded > 0 && busiest > 0.0).then(|| decoded as f64 / (busiest * seconds));
        let gpu_work = preparing + calls[0] + calls[1];
        let coefficients = now.gpu.coefficients.saturating_sub(start.gpu.coefficients);
        let gpu_host = preparing + coefficients;
        let working = (cpu_busy + gpu_host).as_secs_f64() / seconds;
        Some(LaneRates {
            cpu_threads: cpu_threads.max(1) as f64,
            gpu,
            gpu_takes: decoded as f64 / (decoded + refused) as f64,
            gpu_cores: gpu_work.as_secs_f64() / seconds,
            cpu_core_seconds: self.cpu.seconds,
            gpu_core_seconds: gpu_host.as_secs_f64() / decoded.max(1) as f64,
            cores: working.max(self.cores.max(1) as f64),
            copy_seconds: self.copies.seconds,
        })
    }
}

#[cfg(test)]
#[cfg(test)]
mod tests {
    use super::*;

    /// Rates where the cores are not the limit.
    fn rates(cpu: f64, gpu: f64, gpu_takes: f64) -> LaneRates {
        LaneRates {
            cpu_threads: cpu * 0.01,
            gpu: Some(gpu),
            gpu_takes,
            gpu_cores: 0.0,
            cpu_core_seconds: 0.01,
            gpu_core_seconds: 0.001,
            cores: 1e9,
            copy_seconds: 0.0,
        }
    }

    #[test]
    fn the_rates_share_lets_both_lanes_finish_together() {
        // Three times the CPU lane's rate: three quarters of the images.
        let share = rates(1000.0, 3000.0, 1.0).share().unwrap();
        assert!((share - 0.75).abs() < 1e-6);
        // A GPU lane that hands a fifth back is offered more to decode as much.
        let share = rates(1000.0, 3000.0, 0.8).share().unwrap();
        assert!((share - 0.9375).abs() < 1e-6);
        // Never past every image, never below none; no share without a GPU rate.
        assert_eq!(rates(100.0, 3000.0, 0.5).share(), Some(1.0));
        assert_eq!(rates(1000.0, 0.0, 1.0).share(), Some(0.0));
        let none = LaneRates {
            gpu: None,
            ..rates(1.0, 1.0, 1.0)
        };
        assert_eq!(none.share(), None);
        assert_eq!(rates(1000.0, 3000.0, 0.0).share(), None);
    }

    #[test]
    fn the_batch_threads_copies_hold_the_cpu_lanes_part_down() {
        // 64 CPU threads at 1.6 ms an image (40,000 a second) beside a GPU lane of 28,000: the
        // rates alone give the CPU lane 59% of the images...
        let many_threads = LaneRates {
            cpu_threads: 64.0,
            gpu: Some(28_000.0),
            gpu_takes: 1.0,
            gpu_cores: 4.0,
            cpu_core_seconds: 0.0016,
            gpu_core_seconds: 0.0002,
            cores: 1e9,
            copy_seconds: 0.0,
        };
        let rates_alone = many_threads.share().unwrap();
        assert!((rates_alone - 0.41).abs() < 0.02, "{rates_alone}");
        // ...more than the batch thread copies in a second at 34 µs an image. Held to half of
        // its time, the copies leave the CPU lane about a third.
        let copying = LaneRates {
            copy_seconds: 34e-6,
            ..many_threads
        };
        let share = copying.share().unwrap();
        assert!((share - 0.656).abs() < 0.02, "{share}");
        // On 16 threads (27 µs a copy) the copies are no limit.
        let sixteen = LaneRates {
            cpu_threads: 16.0,
            cpu_core_seconds: 0.00125,
            copy_seconds: 27e-6,
            ..many_threads
        };
        let uncounted = LaneRates {
            copy_seconds: 0.0,
            ..sixteen
        };
        assert_eq!(sixteen.share(), uncounted.share());
    }

    #[test]
    fn where_the_cores_are_the_limit_images_move_to_the_lane_that_costs_them_less() {
        // Camera photos, a fifth of them progressive: the CPU lane's 13 threads at 53 ms an
        // image; the GPU lane at 1,000 images a second, 13 ms of its preparing and coefficient
        // threads an image; 16 cores.
        let photos = LaneRates {
            cpu_threads: 13.0,
            gpu: Some(1000.0),
            gpu_takes: 1.0,
            gpu_cores: 3.0,
            cpu_core_seconds: 0.053,
            gpu_core_seconds: 0.013,
            cores: 16.0,
            copy_seconds: 0.0,
        };
        // Without the cores, the lanes would finish together at 0.80...
        let unbounded = LaneRates {
            cores: 1e9,
            ..photos
        };
        let together = unbounded.share().unwrap();
        assert!((together - 0.80).abs() < 0.02, "{together}");
        // ...where the cores would allow 16 / (0.2 * 0.053 + 0.8 * 0.013) = 762 images a
        // second; more of the images on the GPU lane, up to its rate, make more of them.
        let share = photos.share().unwrap();
        assert!(share > 0.95 && share < 1.0, "{share}");
        // A GPU lane that costs the cores more than the CPU lane gets no more than its rate
        // allows beside the CPU lane's threads.
        let costly = LaneRates {
            gpu_core_seconds: 0.1,
            ..photos
        };
        assert!(costly.share().unwrap() <= together, "{costly:?}");
        // On small files the cores are not the limit and the share is the lanes' own.
        let small = LaneRates {
            cpu_threads: 12.0,
            gpu: Some(22_000.0),
            gpu_takes: 1.0,
            gpu_cores: 4.0,
            cpu_core_seconds: 0.0017,
            gpu_core_seconds: 0.0002,
            cores: 16.0,
            copy_seconds: 0.0,
        };
        let own = LaneRates {
            cores: 1e9,
            ..small
        };
        assert_eq!(small.share(), own.share());
    }

    /// A GPU lane's activity: `decoded` and `refused` results, its preparing threads (three)
    /// and its assisted path's threads (four) each busy `busy` of `seconds`.
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
    fn a_window_measures_the_lanes_rates_and_the_gpu_lanes_cores() {
        let stopwatch = Arc::new(Stopwatch::default());
        let mut meter = RateMeter::new(stopwatch.clone(), 0.01, 16);
        meter.restart(LaneActivity::default());
        // Too soon: no rates.
        assert!(meter.measure(activity(100, 0, 0.5, 0.0), 8).is_none());
        // The warm-up: no rates either, whatever it saw; the CPU lane's images in it (8 at 30
        // ms) measure its time for an image.
        std::thread::sleep(MIN_WINDOW);
        for _ in 0..8 {
            stopwatch.add(Stage::CpuDecode, Duration::from_millis(30));
        }
        let warm_up = LaneActivity {
            decoded: 100,
            ..LaneActivity::default()
        };
        assert!(meter.measure(warm_up, 8).is_none());
        assert!((meter.cpu.seconds - 0.03).abs() < 1e-9);
        std::thread::sleep(MIN_WINDOW);
        // 40 images on the CPU lane at 20 ms of a thread each.
        for _ in 0..40 {
            stopwatch.add(Stage::CpuDecode, Duration::from_millis(15));
            stopwatch.add(Stage::CpuResize, Duration::from_millis(5));
        }
        let seconds = MIN_WINDOW.as_secs_f64();
        let rates = meter
            .measure(activity(500, 100, 0.5, seconds), 8)
            .expect("a complete window");
        // 8 threads at 20 ms an image.
        assert!((rates.cpu() - 400.0).abs() < 1e-6, "{rates:?}");
        // The assisted threads were the busiest: half the time. The window ran a little past
        // MIN_WINDOW, so a little under 400 / (0.5 * seconds).
        let gpu = rates.gpu.expect("a GPU rate");
        let most = 400.0 / (0.5 * seconds);
        assert!(gpu <= most + 1e-6 && gpu > 0.8 * most, "{gpu} {most}");
        assert!((rates.gpu_takes - 0.8).abs() < 1e-9);
        // Preparing threads three quarters of a core's worth, submitting ones two cores'.
        assert!(
            rates.gpu_cores > 2.3 && rates.gpu_cores <= 2.75 + 1e-6,
            "{rates:?}"
        );
        // The host's cost of an image on each lane: 20 ms of a CPU thread; the preparing
        // threads' 0.75 * seconds over the 400 images the GPU lane decoded. Fewer threads worked
        // than there are cores: the machine's 16.
        assert!((rates.cpu_core_seconds - 0.02).abs() < 1e-9, "{rates:?}");
        let preparing = 0.75 * seconds / 400.0;
        assert!(
            (rates.gpu_core_seconds - preparing).abs() < 1e-9,
            "{rates:?}"
        );
        assert_eq!(rates.cores, 16.0);
        // A window without CPU images keeps the CPU lane's last rate (per thread). The
        // coefficient threads' time counts with the preparing threads'; 30 threads' worth
        // working outnumber the cores, which count as many.
        std::thread::sleep(MIN_WINDOW);
        let mut next = activity(900, 200, 0.5, 2.0 * seconds);
        next.coefficients = Duration::from_secs_f64(30.0 * MIN_WINDOW.as_secs_f64());
        let later = meter.measure(next, 4).unwrap();
        assert!((later.cpu() - 200.0).abs() < 1e-6, "{later:?}");
        let preparing = 0.75 * seconds;
        let coefficients = 30.0 * MIN_WINDOW.as_secs_f64();
        assert!(
            (later.gpu_core_seconds - (preparing + coefficients) / 400.0).abs() < 1e-9,
            "{later:?}"
        );
        assert!(later.cores > 16.0 && later.cores <= 30.0 + 1.5, "{later:?}");
    }

    /// Where the CPU lane decodes a few images a window (the GPU lane taking nearly all of
    /// them), its time for an image is measured over as many windows as it takes to decode
    /// [`MIN_CPU_IMAGES`], counting those it decoded before the GPU lane began.
    #[test]
    fn the_cpu_lanes_time_for_an_image_is_measured_across_windows() {
        let stopwatch = Arc::new(Stopwatch::default());
        let mut meter = RateMeter::new(stopwatch.clone(), 0.02, 16);
        // Before the GPU lane begins: 3 images at 60 ms.
        for _ in 0..3 {
            stopwatch.add(Stage::CpuDecode, Duration::from_millis(60));
        }
        meter.restart(LaneActivity::default());
        assert_eq!(meter.cpu.seconds, 0.02, "3 images are too few");
        let seconds = MIN_WINDOW.as_secs_f64();
        let mut results = 0;
        for window in 0..3 {
            std::thread::sleep(MIN_WINDOW);
            for _ in 0..2 {
                stopwatch.add(Stage::CpuDecode, Duration::from_millis(50));
                stopwatch.add(Stage::CpuResize, Duration::from_millis(10));
            }
            // The batch thread copies 40 images a window, 30 µs each.
            stopwatch.add_many(Stage::StagingCopy, Duration::from_micros(1200), 40);
            results += 100;
            let rates = meter.measure(activity(results, 0, 0.5, seconds * (window + 1) as f64), 8);
            // 3 + 2, 3 + 4, then 3 + 6 images: measured at the ninth.
            let want = match window {
                2 => 0.06,
                _ => 0.02,
            };
            assert!(
                (meter.cpu.seconds - want).abs() < 1e-9,
                "window {window}: {}",
                meter.cpu.seconds
            );
            // The copies are measured once 64 are in: from the second window on.
            let copy = match window {
                0 => 0.0,
                _ => 30e-6,
            };
            assert!(
                (meter.copies.seconds - copy).abs() < 1e-12,
                "window {window}: {}",
                meter.copies.seconds
            );
            if let Some(rates) = rates {
                assert_eq!(rates.copy_seconds, meter.copies.seconds);
            }
        }
    }

    #[test]
    fn the_share_closes_in_on_the_rates_share_and_a_given_one_is_kept() {
        let stopwatch = Arc::new(Stopwatch::default());
        let mut balance = Balance::new(None, None, stopwatch.clone(), 0.02, 16);
        assert_eq!(balance.share(), INITIAL_SHARE);
        assert_eq!(INITIAL_SHARE, 1.0, "every image to the GPU lane at first");
        balance.restart(LaneActivity::default());
        std::thread::sleep(MIN_WINDOW);
        assert!(balance.observe(activity(100, 0, 0.01, 1.0), 4).is_none());
        assert_eq!(balance.share(), INITIAL_SHARE);
        balance.restart(LaneActivity::default());
        balance.meter.warming_up = false;
        std::thread::sleep(MIN_WINDOW);
        // The GPU lane fully busy at 2,000 images a second, the CPU lane estimated at 50 a
        // thread with 4 threads: 2000 / 2200 of the images, half way from 1.
        let seconds = MIN_WINDOW.as_secs_f64() * 1.05;
        let observed = balance
            .observe(activity((2000.0 * seconds) as u64, 0, 1.0, seconds), 4)
            .expect("a complete window");
        assert!(observed.moved);
        let first = balance.share();
        assert_eq!((first * SHARE_STEPS).fract(), 0.0);
        assert!(first > 0.94 && first < 0.97, "{first}");
        // Then a GPU lane half as fast: down again, half way to 1000 / 1200.
        std::thread::sleep(MIN_WINDOW);
        let decoded = (2000.0 * seconds) as u64;
        balance.observe(activity(2 * decoded, 0, 1.0, 3.0 * seconds), 4);
        let second = balance.share();
        assert!(second > 0.87 && second < 0.91, "{first} {second}");
        // Then towards a GPU lane handing half its images back (share 1).
        std::thread::sleep(MIN_WINDOW);
        balance.observe(activity(4 * decoded, decoded, 1.0, 4.0 * seconds), 4);
        let third = balance.share();
        assert!(third > second && third < 1.0, "{second} {third}");

        let mut pinned = Balance::new(Some(0.3), None, stopwatch, 0.02, 16);
        pinned.restart(LaneActivity::default());
        pinned.meter.warming_up = false;
        std::thread::sleep(MIN_WINDOW);
        let observed = pinned.observe(activity(1000, 0, 1.0, seconds), 4).unwrap();
        assert!(!observed.moved);
        assert_eq!(pinned.share(), 0.3);
        assert!(pinned.is_pinned());
    }

    /// A floor holds the share up from the start, before the engines join as after, where the
    /// rates alone would take it lower; the rates may still take it above the floor.
    #[test]
    fn a_floor_holds_the_share_from_the_start() {
        let stopwatch = Arc::new(Stopwatch::default());
        let mut balance = Balance::new(None, Some(0.9), stopwatch.clone(), 0.02, 16);
        let mut without = Balance::new(None, None, stopwatch, 0.02, 16);
        assert_eq!(balance.share(), INITIAL_SHARE);
        assert_eq!(without.share(), INITIAL_SHARE);
        for balance in [&mut balance, &mut without] {
            balance.restart(LaneActivity::default());
            balance.meter.warming_up = false;
        }
        let seconds = MIN_WINDOW.as_secs_f64() * 1.05;
        // The GPU lane at 500 images a second, the CPU lane's 4 threads at 200.
        let decoded = (500.0 * seconds) as u64;
        // The assisted path alone, at rates that call for about 0.71: half way there without a
        // floor, the floor with one.
        std::thread::sleep(MIN_WINDOW);
        balance.observe(activity(decoded, 0, 1.0, seconds), 4);
        without.observe(activity(decoded, 0, 1.0, seconds), 4);
        let rates = without.share();
        assert!(rates > 0.84 && rates < 0.87, "{rates}");
        assert_eq!(balance.share(), 0.9);
        // The engines joined, the rates the same: still the floor.
        let engines = |mut activity: LaneActivity| {
            activity.call_threads[0] = 2;
            activity
        };
        std::thread::sleep(MIN_WINDOW);
        balance
            .observe(engines(activity(2 * decoded, 0, 1.0, 2.0 * seconds)), 4)
            .expect("a complete window");
        assert_eq!(balance.share(), 0.9);
        // Rates calling for more than the floor (half the images handed back) move it higher.
        std::thread::sleep(MIN_WINDOW);
        balance.observe(
            engines(activity(4 * decoded, decoded, 1.0, 3.0 * seconds)),
            4,
        );
        assert!(balance.share() > 0.9, "{}", balance.share());
    }
}
