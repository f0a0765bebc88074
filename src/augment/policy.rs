//! The automatic augmentation policies, as torchvision v2 defines them: the operations each may
//! choose, their magnitude bins (`torch.linspace` in float32, computed as PyTorch's CPU kernel
//! computes it) and signs, and how one image's operations are drawn, from the image's own
//! stream of draws, with torchvision's distributions.

use super::ops::{degrees, Op};
use crate::options::{Augment, RAND_AUGMENT_BINS};
use crate::random::Draws;

/// torchvision's transform ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Transform {
    Identity,
    ShearX,
    ShearY,
    TranslateX,
    TranslateY,
    Rotate,
    Brightness,
    Color,
    Contrast,
    Sharpness,
    Posterize,
    Solarize,
    AutoContrast,
    Equalize,
    Invert,
}

use Transform::*;

/// The augmentation spaces, in torchvision's dictionary order (the order an op index draws
/// from).
pub(crate) const WIDE_SPACE: [Transform; 14] = [
    Identity,
    ShearX,
    ShearY,
    TranslateX,
    TranslateY,
    Rotate,
    Brightness,
    Color,
    Contrast,
    Sharpness,
    Posterize,
    Solarize,
    AutoContrast,
    Equalize,
];

/// `RandAugment._AUGMENTATION_SPACE`: the same ids as TrivialAugmentWide's, narrower ranges.
pub(crate) const RAND_SPACE: [Transform; 14] = WIDE_SPACE;

/// Which table of ranges a transform's magnitudes come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ranges {
    /// TrivialAugmentWide's.
    Wide,
    /// RandAugment's and AutoAugment's.
    Standard,
}

/// `torch.linspace(start, end, steps)` in float32 as PyTorch's CPU kernel computes it: the step
/// `(end - start) / (steps - 1)`, then `start + step * i` (one fused multiply-add) for the first
/// half and `end - step * (steps - 1 - i)` for the rest.
pub(crate) fn linspace(start: f64, end: f64, steps: usize) -> Vec<f32> {
    let (start, end) = (start as f32, end as f32);
    if steps == 1 {
        return vec![start];
    }
    let step = (end - start) / (steps - 1) as f32;
    let half = steps / 2;
    (0..steps)
        .map(|i| {
            if i < half {
                step.mul_add(i as f32, start)
            } else {
                (-step).mul_add((steps - 1 - i) as f32, end)
            }
        })
        .collect()
}

/// `(8 - (torch.arange(bins) / ((bins - 1) / divisor))).round().int()`.
fn posterize_bits(bins: usize, divisor: f64) -> Vec<f32> {
    let d = ((bins - 1) as f64 / divisor) as f32;
    (0..bins)
        .map(|i| (8.0 - i as f32 / d).round_ties_even())
        .collect()
}

/// A transform's magnitudes over `bins` bins for an image of `width` x `height`, and whether
/// its sign is drawn; `None` for transforms without a magnitude.
pub(crate) fn magnitudes(
    t: Transform,
    ranges: Ranges,
    bins: usize,
    width: u32,
    height: u32,
) -> Option<(Vec<f32>, bool)> {
    let wide = ranges == Ranges::Wide;
    let signed = |v: Vec<f32>| Some((v, true));
    match t {
        Identity | AutoContrast | Equalize | Invert => None,
        ShearX | ShearY => signed(linspace(0.0, if wide { 0.99 } else { 0.3 }, bins)),
        TranslateX => signed(if wide {
            linspace(0.0, 32.0, bins)
        } else {
            linspace(0.0, 150.0 / 331.0 * f64::from(width), bins)
        }),
        TranslateY => signed(if wide {
            linspace(0.0, 32.0, bins)
        } else {
            linspace(0.0, 150.0 / 331.0 * f64::from(height), bins)
        }),
        Rotate => signed(linspace(0.0, if wide { 135.0 } else { 30.0 }, bins)),
        Brightness | Color | Contrast | Sharpness => {
            signed(linspace(0.0, if wide { 0.99 } else { 0.9 }, bins))
        }
        Posterize => Some((posterize_bits(bins, if wide { 6.0 } else { 4.0 }), false)),
        Solarize => Some((linspace(1.0, 0.0, bins), false)),
    }
}

/// `_apply_image_or_video_transform(image, transform_id, magnitude)`: the functional call a
/// transform makes at `magnitude` (`None` for `Identity`).
pub(crate) fn call(t: Transform, magnitude: f64, fill: [u8; 3]) -> Option<Op> {
    Some(match t {
        Identity => return None,
        ShearX => Op::Shear {
            x: degrees(magnitude.atan()),
            y: 0.0,
            fill,
        },
        ShearY => Op::Shear {
            x: 0.0,
            y: degrees(magnitude.atan()),
            fill,
        },
        // int(magnitude): toward zero.
        TranslateX => Op::Translate {
            x: magnitude.trunc() as i32,
            y: 0,
            fill,
        },
        TranslateY => Op::Translate {
            x: 0,
            y: magnitude.trunc() as i32,
            fill,
        },
        Rotate => Op::Rotate {
            angle: magnitude,
            fill,
        },
        Brightness => Op::Brightness(1.0 + magnitude),
        Color => Op::Saturation(1.0 + magnitude),
        Contrast => Op::Contrast(1.0 + magnitude),
        Sharpness => Op::Sharpness(1.0 + magnitude),
        Posterize => Op::Posterize(magnitude as u8),
        Solarize => Op::Solarize(255.0 * magnitude),
        AutoContrast => Op::AutoContrast,
        Equalize => Op::Equalize,
        Invert => Op::Invert,
    })
}

/// `torch.rand(()) <= p`: a float32 draw against `p` in float32.
fn chance(draws: &mut Draws, p: f64) -> bool {
    draws.uniform_f32(0.0, 1.0) <= p as f32
}

/// The magnitude of bin `bin` of `t`, its sign drawn when the transform is signed, as
/// torchvision does (`float(magnitudes[bin])`, negated when `torch.rand(()) <= 0.5`).
fn signed_magnitude(
    t: Transform,
    ranges: Ranges,
    bins: usize,
    bin: Option<usize>,
    size: (u32, u32),
    draws: &mut Draws,
) -> f64 {
    match magnitudes(t, ranges, bins, size.0, size.1) {
        Some((values, signed)) => {
            let bin = bin.unwrap_or_else(|| draws.below(bins as u64) as usize);
            let mut m = f64::from(values[bin]);
            if signed && chance(draws, 0.5) {
                m = -m;
            }
            m
        }
        None => 0.0,
    }
}

/// `AutoAugmentPolicy.IMAGENET`'s 25 sub-policies: (transform, probability, magnitude bin).
pub(crate) const IMAGENET_POLICY: [[(Transform, f64, Option<usize>); 2]; 25] = [
    [(Posterize, 0.4, Some(8)), (Rotate, 0.6, Some(9))],
    [(Solarize, 0.6, Some(5)), (AutoContrast, 0.6, None)],
    [(Equalize, 0.8, None), (Equalize, 0.6, None)],
    [(Posterize, 0.6, Some(7)), (Posterize, 0.6, Some(6))],
    [(Equalize, 0.4, None), (Solarize, 0.2, Some(4))],
    [(Equalize, 0.4, None), (Rotate, 0.8, Some(8))],
    [(Solarize, 0.6, Some(3)), (Equalize, 0.6, None)],
    [(Posterize, 0.8, Some(5)), (Equalize, 1.0, None)],
    [(Rotate, 0.2, Some(3)), (Solarize, 0.6, Some(8))],
    [(Equalize, 0.6, None), (Posterize, 0.4, Some(6))],
    [(Rotate, 0.8, Some(8)), (Color, 0.4, Some(0))],
    [(Rotate, 0.4, Some(9)), (Equalize, 0.6, None)],
    [(Equalize, 0.0, None), (Equalize, 0.8, None)],
    [(Invert, 0.6, None), (Equalize, 1.0, None)],
    [(Color, 0.6, Some(4)), (Contrast, 1.0, Some(8))],
    [(Rotate, 0.8, Some(8)), (Color, 1.0, Some(2))],
    [(Color, 0.8, Some(8)), (Solarize, 0.8, Some(7))],
    [(Sharpness, 0.4, Some(7)), (Invert, 0.6, None)],
    [(ShearX, 0.6, Some(5)), (Equalize, 1.0, None)],
    [(Color, 0.4, Some(0)), (Equalize, 0.6, None)],
    [(Equalize, 0.4, None), (Solarize, 0.2, Some(4))],
    [(Solarize, 0.6, Some(5)), (AutoContrast, 0.6, None)],
    [(Invert, 0.6, None), (Equalize, 1.0, None)],
    [(Color, 0.6, Some(4)), (Contrast, 1.0, Some(8))],
    [(Equalize, 0.8, None), (Equalize, 0.6, None)],
];

/// AutoAugment's magnitude bins.
const AUTO_AUGMENT_BINS: usize = 10;

/// TrivialAugmentWide's magnitude bins.
const WIDE_BINS: usize = 31;

/// What one image's policy draws, in order: each chosen transform and its signed magnitude
/// (the draws torchvision makes, in its order), and the calls they make.
pub(crate) fn draw_policy(
    policy: Augment,
    width: u32,
    height: u32,
    fill: [u8; 3],
    draws: &mut Draws,
    out: &mut Vec<Op>,
    chosen: Option<&mut Vec<(Transform, f64)>>,
) {
    let size = (width, height);
    let mut picked = Vec::new();
    match policy {
        Augment::None => {}
        Augment::TrivialAugmentWide => {
            let t = WIDE_SPACE[draws.below(WIDE_SPACE.len() as u64) as usize];
            let m = signed_magnitude(t, Ranges::Wide, WIDE_BINS, None, size, draws);
            picked.push((t, m));
        }
        Augment::RandAugment { num_ops, magnitude } => {
            for _ in 0..num_ops {
                let t = RAND_SPACE[draws.below(RAND_SPACE.len() as u64) as usize];
                let m = signed_magnitude(
                    t,
                    Ranges::Standard,
                    RAND_AUGMENT_BINS,
                    Some(magnitude as usize),
                    size,
                    draws,
                );
                picked.push((t, m));
            }
        }
        Augment::AutoAugment => {
            let sub = IMAGENET_POLICY[draws.below(IMAGENET_POLICY.len() as u64) as usize];
            for (t, p, bin) in sub {
                if !chance(draws, p) {
                    continue;
                }
                let m = match bin {
                    Some(bin) => signed_magnitude(
                        t,
                        Ranges::Standard,
                        AUTO_AUGMENT_BINS,
                        Some(bin),
                        size,
                        draws,
                    ),
                    None => 0.0,
                };
                picked.push((t, m));
            }
        }
    }
    out.extend(picked.iter().filter_map(|&(t, m)| call(t, m, fill)));
    if let Some(chosen) = chosen {
        chosen.extend(picked);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_print_and_parse() {
        for a in [
            Augment::None,
            Augment::TrivialAugmentWide,
            Augment::RandAugment {
                num_ops: 3,
                magnitude: 15,
            },
            Augment::AutoAugment,
        ] {
            assert_eq!(a.to_string().parse::<Augment>(), Ok(a));
        }
        assert_eq!(
            "rand-augment".parse::<Augment>(),
            Ok(Augment::RandAugment {
                num_ops: 2,
                magnitude: 9
            })
        );
        assert_eq!(
            "Trivial_Augment_Wide".parse::<Augment>(),
            Ok(Augment::TrivialAugmentWide)
        );
        for bad in [
            "rand-augment:2",
            "rand-augment:a:b",
            "augmix",
            "auto-augment:cifar10",
        ] {
            let e = bad.parse::<Augment>().expect_err(bad);
            assert!(e.to_string().contains("trivial-augment-wide"), "{e}");
        }
    }

    #[test]
    fn linspace_is_pytorchs() {
        // Values torch.linspace gives on float32 (torch 2.11, x86-64 CPU).
        let t = linspace(0.0, 32.0, 31);
        assert_eq!(t[15], 15.999_999);
        assert_eq!(t[17], 18.133_333);
        let t = linspace(0.0, 135.0, 31);
        assert_eq!(t[20], 90.0);
        assert_eq!(t[30], 135.0);
        let t = linspace(1.0, 0.0, 10);
        assert_eq!(t[3], 0.666_666_7);
        assert_eq!(
            posterize_bits(31, 6.0)
                .iter()
                .map(|&b| b as u8)
                .collect::<Vec<_>>(),
            [
                8, 8, 8, 7, 7, 7, 7, 7, 6, 6, 6, 6, 6, 5, 5, 5, 5, 5, 4, 4, 4, 4, 4, 3, 3, 3, 3, 3,
                2, 2, 2
            ]
        );
        assert_eq!(
            posterize_bits(10, 4.0)
                .iter()
                .map(|&b| b as u8)
                .collect::<Vec<_>>(),
            [8, 8, 7, 7, 6, 6, 5, 5, 4, 4]
        );
    }
}
