//! torchvision's colour calls on a PIL image, with the arithmetic that runs them: Pillow's
//! `Image.blend` (float32, truncated) behind `ImageEnhance`, its `convert("L")` (ITU-R 601-2
//! in 16-bit fixed point, rounded), its HSV conversion (`Convert.c`'s `rgb2hsv` and `hsv2rgb`,
//! their float and double steps as C evaluates them), `ImageOps.solarize`, and torchvision's
//! Gaussian blur (the PIL image made a float32 tensor, convolved with the 2-D kernel, reflect
//! padding, rounded half to even).
//!
//! Images are packed RGB8, row after row (HWC).

use super::ViewOp;
use crate::error::{Error, Result};

/// Pillow's `convert("L")` of one pixel: `(r * 19595 + g * 38470 + b * 7471 + 0x8000) >> 16`.
fn luma(px: &[u8]) -> u8 {
    let l = u32::from(px[0]) * 19595 + u32::from(px[1]) * 38470 + u32::from(px[2]) * 7471;
    ((l + 0x8000) >> 16) as u8
}

/// `ImagingBlend(degenerate, image, alpha)` of one sample: `in1 + alpha * (in2 - in1)` in
/// float32, truncated; clipped to 0..255 when `alpha` is outside 0..1.
fn blend(degenerate: u8, sample: u8, alpha: f32) -> u8 {
    let t = f32::from(degenerate) + alpha * (i32::from(sample) - i32::from(degenerate)) as f32;
    if (0.0..=1.0).contains(&alpha) {
        t as u8
    } else if t <= 0.0 {
        0
    } else if t >= 255.0 {
        255
    } else {
        t as u8
    }
}

/// `ImageEnhance.Contrast`'s grey level: the mean of `convert("L")` as `ImageStat` computes it
/// (a float64 sum over the histogram divided by the count), `int(mean + 0.5)`.
fn contrast_mean(img: &[u8]) -> u8 {
    let mut hist = [0u64; 256];
    for px in img.chunks_exact(3) {
        hist[luma(px) as usize] += 1;
    }
    let n: u64 = hist.iter().sum();
    if n == 0 {
        return 0;
    }
    let sum: f64 = hist
        .iter()
        .enumerate()
        .map(|(i, &c)| i as f64 * c as f64)
        .sum();
    (sum / n as f64 + 0.5) as u8
}

/// `Convert.c`'s `rgb2hsv_row`: `h` and `s` in float, the steps with a double constant in
/// double, truncated to 0..255.
fn rgb_to_hsv(px: [u8; 3]) -> [u8; 3] {
    let [r, g, b] = px;
    let maxc = r.max(g).max(b);
    let minc = r.min(g).min(b);
    if maxc == minc {
        return [0, 0, maxc];
    }
    let cr = f32::from(maxc - minc);
    let s = cr / f32::from(maxc);
    let rc = f32::from(maxc - r) / cr;
    let gc = f32::from(maxc - g) / cr;
    let bc = f32::from(maxc - b) / cr;
    let h: f32 = if r == maxc {
        bc - gc
    } else if g == maxc {
        (2.0 + f64::from(rc) - f64::from(bc)) as f32
    } else {
        (4.0 + f64::from(gc) - f64::from(rc)) as f32
    };
    let h = ((f64::from(h) / 6.0 + 1.0) % 1.0) as f32;
    let clip = |v: f64| (v as i32).clamp(0, 255) as u8;
    [clip(f64::from(h) * 255.0), clip(f64::from(s) * 255.0), maxc]
}

/// `Convert.c`'s `hsv2rgb`: the sector and its remainder in double (stored as float), C's
/// `round` (halves away from zero).
fn hsv_to_rgb(hsv: [u8; 3]) -> [u8; 3] {
    let [h, s, v] = hsv;
    if s == 0 {
        return [v, v, v];
    }
    let hd = f64::from(f32::from(h)) * 6.0 / 255.0;
    let i = hd.floor() as i32;
    let f = (hd - f64::from(i as f32)) as f32;
    let fs = (f64::from(f32::from(s)) / 255.0) as f32;
    let vf = f64::from(f32::from(v));
    let clip = |x: f64| (x.round() as i32).clamp(0, 255) as u8;
    let p = clip(vf * (1.0 - f64::from(fs)));
    let q = clip(vf * (1.0 - f64::from(fs * f)));
    let t = clip(vf * (1.0 - f64::from(fs) * (1.0 - f64::from(f))));
    match i % 6 {
        0 => [v, t, p],
        1 => [q, v, p],
        2 => [p, v, t],
        3 => [p, q, v],
        4 => [t, p, v],
        _ => [v, p, q],
    }
}

/// `F.adjust_hue` on a PIL image: the image to HSV, `uint8(factor * 255)` added to the hue
/// (truncated toward zero, wrapping), back to RGB.
fn hue(img: &mut [u8], factor: f32) {
    let shift = (f64::from(factor) * 255.0) as i32 as u8;
    for px in img.chunks_exact_mut(3) {
        let [h, s, v] = rgb_to_hsv([px[0], px[1], px[2]]);
        px.copy_from_slice(&hsv_to_rgb([h.wrapping_add(shift), s, v]));
    }
}

/// torchvision's `_get_gaussian_kernel1d` in float32: `exp(-0.5 * (x / sigma)^2)` at
/// `linspace(-(k - 1) / 2, (k - 1) / 2, k)`, divided by its sum.
pub(crate) fn gaussian_kernel(kernel_size: usize, sigma: f32) -> Vec<f32> {
    let half = (kernel_size as f32 - 1.0) * 0.5;
    let pdf: Vec<f32> = (0..kernel_size)
        .map(|i| {
            let x = -half + i as f32;
            let z = x / sigma;
            (-0.5f32 * (z * z)).exp()
        })
        .collect();
    let sum: f32 = pdf.iter().sum();
    pdf.iter().map(|p| p / sum).collect()
}

/// torch's `reflect` padding of index `i` into `0..n` (the edge not repeated).
fn reflect(i: isize, n: usize) -> usize {
    let n = n as isize;
    let mut i = i;
    if i < 0 {
        i = -i;
    }
    if i >= n {
        i = 2 * (n - 1) - i;
    }
    i.clamp(0, n - 1) as usize
}

/// torchvision's `gaussian_blur` of a `uint8` image: the 2-D kernel (the float32 outer
/// product of the 1-D one) over the reflect-padded image, each output rounded half to even.
/// The sums are taken in float64 (PyTorch's convolution sums float32 in an order of its own:
/// an output within about 1e-4 of a half may round the other way there). The kernel is
/// symmetric, exactly (its taps at `x` and `-x` are the same float32), so the samples its equal
/// taps weigh are added first and multiplied once: a quarter of the products. Each channel is
/// padded once, and each tap runs along whole rows.
fn blur(img: &mut [u8], height: usize, width: usize, kernel_size: usize, sigma: f32) {
    let k1 = gaussian_kernel(kernel_size, sigma);
    let k = kernel_size;
    let weight = |i: usize, j: usize| f64::from(k1[i] * k1[j]);
    let half = (k / 2) as isize;
    let pw = width + k - 1;
    let ph = height + k - 1;
    let mut padded = vec![0f64; pw * ph];
    let mut rows = vec![0f64; pw];
    let mut acc = vec![0f64; width];
    for c in 0..3 {
        for (py, line) in padded.chunks_exact_mut(pw).enumerate() {
            let y = reflect(py as isize - half, height);
            for (px, v) in line.iter_mut().enumerate() {
                let x = reflect(px as isize - half, width);
                *v = f64::from(img[(y * width + x) * 3 + c]);
            }
        }
        for y in 0..height {
            acc.fill(0.0);
            for i in 0..=k / 2 {
                let (top, bottom) = (y + i, y + k - 1 - i);
                let a = &padded[top * pw..(top + 1) * pw];
                if top == bottom {
                    rows.copy_from_slice(a);
                } else {
                    let b = &padded[bottom * pw..(bottom + 1) * pw];
                    for ((r, &a), &b) in rows.iter_mut().zip(a).zip(b) {
                        *r = a + b;
                    }
                }
                for j in 0..=k / 2 {
                    let w = weight(i, j);
                    let (l, r) = (j, k - 1 - j);
                    if l == r {
                        for (a, &v) in acc.iter_mut().zip(&rows[l..l + width]) {
                            *a += w * v;
                        }
                    } else {
                        let left = &rows[l..l + width];
                        let right = &rows[r..r + width];
                        for ((a, &u), &v) in acc.iter_mut().zip(left).zip(right) {
                            *a += w * (u + v);
                        }
                    }
                }
            }
            for (x, a) in acc.iter().enumerate() {
                img[(y * width + x) * 3 + c] = a.round_ties_even().clamp(0.0, 255.0) as u8;
            }
        }
    }
}

/// Applies a view's calls (`ops`, in order) to its pixels (`height` x `width` packed RGB8) as
/// torchvision applies them to a PIL image: what the CPU rendition of views runs, and what a
/// user holding `u8` pixels calls to reproduce a view from its drawn parameters.
pub fn apply_view_ops(
    ops: &[ViewOp],
    pixels: &mut [u8],
    height: usize,
    width: usize,
) -> Result<()> {
    let n = height * width * 3;
    let Some(img) = pixels.get_mut(..n) else {
        return Err(Error::Mismatch(format!(
            "{} bytes hold no {width}x{height} RGB image",
            pixels.len()
        )));
    };
    for op in ops {
        match *op {
            ViewOp::Brightness(f) => img.iter_mut().for_each(|v| *v = blend(0, *v, f)),
            ViewOp::Contrast(f) => {
                let mean = contrast_mean(img);
                img.iter_mut().for_each(|v| *v = blend(mean, *v, f));
            }
            ViewOp::Saturation(f) => {
                for px in img.chunks_exact_mut(3) {
                    let l = luma(px);
                    px.iter_mut().for_each(|v| *v = blend(l, *v, f));
                }
            }
            ViewOp::Hue(f) => hue(img, f),
            ViewOp::Grayscale => {
                for px in img.chunks_exact_mut(3) {
                    let l = luma(px);
                    px.fill(l);
                }
            }
            ViewOp::Blur { kernel_size, sigma } => {
                let k = kernel_size as usize;
                if k / 2 >= height.min(width) {
                    return Err(Error::Mismatch(format!(
                        "a {width}x{height} view is too small for a blur kernel of {k}"
                    )));
                }
                blur(img, height, width, k, sigma);
            }
            ViewOp::Solarize(t) => img
                .iter_mut()
                .filter(|v| **v >= t)
                .for_each(|v| *v = 255 - *v),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hsv_round_trip_is_pillows() {
        // Pillow 13: Image.new("RGB", (1, 1), c).convert("HSV").getpixel((0, 0)) and back.
        assert_eq!(rgb_to_hsv([255, 0, 0]), [0, 255, 255]);
        assert_eq!(rgb_to_hsv([0, 255, 0]), [85, 255, 255]);
        assert_eq!(rgb_to_hsv([0, 0, 255]), [170, 255, 255]);
        assert_eq!(rgb_to_hsv([7, 7, 7]), [0, 0, 7]);
        assert_eq!(hsv_to_rgb([0, 255, 255]), [255, 0, 0]);
        assert_eq!(hsv_to_rgb([0, 0, 9]), [9, 9, 9]);
    }

    #[test]
    fn blend_truncates_and_clips() {
        assert_eq!(blend(0, 200, 0.5), 100);
        assert_eq!(blend(0, 201, 0.5), 100);
        assert_eq!(blend(0, 200, 1.4), 255);
        assert_eq!(blend(100, 0, 1.5), 0);
        assert_eq!(blend(100, 150, 1.5), 175);
        assert_eq!(luma(&[255, 255, 255]), 255);
        assert_eq!(luma(&[255, 0, 0]), 76);
    }

    #[test]
    fn a_blur_keeps_a_flat_image_and_sums_to_one() {
        let k = gaussian_kernel(9, 0.7);
        let s: f32 = k.iter().sum();
        assert!((s - 1.0).abs() < 1e-6);
        let mut img = vec![77u8; 16 * 12 * 3];
        blur(&mut img, 12, 16, 9, 1.3);
        assert!(img.iter().all(|&v| v == 77));
        assert_eq!(reflect(-1, 5), 1);
        assert_eq!(reflect(5, 5), 3);
    }
}
