//! Mixing across the batch: torchvision v2's `MixUp(alpha)` and `CutMix(alpha)` (and, with
//! both, `RandomChoice([MixUp, CutMix])`), drawn once per batch from (seed, epoch, batch
//! number); the soft labels they make; and the CPU rendition of the mixing normalize, bit for
//! bit the kernel's.
//!
//! Row `i` is mixed with row `i - 1` (row 0 with the last), as `inpt.roll(1, 0)` pairs them.
//! MixUp mixes the normalized float images (`rolled * (1 - lam) + image * lam` in float32, as
//! torchvision mixes the float batch its recipe normalizes first); CutMix pastes the partner's
//! box, exact in `uint8`.

use half::{bf16, f16};
use rayon::prelude::*;

use crate::options::{Layout, NormalizeSpec};
use crate::random::Draws;
use crate::tensor::HostData;

/// What a batch's rows were mixed with, as torchvision's `MixUp` and `CutMix` draw it.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum Mix {
    /// `MixUp`: every row is `lam * row + (1 - lam) * previous row`, and so are its labels.
    MixUp {
        /// The weight of the row itself (a Beta(alpha, alpha) draw, in float32).
        lam: f64,
    },
    /// `CutMix`: every row takes the previous row's pixels inside the box `x1..x2`, `y1..y2`;
    /// the labels are mixed with `lam`, the share of the row's own pixels.
    CutMix {
        /// First column of the box.
        x1: u32,
        /// First row of the box.
        y1: u32,
        /// Column past the box.
        x2: u32,
        /// Row past the box.
        y2: u32,
        /// `1 - box area / image area` (torchvision's `lam_adjusted`).
        lam: f64,
    },
}

impl Mix {
    /// The weight of each row's own label.
    pub fn lam(&self) -> f64 {
        match *self {
            Mix::MixUp { lam } | Mix::CutMix { lam, .. } => lam,
        }
    }

    /// The row a row of a batch of `n` is mixed with: the previous one, the last for row 0.
    pub fn partner(row: usize, n: usize) -> usize {
        (row + n - 1) % n
    }

    /// The mixing as a JSON object for row `row` whose partner is row `partner` (of a file of
    /// rows): `{"fn": "mixup", "partner": P, "lam": L}` or `{"fn": "cutmix", "partner": P,
    /// "box": [x1, y1, x2, y2], "lam": L}`.
    pub fn json(&self, partner: usize) -> String {
        use super::ops::json_f64;
        match *self {
            Mix::MixUp { lam } => format!(
                "{{\"fn\": \"mixup\", \"partner\": {partner}, \"lam\": {}}}",
                json_f64(lam)
            ),
            Mix::CutMix {
                x1,
                y1,
                x2,
                y2,
                lam,
            } => format!(
                "{{\"fn\": \"cutmix\", \"partner\": {partner}, \"box\": [{x1}, {y1}, {x2}, {y2}], \
                 \"lam\": {}}}",
                json_f64(lam)
            ),
        }
    }
}

/// A uniform double in (0, 1): 53 random bits, never 0.
fn open_unit(draws: &mut Draws) -> f64 {
    ((draws.next() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
}

/// A standard normal draw (Box-Muller, one of the pair).
fn normal(draws: &mut Draws) -> f64 {
    let (u, v) = (open_unit(draws), open_unit(draws));
    (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
}

/// The logarithm of a Gamma(shape, 1) draw: Marsaglia and Tsang's method, with
/// `Gamma(a) = Gamma(a + 1) * U^(1/a)` for shapes below 1, in logarithms so that small shapes
/// (MixUp's 0.2) cannot underflow.
fn log_gamma_draw(shape: f64, draws: &mut Draws) -> f64 {
    if shape < 1.0 {
        return log_gamma_draw(shape + 1.0, draws) + open_unit(draws).ln() / shape;
    }
    let d = shape - 1.0 / 3.0;
    let c = 1.0 / (9.0 * d).sqrt();
    loop {
        let x = normal(draws);
        let v = 1.0 + c * x;
        if v <= 0.0 {
            continue;
        }
        let v = v * v * v;
        let u = open_unit(draws);
        if u.ln() < 0.5 * x * x + d - d * v + d * v.ln() {
            return d.ln() + v.ln();
        }
    }
}

/// A Beta(alpha, alpha) draw, `X / (X + Y)` of two Gamma(alpha) draws, rounded to float32 as
/// torchvision's `Beta(torch.tensor([alpha]), ...)` samples it.
pub(crate) fn beta(alpha: f64, draws: &mut Draws) -> f64 {
    let x = log_gamma_draw(alpha, draws);
    let y = log_gamma_draw(alpha, draws);
    let lam = 1.0 / (1.0 + (y - x).exp());
    f64::from(lam as f32)
}

/// The batch's mixing: with both, `RandomChoice([MixUp, CutMix])` picks one (each half the
/// time); then `lam ~ Beta(alpha, alpha)`, and for CutMix the box centred on a uniform pixel
/// with sides `sqrt(1 - lam)` of the image's, clipped, as torchvision's `CutMix` draws it.
pub(crate) fn draw_mix(
    mixup: Option<f64>,
    cutmix: Option<f64>,
    width: u32,
    height: u32,
    draws: &mut Draws,
) -> Option<Mix> {
    let use_cutmix = match (mixup, cutmix) {
        (Some(_), Some(_)) => draws.below(2) == 1,
        (None, Some(_)) => true,
        (Some(_), None) => false,
        (None, None) => return None,
    };
    if !use_cutmix {
        let lam = beta(mixup.unwrap_or(1.0), draws);
        return Some(Mix::MixUp { lam });
    }
    let lam = beta(cutmix.unwrap_or(1.0), draws);
    let (w, h) = (i64::from(width), i64::from(height));
    let r_x = draws.below(width as u64) as i64;
    let r_y = draws.below(height as u64) as i64;
    let r = 0.5 * (1.0 - lam).sqrt();
    let r_w_half = (r * w as f64) as i64;
    let r_h_half = (r * h as f64) as i64;
    let x1 = (r_x - r_w_half).max(0);
    let y1 = (r_y - r_h_half).max(0);
    let x2 = (r_x + r_w_half).min(w);
    let y2 = (r_y + r_h_half).min(h);
    let lam = 1.0 - ((x2 - x1) * (y2 - y1)) as f64 / (w * h) as f64;
    Some(Mix::CutMix {
        x1: x1 as u32,
        y1: y1 as u32,
        x2: x2 as u32,
        y2: y2 as u32,
        lam,
    })
}

/// The soft labels of a batch with `labels` over `classes` classes:
/// `one_hot(roll(labels)) * (1 - lam) + one_hot(labels) * lam` in float32, row-major
/// `[n, classes]`, as torchvision's `_mixup_label` computes them.
pub(crate) fn soft_labels(labels: &[u32], classes: usize, lam: f64) -> Vec<f32> {
    let n = labels.len();
    let (own, other) = (lam as f32, (1.0 - lam) as f32);
    let mut out = vec![0.0f32; n * classes];
    for (row, chunk) in out.chunks_exact_mut(classes).enumerate() {
        let partner = labels[Mix::partner(row, n)] as usize;
        let label = labels[row] as usize;
        for (c, v) in chunk.iter_mut().enumerate() {
            let a = if c == partner { other } else { 0.0 };
            let b = if c == label { own } else { 0.0 };
            *v = a + b;
        }
    }
    out
}

/// The normalized value of one mixed element: MixUp's `n(partner) * (1 - lam) + n(own) * lam`
/// (two float32 products and a sum, as `roll(1, 0).mul_(1 - lam).add_(x.mul(lam))` computes
/// them), where `n(x) = fma(x, scale, bias)`.
pub(crate) fn mixup_value(
    own: u8,
    partner: u8,
    scale: f32,
    bias: f32,
    lam: f32,
    one_minus: f32,
) -> f32 {
    let own = f32::from(own).mul_add(scale, bias);
    let partner = f32::from(partner).mul_add(scale, bias);
    partner * one_minus + own * lam
}

/// Writes `n` rows of `hw` pixels into `out` in `spec`'s layout and channel order, row by row
/// in parallel: `value(row, pixel, channel)` converted to the element type.
fn write_rows<T: Send>(
    out: &mut [T],
    n: usize,
    hw: usize,
    spec: &NormalizeSpec,
    value: &(dyn Fn(usize, usize, usize) -> f32 + Sync),
    convert: impl Fn(f32) -> T + Sync,
) {
    out[..n * hw * 3]
        .par_chunks_mut((hw * 3).max(1))
        .enumerate()
        .for_each(|(row, chunk)| {
            for pixel in 0..hw {
                for c in 0..3 {
                    let oc = spec.channel_order.output_channel(c);
                    let i = match spec.layout {
                        Layout::Nchw => oc * hw + pixel,
                        Layout::Nhwc => pixel * 3 + oc,
                    };
                    chunk[i] = convert(value(row, pixel, c));
                }
            }
        });
}

/// The CPU rendition of the kernel that normalizes a mixed batch: `n` images of `height` x
/// `width` packed RGB8 (after their own augmentations) into the first elements of `data`, as
/// `spec` asks.
pub(crate) fn mix_normalize(
    pixels: &[u8],
    n: usize,
    height: usize,
    width: usize,
    spec: &NormalizeSpec,
    mix: &Mix,
    data: &mut HostData,
) {
    let hw = height * width;
    let image = hw * 3;
    let (lam, one_minus) = (mix.lam() as f32, (1.0 - mix.lam()) as f32);
    let value = |row: usize, pixel: usize, c: usize| -> f32 {
        let partner = Mix::partner(row, n);
        let (scale, bias) = (spec.affine.scale[c], spec.affine.bias[c]);
        let own = pixels[row * image + pixel * 3 + c];
        let other = pixels[partner * image + pixel * 3 + c];
        match *mix {
            Mix::MixUp { .. } => mixup_value(own, other, scale, bias, lam, one_minus),
            Mix::CutMix { x1, y1, x2, y2, .. } => {
                let (x, y) = ((pixel % width) as u32, (pixel / width) as u32);
                let inside = x >= x1 && x < x2 && y >= y1 && y < y2;
                let x = if inside { other } else { own };
                f32::from(x).mul_add(scale, bias)
            }
        }
    };
    match data {
        HostData::F32(out) => write_rows(out, n, hw, spec, &value, |v| v),
        HostData::F16(out) => write_rows(out, n, hw, spec, &value, f16::from_f32),
        HostData::BF16(out) => write_rows(out, n, hw, spec, &value, bf16::from_f32),
        // The pipeline's options refuse an integer output.
        HostData::I32(_) | HostData::I64(_) | HostData::U8(_) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Mean and variance of `n` Beta(alpha, alpha) draws.
    fn moments(alpha: f64, n: usize) -> (f64, f64, Vec<f64>) {
        let mut draws = Draws::new(17);
        let v: Vec<f64> = (0..n).map(|_| beta(alpha, &mut draws)).collect();
        let mean = v.iter().sum::<f64>() / n as f64;
        let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n as f64;
        (mean, var, v)
    }

    #[test]
    fn beta_draws_have_the_distributions_moments() {
        let n = 100_000;
        for alpha in [0.2, 0.8, 1.0, 2.0] {
            let (mean, var, v) = moments(alpha, n);
            // Beta(a, a): mean 1/2, variance 1 / (4 (2a + 1)).
            let want_var = 1.0 / (4.0 * (2.0 * alpha + 1.0));
            let se_mean = (want_var / n as f64).sqrt();
            assert!(
                (mean - 0.5).abs() < 5.0 * se_mean,
                "alpha {alpha}: mean {mean}"
            );
            assert!(
                (var - want_var).abs() < 0.02 * want_var + 0.002,
                "alpha {alpha}: var {var} vs {want_var}"
            );
            assert!(v.iter().all(|x| (0.0..=1.0).contains(x)), "alpha {alpha}");
        }
        // Beta(1, 1) is uniform and Beta(2, 2) has the CDF 3x^2 - 2x^3: Kolmogorov-Smirnov.
        for (alpha, cdf) in [
            (1.0, &(|x: f64| x) as &dyn Fn(f64) -> f64),
            (2.0, &|x: f64| 3.0 * x * x - 2.0 * x * x * x),
        ] {
            let (_, _, mut v) = moments(alpha, n);
            v.sort_by(f64::total_cmp);
            let d = v
                .iter()
                .enumerate()
                .map(|(i, &x)| {
                    let f = cdf(x);
                    (f - i as f64 / n as f64)
                        .abs()
                        .max(((i + 1) as f64 / n as f64 - f).abs())
                })
                .fold(0.0, f64::max);
            // The 1e-4 critical value of the one-sample statistic.
            let limit = (-0.5 * (1e-4f64 / 2.0).ln()).sqrt() / (n as f64).sqrt();
            assert!(d < limit, "alpha {alpha}: KS {d} over {limit}");
        }
    }

    #[test]
    fn cutmix_boxes_fit_and_lam_counts_the_kept_pixels() {
        let mut draws = Draws::new(5);
        let mut cut = 0;
        for _ in 0..10_000 {
            match draw_mix(Some(0.2), Some(1.0), 224, 160, &mut draws).expect("a mix") {
                Mix::CutMix {
                    x1,
                    y1,
                    x2,
                    y2,
                    lam,
                } => {
                    cut += 1;
                    assert!(x1 <= x2 && x2 <= 224 && y1 <= y2 && y2 <= 160);
                    let kept = 1.0 - f64::from((x2 - x1) * (y2 - y1)) / (224.0 * 160.0);
                    assert_eq!(lam, kept);
                }
                Mix::MixUp { lam } => assert!((0.0..=1.0).contains(&lam)),
            }
        }
        assert!((4_700..5_300).contains(&cut), "{cut} CutMix of 10,000");
    }

    #[test]
    fn soft_labels_are_torchvisions() {
        let labels = [3, 1, 1];
        let s = soft_labels(&labels, 4, 0.75);
        // Row 0 pairs with row 2 (label 1), row 1 with row 0 (3), row 2 with row 1 (1).
        assert_eq!(&s[0..4], &[0.0, 0.25, 0.0, 0.75]);
        assert_eq!(&s[4..8], &[0.0, 0.75, 0.0, 0.25]);
        assert_eq!(&s[8..12], &[0.0, 1.0, 0.0, 0.0]);
    }
}
