//! The operations themselves: what torchvision's functional call of each one is
//! ([`Op`], with the arguments it takes), the few numbers a kernel needs to carry it out
//! ([`KernelOp`], `struct GfOp` of `kernels/augment.cu`), and the CPU rendition
//! ([`apply`]), line for line the arithmetic of the kernel, which is itself torchvision's on a
//! `uint8` image: the same float32 operations in the same order, fused multiply-adds where
//! PyTorch's kernels fuse (`add_(x, alpha=a)` is `fma(x, a, self)`), truncation where a float
//! tensor becomes `uint8` again.
//!
//! Images are packed RGB8, row after row (HWC), as the pipeline stages them.

/// One torchvision v2 functional call on a `uint8` image, with the arguments torchvision passes
/// it. Geometric calls use nearest-neighbour sampling.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum Op {
    /// `F.affine(img, angle=0.0, translate=[0, 0], scale=1.0, shear=[shear_x, shear_y],
    /// center=[0, 0], interpolation=NEAREST, fill)`: AutoAugment's `ShearX`/`ShearY` (the angles
    /// in degrees, `degrees(atan(magnitude))`).
    Shear {
        /// Shear along x, degrees.
        x: f64,
        /// Shear along y, degrees.
        y: f64,
        /// Value of pixels from outside the image, per channel.
        fill: [u8; 3],
    },
    /// `F.affine(img, angle=0.0, translate=[x, y], scale=1.0, shear=[0.0, 0.0],
    /// interpolation=NEAREST, fill)`: `TranslateX`/`TranslateY`.
    Translate {
        /// Pixels to the right.
        x: i32,
        /// Pixels down.
        y: i32,
        /// Value of pixels from outside the image, per channel.
        fill: [u8; 3],
    },
    /// `F.rotate(img, angle, interpolation=NEAREST, fill)`: counter-clockwise, degrees.
    Rotate {
        /// Degrees, counter-clockwise.
        angle: f64,
        /// Value of pixels from outside the image, per channel.
        fill: [u8; 3],
    },
    /// `F.adjust_brightness(img, brightness_factor)`.
    Brightness(f64),
    /// `F.adjust_saturation(img, saturation_factor)` (AutoAugment's `Color`).
    Saturation(f64),
    /// `F.adjust_contrast(img, contrast_factor)`.
    Contrast(f64),
    /// `F.adjust_sharpness(img, sharpness_factor)`.
    Sharpness(f64),
    /// `F.adjust_hue(img, hue_factor)`, `hue_factor` in -0.5..=0.5.
    Hue(f64),
    /// `F.posterize(img, bits)`.
    Posterize(u8),
    /// `F.solarize(img, threshold)`.
    Solarize(f64),
    /// `F.autocontrast(img)`.
    AutoContrast,
    /// `F.equalize(img)`.
    Equalize,
    /// `F.invert(img)`.
    Invert,
    /// `F.erase(img, i, j, h, w, v)`: rows `i..i+h`, columns `j..j+w` set to `v`.
    Erase {
        /// First row.
        i: u32,
        /// First column.
        j: u32,
        /// Rows.
        h: u32,
        /// Columns.
        w: u32,
        /// Value per channel.
        v: [u8; 3],
    },
}

/// What a kernel does for one [`Op`]: `struct GfOp` of `kernels/augment.cu`, field for field.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct KernelOp {
    pub kind: i32,
    pub a: i32,
    pub b: i32,
    pub c: i32,
    pub d: i32,
    pub e: i32,
    pub f: [f32; 6],
}

// The kinds of `KernelOp`, the `GF_*` constants of the kernel.
pub(crate) const KIND_AFFINE: i32 = 1;
pub(crate) const KIND_ROT90: i32 = 2;
pub(crate) const KIND_BRIGHTNESS: i32 = 3;
pub(crate) const KIND_SATURATION: i32 = 4;
pub(crate) const KIND_CONTRAST: i32 = 5;
pub(crate) const KIND_SHARPNESS: i32 = 6;
pub(crate) const KIND_POSTERIZE: i32 = 7;
pub(crate) const KIND_SOLARIZE: i32 = 8;
pub(crate) const KIND_AUTOCONTRAST: i32 = 9;
pub(crate) const KIND_EQUALIZE: i32 = 10;
pub(crate) const KIND_INVERT: i32 = 11;
pub(crate) const KIND_HUE: i32 = 12;
pub(crate) const KIND_ERASE: i32 = 13;

/// Python's `math.radians` and `math.degrees`: a multiplication by the rounded quotient, as
/// CPython computes them (Rust's `to_degrees` multiplies by a differently rounded constant).
fn radians(degrees: f64) -> f64 {
    degrees * (std::f64::consts::PI / 180.0)
}

/// See [`radians`].
pub(crate) fn degrees(radians: f64) -> f64 {
    radians * (180.0 / std::f64::consts::PI)
}

/// Python's `a % b` of floats (the result takes the sign of `b`).
fn python_mod(a: f64, b: f64) -> f64 {
    let m = a % b;
    if m != 0.0 && ((b < 0.0) != (m < 0.0)) {
        m + b
    } else if m == 0.0 {
        0.0f64.copysign(b)
    } else {
        m
    }
}

/// torchvision's `_get_inverse_affine_matrix(center, angle, translate, scale=1, shear)`.
fn inverse_affine(center: [f64; 2], angle: f64, translate: [f64; 2], shear: [f64; 2]) -> [f64; 6] {
    let rot = radians(angle);
    let sx = radians(shear[0]);
    let sy = radians(shear[1]);
    let [cx, cy] = center;
    let [tx, ty] = translate;
    let cos_sy = sy.cos();
    let tan_sx = sx.tan();
    let rot_minus_sy = rot - sy;
    let cx_plus_tx = cx + tx;
    let cy_plus_ty = cy + ty;
    let a = rot_minus_sy.cos() / cos_sy;
    let b = -(a * tan_sx + rot.sin());
    let c = rot_minus_sy.sin() / cos_sy;
    let d = rot.cos() - c * tan_sx;
    let scale = 1.0;
    let mut m = [d / scale, -b / scale, 0.0, -c / scale, a / scale, 0.0];
    m[2] += cx - m[0] * cx_plus_tx - m[1] * cy_plus_ty;
    m[5] += cy - m[3] * cx_plus_tx - m[4] * cy_plus_ty;
    m
}

/// The sampling grid's coefficients from an inverse affine matrix, as torchvision's
/// `_affine_grid` makes them: `theta` in float32, transposed and divided by `(w / 2, h / 2)`.
/// Returned as `[x from x, x from y, x offset, y from x, y from y, y offset]`.
fn grid_coefficients(m: [f64; 6], width: usize, height: usize) -> [f32; 6] {
    let half_w = (0.5 * width as f64) as f32;
    let half_h = (0.5 * height as f64) as f32;
    [
        m[0] as f32 / half_w,
        m[1] as f32 / half_w,
        m[2] as f32 / half_w,
        m[3] as f32 / half_h,
        m[4] as f32 / half_h,
        m[5] as f32 / half_h,
    ]
}

fn pack(rgb: [u8; 3]) -> i32 {
    i32::from(rgb[0]) | i32::from(rgb[1]) << 8 | i32::from(rgb[2]) << 16
}

fn unpack(v: i32) -> [u8; 3] {
    [v as u8, (v >> 8) as u8, (v >> 16) as u8]
}

impl Op {
    /// What the kernel does for this call on an image of `width` x `height`; `None` when the
    /// call leaves every image unchanged (a rotation by 0 degrees is a copy in torchvision).
    pub(crate) fn kernel(&self, width: usize, height: usize) -> Option<KernelOp> {
        let op = |kind| KernelOp {
            kind,
            ..KernelOp::default()
        };
        let affine = |m: [f64; 6], fill: [u8; 3]| KernelOp {
            kind: KIND_AFFINE,
            a: pack(fill),
            f: grid_coefficients(m, width, height),
            ..KernelOp::default()
        };
        // float(x) as PyTorch takes a Python float into a float32 computation.
        let f = |x: f64| x as f32;
        Some(match *self {
            Op::Shear { x, y, fill } => {
                let center = [-(width as f64) * 0.5, -(height as f64) * 0.5];
                affine(inverse_affine(center, 0.0, [0.0, 0.0], [x, y]), fill)
            }
            Op::Translate { x, y, fill } => affine(
                inverse_affine([0.0, 0.0], 0.0, [f64::from(x), f64::from(y)], [0.0, 0.0]),
                fill,
            ),
            Op::Rotate { angle, fill } => {
                let angle = python_mod(angle, 360.0);
                // torchvision's fast paths: exact turns by a transpose.
                let turns = if angle == 0.0 {
                    return None;
                } else if angle == 180.0 {
                    Some(2)
                } else if width == height && angle == 90.0 {
                    Some(1)
                } else if width == height && angle == 270.0 {
                    Some(3)
                } else {
                    None
                };
                match turns {
                    Some(k) => KernelOp {
                        kind: KIND_ROT90,
                        a: k,
                        ..KernelOp::default()
                    },
                    None => affine(
                        inverse_affine([0.0, 0.0], -angle, [0.0, 0.0], [0.0, 0.0]),
                        fill,
                    ),
                }
            }
            Op::Brightness(factor) => KernelOp {
                kind: KIND_BRIGHTNESS,
                f: [f(factor), 0.0, 0.0, 0.0, 0.0, 0.0],
                ..KernelOp::default()
            },
            Op::Saturation(factor) => KernelOp {
                kind: KIND_SATURATION,
                f: [f(factor), f(1.0 - factor), 0.0, 0.0, 0.0, 0.0],
                ..KernelOp::default()
            },
            Op::Contrast(factor) => KernelOp {
                kind: KIND_CONTRAST,
                f: [f(factor), f(1.0 - factor), 0.0, 0.0, 0.0, 0.0],
                ..KernelOp::default()
            },
            Op::Sharpness(factor) => {
                if width <= 2 || height <= 2 {
                    return None;
                }
                KernelOp {
                    kind: KIND_SHARPNESS,
                    f: [f(factor), f(1.0 - factor), 0.0, 0.0, 0.0, 0.0],
                    ..KernelOp::default()
                }
            }
            Op::Hue(factor) => KernelOp {
                kind: KIND_HUE,
                f: [f(factor), 0.0, 0.0, 0.0, 0.0, 0.0],
                ..KernelOp::default()
            },
            Op::Posterize(bits) => {
                if bits >= 8 {
                    return None;
                }
                KernelOp {
                    kind: KIND_POSTERIZE,
                    a: ((1i32 << bits) - 1) << (8 - bits),
                    ..KernelOp::default()
                }
            }
            Op::Solarize(threshold) => KernelOp {
                kind: KIND_SOLARIZE,
                f: [f(threshold), 0.0, 0.0, 0.0, 0.0, 0.0],
                ..KernelOp::default()
            },
            Op::AutoContrast => op(KIND_AUTOCONTRAST),
            Op::Equalize => op(KIND_EQUALIZE),
            Op::Invert => op(KIND_INVERT),
            Op::Erase { i, j, h, w, v } => {
                // Clipped to the image, as a slice assignment is.
                let (i, j) = (i.min(height as u32), j.min(width as u32));
                let h = h.min(height as u32 - i);
                let w = w.min(width as u32 - j);
                if h == 0 || w == 0 {
                    return None;
                }
                KernelOp {
                    kind: KIND_ERASE,
                    a: i as i32,
                    b: j as i32,
                    c: h as i32,
                    d: w as i32,
                    e: pack(v),
                    ..KernelOp::default()
                }
            }
        })
    }

    /// The name of the `torchvision.transforms.v2.functional` function.
    pub fn function(&self) -> &'static str {
        match self {
            Op::Shear { .. } | Op::Translate { .. } => "affine",
            Op::Rotate { .. } => "rotate",
            Op::Brightness(_) => "adjust_brightness",
            Op::Saturation(_) => "adjust_saturation",
            Op::Contrast(_) => "adjust_contrast",
            Op::Sharpness(_) => "adjust_sharpness",
            Op::Hue(_) => "adjust_hue",
            Op::Posterize(_) => "posterize",
            Op::Solarize(_) => "solarize",
            Op::AutoContrast => "autocontrast",
            Op::Equalize => "equalize",
            Op::Invert => "invert",
            Op::Erase { .. } => "erase",
        }
    }

    /// The keyword arguments of the call, as a JSON object (Python's literals: `null` for
    /// `None`; interpolation by its `InterpolationMode` value).
    pub fn json_arguments(&self) -> String {
        let fill = |f: [u8; 3]| format!("[{}, {}, {}]", f[0], f[1], f[2]);
        match *self {
            Op::Shear { x, y, fill: f } => format!(
                "{{\"angle\": 0.0, \"translate\": [0, 0], \"scale\": 1.0, \"shear\": [{}, {}], \
                 \"interpolation\": \"nearest\", \"fill\": {}, \"center\": [0, 0]}}",
                json_f64(x),
                json_f64(y),
                fill(f)
            ),
            Op::Translate { x, y, fill: f } => format!(
                "{{\"angle\": 0.0, \"translate\": [{x}, {y}], \"scale\": 1.0, \"shear\": [0.0, 0.0], \
                 \"interpolation\": \"nearest\", \"fill\": {}}}",
                fill(f)
            ),
            Op::Rotate { angle, fill: f } => format!(
                "{{\"angle\": {}, \"interpolation\": \"nearest\", \"fill\": {}}}",
                json_f64(angle),
                fill(f)
            ),
            Op::Brightness(v) => format!("{{\"brightness_factor\": {}}}", json_f64(v)),
            Op::Saturation(v) => format!("{{\"saturation_factor\": {}}}", json_f64(v)),
            Op::Contrast(v) => format!("{{\"contrast_factor\": {}}}", json_f64(v)),
            Op::Sharpness(v) => format!("{{\"sharpness_factor\": {}}}", json_f64(v)),
            Op::Hue(v) => format!("{{\"hue_factor\": {}}}", json_f64(v)),
            Op::Posterize(bits) => format!("{{\"bits\": {bits}}}"),
            Op::Solarize(v) => format!("{{\"threshold\": {}}}", json_f64(v)),
            Op::AutoContrast | Op::Equalize | Op::Invert => "{}".into(),
            Op::Erase { i, j, h, w, v } => format!(
                "{{\"i\": {i}, \"j\": {j}, \"h\": {h}, \"w\": {w}, \"v\": {}}}",
                fill(v)
            ),
        }
    }
}

/// A float as JSON, with every digit Python's `repr` would print (Rust's shortest round-trip
/// form), and always with a decimal point so Python reads a float back.
pub(crate) fn json_f64(v: f64) -> String {
    let s = format!("{v:?}");
    if s.contains(['.', 'e', 'E', 'N', 'i']) {
        s
    } else {
        format!("{s}.0")
    }
}

/// float32 of a `uint8` sample.
fn fl(x: u8) -> f32 {
    f32::from(x)
}

/// A float32 tensor value back to `uint8` after `clamp_(0, 255)`: truncated, as
/// `Tensor.to(torch.uint8)` converts.
fn to_u8(v: f32) -> u8 {
    v.clamp(0.0, 255.0) as u8
}

/// `rgb_to_grayscale(img, preserve_dtype=False).floor_()` of one pixel:
/// `r.mul(0.2989).add_(g, alpha=0.587).add_(b, alpha=0.114)`, floored.
fn gray(px: &[u8]) -> f32 {
    let l = fl(px[0]) * 0.2989f32;
    let l = fl(px[1]).mul_add(0.587f32, l);
    let l = fl(px[2]).mul_add(0.114f32, l);
    l.floor()
}

/// `_blend(image1, image2, ratio)` of one sample: `image1.mul(ratio).add_(image2,
/// alpha=1 - ratio)`, clamped, truncated.
fn blend(x: u8, other: f32, ratio: f32, one_minus_ratio: f32) -> u8 {
    to_u8(other.mul_add(one_minus_ratio, fl(x) * ratio))
}

/// Runs the kernel's work for `op` on one image (`height` x `width` packed RGB8), with
/// `scratch` at least as large as the image.
pub(crate) fn apply(
    op: &KernelOp,
    img: &mut [u8],
    scratch: &mut [u8],
    height: usize,
    width: usize,
) {
    let n = height * width;
    let img = &mut img[..n * 3];
    let scratch = &mut scratch[..n * 3];
    match op.kind {
        KIND_AFFINE => affine(op, img, scratch, height, width),
        KIND_ROT90 => rot90(op, img, scratch, height, width),
        KIND_BRIGHTNESS => {
            for v in img.iter_mut() {
                *v = to_u8(fl(*v) * op.f[0]);
            }
        }
        KIND_SATURATION => {
            for px in img.chunks_exact_mut(3) {
                let g = gray(px);
                for v in px.iter_mut() {
                    *v = blend(*v, g, op.f[0], op.f[1]);
                }
            }
        }
        KIND_CONTRAST => {
            let mean = gray_mean(img);
            for v in img.iter_mut() {
                *v = blend(*v, mean, op.f[0], op.f[1]);
            }
        }
        KIND_SHARPNESS => sharpness(op, img, scratch, height, width),
        KIND_POSTERIZE => {
            for v in img.iter_mut() {
                *v &= op.a as u8;
            }
        }
        KIND_SOLARIZE => {
            for v in img.iter_mut() {
                if fl(*v) >= op.f[0] {
                    *v = 255 - *v;
                }
            }
        }
        KIND_AUTOCONTRAST => autocontrast(img),
        KIND_EQUALIZE => equalize(img, n),
        KIND_INVERT => {
            for v in img.iter_mut() {
                *v = 255 - *v;
            }
        }
        KIND_HUE => {
            for px in img.chunks_exact_mut(3) {
                let out = hue_pixel([px[0], px[1], px[2]], op.f[0]);
                px.copy_from_slice(&out);
            }
        }
        KIND_ERASE => erase(op, img, width),
        _ => {}
    }
}

/// `KIND_AFFINE`: the affine grid of `op.f` sampled nearest (`grid_sample`, `align_corners` off,
/// ties to even), `op.a`'s fill outside the image.
fn affine(op: &KernelOp, img: &mut [u8], scratch: &mut [u8], height: usize, width: usize) {
    scratch.copy_from_slice(img);
    let fill = unpack(op.a);
    let r = op.f;
    let (wf, hf) = (width as f32, height as f32);
    let x0 = (1.0 - wf) * 0.5;
    let y0 = (1.0 - hf) * 0.5;
    for y in 0..height {
        let by = y0 + y as f32;
        for x in 0..width {
            let bx = x0 + x as f32;
            // The grid (a matrix product, one fused multiply-add per term).
            let gx = by.mul_add(r[1], bx * r[0]) + r[2];
            let gy = by.mul_add(r[4], bx * r[3]) + r[5];
            // grid_sample, align_corners=False, nearest (ties to even).
            let ix = (((gx + 1.0) * wf - 1.0) * 0.5).round_ties_even();
            let iy = (((gy + 1.0) * hf - 1.0) * 0.5).round_ties_even();
            let o = (y * width + x) * 3;
            if ix >= 0.0 && ix < wf && iy >= 0.0 && iy < hf {
                let s = (iy as usize * width + ix as usize) * 3;
                img[o..o + 3].copy_from_slice(&scratch[s..s + 3]);
            } else {
                img[o..o + 3].copy_from_slice(&fill);
            }
        }
    }
}

/// `KIND_ROT90`: `torch.rot90(img, op.a, dims=(-2, -1))`.
fn rot90(op: &KernelOp, img: &mut [u8], scratch: &mut [u8], height: usize, width: usize) {
    scratch.copy_from_slice(img);
    for y in 0..height {
        for x in 0..width {
            // torch.rot90(img, k, dims=(-2, -1)) of a square image (any image for k 2).
            let (sy, sx) = match op.a {
                1 => (x, width - 1 - y),
                2 => (height - 1 - y, width - 1 - x),
                _ => (height - 1 - x, y),
            };
            let o = (y * width + x) * 3;
            let s = (sy * width + sx) * 3;
            img[o..o + 3].copy_from_slice(&scratch[s..s + 3]);
        }
    }
}

/// `KIND_SHARPNESS`: each inner pixel blended with its smoothed 3 x 3 neighbourhood by
/// `op.f[1]`; the border kept.
fn sharpness(op: &KernelOp, img: &mut [u8], scratch: &mut [u8], height: usize, width: usize) {
    scratch.copy_from_slice(img);
    for y in 1..height - 1 {
        for x in 1..width - 1 {
            for c in 0..3 {
                let at = |yy: usize, xx: usize| u32::from(scratch[(yy * width + xx) * 3 + c]);
                let centre = at(y, x);
                let ring = at(y - 1, x - 1)
                    + at(y - 1, x)
                    + at(y - 1, x + 1)
                    + at(y, x - 1)
                    + at(y, x + 1)
                    + at(y + 1, x - 1)
                    + at(y + 1, x)
                    + at(y + 1, x + 1);
                let blurred = smooth(ring, centre);
                let diff = blurred as f32 - centre as f32;
                img[(y * width + x) * 3 + c] = to_u8(diff.mul_add(op.f[1], centre as f32));
            }
        }
    }
}

/// `KIND_AUTOCONTRAST`: each channel stretched from its lowest to its highest value.
fn autocontrast(img: &mut [u8]) {
    let mut low = [255u8; 3];
    let mut high = [0u8; 3];
    for px in img.chunks_exact(3) {
        for c in 0..3 {
            low[c] = low[c].min(px[c]);
            high[c] = high[c].max(px[c]);
        }
    }
    let scale: [(f32, f32); 3] = std::array::from_fn(|c| autocontrast_scale(low[c], high[c]));
    for px in img.chunks_exact_mut(3) {
        for c in 0..3 {
            let (minimum, inv_scale) = scale[c];
            px[c] = to_u8((fl(px[c]) - minimum) / inv_scale);
        }
    }
}

/// `KIND_EQUALIZE`: each channel of the image's `n` pixels through its histogram's lookup table.
fn equalize(img: &mut [u8], n: usize) {
    let mut hist = [[0u32; 256]; 3];
    for px in img.chunks_exact(3) {
        for c in 0..3 {
            hist[c][px[c] as usize] += 1;
        }
    }
    let luts: [Option<[u8; 256]>; 3] = std::array::from_fn(|c| equalize_lut(&hist[c], n as u32));
    for px in img.chunks_exact_mut(3) {
        for c in 0..3 {
            if let Some(lut) = &luts[c] {
                px[c] = lut[px[c] as usize];
            }
        }
    }
}

/// `KIND_ERASE`: the box of `op` (top `a`, left `b`, height `c`, width `d`) set to `op.e`'s
/// value.
fn erase(op: &KernelOp, img: &mut [u8], width: usize) {
    let v = unpack(op.e);
    let (i, j, h, w) = (op.a as usize, op.b as usize, op.c as usize, op.d as usize);
    for y in i..i + h {
        for px in img[(y * width + j) * 3..(y * width + j + w) * 3].chunks_exact_mut(3) {
            px.copy_from_slice(&v);
        }
    }
}

/// `adjust_contrast`'s mean: `torch.mean` of the floored grayscale, float32. The floored values
/// are integers, so their sum is exact however it is ordered; the mean is the sum rounded to
/// float32, divided by the pixel count.
pub(crate) fn gray_mean(img: &[u8]) -> f32 {
    let n = img.len() / 3;
    let sum: u64 = img.chunks_exact(3).map(|px| gray(px) as u64).sum();
    sum as f32 / n as f32
}

/// `conv2d` of the 3x3 kernel `[[1, 1, 1], [1, 5, 1], [1, 1, 1]] / 13` over integer samples,
/// then `round_()`: the exact quotient is never within 1/26 of a tie, far beyond float32's
/// error, so rounding the exact quotient gives torchvision's value.
pub(crate) fn smooth(ring: u32, centre: u32) -> u32 {
    (2 * (ring + 5 * centre) + 13) / 26
}

/// `autocontrast`'s per-channel `(minimum, inv_scale)`: `(max - min) * (1 / 255)`, or `(0, 1)`
/// for a flat channel.
pub(crate) fn autocontrast_scale(low: u8, high: u8) -> (f32, f32) {
    if low == high {
        (0.0, 1.0)
    } else {
        (fl(low), (fl(high) - fl(low)) * (1.0f64 / 255.0) as f32)
    }
}

/// `equalize`'s lookup table for one channel's histogram of `n` samples; `None` when the
/// channel is left as it is (torchvision's `step == 0`).
pub(crate) fn equalize_lut(hist: &[u32; 256], n: u32) -> Option<[u8; 256]> {
    // The last non-empty bin (where the cumulative histogram first reaches its maximum).
    let last = hist.iter().rposition(|&c| c > 0).unwrap_or(0);
    let step = (n - hist[last]) / 255;
    if step == 0 {
        return None;
    }
    let mut lut = [0u8; 256];
    let mut cumulative = 0u32;
    for i in 0..255 {
        cumulative += hist[i];
        lut[i + 1] = ((cumulative + step / 2) / step).min(255) as u8;
    }
    Some(lut)
}

/// `adjust_hue` of one pixel: torchvision's `_rgb_to_hsv`, the hue shifted and wrapped, then
/// `_hsv_to_rgb`, in float32, and back to `uint8` by `mul(255.999)` truncated.
pub(crate) fn hue_pixel(px: [u8; 3], factor: f32) -> [u8; 3] {
    let scale = (1.0f64 / 255.0) as f32;
    let [r, g, b] = px.map(|v| fl(v) * scale);
    let maxc = r.max(g).max(b);
    let minc = r.min(g).min(b);
    let eqc = maxc == minc;
    let range = maxc - minc;
    let s = range / if eqc { 1.0 } else { maxc };
    let divisor = if eqc { 1.0 } else { range };
    let rc = (maxc - r) / divisor;
    let gc = (maxc - g) / divisor;
    let bc = (maxc - b) / divisor;
    let mask = |m: bool| if m { 1.0f32 } else { 0.0 };
    let hg = ((rc + 2.0) - bc) * mask(maxc == g && maxc != r);
    let hr = (bc - gc) * mask(maxc == r);
    let hb = ((gc + 4.0) - rc) * mask(maxc != r && maxc != g);
    let h = (hr + hg) + hb;
    let h = (h * (1.0f64 / 6.0) as f32 + 1.0) % 1.0;
    // h.add_(hue_factor).remainder_(1.0)
    let h = h + factor;
    let h = h - h.floor();
    let v = maxc;
    let h6 = h * 6.0;
    let i = h6.floor();
    let f = h6 - i;
    let sxf = s * f;
    let one_minus_s = 1.0 - s;
    let q = ((1.0 - sxf) * v).clamp(0.0, 1.0);
    let t = ((sxf + one_minus_s) * v).clamp(0.0, 1.0);
    let p = (one_minus_s * v).clamp(0.0, 1.0);
    let (r, g, b) = match (i as i32).rem_euclid(6) {
        0 => (v, t, p),
        1 => (q, v, p),
        2 => (p, v, t),
        3 => (p, q, v),
        4 => (t, p, v),
        _ => (v, p, q),
    };
    let up = 255.0f32 + 1.0 - 1e-3;
    [r, g, b].map(|x| (x * up) as u8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_arithmetic() {
        assert_eq!(python_mod(-30.0, 360.0), 330.0);
        assert_eq!(python_mod(390.0, 360.0), 30.0);
        assert_eq!(python_mod(-0.0, 360.0).to_bits(), 0.0f64.to_bits());
        assert_eq!(json_f64(2.0), "2.0");
        assert_eq!(json_f64(0.1), "0.1");
        assert_eq!(json_f64(-16.0), "-16.0");
    }

    #[test]
    fn sharpening_rounds_the_exact_quotient() {
        for ring in 0..=8 * 255 {
            for centre in [0, 1, 100, 254, 255] {
                let exact = f64::from(ring + 5 * centre) / 13.0;
                assert_eq!(
                    smooth(ring, centre),
                    exact.round() as u32,
                    "{ring} {centre}"
                );
            }
        }
    }

    #[test]
    fn equalize_leaves_flat_channels_alone() {
        let mut hist = [0u32; 256];
        hist[7] = 100;
        assert!(equalize_lut(&hist, 100).is_none());
        hist[9] = 600;
        // step = (700 - 600) / 255 = 0: still left alone.
        assert!(equalize_lut(&hist, 700).is_none());
        let mut hist = [0u32; 256];
        for (i, h) in hist.iter_mut().enumerate() {
            *h = i as u32 % 7 + 1;
        }
        let n = hist.iter().sum();
        let lut = equalize_lut(&hist, n).expect("a lut");
        assert!(lut.windows(2).all(|w| w[0] <= w[1]), "monotone");
    }
}
