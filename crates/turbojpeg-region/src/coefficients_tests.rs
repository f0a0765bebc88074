//! Tests of the coefficient reader on files written here: every entropy coding of one image
//! gives the same coefficients, headers say what was written, an early stop keeps the rows above
//! it, and bad files are typed errors that leave the reader usable.

use super::*;
use crate::{encode, Decoder, EncodeOptions, Error, Format, Request, Restart, Sampling};

/// A bundled photo, found from wherever the tests run.
fn asset(name: &str) -> Vec<u8> {
    let cwd = std::env::current_dir().expect("current directory");
    let path = cwd
        .ancestors()
        .map(|dir| dir.join("assets").join(name))
        .find(|path| path.is_file())
        .unwrap_or_else(|| panic!("assets/{name} not found above {}", cwd.display()));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Pseudo-random bytes (xorshift), the same on every run for a seed.
fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// An RGB image with edges, gradients and noise, so that every frequency has coefficients.
fn picture(width: u32, height: u32, seed: u64) -> Vec<u8> {
    let grain = noise(seed, (width * height * 3) as usize);
    let mut pixels = Vec::with_capacity(grain.len());
    for y in 0..height {
        for x in 0..width {
            for c in 0..3u32 {
                let i = ((y * width + x) * 3 + c) as usize;
                let ramp = (x * (60 + 40 * c) / width.max(1) + y * 90 / height.max(1)) as i32;
                let edge = if (x / 7 + y / 5 + c).is_multiple_of(3) {
                    60
                } else {
                    0
                };
                let v = 40 + ramp + edge + (grain[i] as i32 - 128) / 4;
                pixels.push(v.clamp(0, 255) as u8);
            }
        }
    }
    pixels
}

/// The photo `name` decoded to RGB, as a source of real content.
fn photo(name: &str) -> (Vec<u8>, u32, u32) {
    let jpeg = asset(name);
    let mut decoder = Decoder::new().unwrap();
    let header = decoder.read_header(&jpeg).unwrap();
    let request = Request {
        format: Format::Rgb,
        reduction: 1,
        region: None,
    };
    let mut out = vec![0; request.output_len(&header)];
    decoder.decompress(&jpeg, &request, &mut out).unwrap();
    (out, header.width, header.height)
}

/// Every block row of every component, copied.
fn all_coefficients(jpeg: &[u8]) -> (CoefficientHeader, Vec<Vec<i16>>, Vec<[u16; 64]>) {
    let mut reader = CoefficientReader::new().unwrap();
    let coefficients = reader.open(jpeg).unwrap().read(None).unwrap();
    let header = coefficients.header().clone();
    let mut planes = Vec::new();
    let mut tables = Vec::new();
    for (c, info) in header.components().iter().enumerate() {
        let mut plane =
            vec![0x5A5A_u16 as i16; (info.blocks_wide * info.blocks_high * 64) as usize];
        coefficients.copy_component(c, &mut plane).unwrap();
        planes.push(plane);
        tables.push(*coefficients.quant_table(c).unwrap());
    }
    assert!(coefficients.warning().is_none());
    assert!(!coefficients.stopped_early());
    assert!(!coefficients.block_smoothing());
    (header, planes, tables)
}

#[test]
fn every_entropy_coding_gives_the_same_coefficients() {
    let (rocket, rw, rh) = photo("rocket.jpg");
    let images = [(picture(61, 37, 1), 61, 37), (rocket, rw, rh)];
    for (pixels, w, h) in &images {
        for sampling in [
            Sampling::S444,
            Sampling::S422,
            Sampling::S420,
            Sampling::S440,
        ] {
            let base = EncodeOptions {
                sampling,
                quality: 85,
                ..EncodeOptions::default()
            };
            let (header, planes, tables) =
                all_coefficients(&encode(pixels, *w, *h, Format::Rgb, &base).unwrap());
            assert!(!header.progressive && !header.arithmetic && header.stops_early);
            assert_eq!(header.restart_interval, 0);
            // Some AC energy in every component, or the comparison proves little.
            for plane in &planes {
                assert!(plane.chunks(64).any(|b| b[1..].iter().any(|&v| v != 0)));
            }
            let variants = [
                EncodeOptions {
                    progressive: true,
                    ..base
                },
                EncodeOptions {
                    arithmetic: true,
                    ..base
                },
                EncodeOptions {
                    progressive: true,
                    arithmetic: true,
                    ..base
                },
                EncodeOptions {
                    restart: Restart::Mcus(3),
                    ..base
                },
                EncodeOptions {
                    restart: Restart::Rows(1),
                    optimize: true,
                    ..base
                },
            ];
            for options in variants {
                let jpeg = encode(pixels, *w, *h, Format::Rgb, &options).unwrap();
                let (other, other_planes, other_tables) = all_coefficients(&jpeg);
                assert_eq!(other.progressive, options.progressive);
                assert_eq!(other.arithmetic, options.arithmetic);
                assert_eq!(
                    other.stops_early,
                    !options.progressive && !options.arithmetic
                );
                assert_eq!(other.components(), header.components());
                assert_eq!(other_tables, tables, "{options:?}");
                assert!(other_planes == planes, "{w}x{h} {options:?}");
                if let Restart::Mcus(n) = options.restart {
                    assert_eq!(other.restart_interval, u32::from(n));
                }
            }
        }
    }
}

#[test]
fn headers_give_the_block_grids_libjpeg_uses() {
    // 4:2:0, 17x9: luma 3x2 blocks (padded to the 2x2 MCU: 4x2), chroma 9x5 samples in 2x1.
    let jpeg = encode(
        &picture(17, 9, 2),
        17,
        9,
        Format::Rgb,
        &EncodeOptions::default(),
    )
    .unwrap();
    let mut reader = CoefficientReader::new().unwrap();
    let opened = reader.open(&jpeg).unwrap();
    let header = opened.header().clone();
    assert_eq!((header.width, header.height), (17, 9));
    assert_eq!(header.colorspace, Colorspace::YCbCr);
    assert!(header.jfif);
    assert_eq!(header.adobe_transform, None);
    assert_eq!((header.max_h_samp, header.max_v_samp), (2, 2));
    assert_eq!(header.imcu_rows, 1);
    assert_eq!(header.imcu_height(), 16);
    let luma = header.components()[0];
    assert_eq!((luma.h_samp, luma.v_samp), (2, 2));
    assert_eq!((luma.blocks_wide, luma.blocks_high), (3, 2));
    assert_eq!((luma.padded_blocks_wide, luma.padded_blocks_high), (4, 2));
    assert_eq!((luma.samples_wide, luma.samples_high), (17, 9));
    let chroma = header.components()[1];
    assert_eq!((chroma.h_samp, chroma.v_samp), (1, 1));
    assert_eq!((chroma.blocks_wide, chroma.blocks_high), (2, 1));
    assert_eq!((chroma.samples_wide, chroma.samples_high), (9, 5));
    let coefficients = opened.read(None).unwrap();
    assert_eq!(coefficients.block_rows_read(0), 2);
    assert_eq!(coefficients.block_row(0, 1).unwrap().len(), 3 * 64);
    assert!(matches!(
        coefficients.block_row(0, 2),
        Err(CoefficientError::Request(_))
    ));
    assert!(matches!(
        coefficients.block_row(3, 0),
        Err(CoefficientError::Request(_))
    ));
    assert!(coefficients.quant_table(3).is_none());
    let mut small = vec![0; 10];
    assert!(matches!(
        coefficients.copy_component(0, &mut small),
        Err(CoefficientError::Request(_))
    ));

    // Odd factors: Y 3x1 with chroma 1x1 (an MCU 24 pixels wide), RGB with an Adobe marker,
    // gray from RGB pixels.
    let odd = EncodeOptions {
        sampling: Sampling([(3, 1), (1, 1), (1, 1)]),
        ..EncodeOptions::default()
    };
    let jpeg = encode(&picture(50, 20, 3), 50, 20, Format::Rgb, &odd).unwrap();
    let header = reader.open(&jpeg).unwrap().header().clone();
    assert_eq!((header.max_h_samp, header.max_v_samp), (3, 1));
    assert_eq!(header.components()[1].samples_wide, 17); // ceil(50 / 3)
    assert_eq!(header.components()[0].padded_blocks_wide, 9); // 7 up to a multiple of 3
    let rgb = EncodeOptions {
        colorspace: Colorspace::Rgb,
        sampling: Sampling::S444,
        ..EncodeOptions::default()
    };
    let jpeg = encode(&picture(20, 20, 4), 20, 20, Format::Rgb, &rgb).unwrap();
    let header = reader.open(&jpeg).unwrap().header().clone();
    assert_eq!(header.colorspace, Colorspace::Rgb);
    assert_eq!(header.adobe_transform, Some(0));
    let gray = EncodeOptions {
        colorspace: Colorspace::Gray,
        sampling: Sampling::S444,
        ..EncodeOptions::default()
    };
    let jpeg = encode(&picture(20, 20, 5), 20, 20, Format::Rgb, &gray).unwrap();
    let header = reader.open(&jpeg).unwrap().header().clone();
    assert_eq!(header.colorspace, Colorspace::Gray);
    assert_eq!(header.components().len(), 1);
}

#[test]
fn a_flat_image_has_only_dc_coefficients() {
    // Gray 200 everywhere: every block's DC is (200 - 128) * 8 / q[0], rounded, AC all zero.
    let pixels = vec![200u8; 40 * 24];
    let options = EncodeOptions {
        colorspace: Colorspace::Gray,
        sampling: Sampling::S444,
        quality: 50,
        ..EncodeOptions::default()
    };
    let jpeg = encode(&pixels, 40, 24, Format::Gray, &options).unwrap();
    let (header, planes, tables) = all_coefficients(&jpeg);
    assert_eq!(header.components()[0].blocks_wide, 5);
    let q = f64::from(tables[0][0]);
    let dc = ((200.0 - 128.0) * 8.0 / q).round() as i16;
    for block in planes[0].chunks(64) {
        assert_eq!(block[0], dc);
        assert!(block[1..].iter().all(|&v| v == 0));
    }
    // libjpeg's standard luminance table at quality 50 is the table itself: 16 at DC, 11 next
    // across (natural index 1), 12 next down (index 8).
    assert_eq!((tables[0][0], tables[0][1], tables[0][8]), (16, 11, 12));
}

#[test]
fn an_early_stop_keeps_the_rows_above_it() {
    let (pixels, w, h) = photo("rocket.jpg");
    for options in [
        EncodeOptions::default(),
        EncodeOptions {
            restart: Restart::Mcus(5),
            sampling: Sampling::S422,
            ..EncodeOptions::default()
        },
    ] {
        let jpeg = encode(&pixels, w, h, Format::Rgb, &options).unwrap();
        let (header, planes, _) = all_coefficients(&jpeg);
        let mut reader = CoefficientReader::new().unwrap();
        for stop in [1, 3, header.imcu_rows - 1] {
            let coefficients = reader.open(&jpeg).unwrap().read(Some(stop)).unwrap();
            assert!(coefficients.stopped_early());
            // The stop is not the data's fault.
            assert_eq!(coefficients.warning(), None);
            for (c, info) in header.components().iter().enumerate() {
                let rows = coefficients.block_rows_read(c);
                assert_eq!(rows, stop * u32::from(info.v_samp));
                let row_len = info.blocks_wide as usize * 64;
                let mut got = vec![0; rows as usize * row_len];
                coefficients.copy_component(c, &mut got).unwrap();
                assert!(
                    got[..] == planes[c][..got.len()],
                    "stop {stop} component {c}"
                );
                assert!(coefficients.block_row(c, rows).is_err());
            }
        }
        // Past the end: the whole image, not an early stop.
        let coefficients = reader
            .open(&jpeg)
            .unwrap()
            .read(Some(header.imcu_rows + 5))
            .unwrap();
        assert!(!coefficients.stopped_early());
        assert_eq!(
            coefficients.block_rows_read(0),
            header.components()[0].blocks_high
        );
    }
    // A progressive file is read whole whatever the stop.
    let progressive = EncodeOptions {
        progressive: true,
        ..EncodeOptions::default()
    };
    let jpeg = encode(&pixels, w, h, Format::Rgb, &progressive).unwrap();
    let mut reader = CoefficientReader::new().unwrap();
    assert!(!reader.open(&jpeg).unwrap().header().stops_early);
    let coefficients = reader.open(&jpeg).unwrap().read(Some(1)).unwrap();
    assert!(!coefficients.stopped_early());
    assert_eq!(
        coefficients.block_rows_read(0),
        coefficients.header().components()[0].blocks_high
    );
}

/// A TurboJPEG compression with a precision (8, 12) and lossless flag, for the files the
/// encoder above does not write.
fn turbojpeg_file(precision: i32, lossless: bool) -> Vec<u8> {
    use turbojpeg_sys as sys;
    let (w, h) = (16, 16);
    // SAFETY: a compressor handle used only here and destroyed below; the parameters are
    // valid TJPARAMs; the pixel buffer holds w * h * 3 samples of the precision's type, and the
    // output pointer and size are written by the call and freed with tj3Free.
    unsafe {
        let handle = sys::tj3Init(sys::TJINIT_TJINIT_COMPRESS as i32);
        assert!(!handle.is_null());
        sys::tj3Set(handle, sys::TJPARAM_TJPARAM_SUBSAMP as i32, 0);
        sys::tj3Set(handle, sys::TJPARAM_TJPARAM_QUALITY as i32, 90);
        sys::tj3Set(handle, sys::TJPARAM_TJPARAM_PRECISION as i32, precision);
        if lossless {
            sys::tj3Set(handle, sys::TJPARAM_TJPARAM_LOSSLESS as i32, 1);
        }
        let mut out: *mut u8 = std::ptr::null_mut();
        let mut size: sys::size_t = 0;
        let status = if precision == 12 {
            let pixels: Vec<i16> = (0..w * h * 3).map(|i| (i * 13 % 4096) as i16).collect();
            sys::tj3Compress12(
                handle,
                pixels.as_ptr(),
                w,
                0,
                h,
                sys::TJPF_TJPF_RGB,
                &mut out,
                &mut size,
            )
        } else {
            let pixels: Vec<u8> = (0..w * h * 3).map(|i| (i * 13 % 256) as u8).collect();
            sys::tj3Compress8(
                handle,
                pixels.as_ptr(),
                w,
                0,
                h,
                sys::TJPF_TJPF_RGB,
                &mut out,
                &mut size,
            )
        };
        assert_eq!(status, 0);
        let file = std::slice::from_raw_parts(out, size as usize).to_vec();
        sys::tj3Free(out as *mut libc::c_void);
        sys::tj3Destroy(handle);
        file
    }
}

#[test]
fn bad_and_unsupported_files_are_typed_errors() {
    let mut reader = CoefficientReader::new().unwrap();
    assert!(matches!(
        reader.open(b""),
        Err(CoefficientError::Request(_))
    ));
    assert!(matches!(
        reader.open(b"\xFF\xD8\xFF not a jpeg"),
        Err(CoefficientError::Corrupt(_))
    ));
    assert!(matches!(
        reader.open(b"GIF89a....."),
        Err(CoefficientError::Corrupt(_))
    ));
    let twelve = turbojpeg_file(12, false);
    match reader.open(&twelve) {
        Err(CoefficientError::Unsupported(m)) => assert!(m.contains("12-bit"), "{m}"),
        other => panic!("12-bit: {other:?}"),
    }
    let lossless = turbojpeg_file(8, true);
    let result = reader
        .open(&lossless)
        .and_then(|o| o.read(None).map(|_| ()));
    assert!(
        matches!(result, Err(CoefficientError::Unsupported(_))),
        "lossless: {result:?}"
    );

    // A file cut in half: read to its end with libjpeg's warning, the missing rows zero, as in
    // libjpeg's own decode.
    let (pixels, w, h) = photo("rocket.jpg");
    let jpeg = encode(&pixels, w, h, Format::Rgb, &EncodeOptions::default()).unwrap();
    let (_, planes, _) = all_coefficients(&jpeg);
    let cut = &jpeg[..jpeg.len() / 2];
    let coefficients = reader.open(cut).unwrap().read(None).unwrap();
    let warning = coefficients.warning().expect("a warning").to_string();
    assert!(warning.contains("Premature end of JPEG file"), "{warning}");
    let info = coefficients.header().components()[0];
    let last = coefficients.block_row(0, info.blocks_high - 1).unwrap();
    assert!(last.iter().all(|&v| v == 0));
    let first = coefficients.block_row(0, 0).unwrap();
    assert_eq!(first, &planes[0][..first.len()]);
    drop(coefficients);

    // Progressive files have a scan limit.
    let progressive = encode(
        &pixels,
        w,
        h,
        Format::Rgb,
        &EncodeOptions {
            progressive: true,
            ..EncodeOptions::default()
        },
    )
    .unwrap();
    reader.set_scan_limit(3);
    assert_eq!(
        reader.open(&progressive).unwrap().read(None).unwrap_err(),
        CoefficientError::TooManyScans(3)
    );
    reader.set_scan_limit(0);
    // ... and one cut short is read with its last scans missing, which libjpeg's decoder would
    // smooth over (a cut in the last scan would not: libjpeg counts a scan's coefficients as
    // complete when the scan starts).
    let cut = &progressive[..progressive.len() / 3];
    let coefficients = reader.open(cut).unwrap().read(None).unwrap();
    assert!(coefficients.warning().is_some());
    assert!(coefficients.block_smoothing());
    drop(coefficients);

    // The reader is still usable after all of this.
    let (_, again, _) = all_coefficients(&jpeg);
    assert!(again == planes);
    let coefficients = reader.open(&jpeg).unwrap().read(None).unwrap();
    assert_eq!(
        coefficients.block_row(0, 0).unwrap(),
        &planes[0][..first_len(&coefficients)]
    );
}

fn first_len(coefficients: &Coefficients<'_>) -> usize {
    coefficients.header().components()[0].blocks_wide as usize * 64
}

#[test]
fn cmyk_files_are_read_as_four_components() {
    let cwd = std::env::current_dir().unwrap();
    let path = cwd
        .ancestors()
        .map(|d| d.join("tests/fixtures/cmyk.jpg"))
        .find(|p| p.is_file())
        .expect("tests/fixtures/cmyk.jpg");
    let jpeg = std::fs::read(path).unwrap();
    let mut reader = CoefficientReader::new().unwrap();
    let coefficients = reader.open(&jpeg).unwrap().read(None).unwrap();
    assert_eq!(coefficients.header().colorspace, Colorspace::Cmyk);
    assert_eq!(coefficients.header().components().len(), 4);
    assert!(coefficients.block_row(3, 0).is_ok());
}

#[test]
fn encoder_rejects_what_it_cannot_write() {
    let pixels = picture(8, 8, 9);
    assert!(encode(&pixels, 8, 9, Format::Rgb, &EncodeOptions::default()).is_err());
    let bad_quality = EncodeOptions {
        quality: 0,
        ..EncodeOptions::default()
    };
    assert!(encode(&pixels, 8, 8, Format::Rgb, &bad_quality).is_err());
    let cmyk = EncodeOptions {
        colorspace: Colorspace::Cmyk,
        ..EncodeOptions::default()
    };
    assert!(encode(&pixels, 8, 8, Format::Rgb, &cmyk).is_err());
    // libjpeg refuses an MCU of more than 10 blocks: its message comes back.
    let too_many = EncodeOptions {
        sampling: Sampling([(4, 4), (1, 1), (1, 1)]),
        ..EncodeOptions::default()
    };
    match encode(&pixels, 8, 8, Format::Rgb, &too_many) {
        Err(Error::Library(m)) => assert!(!m.is_empty()),
        other => panic!("{other:?}"),
    }
}
