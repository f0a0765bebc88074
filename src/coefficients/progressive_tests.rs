//! The progressive decoder against libjpeg-turbo's own reading of the coefficients
//! (`jpeg_read_coefficients`), on files made fresh by its encoder (every sampling, sizes from
//! 1x1, restart intervals, gray, qualities 30 to 100), real files, camera-size photos, and broken
//! files, which must be refused or give libjpeg-turbo's coefficients.

use turbojpeg_region::{
    encode, CoefficientHeader, CoefficientReader, Colorspace, EncodeOptions, Format, Restart,
};

use super::cases::{cases, photos_folder, picture, samplings, tiled};
use super::pack::pack;
use super::progressive::ProgressiveDecoder;
use super::{CoefficientSource, Layout, Window};
use gpufeed_bench::upload::random_bytes;

/// Progressive files of every kind the encoder makes.
fn progressive_cases(seed: u64) -> Vec<(String, Vec<u8>)> {
    let mut files = Vec::new();
    let sizes = [
        (1, 1),
        (2, 3),
        (7, 5),
        (8, 8),
        (17, 9),
        (33, 17),
        (50, 31),
        (129, 67),
    ];
    for (s, &(w, h)) in sizes.iter().enumerate() {
        let pixels = picture(w, h, seed * 100 + s as u64);
        for (name, sampling) in samplings() {
            let restart = match s % 3 {
                0 => Restart::None,
                1 => Restart::Mcus(3),
                _ => Restart::Rows(1),
            };
            let options = EncodeOptions {
                sampling,
                quality: [100, 90, 75, 30][s % 4],
                progressive: true,
                restart,
                ..EncodeOptions::default()
            };
            let jpeg = encode(&pixels, w, h, Format::Rgb, &options).expect("encode");
            files.push((format!("{name} {w}x{h} {restart:?}"), jpeg));
        }
        for colorspace in [Colorspace::Gray, Colorspace::Rgb] {
            let options = EncodeOptions {
                colorspace,
                sampling: turbojpeg_region::Sampling::S444,
                progressive: true,
                ..EncodeOptions::default()
            };
            let jpeg = encode(&pixels, w, h, Format::Rgb, &options).expect("encode");
            files.push((format!("{colorspace:?} {w}x{h}"), jpeg));
        }
    }
    files.extend(
        cases(seed)
            .into_iter()
            .filter(|case| is_progressive(&case.jpeg))
            .map(|case| (case.name, case.jpeg)),
    );
    files
}

/// Whether `jpeg`'s frame is progressive Huffman (SOF2).
fn is_progressive(jpeg: &[u8]) -> bool {
    jpeg.windows(2).any(|w| w == [0xFF, 0xC2])
}

/// Every real block of every component of `source` (read with `header`), with its quantization
/// tables.
fn blocks_of(
    source: &(impl CoefficientSource + ?Sized),
    header: &CoefficientHeader,
) -> Vec<(Vec<u16>, Vec<i16>)> {
    header
        .components()
        .iter()
        .enumerate()
        .map(|(c, info)| {
            let quant = source.quant_table(c).expect("table").to_vec();
            let mut blocks = Vec::new();
            for row in 0..info.blocks_high {
                let row = source.block_row(c, row).expect("row");
                blocks.extend_from_slice(&row[..info.blocks_wide as usize * 64]);
            }
            (quant, blocks)
        })
        .collect()
}

/// libjpeg-turbo's coefficients of `jpeg`; `None` if it refuses the file or would smooth its
/// blocks.
fn libjpeg(reader: &mut CoefficientReader, jpeg: &[u8]) -> Option<Vec<(Vec<u16>, Vec<i16>)>> {
    let coefficients = reader.open(jpeg).ok()?.read(None).ok()?;
    if coefficients.block_smoothing() {
        return None;
    }
    let header = coefficients.header().clone();
    Some(blocks_of(&coefficients, &header))
}

fn check(
    decoder: &mut ProgressiveDecoder,
    reader: &mut CoefficientReader,
    name: &str,
    jpeg: &[u8],
) -> bool {
    let want = libjpeg(reader, jpeg);
    let Ok(got) = decoder.decode(jpeg) else {
        return false;
    };
    let header = reader.open(jpeg).expect("header").header().clone();
    let got = blocks_of(&got, &header);
    let want = want.unwrap_or_else(|| panic!("{name}: decoded, but libjpeg-turbo refuses it"));
    for (c, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g.0, w.0, "{name}: component {c}'s quantization table");
        if let Some(at) = g.1.iter().zip(&w.1).position(|(a, b)| a != b) {
            panic!(
                "{name}: component {c} differs at block {} coefficient {}: {} against {}",
                at / 64,
                at % 64,
                g.1[at],
                w.1[at]
            );
        }
    }
    assert_eq!(got.len(), want.len(), "{name}");
    true
}

#[test]
fn progressive_files_decode_to_libjpeg_turbos_coefficients() {
    let mut decoder = ProgressiveDecoder::new();
    let mut reader = CoefficientReader::new().expect("reader");
    let files = progressive_cases(1);
    assert!(files.len() > 100, "{} files", files.len());
    for (name, jpeg) in &files {
        assert!(
            check(&mut decoder, &mut reader, name, jpeg),
            "{name}: refused: {:?}",
            decoder.decode(jpeg).err()
        );
    }
    // Baseline files are not for it.
    let baseline = encode(
        &picture(16, 16, 3),
        16,
        16,
        Format::Rgb,
        &EncodeOptions::default(),
    )
    .expect("encode");
    assert!(decoder.decode(&baseline).is_err());
}

#[test]
fn stripes_of_one_mcu_row_decode_as_whole_scans_do() {
    // Every scan stops and takes up again at each MCU row: inside restart intervals, end of
    // band runs and DC predictions that cross the rows.
    let mut decoder = ProgressiveDecoder::with_stripe_bytes(1);
    let mut reader = CoefficientReader::new().expect("reader");
    for (name, jpeg) in &progressive_cases(4) {
        assert!(
            check(&mut decoder, &mut reader, name, jpeg),
            "{name}: refused: {:?}",
            decoder.decode(jpeg).err()
        );
    }
}

#[test]
fn a_decoder_that_released_its_memory_decodes_as_before() {
    let mut decoder = ProgressiveDecoder::new();
    let mut reader = CoefficientReader::new().expect("reader");
    assert_eq!(decoder.memory_bytes(), 0);
    let files = progressive_cases(3);
    let (name, jpeg) = files.last().expect("a file");
    assert!(check(&mut decoder, &mut reader, name, jpeg), "{name}");
    // The planes alone: 2 bytes a coefficient of the image, at least.
    let header = reader.open(jpeg).expect("headers");
    let pixels = header.header().width as usize * header.header().height as usize;
    assert!(
        decoder.memory_bytes() >= 2 * pixels,
        "{}",
        decoder.memory_bytes()
    );
    decoder.release_memory();
    assert_eq!(decoder.memory_bytes(), 0);
    for (name, jpeg) in files.iter().rev().take(8) {
        assert!(check(&mut decoder, &mut reader, name, jpeg), "{name}");
    }
}

#[test]
fn broken_progressive_files_are_refused_or_give_libjpeg_turbos_coefficients() {
    let mut decoder = ProgressiveDecoder::new();
    let mut reader = CoefficientReader::new().expect("reader");
    let files = progressive_cases(2);
    let mut refused = 0;
    let mut tried = 0;
    for (i, (name, jpeg)) in files.iter().enumerate().step_by(5) {
        let noise = random_bytes(64, 7 + i as u64);
        // Cut short at several places, and bytes changed after the headers.
        for cut in [jpeg.len() / 3, jpeg.len() / 2, jpeg.len() - 3] {
            tried += 1;
            let short = &jpeg[..cut];
            refused += usize::from(!check(&mut decoder, &mut reader, name, short));
        }
        for k in 0..8 {
            let mut bad = jpeg.clone();
            let at = jpeg.len() / 4 + usize::from(noise[k * 2]) * jpeg.len() / 512;
            if at + 2 < bad.len() {
                bad[at] ^= noise[k * 2 + 1] | 1;
                tried += 1;
                refused += usize::from(!check(&mut decoder, &mut reader, name, &bad));
            }
        }
    }
    // The cuts are all refused (no EOI); most changed bytes are too.
    assert!(refused > tried / 2, "{refused} of {tried} refused");
    // A frame header claiming 65535 x 65535 pixels is refused before its planes are allocated.
    let (_, jpeg) = &files[0];
    let at = jpeg
        .windows(2)
        .position(|w| w == [0xFF, 0xC2])
        .expect("a SOF2 marker");
    let mut bomb = jpeg.clone();
    bomb[at + 5..at + 9].copy_from_slice(&[0xFF, 0xFF, 0xFF, 0xFF]);
    let refusal = decoder.decode(&bomb).err().map(|e| e.to_string());
    assert!(
        refusal
            .as_deref()
            .is_some_and(|e| e.contains("65535x65535")),
        "{refusal:?}"
    );
}

#[test]
fn large_photos_re_encoded_progressive_decode_to_libjpeg_turbos_coefficients() {
    let Some(folder) = photos_folder() else {
        eprintln!("skipped: no photos folder");
        return;
    };
    let mut paths: Vec<_> = std::fs::read_dir(&folder)
        .expect("photos folder")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "png" || e == "jpg"))
        .collect();
    paths.sort();
    let mut decoder = ProgressiveDecoder::new();
    let mut reader = CoefficientReader::new().expect("reader");
    let mut checked = 0;
    for (i, path) in paths.iter().enumerate().take(6) {
        let Ok(decoded) = image::open(path) else {
            continue;
        };
        let rgb = decoded.to_rgb8();
        let (w, h) = rgb.dimensions();
        let (tw, th) = [(1920, 1280), (3000, 2000)][i % 2];
        let pixels = tiled(rgb.as_raw(), w, h, tw, th);
        let options = EncodeOptions {
            quality: [90, 95, 75][i % 3],
            sampling: [
                turbojpeg_region::Sampling::S420,
                turbojpeg_region::Sampling::S444,
                turbojpeg_region::Sampling::S422,
            ][i % 3],
            progressive: true,
            ..EncodeOptions::default()
        };
        let jpeg = encode(&pixels, tw, th, Format::Rgb, &options).expect("encode");
        let name = path.display().to_string();
        assert!(
            check(&mut decoder, &mut reader, &name, &jpeg),
            "{name}: refused"
        );
        checked += 1;
    }
    assert!(checked > 0, "no photo could be read");
}

#[test]
fn a_decode_of_the_top_rows_gives_libjpeg_turbos_coefficients_there_and_zeros_below() {
    let mut reader = CoefficientReader::new().expect("reader");
    // One decoder over every file, so that a decode stopping early finds an earlier image's
    // blocks below its rows; stripes of one MCU row, so that it stops at the row asked for.
    for stripe_bytes in [1, 256 << 10] {
        let mut decoder = ProgressiveDecoder::with_stripe_bytes(stripe_bytes);
        let mut stopped_early = 0;
        for (name, jpeg) in &progressive_cases(5) {
            let Some(want) = libjpeg(&mut reader, jpeg) else {
                continue;
            };
            let header = reader.open(jpeg).expect("header").header().clone();
            for eighths in [1, 4, 7] {
                let rows: Vec<u32> = header
                    .components()
                    .iter()
                    .map(|c| (c.blocks_high * eighths).div_ceil(8))
                    .collect();
                let got = decoder.decode_top(jpeg, Some(&rows)).expect(name);
                let got = blocks_of(&got, &header);
                for (c, ((_, g), (_, w))) in got.iter().zip(&want).enumerate() {
                    let row_len = header.components()[c].blocks_wide as usize * 64;
                    for (r, (g, w)) in g.chunks(row_len).zip(w.chunks(row_len)).enumerate() {
                        let zero = g.iter().all(|&v| v == 0);
                        if (r as u32) < rows[c] || !zero {
                            assert_eq!(g, w, "{name}, {eighths}/8: component {c}, block row {r}");
                        }
                        stopped_early += usize::from(zero && w.iter().any(|&v| v != 0));
                    }
                }
            }
        }
        assert!(stopped_early > 100, "{stopped_early} block rows left zero");
    }
}

/// Windows of a `width` x `height` image: the whole, a centre crop's, a corner, the last rows.
fn windows_of(width: u32, height: u32) -> Vec<Window> {
    let mut windows = vec![
        Window::whole(width, height),
        Window {
            x: width / 5,
            y: height / 7,
            width: (width / 2).max(1),
            height: (height / 2).max(1),
        },
        Window {
            x: 0,
            y: 0,
            width: width.min(9),
            height: height.min(5),
        },
    ];
    if height > 3 {
        windows.push(Window {
            x: width / 3,
            y: height - 3,
            width: width - width / 3,
            height: 3,
        });
    }
    windows
}

#[test]
fn a_packed_decode_packs_what_a_whole_decode_packs() {
    // The stripes are packed as they are finished, in planes of one stripe: the bytes must be
    // those packed from the whole image's planes, whatever the stripes, the window, the image
    // decoded before (one decoder for every file) and where in the buffer the image starts.
    let mut reader = CoefficientReader::new().expect("reader");
    let mut whole = ProgressiveDecoder::new();
    let mut compared = 0;
    for stripe_bytes in [1, 40_000, 256 << 10] {
        let mut decoder = ProgressiveDecoder::with_stripe_bytes(stripe_bytes);
        for (name, jpeg) in &progressive_cases(6) {
            let Ok(layout) = Layout::new(reader.open(jpeg).expect(name).header()) else {
                continue;
            };
            for window in windows_of(layout.width, layout.height) {
                let mut want_bytes = Vec::new();
                let want = whole.decode(jpeg).map_err(|e| e.to_string()).and_then(|c| {
                    pack(&c, &layout, &window, &mut want_bytes).map_err(|e| e.to_string())
                });
                // An earlier image's bytes before this one, and stale bytes in the buffers.
                let mut got_bytes = vec![7u8; 16];
                let got = decoder
                    .decode_packed(jpeg, &layout, &window, &mut got_bytes)
                    .map_err(|e| e.to_string());
                assert_eq!(
                    got, want,
                    "{name}, {window:?}, stripes of {stripe_bytes} bytes"
                );
                assert_eq!(&got_bytes[..16], &[7u8; 16], "{name}: the bytes before");
                assert_eq!(&got_bytes[16..], &want_bytes[..], "{name}, {window:?}");
                compared += 1;
            }
        }
    }
    assert!(compared > 1000, "{compared} windows compared");
    // A layout that is not the file's is refused, not packed.
    let files = progressive_cases(6);
    let gray = files
        .iter()
        .find(|(n, _)| n.starts_with("Gray"))
        .expect("a gray file");
    let colour = files
        .iter()
        .find(|(n, _)| n.starts_with("Rgb"))
        .expect("a colour file");
    let layout = Layout::new(reader.open(&colour.1).expect("header").header()).expect("layout");
    let mut out = Vec::new();
    let window = Window::whole(1, 1);
    let refused = ProgressiveDecoder::new().decode_packed(&gray.1, &layout, &window, &mut out);
    assert!(refused.is_err(), "{refused:?}");
}
