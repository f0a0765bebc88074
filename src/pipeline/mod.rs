//! [`Pipeline`]: the consumer's side of the prefetch thread, and how it is built.
//!
//! One background thread per pipeline ([`worker`]) runs epochs: for each batch it takes a staging
//! slot from the output stage, has the decode lanes fill it ([`lanes`]; which lanes, and how they
//! share the images, the schedule decides from the options read once at the start), then has the
//! output stage turn it into the batch's tensor (upload + kernel on the pipeline's stream, or the
//! host tensor) and queues the [`Batch`]. A bounded channel keeps at most `prefetch` batches
//! ready ahead of the consumer.

mod builder;
mod hybrid;
mod lanes;
mod output;
mod patch_output;
mod serve;
mod views_output;
mod worker;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use cudarc::driver::CudaStream;

use crate::augment::Augmenter;
use crate::batch::{Batch, EpochReport};
use crate::cuda::Gpu;
use crate::error::{Error, Result};
use crate::geometry::Geometry;
use crate::options::Options;
use crate::order::{EpochStart, Fingerprint, PipelineState, Sampler};
use crate::patches::{NaflexSchedule, Preset};
use crate::profile::{Profile, Stage, Stopwatch};
use crate::schedule::{DecodePlan, EpochSample, WorkMix};
use crate::source::Source;
use crate::views::Views;
use lanes::{Lanes, LanesStarting};
use output::OutputPlan;
use worker::{EpochCommand, EpochPlanning, LanesReport, Message, Worker};

/// Files whose sizes estimate an epoch's encoded bytes, for automatic decoding's choice.
const EPOCH_BYTES_SAMPLE: usize = 1024;

pub use builder::PipelineBuilder;
pub use serve::{PatchServer, PatchServerBuilder, RequestImage};

/// Turns a [`Source`] into batches on the device, prepared in the background.
///
/// ```no_run
/// use gpufeed::{DType, Device, Layout, Pipeline, ResizeMode, Source, IMAGENET_MEAN, IMAGENET_STD};
///
/// let mut pipeline = Pipeline::builder()
///     .source(Source::image_folder("val/")?)
///     .batch_size(256)
///     .resize(ResizeMode::center_crop(256, 224))
///     .mean_std(IMAGENET_MEAN, IMAGENET_STD)
///     .dtype(DType::F16)
///     .layout(Layout::Nchw)
///     .device(Device::Cuda(0))
///     .build()?;
/// while let Some(batch) = pipeline.next_batch()? {
///     let images = batch.images(); // [N, 3, 224, 224] f16 on the GPU
///     let labels = batch.labels();
/// #   let _ = (images, labels);
/// }
/// # Ok::<(), gpufeed::Error>(())
/// ```
pub struct Pipeline {
    options: Options,
    /// The views made of each image, in a pipeline of views.
    views: Option<Arc<Views>>,
    /// The decode choice, read from the options once.
    plan: DecodePlan,
    source_len: usize,
    shard_len: usize,
    /// Source indices of images known to be unreadable for what they hold (damaged parts of
    /// shards and keys no client can request, from the listing; files skipped in an earlier
    /// epoch for anything but a failed read): [`Pipeline::batches_per_epoch`] counts them out.
    known_bad: std::collections::HashSet<usize>,
    /// The batches of an epoch planned ahead (timm's patch sequences), when they are.
    planned_batches: Option<usize>,
    class_names: Option<Vec<String>>,
    device_description: String,
    /// Why the pipeline runs on the CPU though a CUDA device was asked for, when it fell back.
    cpu_fallback: Option<String>,
    pinned_bytes: usize,
    /// Which lanes decode and the GPU lane's share, as the worker last reported them.
    lanes_report: Arc<Mutex<LanesReport>>,
    /// Where the stages' times go.
    stopwatch: Arc<Stopwatch>,
    cuda_stream: Option<Arc<CudaStream>>,
    /// What a saved state must match to resume this pipeline.
    fingerprint: Fingerprint,
    epoch: u64,
    /// Where the current epoch began and how far the consumer has taken it: the position after
    /// the last batch handed out, and the rows and batches handed out.
    progress: EpochStart,
    state: EpochState,
    /// The iterator has returned the end of the current epoch: its next call starts another.
    end_returned: bool,
    report: EpochReport,
    abandon: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    commands: Option<Sender<EpochCommand>>,
    batches: Option<Receiver<Message>>,
    worker: Option<JoinHandle<()>>,
    /// The source, to stop its reads when the pipeline goes (the worker holds it too).
    source: Arc<Source>,
    /// The epochs' orders, to check a resumed position against (the worker has its own).
    sampler: Sampler,
    /// The process that built the pipeline: a fork of it has none of its threads.
    process: u32,
}

/// What [`Pipeline::wait_batch`] found within its time.
#[derive(Debug)]
pub enum WaitedBatch {
    /// The next batch of the current epoch (boxed: the other outcomes carry nothing).
    Ready(Box<Batch>),
    /// The epoch is over ([`Pipeline::next_batch`]'s `Ok(None)`).
    EpochEnd,
    /// No batch was ready in time: wait again (after, say, checking for an interrupt).
    NotYet,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EpochState {
    Running,
    Ended,
}

impl std::fmt::Debug for Pipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pipeline")
            .field("options", &self.options)
            .field("images", &self.shard_len)
            .field("device", &self.device_description)
            .field("epoch", &self.epoch)
            .finish_non_exhaustive()
    }
}

/// The source indices this process takes in `epoch` under `batching` (its shuffle, shard and
/// shard balance), in order, the shard's padding included: the order a [`Pipeline`] built over
/// `source` with the same batching goes through. What a caller making its own outputs of the
/// images (their views, with [`crate::cpu::render_views`]) follows to shuffle and shard as the
/// pipeline does.
pub fn epoch_order(
    source: &Source,
    batching: &crate::options::BatchOptions,
    epoch: u64,
) -> Vec<usize> {
    Sampler::new(source.len(), batching)
        .with_blocks(source.shuffle_blocks())
        .epoch_from(epoch, 0)
        .indices()
        .to_vec()
}

impl Pipeline {
    /// A builder with torchvision's defaults.
    pub fn builder() -> PipelineBuilder {
        PipelineBuilder::default()
    }

    /// Checks `options`, opens the device, compiles the kernel, allocates the staging and starts
    /// the first epoch in the background: the builder's [`PipelineBuilder::build`] with every
    /// option given at once.
    pub fn with_options(source: Source, options: Options) -> Result<Pipeline> {
        Pipeline::open(source, options, None, None)
    }

    /// [`Pipeline::with_options`], beginning where `state` says instead of at the first epoch
    /// (see [`PipelineBuilder::resume`]).
    pub fn with_options_from(
        source: Source,
        options: Options,
        state: &PipelineState,
    ) -> Result<Pipeline> {
        Pipeline::open(source, options, None, Some(state))
    }

    /// [`Pipeline::with_options`], making `views` of each image if given, beginning where
    /// `resume` says (or at the first epoch).
    fn open(
        source: Source,
        mut options: Options,
        views: Option<Arc<Views>>,
        resume: Option<&PipelineState>,
    ) -> Result<Pipeline> {
        let Planned {
            augmenter,
            fingerprint,
            sampler,
            shard_len,
            schedule,
            plan,
            start,
        } = Planned::new(&source, &mut options, views.as_ref(), resume)?;
        let classes = augmenter.as_ref().map_or(0, |(_, classes)| *classes);
        // The output's geometry, planned once for every lane.
        let geometry = Geometry::new(&options.resize).with_patches(options.patches.as_ref());
        let stopwatch = Arc::new(Stopwatch::default());
        let epoch_bytes = |source: &Source| epoch_sample(source, shard_len);
        let sizes = Sizes {
            geometry,
            images: shard_len,
            classes,
            views: views_output::lane_views(
                views.as_ref(),
                options.batching.batch_size,
                options.runtime.device,
            ),
        };
        let mut starting = Starting::new(
            plan,
            &options,
            sizes.clone(),
            || epoch_bytes(&source),
            &stopwatch,
        )?;
        // The CPU lane starts on the first epoch while the device opens (a few tenths of a
        // second for the CUDA context, the staging and the kernels).
        let source = Arc::new(source);
        let mut upcoming = None;
        let begun = starting
            .lanes
            .begin_early(&source, start.epoch, || {
                let planning = EpochPlanning {
                    sampler: &sampler,
                    schedule: schedule.as_ref(),
                };
                worker::plan_epoch(&planning, &source, start, &mut upcoming)
            })
            .map(|order| (start, order));
        let (gpu, cpu_fallback) = starting.open_device(&mut options, |plan, options| {
            let epoch_bytes = || epoch_bytes(&source);
            // The views as the device takes their colour calls.
            let batch = options.batching.batch_size;
            let views = views_output::lane_views(views.as_ref(), batch, options.runtime.device);
            let sizes = Sizes { views, ..sizes };
            Starting::new(plan, options, sizes, epoch_bytes, &stopwatch)
        })?;
        let Starting {
            plan,
            output: output_plan,
            lanes,
        } = starting;
        if let Some(gpu) = &gpu {
            output_plan.check_device(gpu)?;
        }
        // The GPU lane opens on a thread of its own (with no share given) while the staging and
        // the kernels are made.
        let lanes = lanes.open(&options, gpu.as_ref(), &stopwatch)?;
        let output = output_plan.open(&options, gpu.as_ref())?;
        let device_description = output.describe();
        let pinned_bytes = output.pinned_bytes() + lanes.pinned_bytes();
        let cuda_stream = output.cuda_stream();
        let known_bad = source.damaged_indices().collect();
        let planned_batches = schedule.as_ref().map(|schedule| schedule.len());
        let abandon = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let class_names = source.class_names().map(|c| c.to_vec());
        let source_len = source.len();
        let lanes_report = Arc::new(Mutex::new(LanesReport {
            share: lanes.gpu_share(),
            description: lanes.describe(),
        }));
        let worker = Worker {
            labelled: source.has_labels(),
            source: source.clone(),
            sampler: sampler.clone(),
            batching: options.batching,
            lanes,
            stopwatch: stopwatch.clone(),
            lanes_report: lanes_report.clone(),
            output,
            num_classes: augmenter.map_or(0, |(_, classes)| classes),
            augmenter: augmenter.map(|(a, _)| a),
            abandon: abandon.clone(),
            stop: stop.clone(),
            begun,
            upcoming,
            planned_epochs: plan.planned_epochs(),
            schedule,
        };
        let prefetch = worker.spawn(options.runtime.prefetch)?;
        let mut pipeline = Pipeline {
            options,
            views,
            plan,
            source_len,
            shard_len,
            known_bad,
            planned_batches,
            class_names,
            device_description,
            cpu_fallback,
            pinned_bytes,
            lanes_report,
            stopwatch,
            cuda_stream,
            fingerprint,
            epoch: 0,
            progress: EpochStart::default(),
            state: EpochState::Ended,
            end_returned: false,
            report: EpochReport::default(),
            abandon,
            stop,
            commands: Some(prefetch.commands),
            batches: Some(prefetch.batches),
            worker: Some(prefetch.thread),
            source,
            sampler,
            process: std::process::id(),
        };
        pipeline.begin(start, None)?;
        Ok(pipeline)
    }

    fn begin_epoch(&mut self, epoch: u64) -> Result<()> {
        self.begin(EpochStart::beginning(epoch), None)
    }

    /// Has the worker run an epoch from `start`, with the GPU lane's share pinned to `share`.
    fn begin(&mut self, start: EpochStart, share: Option<f32>) -> Result<()> {
        self.check_process()?;
        self.epoch = start.epoch;
        self.progress = start;
        self.report = EpochReport {
            epoch: start.epoch,
            ..EpochReport::default()
        };
        self.state = EpochState::Running;
        self.end_returned = false;
        self.commands
            .as_ref()
            .and_then(|c| c.send(EpochCommand { start, share }).ok())
            .ok_or_else(|| Error::Worker("the prefetch thread has exited".into()))
    }

    /// Refuses to run in a process forked from the one that built the pipeline, where waiting
    /// for its threads would wait forever.
    fn check_process(&self) -> Result<()> {
        let current = std::process::id();
        if current == self.process {
            Ok(())
        } else {
            Err(Error::Forked {
                built: self.process,
                current,
            })
        }
    }

    /// The next batch of the current epoch, waiting only if none is ready yet; `Ok(None)` once
    /// the epoch is over (see [`Pipeline::next_epoch`]). Under [`OnError::Fail`](crate::OnError::Fail) the first bad
    /// image ends the epoch with [`Error::Item`].
    pub fn next_batch(&mut self) -> Result<Option<Batch>> {
        match self.receive(None)? {
            WaitedBatch::Ready(batch) => Ok(Some(*batch)),
            WaitedBatch::EpochEnd | WaitedBatch::NotYet => Ok(None),
        }
    }

    /// [`Pipeline::next_batch`], waiting at most `timeout`: a caller that must stay responsive
    /// while the batch is made (to an interrupt, say) waits in slices.
    ///
    /// ```
    /// use std::time::Duration;
    /// use gpufeed::{Device, Pipeline, ResizeMode, Source, WaitedBatch};
    /// let mut pipeline = Pipeline::builder()
    ///     .source(Source::directory("assets")?)
    ///     .resize(ResizeMode::stretch(32, 32))
    ///     .device(Device::Cpu)
    ///     .build()?;
    /// let mut images = 0;
    /// loop {
    ///     match pipeline.wait_batch(Duration::from_millis(20))? {
    ///         WaitedBatch::Ready(batch) => images += batch.len(),
    ///         WaitedBatch::NotYet => {} // check for an interrupt here, then wait again
    ///         WaitedBatch::EpochEnd => break,
    ///     }
    /// }
    /// assert_eq!(images, pipeline.len());
    /// # Ok::<(), gpufeed::Error>(())
    /// ```
    pub fn wait_batch(&mut self, timeout: Duration) -> Result<WaitedBatch> {
        self.receive(Some(timeout))
    }

    fn receive(&mut self, timeout: Option<Duration>) -> Result<WaitedBatch> {
        if self.state == EpochState::Ended {
            return Ok(WaitedBatch::EpochEnd);
        }
        self.check_process()?;
        let waiting = Instant::now();
        let received = match (self.batches.as_ref(), timeout) {
            (None, _) => None,
            (Some(batches), None) => batches.recv().ok(),
            (Some(batches), Some(timeout)) => match batches.recv_timeout(timeout) {
                Ok(message) => Some(message),
                Err(RecvTimeoutError::Timeout) => {
                    self.stopwatch.add(Stage::WaitBatch, waiting.elapsed());
                    return Ok(WaitedBatch::NotYet);
                }
                Err(RecvTimeoutError::Disconnected) => None,
            },
        };
        self.stopwatch.add(Stage::WaitBatch, waiting.elapsed());
        let message = received.ok_or_else(|| {
            self.state = EpochState::Ended;
            Error::Worker("the prefetch thread stopped unexpectedly".into())
        })?;
        match message {
            Message::Batch(batch) => match *batch {
                Ok(batch) => {
                    self.progress.position = batch.next_position;
                    self.progress.rows += batch.len();
                    self.progress.batches += 1;
                    self.report.images += batch.len();
                    self.report.padded += batch.padded().iter().filter(|&&p| p).count();
                    self.report.batches += 1;
                    self.report.decoded_by_cpu += batch.decoded_by.cpu;
                    self.report.decoded_by_gpu += batch.decoded_by.gpu;
                    self.report.decoded_by_assisted += batch.decoded_by.assisted;
                    self.report.skipped.extend_from_slice(batch.skipped());
                    self.learn_bad(batch.skipped());
                    Ok(WaitedBatch::Ready(Box::new(batch)))
                }
                Err(error) => {
                    // The worker ends the epoch after an error; consume its end marker.
                    self.drain_epoch();
                    if let Error::Item(item) = &error {
                        self.report.skipped.push(item.clone());
                    }
                    Err(error)
                }
            },
            Message::EndOfEpoch {
                trailing_skipped,
                dropped,
                complete,
                reads,
            } => {
                self.learn_bad(&trailing_skipped);
                self.report.skipped.extend(trailing_skipped);
                self.report.dropped = dropped;
                self.report.complete = complete;
                self.report.reads = reads;
                self.state = EpochState::Ended;
                Ok(WaitedBatch::EpochEnd)
            }
        }
    }

    /// Notes the images skipped for what they hold (not for a read that failed, which may
    /// succeed next time), for [`Pipeline::batches_per_epoch`].
    fn learn_bad(&mut self, skipped: &[crate::ItemError]) {
        for item in skipped {
            if !matches!(item.kind, crate::ItemErrorKind::Read { .. }) {
                self.known_bad.insert(item.index);
            }
        }
    }

    /// Receives and discards messages up to the end of the current epoch.
    fn drain_epoch(&mut self) {
        while self.state == EpochState::Running {
            match self.batches.as_ref().and_then(|b| b.recv().ok()) {
                Some(Message::EndOfEpoch {
                    complete, reads, ..
                }) => {
                    self.report.complete = complete;
                    self.report.reads = reads;
                    self.state = EpochState::Ended;
                }
                Some(Message::Batch(_)) => {}
                None => self.state = EpochState::Ended,
            }
        }
    }

    /// Starts the next epoch (reshuffled when shuffling) and returns its number. Batches of the
    /// current epoch not consumed yet are abandoned.
    pub fn next_epoch(&mut self) -> Result<u64> {
        self.check_process()?;
        self.abandon_epoch();
        self.begin_epoch(self.epoch + 1)?;
        Ok(self.epoch)
    }

    /// Abandons what is left of the current epoch.
    fn abandon_epoch(&mut self) {
        if self.state == EpochState::Running {
            self.abandon.store(true, Ordering::SeqCst);
            self.drain_epoch();
            self.abandon.store(false, Ordering::SeqCst);
        }
    }

    /// Where the pipeline stands, as its consumer saw it: the epoch and the position after the
    /// last batch handed out (batches prepared ahead do not count), once an epoch has ended the
    /// beginning of the next. Save it beside the model's checkpoint, and give it to
    /// [`PipelineBuilder::resume`] (or [`Pipeline::resume`]) to go on from there; see
    /// [`PipelineState`].
    pub fn state(&self) -> PipelineState {
        let start = if self.state == EpochState::Ended && self.report.complete {
            EpochStart::beginning(self.epoch + 1)
        } else {
            self.progress
        };
        PipelineState::new(
            start,
            self.options.batching.shard,
            self.gpu_share(),
            &self.fingerprint,
        )
    }

    /// Goes on from `state` (a pipeline's [`Pipeline::state`]): what is left of the current
    /// epoch is abandoned, and the next batch is the one that followed where `state` was taken.
    /// Refused, with nothing abandoned, when `state` does not fit this pipeline (another source
    /// listing or output options, see [`PipelineState`]).
    pub fn resume(&mut self, state: &PipelineState) -> Result<()> {
        check_planned_world(state, &self.options)?;
        let configured = self.plan.configured_share();
        let (start, share) =
            state.resume_start(&self.fingerprint, self.options.batching.shard, configured)?;
        check_reach(&self.sampler, start, self.options.batching.shard)?;
        self.abandon_epoch();
        self.begin(start, self.plan.applying(share))
    }

    /// The current epoch number (the first is 0).
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// What happened to every image of the current epoch so far; complete once
    /// [`Pipeline::next_batch`] has returned `Ok(None)`.
    pub fn epoch_report(&self) -> &EpochReport {
        &self.report
    }

    /// Images per epoch for this process (its shard), before any is skipped.
    pub fn len(&self) -> usize {
        self.shard_len
    }

    /// Batches an epoch yields for this process (padding rows included, a partial last batch
    /// counted unless dropped): what PyTorch's `len(DataLoader)` counts, for progress bars and
    /// schedules. Images known to be unreadable are counted out: damaged parts of shards and
    /// keys no client can request (known from the listing), and files an earlier epoch skipped
    /// for what they hold. With equal shards every rank yields its full count whatever fails;
    /// otherwise an epoch over files not read before yields fewer when some turn out unreadable.
    pub fn batches_per_epoch(&self) -> usize {
        if let Some(planned) = self.planned_batches {
            return planned;
        }
        let batching = &self.options.batching;
        let refills =
            batching.shard.world > 1 && batching.shard_balance != crate::ShardBalance::Uneven;
        let mut positions = self.sampler.positions();
        if !refills && !self.known_bad.is_empty() {
            let bad = match batching.shard.world {
                1 => self.known_bad.len(),
                _ => {
                    let order = self.sampler.epoch_from(self.epoch, 0);
                    order
                        .indices()
                        .iter()
                        .filter(|i| self.known_bad.contains(i))
                        .count()
                }
            };
            positions = positions.saturating_sub(bad);
        }
        let batch_size = batching.batch_size.max(1);
        match batching.last_batch {
            crate::LastBatch::Drop => positions / batch_size,
            crate::LastBatch::Keep => positions.div_ceil(batch_size),
        }
    }

    /// Whether an epoch has no images.
    pub fn is_empty(&self) -> bool {
        self.shard_len == 0
    }

    /// Images in the whole source (all shards).
    pub fn source_len(&self) -> usize {
        self.source_len
    }

    /// Class names by label, for [`Source::image_folder`] sources.
    pub fn class_names(&self) -> Option<&[String]> {
        self.class_names.as_deref()
    }

    /// The options in force.
    pub fn options(&self) -> &Options {
        &self.options
    }

    /// The views made of each image, in a pipeline of views ([`PipelineBuilder::views`]).
    pub fn views(&self) -> Option<&Views> {
        self.views.as_deref()
    }

    /// The device the batches land on, in words.
    pub fn device_description(&self) -> &str {
        &self.device_description
    }

    /// Why the pipeline runs on the CPU, when a CUDA device was asked for with
    /// [`PipelineBuilder::cpu_fallback`] and could not be used: the driver, NVRTC or the device
    /// missing, in words. `None` when it runs on the device asked for.
    pub fn cpu_fallback(&self) -> Option<&str> {
        self.cpu_fallback.as_deref()
    }

    /// The CUDA stream every batch is uploaded, written and freed on (none on the CPU device).
    /// Work queued on it is ordered with the batches by the stream itself: give it to a
    /// framework that can run on a caller's stream (ONNX Runtime's `with_compute_stream`), or
    /// declare other streams with [`crate::DeviceTensor::use_on`].
    pub fn cuda_stream(&self) -> Option<&Arc<CudaStream>> {
        self.cuda_stream.as_ref()
    }

    /// While the GPU decode lane runs, its share of the images it can take: as given, or as it
    /// follows the lanes' measured rates (`None` while it does not run). Giving it back
    /// ([`PipelineBuilder::gpu_share`]) keeps it, and puts every image on the same lane in a
    /// later run.
    pub fn gpu_share(&self) -> Option<f32> {
        self.lanes_report().share
    }

    /// Which lanes decode the images, and why, in words: the CPU alone (as asked, or because
    /// the GPU decode lane cannot run here, with the reason), or the CPU and the GPU's JPEG
    /// engines with the GPU lane's share. With [`crate::Decode::Auto`] the GPU lane opens beside
    /// the first batches, so this changes once it runs.
    pub fn decode_description(&self) -> String {
        self.lanes_report().description
    }

    /// Where the pipeline's time went since it was built: each stage's time, summed over the
    /// threads that ran it, and how many times it ran. The stage that keeps the others waiting
    /// is the one to look at: [`Stage::WaitBatch`] high means the pipeline is the bottleneck,
    /// [`Stage::WaitConsumer`] high means the consumer is.
    ///
    /// [`Stage::WaitBatch`]: crate::Stage::WaitBatch
    /// [`Stage::WaitConsumer`]: crate::Stage::WaitConsumer
    pub fn profile(&self) -> Profile {
        self.stopwatch.profile()
    }

    fn lanes_report(&self) -> LanesReport {
        self.lanes_report
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// Page-locked host memory the pipeline holds: the staging ring, and the CPU lane's images
    /// of their own, which it prepares into ahead of the batches and uploads from (allocated a
    /// chunk before each of the first batches); 0 on the CPU device.
    pub fn pinned_bytes(&self) -> usize {
        self.pinned_bytes
    }
}

/// What a pipeline is planned as before anything starts: its options checked, its order, the
/// decode plan and where it begins.
struct Planned {
    augmenter: Option<(Augmenter, usize)>,
    fingerprint: Fingerprint,
    sampler: Sampler,
    /// This rank's real images an epoch.
    shard_len: usize,
    /// timm's patch sequences: batches planned ahead of every epoch.
    schedule: Option<NaflexSchedule>,
    plan: DecodePlan,
    start: EpochStart,
}

impl Planned {
    /// Checks `options` (and `views`) against `source` and plans the run, fitting `options`'
    /// batch size to the epoch (or to timm's largest planned batch) and taking a `resume`
    /// state's settings.
    fn new(
        source: &Source,
        options: &mut Options,
        views: Option<&Arc<Views>>,
        resume: Option<&PipelineState>,
    ) -> Result<Planned> {
        options.validate()?;
        if let Some(views) = views {
            views_output::check_views(views, options)?;
        }
        if source.is_empty() {
            return Err(Error::invalid("source", "the source has no images"));
        }
        let augmenter = augmenter(options, source)?;
        let fingerprint =
            Fingerprint::new(source.listing(), options).with_views(views.map(|v| format!("{v:?}")));
        let sampler =
            Sampler::new(source.len(), &options.batching).with_blocks(source.shuffle_blocks());
        let shard_len = sampler.real_len();
        // timm's patch sequences: batches planned ahead of every epoch, the largest of which
        // the batches' memory is sized for.
        let schedule = batch_schedule(options, sampler.positions())?;
        if let Some(schedule) = &schedule {
            options.batching.batch_size = schedule.largest();
        }
        let mut plan = DecodePlan::new(options);
        if views.is_some() {
            plan = plan.for_views();
        }
        let start = match resume {
            Some(state) => resume_start(state, &fingerprint, &mut plan, options)?,
            None => EpochStart::beginning(0),
        };
        if resume.is_some() {
            check_reach(&sampler, start, options.batching.shard)?;
        }
        if schedule.is_none() {
            fit_batch(options, &sampler);
        }
        Ok(Planned {
            augmenter,
            fingerprint,
            sampler,
            shard_len,
            schedule,
            plan,
            start,
        })
    }
}

/// An epoch's encoded bytes, from the sizes of the first files (a stat each, or the listing's
/// sizes in object storage), and the mix of its work, from files spread over the listing (their
/// names' extensions and sizes); `shard_len` images an epoch.
fn epoch_sample(source: &Source, shard_len: usize) -> EpochSample {
    let sampled = source.len().min(EPOCH_BYTES_SAMPLE);
    let bytes: u64 = (0..sampled).map(|i| source.item(i).size_hint()).sum();
    let spread: Vec<usize> = (0..sampled)
        .map(|k| k * source.len() / sampled.max(1))
        .collect();
    let names: Vec<&str> = spread.iter().map(|&i| source.item(i).id()).collect();
    EpochSample {
        bytes: bytes / sampled.max(1) as u64 * shard_len as u64,
        mix: WorkMix::of_names(&names, |k| source.item(spread[k]).size_hint()),
    }
}

/// Where a pipeline resumed from `state` begins, once `state` is found to fit its listing
/// (`fingerprint`) and options; a share the state recorded is kept from the start (`plan` and
/// `options` take it), so that every image goes to the lane it went to.
fn resume_start(
    state: &PipelineState,
    fingerprint: &Fingerprint,
    plan: &mut DecodePlan,
    options: &mut Options,
) -> Result<EpochStart> {
    check_planned_world(state, options)?;
    let configured = plan.configured_share();
    let (start, share) = state.resume_start(fingerprint, options.batching.shard, configured)?;
    if let Some(share) = plan.resume_with(share) {
        options.decode.gpu_share = Some(share);
    }
    Ok(start)
}

/// What sizes a pipeline's buffers: the outputs' geometry (or the views of each image), an
/// epoch's images for this process and, with MixUp or CutMix, the soft labels' classes (0
/// without).
#[derive(Clone)]
struct Sizes {
    geometry: Geometry,
    images: usize,
    classes: usize,
    views: Option<Arc<crate::cpu::LaneViews>>,
}

/// timm's batches planned ahead of every epoch, for `positions` positions an epoch (this rank's,
/// the same on every rank with equal shards): a sequence length and a size each, drawn from the
/// seed. `None` for any other output.
fn batch_schedule(options: &Options, positions: usize) -> Result<Option<NaflexSchedule>> {
    match &options.patches {
        Some(patches) if patches.preset == Preset::TimmNaflex => patches
            .schedule(options.resize.seed, positions)
            .map(Some)
            .map_err(|e| Error::invalid("seq_lens", e.to_string())),
        _ => Ok(None),
    }
}

/// Refuses to resume a state of timm's patch sequences in another world: its batches are
/// planned over each rank's positions, which another world splits otherwise.
fn check_planned_world(state: &PipelineState, options: &Options) -> Result<()> {
    let planned = options
        .patches
        .is_some_and(|p| p.preset == Preset::TimmNaflex);
    let (saved, here) = (state.shard().world, options.batching.shard.world);
    if planned && saved != here {
        return Err(Error::invalid(
            "resume",
            format!(
                "timm-naflex plans each rank's batches ahead: a state saved with {saved} ranks \
                 resumes with {saved}, not {here}"
            ),
        ));
    }
    Ok(())
}

/// What a pipeline starts before its device opens: the decode plan, the output stage's plan
/// (batches the host cannot hold are refused before any work begins) and the lanes, as far as
/// they go without the device.
struct Starting {
    plan: DecodePlan,
    output: OutputPlan,
    lanes: LanesStarting,
}

impl Starting {
    /// Starts what `plan` and `options` ask for, for the `sizes` of the outputs and epochs
    /// (`epoch_bytes` estimates an epoch's encoded bytes); the stages' times go to `stopwatch`.
    fn new(
        plan: DecodePlan,
        options: &Options,
        sizes: Sizes,
        epoch_bytes: impl FnOnce() -> EpochSample,
        stopwatch: &Arc<Stopwatch>,
    ) -> Result<Starting> {
        let Sizes {
            geometry,
            images,
            classes,
            views,
        } = sizes;
        let image_bytes = crate::views::lane_output_bytes(views.as_deref(), &geometry);
        let lanes_bytes = Lanes::device_bytes(&plan, image_bytes, options.batching.batch_size);
        let output = OutputPlan::new(options, &geometry, lanes_bytes, classes, views.as_deref())?;
        let lanes = Lanes::start(
            &plan,
            options,
            (geometry, views),
            images,
            epoch_bytes,
            stopwatch,
        )?;
        Ok(Starting {
            plan,
            output,
            lanes,
        })
    }

    /// Opens the CUDA device `options` ask for (none for the CPU). Where CUDA cannot be used and
    /// [`RuntimeOptions::cpu_fallback`](crate::RuntimeOptions::cpu_fallback) allows, the
    /// pipeline runs on the CPU device instead: `options` turn to it, `restart` starts its lanes
    /// and plans in place of those started for the GPU (the epoch's order stays planned; the CPU
    /// lane works batch by batch), and the reason comes back beside.
    fn open_device(
        &mut self,
        options: &mut Options,
        restart: impl FnOnce(DecodePlan, &Options) -> Result<Starting>,
    ) -> Result<(Option<Gpu>, Option<String>)> {
        let crate::Device::Cuda(ordinal) = options.runtime.device else {
            return Ok((None, None));
        };
        match Gpu::open(ordinal) {
            Ok(gpu) => Ok((Some(gpu), None)),
            Err(Error::CudaUnavailable(why)) if options.runtime.cpu_fallback => {
                options.runtime.device = crate::Device::Cpu;
                *self = restart(self.plan.on_the_cpu(), options)?;
                Ok((None, Some(why.to_string())))
            }
            Err(e) => Err(e),
        }
    }
}

/// No batch holds more rows than an epoch's positions: the batch size is cut to them, so that
/// buffers are not sized for rows that never come (with the last batch dropped, a batch that
/// large is none at all, and the size is left as it is).
fn fit_batch(options: &mut Options, sampler: &Sampler) {
    if options.batching.last_batch == crate::LastBatch::Keep {
        let most = sampler.positions().max(1);
        options.batching.batch_size = options.batching.batch_size.min(most);
    }
}

/// Refuses a resumed `start` past the end of its epoch's order for this rank.
fn check_reach(sampler: &Sampler, start: EpochStart, shard: crate::Shard) -> Result<()> {
    let reach = sampler.epoch_from(start.epoch, start.from).reach(0);
    Ok(PipelineState::check_reach(start, shard, reach)?)
}

/// The draws of the pipeline's augmentations and the class count of its soft labels, when it
/// augments; refuses mixing without labels to mix.
fn augmenter(options: &Options, source: &Source) -> Result<Option<(Augmenter, usize)>> {
    let augment = options.augment;
    if !augment.is_on() {
        return Ok(None);
    }
    let (height, width) = options.resize.output_size();
    let augmenter = Augmenter {
        options: augment,
        seed: options.resize.seed,
        width,
        height,
    };
    if !augment.mixes() {
        return Ok(Some((augmenter, 0)));
    }
    if !source.has_labels() {
        return Err(Error::invalid(
            "mixup/cutmix",
            "MixUp and CutMix mix labels: the source has none (use an image folder, paths with \
             labels, or tar shards with .cls members)",
        ));
    }
    let classes = augment
        .num_classes
        .or_else(|| source.class_names().map(<[String]>::len))
        .ok_or_else(|| {
            Error::invalid(
                "num_classes",
                "MixUp and CutMix make soft labels over num_classes classes: give it (the \
                 source has no class names to count)",
            )
        })?;
    Ok(Some((augmenter, classes)))
}

impl Drop for Pipeline {
    fn drop(&mut self) {
        if self.check_process().is_err() {
            // A fork has neither the threads to join nor the CUDA context to free in: leave
            // them alone (the parent's own copy still frees them).
            std::mem::forget(self.worker.take());
            std::mem::forget(self.cuda_stream.take());
            return;
        }
        self.stop.store(true, Ordering::SeqCst);
        self.abandon.store(true, Ordering::SeqCst);
        // Threads waiting for an object in object storage stop waiting.
        self.source.stop_reads();
        // Closing both channels wakes the worker wherever it waits.
        self.commands.take();
        self.batches.take();
        if let Some(worker) = self.worker.take() {
            let _ = worker.join();
        }
    }
}

/// The batches of one epoch at a time: `for batch in &mut pipeline` runs the current epoch to
/// its end, and a later loop over the pipeline starts the next epoch (reshuffled when
/// shuffling), so no epoch starts that nobody asked for. The first epoch starts when the
/// pipeline is built.
///
/// ```
/// # use gpufeed::{Device, Pipeline, ResizeMode, Source};
/// let mut pipeline = Pipeline::builder()
///     .source(Source::directory("assets")?)
///     .resize(ResizeMode::stretch(32, 32))
///     .batch_size(4)
///     .device(Device::Cpu)
///     .build()?;
/// for epoch in 0..2 {
///     for batch in &mut pipeline {
///         let batch = batch?;
///         assert_eq!(batch.epoch(), epoch);
///     }
/// }
/// # Ok::<(), gpufeed::Error>(())
/// ```
impl Iterator for Pipeline {
    type Item = Result<Batch>;

    fn next(&mut self) -> Option<Result<Batch>> {
        if self.end_returned {
            if let Err(e) = self.begin_epoch(self.epoch + 1) {
                return Some(Err(e));
            }
        }
        match self.next_batch() {
            Ok(Some(batch)) => Some(Ok(batch)),
            Ok(None) => {
                self.end_returned = true;
                None
            }
            Err(e) => Some(Err(e)),
        }
    }
}
