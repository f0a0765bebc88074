//! Batches of samples with targets: each epoch's order (shuffled from (seed, epoch), sharded),
//! the samples loaded and transformed on the rayon pool, the images padded to the batch's
//! largest (rounded up to a multiple), boxes, labels and crowd flags packed with per-row
//! offsets, masks as `u8` planes of the padded size, and each row's calls and inverse map.

use rayon::prelude::*;

use crate::error::ItemError;
use crate::options::DecodeOptions;
use crate::random::Draws;

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
}

/// Batches of a [`TargetSource`] under a [`TargetRecipe`].
#[derive(Debug)]
pub struct TargetLoader {
    source: TargetSource,
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
}

impl TargetLoader {
    /// Batches of 8 of `source`, unchanged ([`TargetRecipe::Plain`]), in order, padded to a
    /// multiple of 32.
    pub fn new(source: TargetSource) -> TargetLoader {
        let mut loader = TargetLoader {
            source,
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
        };
        loader.plan_epoch();
        loader
    }

    /// The recipe.
    pub fn recipe(mut self, recipe: TargetRecipe) -> TargetLoader {
        self.recipe = recipe;
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
        self
    }

    /// The value of the images' padding in a batch.
    pub fn pad_fill(mut self, v: u8) -> TargetLoader {
        self.pad_fill = v;
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

    /// The epoch's next batch; `None` at its end (then [`TargetLoader::next_epoch`]).
    pub fn next_batch(&mut self) -> Option<TargetBatch> {
        if self.position >= self.order.len() {
            return None;
        }
        let end = (self.position + self.batch_size).min(self.order.len());
        let indices = self.order[self.position..end].to_vec();
        self.position = end;
        let (recipe, seed, epoch, decode) = (self.recipe, self.seed, self.epoch, self.decode);
        let source = &self.source;
        let loaded: Vec<_> = indices
            .par_iter()
            .map(|&index| {
                let mut sample = source.load(index, &decode)?;
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
                sample.apply(&ops).map_err(|e| ItemError {
                    id: source
                        .image_path(index)
                        .map(|p| p.display().to_string())
                        .unwrap_or_default(),
                    index,
                    kind: crate::error::ItemErrorKind::Resize(e.to_string()),
                })?;
                Ok((index, sample, ops, inverse, before))
            })
            .collect();
        let mut batch = TargetBatch {
            epoch,
            ..TargetBatch::default()
        };
        let mut rows = Vec::new();
        for r in loaded {
            match r {
                Ok((index, sample, ops, inverse, before)) => {
                    self.report.objects += before;
                    self.report.dropped_objects += before - sample.boxes.len();
                    batch.indices.push(index);
                    batch.ids.push(
                        source
                            .image_path(index)
                            .map(|p| p.display().to_string())
                            .unwrap_or_default(),
                    );
                    batch.ops.push(ops);
                    batch.inverse.push(inverse);
                    rows.push(sample);
                }
                Err(e) => batch.skipped.push(e),
            }
        }
        self.report.samples += rows.len();
        self.report.skipped.extend(batch.skipped.iter().cloned());
        collate(&mut batch, rows, self.divisible, self.pad_fill);
        Some(batch)
    }
}

/// Lays `rows` out in `batch`: padded images, packed targets, masks.
fn collate(batch: &mut TargetBatch, rows: Vec<Sample>, divisible: u32, pad_fill: u8) {
    let round = |v: u32| v.div_ceil(divisible) * divisible;
    let h = round(rows.iter().map(|s| s.height).max().unwrap_or(0));
    let w = round(rows.iter().map(|s| s.width).max().unwrap_or(0));
    let (hu, wu) = (h as usize, w as usize);
    batch.height = h;
    batch.width = w;
    batch.images = vec![pad_fill; rows.len() * hu * wu * 3];
    let semantic = rows.iter().any(|s| s.semantic.count > 0);
    if semantic {
        batch.semantic = vec![255; rows.len() * hu * wu];
    }
    batch.offsets.push(0);
    for (i, s) in rows.iter().enumerate() {
        let (sw, sh) = (s.width as usize, s.height as usize);
        let image = &mut batch.images[i * hu * wu * 3..(i + 1) * hu * wu * 3];
        for y in 0..sh {
            image[y * wu * 3..y * wu * 3 + sw * 3]
                .copy_from_slice(&s.pixels[y * sw * 3..(y + 1) * sw * 3]);
        }
        if semantic && s.semantic.count > 0 {
            let plane = &mut batch.semantic[i * hu * wu..(i + 1) * hu * wu];
            for y in 0..sh {
                plane[y * wu..y * wu + sw].copy_from_slice(&s.semantic.data[y * sw..(y + 1) * sw]);
            }
        }
        for p in 0..s.masks.count {
            let start = batch.masks.len();
            batch.masks.resize(start + hu * wu, 0);
            let src = &s.masks.data[p * sw * sh..(p + 1) * sw * sh];
            for y in 0..sh {
                batch.masks[start + y * wu..start + y * wu + sw]
                    .copy_from_slice(&src[y * sw..(y + 1) * sw]);
            }
        }
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
}

#[cfg(test)]
mod tests {
    use super::*;

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
