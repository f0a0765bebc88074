//! Hybrid decoding: the CPU threads and the GPU's JPEG engines fill the same batch.
//!
//! Each image of a batch is offered to the GPU lane or not by a rule that depends only on its
//! source index and the lane's share ([`Balance`]), so the same settings put the same images on
//! the same lane on every run. The GPU lane reads the files it is offered (on the CPU lane's
//! threads, in parallel), keeps the baseline JPEGs its engines decode and hands every other image
//! back to the CPU lane's queue while the CPU threads are already at work; an image the engines
//! fail on goes back the same way, so nothing is lost. Each image keeps its place in the batch
//! whichever lane decodes it. Refills after bad images run on the CPU lane.
//!
//! The share is measured before the first batch unless given: both lanes' throughputs on the
//! first batch's images (decoded twice and dropped: a warm-up, then the measurement) decide how
//! much the GPU lane takes, so that neither waits on the other; every batch is then made with
//! that share, which the pipeline reports, so a run given it back decodes every image in the
//! same lane.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::CudaStream;
use rayon::prelude::*;

use super::output::HybridParts;
use crate::cpu::{BatchRequest, CpuLane, Filled, JobQueue};
use crate::cuda::{JpegLane, LaneImage, PlannedImages, Screened};
use crate::error::Result;
use crate::source::Source;

/// How many images each lane decoded.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct DecodedBy {
    pub cpu: usize,
    pub gpu: usize,
}

/// The GPU lane's share of the images it can take.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Balance {
    /// The share in force; `None` until measured.
    share: Option<f32>,
}

/// The share the first batch runs with, while both lanes are measured.
const PROBE_SHARE: f32 = 0.5;

/// Shares are kept in steps of 1/64, so measuring twice on one machine usually lands on one.
const SHARE_STEPS: f32 = 64.0;

impl Balance {
    /// A given share, or one to measure (`None`).
    pub fn new(share: Option<f32>) -> Balance {
        Balance { share }
    }

    /// The share in force, once known.
    pub fn share(&self) -> Option<f32> {
        self.share
    }

    /// Whether image `index` is offered to the GPU lane under `share`: a hash of the index
    /// below the share, so the offered images are spread evenly and fixed by the index alone.
    fn offered(index: usize, share: f32) -> bool {
        let mut z = (index as u64).wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        ((z >> 40) as f32) < share * (1u64 << 24) as f32
    }

    /// Sets the share from one batch's measurement: images and seconds of each lane. The GPU
    /// lane's share of what it was offered becomes what makes both lanes finish together.
    fn measured(&mut self, cpu: (usize, f64), gpu: (usize, f64), offered_to_gpu: usize) {
        let rate = |(n, s): (usize, f64)| if s > 0.0 { n as f64 / s } else { 0.0 };
        let (cpu_rate, gpu_rate) = (rate(cpu), rate(gpu));
        let total = cpu.0 + gpu.0;
        if total == 0 || cpu_rate + gpu_rate <= 0.0 {
            self.share = Some(PROBE_SHARE);
            return;
        }
        // Of `total` images, the GPU lane should decode gpu_rate / (cpu_rate + gpu_rate); it
        // takes about `gpu.0 / offered` of what it is offered, and is offered `share` of all.
        let wanted = gpu_rate / (cpu_rate + gpu_rate) * total as f64;
        let taken_per_offered = gpu.0 as f64 / offered_to_gpu.max(1) as f64;
        let share = if taken_per_offered > 0.0 {
            wanted / taken_per_offered / total as f64
        } else {
            0.0
        };
        let stepped = (share.clamp(0.0, 1.0) as f32 * SHARE_STEPS).round() / SHARE_STEPS;
        self.share = Some(stepped);
    }
}

/// A batch both lanes filled: the staging holds the CPU lane's images, `from_gpu` the GPU lane's
/// with their places.
pub(crate) struct HybridFilled {
    pub filled: Filled,
    pub from_gpu: PlannedImages,
    pub decoded_by: DecodedBy,
}

/// Fills a batch with both lanes (see the module's description). `Ok(None)` if `stop` was
/// raised meanwhile.
pub(crate) fn fill(
    cpu: &CpuLane,
    parts: HybridParts<'_>,
    request: &BatchRequest<'_>,
    source: &Source,
    stop: &AtomicBool,
    balance: &mut Balance,
    max_file_bytes: u64,
) -> Result<Option<HybridFilled>> {
    let HybridParts {
        mut staging,
        lane,
        stream,
    } = parts;
    let take = request.batch_size.min(request.order.len());
    let chunk = &request.order[..take];
    let round = Round {
        cpu,
        chunk,
        epoch: request.epoch,
        source,
        stop,
        max_file_bytes,
    };
    if balance.share.is_none() {
        // The share is measured once, before any batch is made: this batch's images go through
        // both lanes twice (the first pass warms them up) and the results are dropped, so every
        // batch, this one too, is made with the share the pipeline reports.
        round.run(&mut staging, lane, stream, PROBE_SHARE, false)?;
        let probe = round.run(&mut staging, lane, stream, PROBE_SHARE, true)?;
        balance.measured(probe.cpu_time, probe.gpu_time, probe.offered);
    }
    let share = balance.share.unwrap_or(PROBE_SHARE);
    let outcome = round.run(&mut staging, lane, stream, share, false)?;
    let outcome = (outcome.cpu_done, outcome.decoded);
    let (cpu_done, decoded) = outcome;
    // Every place of the round, in order: the CPU lane's outcome or the GPU lane's image.
    let mut cpu_outcomes: Vec<Option<crate::cpu::Outcome>> = (0..take).map(|_| None).collect();
    for (k, outcome) in cpu_done {
        cpu_outcomes[k] = Some(outcome);
    }
    let mut gpu_images: Vec<Option<LaneImage>> = vec![None; take];
    for (k, image) in decoded {
        gpu_images[k] = Some(image);
    }
    let image_bytes = cpu.image_bytes();
    let mut filled = Filled::default();
    let mut from_gpu = Vec::new();
    let mut good = 0;
    for k in 0..take {
        if let Some(image) = gpu_images[k] {
            from_gpu.push((image, good));
            filled.indices.push(chunk[k]);
            good += 1;
            continue;
        }
        let Some(Some(outcome)) = cpu_outcomes[k].take() else {
            // Not tried: the pipeline is stopping.
            return Ok(None);
        };
        if filled.record(chunk[k], outcome, source, request.on_error)? {
            if k != good {
                staging.move_image(k, good, image_bytes);
            }
            good += 1;
        }
    }
    filled.consumed = take;
    let gpu = from_gpu.len();
    // The GPU resize's plan, made on the lane's threads (they are idle until the next round).
    let planner = lane.planner();
    let from_gpu = cpu.install(|| planner.plan(&from_gpu))?;
    // Places left by bad images are refilled from the rest of the order, on the CPU lane.
    let Some(filled) = cpu.fill_after(&mut staging, request, source, stop, filled)? else {
        return Ok(None);
    };
    let decoded_by = DecodedBy {
        cpu: filled.indices.len() - gpu,
        gpu,
    };
    Ok(Some(HybridFilled {
        filled,
        from_gpu,
        decoded_by,
    }))
}

/// One pass of a batch's images through both lanes.
struct Round<'r> {
    cpu: &'r CpuLane,
    chunk: &'r [usize],
    epoch: u64,
    source: &'r Source,
    stop: &'r AtomicBool,
    max_file_bytes: u64,
}

/// What a [`Round`] made: each lane's images (by their place `k`), and how long each took.
struct RoundOutcome {
    cpu_done: Vec<(usize, crate::cpu::Outcome)>,
    decoded: Vec<(usize, LaneImage)>,
    /// Images the CPU lane prepared and seconds it took.
    cpu_time: (usize, f64),
    /// Images the GPU lane decoded and seconds until its engines were done (when measured).
    gpu_time: (usize, f64),
    /// Images offered to the GPU lane.
    offered: usize,
}

impl Round<'_> {
    /// Runs the images of the round through both lanes with the GPU lane's `share`; with
    /// `measure`, waits for the engines so the GPU lane's time is theirs.
    fn run(
        &self,
        staging: &mut crate::cpu::Staging<'_>,
        lane: &mut JpegLane,
        stream: &Arc<CudaStream>,
        share: f32,
        measure: bool,
    ) -> Result<RoundOutcome> {
        let Round {
            cpu,
            chunk,
            epoch,
            source,
            stop,
            max_file_bytes,
        } = *self;
        let started = Instant::now();
        let jobs = cpu.jobs(staging, 0, chunk.len());
        let (offered, kept): (Vec<_>, Vec<_>) = jobs
            .into_iter()
            .partition(|job| Balance::offered(chunk[job.k], share));
        // The offered files, read and screened on the lane's threads.
        let screen = lane.screen().clone();
        let bytes: Vec<Option<(Vec<u8>, Screened)>> = cpu.install(|| {
            offered
                .par_iter()
                .map(|job| {
                    let data = read_whole(source, chunk[job.k], max_file_bytes)?;
                    let screened = screen.take(&data)?;
                    Some((data, screened))
                })
                .collect()
        });
        let offered_count = offered.len();
        let queue = JobQueue::new(kept, chunk, source);
        let (cpu_side, decoded, gpu_seconds) = std::thread::scope(|scope| {
            let cpu_side = scope.spawn(|| {
                let done = cpu.install(|| cpu.run_queue(&queue, chunk, epoch, source, stop));
                (done, started.elapsed().as_secs_f64())
            });
            let decoded = gpu_side(lane, stream, offered, bytes, &queue);
            queue.close();
            if measure {
                // The engines' work must be done to count.
                let _ = stream.synchronize();
            }
            let gpu_seconds = started.elapsed().as_secs_f64();
            (cpu_side.join(), decoded, gpu_seconds)
        });
        let Ok((cpu_done, cpu_seconds)) = cpu_side else {
            return Err(crate::Error::Worker("a CPU lane thread panicked".into()));
        };
        Ok(RoundOutcome {
            cpu_time: (cpu_done.len(), cpu_seconds),
            gpu_time: (decoded.len(), gpu_seconds),
            offered: offered_count,
            cpu_done,
            decoded,
        })
    }
}

/// The GPU lane's part of a round: keeps the offered images its engines take, queues their
/// decode, and hands every other one (not a baseline JPEG, unreadable, refused, failed) back to
/// the CPU lane through `queue`. Returns the decoded images by their place `k`.
fn gpu_side<'a>(
    lane: &mut JpegLane,
    stream: &Arc<CudaStream>,
    offered: Vec<crate::cpu::Job<'a>>,
    bytes: Vec<Option<(Vec<u8>, Screened)>>,
    queue: &JobQueue<'a>,
) -> Vec<(usize, LaneImage)> {
    let mut accepted = Vec::with_capacity(offered.len());
    for (job, data) in offered.into_iter().zip(bytes) {
        match data {
            Some(data) => accepted.push((job, data)),
            None => queue.push(job),
        }
    }
    if accepted.is_empty() {
        return Vec::new();
    }
    let jpegs: Vec<(&[u8], Screened)> = accepted
        .iter()
        .map(|(_, (data, screened))| (data.as_slice(), *screened))
        .collect();
    let outcomes = lane.decode(stream, &jpegs);
    drop(jpegs);
    let mut decoded = Vec::with_capacity(accepted.len());
    // Images the engines refused or failed on go to the CPU lane.
    for ((job, _), outcome) in accepted.into_iter().zip(outcomes) {
        match outcome {
            Some(image) => decoded.push((job.k, image)),
            None => queue.push(job),
        }
    }
    decoded
}

/// The bytes of image `index` when it is a file the GPU lane may take (read whole, at most
/// `max_bytes`); `None` hands it to the CPU lane, which reports any problem with it.
fn read_whole(source: &Source, index: usize, max_bytes: u64) -> Option<Vec<u8>> {
    let item = source.item(index).open(max_bytes).ok()?;
    if !item.head().starts_with(&[0xFF, 0xD8, 0xFF]) {
        return None;
    }
    item.read(Vec::new()).ok().map(|bytes| bytes.into_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_offer_depends_on_the_index_and_the_share_alone() {
        let offered = |share| {
            (0..10_000)
                .filter(|&i| Balance::offered(i, share))
                .collect::<Vec<_>>()
        };
        assert_eq!(offered(0.3), offered(0.3));
        assert!(offered(0.0).is_empty());
        assert_eq!(offered(1.0).len(), 10_000);
        let n = offered(0.3).len();
        assert!((2_800..3_200).contains(&n), "{n}");
        // A larger share offers a superset.
        let small = offered(0.3);
        let large = offered(0.6);
        assert!(small.iter().all(|i| large.contains(i)));
    }

    #[test]
    fn the_faster_lane_takes_more() {
        let mut b = Balance::new(None);
        // The GPU lane decoded all 128 offered in 0.01 s; the CPU lane 128 in 0.04 s.
        b.measured((128, 0.04), (128, 0.01), 128);
        let share = b.share().expect("measured");
        assert!((0.78..0.82).contains(&share), "{share}");
        let mut b = Balance::new(None);
        b.measured((128, 0.01), (128, 0.04), 128);
        assert!(b.share().expect("measured") < 0.25);
    }
}
