//! The CPU passes against the scalar reference and Pillow itself.

use super::cpu::{HostImage, Kernels, Slot};
use super::filter::{Filter, Resampling};
use super::image::ImagePlan;
use super::passes::PassOrder;
use super::plan::{AxisPlan, PlanError, SourceBox};
use super::reference::{resample, resample_with};

/// Every resampling Pillow has.
const ALL: [Resampling; 6] = [
    Resampling::Nearest,
    Resampling::Filter(Filter::Box),
    Resampling::Filter(Filter::Bilinear),
    Resampling::Filter(Filter::Hamming),
    Resampling::Filter(Filter::Bicubic),
    Resampling::Filter(Filter::Lanczos),
];

/// A small xorshift generator: fresh sizes and plans from a seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// In `lo..=hi`.
    fn range(&mut self, lo: u32, hi: u32) -> u32 {
        lo + (self.next() % u64::from(hi - lo + 1)) as u32
    }
}

/// A random plan of a source axis of `len` samples onto an output axis of `out`: a region, a
/// box (sometimes fractional), a resize that shrinks or grows, a kept range and a destination.
fn random_plan(rng: &mut Rng, len: u32, out: u32) -> AxisPlan {
    let src_offset = if rng.range(0, 2) == 0 {
        0
    } else {
        rng.range(0, len - 1)
    };
    let src_len = rng.range(1, len - src_offset);
    let src_box = match rng.range(0, 3) {
        0 => {
            let divisor = 1 << rng.range(0, 3);
            let end = rng.range(1, src_len * divisor);
            let start = rng.range(0, end - 1);
            Some(SourceBox {
                start,
                end,
                divisor,
            })
        }
        _ => None,
    };
    let resized = match rng.range(0, 3) {
        0 => src_len,
        1 => rng.range(1, out * 2),
        _ => rng.range(1, src_len.max(2)),
    };
    let out_first = rng.range(0, resized - 1);
    let out_len = rng.range(1, (resized - out_first).min(out));
    let dst_offset = rng.range(0, out - out_len);
    AxisPlan {
        src_offset,
        src_len,
        src_box,
        resized,
        out_first,
        out_len,
        dst_offset,
    }
}

fn random_bytes(n: usize, rng: &mut Rng) -> Vec<u8> {
    (0..n).map(|_| rng.next() as u8).collect()
}

/// Runs `plan` with `kernels` into a poisoned output.
fn fast(
    plan: &ImagePlan,
    source: &HostImage,
    pad: u8,
    out_w: u32,
    out_h: u32,
    kernels: Kernels,
) -> Result<Vec<u8>, PlanError> {
    let mut bytes = vec![0xA5; out_w as usize * out_h as usize * 3];
    let mut slot = Slot {
        bytes: &mut bytes,
        width: out_w,
        height: out_h,
    };
    plan.resample_into(source, pad, &mut slot, kernels, &mut Vec::new())?;
    Ok(bytes)
}

/// The kernels this CPU runs besides the portable ones, or a printed reason.
fn vector_kernels() -> Option<Kernels> {
    match Kernels::detect() {
        Kernels::Portable => {
            println!("skipped: AVX2 passes: this CPU has no AVX2");
            None
        }
        other => Some(other),
    }
}

/// The fast passes, portable and AVX2, equal the scalar reference on fresh random images and
/// plans: every resampling, every pass order, gray and RGB, odd sizes, fractional boxes, kept
/// ranges and pads.
#[test]
fn fast_passes_equal_the_reference() {
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64)
        | 1;
    let mut rng = Rng(seed);
    let vector = vector_kernels();
    let orders = [
        PassOrder::ShrinkVerticalFirst,
        PassOrder::TallVerticalFirst,
        PassOrder::HorizontalFirst,
    ];
    let mut compared = 0;
    for case in 0..600 {
        let channels = if case % 3 == 0 { 1 } else { 3 };
        let (w, h) = (rng.range(1, 160), rng.range(1, 160));
        let (ow, oh) = (rng.range(1, 90), rng.range(1, 90));
        let pixels = random_bytes((w * h * channels) as usize, &mut rng);
        let source = HostImage {
            pixels: &pixels,
            width: w,
            height: h,
            channels,
        };
        let x = random_plan(&mut rng, w, ow);
        let y = random_plan(&mut rng, h, oh);
        let resampling = ALL[case % ALL.len()];
        let order = orders[(case / ALL.len()) % orders.len()];
        let pad = rng.next() as u8;
        let mut want = vec![0x5A; (ow * oh * 3) as usize];
        resample_with(&source, &x, &y, resampling, order, pad, &mut want, ow, oh)
            .unwrap_or_else(|e| panic!("reference {x:?} {y:?}: {e}"));
        let plan = ImagePlan::new(&x, &y, resampling, order).expect("plan");
        let what = format!(
            "seed {seed} case {case}: {w}x{h}x{channels} {resampling:?} {order:?} {x:?} {y:?}"
        );
        let portable = fast(&plan, &source, pad, ow, oh, Kernels::Portable).expect("portable");
        assert!(portable == want, "portable differs: {what}");
        if let Some(kernels) = vector {
            let got = fast(&plan, &source, pad, ow, oh, kernels).expect("vector");
            assert!(got == want, "{kernels:?} differs: {what}");
        }
        compared += 1;
    }
    assert_eq!(compared, 600);
}

/// Pillow's weights always fit the AVX2 passes' byte multiplies ([`super::cpu::SplitWeights`]),
/// so those passes never leave a real plan to the portable ones: every filter, on fresh random
/// plans that shrink and grow, with fractional boxes.
#[test]
fn pillows_weights_fit_the_byte_multiplies() {
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64)
        | 1;
    let mut rng = Rng(seed);
    for case in 0..3000 {
        let (w, ow) = (rng.range(1, 3000), rng.range(1, 400));
        let (h, oh) = (rng.range(1, 300), rng.range(1, 300));
        let x = random_plan(&mut rng, w, ow);
        let y = random_plan(&mut rng, h, oh);
        let resampling = ALL[1 + case % (ALL.len() - 1)];
        let plan = ImagePlan::new(&x, &y, resampling, PassOrder::default()).expect("plan");
        assert!(
            plan.x_split.bytes && plan.y_split.bytes,
            "seed {seed} case {case}: {resampling:?} {x:?} {y:?}"
        );
    }
}

/// Real sizes: torchvision's Resize(256) + CenterCrop(224) of photo-sized random images, and
/// large shrinks (wide filters), with every filter, on both kernels.
#[test]
fn fast_passes_equal_the_reference_at_real_sizes() {
    let mut rng = Rng(0x2545_F491_4F6C_DD1D);
    let vector = vector_kernels();
    for (i, &(w, h)) in [(500, 375), (375, 500), (1024, 683), (333, 2000), (3000, 97)]
        .iter()
        .enumerate()
    {
        let channels = if i == 3 { 1 } else { 3 };
        let pixels = random_bytes((w * h * channels) as usize, &mut rng);
        let source = HostImage {
            pixels: &pixels,
            width: w,
            height: h,
            channels,
        };
        let (x, y) = super::plan::torchvision_center_crop(w, h, 256, 224, 224);
        for resampling in ALL {
            let mut want = vec![0; 224 * 224 * 3];
            resample_with(
                &source,
                &x,
                &y,
                resampling,
                PassOrder::default(),
                0,
                &mut want,
                224,
                224,
            )
            .expect("reference");
            let plan = ImagePlan::new(&x, &y, resampling, PassOrder::default()).expect("plan");
            for kernels in [Some(Kernels::Portable), vector].into_iter().flatten() {
                let got = fast(&plan, &source, 0, 224, 224, kernels).expect("fast");
                assert!(got == want, "{w}x{h} {resampling:?} {kernels:?}");
            }
        }
    }
}

/// A large pass cut into bands of rows on several threads gives the bytes of the whole pass
/// on one (itself equal to the reference above): every filter, pass order and sample count, odd
/// sizes, kept ranges and pads, on both kernels, cut in two to sixteen.
#[test]
fn passes_in_bands_give_the_bytes_of_one_pass() {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let vector = vector_kernels();
    let orders = [PassOrder::ShrinkVerticalFirst, PassOrder::HorizontalFirst];
    for case in 0..24 {
        let channels = if case % 4 == 0 { 1 } else { 3 };
        let (w, h) = (rng.range(300, 1400), rng.range(300, 1400));
        let (ow, oh) = (rng.range(400, 1000), rng.range(400, 1000));
        let pixels = random_bytes((w * h * channels) as usize, &mut rng);
        let source = HostImage {
            pixels: &pixels,
            width: w,
            height: h,
            channels,
        };
        let x = random_plan(&mut rng, w, ow);
        let y = random_plan(&mut rng, h, oh);
        let resampling = ALL[case % ALL.len()];
        let order = orders[case % orders.len()];
        let pad = rng.next() as u8;
        let plan = ImagePlan::new(&x, &y, resampling, order).expect("plan");
        for kernels in [Some(Kernels::Portable), vector].into_iter().flatten() {
            let want = fast(&plan, &source, pad, ow, oh, kernels).expect("one pass");
            for threads in [2, 3, 7, 16] {
                let mut got = vec![0xA5; want.len()];
                let mut slot = Slot {
                    bytes: &mut got,
                    width: ow,
                    height: oh,
                };
                plan.resample_into_bands(
                    &source,
                    pad,
                    &mut slot,
                    kernels,
                    &mut Vec::new(),
                    threads,
                )
                .expect("bands");
                assert!(
                    got == want,
                    "case {case}: {w}x{h}x{channels} -> {ow}x{oh} {resampling:?} {order:?} \
                     {kernels:?} in {threads}"
                );
            }
        }
    }
}

#[test]
fn bad_plans_are_errors_not_panics() {
    let mut out = vec![0u8; 4 * 4 * 3];
    let src = vec![0u8; 8 * 8 * 3];
    let good = AxisPlan::stretch(8, 4);
    let cases = [
        AxisPlan { src_len: 0, ..good },
        AxisPlan { resized: 0, ..good },
        AxisPlan { out_len: 0, ..good },
        AxisPlan {
            src_offset: 1,
            ..good
        },
        AxisPlan {
            out_first: 1,
            ..good
        },
        AxisPlan {
            dst_offset: 1,
            ..good
        },
        AxisPlan {
            src_offset: u32::MAX,
            ..good
        },
        AxisPlan {
            resized: u32::MAX,
            out_first: u32::MAX,
            ..good
        },
        AxisPlan {
            src_len: u32::MAX,
            ..good
        },
        AxisPlan {
            src_box: Some(SourceBox {
                start: 3,
                end: 3,
                divisor: 1,
            }),
            ..good
        },
        AxisPlan {
            src_box: Some(SourceBox {
                start: 0,
                end: 8,
                divisor: 3,
            }),
            ..good
        },
    ];
    let source = HostImage {
        pixels: &src,
        width: 8,
        height: 8,
        channels: 3,
    };
    for bad in cases {
        for (x, y) in [(bad, good), (good, bad)] {
            for resampling in ALL {
                let r = resample_with(
                    &source,
                    &x,
                    &y,
                    resampling,
                    PassOrder::default(),
                    0,
                    &mut out,
                    4,
                    4,
                );
                assert!(r.is_err(), "{bad:?}");
                let fast = ImagePlan::new(&x, &y, resampling, PassOrder::default())
                    .and_then(|p| self::fast(&p, &source, 0, 4, 4, Kernels::detect()));
                assert!(fast.is_err(), "{bad:?}");
            }
        }
    }
    let r = resample(&src, 8, 8, 2, &good, &good, Filter::Box, 0, &mut out, 4, 4);
    assert_eq!(r, Err(PlanError::Channels(2)));
    let r = resample(
        &src[1..],
        8,
        8,
        3,
        &good,
        &good,
        Filter::Box,
        0,
        &mut out,
        4,
        4,
    );
    assert!(matches!(r, Err(PlanError::BufferSize { .. })));
    let plan =
        ImagePlan::new(&good, &good, Resampling::Nearest, PassOrder::default()).expect("plan");
    let short = HostImage {
        pixels: &src[1..],
        ..source
    };
    assert!(matches!(
        fast(&plan, &short, 0, 4, 4, Kernels::Portable),
        Err(PlanError::BufferSize { .. })
    ));
}

#[test]
fn a_copy_is_exact_and_pads_around() {
    // 2x2 RGB copied into the middle of a 4x4 output padded with 7.
    let src: Vec<u8> = (1..=12).collect();
    let x = AxisPlan::letterbox(2, 2, 4);
    let y = AxisPlan::letterbox(2, 2, 4);
    let source = HostImage {
        pixels: &src,
        width: 2,
        height: 2,
        channels: 3,
    };
    for resampling in ALL {
        let plan = ImagePlan::new(&x, &y, resampling, PassOrder::default()).expect("plan");
        let out = fast(&plan, &source, 7, 4, 4, Kernels::detect()).expect("copy");
        let at = |px: usize, py: usize| &out[(py * 4 + px) * 3..(py * 4 + px) * 3 + 3];
        assert_eq!(at(1, 1), &[1, 2, 3]);
        assert_eq!(at(2, 2), &[10, 11, 12]);
        assert_eq!(at(0, 0), &[7, 7, 7]);
        assert_eq!(at(3, 3), &[7, 7, 7]);
    }
}

#[test]
fn gray_is_spread_to_rgb() {
    let src = [0u8, 255, 255, 0];
    let p = AxisPlan::stretch(2, 3);
    let source = HostImage {
        pixels: &src,
        width: 2,
        height: 2,
        channels: 1,
    };
    for resampling in ALL {
        let plan = ImagePlan::new(&p, &p, resampling, PassOrder::default()).expect("plan");
        let out = fast(&plan, &source, 0, 3, 3, Kernels::detect()).expect("gray");
        assert!(out.chunks(3).all(|px| px[0] == px[1] && px[1] == px[2]));
    }
}

/// The port reproduces Pillow itself: on every golden of tests/golden/ whose input decodes
/// losslessly (PNG), the planner's plans and the CPU passes give Pillow's bytes exactly
/// (torchvision's Resize + CenterCrop, other sizes, stretch, letterbox, bicubic, Lanczos,
/// nearest), and so does the scalar reference.
#[test]
fn equals_pillow_on_the_png_goldens() {
    use crate::geometry::Geometry;
    use crate::options::{Interpolation, ResizeMode, ResizeOptions};
    let manifest = std::fs::read_to_string("tests/golden/MANIFEST.txt").expect("manifest");
    let mut compared = 0;
    for line in manifest.lines().filter(|l| !l.starts_with('#')) {
        let f: Vec<&str> = line.split_whitespace().collect();
        let (input, golden, variant) = (f[0], f[1], f.get(3).copied().unwrap_or("default"));
        // 16-bit files go through Pillow's own 16-bit conversion first.
        if !input.ends_with(".png") || input.contains("16") {
            continue;
        }
        let torchvision = ResizeMode::center_crop(256, 224);
        let (mode, interpolation) = match variant {
            "default" => (torchvision, Interpolation::Bilinear),
            "bicubic" => (torchvision, Interpolation::Bicubic),
            "lanczos" => (torchvision, Interpolation::Lanczos),
            "nearest" => (torchvision, Interpolation::Nearest),
            "r160c128" => (ResizeMode::center_crop(160, 128), Interpolation::Bilinear),
            "stretch224" => (ResizeMode::stretch(224, 224), Interpolation::Bilinear),
            "letterbox224" => (
                ResizeMode::letterbox(224, 224, 114),
                Interpolation::Bilinear,
            ),
            _ => continue,
        };
        let geometry = Geometry::new(
            &ResizeOptions::default()
                .mode(mode)
                .interpolation(interpolation),
        );
        let source = image::open(input).expect("input").to_rgb8();
        let (w, h) = source.dimensions();
        let (x, y) = geometry.axis_plans(w, h, None);
        let (ow, oh) = (geometry.width, geometry.height);
        let want = image::open(format!("tests/golden/{golden}"))
            .expect("golden")
            .to_rgb8();
        let host = HostImage {
            pixels: source.as_raw(),
            width: w,
            height: h,
            channels: 3,
        };
        let mut reference = vec![0xA5; ow as usize * oh as usize * 3];
        resample_with(
            &host,
            &x,
            &y,
            geometry.resampling(),
            PassOrder::default(),
            geometry.pad(),
            &mut reference,
            ow,
            oh,
        )
        .expect("reference");
        let plan =
            ImagePlan::new(&x, &y, geometry.resampling(), PassOrder::default()).expect("plan");
        for (what, out) in [
            ("reference", reference),
            (
                "portable",
                fast(&plan, &host, geometry.pad(), ow, oh, Kernels::Portable).expect("portable"),
            ),
            (
                "detected",
                fast(&plan, &host, geometry.pad(), ow, oh, Kernels::detect()).expect("fast"),
            ),
        ] {
            let differing = want
                .as_raw()
                .iter()
                .zip(&out)
                .filter(|(a, b)| a != b)
                .count();
            assert_eq!(
                differing, 0,
                "{input} {variant} ({what}): {differing} bytes differ from Pillow"
            );
        }
        compared += 1;
    }
    assert!(compared >= 13, "only {compared} goldens compared");
}
