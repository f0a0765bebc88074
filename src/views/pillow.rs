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
/// float32, truncated; clipped to 0..255 when `alpha` is outside 0..1 (within it the value lies
/// between the two samples). Clamped first, then truncated (a NaN factor gives 0, as a
/// conversion of a NaN does).
#[inline(always)]
fn blend(degenerate: u8, sample: u8, alpha: f32) -> u8 {
    let t = f32::from(degenerate) + alpha * (i32::from(sample) - i32::from(degenerate)) as f32;
    t.clamp(0.0, 255.0) as i32 as u8
}

/// `ImageEnhance.Contrast`'s grey level: the mean of `convert("L")` as `ImageStat` computes it
/// (a float64 sum over the histogram divided by the count), `int(mean + 0.5)`. Each term of that
/// sum, and each partial sum, is a whole number far below 2^53, so the float64 sum is the
/// integer sum of the grey levels exactly, whatever the order: that is what is added here.
fn contrast_mean(img: &[u8]) -> u8 {
    let n = (img.len() / 3) as u64;
    if n == 0 {
        return 0;
    }
    let sum: u64 = img.chunks_exact(3).map(|px| u64::from(luma(px))).sum();
    (sum as f64 / n as f64 + 0.5) as u8
}

/// `Convert.c`'s `rgb2hsv_row`: `h` and `s` in float, the steps with a double constant in
/// double, truncated to 0..255. Its `fmod(h / 6.0 + 1.0, 1.0)` is the subtraction it equals
/// there ([`unit_fraction`]).
fn rgb_to_hsv(px: [u8; 3]) -> [u8; 3] {
    rgb_to_hsv_with(px, unit_fraction)
}

/// `fmod(x, 1.0)` of `x = h / 6 + 1`: `h` lies in [-1, 5], so `x` in [5/6, 11/6], where it is
/// `x - 1` from 1 on (exact) and `x` below; C's `fmod` for anything else.
#[inline(always)]
fn unit_fraction(x: f64) -> f64 {
    if (1.0..2.0).contains(&x) {
        x - 1.0
    } else if (0.0..1.0).contains(&x) {
        x
    } else {
        x % 1.0
    }
}

/// [`rgb_to_hsv`] with `fraction` for its `fmod(x, 1.0)`.
#[inline(always)]
fn rgb_to_hsv_with(px: [u8; 3], fraction: impl Fn(f64) -> f64) -> [u8; 3] {
    let [r, g, b] = px;
    let maxc = r.max(g).max(b);
    let minc = r.min(g).min(b);
    if maxc == minc {
        return [0, 0, maxc];
    }
    let cr = f32::from(maxc - minc);
    let s = cr / f32::from(maxc);
    let part = |c: u8| f32::from(maxc - c) / cr;
    let h: f32 = if r == maxc {
        part(b) - part(g)
    } else if g == maxc {
        (2.0 + f64::from(part(r)) - f64::from(part(b))) as f32
    } else {
        (4.0 + f64::from(part(g)) - f64::from(part(r))) as f32
    };
    let h = fraction(f64::from(h) / 6.0 + 1.0) as f32;
    let clip = |v: f64| (v as i32).clamp(0, 255) as u8;
    [clip(f64::from(h) * 255.0), clip(f64::from(s) * 255.0), maxc]
}

/// C's `round` (halves away from zero) of `x`, clipped to 0..255, without a call: the
/// truncation and the remainder it leaves are exact for such values.
fn round_clip(x: f64) -> u8 {
    if x.is_nan() || x <= 0.0 {
        return 0;
    }
    if x >= 255.0 {
        return 255;
    }
    let whole = x as u32;
    (whole + u32::from(x - f64::from(whole) >= 0.5)) as u8
}

/// `Convert.c`'s `hsv2rgb` steps that depend on one byte alone, for each byte: the sector of
/// a hue `h` (`floor(h * 6.0 / 255.0)` in double, taken as the truncation of a value at least 0)
/// and its remainder (in double, stored as float), and a saturation's `s / 255.0` (stored as
/// float).
struct HsvSteps {
    sector: [u8; 256],
    remainder: [f32; 256],
    saturation: [f32; 256],
}

impl HsvSteps {
    fn new() -> HsvSteps {
        let mut steps = HsvSteps {
            sector: [0; 256],
            remainder: [0.0; 256],
            saturation: [0.0; 256],
        };
        for e in 0..256 {
            let hd = f64::from(e as f32) * 6.0 / 255.0;
            let i = hd as i32;
            steps.sector[e] = (i % 6) as u8;
            steps.remainder[e] = (hd - f64::from(i as f32)) as f32;
            steps.saturation[e] = (f64::from(e as f32) / 255.0) as f32;
        }
        steps
    }

    /// `Convert.c`'s `hsv2rgb` of one pixel: C's `round` (halves away from zero).
    fn rgb(&self, hsv: [u8; 3]) -> [u8; 3] {
        let [h, s, v] = hsv;
        if s == 0 {
            return [v, v, v];
        }
        let f = self.remainder[usize::from(h)];
        let fs = self.saturation[usize::from(s)];
        let vf = f64::from(f32::from(v));
        let p = round_clip(vf * (1.0 - f64::from(fs)));
        let q = round_clip(vf * (1.0 - f64::from(fs * f)));
        let t = round_clip(vf * (1.0 - f64::from(fs) * (1.0 - f64::from(f))));
        match self.sector[usize::from(h)] {
            0 => [v, t, p],
            1 => [q, v, p],
            2 => [p, v, t],
            3 => [p, q, v],
            4 => [t, p, v],
            _ => [v, p, q],
        }
    }
}

/// `F.adjust_hue` on a PIL image: the image to HSV, `uint8(factor * 255)` added to the hue
/// (truncated toward zero, wrapping), back to RGB. Eight pixels a step with AVX2
/// ([`super::colour_avx2`], the same arithmetic), the rest one by one.
fn hue(img: &mut [u8], factor: f32) {
    let shift = (f64::from(factor) * 255.0) as i32 as u8;
    let mut rest: &mut [u8] = img;
    #[cfg(target_arch = "x86_64")]
    if super::colour_avx2::available() {
        let mut steps = rest.chunks_exact_mut(3 * super::colour_avx2::STEP);
        for step in &mut steps {
            if let Ok(step) = <&mut [u8; 3 * super::colour_avx2::STEP]>::try_from(step) {
                // SAFETY: the CPU has AVX2 (`available` above).
                #[allow(unsafe_code)]
                unsafe {
                    super::colour_avx2::hue_step(step, shift)
                };
            }
        }
        rest = steps.into_remainder();
    }
    if rest.len() < 3 {
        return;
    }
    let steps = HsvSteps::new();
    for px in rest.chunks_exact_mut(3) {
        let [h, s, v] = rgb_to_hsv([px[0], px[1], px[2]]);
        px.copy_from_slice(&steps.rgb([h.wrapping_add(shift), s, v]));
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
/// taps weigh are added first and multiplied once: a quarter of the products. Each output's sum
/// runs over the kernel's rows `i`, then its columns `j` (the GPU's order too); the samples of
/// a row, all three channels, are summed side by side ([`blur_row_with`]); on CPUs with AVX2 the
/// whole blur is compiled for it, four samples a register.
fn blur(img: &mut [u8], height: usize, width: usize, kernel_size: usize, sigma: f32) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked just above); the function is safe Rust compiled
        // with it.
        #[allow(unsafe_code)]
        unsafe {
            blur_avx2(img, height, width, kernel_size, sigma)
        };
        return;
    }
    blur_with(img, height, width, kernel_size, sigma);
}

/// [`blur_with`] compiled for AVX2 (no fused multiply-adds: Rust rounds the product and the
/// sum apart).
///
/// # Safety
/// The CPU has AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[allow(unsafe_code)]
unsafe fn blur_avx2(img: &mut [u8], height: usize, width: usize, kernel_size: usize, sigma: f32) {
    blur_with(img, height, width, kernel_size, sigma);
}

#[inline(always)]
fn blur_with(img: &mut [u8], height: usize, width: usize, kernel_size: usize, sigma: f32) {
    let k = kernel_size;
    let taps = k / 2 + 1;
    let k1 = gaussian_kernel(k, sigma);
    let weights: Vec<f64> = (0..taps * taps)
        .map(|n| f64::from(k1[n / taps] * k1[n % taps]))
        .collect();
    let half = (k / 2) as isize;
    // Samples of a padded row, and padded rows.
    let pw = (width + k - 1) * 3;
    let ph = height + k - 1;
    let mut padded = vec![0f64; pw * ph];
    let left = k / 2;
    for (py, line) in padded.chunks_exact_mut(pw).enumerate() {
        let y = reflect(py as isize - half, height);
        let row = &img[y * width * 3..(y + 1) * width * 3];
        // The row itself in the middle, its reflections on either side.
        for (v, &s) in line[left * 3..(left + width) * 3].iter_mut().zip(row) {
            *v = f64::from(s);
        }
        for px in (0..left).chain(left + width..width + k - 1) {
            let x = reflect(px as isize - half, width);
            for (v, &s) in line[px * 3..px * 3 + 3]
                .iter_mut()
                .zip(&row[x * 3..x * 3 + 3])
            {
                *v = f64::from(s);
            }
        }
    }
    // Row i of a pass: the padded rows the kernel's rows i and k - 1 - i weigh, added.
    let mut pairs = vec![0f64; taps * pw];
    let mut sums = vec![0f64; width * 3];
    for y in 0..height {
        for (i, pair) in pairs.chunks_exact_mut(pw).enumerate() {
            let (top, bottom) = (y + i, y + k - 1 - i);
            let a = &padded[top * pw..(top + 1) * pw];
            if top == bottom {
                pair.copy_from_slice(a);
            } else {
                let b = &padded[bottom * pw..(bottom + 1) * pw];
                for ((p, &a), &b) in pair.iter_mut().zip(a).zip(b) {
                    *p = a + b;
                }
            }
        }
        blur_row_with(&pairs, pw, k, &weights, &mut sums);
        let out = &mut img[y * width * 3..(y + 1) * width * 3];
        for (o, &sum) in out.iter_mut().zip(&sums) {
            *o = round_half_even_clip(sum);
        }
    }
}

/// A blurred row's sums: sample o (pixel x, channel c: `o = 3x + c`) is, over the kernel's rows
/// `i` then its columns `j`, `w(i, j) * (pairs[i][o + 3j] + pairs[i][o + 3(k - 1 - j)])` added
/// to a float64 that starts at 0 (the middle column once). Eight samples at a time, each its
/// own sum, so that the compiler keeps them in vector registers; on CPUs with AVX2 four a
/// register.
#[inline(always)]
fn blur_row_with(pairs: &[f64], pw: usize, k: usize, weights: &[f64], sums: &mut [f64]) {
    const LANES: usize = 8;
    let taps = k / 2 + 1;
    let samples = sums.len();
    let mut o = 0;
    while o + LANES <= samples {
        let mut acc = [0f64; LANES];
        for (i, pair) in pairs.chunks_exact(pw).enumerate() {
            for j in 0..taps {
                let w = weights[i * taps + j];
                let (l, r) = (o + 3 * j, o + 3 * (k - 1 - j));
                let left = &pair[l..l + LANES];
                if l == r {
                    for (a, &u) in acc.iter_mut().zip(left) {
                        *a += w * u;
                    }
                } else {
                    let right = &pair[r..r + LANES];
                    for ((a, &u), &v) in acc.iter_mut().zip(left).zip(right) {
                        *a += w * (u + v);
                    }
                }
            }
        }
        sums[o..o + LANES].copy_from_slice(&acc);
        o += LANES;
    }
    for (o, sum) in sums.iter_mut().enumerate().skip(o) {
        let mut acc = 0f64;
        for (i, pair) in pairs.chunks_exact(pw).enumerate() {
            for j in 0..taps {
                let w = weights[i * taps + j];
                let (l, r) = (o + 3 * j, o + 3 * (k - 1 - j));
                acc += if l == r {
                    w * pair[l]
                } else {
                    w * (pair[l] + pair[r])
                };
            }
        }
        *sum = acc;
    }
}

/// `round` half to even of a blurred sum, clipped to 0..255, without a call: 2^52 added and
/// taken away rounds a value in 0..2^51 to a whole number, ties to even, in IEEE arithmetic.
fn round_half_even_clip(sum: f64) -> u8 {
    const WHOLE: f64 = 4_503_599_627_370_496.0;
    let v = sum.clamp(0.0, 255.0);
    ((v + WHOLE) - WHOLE) as u8
}

/// A call that maps each pixel alone.
#[derive(Clone, Copy)]
enum Point {
    /// Every sample blended with this grey level by this factor (brightness, contrast).
    Blend(u8, f32),
    /// Each pixel's samples blended with its own grey level (`ImageEnhance.Color`).
    Saturation(f32),
    /// Each pixel its grey level.
    Grayscale,
    /// Samples at or above the threshold inverted.
    Solarize(u8),
}

/// Pixels of a run of [`point`]'s blends: their grey levels are gathered, three times each,
/// then the run's samples blended.
const RUN: usize = 32;

/// Applies `call` to every pixel of `img`.
fn point(img: &mut [u8], call: Point) {
    match call {
        Point::Blend(grey, f) => {
            let greys = [grey; 3 * RUN];
            for run in img.chunks_mut(3 * RUN) {
                blend_samples(run, &greys, f);
            }
        }
        Point::Saturation(f) => {
            let mut greys = [0u8; 3 * RUN];
            for run in img.chunks_mut(3 * RUN) {
                for (g, px) in greys.chunks_exact_mut(3).zip(run.chunks_exact(3)) {
                    g.fill(luma(px));
                }
                blend_samples(run, &greys, f);
            }
        }
        Point::Grayscale => {
            for px in img.chunks_exact_mut(3) {
                let l = luma(px);
                px.fill(l);
            }
        }
        Point::Solarize(t) => img
            .iter_mut()
            .for_each(|v| *v = if *v >= t { 255 - *v } else { *v }),
    }
}

/// [`blend`] of each sample toward its grey level (`greys`, at least as many): 32 a step with
/// AVX2 ([`super::colour_avx2::blend_step`], the same arithmetic), the rest one by one.
fn blend_samples(samples: &mut [u8], greys: &[u8], alpha: f32) {
    #[allow(unused_mut)]
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if super::colour_avx2::available() {
        const STEP: usize = super::colour_avx2::BLEND_STEP;
        for (s, g) in samples.chunks_exact_mut(STEP).zip(greys.chunks_exact(STEP)) {
            if let (Ok(s), Ok(g)) = (<&mut [u8; STEP]>::try_from(s), <&[u8; STEP]>::try_from(g)) {
                // SAFETY: the CPU has AVX2 (`available` above).
                #[allow(unsafe_code)]
                unsafe {
                    super::colour_avx2::blend_step(s, g, alpha)
                };
                done += STEP;
            }
        }
    }
    for (v, &g) in samples.iter_mut().zip(greys).skip(done) {
        *v = blend(g, *v, alpha);
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
            ViewOp::Brightness(f) => point(img, Point::Blend(0, f)),
            ViewOp::Contrast(f) => point(img, Point::Blend(contrast_mean(img), f)),
            ViewOp::Saturation(f) => point(img, Point::Saturation(f)),
            ViewOp::Hue(f) => hue(img, f),
            ViewOp::Grayscale => point(img, Point::Grayscale),
            ViewOp::Blur { kernel_size, sigma } => {
                let k = kernel_size as usize;
                if k == 0 || k / 2 >= height.min(width) {
                    return Err(Error::Mismatch(format!(
                        "a {width}x{height} view is too small for a blur kernel of {k}"
                    )));
                }
                blur(img, height, width, k, sigma);
            }
            ViewOp::Solarize(t) => point(img, Point::Solarize(t)),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    // The arithmetic as first written: C's `floor` and `round` called, each output's blur
    // summed alone (and `rgb_to_hsv_with` given C's `fmod` below).

    /// `Convert.c`'s `hsv2rgb`: the sector and its remainder in double (stored as float), C's
    /// `round` (halves away from zero).
    fn reference_hsv_to_rgb(hsv: [u8; 3]) -> [u8; 3] {
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

    /// torchvision's `gaussian_blur` of a `uint8` image: the 2-D kernel (the float32 outer
    /// product of the 1-D one) over the reflect-padded image, each output rounded half to even.
    /// The sums are taken in float64 (PyTorch's convolution sums float32 in an order of its own:
    /// an output within about 1e-4 of a half may round the other way there). The kernel is
    /// symmetric, exactly (its taps at `x` and `-x` are the same float32), so the samples its equal
    /// taps weigh are added first and multiplied once: a quarter of the products. Each channel is
    /// padded once, and each tap runs along whole rows.
    fn reference_blur(img: &mut [u8], height: usize, width: usize, kernel_size: usize, sigma: f32) {
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

    #[test]
    fn hsv_conversions_equal_the_calls_they_stand_for_on_every_input() {
        let steps = HsvSteps::new();
        for v in 0..1u32 << 24 {
            let [a, b, c, _] = v.to_le_bytes();
            assert_eq!(
                rgb_to_hsv([a, b, c]),
                rgb_to_hsv_with([a, b, c], |x| x % 1.0),
                "{a} {b} {c}"
            );
            assert_eq!(
                steps.rgb([a, b, c]),
                reference_hsv_to_rgb([a, b, c]),
                "{a} {b} {c}"
            );
        }
        for x in [
            -0.7,
            -0.5,
            -0.0,
            0.0,
            0.49999999999999994,
            0.5,
            1.5,
            2.5,
            254.5,
            254.9,
            255.0,
        ] {
            assert_eq!(
                round_clip(x),
                (f64::round(x) as i32).clamp(0, 255) as u8,
                "{x}"
            );
        }
        assert_eq!(round_clip(f64::NAN), 0);
        for x in [
            0.5,
            1.5,
            2.5,
            3.49,
            254.5,
            255.5,
            -0.5,
            -3.0,
            300.0,
            f64::NAN,
        ] {
            let want = f64::round_ties_even(x).clamp(0.0, 255.0) as u8;
            assert_eq!(round_half_even_clip(x), want, "{x}");
        }
    }

    #[test]
    fn hue_steps_of_eight_pixels_equal_the_pixel_by_pixel_hue_on_every_colour() {
        #[cfg(target_arch = "x86_64")]
        if super::super::colour_avx2::available() {
            let steps = HsvSteps::new();
            for shift in [0u8, 1, 77, 128, 200, 255] {
                let mut block = [0u8; 24];
                for first in (0..1u32 << 24).step_by(8) {
                    for (i, px) in block.chunks_exact_mut(3).enumerate() {
                        px.copy_from_slice(&(first + i as u32).to_le_bytes()[..3]);
                    }
                    let mut want = block;
                    for px in want.chunks_exact_mut(3) {
                        let [h, s, v] = rgb_to_hsv([px[0], px[1], px[2]]);
                        px.copy_from_slice(&steps.rgb([h.wrapping_add(shift), s, v]));
                    }
                    // SAFETY: the CPU has AVX2 (checked above).
                    #[allow(unsafe_code)]
                    unsafe {
                        super::super::colour_avx2::hue_step(&mut block, shift)
                    };
                    assert_eq!(block, want, "from {first:06x}, shift {shift}");
                }
            }
        }
    }

    /// `ImagingBlend` as first written: clipped apart when the factor is outside 0..1.
    fn reference_blend(degenerate: u8, sample: u8, alpha: f32) -> u8 {
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

    #[test]
    fn point_calls_equal_their_pixel_by_pixel_arithmetic() {
        let alphas = [0.0f32, 0.6, 0.999, 1.0, 1.4, 2.5, -0.5, f32::NAN];
        for alpha in alphas {
            for d in 0..=255u8 {
                for v in 0..=255u8 {
                    assert_eq!(
                        blend(d, v, alpha),
                        reference_blend(d, v, alpha),
                        "{d} {v} {alpha}"
                    );
                }
            }
        }
        // Every sample value in every channel, in runs that end mid-run.
        let img: Vec<u8> = (0..3 * 1000).map(|i| (i * 7 + i / 3) as u8).collect();
        for len in [3 * 1000, 3 * 33, 3] {
            for alpha in alphas {
                let mut got = img[..len].to_vec();
                point(&mut got, Point::Saturation(alpha));
                let mut want = img[..len].to_vec();
                for px in want.chunks_exact_mut(3) {
                    let l = luma(px);
                    px.iter_mut()
                        .for_each(|v| *v = reference_blend(l, *v, alpha));
                }
                assert_eq!(got, want, "saturation {alpha}, {len} samples");
                let mut got = img[..len].to_vec();
                point(&mut got, Point::Blend(117, alpha));
                let want: Vec<u8> = img[..len]
                    .iter()
                    .map(|&v| reference_blend(117, v, alpha))
                    .collect();
                assert_eq!(got, want, "blend {alpha}, {len} samples");
            }
            let mut got = img[..len].to_vec();
            point(&mut got, Point::Solarize(128));
            let want: Vec<u8> = img[..len]
                .iter()
                .map(|&v| if v >= 128 { !v } else { v })
                .collect();
            assert_eq!(got, want);
        }
    }

    #[test]
    fn the_contrast_grey_level_is_the_histograms_mean() {
        let reference = |img: &[u8]| {
            let mut hist = [0u64; 256];
            for px in img.chunks_exact(3) {
                hist[luma(px) as usize] += 1;
            }
            let n: u64 = hist.iter().sum();
            let sum: f64 = hist
                .iter()
                .enumerate()
                .map(|(i, &c)| i as f64 * c as f64)
                .sum();
            if n == 0 {
                0
            } else {
                (sum / n as f64 + 0.5) as u8
            }
        };
        let mut state = 0x1234_5678_9abc_def1u64;
        for len in [0, 1, 2, 7, 96 * 96, 224 * 224, 1000 * 700] {
            let mut img: Vec<u8> = (0..3 * len)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    state as u8
                })
                .collect();
            assert_eq!(contrast_mean(&img), reference(&img), "{len} pixels");
            img.fill(255);
            assert_eq!(contrast_mean(&img), reference(&img), "{len} white pixels");
        }
    }

    #[test]
    fn blurs_equal_each_output_summed_alone() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for (height, width) in [
            (1, 1),
            (3, 7),
            (5, 8),
            (9, 17),
            (12, 31),
            (40, 33),
            (96, 96),
        ] {
            for k in 1..=11usize {
                if k / 2 >= height.min(width) {
                    continue;
                }
                for sigma in [0.1f32, 0.7, 1.3, 2.0, 5.5] {
                    let mut img: Vec<u8> = (0..height * width * 3).map(|_| next() as u8).collect();
                    if next() % 3 == 0 {
                        // Flat stretches, where sums near a half are likelier.
                        img.iter_mut().for_each(|v| *v &= 0xF0);
                    }
                    let mut want = img.clone();
                    reference_blur(&mut want, height, width, k, sigma);
                    blur(&mut img, height, width, k, sigma);
                    assert_eq!(img, want, "{width}x{height}, kernel {k}, sigma {sigma}");
                }
            }
        }
    }

    #[test]
    fn a_blur_kernel_of_nothing_is_refused() {
        let mut img = vec![9u8; 4 * 4 * 3];
        let none = [ViewOp::Blur {
            kernel_size: 0,
            sigma: 1.0,
        }];
        assert!(apply_view_ops(&none, &mut img, 4, 4).is_err());
        assert!(img.iter().all(|&v| v == 9));
    }

    #[test]
    fn hsv_round_trip_is_pillows() {
        // Pillow 13: Image.new("RGB", (1, 1), c).convert("HSV").getpixel((0, 0)) and back.
        assert_eq!(rgb_to_hsv([255, 0, 0]), [0, 255, 255]);
        assert_eq!(rgb_to_hsv([0, 255, 0]), [85, 255, 255]);
        assert_eq!(rgb_to_hsv([0, 0, 255]), [170, 255, 255]);
        assert_eq!(rgb_to_hsv([7, 7, 7]), [0, 0, 7]);
        assert_eq!(HsvSteps::new().rgb([0, 255, 255]), [255, 0, 0]);
        assert_eq!(HsvSteps::new().rgb([0, 0, 9]), [9, 9, 9]);
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
