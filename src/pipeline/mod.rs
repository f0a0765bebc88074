//! [`Pipeline`]: the consumer's side of the prefetch thread, and how it is built.
//!
//! One background thread per pipeline ([`worker`]) runs epochs: for each batch it takes a staging
//! slot from the output stage, has the CPU lane fill it, then has the output stage turn it into
//! the batch's tensor (upload + kernel on the pipeline's stream, or the host tensor) and queues
//! the [`Batch`]. A bounded channel keeps at most `prefetch` batches ready ahead of the consumer.

mod builder;
mod hybrid;
mod output;
mod worker;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use cudarc::driver::CudaStream;

use crate::batch::{Batch, EpochReport};
use crate::cpu::{CpuAhead, CpuLane};
use crate::error::{Error, Result};
use crate::geometry::Geometry;
use crate::options::Options;
use crate::order::Sampler;
use crate::source::Source;
use worker::{Message, Worker};

pub use builder::PipelineBuilder;

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
    source_len: usize,
    shard_len: usize,
    class_names: Option<Vec<String>>,
    device_description: String,
    pinned_bytes: usize,
    /// The GPU lane's share, as the worker measured or was given it.
    gpu_share: Arc<Mutex<Option<f32>>>,
    cuda_stream: Option<Arc<CudaStream>>,
    epoch: u64,
    state: EpochState,
    /// The iterator has returned the end of the current epoch: its next call starts another.
    end_returned: bool,
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

impl Pipeline {
    /// A builder with torchvision's defaults.
    pub fn builder() -> PipelineBuilder {
        PipelineBuilder::default()
    }

    /// Checks `options`, opens the device, compiles the kernel, allocates the staging and starts
    /// the first epoch in the background: the builder's [`PipelineBuilder::build`] with every
    /// option given at once.
    pub fn with_options(source: Source, options: Options) -> Result<Pipeline> {
        options.validate()?;
        if source.is_empty() {
            return Err(Error::invalid("source", "the source has no images"));
        }
        let output = output::open(&options, Geometry::new(&options.resize).image_bytes())?;
        // By default the CPU lane leaves two cores to the GPU lane's submitting threads (which
        // wait on the engines most of the time) and the thread that hands the batches out.
        let threads = match (options.runtime.threads, output.gpu_lane_threads()) {
            (0, lane) if lane > 0 => std::thread::available_parallelism()
                .map_or(1, |n| n.get())
                .saturating_sub(2)
                .max(1),
            (threads, _) => threads,
        };
        let lane = CpuLane::new(&options.decode, &options.resize, threads)?;
        // With a GPU lane, the CPU lane works ahead of the batches too, on threads of its own.
        let ahead = match output.gpu_lane_threads() {
            0 => None,
            _ => {
                let lookahead = crate::cuda::lookahead(options.batching.batch_size);
                Some(CpuAhead::start(
                    lane.core(),
                    lane.threads(),
                    lookahead,
                    options.batching.batch_size + lookahead,
                )?)
            }
        };
        let device_description = output.describe();
        let pinned_bytes = output.pinned_bytes();
        let cuda_stream = output.cuda_stream();
        let sampler =
            Sampler::new(source.len(), &options.batching).with_blocks(source.shuffle_blocks());
        let shard_len = sampler.real_len();
        let (command_tx, command_rx) = mpsc::channel::<u64>();
        let (batch_tx, batch_rx) = mpsc::sync_channel::<Message>(options.runtime.prefetch - 1);
        let abandon = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let class_names = source.class_names().map(|c| c.to_vec());
        let source_len = source.len();
        let gpu_share = Arc::new(Mutex::new(match options.decode.lanes {
            crate::Decode::Hybrid => options.decode.gpu_share,
            _ => None,
        }));
        let worker = Worker {
            labelled: source.has_labels(),
            source: Arc::new(source),
            sampler,
            batching: options.batching,
            lane,
            ahead,
            balance: hybrid::Balance::new(options.decode.gpu_share),
            share_report: gpu_share.clone(),
            output,
            abandon: abandon.clone(),
            stop: stop.clone(),
        };
        let handle = std::thread::Builder::new()
            .name("gpufeed-prefetch".into())
            .spawn(move || worker.run(command_rx, batch_tx))
            .map_err(|e| Error::Worker(format!("cannot start the prefetch thread: {e}")))?;
        let mut pipeline = Pipeline {
            options,
            source_len,
            shard_len,
            class_names,
            device_description,
            pinned_bytes,
            gpu_share,
            cuda_stream,
            epoch: 0,
            state: EpochState::Ended,
            end_returned: false,
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
        self.end_returned = false;
        self.commands
            .as_ref()
            .and_then(|c| c.send(epoch).ok())
            .ok_or_else(|| Error::Worker("the prefetch thread has exited".into()))
    }

    /// The next batch of the current epoch, waiting only if none is ready yet; `Ok(None)` once
    /// the epoch is over (see [`Pipeline::next_epoch`]). Under [`OnError::Fail`](crate::OnError::Fail) the first bad
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
            Message::Batch(batch) => match *batch {
                Ok(batch) => {
                    self.report.images += batch.len();
                    self.report.padded += batch.padded().iter().filter(|&&p| p).count();
                    self.report.batches += 1;
                    self.report.decoded_by_cpu += batch.decoded_by.cpu;
                    self.report.decoded_by_gpu += batch.decoded_by.gpu;
                    self.report.skipped.extend_from_slice(batch.skipped());
                    Ok(Some(batch))
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
                self.report.skipped.extend(trailing_skipped);
                self.report.dropped = dropped;
                self.report.complete = complete;
                self.report.reads = reads;
                self.state = EpochState::Ended;
                Ok(None)
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
    pub fn options(&self) -> &Options {
        &self.options
    }

    /// The device the batches land on, in words.
    pub fn device_description(&self) -> &str {
        &self.device_description
    }

    /// The CUDA stream every batch is uploaded, written and freed on (none on the CPU device).
    /// Work queued on it is ordered with the batches by the stream itself: give it to a
    /// framework that can run on a caller's stream (ONNX Runtime's `with_compute_stream`), or
    /// declare other streams with [`crate::DeviceTensor::use_on`].
    pub fn cuda_stream(&self) -> Option<&Arc<CudaStream>> {
        self.cuda_stream.as_ref()
    }

    /// With hybrid decoding, the GPU lane's share of the images it can take: as given, or as
    /// measured on the first batch (`None` until then, and without hybrid decoding). Giving it
    /// back ([`PipelineBuilder::gpu_share`]) puts every image on the same lane in a later run.
    pub fn gpu_share(&self) -> Option<f32> {
        *self
            .gpu_share
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
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
