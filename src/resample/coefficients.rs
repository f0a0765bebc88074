//! The integer coefficients of one axis: Pillow's `precompute_coeffs` and `normalize_coeffs_8bpc`
//! for a convolution filter, `ImagingScaleAffine`'s sample positions for `NEAREST`, and a copy
//! for an axis Pillow leaves alone.
//!
//! What is ported, and must stay as it is for the results to match Pillow's:
//!
//! - the filter is centred on `in0 + (i + 0.5) * scale` (`in0`, `in1`: the box's edges as C
//!   floats, `scale = (double)(in1 - in0) / out`), stretched by `max(scale, 1)` (antialiasing
//!   when shrinking), its taps clamped to the edges of the image Pillow resizes and the clamped
//!   weights renormalised to sum to one, all in `f64` in Pillow's order of operations;
//! - each weight becomes an `i32` with [`PRECISION_BITS`] = 22 fraction bits, rounded half away
//!   from zero;
//! - a sum starts at `1 << 21` (one half), adds `sample * weight` in `i32`, and is shifted right
//!   by 22 and clamped to 0..=255 ([`clip8`]);
//! - `NEAREST` walks the box with a `double` position that starts at `in0 + step / 2` and adds
//!   `step = (double)(in1 - in0) / out` once per output (a running sum, not a product), taking the
//!   sample `(int)position`; a position past the image leaves the output 0.

use super::filter::{Filter, Resampling};
use super::plan::{Axis, AxisPlan, PlanError};

/// Fraction bits of the integer weights: 32 bits less 8 for the sample, less 2 for headroom
/// (weights can sum above one, or below zero, before the final clamp).
pub const PRECISION_BITS: u32 = 32 - 8 - 2;

/// The rounding half every sum starts from: `clip8` then rounds to nearest.
pub const HALF: i32 = 1 << (PRECISION_BITS - 1);

/// The weight of a copied sample: 1.0 in [`PRECISION_BITS`] fixed point.
pub const ONE: i32 = 1 << PRECISION_BITS;

/// The coefficients of one axis for its kept outputs: output `j` (the resize's sample
/// `out_first + j`) is `clip8(HALF + sum(sample[start + k] * weights[j * taps + k]))` over
/// `k < len`, with `(start, len) = bounds[j]` in samples of the source region. An output with no
/// taps (`len` 0: a nearest position past the image) is 0.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AxisCoefficients {
    /// Whether the axis is filtered. When it is not (Pillow leaves an unchanged axis alone, and
    /// `NEAREST` picks samples), every output has one tap of weight [`ONE`] (or none).
    pub resampled: bool,
    /// Weights per output (Pillow's `ksize`, the most taps any output of the resize may have;
    /// 1 for an axis that is not filtered); weights past an output's `len` are zero.
    pub taps: usize,
    /// Per kept output: the first source sample it reads and how many it reads.
    pub bounds: Vec<(u32, u32)>,
    /// `taps` weights per kept output, [`PRECISION_BITS`] fraction bits; empty where they are
    /// left to the device (`weights_on_device`).
    pub weights: Vec<i32>,
    /// Where the host left the weights to the device ([`AxisCoefficients::compute_bounds`]):
    /// what its kernel computes them from, the bounds here as the weights' would be.
    pub weights_on_device: Option<WeightRule>,
}

/// What a device computes the weights of a bilinear or bicubic axis from, where the host leaves
/// them to it: the values the host's loop starts from, so that the same double operations, each
/// rounded on its own (`kernels/resize.cu`'s `gpufeed_resize_weights`), give the same weights.
/// Weights of kept output `j` (the resize's sample `out_first + j`) are those
/// [`AxisCoefficients::compute`] gives it.
#[derive(Debug, Clone, Copy)]
pub struct WeightRule {
    /// Bilinear or bicubic ([`WeightRule::takes`]).
    pub filter: Filter,
    /// The box's first edge (a C float, widened).
    pub in0: f64,
    /// Source samples per output.
    pub scale: f64,
    /// How far the stretched filter reaches.
    pub support: f64,
    /// One over the filter's stretch.
    pub inv_filterscale: f64,
    /// Samples of the image resized (taps are clamped to it).
    pub in_size: i32,
    /// The first kept output's sample of the resize.
    pub out_first: u32,
}

impl WeightRule {
    /// Whether a device computes `filter`'s weights: those whose values are additions,
    /// multiplications and comparisons alone (no sine or cosine, whose library results differ
    /// between the host and the device).
    pub fn takes(filter: Filter) -> bool {
        matches!(filter, Filter::Bilinear | Filter::Bicubic)
    }

    /// Its values as bits, for comparing rules exactly.
    fn bits(&self) -> (Filter, [u64; 4], i32, u32) {
        let values = [self.in0, self.scale, self.support, self.inv_filterscale];
        (
            self.filter,
            values.map(f64::to_bits),
            self.in_size,
            self.out_first,
        )
    }
}

impl PartialEq for WeightRule {
    fn eq(&self, other: &WeightRule) -> bool {
        self.bits() == other.bits()
    }
}

impl Eq for WeightRule {}

/// What every output of a convolution axis shares (the scalar loop's values, which the vectors'
/// loop and the device's kernel start from too).
pub(super) struct Convolution {
    pub rule: WeightRule,
    /// Weights per output (Pillow's `ksize`).
    pub taps: usize,
}

impl Convolution {
    /// `precompute_coeffs`'s values for `plan` under `filter`.
    fn of(plan: &AxisPlan, filter: Filter) -> Convolution {
        let (in0, in1) = plan.source_box().edges();
        let scale = f64::from(in1 - in0) / f64::from(plan.resized);
        let filterscale = scale.max(1.0);
        let support = filter.support() * filterscale;
        Convolution {
            rule: WeightRule {
                filter,
                in0: f64::from(in0),
                scale,
                support,
                inv_filterscale: 1.0 / filterscale,
                in_size: plan.src_len as i32,
                out_first: plan.out_first,
            },
            taps: (support.ceil() as usize) * 2 + 1,
        }
    }

    /// Output `xx`'s centre, first sample and samples read (at most `taps`).
    fn bounds(&self, xx: u32) -> (f64, i32, usize) {
        let r = &self.rule;
        let center = r.in0 + (f64::from(xx) + 0.5) * r.scale;
        // `(int)` truncates toward zero; Rust's `as` does too (and saturates instead of UB).
        let xmin = ((center - r.support + 0.5) as i32).max(0);
        let xmax = ((center + r.support + 0.5) as i32).min(r.in_size);
        let len = (xmax - xmin).max(0) as usize;
        (center, xmin, len.min(self.taps))
    }
}

impl AxisCoefficients {
    /// The coefficients of outputs `from..to` alone (a band of a pass's outputs), their bounds
    /// still counted from the same source.
    pub(crate) fn rows(&self, from: usize, to: usize) -> AxisCoefficients {
        let taps = self.taps;
        AxisCoefficients {
            resampled: self.resampled,
            taps,
            bounds: self
                .bounds
                .get(from..to)
                .map_or_else(Vec::new, <[_]>::to_vec),
            weights: self
                .weights
                .get(from * taps..to * taps)
                .map_or_else(Vec::new, <[i32]>::to_vec),
            weights_on_device: self.weights_on_device.map(|rule| WeightRule {
                out_first: rule.out_first + from as u32,
                ..rule
            }),
        }
    }

    /// The source samples the kept outputs read, `[first, end)`.
    pub fn span(&self) -> (u32, u32) {
        let read = self.bounds.iter().filter(|b| b.1 > 0);
        let first = read.clone().map(|b| b.0).min().unwrap_or(0);
        let end = read.map(|b| b.0 + b.1).max().unwrap_or(first);
        (first, end.max(first))
    }

    /// [`AxisCoefficients::span`] in the source image: offset by the region of `plan`, the plan
    /// these coefficients were computed for.
    pub fn source_span(&self, plan: &AxisPlan) -> std::ops::Range<u32> {
        let (first, end) = self.span();
        plan.src_offset + first..plan.src_offset + end
    }

    /// The same coefficients with every bound's start moved `by` samples back: for an input
    /// that starts `by` samples into the region (Pillow's "shift bounds for vertical pass").
    pub fn shifted(mut self, by: u32) -> AxisCoefficients {
        for b in &mut self.bounds {
            b.0 = b.0.saturating_sub(by);
        }
        self
    }

    /// Computes the coefficients of `plan`'s kept outputs under `resampling` into `self`,
    /// reusing its buffers.
    pub(crate) fn compute(
        &mut self,
        plan: &AxisPlan,
        resampling: Resampling,
        axis: Axis,
    ) -> Result<(), PlanError> {
        plan.check_own(axis)?;
        self.bounds.clear();
        self.weights.clear();
        self.weights_on_device = None;
        match resampling {
            _ if !plan.is_resampled() => {
                let first = plan.source_box().start / plan.source_box().divisor;
                self.copy(first + plan.out_first, plan.out_len);
            }
            Resampling::Nearest => self.nearest(plan),
            Resampling::Filter(filter) => {
                self.convolution(plan, |x| filter.weight(x), filter, vector_weights(filter))
            }
        }
        Ok(())
    }

    /// [`AxisCoefficients::compute`] with the weights of a bilinear or bicubic axis left to the
    /// device ([`WeightRule`]): the bounds alone are computed here, the same as `compute`'s.
    /// Any other axis is computed whole.
    pub(crate) fn compute_bounds(
        &mut self,
        plan: &AxisPlan,
        filter: Filter,
        axis: Axis,
    ) -> Result<(), PlanError> {
        if !WeightRule::takes(filter) || !plan.is_resampled() {
            return self.compute(plan, Resampling::Filter(filter), axis);
        }
        plan.check_own(axis)?;
        self.bounds.clear();
        self.weights.clear();
        let convolution = Convolution::of(plan, filter);
        self.resampled = true;
        self.taps = convolution.taps;
        let mut done = 0;
        // Four outputs at a time where the CPU has AVX2 (the same bounds); the rest, and four
        // whose values leave `i32`, one by one below.
        #[cfg(target_arch = "x86_64")]
        if vector_weights(filter) {
            let mut four = [(0, 0); 4];
            while done + 4 <= plan.out_len {
                // SAFETY: the CPU has AVX2 (`vector_weights`).
                #[allow(unsafe_code)]
                let computed = unsafe {
                    super::weights_avx2::four_bounds(&convolution, plan.out_first + done, &mut four)
                };
                if !computed {
                    break;
                }
                self.bounds.extend_from_slice(&four);
                done += 4;
            }
        }
        let kept = plan.out_first + done..plan.out_first + plan.out_len;
        self.bounds.extend(kept.map(|xx| {
            let (_, xmin, len) = convolution.bounds(xx);
            (xmin as u32, len as u32)
        }));
        self.weights_on_device = Some(convolution.rule);
        Ok(())
    }

    /// One tap of weight [`ONE`] per output, from sample `first` on.
    fn copy(&mut self, first: u32, len: u32) {
        self.resampled = false;
        self.taps = 1;
        self.bounds.extend((first..first + len).map(|i| (i, 1)));
        self.weights.resize(len as usize, ONE);
    }

    /// `ImagingScaleAffine` along one axis.
    fn nearest(&mut self, plan: &AxisPlan) {
        self.resampled = false;
        self.taps = 1;
        let (in0, in1) = plan.source_box().edges();
        // `a[0] = (double)(box[2] - box[0]) / xsize; a[2] = box[0]`: a float difference.
        let step = f64::from(in1 - in0) / f64::from(plan.resized);
        let mut position = f64::from(in0) + step * 0.5;
        let kept = plan.out_first..plan.out_first + plan.out_len;
        for i in 0..plan.out_first + plan.out_len {
            if kept.contains(&i) {
                // `COORD(v)`: -1 below zero, else `(int)v`.
                let sample = if position < 0.0 { -1 } else { position as i64 };
                if (0..i64::from(plan.src_len)).contains(&sample) {
                    self.bounds.push((sample as u32, 1));
                } else {
                    self.bounds.push((0, 0));
                }
            }
            position += step;
        }
        self.weights.resize(plan.out_len as usize, ONE);
    }

    /// `precompute_coeffs` and `normalize_coeffs_8bpc` for the kept outputs.
    /// With `vectors` (where [`vector_weights`] says so), four outputs at a time, the same
    /// bits.
    fn convolution(
        &mut self,
        plan: &AxisPlan,
        weight: impl Fn(f64) -> f64,
        filter: Filter,
        vectors: bool,
    ) {
        let convolution = Convolution::of(plan, filter);
        let (rule, taps) = (&convolution.rule, convolution.taps);
        self.resampled = true;
        self.taps = taps;
        self.weights.resize(plan.out_len as usize * taps, 0);
        let mut prekk = [0f64; 64];
        let mut spill = Vec::new();
        let prekk: &mut [f64] = if taps <= prekk.len() {
            &mut prekk[..taps]
        } else {
            spill.resize(taps, 0.0);
            &mut spill
        };
        let out_len = plan.out_len as usize;
        let mut done = 0;
        // Bilinear and bicubic weights four outputs at a time where the CPU has AVX2 (the same
        // bits); the rest, and four whose values are not all finite, one by one below.
        #[cfg(target_arch = "x86_64")]
        if vectors {
            // Scratch for filters of up to 64 taps (`four_outputs` leaves wider ones to the
            // scalar loop).
            let mut values = [0f64; 4 * 64];
            let mut bounds = [(0, 0); 4];
            while done + 4 <= out_len {
                let rows = &mut self.weights[done * taps..(done + 4) * taps];
                let first = plan.out_first + done as u32;
                // SAFETY: the CPU has AVX2 and the filter is one the vectors take
                // (`vector_weights`, which the caller asked); the function checks its
                // buffers' lengths.
                #[allow(unsafe_code)]
                let computed = unsafe {
                    super::weights_avx2::four_outputs(
                        &convolution,
                        first,
                        &mut values,
                        rows,
                        &mut bounds,
                    )
                };
                if !computed {
                    // The scalar loop below writes these outputs' weights, over zeros.
                    rows.fill(0);
                    break;
                }
                self.bounds.extend_from_slice(&bounds);
                done += 4;
            }
        }
        let kept = plan.out_first + done as u32..plan.out_first + plan.out_len;
        let rows = self.weights[done * taps..].chunks_exact_mut(taps);
        for (xx, row) in kept.zip(rows) {
            let (center, xmin, len) = convolution.bounds(xx);
            let k = &mut prekk[..len];
            let mut ww = 0.0;
            for (x, w) in k.iter_mut().enumerate() {
                let v = weight((f64::from(x as i32 + xmin) - center + 0.5) * rule.inv_filterscale);
                *w = v;
                ww += v;
            }
            if ww != 0.0 {
                k.iter_mut().for_each(|w| *w /= ww);
            }
            // The rest of the row stays zero (the buffer was cleared and zero-filled above).
            for (dst, &w) in row.iter_mut().zip(k.iter()) {
                *dst = to_fixed(w);
            }
            self.bounds.push((xmin as u32, k.len() as u32));
        }
    }

    /// Output `j`'s bounds and weights (the first `len` of its row).
    pub(crate) fn output(&self, j: usize) -> ((u32, u32), &[i32]) {
        let bounds = self.bounds.get(j).copied().unwrap_or((0, 0));
        let start = j * self.taps;
        let weights = self
            .weights
            .get(start..start + bounds.1 as usize)
            .unwrap_or(&[]);
        (bounds, weights)
    }
}

/// Whether this CPU computes `filter`'s weights four outputs at a time (bilinear and bicubic,
/// with AVX2).
fn vector_weights(filter: Filter) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        super::weights_avx2::takes(filter)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = filter;
        false
    }
}

/// The coefficients of `plan`'s kept outputs under `resampling`: a convolution filter's, the
/// nearest samples', or a copy for an axis Pillow does not resample.
pub fn axis_coefficients(
    plan: &AxisPlan,
    resampling: Resampling,
    axis: Axis,
) -> Result<AxisCoefficients, PlanError> {
    let mut c = AxisCoefficients::default();
    c.compute(plan, resampling, axis)?;
    Ok(c)
}

/// `normalize_coeffs_8bpc` for one weight: rounded half away from zero (then truncated by the
/// conversion, as `(int)` does).
fn to_fixed(w: f64) -> i32 {
    let scaled = w * f64::from(ONE);
    if w < 0.0 {
        (-0.5 + scaled) as i32
    } else {
        (0.5 + scaled) as i32
    }
}

/// `clip8`: the sum shifted down to 8 bits (arithmetic shift, so negative sums floor) and
/// clamped to 0..=255, as Pillow's lookup table does.
#[inline]
pub fn clip8(sum: i32) -> u8 {
    (sum >> PRECISION_BITS).clamp(0, 255) as u8
}

#[cfg(test)]
mod tests {
    use super::super::filter::Filter;
    use super::super::plan::SourceBox;
    use super::*;

    fn plan(src_len: u32, resized: u32) -> AxisPlan {
        AxisPlan::stretch(src_len, resized)
    }

    #[test]
    fn fixed_point_constants_are_pillows() {
        assert_eq!(PRECISION_BITS, 22);
        assert_eq!(HALF, 1 << 21);
        assert_eq!(clip8(HALF + 200 * ONE), 200);
        assert_eq!(clip8(-1), 0, "negative sums floor, then clamp to 0");
        assert_eq!(clip8(i32::MAX), 255);
    }

    #[test]
    fn weights_four_outputs_at_a_time_equal_them_one_by_one() {
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move |n: u32| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % u64::from(n)) as u32
        };
        let mut plans = Vec::new();
        for src in [1, 2, 3, 7, 31, 96, 224, 255, 256, 375, 500, 4000] {
            for out in [1, 2, 3, 4, 5, 96, 168, 224, 252, 256, 333, 1000] {
                plans.push(plan(src, out));
            }
        }
        // Random crops resized up and down (a random resized crop's), centre crops, and the
        // same from images decoded at a fraction of their size (fractional boxes).
        for _ in 0..2000 {
            let src = 2 + next(1500);
            let start = next(src - 1);
            let len = 1 + next(src - start);
            let crop = AxisPlan::crop_then_resize(start, len, 1 + next(400));
            plans.push(crop);
            let reduction = 1 << next(4);
            plans.push(crop.reduced(reduction, src.div_ceil(reduction)));
            let resized = 1 + next(600);
            plans.push(AxisPlan::center_crop(src, resized, 1 + next(resized)));
        }
        for filter in [Filter::Bilinear, Filter::Bicubic, Filter::Lanczos] {
            for p in &plans {
                let mut one = AxisCoefficients::default();
                let mut four = AxisCoefficients::default();
                one.convolution(p, |x| filter.weight(x), filter, false);
                four.convolution(p, |x| filter.weight(x), filter, vector_weights(filter));
                assert_eq!(one, four, "{filter:?} {p:?}");
                // The bounds alone, for the device's weights, are the same; the rule is the
                // loop's.
                let mut whole = AxisCoefficients::default();
                whole
                    .compute(p, Resampling::Filter(filter), Axis::X)
                    .expect("coefficients");
                let mut bounds = AxisCoefficients::default();
                bounds.compute_bounds(p, filter, Axis::X).expect("bounds");
                let alone = AxisCoefficients {
                    weights: whole.weights.clone(),
                    weights_on_device: None,
                    ..bounds.clone()
                };
                assert_eq!(alone, whole, "{filter:?} {p:?}");
                match WeightRule::takes(filter) && p.is_resampled() {
                    true => {
                        assert!(bounds.weights.is_empty());
                        let rule = bounds.weights_on_device.expect("a rule");
                        assert_eq!(rule, Convolution::of(p, filter).rule);
                        assert_eq!(rule.out_first, p.out_first);
                    }
                    false => assert_eq!(bounds, whole, "{filter:?} {p:?}"),
                }
            }
        }
    }

    #[test]
    fn weights_round_half_away_from_zero() {
        assert_eq!(to_fixed(1.0), ONE);
        assert_eq!(to_fixed(0.5 / f64::from(ONE)), 1);
        assert_eq!(to_fixed(-0.5 / f64::from(ONE)), -1);
        assert_eq!(to_fixed(0.49 / f64::from(ONE)), 0);
        assert_eq!(to_fixed(-0.0), 0);
    }

    #[test]
    fn bilinear_halving_averages_pairs() {
        // Scale 2: support 2, ksize 5; output 0 is centred on 1.0 and reads samples 0..3 with
        // weights 3/8, 3/8... normalised over the clamped taps.
        let bilinear = Resampling::Filter(Filter::Bilinear);
        let c = axis_coefficients(&plan(4, 2), bilinear, Axis::X).expect("plan");
        assert!(c.resampled);
        assert_eq!(c.taps, 5);
        assert_eq!(c.bounds, vec![(0, 3), (1, 3)]);
        let sum: i64 = c.weights[..5].iter().map(|&w| i64::from(w)).sum();
        assert!((sum - i64::from(ONE)).abs() <= 2);
    }

    #[test]
    fn an_unchanged_axis_is_copied() {
        let p = AxisPlan {
            src_offset: 3,
            src_len: 10,
            resized: 10,
            out_first: 2,
            out_len: 5,
            ..AxisPlan::default()
        };
        let lanczos = Resampling::Filter(Filter::Lanczos);
        let c = axis_coefficients(&p, lanczos, Axis::Y).expect("plan");
        assert!(!c.resampled);
        assert_eq!(c.taps, 1);
        assert_eq!(c.bounds, vec![(2, 1), (3, 1), (4, 1), (5, 1), (6, 1)]);
        assert!(c.weights.iter().all(|&w| w == ONE));
    }

    #[test]
    fn nearest_takes_the_sample_under_each_centre() {
        // 10 -> 4: step 2.5, positions 1.25, 3.75, 6.25, 8.75.
        let c = axis_coefficients(&plan(10, 4), Resampling::Nearest, Axis::X).expect("plan");
        assert_eq!(c.bounds, vec![(1, 1), (3, 1), (6, 1), (8, 1)]);
        // 3 -> 7 keeping outputs 2..5: positions (i + 0.5) * 3 / 7.
        let kept = AxisPlan {
            out_first: 2,
            out_len: 3,
            ..plan(3, 7)
        };
        let c = axis_coefficients(&kept, Resampling::Nearest, Axis::X).expect("plan");
        assert_eq!(c.bounds, vec![(1, 1), (1, 1), (1, 1)]);
        // A box (0.5, 5.5) of 6 samples to 2: positions 1.75 and 4.25.
        let boxed = AxisPlan {
            src_box: Some(SourceBox {
                start: 1,
                end: 11,
                divisor: 2,
            }),
            ..plan(6, 2)
        };
        let c = axis_coefficients(&boxed, Resampling::Nearest, Axis::X).expect("plan");
        assert_eq!(c.bounds, vec![(1, 1), (4, 1)]);
    }

    #[test]
    fn a_box_moves_the_filter_centres() {
        // The box (0.5, 4.5) of 6 samples resized to 4: scale 1, centres 1.0, 2.0, 3.0, 4.0:
        // bilinear takes half of each neighbour.
        let boxed = AxisPlan {
            src_box: Some(SourceBox {
                start: 1,
                end: 9,
                divisor: 2,
            }),
            ..plan(6, 4)
        };
        let c =
            axis_coefficients(&boxed, Resampling::Filter(Filter::Bilinear), Axis::X).expect("plan");
        assert_eq!(c.bounds[0], (0, 2));
        assert_eq!(&c.weights[..2], &[ONE / 2, ONE / 2]);
        assert_eq!(c.bounds[3], (3, 2));
    }
}
