//! PyTorch's `uint8` antialiased resampling (`aten/src/ATen/native/cpu/UpSampleKernel.cpp`),
//! which torchvision's `resize` of a `uint8` tensor runs on the CPU (transformers' torchvision
//! processors): the same filter support and centring as Pillow, but
//!
//! - the bicubic filter written as `((a + 2) x - (a + 3)) x x + 1` and
//!   `((a x - 5 a) x + 8 a) x - 4 a` (`cubic_convolution1` / `2`), a different order of `f64`
//!   operations from Pillow's;
//! - the normalized weights rounded to 16-bit integers at a precision chosen per axis: the
//!   largest `p < 22` whose `round(wt_max * 2^(p + 1))` stays below 2^15
//!   (`_compute_index_ranges_int16_weights`), each output `clamp((2^(p-1) + sum) >> p, 0, 255)`;
//! - the width always resampled first (`upsample_avx_bilinear_bicubic_uint8`).
//!
//! The weights are handed to the passes as Pillow-style 22-bit weights, `w16 << (22 - p)`:
//! `(2^21 + sum * 2^(22 - p)) >> 22` is `(2^(p-1) + sum) >> p` exactly, so the same passes (AVX2
//! or portable) run them.

use super::coefficients::{AxisCoefficients, PRECISION_BITS};
use super::filter::{Filter, Resampling};
use super::plan::{Axis, AxisPlan, PlanError};

/// `HelperInterpCubic::aa_filter` (a = -0.5) and `HelperInterpLinear::aa_filter`.
fn torch_filter(filter: Filter, x: f64) -> Option<f64> {
    match filter {
        Filter::Bicubic => {
            const A: f64 = -0.5;
            let x = x.abs();
            Some(if x < 1.0 {
                ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
            } else if x < 2.0 {
                ((A * x - 5.0 * A) * x + 8.0 * A) * x - 4.0 * A
            } else {
                0.0
            })
        }
        Filter::Bilinear => {
            let x = x.abs();
            Some(if x < 1.0 { 1.0 - x } else { 0.0 })
        }
        _ => None,
    }
}

/// The coefficients of `plan`'s kept outputs under PyTorch's `uint8` antialiased `filter`
/// (bilinear or bicubic), into `c`. The plan's region is resized as a whole (no box).
pub(super) fn compute(
    c: &mut AxisCoefficients,
    plan: &AxisPlan,
    filter: Filter,
    axis: Axis,
) -> Result<(), PlanError> {
    plan.check_own(axis)?;
    if !plan.is_resampled() || plan.src_box.is_some() || torch_filter(filter, 0.0).is_none() {
        // An unchanged axis is copied (torchvision returns the image as it is); a box or
        // another filter has no PyTorch counterpart here.
        if plan.is_resampled() {
            return Err(PlanError::BadBox { axis });
        }
        return c.compute(plan, Resampling::Filter(filter), axis);
    }
    let (input, output) = (plan.src_len as i64, plan.resized);
    let scale = input as f64 / f64::from(output);
    let support = if scale >= 1.0 {
        filter.support() * scale
    } else {
        filter.support()
    };
    let taps = support.ceil() as usize * 2 + 1;
    let invscale = if scale >= 1.0 { 1.0 / scale } else { 1.0 };
    let kept = plan.out_first..plan.out_first + plan.out_len;
    // Every output's weights first: the precision depends on the largest of the whole axis.
    let mut real = vec![0.0f64; output as usize * taps];
    let mut bounds = Vec::with_capacity(output as usize);
    let mut wt_max = 0.0f64;
    for (i, row) in real.chunks_exact_mut(taps).enumerate() {
        let center = scale * (i as f64 + 0.5);
        let xmin = ((center - support + 0.5) as i64).max(0);
        let xsize = (((center + support + 0.5) as i64).min(input) - xmin).clamp(0, taps as i64);
        let mut total = 0.0;
        for (j, w) in row[..xsize as usize].iter_mut().enumerate() {
            let x = (j as i64 + xmin) as f64 - center + 0.5;
            *w = torch_filter(filter, x * invscale).unwrap_or(0.0);
            total += *w;
        }
        if total != 0.0 {
            for w in &mut row[..xsize as usize] {
                *w /= total;
                wt_max = wt_max.max(*w);
            }
        }
        bounds.push((xmin as u32, xsize as u32));
    }
    let mut precision = 0u32;
    while precision < 22 {
        let next = (0.5 + wt_max * f64::from(1u32 << (precision + 1))) as i32;
        if next >= 1 << 15 {
            break;
        }
        precision += 1;
    }
    let to_i16 = |w: f64| {
        let v = w * f64::from(1u32 << precision);
        (if v < 0.0 {
            (-0.5 + v) as i32
        } else {
            (0.5 + v) as i32
        }) as i16
    };
    let widen = PRECISION_BITS - precision;
    c.resampled = true;
    c.taps = taps;
    c.bounds.clear();
    c.weights.clear();
    for i in kept {
        let row = &real[i as usize * taps..(i as usize + 1) * taps];
        c.bounds.push(bounds[i as usize]);
        c.weights
            .extend(row.iter().map(|&w| i32::from(to_i16(w)) << widen));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_are_pytorchs_16_bit_ones_widened() {
        // 1000 -> 300 bicubic: PyTorch's largest weight at scale 3.33 is about 0.15, so the
        // precision is the largest p with round(0.15 * 2^(p+1)) < 2^15: p = 16.
        let mut c = AxisCoefficients::default();
        compute(
            &mut c,
            &AxisPlan::stretch(1000, 300),
            Filter::Bicubic,
            Axis::X,
        )
        .expect("plan");
        assert!(c.resampled);
        let low_bits = c.weights.iter().fold(0, |acc, w| acc | w);
        assert_eq!(low_bits.trailing_zeros(), PRECISION_BITS - 16);
        // An unchanged axis is copied; a box is refused.
        compute(&mut c, &AxisPlan::stretch(30, 30), Filter::Bicubic, Axis::Y).expect("copy");
        assert!(!c.resampled);
    }
}
