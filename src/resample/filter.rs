//! Pillow's resampling filters (`libImaging/Resample.c`): their supports and values, computed
//! operation for operation as Pillow computes them, so the coefficients built from them round to
//! the same integers.

use std::f64::consts::PI;
use std::fmt;

/// A resampling filter of Pillow's (`PIL.Image.Resampling`), NEAREST aside.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Filter {
    /// `BOX`: each output is the mean of the source samples it covers (support 0.5).
    Box,
    /// `BILINEAR`: the triangle filter (support 1); torchvision's default.
    Bilinear,
    /// `HAMMING`: a Hamming-windowed sinc (support 1).
    Hamming,
    /// `BICUBIC`: Keys' cubic with a = -0.5 (support 2).
    Bicubic,
    /// `LANCZOS`: a 3-lobed Lanczos-windowed sinc (support 3).
    Lanczos,
}

impl Filter {
    /// How far the filter reaches, in source samples, at scale 1.
    pub fn support(self) -> f64 {
        match self {
            Filter::Box => 0.5,
            Filter::Bilinear | Filter::Hamming => 1.0,
            Filter::Bicubic => 2.0,
            Filter::Lanczos => 3.0,
        }
    }

    /// The filter's value at `x`, exactly as Resample.c computes it.
    pub fn weight(self, x: f64) -> f64 {
        match self {
            Filter::Box => box_filter(x),
            Filter::Bilinear => bilinear_filter(x),
            Filter::Hamming => hamming_filter(x),
            Filter::Bicubic => bicubic_filter(x),
            Filter::Lanczos => lanczos_filter(x),
        }
    }

    /// Pillow's name of the filter.
    pub fn name(self) -> &'static str {
        match self {
            Filter::Box => "BOX",
            Filter::Bilinear => "BILINEAR",
            Filter::Hamming => "HAMMING",
            Filter::Bicubic => "BICUBIC",
            Filter::Lanczos => "LANCZOS",
        }
    }
}

impl fmt::Display for Filter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

// The filters of Resample.c, operation for operation (no fused multiply-add: Rust does not
// contract, and neither does a C compiler for x86-64 without -mfma).

fn box_filter(x: f64) -> f64 {
    if x > -0.5 && x <= 0.5 {
        1.0
    } else {
        0.0
    }
}

fn bilinear_filter(x: f64) -> f64 {
    let x = if x < 0.0 { -x } else { x };
    if x < 1.0 {
        1.0 - x
    } else {
        0.0
    }
}

fn hamming_filter(x: f64) -> f64 {
    let x = if x < 0.0 { -x } else { x };
    if x == 0.0 {
        return 1.0;
    }
    if x >= 1.0 {
        return 0.0;
    }
    let x = x * PI;
    // `0.54f + 0.46f * cos(x)`: single-precision constants, widened to double.
    x.sin() / x * (f64::from(0.54f32) + f64::from(0.46f32) * x.cos())
}

fn bicubic_filter(x: f64) -> f64 {
    const A: f64 = -0.5;
    let x = if x < 0.0 { -x } else { x };
    if x < 1.0 {
        return ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0;
    }
    if x < 2.0 {
        return (((x - 5.0) * x + 8.0) * x - 4.0) * A;
    }
    0.0
}

fn sinc_filter(x: f64) -> f64 {
    if x == 0.0 {
        return 1.0;
    }
    let x = x * PI;
    x.sin() / x
}

fn lanczos_filter(x: f64) -> f64 {
    if (-3.0..3.0).contains(&x) {
        sinc_filter(x) * sinc_filter(x / 3.0)
    } else {
        0.0
    }
}

/// How an axis is resampled: Pillow's `NEAREST` (no filter: each output takes the sample under
/// its centre) or one of its convolution filters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Resampling {
    /// `NEAREST`: `Image.resize` runs an affine scale (`ImagingScaleAffine`).
    Nearest,
    /// A convolution filter (`ImagingResample`).
    Filter(Filter),
}
