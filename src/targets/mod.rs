//! Dense targets: detection and segmentation samples (an image with its boxes, labels, instance
//! masks or semantic mask) read from COCO files, image/mask folder pairs or WebDataset shards
//! ([`TargetSource`]),
//! transformed together exactly as torchvision v2's reference recipes do ([`TargetRecipe`]:
//! each image's calls drawn from (seed, epoch, index) as [`JointOp`]s), and collated into
//! padded batches with packed boxes and labels ([`TargetBatch`], [`TargetLoader`], the next
//! batches made ahead on the rayon pool while the caller uses one), each row's inverse map kept
//! so a model's boxes go back to the original pixels ([`TargetBatch::to_original`]).
//!
//! The samples are read, decoded whole (libjpeg-turbo, as Pillow) and their targets transformed
//! on the CPU, masks resized with PyTorch's nearest; the images are resized with Pillow's
//! bilinear filter on the CPU (`src/resample`) or, for a batch on a CUDA device
//! ([`TargetLoader::next_device_batch`]), by the device's resize kernel (`src/cuda/resize`),
//! with the same bytes. See `docs/targets.md`.

mod ahead;
mod batch;
mod coco;
mod device;
mod device_decode;
mod layout;
mod mask;
mod recipe;
mod sample_json;
mod source;
mod transform;

pub use batch::{BoxFormat, Inverse, TargetBatch, TargetLoader, TargetReport};
pub use coco::{Category, Coco, CocoError, CocoImage, CocoReport};
pub use device::{detection_output, segmentation_output, DeviceTargetBatch};
pub use mask::{MaskError, Rle};
pub use recipe::TargetRecipe;
pub use source::{TargetKind, TargetSource};

/// `count` planes of one size, one byte a pixel, plane after plane, row-major.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Planes {
    /// How many planes.
    pub count: usize,
    /// The bytes, `count * height * width`.
    pub data: Vec<u8>,
}

/// One image and its targets, as loaded and as transformed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Sample {
    /// Columns.
    pub width: u32,
    /// Rows.
    pub height: u32,
    /// Packed RGB8, row-major.
    pub pixels: Vec<u8>,
    /// Object boxes, XYXY in pixels (`f32`, torchvision's `BoundingBoxes`).
    pub boxes: Vec<[f32; 4]>,
    /// Each object's label (its COCO `category_id`).
    pub labels: Vec<i64>,
    /// Each object's `iscrowd`.
    pub crowd: Vec<u8>,
    /// Each object's keypoints, `[x, y, visibility]` flattened; empty without.
    pub keypoints: Vec<Vec<f32>>,
    /// Instance masks, one plane an object (none when the source has no segmentation).
    pub masks: Planes,
    /// The semantic mask (one plane of class indices, palette indices kept), or none.
    pub semantic: Planes,
}

impl Sample {
    /// Keeps the objects whose `keep` is true, with their labels, masks and keypoints.
    pub(crate) fn retain(&mut self, keep: &[bool]) {
        let pick = |v: &mut Vec<_>| {
            let mut k = keep.iter();
            v.retain(|_| k.next().copied().unwrap_or(true));
        };
        pick(&mut self.boxes);
        let mut k = keep.iter();
        self.labels.retain(|_| k.next().copied().unwrap_or(true));
        let mut k = keep.iter();
        self.crowd.retain(|_| k.next().copied().unwrap_or(true));
        if !self.keypoints.is_empty() {
            let mut k = keep.iter();
            self.keypoints.retain(|_| k.next().copied().unwrap_or(true));
        }
        if self.masks.count == keep.len() && self.masks.count > 0 {
            let plane = self.masks.data.len() / self.masks.count;
            let mut out = Vec::with_capacity(self.masks.data.len());
            for (i, _) in keep.iter().enumerate().filter(|(_, &k)| k) {
                out.extend_from_slice(&self.masks.data[i * plane..(i + 1) * plane]);
            }
            self.masks.count = keep.iter().filter(|&&k| k).count();
            self.masks.data = out;
        }
    }

    /// Applies `ops` in order.
    pub fn apply(&mut self, ops: &[JointOp]) -> crate::Result<()> {
        transform::apply(self, ops).map_err(crate::Error::Mismatch)
    }
}

/// One torchvision v2 functional call on an image and its targets together (see
/// `docs/targets.md` for each one's exact arithmetic).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum JointOp {
    /// `F.resize(.., [height, width])`: the image bilinear (Pillow), masks nearest (PyTorch).
    Resize {
        /// New rows.
        height: u32,
        /// New columns.
        width: u32,
    },
    /// `F.crop(.., top, left, height, width)` of a window inside the image; boxes clamped.
    Crop {
        /// First row.
        top: u32,
        /// First column.
        left: u32,
        /// Rows.
        height: u32,
        /// Columns.
        width: u32,
    },
    /// `F.pad(.., [left, top, right, bottom])`: the image with `fill`, instance masks with 0,
    /// the semantic mask with `mask_fill`.
    Pad {
        /// Columns added on the left.
        left: u32,
        /// Rows added at the top.
        top: u32,
        /// Columns added on the right.
        right: u32,
        /// Rows added at the bottom.
        bottom: u32,
        /// The image's fill, per channel.
        fill: [u8; 3],
        /// The semantic mask's fill.
        mask_fill: u8,
    },
    /// `RandomIoUCrop`'s call: `F.crop(.., top, left, height, width)`, then the boxes whose
    /// centre (before the crop) is not strictly inside the window set to `[0, 0, 0, 0]`, for
    /// `SanitizeBoundingBoxes` to drop.
    IouCrop {
        /// First row.
        top: u32,
        /// First column.
        left: u32,
        /// Rows.
        height: u32,
        /// Columns.
        width: u32,
    },
    /// `F.horizontal_flip`.
    HorizontalFlip,
    /// A colour call on the `uint8` image tensor (`F.adjust_brightness`, `adjust_contrast`,
    /// `adjust_saturation`, `adjust_hue`), the targets unchanged.
    Color(crate::augment::Op),
    /// `F.permute_channels(.., permutation)`.
    PermuteChannels([u8; 3]),
    /// `SanitizeBoundingBoxes()` (`min_size=1`, `min_area=1`).
    Sanitize,
}

impl JointOp {
    /// The call as one JSON object: `{"resize": [h, w]}`, `{"crop": [top, left, h, w]}`,
    /// `{"pad": [left, top, right, bottom], "fill": [r, g, b], "mask_fill": v}`,
    /// `{"color": "adjust_hue", "args": {"hue_factor": f}}`, `{"permute_channels": [2, 0, 1]}`,
    /// `{"iou_crop": [top, left, h, w]}`, `{"horizontal_flip": true}`, `{"sanitize": true}`.
    pub fn json(&self) -> serde_json::Value {
        use serde_json::json;
        match *self {
            JointOp::Resize { height, width } => json!({"resize": [height, width]}),
            JointOp::Crop {
                top,
                left,
                height,
                width,
            } => json!({"crop": [top, left, height, width]}),
            JointOp::Pad {
                left,
                top,
                right,
                bottom,
                fill,
                mask_fill,
            } => json!({"pad": [left, top, right, bottom], "fill": fill, "mask_fill": mask_fill}),
            JointOp::Color(op) => {
                let args: serde_json::Value =
                    serde_json::from_str(&op.json_arguments()).unwrap_or_default();
                json!({"color": op.function(), "args": args})
            }
            JointOp::PermuteChannels(p) => json!({"permute_channels": p}),
            JointOp::IouCrop {
                top,
                left,
                height,
                width,
            } => json!({"iou_crop": [top, left, height, width]}),
            JointOp::HorizontalFlip => json!({"horizontal_flip": true}),
            JointOp::Sanitize => json!({"sanitize": true}),
        }
    }
}
