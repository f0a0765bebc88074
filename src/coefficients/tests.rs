//! The CPU rendition against libjpeg-turbo's own decode, bit for bit, on every case; windows
//! and early stops against the whole decode.

use turbojpeg_region::{CoefficientReader, Colorspace};

use super::cases::{cases, samplings, turbo_decode};
use super::reference::render;
use super::*;
use gpufeed_bench::upload::random_bytes;

/// Reads `jpeg`'s coefficients whole and its layout.
fn read(reader: &mut CoefficientReader, jpeg: &[u8]) -> (Layout, DenseCoefficients, bool) {
    let coefficients = reader.open(jpeg).unwrap().read(None).unwrap();
    assert!(!coefficients.block_smoothing());
    let layout = Layout::new(coefficients.header()).unwrap();
    let gray = coefficients.header().colorspace == Colorspace::Gray;
    (
        layout,
        DenseCoefficients::copy(&coefficients).unwrap(),
        gray,
    )
}

/// The pixels of `window` cut from a whole image `width` wide.
fn cut(whole: &[u8], width: u32, channels: usize, window: &Window) -> Vec<u8> {
    let mut out = Vec::new();
    for row in window.y..window.y + window.height {
        let start = (row * width + window.x) as usize * channels;
        out.extend_from_slice(&whole[start..start + window.width as usize * channels]);
    }
    out
}

/// Where two images first differ, for messages.
fn first_difference(a: &[u8], b: &[u8], width: u32, channels: usize) -> String {
    match a.iter().zip(b).position(|(x, y)| x != y) {
        Some(i) => {
            let pixel = i / channels;
            format!(
                "first difference at ({}, {}) channel {}: {} vs {}",
                pixel as u32 % width,
                pixel as u32 / width,
                i % channels,
                a[i],
                b[i]
            )
        }
        None => format!("lengths {} vs {}", a.len(), b.len()),
    }
}

#[test]
fn the_cpu_rendition_equals_libjpeg_turbo_on_every_case() {
    let mut reader = CoefficientReader::new().unwrap();
    let all = cases(1);
    assert!(all.len() > 120);
    for case in &all {
        let (layout, dense, gray) = read(&mut reader, &case.jpeg);
        let (expected, w, h) = turbo_decode(&case.jpeg, gray);
        assert_eq!((layout.width, layout.height), (w, h), "{}", case.name);
        let channels = layout.channels();
        assert_eq!(channels, if gray { 1 } else { 3 });
        let mut got = vec![0xA5; expected.len()];
        let window = Window::whole(w, h);
        render(&dense, &layout, &window, &mut got, w as usize * channels).unwrap();
        assert!(
            got == expected,
            "{}: {}",
            case.name,
            first_difference(&got, &expected, w, channels)
        );
    }
}

#[test]
fn windows_and_early_stops_give_the_pixels_of_the_whole_decode() {
    let mut reader = CoefficientReader::new().unwrap();
    let all = cases(2);
    let picks = random_bytes(all.len() * 16, 3);
    let mut stopped = 0;
    for (n, case) in all.iter().enumerate() {
        let (layout, _, gray) = read(&mut reader, &case.jpeg);
        let (whole, w, h) = turbo_decode(&case.jpeg, gray);
        let channels = layout.channels();
        let p = |k: usize| u32::from(picks[n * 16 + k]);
        for k in 0..2 {
            let x = p(4 * k) * w / 256;
            let y = p(4 * k + 1) * h / 256;
            let window = Window {
                x,
                y,
                width: (1 + p(4 * k + 2) * (w - x) / 256).min(w - x),
                height: (1 + p(4 * k + 3) * (h - y) / 256).min(h - y),
            };
            // Only the iMCU rows the window needs are entropy-decoded.
            let rows = layout.imcu_rows_for(&window);
            let coefficients = reader.open(&case.jpeg).unwrap().read(Some(rows)).unwrap();
            if coefficients.stopped_early() {
                stopped += 1;
            }
            let pitch = window.width as usize * channels + 3;
            let mut got = vec![0xA5; pitch * window.height as usize];
            render(&coefficients, &layout, &window, &mut got, pitch).unwrap();
            let expected = cut(&whole, w, channels, &window);
            let got: Vec<u8> = got
                .chunks(pitch)
                .flat_map(|row| &row[..window.width as usize * channels])
                .copied()
                .collect();
            assert!(
                got == expected,
                "{} {window:?}: {}",
                case.name,
                first_difference(&got, &expected, window.width, channels)
            );
        }
    }
    assert!(stopped > 10, "only {stopped} windows stopped early");
}

#[test]
fn layouts_pick_libjpegs_upsampling_routines() {
    let mut reader = CoefficientReader::new().unwrap();
    let pixels = random_bytes(40 * 40 * 3, 5);
    let expected: &[(&str, [Upsampling; 3])] = &[
        ("444", [Upsampling::Full; 3]),
        (
            "422",
            [
                Upsampling::Full,
                Upsampling::FancyH2V1,
                Upsampling::FancyH2V1,
            ],
        ),
        (
            "420",
            [
                Upsampling::Full,
                Upsampling::FancyH2V2,
                Upsampling::FancyH2V2,
            ],
        ),
        (
            "440",
            [
                Upsampling::Full,
                Upsampling::FancyH1V2,
                Upsampling::FancyH1V2,
            ],
        ),
        (
            "411",
            [
                Upsampling::Full,
                Upsampling::Box { h: 4, v: 1 },
                Upsampling::Box { h: 4, v: 1 },
            ],
        ),
        (
            "y1x1-c2x2",
            [Upsampling::FancyH2V2, Upsampling::Full, Upsampling::Full],
        ),
        (
            "y2x2-cb1x1-cr2x1",
            [
                Upsampling::Full,
                Upsampling::FancyH2V2,
                Upsampling::FancyH1V2,
            ],
        ),
        (
            "y3x1",
            [
                Upsampling::Full,
                Upsampling::Box { h: 3, v: 1 },
                Upsampling::Box { h: 3, v: 1 },
            ],
        ),
        (
            "y4x2",
            [
                Upsampling::Full,
                Upsampling::Box { h: 4, v: 2 },
                Upsampling::Box { h: 4, v: 2 },
            ],
        ),
        (
            "y1x4-c1x2",
            [
                Upsampling::Full,
                Upsampling::FancyH1V2,
                Upsampling::FancyH1V2,
            ],
        ),
        (
            "y2x2-c1x2",
            [
                Upsampling::Full,
                Upsampling::FancyH2V1,
                Upsampling::FancyH2V1,
            ],
        ),
        (
            "y3x2-cb1x1-cr3x1",
            [
                Upsampling::Full,
                Upsampling::Box { h: 3, v: 2 },
                Upsampling::FancyH1V2,
            ],
        ),
    ];
    for (name, sampling) in samplings() {
        let options = turbojpeg_region::EncodeOptions {
            sampling,
            ..Default::default()
        };
        let jpeg =
            turbojpeg_region::encode(&pixels, 40, 40, turbojpeg_region::Format::Rgb, &options)
                .unwrap();
        let header = reader.open(&jpeg).unwrap().header().clone();
        let layout = Layout::new(&header).unwrap();
        let routines: Vec<Upsampling> = layout.components.iter().map(|c| c.upsampling).collect();
        let want = expected.iter().find(|(n, _)| *n == name).unwrap().1;
        assert_eq!(routines, want, "{name}");
        assert_eq!(layout.conversion, Conversion::YCbCr);
    }
    // Two chroma samples across or fewer: replication, not the triangle filter.
    let tiny = turbojpeg_region::encode(
        &pixels[..4 * 3 * 3],
        4,
        3,
        turbojpeg_region::Format::Rgb,
        &Default::default(),
    )
    .unwrap();
    let layout = Layout::new(reader.open(&tiny).unwrap().header()).unwrap();
    assert_eq!(
        layout.components[1].upsampling,
        Upsampling::Box { h: 2, v: 2 }
    );
    // Fractional factors: libjpeg refuses them, and so does the path. (Its encoder will not
    // write them either: a 3x1 file's Cb is made 2x1 in the frame header.)
    let three = turbojpeg_region::EncodeOptions {
        sampling: turbojpeg_region::Sampling([(3, 1), (1, 1), (1, 1)]),
        ..Default::default()
    };
    let mut jpeg =
        turbojpeg_region::encode(&pixels, 40, 40, turbojpeg_region::Format::Rgb, &three).unwrap();
    let sof = jpeg.windows(2).position(|m| m == [0xFF, 0xC0]).unwrap();
    // FFC0, length (2), precision, height (2), width (2), count, then (id, HV, table) each.
    let cb_factors = sof + 2 + 2 + 1 + 4 + 1 + 3 + 1;
    assert_eq!(jpeg[cb_factors], 0x11);
    jpeg[cb_factors] = 0x21;
    assert!(matches!(
        Layout::new(reader.open(&jpeg).unwrap().header()),
        Err(Error::Unsupported(_))
    ));
    let mut decoder = turbojpeg_region::Decoder::new().unwrap();
    let header = decoder.read_header(&jpeg).unwrap();
    let request = turbojpeg_region::Request {
        format: turbojpeg_region::Format::Rgb,
        reduction: 1,
        region: None,
    };
    let mut out = vec![0; request.output_len(&header)];
    assert!(decoder.decompress(&jpeg, &request, &mut out).is_err());
    // CMYK has no conversion to RGB in libjpeg.
    let cmyk = super::cases::repo_file("tests/fixtures/cmyk.jpg");
    assert!(matches!(
        Layout::new(reader.open(&cmyk).unwrap().header()),
        Err(Error::Unsupported(_))
    ));
}

#[test]
fn windows_need_their_blocks_and_no_more() {
    let mut reader = CoefficientReader::new().unwrap();
    let pixels = random_bytes(200 * 120 * 3, 6);
    let jpeg = turbojpeg_region::encode(
        &pixels,
        200,
        120,
        turbojpeg_region::Format::Rgb,
        &Default::default(),
    )
    .unwrap();
    let layout = Layout::new(reader.open(&jpeg).unwrap().header()).unwrap();
    // Luma is full size: pixels 40..72 across are blocks 5..9; rows 0..16 blocks 0..2.
    let window = Window {
        x: 40,
        y: 0,
        width: 32,
        height: 16,
    };
    assert_eq!(
        layout.blocks(0, &window),
        BlockRect {
            x0: 5,
            y0: 0,
            x1: 9,
            y1: 2
        }
    );
    // Chroma (4:2:0, fancy): samples 20..36 across plus one each side, 0..8 down plus one below.
    assert_eq!(layout.samples(1, &window), (19, 0, 37, 9));
    assert_eq!(
        layout.blocks(1, &window),
        BlockRect {
            x0: 2,
            y0: 0,
            x1: 5,
            y1: 2
        }
    );
    // The second chroma block row is in the second iMCU row.
    assert_eq!(layout.imcu_rows_for(&window), 2);
    assert_eq!(layout.imcu_rows_for(&Window::whole(200, 120)), 8);
    assert!(layout
        .check(&Window {
            x: 190,
            y: 0,
            width: 11,
            height: 1
        })
        .is_err());
    assert!(layout
        .check(&Window {
            x: 0,
            y: 0,
            width: 0,
            height: 1
        })
        .is_err());
    let mut out = vec![0; 10];
    assert!(matches!(
        render(
            &reader.open(&jpeg).unwrap().read(None).unwrap(),
            &layout,
            &window,
            &mut out,
            96
        ),
        Err(Error::Request(_))
    ));
}

#[test]
fn packing_is_lossless_and_compact() {
    use super::pack::{pack, packed_bound, Unpacked};
    let mut reader = CoefficientReader::new().unwrap();
    let all = cases(5);
    let picks = random_bytes(all.len() * 4, 11);
    let mut out = Vec::new();
    for (n, case) in all.iter().enumerate() {
        let coefficients = reader.open(&case.jpeg).unwrap().read(None).unwrap();
        let layout = Layout::new(coefficients.header()).unwrap();
        let (w, h) = (layout.width, layout.height);
        let p = |k: usize| u32::from(picks[n * 4 + k]);
        let (x, y) = (p(0) * w / 256, p(1) * h / 256);
        let window = Window {
            x,
            y,
            width: (1 + p(2) * (w - x) / 256).min(w - x),
            height: (1 + p(3) * (h - y) / 256).min(h - y),
        };
        // Images follow one another in one buffer.
        let at = out.len();
        let image = pack(&coefficients, &layout, &window, &mut out).unwrap();
        assert_eq!(out.len() - at, image.bytes);
        assert_eq!(image.bytes % 8, 0);
        assert!(
            image.bytes <= packed_bound(&layout, &window),
            "{}",
            case.name
        );
        let unpacked = Unpacked::new(&out[at..], &image).unwrap();
        for (c, packed) in image.components().enumerate() {
            assert_eq!(packed.blocks, layout.blocks(c, &window));
            assert_eq!(
                CoefficientSource::quant_table(&unpacked, c),
                coefficients.quant_table(c)
            );
            for by in packed.blocks.y0..packed.blocks.y1 {
                let got = CoefficientSource::block_row(&unpacked, c, by).unwrap();
                let want = coefficients.block_row(c, by).unwrap();
                let span = packed.blocks.x0 as usize * 64..packed.blocks.x1 as usize * 64;
                assert_eq!(got[span.clone()], want[span], "{} component {c}", case.name);
            }
        }
        let channels = layout.channels();
        let pitch = window.width as usize * channels;
        let mut from_source = vec![0; pitch * window.height as usize];
        let mut from_packed = vec![1; pitch * window.height as usize];
        render(&coefficients, &layout, &window, &mut from_source, pitch).unwrap();
        render(&unpacked, &layout, &window, &mut from_packed, pitch).unwrap();
        assert!(from_source == from_packed, "{}", case.name);
        // A buffer that does not end on 8 bytes is refused.
        if n == 0 {
            let mut odd = vec![0u8; 3];
            assert!(matches!(
                pack(&coefficients, &layout, &window, &mut odd),
                Err(Error::Request(_))
            ));
        }
    }
    // On a real photo the format is several times smaller than dense coefficients (2 bytes
    // each, 64 a block).
    for file in ["assets/retina.jpg", "assets/hubble_deep_field.jpg"] {
        let jpeg = super::cases::repo_file(file);
        let coefficients = reader.open(&jpeg).unwrap().read(None).unwrap();
        let layout = Layout::new(coefficients.header()).unwrap();
        let window = Window::whole(layout.width, layout.height);
        let mut packed = Vec::new();
        let image = pack(&coefficients, &layout, &window, &mut packed).unwrap();
        let dense: u64 = (0..3)
            .map(|c| layout.blocks(c, &window).blocks() * 128)
            .sum();
        assert!(
            (image.bytes as u64) * 3 < dense,
            "{file}: {} packed bytes, {dense} dense",
            image.bytes
        );
    }
}
