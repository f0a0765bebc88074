//! The joint operations, each on an image and its targets together, as torchvision v2's
//! functional calls compute them on a PIL image, `BoundingBoxes` (`f32`, XYXY) and `Mask`
//! (`u8`) tensors:
//!
//! - `resize`: the image with Pillow's bilinear filter (`src/resample`, bit for bit), masks with
//!   PyTorch's `nearest` (`src = min(floor(dst * (float)in / out), in - 1)` in `f32`), boxes
//!   times the `f32` ratios `[w'/w, h'/h, w'/w, h'/h]`;
//! - `crop`: the image and masks cut, boxes moved by `-[left, top]` and clamped to the new size;
//! - `pad`: the image filled per channel, masks with their own fill, boxes and keypoints moved
//!   by `[left, top]`, boxes clamped to the new size;
//! - colour calls on the `uint8` tensor (`src/augment`'s rendition) and `permute_channels`;
//! - `horizontal_flip`: pixels mirrored, boxes `[W - x1, y0, W - x0, y1]`, keypoints
//!   `W - 1 - x`;
//! - `sanitize`: `SanitizeBoundingBoxes(min_size=1, min_area=1)`, the objects dropped with their
//!   labels and masks.
//!
//! A resize followed by a crop inside the resized image is computed as one resample of the kept
//! outputs (the same samples: each output depends on its own taps only).

use crate::resample::{
    AxisPlan, Filter, HostImage, ImagePlan, Kernels, PassOrder, Resampling, Slot,
};

use super::{JointOp, Sample};

/// Applies `ops` in order to `sample`.
pub(crate) fn apply(sample: &mut Sample, ops: &[JointOp]) -> Result<(), String> {
    let mut i = 0;
    while i < ops.len() {
        match ops[i] {
            JointOp::Resize { height, width } => {
                let crop = match ops.get(i + 1) {
                    Some(&JointOp::Crop {
                        top,
                        left,
                        height: ch,
                        width: cw,
                    }) if top + ch <= height && left + cw <= width => {
                        i += 1;
                        Some((top, left, ch, cw))
                    }
                    _ => None,
                };
                resize(sample, height, width, crop)?;
            }
            JointOp::Crop {
                top,
                left,
                height,
                width,
            } => crop(sample, top, left, height, width)?,
            JointOp::Pad {
                left,
                top,
                right,
                bottom,
                fill,
                mask_fill,
            } => pad(sample, [left, top, right, bottom], fill, mask_fill),
            JointOp::Color(op) => {
                let (w, h) = (sample.width as usize, sample.height as usize);
                crate::augment::apply_ops(&[op], &mut sample.pixels, h, w)
                    .map_err(|e| e.to_string())?;
            }
            JointOp::PermuteChannels(p) => {
                for px in sample.pixels.chunks_exact_mut(3) {
                    let old = [px[0], px[1], px[2]];
                    for (c, &from) in p.iter().enumerate() {
                        px[c] = old[usize::from(from).min(2)];
                    }
                }
            }
            JointOp::IouCrop {
                top,
                left,
                height,
                width,
            } => {
                let inside = centres_inside(&sample.boxes, top, left, height, width);
                crop(sample, top, left, height, width)?;
                for (b, inside) in sample.boxes.iter_mut().zip(inside) {
                    if !inside {
                        *b = [0.0; 4];
                    }
                }
            }
            JointOp::HorizontalFlip => horizontal_flip(sample),
            JointOp::Sanitize => sanitize(sample),
        }
        i += 1;
    }
    Ok(())
}

/// Applies the calls of `ops` to the boxes, keypoints and size of `sample` only (its pixels and
/// masks are left as they are; `SanitizeBoundingBoxes` still drops the objects' planes): the
/// targets of [`apply`], for a sample whose pixels and masks are laid out afterwards
/// (`super::layout`).
pub(crate) fn apply_targets(sample: &mut Sample, ops: &[JointOp]) -> Result<(), String> {
    for op in ops {
        match *op {
            JointOp::Resize { height, width } => {
                if height == 0 || width == 0 {
                    return Err(format!(
                        "resize of {}x{} to {width}x{height}",
                        sample.width, sample.height
                    ));
                }
                if (width, height) != (sample.width, sample.height) {
                    resize_targets(sample, height, width);
                }
            }
            JointOp::Crop {
                top,
                left,
                height,
                width,
            } => {
                check_window(sample, top, left, height, width)?;
                crop_boxes(sample, top, left, height, width);
            }
            JointOp::IouCrop {
                top,
                left,
                height,
                width,
            } => {
                check_window(sample, top, left, height, width)?;
                let inside = centres_inside(&sample.boxes, top, left, height, width);
                crop_boxes(sample, top, left, height, width);
                for (b, inside) in sample.boxes.iter_mut().zip(inside) {
                    if !inside {
                        *b = [0.0; 4];
                    }
                }
            }
            JointOp::Pad {
                left,
                top,
                right,
                bottom,
                ..
            } => pad_targets(sample, [left, top, right, bottom]),
            JointOp::HorizontalFlip => flip_targets(sample),
            JointOp::Sanitize => sanitize(sample),
            JointOp::Color(_) | JointOp::PermuteChannels(_) => {}
        }
    }
    Ok(())
}

/// An error unless the window lies inside the sample.
fn check_window(
    sample: &Sample,
    top: u32,
    left: u32,
    height: u32,
    width: u32,
) -> Result<(), String> {
    if top + height > sample.height || left + width > sample.width {
        return Err(format!(
            "crop {width}x{height} at ({left}, {top}) outside {}x{}",
            sample.width, sample.height
        ));
    }
    Ok(())
}

/// `F.resize(.., [height, width])` of everything, then (fused) `F.crop(.., top, left, h, w)`.
fn resize(
    sample: &mut Sample,
    height: u32,
    width: u32,
    window: Option<(u32, u32, u32, u32)>,
) -> Result<(), String> {
    let (old_w, old_h) = (sample.width, sample.height);
    if height == 0 || width == 0 {
        return Err(format!("resize of {old_w}x{old_h} to {width}x{height}"));
    }
    let (top, left, ch, cw) = window.unwrap_or((0, 0, height, width));
    let keep = |src: u32, resized: u32, first: u32, len: u32| AxisPlan {
        src_len: src,
        resized,
        out_first: first,
        out_len: len,
        ..AxisPlan::default()
    };
    if (width, height) != (old_w, old_h) {
        let x = keep(old_w, width, left, cw);
        let y = keep(old_h, height, top, ch);
        let mut plan = ImagePlan::default();
        plan.plan(
            &x,
            &y,
            Resampling::Filter(Filter::Bilinear),
            PassOrder::default(),
        )
        .map_err(|e| e.to_string())?;
        let mut out = vec![0u8; cw as usize * ch as usize * 3];
        let mut scratch = Vec::new();
        let source = HostImage {
            pixels: &sample.pixels,
            width: old_w,
            height: old_h,
            channels: 3,
        };
        let mut slot = Slot {
            bytes: &mut out,
            width: cw,
            height: ch,
        };
        plan.resample_into(&source, 0, &mut slot, Kernels::detect(), &mut scratch)
            .map_err(|e| e.to_string())?;
        sample.pixels = out;
        let xs = nearest_indices(old_w, width, left, cw);
        let ys = nearest_indices(old_h, height, top, ch);
        for plane in [&mut sample.masks, &mut sample.semantic] {
            plane.data = resize_planes(&plane.data, plane.count, old_w, &xs, &ys);
        }
        resize_targets(sample, height, width);
        if window.is_some() {
            // The pixels and masks are cut already; the boxes follow.
            crop_boxes(sample, top, left, ch, cw);
        }
    } else if window.is_some() {
        crop(sample, top, left, ch, cw)?;
    }
    Ok(())
}

/// The boxes and keypoints of `F.resize(.., [height, width])`, times the `f32` ratios; the
/// sample takes the new size.
fn resize_targets(sample: &mut Sample, height: u32, width: u32) {
    let ratios = [
        (f64::from(width) / f64::from(sample.width)) as f32,
        (f64::from(height) / f64::from(sample.height)) as f32,
    ];
    for b in &mut sample.boxes {
        for (k, v) in b.iter_mut().enumerate() {
            *v *= ratios[k % 2];
        }
    }
    keypoints_map(sample, |x| x * ratios[0], |y| y * ratios[1]);
    sample.width = width;
    sample.height = height;
}

/// PyTorch's `nearest` source index of each kept output `first..first + len` of an axis of
/// `input` samples resized to `output` (`nearest_idx` of `UpSample.h`).
pub(crate) fn nearest_indices(input: u32, output: u32, first: u32, len: u32) -> Vec<u32> {
    (first..first + len)
        .map(|o| {
            if output == input {
                o
            } else if output == 2 * input {
                o >> 1
            } else {
                let scale = input as f32 / output as f32;
                ((o as f32 * scale).floor() as u32).min(input - 1)
            }
        })
        .collect()
}

/// `count` planes of `width` columns gathered at `xs` x `ys`.
fn resize_planes(data: &[u8], count: usize, width: u32, xs: &[u32], ys: &[u32]) -> Vec<u8> {
    let (w, plane) = (width as usize, data.len().checked_div(count).unwrap_or(0));
    let mut out = Vec::with_capacity(count * xs.len() * ys.len());
    for p in 0..count {
        let src = &data[p * plane..(p + 1) * plane];
        for &y in ys {
            let row = &src[y as usize * w..];
            out.extend(xs.iter().map(|&x| row[x as usize]));
        }
    }
    out
}

/// `F.crop(.., top, left, height, width)` of a window inside the image.
fn crop(sample: &mut Sample, top: u32, left: u32, height: u32, width: u32) -> Result<(), String> {
    if top + height > sample.height || left + width > sample.width {
        return Err(format!(
            "crop {width}x{height} at ({left}, {top}) outside {}x{}",
            sample.width, sample.height
        ));
    }
    let cut = |data: &[u8], count: usize, px: usize| {
        let (w, h) = (sample.width as usize, sample.height as usize);
        let mut out = Vec::with_capacity(count * width as usize * height as usize * px);
        for p in 0..count {
            for y in top as usize..(top + height) as usize {
                let row = (p * h + y) * w * px;
                out.extend_from_slice(
                    &data[row + left as usize * px..row + (left + width) as usize * px],
                );
            }
        }
        out
    };
    let pixels = cut(&sample.pixels, 1, 3);
    let masks = cut(&sample.masks.data, sample.masks.count, 1);
    let semantic = cut(&sample.semantic.data, sample.semantic.count, 1);
    sample.pixels = pixels;
    sample.masks.data = masks;
    sample.semantic.data = semantic;
    crop_boxes(sample, top, left, height, width);
    Ok(())
}

/// The boxes of a crop: moved, clamped to the new size; the sample takes the new size.
fn crop_boxes(sample: &mut Sample, top: u32, left: u32, height: u32, width: u32) {
    let (l, t) = (left as f32, top as f32);
    for b in &mut sample.boxes {
        *b = [b[0] - l, b[1] - t, b[2] - l, b[3] - t];
    }
    keypoints_map(sample, |x| x - l, |y| y - t);
    sample.width = width;
    sample.height = height;
    clamp_boxes(sample);
}

/// `clamp_bounding_boxes` of XYXY boxes.
fn clamp_boxes(sample: &mut Sample) {
    let (w, h) = (sample.width as f32, sample.height as f32);
    for b in &mut sample.boxes {
        b[0] = b[0].clamp(0.0, w);
        b[2] = b[2].clamp(0.0, w);
        b[1] = b[1].clamp(0.0, h);
        b[3] = b[3].clamp(0.0, h);
    }
}

/// `F.pad(.., [left, top, right, bottom])`: the image with `fill`, instance masks with 0, the
/// semantic mask with `mask_fill`; boxes and keypoints moved by `[left, top]`, boxes clamped.
fn pad(sample: &mut Sample, [left, top, right, bottom]: [u32; 4], fill: [u8; 3], mask_fill: u8) {
    let (w, h) = (sample.width as usize, sample.height as usize);
    let (l, t) = (left as usize, top as usize);
    let (nw, nh) = (w + l + right as usize, h + t + bottom as usize);
    let grow = |data: &[u8], count: usize, px: usize, fill: &[u8]| {
        let mut out = Vec::with_capacity(count * nw * nh * px);
        let run: Vec<u8> = fill.iter().copied().cycle().take(nw * px).collect();
        let fill_run = |out: &mut Vec<u8>, n: usize| out.extend_from_slice(&run[..n * px]);
        for p in 0..count {
            for y in 0..nh {
                if (t..t + h).contains(&y) {
                    let row = (p * h + y - t) * w * px;
                    fill_run(&mut out, l);
                    out.extend_from_slice(&data[row..row + w * px]);
                    fill_run(&mut out, nw - l - w);
                } else {
                    fill_run(&mut out, nw);
                }
            }
        }
        out
    };
    sample.pixels = grow(&sample.pixels, 1, 3, &fill);
    sample.masks.data = grow(&sample.masks.data, sample.masks.count, 1, &[0]);
    sample.semantic.data = grow(
        &sample.semantic.data,
        sample.semantic.count,
        1,
        &[mask_fill],
    );
    pad_targets(sample, [left, top, right, bottom]);
}

/// The boxes and keypoints of `F.pad(.., [left, top, right, bottom])`: moved, boxes clamped;
/// the sample takes the new size.
fn pad_targets(sample: &mut Sample, [left, top, right, bottom]: [u32; 4]) {
    sample.width += left + right;
    sample.height += top + bottom;
    let (lf, tf) = (left as f32, top as f32);
    for b in &mut sample.boxes {
        *b = [b[0] + lf, b[1] + tf, b[2] + lf, b[3] + tf];
    }
    keypoints_map(sample, |x| x + lf, |y| y + tf);
    clamp_boxes(sample);
}

/// `RandomIoUCrop`'s `is_within_crop_area`: `left < cx < right` and `top < cy < bottom`, the
/// centre `0.5 * (x0 + x1)` in `f32`.
pub(crate) fn centres_inside(
    boxes: &[[f32; 4]],
    top: u32,
    left: u32,
    height: u32,
    width: u32,
) -> Vec<bool> {
    let (l, t) = (left as f32, top as f32);
    let (r, b) = ((left + width) as f32, (top + height) as f32);
    boxes
        .iter()
        .map(|bx| {
            let cx = 0.5 * (bx[0] + bx[2]);
            let cy = 0.5 * (bx[1] + bx[3]);
            l < cx && cx < r && t < cy && cy < b
        })
        .collect()
}

/// `F.horizontal_flip` of everything.
fn horizontal_flip(sample: &mut Sample) {
    let w = sample.width as usize;
    for row in sample.pixels.chunks_exact_mut(w * 3) {
        for x in 0..w / 2 {
            let (a, b) = (x * 3, (w - 1 - x) * 3);
            for c in 0..3 {
                row.swap(a + c, b + c);
            }
        }
    }
    for plane in [&mut sample.masks, &mut sample.semantic] {
        for row in plane.data.chunks_exact_mut(w.max(1)) {
            row.reverse();
        }
    }
    flip_targets(sample);
}

/// The boxes and keypoints of `F.horizontal_flip`.
fn flip_targets(sample: &mut Sample) {
    let fw = sample.width as f32;
    for b in &mut sample.boxes {
        *b = [-(b[2] - fw), b[1], -(b[0] - fw), b[3]];
    }
    // `horizontal_flip_keypoints`: `-(x - (W - 1))`.
    let last = (sample.width as i64 - 1) as f32;
    keypoints_map(sample, |x| -(x - last), |y| y);
}

/// Maps every keypoint's x and y (`[x, y, visibility]` triples; the visibility kept), as
/// torchvision's `KeyPoints` kernels do (`f32`, unclamped).
fn keypoints_map(sample: &mut Sample, fx: impl Fn(f32) -> f32, fy: impl Fn(f32) -> f32) {
    for k in &mut sample.keypoints {
        for p in k.chunks_exact_mut(3) {
            p[0] = fx(p[0]);
            p[1] = fy(p[1]);
        }
    }
}

/// `SanitizeBoundingBoxes()`: keeps the objects whose box is at least 1 x 1 pixel, of area at
/// least 1, with no negative coordinate and inside the image.
fn sanitize(sample: &mut Sample) {
    let (w, h) = (sample.width as f32, sample.height as f32);
    let keep: Vec<bool> = sample
        .boxes
        .iter()
        .map(|b| {
            let (bw, bh) = (b[2] - b[0], b[3] - b[1]);
            bw >= 1.0
                && bh >= 1.0
                && b.iter().all(|&v| v >= 0.0)
                && bw * bh >= 1.0
                && b[0] <= w
                && b[2] <= w
                && b[1] <= h
                && b[3] <= h
        })
        .collect();
    sample.retain(&keep);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::targets::Planes;

    fn sample(w: u32, h: u32) -> Sample {
        Sample {
            width: w,
            height: h,
            pixels: (0..w * h * 3).map(|v| v as u8).collect(),
            boxes: vec![[1.0, 1.0, 3.0, 2.0], [0.0, 0.0, 0.5, 0.5]],
            labels: vec![1, 2],
            crowd: vec![0, 0],
            masks: Planes {
                count: 2,
                data: (0..2 * w * h).map(|v| (v % 7) as u8).collect(),
            },
            semantic: Planes::default(),
            ..Sample::default()
        }
    }

    #[test]
    fn flip_twice_is_the_identity() {
        let s = sample(5, 3);
        let mut t = s.clone();
        apply(&mut t, &[JointOp::HorizontalFlip, JointOp::HorizontalFlip]).unwrap();
        assert_eq!(s, t);
        apply(&mut t, &[JointOp::HorizontalFlip]).unwrap();
        assert_eq!(t.boxes[0], [2.0, 1.0, 4.0, 2.0]);
    }

    #[test]
    fn fused_resize_and_crop_equals_the_two_steps() {
        let s = sample(9, 7);
        let (mut a, mut b) = (s.clone(), s);
        let crop = JointOp::Crop {
            top: 2,
            left: 3,
            height: 5,
            width: 6,
        };
        apply(
            &mut a,
            &[
                JointOp::Resize {
                    height: 11,
                    width: 13,
                },
                crop,
            ],
        )
        .unwrap();
        apply(
            &mut b,
            &[JointOp::Resize {
                height: 11,
                width: 13,
            }],
        )
        .unwrap();
        apply(&mut b, &[crop]).unwrap();
        assert_eq!(a, b);
    }

    #[test]
    fn pad_then_sanitize_drops_small_boxes() {
        let mut s = sample(4, 4);
        apply(
            &mut s,
            &[
                JointOp::Pad {
                    left: 0,
                    top: 0,
                    right: 2,
                    bottom: 1,
                    fill: [1, 2, 3],
                    mask_fill: 255,
                },
                JointOp::Sanitize,
            ],
        )
        .unwrap();
        assert_eq!((s.width, s.height), (6, 5));
        assert_eq!(s.labels, vec![1]);
        assert_eq!(s.masks.count, 1);
        assert_eq!(s.masks.data.len(), 30);
        assert_eq!(&s.pixels[s.pixels.len() - 3..], &[1, 2, 3]);
    }

    #[test]
    fn nearest_follows_pytorch() {
        assert_eq!(nearest_indices(4, 8, 0, 8), vec![0, 0, 1, 1, 2, 2, 3, 3]);
        assert_eq!(nearest_indices(5, 3, 0, 3), vec![0, 1, 3]);
    }
}
