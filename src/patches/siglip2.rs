//! SigLIP2 NaFlex's sizes: transformers' `get_image_size_for_max_num_patches`
//! (`models/siglip2/image_processing_pil_siglip2.py`), a bisection on the scale in `f64`:
//!
//! ```text
//! def scaled(scale, size): max(patch, ceil(size * scale / patch) * patch)
//! lo, hi = eps / 10, 100.0                      # eps = 1e-5
//! while hi - lo >= eps:
//!     scale = (lo + hi) / 2
//!     if (scaled(scale, h) / patch) * (scaled(scale, w) / patch) <= max_num_patches: lo = scale
//!     else: hi = scale
//! return scaled(lo, h), scaled(lo, w)
//! ```

/// The bisection's tolerance (`eps` of the reference).
const EPS: f64 = 1e-5;

/// `get_image_size_for_max_num_patches(height, width, patch, max_patches)`: the resized
/// `(height, width)`, multiples of `patch`, at least one patch each, and at most `max_patches`
/// patches in all (the bisection's last feasible scale).
pub fn size_for_max_patches(height: u32, width: u32, patch: u32, max_patches: u32) -> (u32, u32) {
    let p = f64::from(patch);
    let scaled = |scale: f64, size: u32| -> u32 {
        let v = ((f64::from(size) * scale) / p).ceil() * p;
        v.max(p) as u32
    };
    let (mut lo, mut hi) = (EPS / 10.0, 100.0);
    while hi - lo >= EPS {
        let scale = (lo + hi) / 2.0;
        let (th, tw) = (scaled(scale, height), scaled(scale, width));
        let patches = (f64::from(th) / p) * (f64::from(tw) / p);
        if patches <= f64::from(max_patches) {
            lo = scale;
        } else {
            hi = scale;
        }
    }
    (scaled(lo, height), scaled(lo, width))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_match_transformers() {
        // Printed by transformers 5.23's get_image_size_for_max_num_patches (patch 16).
        let cases = [
            ((300, 451), 256, (208, 304)),
            ((37, 53), 256, (208, 304)),
            ((1, 1), 256, (112, 112)),
            ((3000, 4000), 256, (224, 288)),
            ((50, 10000), 256, (16, 3200)),
            ((10000, 50), 256, (3200, 16)),
            ((14, 14), 256, (256, 256)),
            ((1080, 1920), 256, (192, 336)),
            ((13, 2600), 256, (16, 3200)),
            ((300, 451), 1024, (416, 624)),
            ((37, 53), 1024, (416, 608)),
            ((3000, 4000), 1024, (432, 576)),
            ((50, 10000), 1024, (32, 6400)),
            ((1080, 1920), 1024, (384, 672)),
        ];
        for ((h, w), n, want) in cases {
            assert_eq!(size_for_max_patches(h, w, 16, n), want, "{h}x{w} at {n}");
        }
    }
}
