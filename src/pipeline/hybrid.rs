//! Hybrid decoding: the CPU threads and the GPU decode lane fill the same batches.
//!
//! Which lane an image is offered to is a rule of its source index and the GPU lane's share at
//! its position in the order ([`ShareSchedule`]): the GPU lane works ahead on its own threads
//! through the epoch's order and keeps the offered images it decodes; the CPU lane's threads work
//! ahead through the others. A batch takes its positions in order, the GPU lane's results for the
//! offered ones and the CPU lane's for the rest, handing back to the CPU lane every offered image
//! the GPU lane did not take (not a baseline JPEG, unreadable, refused, failed), so nothing is
//! lost. Each image keeps its place in the batch whichever lane decodes it; places left by bad
//! images are refilled from the next positions the same way.
//!
//! Nothing holds the first batch back. The CPU lane starts at once; the GPU lane opens on a thread
//! of its own meanwhile and is offered images from the first position the CPU lane has not
//! looked at once it is ready: with its assisted path after a fifth of a second or so, its JPEG engines
//! joining a second or two later (until then the CPU lane takes their images back, and the share
//! stays as it is). From then on the share
//! follows the lanes: after each batch (once both lanes have filled their lookahead) the time it
//! waited on each lane moves the share towards the lane that kept it waiting less, again from the
//! first position neither lane has reached, so the
//! lanes always agree on who decodes what. A share given ([`crate::PipelineBuilder::gpu_share`])
//! is kept instead, and the lane opens before the first batch: every image then goes to the same
//! lane on every run, and the bytes are the same run after run.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::CudaStream;

use crate::background::Background;
use crate::batch::DecodedBy;
use crate::cpu::{AheadWork, BatchRequest, CpuAhead, Filled, Staging};
use crate::error::{Error, Result};
use crate::gpu::{
    GpuLane, GpuLaneError, LaneOutput, LaneResult, LaneWork, ShareSchedule, MAX_SPAN,
};
use crate::order::EpochOrder;
use crate::source::Source;

/// How often (in positions) a batch tells the lanes how far it got.
const ADVANCE_EVERY: usize = 32;

/// Shares move in steps of 1/64.
const SHARE_STEPS: f32 = 64.0;

/// The share the GPU lane starts from once it is open, before the waits say more: measured shares
/// on the H100 and H200 machines were 0.6 to 0.8 on ImageNet-sized JPEGs and around 0.5 on
/// camera-size photos.
const INITIAL_SHARE: f32 = 0.75;

/// A batch that waited on one lane for less than this fraction of its time more than on the
/// other leaves the share as it is.
const DEAD_BAND: f64 = 0.02;

/// The most the share moves after one batch. Larger steps overshoot: a move shows only once the
/// lanes have worked through their lookahead, and by then the next batches have asked for more.
const MAX_STEP: f32 = 1.0 / 16.0;

/// The share moves by this fraction of a batch's imbalance (the difference of its waits on the
/// lanes over its time).
const GAIN: f64 = 1.0 / 8.0;

/// The share between the lanes: given and kept, or following the lanes' waits.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Balance {
    share: f32,
    pinned: bool,
}

impl Balance {
    /// A given share, kept; or (`None`) one that starts at [`INITIAL_SHARE`] and follows the
    /// lanes.
    pub fn new(given: Option<f32>) -> Balance {
        match given {
            Some(share) => Balance {
                share,
                pinned: true,
            },
            None => Balance {
                share: INITIAL_SHARE,
                pinned: false,
            },
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

    /// The share after a batch that waited `gpu_wait` on the GPU lane and `cpu_wait` on the
    /// CPU lane in `elapsed`: moved towards the lane that kept it waiting less, by [`GAIN`] of the
    /// difference's fraction of the batch's time (at least 1/64, at most [`MAX_STEP`], in steps
    /// of 1/64).
    fn follow(&mut self, gpu_wait: Duration, cpu_wait: Duration, elapsed: Duration) -> bool {
        if self.pinned || elapsed.is_zero() {
            return false;
        }
        let imbalance = (gpu_wait.as_secs_f64() - cpu_wait.as_secs_f64()) / elapsed.as_secs_f64();
        if imbalance.abs() < DEAD_BAND {
            return false;
        }
        let step = ((imbalance.abs() * GAIN) as f32).clamp(1.0 / SHARE_STEPS, MAX_STEP);
        let moved = if imbalance > 0.0 {
            self.share - step
        } else {
            self.share + step
        };
        let share = (moved.clamp(0.0, 1.0) * SHARE_STEPS).round() / SHARE_STEPS;
        let changed = share != self.share;
        self.share = share;
        changed
    }
}

/// The GPU lane: opening on a thread of its own, open, or off for a reason.
enum GpuState {
    Opening(Opening),
    Open(Box<GpuLane>),
    Off(GpuLaneError),
    NotAsked,
}

/// Why no lane came from a thread that stopped before sending one.
pub(crate) fn opening_stopped() -> std::result::Result<GpuLane, GpuLaneError> {
    Err(GpuLaneError::Opening(
        "the thread opening it stopped".into(),
    ))
}

/// A GPU lane opening on a thread of its own.
pub(crate) type Opening = Background<std::result::Result<GpuLane, GpuLaneError>>;

/// The epoch the lanes work on, kept to begin the GPU lane on it when it opens mid-epoch.
struct Epoch {
    source: Arc<Source>,
    order: Arc<EpochOrder>,
    epoch: u64,
    schedule: Arc<ShareSchedule>,
    /// Whether the GPU lane was begun on it.
    gpu_begun: bool,
    /// Batches starting before this position leave the share as it is: the lanes are still
    /// filling their lookahead (at the epoch's start, or where the GPU lane joined), and the
    /// batches wait on whichever starts slower, not on the one that decodes slower.
    settled_from: usize,
}

/// The GPU decode lane, the CPU lane working ahead beside it, and the share between them.
pub(crate) struct HybridLanes {
    gpu: GpuState,
    ahead: CpuAhead,
    balance: Balance,
    /// The pipeline's stream: the batches read the GPU lane's images on it.
    stream: Arc<CudaStream>,
    image_bytes: usize,
    /// Positions the lanes work past the batches' cursor.
    lookahead: usize,
    epoch: Option<Epoch>,
}

/// A batch both lanes filled: the staging holds the CPU lane's images, `from_gpu` the GPU lane's
/// with their places.
pub(crate) struct HybridFilled {
    pub filled: Filled,
    pub from_gpu: Vec<(LaneOutput, usize)>,
    pub decoded_by: DecodedBy,
    /// What filling it waited on each lane, and spent copying the CPU lane's images.
    pub waits: Waits,
}

/// How the GPU lane comes to a [`HybridLanes`].
pub(crate) enum GpuOpening {
    /// Opened before the first batch.
    Open(Box<GpuLane>),
    /// Opening on a thread of its own.
    Pending(Opening),
    /// Not asked for: the CPU lane alone, working ahead of the batches.
    NotAsked,
}

impl HybridLanes {
    /// The lanes, with the GPU lane as `gpu` brings it; `threads_beside_gpu` of the CPU lane's
    /// `ahead` threads prepare images beside the GPU lane (opening or open), all of them if it
    /// cannot run.
    pub fn new(
        gpu: GpuOpening,
        ahead: CpuAhead,
        balance: Balance,
        stream: Arc<CudaStream>,
        image_bytes: usize,
        lookahead: usize,
        threads_beside_gpu: usize,
    ) -> HybridLanes {
        // The CPU lane leaves the GPU lane's cores free from the start: opening the lane's
        // decoders is host work too, and on a core of its own it ends sooner.
        ahead.set_active_threads(threads_beside_gpu);
        let gpu = match gpu {
            GpuOpening::Open(lane) => GpuState::Open(lane),
            GpuOpening::Pending(opening) => GpuState::Opening(opening),
            GpuOpening::NotAsked => {
                ahead.set_active_threads(ahead.threads());
                GpuState::NotAsked
            }
        };
        HybridLanes {
            gpu,
            ahead,
            balance,
            stream,
            image_bytes,
            lookahead,
            epoch: None,
        }
    }

    /// Which lanes decode now, in words: both (with the GPU lane and its share), the CPU
    /// while the GPU lane opens, or the CPU alone and why.
    pub fn describe(&self) -> String {
        match &self.gpu {
            GpuState::Open(lane) => format!(
                "CPU and GPU decode ({}), GPU share {:.3}{}",
                lane.describe(),
                self.balance.share(),
                if self.balance.is_pinned() {
                    " (given)"
                } else {
                    ""
                }
            ),
            GpuState::Opening(_) => "CPU decode while the GPU decode lane opens".into(),
            GpuState::Off(reason) => format!("CPU decode, the GPU decode lane is off: {reason}"),
            GpuState::NotAsked => "CPU decode".into(),
        }
    }

    /// Whether the GPU lane was asked for (opening, open or off), or the CPU lane works alone.
    pub fn gpu_asked(&self) -> bool {
        !matches!(self.gpu, GpuState::NotAsked)
    }

    /// The GPU lane's share in force; `None` while it is not open.
    pub fn share(&self) -> Option<f32> {
        matches!(self.gpu, GpuState::Open(_)).then_some(self.balance.share())
    }

    /// Keeps the share at `share` from now on, the GPU lane opened first if it is still opening
    /// (so that every image of the epoch to come goes to the lane the share says); whether the
    /// share changed.
    pub fn pin_share(&mut self, share: f32) -> bool {
        if let GpuState::Opening(opening) = &mut self.gpu {
            let opened = opening.wait();
            self.take_opened(opened);
        }
        if let GpuState::Open(lane) = &mut self.gpu {
            lane.wait_for_engines();
        }
        let changed = !self.balance.is_pinned() || self.balance.share() != share;
        self.balance = Balance::new(Some(share));
        changed
    }

    /// Starts both lanes on `order` (an epoch), under the share in force (none while the GPU
    /// lane is not open).
    pub fn begin(
        &mut self,
        source: &Arc<Source>,
        order: &Arc<EpochOrder>,
        epoch: u64,
    ) -> Result<()> {
        self.poll_gpu();
        let share = match self.gpu {
            GpuState::Open(_) => self.balance.share(),
            _ => 0.0,
        };
        let schedule = Arc::new(ShareSchedule::new(share));
        let on_gpu = schedule.clone();
        self.ahead.begin(AheadWork {
            source: source.clone(),
            order: order.clone(),
            epoch,
            on_gpu: Arc::new(move |position, index| on_gpu.offers(position, index)),
        });
        let mut current = Epoch {
            source: source.clone(),
            order: order.clone(),
            epoch,
            schedule,
            gpu_begun: false,
            settled_from: self.frontier(0),
        };
        if let GpuState::Open(lane) = &mut self.gpu {
            lane.begin(&self.stream, lane_work(&current, &self.ahead))?;
            current.gpu_begun = true;
        }
        self.epoch = Some(current);
        Ok(())
    }

    /// Takes the GPU lane if it has opened meanwhile (then [`HybridLanes::start_gpu_lane`]
    /// begins it on the epoch under way).
    fn poll_gpu(&mut self) {
        let GpuState::Opening(opening) = &mut self.gpu else {
            return;
        };
        if let Some(opened) = opening.try_take() {
            self.take_opened(opened);
        }
    }

    /// The GPU lane as its opening ended: open, or off (and every core to the CPU lane).
    fn take_opened(&mut self, opened: std::result::Result<GpuLane, GpuLaneError>) {
        self.gpu = match opened {
            Ok(lane) => GpuState::Open(Box::new(lane)),
            Err(reason) => {
                self.ahead.set_active_threads(self.ahead.threads());
                GpuState::Off(reason)
            }
        };
    }

    /// The first position neither lane has looked at while the batches' cursor is at `cursor`.
    fn frontier(&self, cursor: usize) -> usize {
        cursor + self.lookahead + MAX_SPAN
    }

    /// Fills a batch with both lanes from the request's start position of their current work:
    /// each position in turn takes the GPU lane's image, or the CPU lane's (copied into its place
    /// in `staging`), or is skipped with its error. `Ok(None)` if `stop` was raised meanwhile.
    pub fn fill(
        &mut self,
        staging: &mut Staging<'_>,
        request: &BatchRequest<'_>,
        source: &Source,
        stop: &AtomicBool,
    ) -> Result<Option<HybridFilled>> {
        self.poll_gpu();
        self.start_gpu_lane(request.start)?;
        self.poll_engines(request.start);
        let started = Instant::now();
        let filled = self.fill_positions(staging, request, source, stop)?;
        if let Some(filled) = &filled {
            self.follow(
                request.start,
                filled.filled.consumed,
                &filled.waits,
                started.elapsed(),
            );
        }
        Ok(filled)
    }

    /// Begins a GPU lane that has just opened on the epoch under way, offered images from the
    /// first position the CPU lane has not looked at (with the batches' cursor at `cursor`).
    fn start_gpu_lane(&mut self, cursor: usize) -> Result<()> {
        let frontier = self.frontier(cursor);
        let (GpuState::Open(lane), Some(current)) = (&mut self.gpu, &mut self.epoch) else {
            return Ok(());
        };
        if current.gpu_begun {
            return Ok(());
        }
        // The GPU lane has looked at nothing yet; the CPU lane's threads wait while the share
        // changes from their next position, so that no position is taken by both lanes or
        // neither. (Large photos: the CPU lane has looked at a few dozen of its lookahead's
        // hundreds when the assisted path opens.)
        let share = self.balance.share();
        self.ahead.with_first_unseen(|next| {
            current.schedule.set_from(next.max(cursor), share);
        });
        lane.begin(&self.stream, lane_work(current, &self.ahead))?;
        current.gpu_begun = true;
        current.settled_from = frontier + self.lookahead;
        Ok(())
    }

    /// Takes in the GPU lane's JPEG engines if they have opened meanwhile; the batches then wait
    /// differently, so the share follows again only once the lanes have filled their lookahead
    /// from a batch starting at `cursor`.
    fn poll_engines(&mut self, cursor: usize) {
        let settled = self.frontier(cursor) + self.lookahead;
        if let (GpuState::Open(lane), Some(current)) = (&mut self.gpu, &mut self.epoch) {
            if lane.poll_engines() {
                current.settled_from = current.settled_from.max(settled);
            }
        }
    }

    /// Moves the share after a batch of `used` positions from `start`, by what it waited on
    /// each lane, from the frontier on. Only a batch that ran wholly under the latest share, with
    /// both lanes settled, counts (an earlier move has not shown yet otherwise).
    fn follow(&mut self, start: usize, used: usize, waits: &Waits, elapsed: Duration) {
        let (GpuState::Open(lane), Some(current)) = (&self.gpu, &self.epoch) else {
            return;
        };
        // While the engines open their images go to the CPU lane: the waits say nothing of the
        // lanes' speeds.
        if lane.engines_pending() {
            return;
        }
        let (from, _) = current.schedule.last();
        if !current.gpu_begun || start < from.max(current.settled_from) {
            return;
        }
        if self.balance.follow(waits.gpu, waits.cpu, elapsed) {
            let frontier = self.frontier(start + used);
            current.schedule.set_from(frontier, self.balance.share());
        }
    }

    fn fill_positions(
        &mut self,
        staging: &mut Staging<'_>,
        request: &BatchRequest<'_>,
        source: &Source,
        stop: &AtomicBool,
    ) -> Result<Option<HybridFilled>> {
        let image_bytes = self.image_bytes;
        let mut waits = Waits::default();
        let Some(current) = &self.epoch else {
            return Err(Error::Worker(
                "a hybrid batch before its epoch began".into(),
            ));
        };
        let schedule = current.schedule.clone();
        let (ahead, stream) = (&self.ahead, &self.stream);
        let lane = match &mut self.gpu {
            GpuState::Open(lane) => Some(lane.as_mut()),
            _ => None,
        };
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
        let failed = |lane: Option<&mut GpuLane>, from_gpu: Vec<(LaneOutput, usize)>| match lane {
            Some(lane) => lane.discard(stream, from_gpu.into_iter().map(|(o, _)| o).collect()),
            None => Ok(()),
        };
        while filled.indices.len() < batch_size && used < reach {
            let at = start + used;
            let Some(index) = order.get(at) else { break };
            if used % ADVANCE_EVERY == 0 {
                if stop.load(Ordering::Relaxed) {
                    failed(lane, from_gpu)?;
                    return Ok(None);
                }
                if let Some(lane) = lane.as_deref() {
                    lane.advance(at);
                }
                ahead.advance(at);
            }
            used += 1;
            let place = filled.indices.len();
            let padding = order.is_padding(at);
            if let (Some(gpu), true) = (lane.as_deref(), schedule.offers(at, index)) {
                let waited = Instant::now();
                let result = gpu.result(at);
                waits.gpu += waited.elapsed();
                match result {
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
            let waited = Instant::now();
            let result = ahead.result(at);
            waits.cpu += waited.elapsed();
            let outcome = match result {
                Some(Ok((pixels, draw))) => {
                    let copying = Instant::now();
                    staging.pixels[place * image_bytes..(place + 1) * image_bytes]
                        .copy_from_slice(&pixels);
                    waits.copy += copying.elapsed();
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
            assisted: from_gpu.iter().filter(|(out, _)| out.assisted).count(),
        };
        Ok(Some(HybridFilled {
            filled,
            from_gpu,
            decoded_by,
            waits,
        }))
    }

    /// Gives back the GPU lane's images of a batch that is not made after all.
    pub fn discard(&mut self, from_gpu: Vec<(LaneOutput, usize)>) -> Result<()> {
        match &mut self.gpu {
            GpuState::Open(lane) => lane.discard(
                &self.stream,
                from_gpu.into_iter().map(|(output, _)| output).collect(),
            ),
            _ => Ok(()),
        }
    }

    /// The GPU lane, when open.
    pub fn gpu_lane(&mut self) -> Option<&mut GpuLane> {
        match &mut self.gpu {
            GpuState::Open(lane) => Some(lane.as_mut()),
            _ => None,
        }
    }
}

/// The GPU lane's work for an epoch: the CPU lane takes back what it does not decode.
fn lane_work(epoch: &Epoch, ahead: &CpuAhead) -> LaneWork {
    LaneWork {
        source: epoch.source.clone(),
        order: epoch.order.clone(),
        share: epoch.schedule.clone(),
        epoch: epoch.epoch,
        refused: Some(ahead.hand_back_fn()),
    }
}

/// What a batch waited on each lane, and spent copying the CPU lane's images into the staging.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Waits {
    pub gpu: Duration,
    pub cpu: Duration,
    pub copy: Duration,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn the_share_moves_towards_the_lane_that_waits_less() {
        let mut balance = Balance::new(None);
        assert_eq!(balance.share(), INITIAL_SHARE);
        // The batch waited on the GPU lane for half its time: less for the GPU lane.
        assert!(balance.follow(ms(50), ms(0), ms(100)));
        assert!(balance.share() < INITIAL_SHARE);
        let after_gpu_wait = balance.share();
        // Then on the CPU lane: more for the GPU lane.
        assert!(balance.follow(ms(0), ms(80), ms(100)));
        assert!(balance.share() > after_gpu_wait);
        // Balanced waits change nothing.
        let before = balance.share();
        assert!(!balance.follow(ms(10), ms(10), ms(100)));
        assert_eq!(balance.share(), before);
        // Steps are multiples of 1/64 and at most MAX_STEP.
        assert_eq!((balance.share() * SHARE_STEPS).fract(), 0.0);
        let mut b = Balance::new(None);
        b.follow(ms(100), ms(0), ms(100));
        assert!((INITIAL_SHARE - b.share() - MAX_STEP).abs() < 1e-6);
    }

    #[test]
    fn the_share_stays_within_its_range_and_a_given_one_is_kept() {
        let mut balance = Balance::new(None);
        for _ in 0..100 {
            balance.follow(ms(100), ms(0), ms(100));
        }
        assert_eq!(balance.share(), 0.0);
        for _ in 0..100 {
            balance.follow(ms(0), ms(100), ms(100));
        }
        assert_eq!(balance.share(), 1.0);
        let mut pinned = Balance::new(Some(0.3));
        assert!(!pinned.follow(ms(100), ms(0), ms(100)));
        assert_eq!(pinned.share(), 0.3);
        assert!(pinned.is_pinned());
    }
}
