//! The references' float arithmetic from a `u8` sample to a token value, operation for
//! operation, so the values are theirs bit for bit (not `x * a + b`, which rounds differently).
//!
//! - transformers' PIL processors ([`Arithmetic::NumpyRescale`]): `rescale` is
//!   `image.astype(float64) * (1 / 255)` cast to `float32`; `normalize` then computes
//!   `(image - mean) / std` in `float32`, with `mean` and `std` as `float32` arrays;
//! - transformers' torchvision processors ([`Arithmetic::TorchFused`]): rescale and normalize are
//!   fused: `mean' = tensor(mean) * (1 / rescale_factor)` (a `float32` product: the factor is
//!   255.0 as a float), likewise `std'`, then `(float32(x) - mean') / std'` in `float32`;
//! - timm's NaFlex prefetcher ([`Arithmetic::TimmPrefetcher`]): `mean' = float32(mean * 255)`
//!   (the product in Python's `float64`), likewise `std'`, then `(float32(x) - mean') / std'`.
//!
//! Each comes down to `rescale?(x)` then one `float32` subtraction and one `float32` division
//! per value ([`NormalizeConstants`]), computed here with IEEE rounding and no fused multiply-add
//! for each of the 768 (channel, byte) pairs ([`NormalizeConstants::table`]): the CPU rendition
//! reads that table, and `kernels/patches.cu` reads it uploaded.

use crate::options::Arithmetic;

/// `rescale_factor` of transformers' processors: Python's `1 / 255`.
pub const RESCALE: f64 = 1.0 / 255.0;

/// The per-channel constants of one arithmetic and mean/std: a token value is
/// `(v - sub[c]) / div[c]` in `float32`, `v = float32(x * RESCALE)` when `rescale`, else
/// `float32(x)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NormalizeConstants {
    /// Whether `x` is rescaled in `float64` first.
    pub rescale: bool,
    /// Subtracted, per RGB channel.
    pub sub: [f32; 3],
    /// Divided by, per RGB channel.
    pub div: [f32; 3],
}

impl NormalizeConstants {
    /// The constants of `arithmetic` for `mean` and `std` (0..1 units, RGB, as the reference's
    /// Python floats).
    pub fn new(arithmetic: Arithmetic, mean: [f64; 3], std: [f64; 3]) -> NormalizeConstants {
        let map = |f: &dyn Fn(f64) -> f32, v: [f64; 3]| v.map(f);
        match arithmetic {
            Arithmetic::NumpyRescale => NormalizeConstants {
                rescale: true,
                sub: map(&|m| m as f32, mean),
                div: map(&|s| s as f32, std),
            },
            Arithmetic::TorchFused => {
                // `1.0 / rescale_factor` is a Python float; torch multiplies a float32 tensor
                // by it as float32 (255.0 exactly).
                let factor = (1.0 / RESCALE) as f32;
                NormalizeConstants {
                    rescale: false,
                    sub: map(&|m| m as f32 * factor, mean),
                    div: map(&|s| s as f32 * factor, std),
                }
            }
            Arithmetic::TimmPrefetcher => NormalizeConstants {
                rescale: false,
                sub: map(&|m| (m * 255.0) as f32, mean),
                div: map(&|s| (s * 255.0) as f32, std),
            },
        }
    }

    /// The token value of sample `x` of RGB channel `c`.
    pub fn value(&self, c: usize, x: u8) -> f32 {
        let v = if self.rescale {
            (f64::from(x) * RESCALE) as f32
        } else {
            f32::from(x)
        };
        (v - self.sub[c]) / self.div[c]
    }

    /// Every value: `table[c][x]`.
    pub fn table(&self) -> [[f32; 256]; 3] {
        let mut t = [[0.0; 256]; 3];
        for (c, row) in t.iter_mut().enumerate() {
            for (x, v) in row.iter_mut().enumerate() {
                *v = self.value(c, x as u8);
            }
        }
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_reference_rounds_its_own_way() {
        let mean = [0.48145466, 0.4578275, 0.40821073];
        let std = [0.26862954, 0.26130258, 0.27577711];
        let numpy = NormalizeConstants::new(Arithmetic::NumpyRescale, mean, std);
        let fused = NormalizeConstants::new(Arithmetic::TorchFused, mean, std);
        // float32((x / 255 as f64) - mean) / std: the value NumPy gives for x = 0 and 255.
        assert_eq!(numpy.value(0, 0), (0.0 - mean[0] as f32) / std[0] as f32);
        let v = (255.0 * RESCALE) as f32;
        assert_eq!(numpy.value(2, 255), (v - mean[2] as f32) / std[2] as f32);
        // The fused form is the same formula in other units, and differs from it in the last
        // bits somewhere.
        let differs = (0..=255u8).any(|x| numpy.value(0, x) != fused.value(0, x));
        assert!(differs);
        for x in 0..=255u8 {
            assert!((numpy.value(1, x) - fused.value(1, x)).abs() < 1e-5);
        }
        let timm = NormalizeConstants::new(
            Arithmetic::TimmPrefetcher,
            [0.485, 0.456, 0.406],
            [0.229, 0.224, 0.225],
        );
        assert_eq!(timm.sub[0], (0.485f64 * 255.0) as f32);
        assert_eq!(timm.table()[1][7], timm.value(1, 7));
    }
}
