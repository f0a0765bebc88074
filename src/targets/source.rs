//! Where samples with targets come from: a COCO instances file beside an image folder, or
//! semantic segmentation pairs (each image and the PNG mask of the same relative path and stem
//! in a mask folder: VOC's `JPEGImages` + `SegmentationClass`, ADE20K's `images` +
//! `annotations`), or WebDataset tar shards (on disk or in object storage) whose samples carry
//! their targets beside the image (`KEY.json`, `KEY.seg.png`). A sample that cannot be used is
//! an [`ItemError`] naming the file (or shard and member) and why.

use std::path::{Path, PathBuf};

use crate::error::{Error, ItemError, ItemErrorKind, Result};
use crate::memory::BufferPool;
use crate::options::DecodeOptions;
use crate::source::Source;

use super::coco::Coco;
use super::device_decode::DeviceJpeg;
use super::sample_json::attach_json;
use super::{Planes, Sample};

/// What the samples of WebDataset shards carry beside their image (`KEY.jpg`, `.jpeg`, `.png`,
/// `.webp`; see `docs/targets.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TargetKind {
    /// `KEY.json`: boxes, labels, crowd flags and keypoints; no masks.
    Detection,
    /// `KEY.json` as for [`TargetKind::Detection`], and an instance mask for every object (from
    /// its `segmentation`: polygons or RLE; an empty mask without one).
    Instances,
    /// `KEY.seg.png` (or `KEY.mask.png`): the semantic mask, palette or gray indices.
    Semantic,
}

impl TargetKind {
    /// The members holding a sample's targets, by extension, in the order looked for.
    fn members(self) -> &'static [&'static str] {
        match self {
            TargetKind::Detection | TargetKind::Instances => &["json"],
            TargetKind::Semantic => &["seg.png", "mask.png"],
        }
    }
}

/// Samples with targets.
#[derive(Debug)]
pub struct TargetSource {
    kind: Kind,
}

#[derive(Debug)]
enum Kind {
    Coco {
        coco: Coco,
        images: PathBuf,
    },
    Segmentation {
        images: Source,
        root: PathBuf,
        masks: PathBuf,
    },
    WebDataset {
        samples: Source,
        kind: TargetKind,
    },
}

impl TargetSource {
    /// The images a COCO instances file lists, under `images` (their `file_name`s), with their
    /// boxes, labels, crowd flags, keypoints and (when the file has segmentations) instance
    /// masks. The file is read here, once.
    pub fn coco(annotations: impl AsRef<Path>, images: impl AsRef<Path>) -> Result<TargetSource> {
        let coco = Coco::open(annotations.as_ref()).map_err(|e| Error::Mismatch(e.0))?;
        Ok(TargetSource {
            kind: Kind::Coco {
                coco,
                images: images.as_ref().to_path_buf(),
            },
        })
    }

    /// Every image under `images`, each with the PNG of the same relative path and stem under
    /// `masks` as its semantic mask (palette or gray indices kept).
    pub fn segmentation(images: impl AsRef<Path>, masks: impl AsRef<Path>) -> Result<TargetSource> {
        let root = images.as_ref().to_path_buf();
        let masks = masks.as_ref().to_path_buf();
        if !masks.is_dir() {
            return Err(Error::Mismatch(format!(
                "{}: not a folder of masks",
                masks.display()
            )));
        }
        Ok(TargetSource {
            kind: Kind::Segmentation {
                images: Source::directory(&root)?,
                root,
                masks,
            },
        })
    }

    /// The samples of the WebDataset tar shards in the folder `shards` (its `.tar` files, in
    /// sorted order) or of the one shard `shards` names, grouped by key as WebDataset groups
    /// them, each with the targets `kind` says (see [`TargetKind`]). The shards' members are
    /// indexed here, once; a damaged part of a shard, a sample without an image or without its
    /// targets' member, is skipped with its reason when it is read.
    pub fn webdataset(shards: impl AsRef<Path>, kind: TargetKind) -> Result<TargetSource> {
        let shards = shards.as_ref();
        let samples = if shards.is_dir() {
            Source::webdataset(shards)?
        } else {
            Source::tar_shards([shards])?
        };
        Ok(TargetSource::from_shards(samples, kind))
    }

    /// The samples of these WebDataset tar shards, in order (see [`TargetSource::webdataset`]).
    pub fn tar_shards<I, P>(shards: I, kind: TargetKind) -> Result<TargetSource>
    where
        I: IntoIterator<Item = P>,
        P: Into<PathBuf>,
    {
        Ok(TargetSource::from_shards(Source::tar_shards(shards)?, kind))
    }

    /// The samples of the WebDataset shards at `url` in object storage (a prefix listing its
    /// `.tar` objects, one shard, or a brace list `s3://b/train-{000..009}.tar`), read as
    /// [`crate::Source::url`] reads them with [`crate::UrlLayout::WebDataset`] (the same
    /// options, cache and retries), each with the targets `kind` says.
    #[cfg(feature = "object-store")]
    pub fn url(
        url: &str,
        kind: TargetKind,
        options: &crate::RemoteOptions,
    ) -> Result<TargetSource> {
        let samples = Source::url(url, crate::UrlLayout::WebDataset, options)?;
        Ok(TargetSource::from_shards(samples, kind))
    }

    fn from_shards(samples: Source, kind: TargetKind) -> TargetSource {
        TargetSource {
            kind: Kind::WebDataset { samples, kind },
        }
    }

    /// The samples.
    pub fn len(&self) -> usize {
        match &self.kind {
            Kind::Coco { coco, .. } => coco.images.len(),
            Kind::Segmentation { images, .. } => images.len(),
            Kind::WebDataset { samples, .. } => samples.len(),
        }
    }

    /// Sample `index`'s id: its image's path, or `shard.tar:KEY.jpg` for a shard's sample.
    pub fn id(&self, index: usize) -> Option<String> {
        match &self.kind {
            Kind::WebDataset { samples, .. } => samples.id(index).map(str::to_string),
            _ => self.image_path(index).map(|p| p.display().to_string()),
        }
    }

    /// Whether the samples have instance masks (a COCO file with segmentations,
    /// [`TargetKind::Instances`]).
    pub fn has_instance_masks(&self) -> bool {
        match &self.kind {
            Kind::Coco { coco, .. } => coco.has_masks(),
            Kind::Segmentation { .. } => false,
            Kind::WebDataset { kind, .. } => *kind == TargetKind::Instances,
        }
    }

    /// Whether the samples carry objects (boxes and labels), not a semantic mask.
    pub fn is_detection(&self) -> bool {
        match &self.kind {
            Kind::Coco { .. } => true,
            Kind::Segmentation { .. } => false,
            Kind::WebDataset { kind, .. } => *kind != TargetKind::Semantic,
        }
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The COCO file, for a COCO source.
    pub fn coco_file(&self) -> Option<&Coco> {
        match &self.kind {
            Kind::Coco { coco, .. } => Some(coco),
            Kind::Segmentation { .. } | Kind::WebDataset { .. } => None,
        }
    }

    /// Sample `index`'s image path.
    pub fn image_path(&self, index: usize) -> Option<PathBuf> {
        match &self.kind {
            Kind::Coco { coco, images } => {
                coco.images.get(index).map(|im| images.join(&im.file_name))
            }
            Kind::Segmentation { images, .. } => images.path(index).map(Path::to_path_buf),
            Kind::WebDataset { .. } => None,
        }
    }

    /// Sample `index`'s mask path (segmentation pairs).
    pub fn mask_path(&self, index: usize) -> Option<PathBuf> {
        match &self.kind {
            Kind::Coco { .. } | Kind::WebDataset { .. } => None,
            Kind::Segmentation {
                images,
                root,
                masks,
            } => {
                let path = images.path(index)?;
                let rel = path.strip_prefix(root).unwrap_or(path);
                Some(masks.join(rel).with_extension("png"))
            }
        }
    }

    /// Sample `index`: the image decoded whole (as Pillow decodes it), its targets attached.
    pub fn load(
        &self,
        index: usize,
        decode: &DecodeOptions,
    ) -> std::result::Result<Sample, ItemError> {
        self.load_with(index, decode, &BufferPool::new(0), false)
            .map(|(sample, _)| sample)
    }

    /// [`TargetSource::load`], its pixels and masks in buffers of `buffers` (given back
    /// by the loader once the sample's batch is laid out); with `device`, a JPEG the device's
    /// decoders take is left to them (the sample then has its size and no pixels).
    pub(crate) fn load_with(
        &self,
        index: usize,
        decode: &DecodeOptions,
        buffers: &BufferPool,
        device: bool,
    ) -> std::result::Result<(Sample, Option<DeviceJpeg>), ItemError> {
        if let Kind::WebDataset { samples, kind } = &self.kind {
            return load_shard_sample(samples, *kind, index, (decode, device), buffers);
        }
        let path = self.image_path(index).unwrap_or_default();
        let fail = |kind| ItemError {
            id: path.display().to_string(),
            index,
            kind,
        };
        let bytes = std::fs::read(&path)
            .map_err(|e| fail(ItemErrorKind::read(&e, format!("{}: {e}", path.display()))))?;
        let (mut sample, jpeg) = decode_or_leave(bytes, decode, buffers, device).map_err(fail)?;
        match &self.kind {
            Kind::Coco { coco, .. } => {
                attach_coco(coco, index, coco.has_masks(), &mut sample, buffers)
            }
            Kind::Segmentation { .. } | Kind::WebDataset { .. } => {
                let mask = self.mask_path(index).unwrap_or_default();
                attach_mask(&mask, &mut sample, buffers)
            }
        }
        .map_err(|reason| fail(ItemErrorKind::Target(reason)))?;
        Ok((sample, jpeg))
    }
}

/// The image of `bytes` decoded whole in a buffer of `buffers`, or with `device` a JPEG the
/// device's decoders take left to them (the sample then has its size and no pixels).
fn decode_or_leave(
    bytes: Vec<u8>,
    decode: &DecodeOptions,
    buffers: &BufferPool,
    device: bool,
) -> std::result::Result<(Sample, Option<DeviceJpeg>), ItemErrorKind> {
    let bytes = match device {
        true => match DeviceJpeg::take(bytes, decode) {
            Ok(jpeg) => {
                let sample = Sample {
                    width: jpeg.width(),
                    height: jpeg.height(),
                    ..Sample::default()
                };
                return Ok((sample, Some(jpeg)));
            }
            Err(bytes) => bytes,
        },
        false => bytes,
    };
    let (pixels, width, height) = crate::cpu::decode_whole(&bytes, decode, buffers)?;
    let sample = Sample {
        width,
        height,
        pixels,
        ..Sample::default()
    };
    Ok((sample, None))
}

/// Sample `index` of WebDataset shards: its image member decoded whole (or with `device`, a
/// JPEG left to the device's decoders), its targets from the member `kind` names.
fn load_shard_sample(
    samples: &Source,
    kind: TargetKind,
    index: usize,
    (decode, device): (&DecodeOptions, bool),
    buffers: &BufferPool,
) -> std::result::Result<(Sample, Option<DeviceJpeg>), ItemError> {
    let bytes = samples.read(index)?;
    let fail = |kind| ItemError {
        id: samples.id(index).unwrap_or_default().to_string(),
        index,
        kind,
    };
    let (mut sample, jpeg) = decode_or_leave(bytes, decode, buffers, device).map_err(fail)?;
    let members = kind.members();
    let Some((ext, part)) = samples.part(index, members)? else {
        return Err(fail(ItemErrorKind::Target(format!(
            "the sample has no .{} member",
            members.join(" or .")
        ))));
    };
    match kind {
        TargetKind::Detection => attach_json(&part, false, &mut sample, buffers),
        TargetKind::Instances => attach_json(&part, true, &mut sample, buffers),
        TargetKind::Semantic => {
            attach_mask_bytes(&part, &format!(".{ext} member"), &mut sample, buffers)
        }
    }
    .map_err(|reason| fail(ItemErrorKind::Target(reason)))?;
    Ok((sample, jpeg))
}

/// The COCO annotations of image `index`, masks (when `masks`) rasterized at the decoded size
/// (torchvision's wrapper rasterizes at the image's size) in a buffer of `buffers`.
pub(super) fn attach_coco(
    coco: &Coco,
    index: usize,
    masks: bool,
    sample: &mut Sample,
    buffers: &BufferPool,
) -> std::result::Result<(), String> {
    let Some(image) = coco.images.get(index) else {
        return Err(format!("no image {index}"));
    };
    let (h, w) = (sample.height, sample.width);
    let plane = h as usize * w as usize;
    if masks {
        let len = plane.saturating_mul(image.annotations.len());
        sample.masks.data = buffers.take(len);
        sample.masks.data.clear();
    }
    for a in image.annotations.clone() {
        sample.boxes.push(coco.bbox(a));
        sample.labels.push(coco.label(a));
        sample.crowd.push(u8::from(coco.is_crowd(a)));
        let k = coco.keypoints(a);
        if !k.is_empty() || !sample.keypoints.is_empty() {
            sample.keypoints.resize(sample.labels.len() - 1, Vec::new());
            sample.keypoints.push(k.to_vec());
        }
        if !masks {
            continue;
        }
        let rle = match coco.rle(a, h, w) {
            // An object without a segmentation has an empty mask.
            None => None,
            Some(Err(e)) => return Err(format!("annotation {a} of image {}: {e}", image.id)),
            Some(Ok(rle)) if (rle.height, rle.width) != (h, w) => {
                return Err(format!(
                    "annotation {a} of image {}: mask of {}x{}, the image is {w}x{h}",
                    image.id, rle.width, rle.height
                ))
            }
            Some(Ok(rle)) => Some(rle),
        };
        let start = sample.masks.data.len();
        sample.masks.data.resize(start + plane, 0);
        if let Some(rle) = rle {
            rle.decode_into(&mut sample.masks.data[start..]);
        }
        sample.masks.count += 1;
    }
    if !sample.keypoints.is_empty() {
        sample.keypoints.resize(sample.labels.len(), Vec::new());
    }
    Ok(())
}

/// The semantic mask at `path`: an 8-bit (or fewer bits) palette or gray PNG of the image's size,
/// its indices kept.
fn attach_mask(
    path: &Path,
    sample: &mut Sample,
    buffers: &BufferPool,
) -> std::result::Result<(), String> {
    let bytes = std::fs::read(path).map_err(|e| format!("mask {}: {e}", path.display()))?;
    attach_mask_bytes(&bytes, &path.display().to_string(), sample, buffers)
}

/// The semantic mask in `bytes` (a PNG), named `name` in reasons.
fn attach_mask_bytes(
    bytes: &[u8],
    name: &str,
    sample: &mut Sample,
    buffers: &BufferPool,
) -> std::result::Result<(), String> {
    let (data, w, h) = read_index_png(bytes, buffers).map_err(|e| format!("mask {name}: {e}"))?;
    if (w, h) != (sample.width, sample.height) {
        buffers.give(data, 0);
        return Err(format!(
            "mask {name} is {w}x{h}, its image {}x{}",
            sample.width, sample.height
        ));
    }
    sample.semantic = Planes { count: 1, data };
    Ok(())
}

/// A palette or gray PNG's indices, one byte a pixel (1, 2 and 4 bits unpacked), in a buffer
/// of `buffers`.
fn read_index_png(
    bytes: &[u8],
    buffers: &BufferPool,
) -> std::result::Result<(Vec<u8>, u32, u32), String> {
    let mut decoder = png::Decoder::new(std::io::Cursor::new(bytes));
    decoder.set_transformations(png::Transformations::IDENTITY);
    let mut reader = decoder.read_info().map_err(|e| e.to_string())?;
    let info = reader.info();
    let (w, h) = (info.width, info.height);
    let (color, depth) = (info.color_type, info.bit_depth);
    if !matches!(color, png::ColorType::Indexed | png::ColorType::Grayscale) {
        return Err(format!("a {color:?} PNG, not palette or gray indices"));
    }
    let bits = match depth {
        png::BitDepth::One => 1,
        png::BitDepth::Two => 2,
        png::BitDepth::Four => 4,
        png::BitDepth::Eight => 8,
        png::BitDepth::Sixteen => return Err("a 16-bit PNG, not 8-bit indices".into()),
    };
    if u64::from(w) * u64::from(h) > 1 << 28 {
        return Err(format!("{w}x{h} is too large for a mask"));
    }
    let size = reader
        .output_buffer_size()
        .ok_or_else(|| "PNG too large".to_string())?;
    let mut raw = buffers.take(size);
    raw.resize(size, 0);
    let line = match reader.next_frame(&mut raw) {
        Ok(frame) => frame.line_size,
        Err(e) => {
            buffers.give(raw, 0);
            return Err(e.to_string());
        }
    };
    let (w_px, h_px) = (w as usize, h as usize);
    if bits == 8 {
        // One byte a pixel: the rows are the indices, packed unless a row carries more.
        if line != w_px {
            for y in 1..h_px {
                raw.copy_within(y * line..y * line + w_px, y * w_px);
            }
        }
        raw.truncate(w_px * h_px);
        return Ok((raw, w, h));
    }
    let mut out = buffers.take(w_px * h_px);
    out.clear();
    for y in 0..h_px {
        let row = &raw[y * line..(y + 1) * line];
        let per = 8 / bits;
        let mask = (1u8 << bits) - 1;
        for x in 0..w_px {
            let byte = row[x / per];
            let shift = 8 - bits * (x % per + 1);
            out.push((byte >> shift) & mask);
        }
    }
    buffers.give(raw, 0);
    Ok((out, w, h))
}
