//! A WebDataset sample's `.json` member: its objects, in COCO's own per-image form
//! (`{"annotations": [{"bbox": [x, y, w, h], "category_id": .., "segmentation": ..,
//! "iscrowd": .., "keypoints": [..]}], "categories": [..]}`) or a flat form
//! (`{"boxes": [[x, y, w, h], ..]` or `"boxes_xyxy": [[x1, y1, x2, y2], ..]`, `"labels": [..]`,
//! `"iscrowd": [..]`}). The COCO form is read by the COCO reader itself (boxes, RLE and
//! polygons exactly as a COCO file's); other keys are ignored.

use serde_json::{json, Value};

use super::coco::Coco;
use super::source::attach_coco;
use super::Sample;
use crate::memory::BufferPool;

/// Attaches the objects of the JSON `bytes` to `sample` (its image decoded), with an instance
/// mask for each when `masks`. `Err` names what is wrong.
pub(crate) fn attach_json(
    bytes: &[u8],
    masks: bool,
    sample: &mut Sample,
    buffers: &BufferPool,
) -> Result<(), String> {
    let value: Value =
        serde_json::from_slice(bytes).map_err(|e| format!("the .json member is not JSON: {e}"))?;
    let Some(object) = value.as_object() else {
        return Err("the .json member is not a JSON object".into());
    };
    let (annotations, xyxy) = if let Some(a) = object.get("annotations") {
        let a = a
            .as_array()
            .ok_or("the .json member's \"annotations\" is not a list")?;
        (a.clone(), None)
    } else {
        flat(object)?
    };
    let categories = match object.get("categories") {
        Some(c) => c.clone(),
        // Every category the annotations name.
        None => {
            let mut ids: Vec<i64> = annotations
                .iter()
                .filter_map(|a| a.get("category_id").and_then(Value::as_i64))
                .collect();
            ids.sort_unstable();
            ids.dedup();
            Value::Array(ids.into_iter().map(|id| json!({"id": id})).collect())
        }
    };
    let annotations: Vec<Value> = annotations
        .into_iter()
        .map(|mut a| {
            if let Some(a) = a.as_object_mut() {
                a.insert("image_id".into(), json!(0));
            }
            a
        })
        .collect();
    let doc = json!({
        "images": [{"id": 0, "file_name": "", "width": sample.width, "height": sample.height}],
        "annotations": annotations,
        "categories": categories,
    });
    let bytes = serde_json::to_vec(&doc).map_err(|e| e.to_string())?;
    let coco = Coco::from_slice(&bytes).map_err(|e| format!("the .json member: {e}"))?;
    attach_coco(&coco, 0, masks, sample, buffers)?;
    if let Some(boxes) = xyxy {
        sample.boxes = boxes;
    }
    Ok(())
}

/// The flat form as COCO annotations, and its `boxes_xyxy` as `f32` when it gives those.
#[allow(clippy::type_complexity)]
fn flat(
    object: &serde_json::Map<String, Value>,
) -> Result<(Vec<Value>, Option<Vec<[f32; 4]>>), String> {
    let (boxes, xyxy) = match (object.get("boxes"), object.get("boxes_xyxy")) {
        (Some(b), None) => (b, false),
        (None, Some(b)) => (b, true),
        (Some(_), Some(_)) => return Err("the .json member has both boxes and boxes_xyxy".into()),
        (None, None) => {
            return Err(
                "the .json member has no \"annotations\", \"boxes\" or \"boxes_xyxy\"".into(),
            )
        }
    };
    let boxes: Vec<[f64; 4]> = serde_json::from_value(boxes.clone())
        .map_err(|e| format!("the .json member's boxes are not [x, y, w, h] lists: {e}"))?;
    let labels: Vec<i64> = match object.get("labels") {
        Some(l) => serde_json::from_value(l.clone())
            .map_err(|e| format!("the .json member's labels are not integers: {e}"))?,
        None => return Err("the .json member has boxes but no \"labels\"".into()),
    };
    let crowd: Vec<u64> = match object.get("iscrowd") {
        Some(c) => serde_json::from_value(c.clone())
            .map_err(|e| format!("the .json member's iscrowd is not integers: {e}"))?,
        None => vec![0; boxes.len()],
    };
    if labels.len() != boxes.len() || crowd.len() != boxes.len() {
        return Err(format!(
            "the .json member has {} boxes, {} labels and {} iscrowd",
            boxes.len(),
            labels.len(),
            crowd.len()
        ));
    }
    let annotations = boxes
        .iter()
        .zip(&labels)
        .zip(&crowd)
        .map(|((b, l), c)| {
            let bbox = if xyxy {
                [b[0], b[1], b[2] - b[0], b[3] - b[1]]
            } else {
                *b
            };
            json!({"bbox": bbox, "category_id": l, "iscrowd": c})
        })
        .collect();
    let exact = xyxy.then(|| {
        boxes
            .iter()
            .map(|b| b.map(|v| v as f32))
            .collect::<Vec<[f32; 4]>>()
    });
    Ok((annotations, exact))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Sample {
        Sample {
            width: 8,
            height: 6,
            pixels: vec![0; 8 * 6 * 3],
            ..Sample::default()
        }
    }

    #[test]
    fn the_coco_and_flat_forms_give_the_same_objects() {
        let coco = br#"{"annotations": [{"bbox": [1, 2, 3.5, 2], "category_id": 7,
            "segmentation": [[1, 2, 4, 2, 4, 4]], "iscrowd": 0, "area": 9},
            {"bbox": [0, 0, 2, 2], "category_id": 3, "iscrowd": 1}], "other": 1}"#;
        let mut a = sample();
        attach_json(coco, true, &mut a, &BufferPool::new(0)).expect("coco form");
        assert_eq!(a.boxes, [[1.0, 2.0, 4.5, 4.0], [0.0, 0.0, 2.0, 2.0]]);
        assert_eq!(a.labels, [7, 3]);
        assert_eq!(a.crowd, [0, 1]);
        assert_eq!(a.masks.count, 2);
        assert!(a.masks.data[..48].contains(&1));
        assert!(a.masks.data[48..].iter().all(|&v| v == 0));
        let flat =
            br#"{"boxes": [[1, 2, 3.5, 2], [0, 0, 2, 2]], "labels": [7, 3], "iscrowd": [0, 1]}"#;
        let mut b = sample();
        attach_json(flat, false, &mut b, &BufferPool::new(0)).expect("flat form");
        assert_eq!(
            (&b.boxes, &b.labels, &b.crowd),
            (&a.boxes, &a.labels, &a.crowd)
        );
        assert_eq!(b.masks.count, 0);
        let xyxy = br#"{"boxes_xyxy": [[1, 2, 4.5, 4], [0, 0, 2, 2]], "labels": [7, 3]}"#;
        let mut c = sample();
        attach_json(xyxy, false, &mut c, &BufferPool::new(0)).expect("xyxy form");
        assert_eq!((&c.boxes, &c.labels), (&a.boxes, &a.labels));
    }

    #[test]
    fn categories_given_leave_out_the_others() {
        let json = br#"{"annotations": [{"bbox": [1, 2, 3, 2], "category_id": 7},
            {"bbox": [0, 0, 2, 2], "category_id": 3}], "categories": [{"id": 3, "name": "x"}]}"#;
        let mut a = sample();
        attach_json(json, false, &mut a, &BufferPool::new(0)).expect("read");
        assert_eq!(a.labels, [3]);
    }

    #[test]
    fn bad_json_is_a_reason_not_a_panic() {
        for (bytes, says) in [
            (&b"{not json"[..], "not JSON"),
            (b"[1, 2]", "not a JSON object"),
            (b"{}", "no \"annotations\""),
            (br#"{"boxes": [[1, 2, 3]], "labels": [1]}"#, "boxes are not"),
            (
                br#"{"boxes": [[1, 2, 3, 4]], "labels": [1, 2]}"#,
                "1 boxes, 2 labels",
            ),
            (
                br#"{"annotations": [{"bbox": "x"}]}"#,
                "malformed annotation",
            ),
            (br#"{"annotations": 3}"#, "not a list"),
        ] {
            let err =
                attach_json(bytes, true, &mut sample(), &BufferPool::new(0)).expect_err("bad");
            assert!(err.contains(says), "{err}");
        }
    }
}
