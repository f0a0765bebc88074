//! Hybrid decoding: the CPU threads and the GPU's JPEG engines fill the same batches.
//!
//! Each image is offered to the GPU lane or not by a rule of its source index and the lane's
//! share alone ([`crate::gpu::offered`]), so the same settings put the same images on the same
//! lane on every run. The GPU lane works ahead on its own threads through the epoch's order and
//! keeps the offered images its engines decode; a batch takes its positions in order, runs the
//! ones not offered on the CPU lane at once, and takes the GPU lane's results for the others,
//! handing back to the CPU lane's queue every one the engines did not take (not a baseline JPEG,
//! unreadable, refused, failed), so nothing is lost. Each image keeps its place in the batch
//! whichever lane decodes it; places left by bad images are refilled from the next positions the
//! same way.
//!
//! The share is measured once, before the first batch, unless given: both lanes at once, each on
//! first images of the epoch of its own (after a warm-up of the engines; the results dropped),
//! and the GPU lane is offered what makes both finish together. The pipeline reports the share,
//! and a run given it back decodes every image in the same lane.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::CudaStream;

use crate::batch::DecodedBy;
use crate::cpu::{BatchRequest, CpuAhead, CpuLane, Filled, Staging};
use crate::error::{Error, Result};
use crate::gpu::{offered, GpuLane, LaneOutput, LaneResult, LaneWork};
use crate::options::OnError;
use crate::order::EpochOrder;
use crate::source::Source;

/// The GPU lane's share of the images it can take.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Balance {
    /// The share in force; `None` until measured.
    share: Option<f32>,
}

/// How often (in positions) a batch tells the lanes how far it got.
const ADVANCE_EVERY: usize = 32;

/// Shares are kept in steps of 1/64, so measuring twice on one machine usually lands on one.
const SHARE_STEPS: f32 = 64.0;

/// Images the GPU lane is measured on at most.
const PROBE_GPU_IMAGES: usize = 1024;

/// Images each lane is measured on at least, where the epoch has them.
const PROBE_MIN_IMAGES: usize = 64;

/// Images the engines warm up on before they are measured, at most.
const PROBE_WARM_UP: usize = 64;

/// Outputs the probe gives back to the lane at a time (well under the smallest ring, which holds
/// at least the lookahead of 256).
const PROBE_GIVE_BACK: usize = 32;

/// Images the CPU lane is measured on meanwhile, at most.
const PROBE_CPU_IMAGES: usize = 256;

/// How many images the probe warms the engines up on, then measures the GPU lane and the CPU
/// lane on, in an epoch of `n`: a quarter of the epoch at most for the GPU lane (but at least
/// [`PROBE_MIN_IMAGES`]), a quarter of that for the CPU lane (likewise), and an eighth of it for
/// the warm-up. On 8,192 images that is 64, 1,024 and 256; on a folder of 96 camera-size photos
/// 8, 64 and 64, where decoding all of them, as a fixed size would, made the first epoch cost
/// several of the next.
fn probe_sizes(n: usize) -> (usize, usize, usize) {
    let gpu = (n / 4).clamp(PROBE_MIN_IMAGES, PROBE_GPU_IMAGES).min(n);
    let cpu = (gpu / 4).clamp(PROBE_MIN_IMAGES, PROBE_CPU_IMAGES).min(n);
    let warm_up = (gpu / 8).clamp(1, PROBE_WARM_UP).min(n);
    (warm_up, gpu, cpu)
}

impl Balance {
    /// A given share, or one to measure (`None`).
    pub fn new(share: Option<f32>) -> Balance {
        Balance { share }
    }

    /// The share in force, once known.
    pub fn share(&self) -> Option<f32> {
        self.share
    }
}

/// The share from each lane's throughput alone, in images per second: the CPU lane's over every
/// image, the GPU lane's over those it took, which were `taken` of what it was offered. The GPU
/// lane is offered what makes both lanes finish together.
fn share_from(cpu_rate: f64, gpu_rate: f64, taken: f64) -> f32 {
    let share = if cpu_rate + gpu_rate > 0.0 && taken > 0.0 {
        // Of all images, the GPU lane should decode gpu / (cpu + gpu); it takes `taken` of
        // what it is offered.
        gpu_rate / (cpu_rate + gpu_rate) / taken
    } else {
        0.0
    };
    (share.clamp(0.0, 1.0) as f32 * SHARE_STEPS).round() / SHARE_STEPS
}

/// A batch both lanes filled: the staging holds the CPU lane's images, `from_gpu` the GPU lane's
/// with their places.
pub(crate) struct HybridFilled {
    pub filled: Filled,
    pub from_gpu: Vec<(LaneOutput, usize)>,
    pub decoded_by: DecodedBy,
}

/// The GPU decode lane, the CPU lane working ahead beside it, and the share between them.
pub(crate) struct HybridLanes {
    pub gpu: GpuLane,
    pub ahead: CpuAhead,
    pub balance: Balance,
    /// The pipeline's stream: the batches read the GPU lane's images on it.
    pub stream: Arc<CudaStream>,
    /// Bytes of one output image.
    pub image_bytes: usize,
}

/// The first images of an epoch, which the share is measured on.
pub(crate) struct Probe<'a> {
    pub source: &'a Arc<Source>,
    pub order: &'a EpochOrder,
    pub epoch: u64,
    pub batch_size: usize,
}

impl HybridLanes {
    /// Measures the share on the probe's images (see the module's description): each lane on
    /// images of its own, both at once, as they run in the batches, the CPU lane's written into
    /// `staging` and dropped. `Ok(None)` if `stop` was raised meanwhile.
    pub fn measure(
        &mut self,
        cpu: &CpuLane,
        mut staging: Staging<'_>,
        probe: &Probe<'_>,
        stop: &AtomicBool,
    ) -> Result<Option<f32>> {
        let Probe {
            source,
            order,
            epoch,
            batch_size,
        } = *probe;
        let (lane, stream) = (&mut self.gpu, &self.stream);
        let indices = order.indices();
        let (warm_up, gpu_count, cpu_count) = probe_sizes(indices.len());
        // The GPU lane's images first, the CPU lane's after them (the same ones in a small epoch).
        let gpu_images = &indices[..gpu_count];
        let cpu_images = match indices.get(gpu_count..) {
            Some(rest) if rest.len() >= cpu_count => &rest[..cpu_count],
            _ => &indices[..cpu_count],
        };
        let gpu_pass = |lane: &mut GpuLane, images: &[usize]| -> Result<(f64, usize)> {
            let started = Instant::now();
            lane.begin(
                stream,
                LaneWork {
                    source: source.clone(),
                    order: Arc::new(EpochOrder::new(images.to_vec())),
                    share: 1.0,
                    epoch,
                    refused: None,
                },
            )?;
            lane.advance(images.len());
            // Outputs given back as they come, a few at a time: the ring need not hold the probe.
            let mut taken = 0;
            let mut made = Vec::with_capacity(PROBE_GIVE_BACK);
            for p in 0..images.len() {
                if let LaneResult::Decoded(output) = lane.result(p) {
                    taken += 1;
                    made.push(output);
                }
                if made.len() == PROBE_GIVE_BACK || p + 1 == images.len() {
                    lane.discard(stream, std::mem::take(&mut made))?;
                }
            }
            let seconds = started.elapsed().as_secs_f64();
            Ok((seconds, taken))
        };
        // A warm-up of the engines (their first calls initialize them).
        gpu_pass(lane, &gpu_images[..warm_up])?;
        let (gpu, cpu_side) = std::thread::scope(|scope| {
            let gpu = scope.spawn(|| gpu_pass(lane, gpu_images));
            // The CPU lane meanwhile, a batch at a time into the staging.
            let started = Instant::now();
            let mut done = 0;
            for chunk in cpu_images.chunks(batch_size.max(1)) {
                let order = EpochOrder::new(chunk.to_vec());
                let request = BatchRequest {
                    order: &order,
                    start: 0,
                    epoch,
                    batch_size: chunk.len(),
                    on_error: OnError::Skip,
                };
                match cpu.fill(&mut staging, &request, source, stop) {
                    Ok(Some(_)) => done += chunk.len(),
                    Ok(None) => return (gpu.join(), Ok(None)),
                    Err(e) => return (gpu.join(), Err(e)),
                }
            }
            (
                gpu.join(),
                Ok(Some((done, started.elapsed().as_secs_f64()))),
            )
        });
        let (gpu_seconds, taken) =
            gpu.map_err(|_| Error::Worker("the GPU lane's probe panicked".into()))??;
        let Some((done, cpu_seconds)) = cpu_side? else {
            return Ok(None);
        };
        let rate = |n: usize, s: f64| if s > 0.0 { n as f64 / s } else { 0.0 };
        Ok(Some(share_from(
            rate(done, cpu_seconds),
            rate(taken, gpu_seconds),
            taken as f64 / gpu_images.len().max(1) as f64,
        )))
    }

    /// Fills a batch with both lanes from the request's start position of their current work,
    /// with the GPU lane offered `share` of the images: each position in turn takes the GPU
    /// lane's image, or the CPU lane's (copied into its place in `staging`), or is skipped with
    /// its error. `Ok(None)` if `stop` was raised meanwhile.
    pub fn fill(
        &mut self,
        staging: &mut Staging<'_>,
        request: &BatchRequest<'_>,
        source: &Source,
        stop: &AtomicBool,
        share: f32,
    ) -> Result<Option<HybridFilled>> {
        let image_bytes = self.image_bytes;
        let (ahead, lane, stream) = (&self.ahead, &mut self.gpu, &self.stream);
        let BatchRequest {
            order,
            start,
            batch_size,
            on_error,
            ..
        } = *request;
        let mut filled = Filled::default();
        let mut from_gpu: Vec<(LaneOutput, usize)> = Vec::new();
        let mut used = 0;
        let reach = order.reach(start);
        let failed = |lane: &mut GpuLane, from_gpu: Vec<(LaneOutput, usize)>| {
            lane.discard(stream, from_gpu.into_iter().map(|(o, _)| o).collect())
        };
        while filled.indices.len() < batch_size && used < reach {
            let at = start + used;
            let Some(index) = order.get(at) else { break };
            if used % ADVANCE_EVERY == 0 {
                if stop.load(Ordering::Relaxed) {
                    failed(lane, from_gpu)?;
                    return Ok(None);
                }
                lane.advance(at);
                ahead.advance(at);
            }
            used += 1;
            let place = filled.indices.len();
            let padding = order.is_padding(at);
            if offered(index, share) {
                match lane.result(at) {
                    LaneResult::Decoded(output) => {
                        filled.indices.push(index);
                        filled.draws.push(output.draw);
                        filled.padded.push(padding);
                        from_gpu.push((output, place));
                        continue;
                    }
                    LaneResult::Refused => ahead.hand_back(at),
                }
            }
            let outcome = match ahead.result(at) {
                Some(Ok((pixels, draw))) => {
                    staging.pixels[place * image_bytes..(place + 1) * image_bytes]
                        .copy_from_slice(&pixels);
                    ahead.give_back(pixels);
                    Ok(draw)
                }
                Some(Err(kind)) => Err(kind),
                None => {
                    failed(lane, from_gpu)?;
                    if stop.load(Ordering::Relaxed) {
                        return Ok(None);
                    }
                    return Err(Error::Worker("the CPU lane's threads have stopped".into()));
                }
            };
            if let Err(error) = filled.record(index, padding, outcome, source, on_error) {
                failed(lane, from_gpu)?;
                return Err(error);
            }
        }
        filled.consumed = used;
        let decoded_by = DecodedBy {
            cpu: filled.indices.len() - from_gpu.len(),
            gpu: from_gpu.len(),
        };
        Ok(Some(HybridFilled {
            filled,
            from_gpu,
            decoded_by,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_faster_lane_takes_more() {
        // The GPU lane decodes 4x faster than the CPU lane and takes everything it is offered.
        let share = share_from(2_000.0, 8_000.0, 1.0);
        assert!((0.78..0.82).contains(&share), "{share}");
        assert!(share_from(8_000.0, 2_000.0, 1.0) < 0.25);
        // A lane that takes only half of what it is offered is offered twice as much.
        assert!((0.39..0.41).contains(&share_from(8_000.0, 2_000.0, 0.5)));
        // No GPU throughput: nothing offered.
        assert_eq!(share_from(8_000.0, 0.0, 0.0), 0.0);
    }

    #[test]
    fn the_probe_fits_the_epoch() {
        assert_eq!(probe_sizes(8_192), (64, 1_024, 256));
        assert_eq!(probe_sizes(100_000), (64, 1_024, 256));
        assert_eq!(probe_sizes(2_000), (62, 500, 125));
        assert_eq!(probe_sizes(96), (8, 64, 64));
        assert_eq!(probe_sizes(10), (1, 10, 10));
        assert_eq!(probe_sizes(1), (1, 1, 1));
        for n in 1..3_000 {
            let (warm_up, gpu, cpu) = probe_sizes(n);
            assert!(
                warm_up >= 1 && warm_up <= gpu && gpu <= n && cpu >= 1 && cpu <= n,
                "{n}"
            );
        }
    }
}
