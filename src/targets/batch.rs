//! Batches of samples with targets: each epoch's order (shuffled from (seed, epoch), sharded),
//! the samples loaded and transformed on the rayon pool (the next batches' while the caller
//! uses one: `super::ahead`), the images padded to the batch's largest (rounded up to a
//! multiple), boxes, labels and crowd flags packed with per-row offsets, masks as `u8` planes
//! of the padded size, and each row's calls and inverse map.

use std::sync::Arc;

use rayon::prelude::*;

use crate::cuda::resize::{PackedPixels, PackedResize};
use crate::cuda::GatherPlane;
use crate::error::ItemError;
use crate::memory::BufferPool;
use crate::options::{Decode, DecodeOptions, Device, OutputOptions};
use crate::random::Draws;
use crate::resample::{plan_passes, AxisPlan, Filter, PassOrder};

use super::ahead::{Ahead, AheadPolicy, Key};
use super::device::{
    detection_output, segmentation_output, DeviceTargetBatch, Staged, StagingPool, TargetUpload,
};
use super::device_decode::{DecodedImages, DeviceJpeg, JpegDecoders};
use super::layout::{Layout, LayoutScratch, Placement};
use super::transform;
use super::{JointOp, Sample, TargetRecipe, TargetSource};

/// Keeps the order's stream apart from the recipes'.
const ORDER_SALT: u64 = 0xA54F_F53A_5F1D_36F1;

/// How a row's output coordinates map back to its original image: `x_out = ax * x + bx`,
/// `y_out = ay * y + by` (a negative `ax` after a flip).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Inverse {
    /// The original image's width.
    pub width: u32,
    /// The original image's height.
    pub height: u32,
    /// Horizontal scale (negative when flipped).
    pub ax: f64,
    /// Horizontal offset.
    pub bx: f64,
    /// Vertical scale.
    pub ay: f64,
    /// Vertical offset.
    pub by: f64,
}

impl Inverse {
    /// The map of `ops` applied to an image of `width` x `height`.
    pub fn of(ops: &[JointOp], width: u32, height: u32) -> Inverse {
        let mut m = Inverse {
            width,
            height,
            ax: 1.0,
            bx: 0.0,
            ay: 1.0,
            by: 0.0,
        };
        let (mut w, mut h) = (f64::from(width), f64::from(height));
        for op in ops {
            match *op {
                JointOp::Resize {
                    height: nh,
                    width: nw,
                } => {
                    let (sx, sy) = (f64::from(nw) / w, f64::from(nh) / h);
                    m.ax *= sx;
                    m.bx *= sx;
                    m.ay *= sy;
                    m.by *= sy;
                    (w, h) = (f64::from(nw), f64::from(nh));
                }
                JointOp::Crop {
                    top,
                    left,
                    height: ch,
                    width: cw,
                }
                | JointOp::IouCrop {
                    top,
                    left,
                    height: ch,
                    width: cw,
                } => {
                    m.bx -= f64::from(left);
                    m.by -= f64::from(top);
                    (w, h) = (f64::from(cw), f64::from(ch));
                }
                JointOp::Pad {
                    left,
                    top,
                    right,
                    bottom,
                    ..
                } => {
                    m.bx += f64::from(left);
                    m.by += f64::from(top);
                    w += f64::from(left + right);
                    h += f64::from(top + bottom);
                }
                JointOp::HorizontalFlip => {
                    m.ax = -m.ax;
                    m.bx = w - m.bx;
                }
                JointOp::Sanitize | JointOp::Color(_) | JointOp::PermuteChannels(_) => {}
            }
        }
        m
    }

    /// XYXY boxes in output pixels mapped back to the original image's pixels, clamped to it.
    pub fn to_original(&self, boxes: &[[f32; 4]]) -> Vec<[f32; 4]> {
        let (w, h) = (f64::from(self.width), f64::from(self.height));
        boxes
            .iter()
            .map(|b| {
                let x0 = (f64::from(b[0]) - self.bx) / self.ax;
                let x1 = (f64::from(b[2]) - self.bx) / self.ax;
                let y0 = (f64::from(b[1]) - self.by) / self.ay;
                let y1 = (f64::from(b[3]) - self.by) / self.ay;
                let (x0, x1) = (x0.min(x1), x0.max(x1));
                [
                    x0.clamp(0.0, w) as f32,
                    y0.min(y1).clamp(0.0, h) as f32,
                    x1.clamp(0.0, w) as f32,
                    y0.max(y1).clamp(0.0, h) as f32,
                ]
            })
            .collect()
    }
}

/// One batch of samples with targets.
#[derive(Debug, Clone, Default)]
pub struct TargetBatch {
    /// The epoch.
    pub epoch: u64,
    /// Padded rows of every image.
    pub height: u32,
    /// Padded columns of every image.
    pub width: u32,
    /// The images, `len() x height x width x 3` bytes (NHWC, RGB8), padding `pad_fill`.
    pub images: Vec<u8>,
    /// Each row's valid size, `(height, width)`: its image is the top-left corner.
    pub sizes: Vec<(u32, u32)>,
    /// Each row's source index.
    pub indices: Vec<usize>,
    /// Each row's id (its image path).
    pub ids: Vec<String>,
    /// All rows' boxes, XYXY in the row's pixels, row after row.
    pub boxes: Vec<[f32; 4]>,
    /// All rows' labels.
    pub labels: Vec<i64>,
    /// All rows' crowd flags.
    pub crowd: Vec<u8>,
    /// All rows' keypoints, each object's `[x, y, visibility]` triples flattened (empty for an
    /// object without, and for all when the source has none).
    pub keypoints: Vec<Vec<f32>>,
    /// Row `i`'s objects are `offsets[i]..offsets[i + 1]` of `boxes`, `labels`, `crowd` and
    /// the instance masks.
    pub offsets: Vec<usize>,
    /// Instance masks, one `height x width` plane an object (padding 0), when the source has
    /// segmentations; else empty.
    pub masks: Vec<u8>,
    /// Semantic masks, one `height x width` plane a row (padding 255), for segmentation pairs;
    /// else empty.
    pub semantic: Vec<u8>,
    /// Each row's calls, in order.
    pub ops: Vec<Vec<JointOp>>,
    /// Each row's map back to its original image.
    pub inverse: Vec<Inverse>,
    /// The samples of this batch that were skipped, and why.
    pub skipped: Vec<ItemError>,
    /// A batch made for the device: how the device resizes each row into its padded slot
    /// from its pixels, packed in the batch's `images` (or in the page-locked buffer it was laid
    /// out in).
    pub(super) device_rows: Vec<PackedResize>,
    /// A batch made for the device: how the device gathers each instance and semantic mask
    /// into its padded plane from the rows' masks as loaded, packed after the pixels.
    pub(super) device_masks: DeviceMasks,
}

/// The masks of a batch made for the device: the rows' instance planes and semantic masks as
/// loaded, one after the other (instance planes first), and how each output plane is gathered
/// from them ([`crate::cuda::PlaneGather`]).
#[derive(Debug, Clone, Default)]
pub(super) struct DeviceMasks {
    /// One per object, in row order.
    pub(super) instance: Vec<GatherPlane>,
    /// One per row when the batch has semantic masks (a row without one: all 255).
    pub(super) semantic: Vec<GatherPlane>,
    /// The rows' axis maps and pad fills the planes name.
    pub(super) maps: Vec<i32>,
}

impl TargetBatch {
    /// Rows.
    pub fn len(&self) -> usize {
        self.sizes.len()
    }

    /// Whether it has no rows.
    pub fn is_empty(&self) -> bool {
        self.sizes.is_empty()
    }

    /// Row `row`'s boxes.
    pub fn row_boxes(&self, row: usize) -> &[[f32; 4]] {
        &self.boxes[self.offsets[row]..self.offsets[row + 1]]
    }

    /// Row `row`'s boxes in `format` (`F.convert_bounding_box_format` in `f32`).
    pub fn row_boxes_as(&self, row: usize, format: BoxFormat) -> Vec<[f32; 4]> {
        self.row_boxes(row)
            .iter()
            .map(|b| format.from_xyxy(*b))
            .collect()
    }

    /// Row `row`'s labels.
    pub fn row_labels(&self, row: usize) -> &[i64] {
        &self.labels[self.offsets[row]..self.offsets[row + 1]]
    }

    /// Boxes a model gave for row `row` (XYXY in the batch's pixels) in the original image's
    /// pixels, clamped to it. `None` for a row the batch does not have.
    pub fn to_original(&self, row: usize, boxes: &[[f32; 4]]) -> Option<Vec<[f32; 4]>> {
        self.inverse.get(row).map(|m| m.to_original(boxes))
    }
}

/// torchvision's box formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BoxFormat {
    /// Corners: `[x0, y0, x1, y1]`.
    #[default]
    Xyxy,
    /// Corner and size: `[x0, y0, w, h]`.
    Xywh,
    /// Centre and size: `[cx, cy, w, h]`.
    Cxcywh,
}

impl BoxFormat {
    /// An XYXY box in this format, as torchvision converts in `f32`: `w = x1 - x0`,
    /// `cx = (x0 * 2 + w) / 2`.
    pub fn from_xyxy(self, b: [f32; 4]) -> [f32; 4] {
        let (w, h) = (b[2] - b[0], b[3] - b[1]);
        match self {
            BoxFormat::Xyxy => b,
            BoxFormat::Xywh => [b[0], b[1], w, h],
            BoxFormat::Cxcywh => [(b[0] * 2.0 + w) / 2.0, (b[1] * 2.0 + h) / 2.0, w, h],
        }
    }

    /// A box in this format as XYXY (`x1 = x0 + w`; `x0 = cx - w / 2`).
    pub fn to_xyxy(self, b: [f32; 4]) -> [f32; 4] {
        match self {
            BoxFormat::Xyxy => b,
            BoxFormat::Xywh => [b[0], b[1], b[0] + b[2], b[1] + b[3]],
            BoxFormat::Cxcywh => {
                let (x0, y0) = (b[0] - b[2] / 2.0, b[1] - b[3] / 2.0);
                [x0, y0, x0 + b[2], y0 + b[3]]
            }
        }
    }
}

/// What loading took: the samples delivered, those skipped (with their reasons), and the objects
/// `SanitizeBoundingBoxes` dropped.
#[derive(Debug, Clone, Default)]
pub struct TargetReport {
    /// Samples delivered.
    pub samples: usize,
    /// Samples skipped, each with its reason.
    pub skipped: Vec<ItemError>,
    /// Objects loaded.
    pub objects: usize,
    /// Objects the recipe's `SanitizeBoundingBoxes` dropped.
    pub dropped_objects: usize,
    /// Samples whose JPEG the CUDA device decoded (batches on a device,
    /// [`TargetLoader::decode_lanes`]); the CPU decoded the others.
    pub decoded_on_device: usize,
}

/// A batch handed out, with the page-locked buffer it is laid out in (when it is) and the
/// images the device decoded for it (when it did).
type Handed = (TargetBatch, Option<Staged>, Option<DecodedImages>);

/// Batches of a [`TargetSource`] under a [`TargetRecipe`].
#[derive(Debug)]
pub struct TargetLoader {
    source: Arc<TargetSource>,
    recipe: TargetRecipe,
    seed: u64,
    batch_size: usize,
    shuffle: bool,
    divisible: u32,
    pad_fill: u8,
    shard: (usize, usize),
    decode: DecodeOptions,
    epoch: u64,
    order: Vec<usize>,
    position: usize,
    report: TargetReport,
    /// Batches made ahead; `None`: [`AheadPolicy::batches`] for the pool and the batch size.
    prefetch: Option<usize>,
    ahead: Ahead,
    device: Device,
    output: Option<OutputOptions>,
    /// Which decoders decode the images of the batches on a device.
    lanes: Decode,
    upload: Option<TargetUpload>,
    /// Whether the batches are made for the device ([`TargetLoader::next_device_batch`]: the
    /// rows' pixels resampled there) or the host.
    for_device: bool,
}

impl TargetLoader {
    /// Batches of 8 of `source`, unchanged ([`TargetRecipe::Plain`]), in order, padded to a
    /// multiple of 32.
    pub fn new(source: TargetSource) -> TargetLoader {
        let mut loader = TargetLoader {
            source: Arc::new(source),
            recipe: TargetRecipe::Plain,
            seed: 0,
            batch_size: 8,
            shuffle: false,
            divisible: 32,
            pad_fill: 0,
            shard: (0, 1),
            decode: DecodeOptions::default(),
            epoch: 0,
            order: Vec::new(),
            position: 0,
            report: TargetReport::default(),
            prefetch: None,
            ahead: Ahead::default(),
            device: Device::Cpu,
            output: None,
            lanes: Decode::Auto,
            upload: None,
            for_device: false,
        };
        loader.plan_epoch();
        loader
    }

    /// The recipe.
    pub fn recipe(mut self, recipe: TargetRecipe) -> TargetLoader {
        self.recipe = recipe;
        self.ahead.clear();
        self
    }

    /// The seed of the draws and the shuffle.
    pub fn seed(mut self, seed: u64) -> TargetLoader {
        self.seed = seed;
        self.plan_epoch();
        self
    }

    /// Rows a batch (at least 1).
    pub fn batch_size(mut self, n: usize) -> TargetLoader {
        self.batch_size = n.max(1);
        self.ahead.clear();
        self
    }

    /// Shuffles each epoch (from (seed, epoch)).
    pub fn shuffle(mut self, on: bool) -> TargetLoader {
        self.shuffle = on;
        self.plan_epoch();
        self
    }

    /// Pads the batch's images to a multiple of `n` (torchvision's `size_divisible`; 1: the
    /// largest image as it is).
    pub fn size_divisible(mut self, n: u32) -> TargetLoader {
        self.divisible = n.max(1);
        self.ahead.clear();
        self
    }

    /// The value of the images' padding in a batch.
    pub fn pad_fill(mut self, v: u8) -> TargetLoader {
        self.pad_fill = v;
        self.ahead.clear();
        self
    }

    /// Batches made ahead while the caller uses the one it has (by default enough for six rows
    /// for each thread of the pool, at least three batches): their rows are loaded and transformed on the rayon
    /// pool, each batch is laid out as soon as its last row is made, so no thread waits for a
    /// batch's slowest row and the caller's own work (an upload, a step) overlaps the next
    /// batches'. They hold up to `n` batches' samples and buffers. 0: a batch is made when it is
    /// asked for. The batches are the same whatever `n` and the thread count; the work ahead
    /// stays within the epoch, and changing an option or the position drops it.
    pub fn prefetch(mut self, n: usize) -> TargetLoader {
        self.prefetch = Some(n);
        self.ahead.clear();
        self
    }

    /// Only every `world`th sample of each epoch's order, from `rank`.
    pub fn shard(mut self, rank: usize, world: usize) -> TargetLoader {
        self.shard = (rank, world.max(1));
        self.plan_epoch();
        self
    }

    /// Starts at `epoch`.
    pub fn epoch(mut self, epoch: u64) -> TargetLoader {
        self.epoch = epoch;
        self.plan_epoch();
        self
    }

    /// The source.
    pub fn source(&self) -> &TargetSource {
        &self.source
    }

    /// What loading took so far.
    pub fn report(&self) -> &TargetReport {
        &self.report
    }

    /// The epoch being read.
    pub fn current_epoch(&self) -> u64 {
        self.epoch
    }

    fn plan_epoch(&mut self) {
        let mut order: Vec<usize> = (0..self.source.len()).collect();
        if self.shuffle {
            let mut d = Draws::for_image(self.seed ^ ORDER_SALT, self.epoch, 0);
            for i in (1..order.len()).rev() {
                let j = d.below(i as u64 + 1) as usize;
                order.swap(i, j);
            }
        }
        let (rank, world) = self.shard;
        self.order = order.into_iter().skip(rank).step_by(world).collect();
        self.position = 0;
        self.ahead.clear();
    }

    /// Where the loader stands: the epoch and the samples of its order already handed out.
    pub fn position(&self) -> (u64, usize) {
        (self.epoch, self.position)
    }

    /// Goes on from a [`position`](TargetLoader::position) saved by a loader of the same source
    /// and options: the same batches follow, byte for byte (the order and every draw come from
    /// (seed, epoch, index) alone).
    pub fn resume_at(mut self, epoch: u64, position: usize) -> TargetLoader {
        self.epoch = epoch;
        self.plan_epoch();
        self.position = position.min(self.order.len());
        self
    }

    /// Goes on to the next epoch.
    pub fn next_epoch(&mut self) {
        self.epoch += 1;
        self.plan_epoch();
    }

    /// The epoch's next batch; `None` at its end (then [`TargetLoader::next_epoch`]). The
    /// batches after it start being made ([`TargetLoader::prefetch`]).
    pub fn next_batch(&mut self) -> Option<TargetBatch> {
        self.next_made(false).map(|(batch, ..)| batch)
    }

    /// The epoch's next batch, made for the device (with the page-locked buffer it is laid out
    /// in, when it is, and the images the device decoded for it) or the host.
    fn next_made(&mut self, for_device: bool) -> Option<Handed> {
        let end = self.start_ahead(for_device)?;
        let ahead = self.batches_ahead();
        let outcome = self.ahead.take()?;
        self.position = end;
        self.fill(ahead);
        match outcome {
            Ok(made) => Some(self.hand_out(made)),
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }

    /// Starts the next batches for the device or the host (dropping those in work for the
    /// other, or for other options); the end of the next batch, `None` at the epoch's end.
    fn start_ahead(&mut self, for_device: bool) -> Option<usize> {
        self.for_device = for_device;
        if self.position >= self.order.len() {
            return None;
        }
        let end = (self.position + self.batch_size).min(self.order.len());
        if !self.ahead.front_is(&self.key(self.position, end)) {
            self.ahead.clear();
        }
        self.fill(self.batches_ahead().max(1));
        Some(end)
    }

    /// What the batch of the order's `start..end` is made from.
    fn key(&self, start: usize, end: usize) -> Key {
        Key {
            recipe: self.recipe,
            decode: self.decode,
            seed: self.seed,
            epoch: self.epoch,
            indices: self.order[start..end].to_vec(),
            divisible: self.divisible,
            pad_fill: self.pad_fill,
            for_device: self.for_device,
        }
    }

    /// Starts the epoch's next batches until `batches` are in work.
    fn fill(&mut self, batches: usize) {
        let mut start = self.ahead.end().unwrap_or(self.position);
        while self.ahead.len() < batches && start < self.order.len() {
            let end = (start + self.batch_size).min(self.order.len());
            let key = self.key(start, end);
            self.ahead.push(&self.source, key, end);
            start = end;
        }
    }

    /// Counts a made batch in the report and hands it out.
    fn hand_out(&mut self, made: Made) -> Handed {
        let Made {
            batch,
            decoded,
            decoded_rows,
            samples,
            objects,
            failed,
            staged,
        } = made;
        self.report.decoded_on_device += decoded_rows;
        self.report.objects += objects.0;
        self.report.dropped_objects += objects.1;
        self.report.samples += samples;
        self.report.skipped.extend(batch.skipped.iter().cloned());
        match failed {
            None => (batch, staged, decoded),
            Some(e) => {
                // A layout that fails here failed for every row alike: nothing is handed out
                // half written.
                self.report.skipped.push(e.clone());
                let batch = TargetBatch {
                    epoch: batch.epoch,
                    skipped: vec![e],
                    ..TargetBatch::default()
                };
                (batch, None, None)
            }
        }
    }

    /// Where [`TargetLoader::next_device_batch`] puts the batches: `Device::Cuda(n)` (the
    /// default, `Device::Cpu`, keeps them in host memory: [`TargetLoader::next_batch`]).
    pub fn device(mut self, device: Device) -> TargetLoader {
        self.device = device;
        self.upload = None;
        self.ahead.clear();
        self
    }

    /// Which decoders decode the JPEGs of the batches on a CUDA device
    /// ([`TargetLoader::next_device_batch`]); the host's batches are decoded on the CPU.
    /// [`Decode::Auto`] (the default): the device's cores decode every baseline JPEG they can
    /// once their decoders are open (a few tenths of a second after the first call; the CPU
    /// decodes the rows made before). [`Decode::Hybrid`]: the same, the first call waiting for
    /// the decoders. [`Decode::Cpu`]: the CPU threads decode every image. The bytes of a batch
    /// are the same whichever decodes it.
    pub fn decode_lanes(mut self, lanes: Decode) -> TargetLoader {
        self.lanes = lanes;
        self.upload = None;
        self
    }

    /// What decodes the images of the batches on the device, in words (once the first was
    /// asked for; `None` before).
    pub fn decode_description(&self) -> Option<String> {
        self.upload.as_ref().map(TargetUpload::decoders_description)
    }

    /// How the images are normalized on the device (dtype, mean, std; the layout is NCHW).
    /// Default: [`TargetLoader::default_output`].
    pub fn output(mut self, output: OutputOptions) -> TargetLoader {
        self.output = Some(output);
        self.upload = None;
        self
    }

    /// The device output of this loader's recipe unless [`TargetLoader::output`] says
    /// otherwise: `f32`, scaled to `[0, 1]` for the detection recipes (torchvision's detection
    /// models normalize inside), ImageNet's mean and std for the segmentation recipes.
    pub fn default_output(&self) -> OutputOptions {
        match self.recipe {
            TargetRecipe::SegmentationTrain | TargetRecipe::SegmentationEval => {
                segmentation_output()
            }
            _ if !self.source.is_detection() => segmentation_output(),
            _ => detection_output(),
        }
    }

    /// The epoch's next batch on the CUDA device of [`TargetLoader::device`]: the images
    /// normalized there, the masks as `u8` tensors; `None` at the epoch's end. The device is
    /// opened at the first call. An error when the device is the CPU or cannot be used.
    pub fn next_device_batch(&mut self) -> Option<crate::Result<DeviceTargetBatch>> {
        let Device::Cuda(ordinal) = self.device else {
            return Some(Err(crate::Error::invalid(
                "device",
                "next_device_batch needs device(Device::Cuda(n))",
            )));
        };
        if self.upload.is_none() {
            // The first batches are made on the pool while the device opens (its context and
            // kernels: a few tenths of a second); they are copied into staging memory at their
            // upload, the later ones laid out there. With `Decode::Hybrid` the device and its
            // decoders open first, so every batch's JPEGs go to them.
            if self.lanes != Decode::Hybrid {
                self.start_ahead(true);
            }
            let output = self.output.unwrap_or_else(|| self.default_output());
            match TargetUpload::open(ordinal, &output, self.lanes) {
                Ok(u) => self.upload = Some(u),
                Err(e) => return Some(Err(e)),
            }
        }
        if let Some(upload) = &self.upload {
            self.ahead.stage_in(upload.pool());
        }
        let (batch, staged, decoded) = self.next_made(true)?;
        let instance = self.source.has_instance_masks();
        // The page-locked buffers of the batches in work, of the one handed out and of the next.
        let keep = self.batches_ahead() + 2;
        let upload = self.upload.as_mut()?;
        Some(
            upload
                .upload(batch, (staged, decoded), (instance, keep))
                .map(|(device, [images, masks, semantic])| {
                    let spare = Spare {
                        images,
                        masks,
                        semantic,
                    };
                    self.ahead.recycle(spare, self.batches_ahead() + 1);
                    device
                }),
        )
    }

    /// Gives a handed-out batch's buffers back for the next batches to fill (no allocation per
    /// batch once the sizes settle).
    pub fn recycle(&mut self, batch: TargetBatch) {
        let spare = Spare {
            images: batch.images,
            masks: batch.masks,
            semantic: batch.semantic,
        };
        self.ahead.recycle(spare, self.batches_ahead() + 1);
    }

    /// Batches made ahead: the number given to [`TargetLoader::prefetch`], else the policy's.
    pub fn batches_ahead(&self) -> usize {
        self.prefetch
            .unwrap_or_else(|| AheadPolicy::batches(rayon::current_num_threads(), self.batch_size))
    }
}

/// Buffers of a batch handed back, reused by the next.
#[derive(Debug, Default)]
pub(super) struct Spare {
    images: Vec<u8>,
    masks: Vec<u8>,
    semantic: Vec<u8>,
}

/// One loaded row: the sample (its targets transformed; its pixels and masks as loaded, or
/// transformed whole when the layout cannot map the calls), and how it is laid out.
pub(super) struct Row {
    index: usize,
    id: String,
    sample: Sample,
    ops: Vec<JointOp>,
    inverse: Inverse,
    before: usize,
    layout: Layout,
    /// A JPEG left to the device's decoders (the sample has no pixels until it is decoded).
    jpeg: Option<DeviceJpeg>,
    /// Where the device decoded its pixels, once it has.
    decoded: Option<PackedPixels>,
}

fn id_of(source: &TargetSource, index: usize) -> String {
    source.id(index).unwrap_or_default()
}

/// Loads sample `index` (its pixels and masks in buffers of `buffers`; with `device`, a JPEG
/// the device's decoders take left to them when the device can lay its row out), draws its
/// calls from (seed, epoch, index) and transforms its targets.
pub(super) fn prepare(
    source: &TargetSource,
    recipe: TargetRecipe,
    (decode, device): (&DecodeOptions, bool),
    (seed, epoch): (u64, u64),
    index: usize,
    buffers: &BufferPool,
) -> Result<Row, ItemError> {
    let (mut sample, mut jpeg) = source.load_with(index, decode, buffers, device)?;
    let ops = recipe.draw(
        sample.width,
        sample.height,
        &sample.boxes,
        seed,
        epoch,
        index,
    );
    let inverse = Inverse::of(&ops, sample.width, sample.height);
    let before = sample.boxes.len();
    let fail = |e: String| ItemError {
        id: id_of(source, index),
        index,
        kind: crate::error::ItemErrorKind::Resize(e),
    };
    let plan = Layout::plan(&ops, sample.width, sample.height);
    if !matches!(plan, Some((_, 0))) {
        // Calls applied to the pixels here: they are decoded here.
        if let Some(left) = jpeg.take() {
            sample.pixels = decode_on_cpu(left, decode, buffers).map_err(|kind| ItemError {
                id: id_of(source, index),
                index,
                kind,
            })?;
        }
    }
    let layout = match plan {
        Some((layout, lead)) => {
            transform::apply(&mut sample, &ops[..lead]).map_err(fail)?;
            transform::apply_targets(&mut sample, &ops[lead..]).map_err(fail)?;
            layout
        }
        None => {
            transform::apply(&mut sample, &ops).map_err(fail)?;
            Layout::identity(sample.width, sample.height)
        }
    };
    if layout.size() != (sample.height, sample.width) {
        return Err(fail(format!(
            "layout of {}x{} against targets of {}x{}",
            layout.size().1,
            layout.size().0,
            sample.width,
            sample.height
        )));
    }
    Ok(Row {
        index,
        id: id_of(source, index),
        sample,
        ops,
        inverse,
        before,
        layout,
        jpeg,
        decoded: None,
    })
}

/// The pixels of a JPEG left to the device, decoded on the CPU after all (as the sample would
/// have been loaded), in a buffer of `buffers`.
fn decode_on_cpu(
    jpeg: DeviceJpeg,
    decode: &DecodeOptions,
    buffers: &BufferPool,
) -> Result<Vec<u8>, crate::error::ItemErrorKind> {
    let (width, height) = (jpeg.width(), jpeg.height());
    let (pixels, w, h) = crate::cpu::decode_whole(jpeg.bytes(), decode, buffers)?;
    if (w, h) != (width, height) {
        buffers.give(pixels, 0);
        return Err(crate::error::ItemErrorKind::Decode(format!(
            "decoded {w}x{h}, its header says {width}x{height}"
        )));
    }
    Ok(pixels)
}

/// The padded size of a batch of `rows`: each side the largest row's, rounded up to a
/// multiple of `divisible`.
fn padded_size(rows: &[Row], divisible: u32) -> (u32, u32) {
    let round = |v: u32| v.div_ceil(divisible) * divisible;
    let h = round(rows.iter().map(|r| r.sample.height).max().unwrap_or(0));
    let w = round(rows.iter().map(|r| r.sample.width).max().unwrap_or(0));
    (h, w)
}

/// Decodes the JPEGs `rows` left to the device: on `decoders` those whose slot the device
/// places, the rest (and any the device did not decode) on the CPU; a row the CPU cannot
/// decode either is dropped into `skipped`. The device's decoded images, if any.
fn decode_left_jpegs(
    rows: &mut Vec<Row>,
    decoders: Option<&JpegDecoders>,
    (divisible, pad_fill): (u32, u8),
    (decode, buffers): (&DecodeOptions, &BufferPool),
    skipped: &mut Vec<ItemError>,
) -> Option<DecodedImages> {
    let (h, w) = padded_size(rows, divisible);
    let on_device: Vec<usize> = (0..rows.len())
        .filter(|&k| {
            rows[k].jpeg.is_some() && device_placement(&rows[k].layout, (h, w), pad_fill).is_some()
        })
        .collect();
    let jpegs: Vec<&DeviceJpeg> = on_device
        .iter()
        .filter_map(|&k| rows[k].jpeg.as_ref())
        .collect();
    let (images, placed) = match decoders {
        Some(decoders) => decoders.decode(&jpegs),
        None => (None, vec![None; jpegs.len()]),
    };
    for (&k, pixels) in on_device.iter().zip(placed) {
        if pixels.is_some() {
            rows[k].decoded = pixels;
            rows[k].jpeg = None;
        }
    }
    let mut failed = vec![false; rows.len()];
    for (k, row) in rows.iter_mut().enumerate() {
        let Some(jpeg) = row.jpeg.take() else {
            continue;
        };
        match decode_on_cpu(jpeg, decode, buffers) {
            Ok(pixels) => row.sample.pixels = pixels,
            Err(kind) => {
                failed[k] = true;
                skipped.push(ItemError {
                    id: row.id.clone(),
                    index: row.index,
                    kind,
                });
            }
        }
    }
    let mut k = 0;
    rows.retain(|_| {
        k += 1;
        !failed[k - 1]
    });
    images
}

/// A batch laid out from its rows, and what it adds to the [`TargetReport`].
pub(super) struct Made {
    /// The batch; its `skipped`, the rows that could not be made.
    pub(super) batch: TargetBatch,
    /// The images the device decoded for a batch made for it, which its rows read.
    pub(super) decoded: Option<DecodedImages>,
    /// Rows whose JPEG the device decoded.
    pub(super) decoded_rows: usize,
    /// Rows delivered.
    pub(super) samples: usize,
    /// Objects loaded, and those the recipe's `SanitizeBoundingBoxes` dropped.
    pub(super) objects: (usize, usize),
    /// The layout's error (then the batch is not handed out).
    pub(super) failed: Option<ItemError>,
    /// The page-locked buffer a batch made for the device is laid out in (its `images`,
    /// `masks` and `semantic` then empty).
    pub(super) staged: Option<Staged>,
}

/// The batch of epoch `epoch` of the rows `loaded` (in order), padded to a multiple of
/// `divisible` with `pad_fill`, in the buffers of `spare`; `for_device`: its images left for
/// the device to resample ([`PackedResize`]), the JPEGs left to its decoders decoded there (or
/// with `decode`, on the CPU). The rows' pixel and mask buffers go back to `buffers` once laid
/// out.
pub(super) fn make_batch(
    (epoch, decode): (u64, &DecodeOptions),
    loaded: impl Iterator<Item = Result<Row, ItemError>>,
    (divisible, pad_fill): (u32, u8),
    (spare, buffers): (Spare, &BufferPool),
    (for_device, staging): (bool, Option<&StagingPool>),
) -> Made {
    let mut batch = TargetBatch {
        epoch,
        ..TargetBatch::default()
    };
    let mut rows = Vec::new();
    // Each source index's place in the batch, to list the skipped rows in order.
    let mut places = Vec::new();
    for r in loaded {
        match r {
            Ok(row) => {
                places.push(row.index);
                rows.push(row);
            }
            Err(e) => {
                places.push(e.index);
                batch.skipped.push(e);
            }
        }
    }
    let decoded = match rows.iter().any(|r| r.jpeg.is_some()) {
        true => decode_left_jpegs(
            &mut rows,
            staging.and_then(StagingPool::decoders),
            (divisible, pad_fill),
            (decode, buffers),
            &mut batch.skipped,
        ),
        false => None,
    };
    batch
        .skipped
        .sort_by_key(|e| places.iter().position(|&i| i == e.index));
    let decoded_rows = rows.iter().filter(|r| r.decoded.is_some()).count();
    let (mut objects, mut dropped) = (0, 0);
    for row in &rows {
        objects += row.before;
        dropped += row.before - row.sample.boxes.len();
        batch.indices.push(row.index);
        batch.ids.push(row.id.clone());
        batch.ops.push(row.ops.clone());
        batch.inverse.push(row.inverse);
    }
    let mut staged = None;
    let failed = collate(
        &mut batch,
        &rows,
        (divisible, pad_fill),
        (spare, &mut staged),
        (for_device, staging),
    )
    .err();
    let samples = rows.len();
    for row in rows {
        let Sample {
            pixels,
            masks,
            semantic,
            ..
        } = row.sample;
        for buffer in [pixels, masks.data, semantic.data] {
            buffers.give(buffer, 0);
        }
    }
    Made {
        batch,
        decoded,
        decoded_rows,
        samples,
        objects: (objects, dropped),
        failed,
        staged,
    }
}

thread_local! {
    /// Each pool thread's layout buffers, kept from batch to batch (at most the largest row's
    /// resampled window and intermediate).
    static LAYOUT_SCRATCH: std::cell::RefCell<LayoutScratch> =
        std::cell::RefCell::new(LayoutScratch::default());
}

/// Lays `rows` out in `batch`: padded images (or, `for_device`, each row's pixels for the
/// device to resample), packed targets, masks; the rows' pixels and masks written on the rayon
/// pool, each straight into its place: in `spare`'s buffers, or for the device in a
/// page-locked buffer of `staging`, left in `staged`.
fn collate(
    batch: &mut TargetBatch,
    rows: &[Row],
    (divisible, pad_fill): (u32, u8),
    (spare, staged): (Spare, &mut Option<Staged>),
    (for_device, staging): (bool, Option<&StagingPool>),
) -> Result<(), ItemError> {
    let (h, w) = padded_size(rows, divisible);
    let (hu, wu) = (h as usize, w as usize);
    batch.height = h;
    batch.width = w;
    // Every byte is written below: a buffer handed back is reused as it is.
    let reuse = |mut v: Vec<u8>, len: usize| {
        if v.capacity() < len {
            return vec![0u8; len];
        }
        v.resize(len, 0);
        v
    };
    let semantic = rows.iter().any(|r| r.sample.semantic.count > 0);
    // Each row's bytes of `images`: its padded slot, or its pixels for the device: none when
    // the device decoded them; as decoded when the device can place them and they are no more
    // than its output (an upscale, a crop), else laid out here (a large photo shrunk: fewer
    // bytes to copy and send).
    let plans: Vec<Option<Placement>> = rows
        .iter()
        .map(|row| match for_device {
            true => device_placement(&row.layout, (h, w), pad_fill).filter(|_| {
                let (oh, ow) = row.layout.size();
                row.decoded.is_some() || row.layout.source_len() <= oh as usize * ow as usize * 3
            }),
            false => None,
        })
        .collect();
    let image_lens: Vec<usize> = rows
        .iter()
        .zip(&plans)
        .map(|(row, plan)| match (for_device, plan) {
            (false, _) => hu * wu * 3,
            (true, Some(_)) if row.decoded.is_some() => 0,
            (true, Some(_)) => row.layout.source_len(),
            (true, None) => row.sample.height as usize * row.sample.width as usize * 3,
        })
        .collect();
    // Each row's bytes of `masks` and `semantic`: its padded planes, or for the device its
    // masks as loaded (the device gathers them into their planes).
    let mask_lens: Vec<(usize, usize)> = rows
        .iter()
        .map(|row| match for_device {
            true => (row.sample.masks.data.len(), row.sample.semantic.data.len()),
            false => (
                row.sample.masks.count * hu * wu,
                if semantic { hu * wu } else { 0 },
            ),
        })
        .collect();
    let lens = [
        image_lens.iter().sum(),
        mask_lens.iter().map(|l| l.0).sum(),
        mask_lens.iter().map(|l| l.1).sum(),
    ];
    // Without page-locked memory (none could be had), the host buffers, copied at the upload.
    *staged = staging.and_then(|pool| pool.take(lens).ok());
    if staged.is_none() {
        batch.images = reuse(spare.images, lens[0]);
        batch.masks = reuse(spare.masks, lens[1]);
        batch.semantic = reuse(spare.semantic, lens[2]);
    }
    batch.offsets.push(0);
    for (i, row) in rows.iter().enumerate() {
        let s = &row.sample;
        batch.sizes.push((s.height, s.width));
        batch.boxes.extend_from_slice(&s.boxes);
        batch.labels.extend_from_slice(&s.labels);
        batch.crowd.extend_from_slice(&s.crowd);
        if !s.keypoints.is_empty() {
            batch.keypoints.resize(batch.offsets[i], Vec::new());
            batch.keypoints.extend(s.keypoints.iter().cloned());
        }
        batch.offsets.push(batch.boxes.len());
    }
    if !batch.keypoints.is_empty() {
        batch.keypoints.resize(batch.boxes.len(), Vec::new());
    }
    // Each row's slices of the three buffers.
    let [images_all, masks_all, semantic_all] = match staged.as_mut() {
        Some(staged) => staged.parts_mut(),
        None => [
            &mut batch.images[..],
            &mut batch.masks[..],
            &mut batch.semantic[..],
        ],
    };
    let (mut masks_left, mut semantic_left) = (masks_all, semantic_all);
    let mut mask_parts = Vec::with_capacity(rows.len());
    let mut semantic_parts = Vec::with_capacity(rows.len());
    for &(masks_len, semantic_len) in &mask_lens {
        let (part, rest) = masks_left.split_at_mut(masks_len);
        mask_parts.push(part);
        masks_left = rest;
        let (part, rest) = semantic_left.split_at_mut(semantic_len);
        // The host lays out a plane for every row of a semantic batch (all 255 without a
        // mask); the device gets the masks there are.
        let has = if for_device {
            semantic_len > 0
        } else {
            semantic
        };
        semantic_parts.push(has.then_some(part));
        semantic_left = rest;
    }
    let mut images_left = images_all;
    let mut image_parts = Vec::with_capacity(rows.len());
    for &len in &image_lens {
        let (part, rest) = images_left.split_at_mut(len);
        image_parts.push(part);
        images_left = rest;
    }
    let laid: Vec<Result<Option<PackedResize>, ItemError>> = rows
        .par_iter()
        .zip(plans.into_par_iter())
        .zip(image_parts.into_par_iter())
        .zip(mask_parts.into_par_iter())
        .zip(semantic_parts.into_par_iter())
        .map(|((((row, plan), image), masks), sem)| {
            LAYOUT_SCRATCH.with_borrow_mut(|scratch| {
                let device = match for_device {
                    true => Some(for_the_device(row, plan, image, w, pad_fill, scratch)?),
                    false => {
                        row.layout
                            .image_into(&row.sample, image, wu, pad_fill, scratch)
                            .map_err(|e| row_error(row, e))?;
                        None
                    }
                };
                match for_device {
                    true => {
                        masks.copy_from_slice(&row.sample.masks.data);
                        if let Some(sem) = sem {
                            sem.copy_from_slice(&row.sample.semantic.data);
                        }
                    }
                    false => lay_out_masks(row, masks, sem, wu),
                }
                Ok(device)
            })
        })
        .collect();
    // The first row's error, whichever thread met an error first.
    let device_rows: Vec<Option<PackedResize>> = laid.into_iter().collect::<Result<_, _>>()?;
    let mut offset = 0;
    for (mut row, len) in device_rows.into_iter().flatten().zip(&image_lens) {
        if let PackedPixels::Uploaded { offset: at } = &mut row.pixels {
            *at = offset;
        }
        offset += len;
        batch.device_rows.push(row);
    }
    if for_device {
        batch.device_masks = device_masks(rows, semantic, lens[1])?;
    }
    Ok(())
}

/// How the device gathers the masks of `rows` (with a semantic plane each when `semantic`)
/// from their masks as loaded, packed instance planes first and the semantic masks from byte
/// `semantic_at`.
fn device_masks(
    rows: &[Row],
    semantic: bool,
    semantic_at: usize,
) -> Result<DeviceMasks, ItemError> {
    let mut out = DeviceMasks::default();
    let (mut instance_at, mut semantic_at) = (0u64, semantic_at as u64);
    let offset = |maps: &Vec<i32>| maps.len() as u32;
    for row in rows {
        let s = &row.sample;
        if s.masks.count == 0 && !semantic {
            continue;
        }
        let (rows_n, columns) = row.layout.source_size();
        let plane = rows_n as usize * columns as usize;
        if s.masks.data.len() != s.masks.count * plane
            || (s.semantic.count > 0 && s.semantic.data.len() != plane)
        {
            return Err(row_error(
                row,
                format!(
                    "masks of {} bytes for planes of {columns}x{rows_n}",
                    s.masks.data.len()
                ),
            ));
        }
        let (xs, ys) = row.layout.mask_maps();
        let fills = offset(&out.maps);
        out.maps.extend(row.layout.semantic_fills().map(i32::from));
        let fill_count = offset(&out.maps) - fills;
        let xs_at = offset(&out.maps);
        out.maps.extend_from_slice(&xs);
        let ys_at = offset(&out.maps);
        out.maps.extend_from_slice(&ys);
        let placed = GatherPlane {
            source: 0,
            source_width: columns,
            source_height: rows_n,
            xs: xs_at,
            xs_len: xs.len() as u32,
            ys: ys_at,
            ys_len: ys.len() as u32,
            fills: 0,
            fill_count: 0,
            beyond: 0,
            unused: 0,
        };
        for _ in 0..s.masks.count {
            out.instance.push(GatherPlane {
                source: instance_at,
                ..placed
            });
            instance_at += plane as u64;
        }
        if !semantic {
            continue;
        }
        out.semantic.push(match s.semantic.count {
            0 => GatherPlane {
                beyond: 255,
                ..GatherPlane::default()
            },
            _ => GatherPlane {
                source: semantic_at,
                fills,
                fill_count,
                beyond: 255,
                ..placed
            },
        });
        if s.semantic.count > 0 {
            semantic_at += plane as u64;
        }
    }
    Ok(out)
}

/// A row's resize by the device, when its layout is one placed rectangle whose padding has the
/// batch's padding colour (or the row fills its `rows` x `columns` slot).
fn device_placement(
    layout: &Layout,
    (rows, columns): (u32, u32),
    pad_fill: u8,
) -> Option<Placement> {
    let placement = layout.placement()?;
    let fills_slot = placement.valid == (rows, columns);
    match placement.fill {
        Some(fill) if fill != [pad_fill; 3] && !fills_slot => None,
        _ => Some(placement),
    }
}

/// A row's item error from its layout's.
fn row_error(row: &Row, e: String) -> ItemError {
    ItemError {
        id: row.id.clone(),
        index: row.index,
        kind: crate::error::ItemErrorKind::Resize(e),
    }
}

/// Writes a row's pixels into `image` for the device: its source pixels when the device can
/// place its resize (`plan`), else its output laid out here (then copied by the device); and
/// how the device writes its slot, `columns` wide. Its `offset` is set by the caller.
fn for_the_device(
    row: &Row,
    plan: Option<Placement>,
    image: &mut [u8],
    columns: u32,
    pad_fill: u8,
    scratch: &mut LayoutScratch,
) -> Result<PackedResize, ItemError> {
    let s = &row.sample;
    let placement = match plan {
        Some(p) if row.decoded.is_some() => p,
        Some(p) => {
            let pixels = s.pixels.get(..image.len()).ok_or_else(|| {
                row_error(
                    row,
                    format!(
                        "{} bytes of pixels, the layout reads {}",
                        s.pixels.len(),
                        image.len()
                    ),
                )
            })?;
            image.copy_from_slice(pixels);
            p
        }
        None => {
            row.layout
                .image_into(s, image, s.width as usize, pad_fill, scratch)
                .map_err(|e| row_error(row, e))?;
            Placement {
                x: AxisPlan::stretch(s.width, s.width),
                y: AxisPlan::stretch(s.height, s.height),
                flip: false,
                fill: None,
                valid: (s.height, s.width),
            }
        }
    };
    let (mut x, y) = (placement.x, placement.y);
    if placement.flip {
        // The kernel mirrors the whole slot: the kept columns land mirrored inside the valid
        // rectangle when placed as far from the slot's right edge as from the valid's.
        x.dst_offset += columns - placement.valid.1;
    }
    let passes = plan_passes(&x, &y, Filter::Bilinear, PassOrder::default())
        .map_err(|e| row_error(row, e.to_string()))?;
    Ok(PackedResize {
        pixels: row.decoded.unwrap_or(PackedPixels::Uploaded { offset: 0 }),
        width: x.src_len,
        height: y.src_len,
        x,
        y,
        passes,
        filter: Filter::Bilinear,
        order: PassOrder::default(),
        pad: placement.fill.unwrap_or([pad_fill; 3]),
        flip: placement.flip,
    })
}

/// Writes one row's instance masks and semantic mask into their batch slots (`columns` wide).
fn lay_out_masks(row: &Row, masks: &mut [u8], semantic: Option<&mut [u8]>, columns: usize) {
    let s = &row.sample;
    if s.masks.count == 0 && semantic.is_none() {
        return;
    }
    let maps = row.layout.mask_maps();
    if let Some(source) = s.masks.data.len().checked_div(s.masks.count) {
        let plane = masks.len() / s.masks.count.max(1);
        for (p, out) in masks.chunks_exact_mut(plane.max(1)).enumerate() {
            let src = &s.masks.data[p * source..(p + 1) * source];
            row.layout.mask_into(&maps, src, out, (columns, false, 0));
        }
    }
    if let Some(out) = semantic {
        if s.semantic.count > 0 {
            row.layout
                .mask_into(&maps, &s.semantic.data, out, (columns, true, 255));
        } else {
            out.fill(255);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda::resize::host::run_batch;
    use crate::cuda::resize::plan::{plan_batch_sized, ResizeJob, SourceImage, SourcePixels};
    use crate::targets::Planes;

    /// A row's slot as the device writes it (the resize kernel run on the host, statement for
    /// statement) equals the host's layout of it, for rows the device places (resized, cut,
    /// padded in the batch's colour or filling their slot in another, mirrored) and rows laid
    /// out on the host and copied.
    /// The calls of the layout tests, and the colour of the padding inside the output when
    /// the device can place it (`Some(None)`: no padding inside).
    type Case = (Vec<JointOp>, Option<Option<[u8; 3]>>);

    fn layout_cases() -> Vec<Case> {
        let resize = |height, width| JointOp::Resize { height, width };
        let crop = |top, left, height, width| JointOp::Crop {
            top,
            left,
            height,
            width,
        };
        let pad = |left, top, right, bottom, fill| JointOp::Pad {
            left,
            top,
            right,
            bottom,
            fill,
            // Masks padded with 255, or with 7 where the image's pad is black.
            mask_fill: if fill == [0; 3] { 7 } else { 255 },
        };
        let flip = JointOp::HorizontalFlip;
        vec![
            (vec![resize(80, 100)], Some(None)),
            (vec![resize(70, 90), flip], Some(None)),
            (
                vec![resize(120, 150), crop(10, 20, 60, 70), flip],
                Some(None),
            ),
            (
                vec![resize(30, 40), pad(0, 0, 24, 2, [123, 117, 104]), flip],
                Some(Some([123, 117, 104])),
            ),
            (
                vec![
                    resize(60, 50),
                    flip,
                    pad(0, 0, 30, 25, [0; 3]),
                    crop(5, 12, 64, 64),
                ],
                Some(Some([0; 3])),
            ),
            (vec![pad(7, 3, 2, 5, [9; 3])], Some(Some([9; 3]))),
            (vec![crop(4, 6, 30, 40), flip], Some(None)),
            (vec![], Some(None)),
            // Two pads of different colours: laid out on the host.
            (
                vec![pad(4, 0, 0, 0, [1, 2, 3]), pad(0, 0, 4, 0, [3, 2, 1])],
                None,
            ),
        ]
    }

    #[test]
    fn device_rows_write_the_host_layout() {
        let (w, h) = (57u32, 43u32);
        let pixels: Vec<u8> = (0..w * h * 3)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        let cases = layout_cases();
        let mut scratch = LayoutScratch::default();
        for (ops, inside) in &cases {
            for (divisible, pad_fill) in [(32, 0u8), (1, 9), (1, 0)] {
                let (layout, lead) = Layout::plan(ops, w, h).expect("layout");
                assert_eq!(lead, 0);
                let (oh, ow) = layout.size();
                let round = |v: u32| v.div_ceil(divisible) * divisible;
                let (rows, columns) = (round(oh), round(ow));
                let sample = Sample {
                    width: ow,
                    height: oh,
                    pixels: pixels.clone(),
                    ..Sample::default()
                };
                let slot = (rows * columns * 3) as usize;
                let mut want = vec![0u8; slot];
                layout
                    .image_into(&sample, &mut want, columns as usize, pad_fill, &mut scratch)
                    .expect("host layout");
                let placement = device_placement(&layout, (rows, columns), pad_fill);
                let fills_slot = (oh, ow) == (rows, columns);
                let placed = match inside {
                    Some(Some(fill)) => *fill == [pad_fill; 3] || fills_slot,
                    Some(None) => true,
                    None => false,
                };
                assert_eq!(placement.is_some(), placed, "{ops:?}");
                let row = Row {
                    index: 0,
                    id: String::new(),
                    inverse: Inverse::of(ops, w, h),
                    sample,
                    ops: ops.clone(),
                    before: 0,
                    layout,
                    jpeg: None,
                    decoded: None,
                };
                let len = match placement {
                    Some(_) => row.layout.source_len(),
                    None => (oh * ow * 3) as usize,
                };
                let mut memory = vec![0u8; len];
                let device = for_the_device(
                    &row,
                    placement,
                    &mut memory,
                    columns,
                    pad_fill,
                    &mut scratch,
                )
                .expect("device row");
                let base = 4096;
                let job = ResizeJob {
                    source: SourceImage::whole(
                        SourcePixels::Interleaved {
                            ptr: base,
                            pitch: device.width * 3,
                        },
                        device.width,
                        device.height,
                    ),
                    x: device.x,
                    y: device.y,
                    filter: device.filter,
                    order: device.order,
                    pad: device.pad,
                    flip: device.flip,
                    slot: 0,
                };
                let plan =
                    plan_batch_sized(&[job], &[&device.passes], &[(columns, rows)], slot as u64)
                        .expect("plan");
                let mut got = vec![0xA5u8; slot];
                run_batch(&plan, &memory, base, &mut got).expect("host run of the kernel");
                let differing = got.iter().zip(&want).filter(|(a, b)| a != b).count();
                assert_eq!(differing, 0, "{ops:?} in {columns}x{rows}, pad {pad_fill}");
            }
        }
    }

    /// A batch made for the device, its masks gathered by the gather kernel (its host
    /// rendition), equals the batch laid out on the host: instance planes and semantic masks,
    /// of rows resized, cut, padded (masks with 255 and 7) and mirrored, rows with and without
    /// a semantic mask, in batches padded to 32 and to 1.
    #[test]
    fn device_masks_gather_the_host_layout() {
        let (w, h) = (57u32, 43u32);
        let plane = (w * h) as usize;
        let bytes = |n: usize, salt: u32| -> Vec<u8> {
            (0..n as u32)
                .map(|i| (i.wrapping_add(salt).wrapping_mul(2_654_435_761) >> 13) as u8)
                .collect()
        };
        let rows: Vec<Row> = layout_cases()
            .into_iter()
            .enumerate()
            .map(|(i, (ops, _))| {
                let (layout, _) = Layout::plan(&ops, w, h).expect("layout");
                let (oh, ow) = layout.size();
                let objects = i % 3;
                let semantic = i % 4 != 1;
                Row {
                    index: i,
                    id: format!("row {i}"),
                    inverse: Inverse::of(&ops, w, h),
                    sample: Sample {
                        width: ow,
                        height: oh,
                        pixels: bytes(plane * 3, 1),
                        masks: Planes {
                            count: objects,
                            data: bytes(plane * objects, 2 + i as u32)
                                .iter()
                                .map(|b| b & 1)
                                .collect(),
                        },
                        semantic: Planes {
                            count: usize::from(semantic),
                            data: if semantic {
                                bytes(plane, 3 + i as u32)
                            } else {
                                Vec::new()
                            },
                        },
                        ..Sample::default()
                    },
                    ops,
                    before: 0,
                    layout,
                    jpeg: None,
                    decoded: None,
                }
            })
            .collect();
        for divisible in [32, 1] {
            let made = |for_device| {
                let mut batch = TargetBatch::default();
                collate(
                    &mut batch,
                    &rows,
                    (divisible, 0),
                    (Spare::default(), &mut None),
                    (for_device, None),
                )
                .expect("collate");
                batch
            };
            let (host, device) = (made(false), made(true));
            let size = (host.width, host.height);
            let sources = [&device.masks[..], &device.semantic[..]].concat();
            let m = &device.device_masks;
            assert_eq!(m.instance.len() * plane, device.masks.len());
            let instance = crate::cuda::gather_on_host(&sources, &m.instance, &m.maps, size);
            assert_eq!(
                instance, host.masks,
                "instance masks, divisible {divisible}"
            );
            let semantic = crate::cuda::gather_on_host(&sources, &m.semantic, &m.maps, size);
            assert_eq!(
                semantic, host.semantic,
                "semantic masks, divisible {divisible}"
            );
        }
    }

    /// Rows that left their JPEGs to the device, laid out with no decoder to take them, are
    /// decoded on the CPU: the batch is the batch loaded on the CPU, byte for byte, its rows'
    /// order and the order of its skipped rows (a mask missing, a PNG among the JPEGs) kept.
    #[test]
    fn jpegs_no_device_decodes_are_decoded_on_the_cpu() {
        let dir = std::env::temp_dir().join(format!("gpufeed-left-jpegs-{}", std::process::id()));
        let (images, masks) = (dir.join("images"), dir.join("masks"));
        std::fs::create_dir_all(&images).expect("folder");
        std::fs::create_dir_all(&masks).expect("folder");
        for i in 0..6u32 {
            let (w, h) = (37 + 11 * i, 29 + 5 * i);
            let rgb = image::RgbImage::from_fn(w, h, |x, y| {
                image::Rgb([(x * 7 + i) as u8, ((y * 5) ^ x) as u8, (x * y) as u8])
            });
            let ext = if i == 4 { "png" } else { "jpg" };
            rgb.save(images.join(format!("{i}.{ext}"))).expect("image");
            if i != 2 {
                let mask =
                    image::GrayImage::from_fn(w, h, |x, y| image::Luma([((x + y) % 5) as u8]));
                mask.save(masks.join(format!("{i}.png"))).expect("mask");
            }
        }
        let source = TargetSource::segmentation(&images, &masks).expect("pairs");
        let decode = DecodeOptions::default();
        let buffers = BufferPool::new(0);
        let batch = |device: bool| {
            let rows: Vec<Result<Row, ItemError>> = (0..source.len())
                .map(|i| {
                    let recipe = TargetRecipe::SegmentationTrain;
                    prepare(&source, recipe, (&decode, device), (9, 1), i, &buffers)
                })
                .collect();
            let left = rows.iter().flatten().filter(|r| r.jpeg.is_some()).count();
            assert_eq!(left, if device { 4 } else { 0 });
            let made = make_batch(
                (1, &decode),
                rows.into_iter(),
                (32, 0),
                (Spare::default(), &buffers),
                (false, None),
            );
            assert!(made.failed.is_none());
            assert_eq!(made.decoded_rows, 0);
            made.batch
        };
        let (cpu, left) = (batch(false), batch(true));
        assert_eq!(cpu.indices.len(), 5);
        assert_eq!(left.indices, cpu.indices);
        assert!(left.images == cpu.images, "images differ");
        assert!(left.semantic == cpu.semantic, "masks differ");
        let reasons = |b: &TargetBatch| -> Vec<(usize, String)> {
            b.skipped
                .iter()
                .map(|e| (e.index, e.kind.to_string()))
                .collect()
        };
        assert_eq!(reasons(&left), reasons(&cpu));
        assert_eq!(left.skipped.len(), 1);
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn box_formats_round_trip() {
        let b = [1.0, 2.0, 5.0, 10.0];
        assert_eq!(BoxFormat::Xywh.from_xyxy(b), [1.0, 2.0, 4.0, 8.0]);
        assert_eq!(BoxFormat::Cxcywh.from_xyxy(b), [3.0, 6.0, 4.0, 8.0]);
        for f in [BoxFormat::Xyxy, BoxFormat::Xywh, BoxFormat::Cxcywh] {
            assert_eq!(f.to_xyxy(f.from_xyxy(b)), b);
        }
    }

    #[test]
    fn inverse_undoes_resize_crop_and_flip() {
        let ops = [
            JointOp::Resize {
                height: 200,
                width: 300,
            },
            JointOp::Crop {
                top: 10,
                left: 20,
                height: 100,
                width: 150,
            },
            JointOp::HorizontalFlip,
        ];
        let m = Inverse::of(&ops, 600, 400);
        // Original box [100, 60, 200, 100] -> resized /2 -> [50, 30, 100, 50] -> crop ->
        // [30, 20, 80, 40] -> flip in 150 -> [70, 20, 120, 40].
        let back = m.to_original(&[[70.0, 20.0, 120.0, 40.0]]);
        assert_eq!(back, vec![[100.0, 60.0, 200.0, 100.0]]);
    }
}
