//! [`Pipeline`]: the prefetch thread that wires the stages together, and its builder.
//!
//! One background thread per pipeline runs epochs: for each batch it takes a staging slot, has the
//! CPU stage (a rayon pool) fill it, then hands it to the device stage (upload + kernel on the
//! pipeline's stream, or the CPU reference) and queues the resulting [`Batch`]. A bounded channel
//! keeps at most `prefetch` batches ready ahead of the consumer.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;

use crate::batch::{Batch, EpochReport};
use crate::config::{
    ChannelOrder, Config, DType, Device, Interpolation, LastBatch, Layout, OnError, ResizeMode,
};
use crate::error::{Error, ItemError, Result};
use crate::gpu::{Gpu, NormalizeKernel, StagingRing};
use crate::prepare::{fill_slot, PrepareOptions};
use crate::reference::{normalize, NormalizeSpec};
use crate::source::{Sampler, Source};
use crate::tensor::Tensor;

/// Staging slots per pipeline: the CPU fills one while the previous one uploads.
const STAGING_SLOTS: usize = 2;

/// Builds a [`Pipeline`]; every option has torchvision's default.
#[derive(Debug, Clone, Default)]
pub struct PipelineBuilder {
    source: Option<Source>,
    config: Config,
}

impl PipelineBuilder {
    /// The images to read (required).
    pub fn source(mut self, source: Source) -> Self {
        self.source = Some(source);
        self
    }

    /// Replaces every option at once.
    pub fn config(mut self, config: Config) -> Self {
        self.config = config;
        self
    }

    /// Images per batch (default 256).
    pub fn batch_size(mut self, n: usize) -> Self {
        self.config.batch_size = n;
        self
    }

    /// torchvision's `Resize(shorter_side)` (default 256), followed by the centre crop.
    pub fn resize(mut self, shorter_side: u32) -> Self {
        self.config.resize_mode = ResizeMode::ShorterSideThenCenterCrop { shorter_side };
        self
    }

    /// torchvision's `CenterCrop(size)`: the output is `size` x `size` (default 224).
    pub fn center_crop(mut self, size: u32) -> Self {
        self.config.height = size;
        self.config.width = size;
        self
    }

    /// Output size in pixels, for non-square outputs.
    pub fn output_size(mut self, height: u32, width: u32) -> Self {
        self.config.height = height;
        self.config.width = width;
        self
    }

    /// How images reach the output size (default: shorter side, then centre crop).
    pub fn resize_mode(mut self, mode: ResizeMode) -> Self {
        self.config.resize_mode = mode;
        self
    }

    /// Resampling filter (default: antialiased bilinear).
    pub fn interpolation(mut self, interpolation: Interpolation) -> Self {
        self.config.interpolation = interpolation;
        self
    }

    /// Per-channel mean and standard deviation in 0..1 units, RGB order (default ImageNet's).
    /// They apply to the colour they name whatever the output channel order.
    pub fn mean_std(mut self, mean: [f32; 3], std: [f32; 3]) -> Self {
        self.config.mean = mean;
        self.config.std = std;
        self
    }

    /// Output element type (default f16).
    pub fn dtype(mut self, dtype: DType) -> Self {
        self.config.dtype = dtype;
        self
    }

    /// Output layout (default NCHW).
    pub fn layout(mut self, layout: Layout) -> Self {
        self.config.layout = layout;
        self
    }

    /// Output channel order (default RGB).
    pub fn channel_order(mut self, order: ChannelOrder) -> Self {
        self.config.channel_order = order;
        self
    }

    /// Batches prepared ahead of the consumer (default 2).
    pub fn prefetch(mut self, depth: usize) -> Self {
        self.config.prefetch = depth;
        self
    }

    /// Threads of the CPU stage (default 0: one per core).
    pub fn threads(mut self, threads: usize) -> Self {
        self.config.threads = threads;
        self
    }

    /// Where the output lives (default `Device::Cuda(0)`).
    pub fn device(mut self, device: Device) -> Self {
        self.config.device = device;
        self
    }

    /// What a bad image does (default: skip it and list it on the batch).
    pub fn on_error(mut self, policy: OnError) -> Self {
        self.config.on_error = policy;
        self
    }

    /// Keep or drop a last partial batch (default keep).
    pub fn last_batch(mut self, policy: LastBatch) -> Self {
        self.config.last_batch = policy;
        self
    }

    /// Shuffle each epoch with a permutation drawn from `seed` and the epoch number.
    pub fn shuffle(mut self, seed: u64) -> Self {
        self.config.shuffle_seed = Some(seed);
        self
    }

    /// Take only this process's part: every `world`-th image of the (shuffled) order starting at
    /// `rank`. The parts of ranks `0..world` are disjoint and cover the source.
    pub fn shard(mut self, rank: usize, world: usize) -> Self {
        self.config.shard = (rank, world);
        self
    }

    /// Refuse images that claim more pixels than this (default [`crate::DEFAULT_MAX_PIXELS`]).
    pub fn max_pixels(mut self, max_pixels: u64) -> Self {
        self.config.max_pixels = max_pixels;
        self
    }

    /// Rotate and flip images as their EXIF orientation tag says (default off, like torchvision,
    /// whose PIL loader ignores the tag).
    pub fn exif_orientation(mut self, apply: bool) -> Self {
        self.config.exif_orientation = apply;
        self
    }

    /// Decode large JPEGs reduced in the DCT domain (default off); see [`Config::dct_scaling`].
    pub fn dct_scaling(mut self, on: bool) -> Self {
        self.config.dct_scaling = on;
        self
    }

    /// Checks the options, opens the device, compiles the kernel, allocates the staging ring and
    /// starts the first epoch in the background.
    pub fn build(self) -> Result<Pipeline> {
        let source = self
            .source
            .ok_or_else(|| Error::Config("no source: call .source(...)".into()))?;
        Pipeline::start(source, self.config)
    }
}

/// Turns a [`Source`] into batches on the device, prepared in the background.
///
/// ```no_run
/// use gpufeed::{DType, Device, Layout, Pipeline, Source, IMAGENET_MEAN, IMAGENET_STD};
///
/// let mut pipeline = Pipeline::builder()
///     .source(Source::image_folder("val/")?)
///     .batch_size(256)
///     .resize(256)
///     .center_crop(224)
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
    config: Config,
    source_len: usize,
    shard_len: usize,
    class_names: Option<Vec<String>>,
    device_description: String,
    pinned_bytes: usize,
    epoch: u64,
    state: EpochState,
    report: EpochReport,
    abandon: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    commands: Option<Sender<u64>>,
    batches: Option<Receiver<Message>>,
    worker: Option<JoinHandle<()>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EpochState {
    Running,
    Ended,
}

enum Message {
    Batch(Result<Batch>),
    /// The epoch is over; carries what no batch carried: skipped images after the last batch and
    /// images dropped with a partial last batch.
    EndOfEpoch {
        trailing_skipped: Vec<ItemError>,
        dropped: usize,
        complete: bool,
    },
}

impl std::fmt::Debug for Pipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pipeline")
            .field("config", &self.config)
            .field("images", &self.shard_len)
            .field("device", &self.device_description)
            .field("epoch", &self.epoch)
            .finish_non_exhaustive()
    }
}

impl Pipeline {
    /// A builder with torchvision's defaults.
    pub fn builder() -> PipelineBuilder {
        PipelineBuilder::default()
    }

    fn start(source: Source, config: Config) -> Result<Pipeline> {
        config.validate()?;
        let options = PrepareOptions::from_config(&config);
        let spec = NormalizeSpec {
            affine: config.affine(),
            dtype: config.dtype,
            layout: config.layout,
            channel_order: config.channel_order,
        };
        let slot_bytes = config
            .batch_size
            .checked_mul(options.image_bytes())
            .ok_or_else(|| Error::Config("batch size times image size overflows".into()))?;
        let device_stage = DeviceStage::open(config.device, slot_bytes, spec)?;
        let device_description = device_stage.describe();
        let pinned_bytes = device_stage.pinned_bytes();
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(config.threads)
            .thread_name(|i| format!("gpufeed-cpu-{i}"))
            .build()
            .map_err(|e| Error::Config(format!("cannot start the CPU stage threads: {e}")))?;
        let sampler = Sampler {
            len: source.len(),
            shuffle_seed: config.shuffle_seed,
            rank: config.shard.0,
            world: config.shard.1,
        };
        let shard_len = sampler.epoch_order(0).len();
        let (command_tx, command_rx) = mpsc::channel::<u64>();
        let (batch_tx, batch_rx) = mpsc::sync_channel::<Message>(config.prefetch - 1);
        let abandon = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let worker = Worker {
            class_names: source.class_names().map(|c| c.to_vec()),
            labelled: source.has_labels(),
            source,
            sampler,
            options,
            batch_size: config.batch_size,
            last_batch: config.last_batch,
            device_stage,
            pool,
            abandon: abandon.clone(),
            stop: stop.clone(),
        };
        let class_names = worker.class_names.clone();
        let source_len = worker.source.len();
        let handle = std::thread::Builder::new()
            .name("gpufeed-prefetch".into())
            .spawn(move || worker.run(command_rx, batch_tx))
            .map_err(|e| Error::Worker(format!("cannot start the prefetch thread: {e}")))?;
        let mut pipeline = Pipeline {
            config,
            source_len,
            shard_len,
            class_names,
            device_description,
            pinned_bytes,
            epoch: 0,
            state: EpochState::Ended,
            report: EpochReport::default(),
            abandon,
            stop,
            commands: Some(command_tx),
            batches: Some(batch_rx),
            worker: Some(handle),
        };
        pipeline.begin_epoch(0)?;
        Ok(pipeline)
    }

    fn begin_epoch(&mut self, epoch: u64) -> Result<()> {
        self.epoch = epoch;
        self.report = EpochReport {
            epoch,
            ..EpochReport::default()
        };
        self.state = EpochState::Running;
        self.commands
            .as_ref()
            .and_then(|c| c.send(epoch).ok())
            .ok_or_else(|| Error::Worker("the prefetch thread has exited".into()))
    }

    /// The next batch of the current epoch, waiting only if none is ready yet; `Ok(None)` once
    /// the epoch is over (see [`Pipeline::next_epoch`]). Under [`OnError::Fail`] the first bad
    /// image ends the epoch with [`Error::Item`].
    pub fn next_batch(&mut self) -> Result<Option<Batch>> {
        if self.state == EpochState::Ended {
            return Ok(None);
        }
        let message = self
            .batches
            .as_ref()
            .and_then(|b| b.recv().ok())
            .ok_or_else(|| {
                self.state = EpochState::Ended;
                Error::Worker("the prefetch thread stopped unexpectedly".into())
            })?;
        match message {
            Message::Batch(Ok(batch)) => {
                self.report.images += batch.len();
                self.report.batches += 1;
                self.report.skipped.extend_from_slice(batch.skipped());
                Ok(Some(batch))
            }
            Message::Batch(Err(error)) => {
                // The worker ends the epoch after an error; consume its end marker.
                self.drain_epoch();
                if let Error::Item(item) = &error {
                    self.report.skipped.push(item.clone());
                }
                Err(error)
            }
            Message::EndOfEpoch {
                trailing_skipped,
                dropped,
                complete,
            } => {
                self.report.skipped.extend(trailing_skipped);
                self.report.dropped = dropped;
                self.report.complete = complete;
                self.state = EpochState::Ended;
                Ok(None)
            }
        }
    }

    /// Receives and discards messages up to the end of the current epoch.
    fn drain_epoch(&mut self) {
        while self.state == EpochState::Running {
            match self.batches.as_ref().and_then(|b| b.recv().ok()) {
                Some(Message::EndOfEpoch { complete, .. }) => {
                    self.report.complete = complete;
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
        if self.state == EpochState::Running {
            self.abandon.store(true, Ordering::SeqCst);
            self.drain_epoch();
            self.abandon.store(false, Ordering::SeqCst);
        }
        self.begin_epoch(self.epoch + 1)?;
        Ok(self.epoch)
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
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The device the batches land on, in words.
    pub fn device_description(&self) -> &str {
        &self.device_description
    }

    /// Page-locked host memory held by the staging ring (0 on the CPU device).
    pub fn pinned_bytes(&self) -> usize {
        self.pinned_bytes
    }
}

impl Drop for Pipeline {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        self.abandon.store(true, Ordering::SeqCst);
        // Closing both channels wakes the worker wherever it waits.
        self.commands.take();
        self.batches.take();
        if let Some(worker) = self.worker.take() {
            let _ = worker.join();
        }
    }
}

/// The last stage: a filled staging slot becomes the batch's tensor.
enum DeviceStage {
    Cuda {
        gpu: Gpu,
        ring: Box<StagingRing>,
        kernel: NormalizeKernel,
        spec: NormalizeSpec,
    },
    Cpu {
        slot: Vec<u8>,
        spec: NormalizeSpec,
    },
}

impl DeviceStage {
    fn open(device: Device, slot_bytes: usize, spec: NormalizeSpec) -> Result<DeviceStage> {
        match device {
            Device::Cpu => Ok(DeviceStage::Cpu {
                slot: vec![0; slot_bytes],
                spec,
            }),
            Device::Cuda(ordinal) => {
                let gpu = Gpu::open(ordinal)?;
                // The device holds the u8 input and at least one output batch at a time.
                let needed = slot_bytes as u128 * (1 + spec.dtype.size_of() as u128);
                let (free, _) = gpu.memory()?;
                if needed > free as u128 {
                    return Err(Error::OutOfDeviceMemory(format!(
                        "a batch needs {:.2} GB on {} ({:.2} GB free): use a smaller batch size",
                        needed as f64 / 1e9,
                        gpu.describe(),
                        free as f64 / 1e9
                    )));
                }
                let kernel = NormalizeKernel::compile(gpu.stream())?;
                let ring = Box::new(StagingRing::new(gpu.stream(), STAGING_SLOTS, slot_bytes)?);
                Ok(DeviceStage::Cuda {
                    gpu,
                    ring,
                    kernel,
                    spec,
                })
            }
        }
    }

    fn describe(&self) -> String {
        match self {
            DeviceStage::Cuda { gpu, .. } => gpu.describe(),
            DeviceStage::Cpu { .. } => "CPU".into(),
        }
    }

    fn pinned_bytes(&self) -> usize {
        match self {
            DeviceStage::Cuda { ring, .. } => ring.pinned_bytes(),
            DeviceStage::Cpu { .. } => 0,
        }
    }

    fn slots(&self) -> usize {
        match self {
            DeviceStage::Cuda { ring, .. } => ring.len(),
            DeviceStage::Cpu { .. } => 1,
        }
    }

    /// Staging slot `index`, writable.
    fn slot_mut(&mut self, index: usize) -> Result<&mut [u8]> {
        match self {
            DeviceStage::Cuda { ring, .. } => ring.slot_mut(index),
            DeviceStage::Cpu { slot, .. } => Ok(slot),
        }
    }

    /// The first `n` images of slot `index` as the output tensor, and the bytes uploaded.
    fn finish(
        &mut self,
        index: usize,
        n: usize,
        height: usize,
        width: usize,
    ) -> Result<(Tensor, usize)> {
        let bytes = n * height * width * 3;
        match self {
            DeviceStage::Cuda {
                gpu,
                ring,
                kernel,
                spec,
            } => {
                let input = ring.upload(index, bytes)?;
                let tensor = kernel.run(gpu.stream(), input, n, height, width, spec)?;
                Ok((Tensor::Device(tensor), bytes))
            }
            DeviceStage::Cpu { slot, spec } => {
                let tensor = normalize(slot, n, height, width, spec);
                Ok((Tensor::Host(tensor), 0))
            }
        }
    }
}

/// Everything the prefetch thread owns.
struct Worker {
    source: Source,
    class_names: Option<Vec<String>>,
    labelled: bool,
    sampler: Sampler,
    options: PrepareOptions,
    batch_size: usize,
    last_batch: LastBatch,
    device_stage: DeviceStage,
    pool: rayon::ThreadPool,
    abandon: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
}

impl Worker {
    fn run(mut self, commands: Receiver<u64>, batches: SyncSender<Message>) {
        let mut slot = 0;
        while let Ok(epoch) = commands.recv() {
            let order = self.sampler.epoch_order(epoch);
            let mut position = 0;
            let mut trailing_skipped = Vec::new();
            let mut dropped = 0;
            let mut complete = true;
            while position < order.len() {
                if self.abandon.load(Ordering::SeqCst) {
                    complete = false;
                    break;
                }
                match self.next_batch(epoch, &order[position..], slot) {
                    Ok(Produced::Batch(batch, consumed)) => {
                        position += consumed;
                        slot = (slot + 1) % self.device_stage.slots();
                        if batches.send(Message::Batch(Ok(batch))).is_err() {
                            return;
                        }
                    }
                    Ok(Produced::Tail {
                        skipped,
                        dropped: d,
                    }) => {
                        trailing_skipped = skipped;
                        dropped = d;
                        break;
                    }
                    Ok(Produced::Stopped) => {
                        complete = false;
                        break;
                    }
                    Err(error) => {
                        complete = false;
                        if batches.send(Message::Batch(Err(error))).is_err() {
                            return;
                        }
                        break;
                    }
                }
            }
            let end = Message::EndOfEpoch {
                trailing_skipped,
                dropped,
                complete,
            };
            if self.stop.load(Ordering::SeqCst) || batches.send(end).is_err() {
                return;
            }
        }
    }

    /// Prepares the batch that starts at `order[0]`.
    fn next_batch(&mut self, epoch: u64, order: &[usize], slot: usize) -> Result<Produced> {
        let Worker {
            source,
            options,
            device_stage,
            pool,
            abandon,
            batch_size,
            ..
        } = self;
        let staging = device_stage.slot_mut(slot)?;
        let filled =
            pool.install(|| fill_slot(staging, order, *batch_size, source, options, abandon))?;
        let Some(filled) = filled else {
            return Ok(Produced::Stopped);
        };
        let n = filled.indices.len();
        let at_end = filled.consumed == order.len();
        if n == 0 || (at_end && n < *batch_size && self.last_batch == LastBatch::Drop) {
            return Ok(Produced::Tail {
                skipped: filled.skipped,
                dropped: n,
            });
        }
        let (height, width) = (
            options.geometry.height as usize,
            options.geometry.width as usize,
        );
        let (images, uploaded_bytes) =
            pool.install(|| device_stage.finish(slot, n, height, width))?;
        let ids = filled
            .indices
            .iter()
            .map(|&i| source.item(i).id().to_string())
            .collect();
        let labels = self.labelled.then(|| {
            filled
                .indices
                .iter()
                .map(|&i| source.item(i).label().unwrap_or_default())
                .collect()
        });
        let batch = Batch {
            images,
            indices: filled.indices,
            ids,
            labels,
            skipped: filled.skipped,
            epoch,
            uploaded_bytes,
        };
        Ok(Produced::Batch(batch, filled.consumed))
    }
}

enum Produced {
    Batch(Batch, usize),
    /// Nothing more to yield this epoch: these were skipped after the last batch, and `dropped`
    /// good images were left out with a partial last batch.
    Tail {
        skipped: Vec<ItemError>,
        dropped: usize,
    },
    Stopped,
}
