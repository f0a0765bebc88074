//! COCO's instances files (`instances_*.json`) read once, in one pass, into compact arrays: the
//! images (id, file name, size, their annotations' range), the categories, and per annotation its
//! box (`f32`, XYXY as torchvision's COCO wrapper makes it), category, `iscrowd`, segmentation
//! (polygons' coordinates in one `f64` array, uncompressed RLE counts in one `u32` array,
//! compressed counts strings in one byte array) and keypoints. The file is walked with serde:
//! only one annotation at a time is held as a JSON value.

use std::collections::HashMap;
use std::fmt;
use std::ops::Range;
use std::path::Path;

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

use super::mask::{MaskError, Rle};

/// One image of a COCO file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CocoImage {
    /// The image's `id`.
    pub id: u64,
    /// Its `file_name`, relative to the image folder.
    pub file_name: String,
    /// `width` the file states.
    pub width: u32,
    /// `height` the file states.
    pub height: u32,
    /// Its annotations: indices into the file's annotation arrays.
    pub annotations: Range<usize>,
}

/// A category of a COCO file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Category {
    /// Its `id` (the label of its objects).
    pub id: i64,
    /// Its `name`.
    pub name: String,
}

/// How an annotation's object is outlined.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Segmentation {
    /// No `segmentation`.
    None,
    /// Polygons: `parts` indexes `part_ends`, each part's coordinates in `coords`.
    Polygons { parts: (u32, u32) },
    /// Uncompressed RLE: its size and its runs in `counts`.
    Counts { h: u32, w: u32, runs: (u32, u32) },
    /// Compressed RLE: its size and its string in `strings`.
    Text { h: u32, w: u32, bytes: (u32, u32) },
    /// A `segmentation` of a shape COCO does not have.
    Malformed,
}

/// What reading a COCO file found that it could not use, counted, each a documented outcome:
/// annotations of an image the file does not list and annotations of a category it does not
/// list are left out (and counted here); the rest is kept.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CocoReport {
    /// Annotations whose `image_id` names no image of the file.
    pub orphan_annotations: usize,
    /// Annotations whose `category_id` names no category of the file.
    pub unknown_categories: usize,
}

/// A COCO instances file, read.
#[derive(Debug, Clone, Default)]
pub struct Coco {
    /// The images, in the file's order.
    pub images: Vec<CocoImage>,
    /// The categories, in the file's order.
    pub categories: Vec<Category>,
    /// What was left out.
    pub report: CocoReport,
    boxes: Vec<[f32; 4]>,
    labels: Vec<i64>,
    crowd: Vec<u8>,
    segmentation: Vec<Segmentation>,
    part_ends: Vec<u32>,
    coords: Vec<f64>,
    counts: Vec<u32>,
    strings: Vec<u8>,
    keypoints: Vec<(u32, u32)>,
    keypoint_values: Vec<f32>,
}

/// Why a COCO file could not be read.
#[derive(Debug)]
pub struct CocoError(pub String);

impl fmt::Display for CocoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for CocoError {}

/// One annotation as the file gives it, before it is attached to its image.
struct Raw {
    image_id: u64,
    category: i64,
}

/// The arrays being filled while the file is walked.
#[derive(Default)]
struct Builder {
    coco: Coco,
    raw: Vec<Raw>,
    /// The first malformed annotation: what the error says.
    bad: Option<String>,
}

impl Coco {
    /// Reads `path`. A file that is not COCO JSON is an error naming the file and what is wrong.
    pub fn open(path: &Path) -> Result<Coco, CocoError> {
        let file =
            std::fs::File::open(path).map_err(|e| CocoError(format!("{}: {e}", path.display())))?;
        let reader = std::io::BufReader::with_capacity(1 << 20, file);
        Coco::from_reader(reader).map_err(|e| CocoError(format!("{}: {}", path.display(), e.0)))
    }

    /// Reads COCO JSON from `reader`.
    pub fn from_reader<R: std::io::Read>(reader: R) -> Result<Coco, CocoError> {
        let mut de = serde_json::Deserializer::from_reader(reader);
        let mut builder = Builder::default();
        (&mut de)
            .deserialize_map(TopLevel(&mut builder))
            .map_err(|e| CocoError(format!("not COCO JSON: {e}")))?;
        de.end()
            .map_err(|e| CocoError(format!("not COCO JSON: {e}")))?;
        if let Some(bad) = builder.bad {
            return Err(CocoError(bad));
        }
        builder.finish()
    }

    /// Reads COCO JSON from bytes.
    pub fn from_slice(bytes: &[u8]) -> Result<Coco, CocoError> {
        Coco::from_reader(bytes)
    }

    /// The annotations in all.
    pub fn annotation_count(&self) -> usize {
        self.boxes.len()
    }

    /// Annotation `a`'s box, XYXY in pixels: COCO's `[x, y, w, h]` as `f32`, then
    /// `x + w`, `y + h` in `f32` (torchvision's wrapper and format conversion).
    pub fn bbox(&self, a: usize) -> [f32; 4] {
        self.boxes[a]
    }

    /// Annotation `a`'s `category_id`.
    pub fn label(&self, a: usize) -> i64 {
        self.labels[a]
    }

    /// Annotation `a`'s `iscrowd`.
    pub fn is_crowd(&self, a: usize) -> bool {
        self.crowd[a] != 0
    }

    /// Annotation `a`'s keypoints, `[x, y, visibility]` triples flattened (empty without).
    pub fn keypoints(&self, a: usize) -> &[f32] {
        let (s, e) = self.keypoints[a];
        &self.keypoint_values[s as usize..e as usize]
    }

    /// Annotation `a`'s mask as pycocotools's `annToRLE` makes it for an image of
    /// `height` x `width`: polygons rasterized and merged; uncompressed counts taken at their
    /// own size; a counts string decoded. `None` without a segmentation.
    pub fn rle(&self, a: usize, height: u32, width: u32) -> Option<Result<Rle, MaskError>> {
        match self.segmentation[a] {
            Segmentation::None => None,
            Segmentation::Malformed => Some(Err(MaskError::BadCounts)),
            Segmentation::Polygons { parts } => {
                let mut rles = Vec::new();
                for p in parts.0..parts.1 {
                    let start = if p == 0 {
                        0
                    } else {
                        self.part_ends[p as usize - 1]
                    };
                    let end = self.part_ends[p as usize];
                    let xy = &self.coords[start as usize..end as usize];
                    match Rle::from_polygon(height, width, xy) {
                        Ok(r) => rles.push(r),
                        Err(e) => return Some(Err(e)),
                    }
                }
                Some(Ok(Rle::merge(&rles)))
            }
            Segmentation::Counts { h, w, runs } => Some(Rle::from_counts(
                h,
                w,
                self.counts[runs.0 as usize..runs.1 as usize].to_vec(),
            )),
            Segmentation::Text { h, w, bytes } => Some(Rle::from_string(
                h,
                w,
                &self.strings[bytes.0 as usize..bytes.1 as usize],
            )),
        }
    }

    /// Whether any annotation has a segmentation.
    pub fn has_masks(&self) -> bool {
        self.segmentation
            .iter()
            .any(|s| !matches!(s, Segmentation::None))
    }
}

impl Builder {
    fn image(&mut self, v: &Value) {
        let id = v.get("id").and_then(Value::as_u64);
        let name = v.get("file_name").and_then(Value::as_str);
        let w = v.get("width").and_then(Value::as_u64);
        let h = v.get("height").and_then(Value::as_u64);
        match (id, name, w, h) {
            (Some(id), Some(name), Some(w), Some(h))
                if w <= u32::MAX as u64 && h <= u32::MAX as u64 =>
            {
                self.coco.images.push(CocoImage {
                    id,
                    file_name: name.to_string(),
                    width: w as u32,
                    height: h as u32,
                    annotations: 0..0,
                })
            }
            _ => self.malformed("image", v),
        }
    }

    fn category(&mut self, v: &Value) {
        match (v.get("id").and_then(Value::as_i64), v.get("name")) {
            (Some(id), name) => self.coco.categories.push(Category {
                id,
                name: name.and_then(Value::as_str).unwrap_or("").to_string(),
            }),
            _ => self.malformed("category", v),
        }
    }

    fn malformed(&mut self, what: &str, v: &Value) {
        if self.bad.is_none() {
            let mut text = v.to_string();
            text.truncate(200);
            self.bad = Some(format!("malformed {what}: {text}"));
        }
    }

    fn annotation(&mut self, v: &Value) {
        let image_id = v.get("image_id").and_then(Value::as_u64);
        let category = v.get("category_id").and_then(Value::as_i64);
        let bbox = v.get("bbox").and_then(Value::as_array).and_then(|b| {
            let n: Vec<f64> = b.iter().filter_map(Value::as_f64).collect();
            (n.len() == 4 && b.len() == 4).then_some(n)
        });
        let (Some(image_id), Some(category), Some(b)) = (image_id, category, bbox) else {
            return self.malformed("annotation", v);
        };
        let c = &mut self.coco;
        let (x, y) = (b[0] as f32, b[1] as f32);
        c.boxes.push([x, y, x + b[2] as f32, y + b[3] as f32]);
        c.labels.push(category);
        let crowd = v.get("iscrowd").and_then(Value::as_u64).unwrap_or(0);
        c.crowd.push(u8::from(crowd != 0));
        let segm = self.segmentation(v.get("segmentation"));
        self.coco.segmentation.push(segm);
        let c = &mut self.coco;
        let start = c.keypoint_values.len() as u32;
        if let Some(k) = v.get("keypoints").and_then(Value::as_array) {
            c.keypoint_values
                .extend(k.iter().map(|x| x.as_f64().unwrap_or(f64::NAN) as f32));
        }
        c.keypoints.push((start, c.keypoint_values.len() as u32));
        self.raw.push(Raw { image_id, category });
    }

    fn segmentation(&mut self, v: Option<&Value>) -> Segmentation {
        let c = &mut self.coco;
        match v {
            None | Some(Value::Null) => Segmentation::None,
            Some(Value::Array(polys)) => {
                let first = c.part_ends.len() as u32;
                for p in polys {
                    let Some(p) = p.as_array() else {
                        return Segmentation::Malformed;
                    };
                    c.coords
                        .extend(p.iter().map(|x| x.as_f64().unwrap_or(f64::NAN)));
                    c.part_ends.push(c.coords.len() as u32);
                }
                Segmentation::Polygons {
                    parts: (first, c.part_ends.len() as u32),
                }
            }
            Some(Value::Object(rle)) => {
                let size = rle.get("size").and_then(Value::as_array).and_then(|s| {
                    let h = s.first()?.as_u64()?;
                    let w = s.get(1)?.as_u64()?;
                    (s.len() == 2 && h <= u32::MAX as u64 && w <= u32::MAX as u64)
                        .then_some((h as u32, w as u32))
                });
                let Some((h, w)) = size else {
                    return Segmentation::Malformed;
                };
                match rle.get("counts") {
                    Some(Value::String(s)) => {
                        let start = c.strings.len() as u32;
                        c.strings.extend_from_slice(s.as_bytes());
                        Segmentation::Text {
                            h,
                            w,
                            bytes: (start, c.strings.len() as u32),
                        }
                    }
                    Some(Value::Array(runs)) => {
                        let start = c.counts.len() as u32;
                        for r in runs {
                            match r.as_u64() {
                                Some(r) if r <= u32::MAX as u64 => c.counts.push(r as u32),
                                _ => return Segmentation::Malformed,
                            }
                        }
                        Segmentation::Counts {
                            h,
                            w,
                            runs: (start, c.counts.len() as u32),
                        }
                    }
                    _ => Segmentation::Malformed,
                }
            }
            Some(_) => Segmentation::Malformed,
        }
    }

    /// Attaches the annotations to their images, leaving out (and counting) those of no image
    /// and of no category; the kept ones reordered image by image, in the file's order within
    /// an image.
    fn finish(mut self) -> Result<Coco, CocoError> {
        let c = &mut self.coco;
        let by_id: HashMap<u64, usize> = c
            .images
            .iter()
            .enumerate()
            .map(|(i, im)| (im.id, i))
            .collect();
        if by_id.len() != c.images.len() {
            return Err(CocoError("two images share an id".into()));
        }
        let categories: std::collections::HashSet<i64> =
            c.categories.iter().map(|k| k.id).collect();
        let mut order: Vec<(usize, usize)> = Vec::with_capacity(self.raw.len());
        for (a, raw) in self.raw.iter().enumerate() {
            match by_id.get(&raw.image_id) {
                None => c.report.orphan_annotations += 1,
                Some(_) if !categories.contains(&raw.category) => c.report.unknown_categories += 1,
                Some(&image) => order.push((image, a)),
            }
        }
        order.sort_by_key(|&(image, a)| (image, a));
        let pick = |a: &[usize]| a.to_vec();
        let kept: Vec<usize> = pick(&order.iter().map(|&(_, a)| a).collect::<Vec<_>>());
        c.boxes = kept.iter().map(|&a| c.boxes[a]).collect();
        c.labels = kept.iter().map(|&a| c.labels[a]).collect();
        c.crowd = kept.iter().map(|&a| c.crowd[a]).collect();
        c.segmentation = kept.iter().map(|&a| c.segmentation[a]).collect();
        c.keypoints = kept.iter().map(|&a| c.keypoints[a]).collect();
        let mut at = 0;
        for (i, im) in c.images.iter_mut().enumerate() {
            let start = at;
            while at < order.len() && order[at].0 == i {
                at += 1;
            }
            im.annotations = start..at;
        }
        Ok(self.coco)
    }
}

/// The top-level object: `images`, `annotations` and `categories` walked an element at a time,
/// everything else skipped.
struct TopLevel<'a>(&'a mut Builder);

impl<'de> Visitor<'de> for TopLevel<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a COCO object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key::<String>()? {
            let kind = match key.as_str() {
                "images" => Kind::Image,
                "annotations" => Kind::Annotation,
                "categories" => Kind::Category,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                    continue;
                }
            };
            map.next_value_seed(Elements(&mut *self.0, kind))?;
        }
        Ok(())
    }
}

#[derive(Clone, Copy)]
enum Kind {
    Image,
    Annotation,
    Category,
}

/// One of the top-level arrays, its elements handed to the builder one by one.
struct Elements<'a>(&'a mut Builder, Kind);

impl<'de> DeserializeSeed<'de> for Elements<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for Elements<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an array")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while let Some(v) = seq.next_element::<Value>()? {
            match self.1 {
                Kind::Image => self.0.image(&v),
                Kind::Annotation => self.0.annotation(&v),
                Kind::Category => self.0.category(&v),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = r#"{"info": {"x": [1, 2]}, "images": [
        {"id": 7, "file_name": "a.jpg", "width": 20, "height": 10},
        {"id": 3, "file_name": "b.jpg", "width": 8, "height": 8}],
      "annotations": [
        {"id": 1, "image_id": 3, "category_id": 1, "bbox": [1, 2, 3, 4], "iscrowd": 0,
         "segmentation": [[1, 1, 5, 1, 5, 5]], "keypoints": [1, 2, 2]},
        {"id": 2, "image_id": 7, "category_id": 2, "bbox": [0.5, 0, 1, 1], "iscrowd": 1,
         "segmentation": {"size": [10, 20], "counts": [5, 10, 185]}},
        {"id": 3, "image_id": 99, "category_id": 1, "bbox": [0, 0, 1, 1]},
        {"id": 4, "image_id": 7, "category_id": 42, "bbox": [0, 0, 1, 1]}],
      "categories": [{"id": 1, "name": "cat"}, {"id": 2, "name": "dog"}]}"#;

    #[test]
    fn reads_images_annotations_and_what_it_left_out() {
        let c = Coco::from_slice(FILE.as_bytes()).unwrap();
        assert_eq!(c.images.len(), 2);
        assert_eq!(c.categories[1].name, "dog");
        assert_eq!(c.annotation_count(), 2);
        assert_eq!(c.report.orphan_annotations, 1);
        assert_eq!(c.report.unknown_categories, 1);
        let a = c.images[0].annotations.clone();
        assert_eq!(a.len(), 1);
        assert_eq!(c.bbox(a.start), [0.5, 0.0, 1.5, 1.0]);
        assert!(c.is_crowd(a.start));
        assert_eq!(c.rle(a.start, 10, 20).unwrap().unwrap().area(), 10);
        let b = c.images[1].annotations.start;
        assert_eq!(c.bbox(b), [1.0, 2.0, 4.0, 6.0]);
        assert_eq!(c.keypoints(b), &[1.0, 2.0, 2.0]);
        assert!(c.rle(b, 8, 8).unwrap().is_ok());
    }

    #[test]
    fn malformed_files_are_errors() {
        assert!(Coco::from_slice(b"[1, 2]").is_err());
        assert!(Coco::from_slice(br#"{"images": [{"id": 1}]}"#).is_err());
        assert!(Coco::from_slice(br#"{"images": 3}"#).is_err());
    }
}
