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
//! looked at once it is ready: with its assisted path after 0.1-0.3 s, which takes every file it
//! can until its JPEG engines join a second or two later (the CPU lane takes the rest). From
//! then on the share follows the lanes' measured rates (the schedule's policy): after each window of
//! a quarter of a second or more it moves half way towards the share at which both lanes finish
//! together, from the first position neither lane has reached, so the lanes always agree on who
//! decodes what; and with the thread count left to the pipeline the CPU lane leaves the GPU
//! lane's host threads the cores they keep busy. A share given
//! ([`crate::PipelineBuilder::gpu_share`]) is kept instead, and the lane opens before the first
//! batch: every image then goes to the same lane on every run, and the bytes are the same run
//! after run.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{CudaSlice, CudaStream};

use crate::background::Background;
use crate::batch::DecodedBy;
use crate::cpu::{AheadImage, AheadWork, BatchRequest, CpuAhead, Filled, Staging};
use crate::cuda::{upload_images, upload_positioned, ImagesInFlight};
use crate::error::{Error, Result};
use crate::gpu::{GpuLane, GpuLaneError, LaneOutput, LaneResult, LaneWork, MAX_SPAN};
use crate::memory::{PinnedChunks, PinnedImage, PositionedImage};
use crate::order::EpochOrder;
use crate::schedule::{LanePolicy, ShareSchedule};
use crate::source::Source;

use super::output::DeviceWrites;

/// How often (in positions) a batch tells the lanes how far it got.
const ADVANCE_EVERY: usize = 32;

/// The GPU lane: opening on a thread of its own, open, or off for a reason.
enum GpuState {
    Opening(Opening),
    Open(Box<GpuLane>),
    Off(GpuLaneError),
    NotAsked,
}

impl GpuState {
    /// The lane, when open.
    fn lane(&mut self) -> Option<&mut GpuLane> {
        match self {
            GpuState::Open(lane) => Some(lane.as_mut()),
            _ => None,
        }
    }
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
pub(crate) struct Epoch {
    source: Arc<Source>,
    order: Arc<EpochOrder>,
    epoch: u64,
    schedule: Arc<ShareSchedule>,
    /// Whether the GPU lane was begun on it.
    gpu_begun: bool,
}

impl Epoch {
    /// Starts the CPU lane on `order` (an epoch), leaving the positions `share` offers to the
    /// GPU lane, which is not begun on it yet.
    pub fn begin_cpu(
        ahead: &CpuAhead,
        source: &Arc<Source>,
        order: &Arc<EpochOrder>,
        epoch: u64,
        share: f32,
    ) -> Epoch {
        let schedule = Arc::new(ShareSchedule::new(share));
        let on_gpu = schedule.clone();
        ahead.begin(AheadWork {
            source: source.clone(),
            order: order.clone(),
            epoch,
            on_gpu: Arc::new(move |position, index| on_gpu.offers(position, index)),
        });
        Epoch {
            source: source.clone(),
            order: order.clone(),
            epoch,
            schedule,
            gpu_begun: false,
        }
    }
}

/// The GPU decode lane, the CPU lane working ahead beside it, and the share between them.
pub(crate) struct HybridLanes {
    gpu: GpuState,
    ahead: CpuAhead,
    /// What decides the share, when the engines open and the CPU threads beside the GPU lane.
    policy: LanePolicy,
    /// The pipeline's stream: the batches read the GPU lane's images on it.
    stream: Arc<CudaStream>,
    image_bytes: usize,
    /// Positions the lanes work past the batches' cursor.
    lookahead: usize,
    epoch: Option<Epoch>,
    /// The CPU lane's page-locked images, allocated a chunk at a time ([`CopyMeter`]).
    pinning: Option<PinnedChunks>,
    /// Why the CPU lane has no more page-locked images, if their allocation failed.
    pinning_failed: Option<String>,
    /// The CPU lane's page-locked images of batches whose uploads are queued.
    in_flight: ImagesInFlight,
    /// Whether the CPU lane's images laid out by position while the device opened were
    /// page-locked (or could not be), at the first batch.
    positioned_locked: bool,
    /// How long the batches copy the CPU lane's images, against how long they wait for the lanes.
    copying: CopyMeter,
}

/// Moving averages of a batch's time copying the CPU lane's images into the staging and waiting
/// for the lanes, over about the last [`CopyMeter::BATCHES`] batches.
#[derive(Debug, Default)]
struct CopyMeter {
    copy: f64,
    wait: f64,
}

impl CopyMeter {
    /// Batches the averages reach back over.
    const BATCHES: f64 = 8.0;

    /// Takes in a batch's times: whether its batches copy longer than twice their waits, so the
    /// thread putting them together holds the lane back (the copy of 256 images of 224 x 224
    /// takes it 5-15 ms; over a run on 16 cores the batches waited about twice as long for the
    /// CPU lane, though less in stretches, and on 64 cores they hardly waited).
    fn observe(&mut self, waits: Waits) -> bool {
        let weight = 1.0 / Self::BATCHES;
        let wait = (waits.cpu + waits.gpu).as_secs_f64();
        self.copy += weight * (waits.copy.as_secs_f64() - self.copy);
        self.wait += weight * (wait - self.wait);
        self.copy > 2.0 * self.wait
    }
}

/// A batch both lanes filled: the staging holds the CPU lane's images copied there, `unstaged`
/// the others with their places.
pub(crate) struct HybridFilled {
    pub filled: Filled,
    pub unstaged: Unstaged,
    pub decoded_by: DecodedBy,
    /// What filling it waited on each lane, and spent copying the CPU lane's images.
    pub waits: Waits,
}

/// A batch's images that are not in its staging, with their places: the GPU lane's, on the
/// device, and the CPU lane's prepared into page-locked images of their own.
#[derive(Default)]
pub(crate) struct Unstaged {
    pub gpu: Vec<(LaneOutput, usize)>,
    /// With the bytes each holds (from its first).
    pub pinned: Vec<(PinnedImage, usize, usize)>,
    pub positioned: Vec<(PositionedImage, usize)>,
}

impl Unstaged {
    /// The images of a batch that is not made after all, back to their lanes: the page-locked
    /// ones to `ahead`, the GPU lane's to `lane` (their slots freed once `stream` is past them).
    fn give_back(
        self,
        lane: Option<&mut GpuLane>,
        ahead: &CpuAhead,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        for (image, _, _) in self.pinned {
            ahead.give_back(AheadImage::Pinned(image));
        }
        for (image, _) in self.positioned {
            ahead.give_back(AheadImage::Positioned(image));
        }
        match lane {
            Some(lane) => lane.discard(stream, self.gpu.into_iter().map(|(o, _)| o).collect()),
            None => Ok(()),
        }
    }
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
    /// The lanes, with the GPU lane as `gpu` brings it beside the CPU lane's `ahead` threads (as
    /// many of them at work as [`super::lanes::Lanes::start`] left, all of them if the lane
    /// cannot open), scheduled by `policy`. `begun`: the epoch the CPU lane began alone (the GPU
    /// lane joins it once open).
    pub fn new(
        gpu: GpuOpening,
        ahead: CpuAhead,
        policy: LanePolicy,
        stream: Arc<CudaStream>,
        lookahead: usize,
        begun: Option<Epoch>,
    ) -> HybridLanes {
        let gpu = match gpu {
            GpuOpening::Open(lane) => GpuState::Open(lane),
            GpuOpening::Pending(opening) => GpuState::Opening(opening),
            GpuOpening::NotAsked => GpuState::NotAsked,
        };
        HybridLanes {
            gpu,
            image_bytes: ahead.image_bytes(),
            ahead,
            policy,
            stream,
            lookahead,
            epoch: begun,
            pinning: None,
            pinning_failed: None,
            in_flight: ImagesInFlight::default(),
            positioned_locked: false,
            copying: CopyMeter::default(),
        }
    }

    /// Lets the CPU lane have page-locked images to prepare into, for batches of `batch_size`,
    /// while it decodes alone: a chunk after each batch while the batches spend longer copying
    /// its images into the staging than twice their waits for it (pinning memory is slow: 164 MB
    /// allocated page-locked took about 80 ms on the H200 machine, and it holds back the other
    /// threads' calls to the driver meanwhile; where the lane is what the batches wait for, the
    /// copies cost nothing), up to enough for the batch being filled, the one before it
    /// (uploading), the lookahead's results (the lanes are told of the batches' progress every
    /// [`ADVANCE_EVERY`] positions) and an image on each thread.
    pub fn pin_cpu_images(&mut self, batch_size: usize) {
        let images = 2 * batch_size + self.lookahead + ADVANCE_EVERY + self.ahead.threads();
        let context = self.stream.context().clone();
        self.pinning = Some(PinnedChunks::new(context, self.image_bytes, images));
    }

    /// Which lanes decode now, in words: both (with the GPU lane and its share), the CPU
    /// while the GPU lane opens, or the CPU alone and why.
    pub fn describe(&self) -> String {
        let lanes: String = match &self.gpu {
            GpuState::Open(lane) => format!(
                "CPU and GPU decode ({}), GPU share {:.3}{}",
                lane.describe(),
                self.policy.share(),
                match (self.policy.is_pinned(), self.policy.floor()) {
                    (true, _) => " (given)".to_string(),
                    (false, Some(floor)) => {
                        format!(" (at least {floor:.3})")
                    }
                    (false, None) => String::new(),
                }
            ),
            GpuState::Opening(_) => "CPU decode while the GPU decode lane opens".into(),
            GpuState::Off(reason) => format!("CPU decode, the GPU decode lane is off: {reason}"),
            GpuState::NotAsked => "CPU decode".into(),
        };
        match &self.pinning_failed {
            Some(reason) => format!(
                "{lanes}; the CPU lane's images copied into the staging, without page-locked \
                 memory of their own: {reason}"
            ),
            None => lanes,
        }
    }

    /// Whether the GPU lane was asked for (opening, open or off), or the CPU lane works alone.
    pub fn gpu_asked(&self) -> bool {
        !matches!(self.gpu, GpuState::NotAsked)
    }

    /// The GPU lane's share in force; `None` while it is not open.
    pub fn share(&self) -> Option<f32> {
        matches!(self.gpu, GpuState::Open(_)).then_some(self.policy.share())
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
            lane.wait_until_open();
        }
        let changed = !self.policy.is_pinned() || self.policy.share() != share;
        self.policy.pin(share);
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
            GpuState::Open(_) => self.policy.share(),
            _ => 0.0,
        };
        let mut current = Epoch::begin_cpu(&self.ahead, source, order, epoch, share);
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
                self.ahead
                    .set_active_threads(self.policy.threads_without_gpu());
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
    /// in `staging`, or, prepared into page-locked memory of its own, uploaded from there), or is
    /// skipped with its error. `Ok(None)` if `stop` was raised meanwhile.
    pub fn fill(
        &mut self,
        staging: &mut Staging<'_>,
        request: &BatchRequest<'_>,
        source: &Source,
        stop: &AtomicBool,
    ) -> Result<Option<HybridFilled>> {
        // The pinned images of the batch before last are uploaded by now, as a rule.
        for image in self.in_flight.reclaim(1)? {
            self.ahead.give_back(AheadImage::Pinned(image));
        }
        if !self.positioned_locked {
            // The images the CPU lane finished while the device opened are uploaded from where
            // they lie, rather than copied into the staging.
            self.positioned_locked = true;
            let locked = match self.ahead.positioned() {
                Some((positioned, looked)) => positioned.lock(self.stream.context(), looked),
                None => Ok(()),
            };
            if let Err(e) = locked {
                self.pinning_failed = Some(e.to_string());
            }
        }
        self.poll_gpu();
        self.start_gpu_lane(request.start)?;
        if let GpuState::Open(lane) = &mut self.gpu {
            lane.poll_opening();
        }
        let filled = self.fill_positions(staging, request, source, stop)?;
        if let Some(filled) = &filled {
            self.follow(request.start + filled.filled.consumed);
            // Where the batches' copies of the CPU lane's images take longer than their waits for
            // it, the lane is ahead of them, and page-locked images would spare them the copies.
            // Not beside the GPU lane: its threads call the driver all the time, and a batch's
            // uploads image by image contend with them (hybrid decoding on 64 threads was
            // 0.79-0.98x as fast with them).
            let cpu_alone = matches!(self.gpu, GpuState::NotAsked | GpuState::Off(_));
            if cpu_alone && self.copying.observe(filled.waits) {
                self.pin_next_chunk();
            }
        }
        Ok(filled)
    }

    /// The most page-locked bytes the CPU lane's images take.
    pub fn pinned_bytes(&self) -> usize {
        self.pinning.as_ref().map_or(0, PinnedChunks::bytes)
    }

    /// Gives the CPU lane its next chunk of page-locked images, until it has them all (or one
    /// could not be allocated: the lane goes on with what it has, and ordinary buffers).
    fn pin_next_chunk(&mut self) {
        let Some(pinning) = self.pinning.as_mut().filter(|p| !p.done()) else {
            return;
        };
        match pinning.next_chunk() {
            Ok(images) => self.ahead.add_pinned(images, pinning.done()),
            Err(e) => {
                pinning.give_up();
                self.pinning_failed = Some(e.to_string());
            }
        }
    }

    /// Begins a GPU lane that has just opened on the epoch under way, offered images from the
    /// first position the CPU lane has not looked at (with the batches' cursor at `cursor`).
    fn start_gpu_lane(&mut self, cursor: usize) -> Result<()> {
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
        let share = self.policy.share();
        self.ahead.with_first_unseen(|next| {
            current.schedule.set_from(next.max(cursor), share);
        });
        // The CPU lane worked further ahead while the device opened; from now on the GPU lane
        // takes its share of the positions past the CPU lane's.
        self.ahead.end_reach(cursor);
        lane.begin(&self.stream, lane_work(current, &self.ahead))?;
        current.gpu_begun = true;
        self.policy.restart(lane.activity());
        Ok(())
    }

    /// After a batch that took the positions before `cursor`: tells the policy what the lanes
    /// did, and carries out what it decides once a window of the lanes' rates is complete: the
    /// share from the first position neither lane has looked at, and the CPU lane's threads at
    /// work.
    fn follow(&mut self, cursor: usize) {
        let (GpuState::Open(lane), Some(current)) = (&self.gpu, &self.epoch) else {
            return;
        };
        if !current.gpu_begun {
            return;
        }
        let working = self.ahead.active_threads();
        let Some(decision) = self.policy.observe(lane.activity(), working) else {
            return;
        };
        if let Some(share) = decision.share {
            current.schedule.set_from(self.frontier(cursor), share);
        }
        if let Some(threads) = decision.cpu_threads {
            self.ahead.set_active_threads(threads);
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
        let stream = self.stream.clone();
        let BatchRequest {
            order,
            start,
            batch_size,
            positions,
            on_error,
            ..
        } = *request;
        let mut filled = Filled::default();
        let mut unstaged = Unstaged::default();
        let mut used = 0;
        let reach = order.reach(start).min(positions);
        while filled.indices.len() < batch_size && used < reach {
            let at = start + used;
            let Some(index) = order.get(at) else { break };
            if used % ADVANCE_EVERY == 0 && matches!(self.gpu, GpuState::Opening(_)) {
                // A lane that opened while the batch waited on the CPU lane begins at once,
                // from the first position the CPU lane has not looked at.
                self.poll_gpu();
                self.start_gpu_lane(at)?;
            }
            let ahead = &self.ahead;
            let lane = self.gpu.lane();
            if used % ADVANCE_EVERY == 0 {
                if stop.load(Ordering::Relaxed) {
                    unstaged.give_back(lane, ahead, &stream)?;
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
                    LaneResult::Decoded(mut output) => {
                        filled.indices.push(index);
                        filled.draws.push(output.draw);
                        filled.padded.push(padding);
                        if let Some(views) = output.views.take() {
                            filled.view_draws.push(views);
                        }
                        unstaged.gpu.push((output, place));
                        continue;
                    }
                    LaneResult::Refused => ahead.hand_back(at),
                }
            }
            let waited = Instant::now();
            let result = ahead.result(at);
            waits.cpu += waited.elapsed();
            let mut views = None;
            let outcome = match result {
                Some(Ok((image, made))) => {
                    views = made.views;
                    match image {
                        AheadImage::Pinned(image) => {
                            unstaged.pinned.push((image, place, made.bytes))
                        }
                        AheadImage::Positioned(image) if image.is_locked() => {
                            unstaged.positioned.push((image, place));
                        }
                        // Ordinary memory, or laid out by position and not page-locked: copied
                        // (the bytes the image holds: a patch sequence's image fills its place
                        // in part).
                        image => {
                            let copying = Instant::now();
                            let bytes = made.bytes.min(image_bytes);
                            let at = place * image_bytes;
                            staging.pixels[at..at + bytes]
                                .copy_from_slice(&image.as_slice()[..bytes]);
                            waits.copy += copying.elapsed();
                            waits.copied += 1;
                            ahead.give_back(image);
                        }
                    }
                    Ok(made.draw)
                }
                Some(Err(kind)) => Err(kind),
                None => {
                    unstaged.give_back(lane, ahead, &stream)?;
                    if stop.load(Ordering::Relaxed) {
                        return Ok(None);
                    }
                    return Err(Error::Worker("the CPU lane's threads have stopped".into()));
                }
            };
            match filled.record(index, padding, outcome, source, on_error) {
                Ok(true) => filled.view_draws.extend(views),
                Ok(false) => {}
                Err(error) => {
                    unstaged.give_back(lane, ahead, &stream)?;
                    return Err(error);
                }
            }
        }
        filled.consumed = used;
        let decoded_by = DecodedBy {
            cpu: filled.indices.len() - unstaged.gpu.len(),
            gpu: unstaged.gpu.len(),
            assisted: unstaged.gpu.iter().filter(|(out, _)| out.assisted).count(),
        };
        Ok(Some(HybridFilled {
            filled,
            unstaged,
            decoded_by,
            waits,
        }))
    }

    /// Gives back the images of a batch that is not made after all.
    pub fn discard(&mut self, unstaged: Unstaged) -> Result<()> {
        unstaged.give_back(self.gpu.lane(), &self.ahead, &self.stream)
    }

    /// A batch's images that are not in its staging, to be written into its places of the
    /// batch's device buffer by the output stage.
    pub fn device_writes(&mut self, unstaged: Unstaged) -> UnstagedWrites<'_> {
        UnstagedWrites {
            lane: self.gpu.lane(),
            unstaged,
            in_flight: Some(&mut self.in_flight),
        }
    }
}

/// A batch's images that are not in its staging, written into their places on the device: the
/// CPU lane's page-locked images uploaded (kept until the stream is past the upload), the GPU
/// lane's gathered (their slots back to the lane once queued).
pub(crate) struct UnstagedWrites<'a> {
    pub lane: Option<&'a mut GpuLane>,
    pub unstaged: Unstaged,
    pub in_flight: Option<&'a mut ImagesInFlight>,
}

impl DeviceWrites for UnstagedWrites<'_> {
    fn places(&self) -> Vec<usize> {
        let gpu = self.unstaged.gpu.iter().map(|&(_, place)| place);
        let pinned = self.unstaged.pinned.iter().map(|&(_, place, _)| place);
        let positioned = self.unstaged.positioned.iter().map(|&(_, place)| place);
        let mut places: Vec<usize> = gpu.chain(pinned).chain(positioned).collect();
        places.sort_unstable();
        places
    }

    fn write(&mut self, stream: &Arc<CudaStream>, input: &mut CudaSlice<u8>) -> Result<usize> {
        let pinned = std::mem::take(&mut self.unstaged.pinned);
        let positioned = std::mem::take(&mut self.unstaged.positioned);
        let uploaded = match self.in_flight.as_deref_mut() {
            Some(in_flight) => {
                let queued = upload_images(stream, &pinned, input)
                    .and_then(|images| Ok(images + upload_positioned(stream, &positioned, input)?));
                // Kept until the stream is past what was queued, even if it failed part way.
                in_flight.push(
                    stream,
                    pinned.into_iter().map(|(image, _, _)| image).collect(),
                    positioned.into_iter().map(|(image, _)| image).collect(),
                )?;
                queued?
            }
            None if pinned.is_empty() && positioned.is_empty() => 0,
            None => {
                return Err(Error::Worker(
                    "page-locked images for a batch with nothing to keep them in".into(),
                ))
            }
        };
        let Some(lane) = self.lane.as_mut() else {
            return Ok(uploaded);
        };
        let outputs = std::mem::take(&mut self.unstaged.gpu);
        lane.gather(stream, &outputs, input)?;
        lane.release(stream, outputs.into_iter().map(|(output, _)| output))?;
        Ok(uploaded)
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
    /// The CPU lane's images copied.
    pub copied: u64,
}
