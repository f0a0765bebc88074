//! Several views of each image, cut from one decode: the multi-crop recipes of self-supervised
//! training. A [`Views`] is a list of [`ViewGroup`]s; each group gives `count` views of one
//! output size, each with its own `RandomResizedCrop`, flip and colour operations, applied as
//! torchvision applies them to a PIL image (Pillow's arithmetic). The presets
//! [`Views::dinov2`] and [`Views::simclr`] reproduce their references' transforms.

use std::fmt;
use std::str::FromStr;

use super::{DrawRange, Interpolation, ParseOptionError, ResizeOptions, RANDOM_CROP_RATIO};
use crate::error::{Error, Result};

/// torchvision's `GaussianBlur(kernel_size, sigma=(min, max))` on a PIL image, applied with
/// chance `p`: `sigma` drawn uniformly from the range, the image blurred with the square
/// `kernel_size` x `kernel_size` Gaussian kernel, reflect padding.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ViewBlur {
    /// Chance the view is blurred.
    pub p: f64,
    /// The kernel's side, odd.
    pub kernel_size: u32,
    /// The range `sigma` is drawn from.
    pub sigma: DrawRange,
}

/// What one group's views do after their crop, in torchvision's order: the flip, the colour
/// jitter (applied with chance `jitter_p`), the grayscale, the blur, the solarize.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ViewOps {
    /// `RandomHorizontalFlip(p)`.
    pub flip: f64,
    /// `ColorJitter(brightness, contrast, saturation, hue)` on a PIL image (Pillow's
    /// `ImageEnhance` and its HSV conversion), in a random order.
    pub jitter: super::ColorJitter,
    /// `RandomApply([ColorJitter(...)], p)`: the chance the jitter is applied.
    pub jitter_p: f64,
    /// `RandomGrayscale(p)`.
    pub grayscale: f64,
    /// Gaussian blur, if any.
    pub blur: Option<ViewBlur>,
    /// `RandomSolarize(threshold=128, p)`: the chance.
    pub solarize: f64,
}

impl ViewOps {
    /// No operation at all, not even the flip.
    pub const fn none() -> ViewOps {
        ViewOps {
            flip: 0.0,
            jitter: super::ColorJitter {
                brightness: 0.0,
                contrast: 0.0,
                saturation: 0.0,
                hue: 0.0,
            },
            jitter_p: 0.0,
            grayscale: 0.0,
            blur: None,
            solarize: 0.0,
        }
    }
}

impl Default for ViewOps {
    fn default() -> ViewOps {
        ViewOps::none()
    }
}

/// `count` views of `size` x `size` pixels, each cut with `RandomResizedCrop(size, scale,
/// ratio, interpolation)` and then given its [`ViewOps`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ViewGroup {
    /// Output side (square views).
    pub size: u32,
    /// The crop's area as a share of the image's.
    pub scale: DrawRange,
    /// The crop's aspect ratio (width / height).
    pub ratio: DrawRange,
    /// The resampling filter.
    pub interpolation: Interpolation,
    /// Views in the group.
    pub count: u32,
    /// What follows the crop.
    pub ops: ViewOps,
}

impl ViewGroup {
    /// `count` views of `size` with torchvision's `RandomResizedCrop` defaults (scale 0.08 to
    /// 1, ratio 3/4 to 4/3, bilinear) and no operation.
    pub fn new(size: u32, count: u32) -> ViewGroup {
        ViewGroup {
            size,
            scale: DrawRange::new(0.08, 1.0),
            ratio: RANDOM_CROP_RATIO,
            interpolation: Interpolation::Bilinear,
            count,
            ops: ViewOps::none(),
        }
    }

    fn check(&self, at: usize) -> Result<()> {
        let wrong = |reason: String| Err(Error::invalid("views", format!("group {at}: {reason}")));
        if self.size == 0 || self.size > 8192 {
            return wrong(format!("size {}: must be 1 to 8192", self.size));
        }
        if self.count == 0 || self.count > 64 {
            return wrong(format!("count {}: must be 1 to 64", self.count));
        }
        let range_ok = |r: DrawRange, high: f64| {
            r.min.is_finite() && r.max.is_finite() && 0.0 < r.min && r.min <= r.max && r.max <= high
        };
        if !range_ok(self.scale, 1.0) {
            return wrong(format!(
                "scale {}..{}: need 0 < min <= max <= 1",
                self.scale.min, self.scale.max
            ));
        }
        if !range_ok(self.ratio, f64::MAX) {
            return wrong(format!(
                "ratio {}..{}: need 0 < min <= max",
                self.ratio.min, self.ratio.max
            ));
        }
        let o = &self.ops;
        for (name, p) in [
            ("flip", o.flip),
            ("jitter_p", o.jitter_p),
            ("grayscale", o.grayscale),
            ("solarize", o.solarize),
        ] {
            if !(0.0..=1.0).contains(&p) {
                return wrong(format!("{name} {p}: not a chance from 0 to 1"));
            }
        }
        o.jitter.check()?;
        if let Some(b) = &o.blur {
            if !(0.0..=1.0).contains(&b.p) {
                return wrong(format!("blur p {}: not a chance from 0 to 1", b.p));
            }
            if b.kernel_size % 2 == 0 || b.kernel_size > 255 {
                return wrong(format!(
                    "blur kernel_size {}: must be odd, up to 255",
                    b.kernel_size
                ));
            }
            if !range_ok(b.sigma, f64::MAX) {
                return wrong(format!(
                    "blur sigma {}..{}: need 0 < min <= max",
                    b.sigma.min, b.sigma.max
                ));
            }
            // Reflect padding needs more pixels than half the kernel.
            if self.size <= b.kernel_size / 2 {
                return wrong(format!(
                    "size {} too small for a blur kernel of {}",
                    self.size, b.kernel_size
                ));
            }
        }
        Ok(())
    }
}

/// A named set of view groups.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ViewsPreset {
    /// DINOv2's `DataAugmentationDINO` ([`Views::dinov2`]).
    Dinov2,
    /// SimCLR's two views ([`Views::simclr`]).
    Simclr,
}

impl fmt::Display for ViewsPreset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ViewsPreset::Dinov2 => "dinov2",
            ViewsPreset::Simclr => "simclr",
        })
    }
}

impl FromStr for ViewsPreset {
    type Err = ParseOptionError;

    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "dinov2" => Ok(ViewsPreset::Dinov2),
            "simclr" => Ok(ViewsPreset::Simclr),
            _ => Err(ParseOptionError::new("views", s, "dinov2, simclr")),
        }
    }
}

/// Views of each image: the groups in order, their views numbered from 0 across the groups
/// (view `k` draws from (seed, epoch, index, k)), and the seed.
#[derive(Debug, Clone, PartialEq)]
pub struct Views {
    /// The groups, in order.
    pub groups: Vec<ViewGroup>,
    /// The seed every view's draws start from.
    pub seed: u64,
    /// The Pillow version `(major, minor)` whose resize rounding the views reproduce (its pass
    /// order changed in 13.0); as [`ResizeOptions::pillow_version`], 13.0 by default.
    pub pillow_version: (u32, u32),
}

/// DINOv2's colour operations before the blur: `RandomApply([ColorJitter(0.4, 0.4, 0.2, 0.1)],
/// p=0.8)`, `RandomGrayscale(p=0.2)`, the flip of `RandomHorizontalFlip(p=0.5)`.
const fn dinov2_ops(blur_p: f64, solarize: f64) -> ViewOps {
    ViewOps {
        flip: 0.5,
        jitter: super::ColorJitter {
            brightness: 0.4,
            contrast: 0.4,
            saturation: 0.2,
            hue: 0.1,
        },
        jitter_p: 0.8,
        grayscale: 0.2,
        blur: Some(ViewBlur {
            p: blur_p,
            kernel_size: 9,
            sigma: DrawRange::new(0.1, 2.0),
        }),
        solarize,
    }
}

impl Views {
    /// Views of `groups`, seed 0.
    pub fn new(groups: Vec<ViewGroup>) -> Views {
        Views {
            groups,
            seed: 0,
            pillow_version: ResizeOptions::default().pillow_version,
        }
    }

    /// The preset `preset`.
    pub fn preset(preset: ViewsPreset) -> Views {
        match preset {
            ViewsPreset::Dinov2 => Views::dinov2(),
            ViewsPreset::Simclr => Views::simclr(),
        }
    }

    /// DINOv2's `DataAugmentationDINO(global_crops_scale=(0.32, 1.0), local_crops_scale=(0.05,
    /// 0.32), local_crops_number=8)` (its training configs' values): two global views of 224
    /// and eight local views of 96, bicubic, each flipped with chance 0.5, jittered
    /// (`ColorJitter(0.4, 0.4, 0.2, 0.1)`) with chance 0.8, gray with chance 0.2; then the
    /// blur (`GaussianBlur(kernel_size=9, sigma=(0.1, 2.0))`) and, on the second global view,
    /// `RandomSolarize(128, p=0.2)`.
    ///
    /// The blur's chances are what DINOv2 runs, not what its code names: its `GaussianBlur(p)`
    /// is `RandomApply(..., p=1 - p)`, so the first global view (named `p=1.0`) is never
    /// blurred, the second (named `p=0.1`) is blurred with chance 0.9, the local ones with 0.5.
    pub fn dinov2() -> Views {
        let group = |size, scale, count, ops| ViewGroup {
            size,
            scale,
            ratio: RANDOM_CROP_RATIO,
            interpolation: Interpolation::Bicubic,
            count,
            ops,
        };
        let global = DrawRange::new(0.32, 1.0);
        Views::new(vec![
            group(224, global, 1, dinov2_ops(0.0, 0.0)),
            group(224, global, 1, dinov2_ops(0.9, 0.2)),
            group(96, DrawRange::new(0.05, 0.32), 8, dinov2_ops(0.5, 0.0)),
        ])
    }

    /// SimCLR's two views of 224 as torchvision writes them: `RandomResizedCrop(224)` (scale
    /// 0.08 to 1, bilinear), `RandomHorizontalFlip()`, `RandomApply([ColorJitter(0.8, 0.8,
    /// 0.8, 0.2)], p=0.8)`, `RandomGrayscale(p=0.2)`, `RandomApply([GaussianBlur(23, sigma=(0.1,
    /// 2.0))], p=0.5)` (a kernel of about a tenth of the view, odd).
    pub fn simclr() -> Views {
        let mut group = ViewGroup::new(224, 2);
        group.ops = ViewOps {
            flip: 0.5,
            jitter: super::ColorJitter {
                brightness: 0.8,
                contrast: 0.8,
                saturation: 0.8,
                hue: 0.2,
            },
            jitter_p: 0.8,
            grayscale: 0.2,
            blur: Some(ViewBlur {
                p: 0.5,
                kernel_size: 23,
                sigma: DrawRange::new(0.1, 2.0),
            }),
            solarize: 0.0,
        };
        Views::new(vec![group])
    }

    /// The same views with another seed.
    pub fn seed(mut self, seed: u64) -> Views {
        self.seed = seed;
        self
    }

    /// The same views resized with Pillow `major.minor`'s rounding (the installed Pillow's, to
    /// equal torchvision's transforms run with it).
    pub fn pillow_version(mut self, major: u32, minor: u32) -> Views {
        self.pillow_version = (major, minor);
        self
    }

    /// Views of each image, all groups together.
    pub fn count(&self) -> usize {
        self.groups.iter().map(|g| g.count as usize).sum()
    }

    /// The group of view `view` (numbered across the groups), if there is one.
    pub fn group_of(&self, view: usize) -> Option<&ViewGroup> {
        let mut left = view;
        for g in &self.groups {
            if left < g.count as usize {
                return Some(g);
            }
            left -= g.count as usize;
        }
        None
    }

    /// Checks every group: sizes, counts, ranges and chances.
    pub fn validate(&self) -> Result<()> {
        if self.groups.is_empty() {
            return Err(Error::invalid("views", "no view group"));
        }
        if self.count() > 256 {
            return Err(Error::invalid(
                "views",
                format!("{} views per image: at most 256", self.count()),
            ));
        }
        self.groups
            .iter()
            .enumerate()
            .try_for_each(|(at, g)| g.check(at))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_parse_count_and_validate() {
        let dino = Views::preset("DINOv2".parse().unwrap());
        assert_eq!(dino.count(), 10);
        dino.validate().unwrap();
        assert_eq!(dino.group_of(0).unwrap().size, 224);
        assert_eq!(dino.group_of(1).unwrap().ops.solarize, 0.2);
        assert_eq!(dino.group_of(9).unwrap().size, 96);
        assert!(dino.group_of(10).is_none());
        let simclr = Views::preset("simclr".parse().unwrap());
        assert_eq!(simclr.count(), 2);
        simclr.validate().unwrap();
        assert!("dino".parse::<ViewsPreset>().is_err());
    }

    #[test]
    fn bad_groups_are_refused_with_a_reason() {
        let mut g = ViewGroup::new(96, 2);
        g.ops.blur = Some(ViewBlur {
            p: 0.5,
            kernel_size: 8,
            sigma: DrawRange::new(0.1, 2.0),
        });
        let e = Views::new(vec![g]).validate().unwrap_err().to_string();
        assert!(e.contains("odd"), "{e}");
        let mut g = ViewGroup::new(96, 0);
        g.ops.flip = 0.5;
        assert!(Views::new(vec![g]).validate().is_err());
        let mut g = ViewGroup::new(96, 1);
        g.ops.grayscale = 1.5;
        assert!(Views::new(vec![g]).validate().is_err());
        assert!(Views::new(vec![]).validate().is_err());
    }
}
