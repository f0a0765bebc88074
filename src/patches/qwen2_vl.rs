//! Qwen2-VL's sizes: transformers' `smart_resize` (`models/qwen2_vl/image_processing_qwen2_vl.py`,
//! copied into the PIL processor), float for float.
//!
//! ```text
//! if max(h, w) / min(h, w) > 200: raise ValueError
//! h_bar = round(h / factor) * factor            # Python's round: ties to even
//! w_bar = round(w / factor) * factor
//! if h_bar * w_bar > max_pixels:
//!     beta = sqrt((h * w) / max_pixels)
//!     h_bar = max(factor, floor(h / beta / factor) * factor)
//!     w_bar = max(factor, floor(w / beta / factor) * factor)
//! elif h_bar * w_bar < min_pixels:
//!     beta = sqrt(min_pixels / (h * w))
//!     h_bar = ceil(h * beta / factor) * factor
//!     w_bar = ceil(w * beta / factor) * factor
//! ```
//!
//! Every division is Python's true division of two integers below 2^53 (one correctly rounded
//! `f64` division), so the same `f64` operations give the same sizes.

use super::PatchError;

/// The largest aspect ratio `smart_resize` accepts (it refuses `max / min > 200`).
pub const MAX_ASPECT_RATIO: f64 = 200.0;

/// `smart_resize(height, width, factor, min_pixels, max_pixels)`: the resized `(height, width)`,
/// both multiples of `factor`.
pub fn smart_resize(
    height: u32,
    width: u32,
    factor: u32,
    min_pixels: u64,
    max_pixels: u64,
) -> Result<(u32, u32), PatchError> {
    if height == 0 || width == 0 {
        return Err(PatchError::Empty);
    }
    let (h, w, f) = (f64::from(height), f64::from(width), u64::from(factor));
    let ratio = h.max(w) / h.min(w);
    if ratio > MAX_ASPECT_RATIO {
        return Err(PatchError::AspectRatio {
            width,
            height,
            ratio,
            limit: MAX_ASPECT_RATIO,
        });
    }
    let round_to = |v: u32| (f64::from(v) / f as f64).round_ties_even() as u64 * f;
    let (mut h_bar, mut w_bar) = (round_to(height), round_to(width));
    let area = u64::from(height) * u64::from(width);
    if h_bar * w_bar > max_pixels {
        let beta = (area as f64 / max_pixels as f64).sqrt();
        h_bar = f.max((h / beta / f as f64).floor() as u64 * f);
        w_bar = f.max((w / beta / f as f64).floor() as u64 * f);
    } else if h_bar * w_bar < min_pixels {
        let beta = (min_pixels as f64 / area as f64).sqrt();
        h_bar = (h * beta / f as f64).ceil() as u64 * f;
        w_bar = (w * beta / f as f64).ceil() as u64 * f;
    }
    let side = |v: u64| u32::try_from(v).map_err(|_| PatchError::TooLarge { side: v });
    Ok((side(h_bar)?, side(w_bar)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: u64 = 56 * 56;
    const MAX: u64 = 28 * 28 * 1280;

    #[test]
    fn sizes_match_transformers() {
        // Values printed by transformers 5.23's smart_resize with the processor's defaults.
        let cases = [
            ((300, 451), (308, 448)),
            ((37, 53), (56, 84)),
            ((1, 1), (56, 56)),
            ((3000, 4000), (840, 1148)),
            ((50, 10000), (56, 9996)),
            ((10000, 50), (9996, 56)),
            ((14, 14), (56, 56)),
            ((42, 42), (56, 56)),
            ((70, 70), (56, 56)), // round(2.5) = 2: ties to even
            ((1080, 1920), (728, 1316)),
            ((1, 200), (28, 812)),
            ((13, 2600), (28, 812)),
        ];
        for ((h, w), want) in cases {
            assert_eq!(
                smart_resize(h, w, 28, MIN, MAX).expect("size"),
                want,
                "{h}x{w}"
            );
        }
    }

    #[test]
    fn extreme_aspect_ratios_are_refused_as_the_reference_refuses_them() {
        assert!(
            smart_resize(50, 10_000, 28, MIN, MAX).is_ok(),
            "exactly 200 passes"
        );
        let err = smart_resize(49, 10_000, 28, MIN, MAX).expect_err("over 200");
        assert!(
            matches!(err, PatchError::AspectRatio { ratio, .. } if ratio > 200.0),
            "{err}"
        );
        assert_eq!(smart_resize(0, 10, 28, MIN, MAX), Err(PatchError::Empty));
    }
}
