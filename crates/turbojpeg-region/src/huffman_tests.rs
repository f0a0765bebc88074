//! The shim's Huffman decoder (`src/huffman.c`) against libjpeg-turbo's own, on the same
//! requests: clean files of every sampling, table and restart layout, then the same files cut
//! short, with bytes changed inside their entropy-coded data, and with a stray marker in it.
//! Both must give the same pixels and the same warning, or the same error.

use crate::tests::asset;
use crate::{
    encode, Colorspace, Decoder, EncodeOptions, Format, Region, Request, Restart, Sampling,
};

/// A small deterministic generator (SplitMix64), so that every run corrupts the same bytes.
struct Mix(u64);

impl Mix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// A photo-like image: smooth gradients, edges and noise, so that coefficients of every size
/// and long zero runs both occur.
fn picture(w: u32, h: u32, seed: u64) -> Vec<u8> {
    let mut mix = Mix(seed);
    let mut out = Vec::with_capacity((w * h * 3) as usize);
    for y in 0..h {
        for x in 0..w {
            let edge = if (x / 7 + y / 11) % 3 == 0 { 90 } else { 0 };
            for c in 0..3u32 {
                let smooth = (x * (c + 1) * 255 / w.max(1) + y * 255 / h.max(1)) / 2;
                let noise = (mix.next() % 48) as u32;
                out.push(((smooth + edge + noise) % 256) as u8);
            }
        }
    }
    out
}

/// Where a JPEG's entropy-coded data starts: after the SOS segment.
fn scan_start(jpeg: &[u8]) -> usize {
    let at = jpeg
        .windows(2)
        .position(|w| w == [0xFF, 0xDA])
        .expect("a scan");
    at + 2 + usize::from(jpeg[at + 2]) * 256 + usize::from(jpeg[at + 3])
}

/// The file and its damaged versions.
fn variants(jpeg: &[u8], mix: &mut Mix) -> Vec<(String, Vec<u8>)> {
    let start = scan_start(jpeg);
    let data = jpeg.len() - start;
    let mut out = vec![("clean".to_string(), jpeg.to_vec())];
    for cut in [1, 2, data / 10, data / 2, data * 9 / 10] {
        out.push((
            format!("cut {cut} bytes short"),
            jpeg[..jpeg.len() - cut].to_vec(),
        ));
    }
    for flips in [1, 3, 12] {
        let mut bad = jpeg.to_vec();
        for _ in 0..flips {
            let at = start + mix.below(data - 2);
            bad[at] ^= 1 << mix.below(8);
        }
        out.push((format!("{flips} bits flipped"), bad));
    }
    let mut marker = jpeg.to_vec();
    let at = start + data / 3;
    marker.splice(at..at, [0xFF, 0xD3]);
    out.push(("a stray RST3".into(), marker));
    let restart = jpeg[start..]
        .windows(2)
        .position(|w| w[0] == 0xFF && (0xD0..=0xD7).contains(&w[1]));
    if let Some(at) = restart {
        let mut lost = jpeg.to_vec();
        lost.drain(start + at..start + at + 2);
        out.push(("a restart marker lost".into(), lost));
    }
    let mut ff = jpeg.to_vec();
    ff.splice(start + data / 4..start + data / 4, [0xFF, 0xFF, 0x00]);
    out.push(("padding 0xFFs".into(), ff));
    out
}

/// A warning without its numbers: the fast paths read ahead by different amounts, so after a
/// damaged scan that ends early libjpeg counts a few more or fewer bytes "before marker".
fn without_counts(warning: &str) -> String {
    warning.chars().filter(|c| !c.is_ascii_digit()).collect()
}

/// A decode's pixels and warning, or its error's text.
type Outcome = Result<(Vec<u8>, Option<String>), String>;

/// Decodes with the shim's Huffman decoder on or off: the outcome (the buffer poisoned first)
/// and whether the shim's decoder took the file.
fn decode(
    decoder: &mut Decoder,
    jpeg: &[u8],
    format: Format,
    reduction: u32,
    region: bool,
    fast: bool,
) -> (Outcome, bool) {
    decoder.set_fast_huffman(fast);
    let header = match decoder.read_header(jpeg) {
        Ok(header) => header,
        Err(e) => return (Err(e.to_string()), false),
    };
    let (w, h) = header.scaled_size(reduction);
    let region = (region && w > 16 && h > 16)
        .then(|| Region::aligned(&header, reduction, w / 3, h / 4, w / 2, h / 2));
    let request = Request {
        format,
        reduction,
        region,
    };
    let mut pixels = vec![0x5A; request.output_len(&header)];
    match decoder.decompress(jpeg, &request, &mut pixels) {
        Ok(decoded) => (Ok((pixels, decoded.warning)), decoded.fast_huffman),
        Err(e) => (Err(e.to_string()), false),
    }
}

fn compare(
    decoder: &mut Decoder,
    name: &str,
    jpeg: &[u8],
    mix: &mut Mix,
    fast_expected: bool,
) -> usize {
    let mut fast_used = 0;
    for (damage, file) in variants(jpeg, mix) {
        for (format, reduction, region) in [
            (Format::Rgb, 1, false),
            (Format::Rgb, 1, true),
            (Format::Gray, 1, true),
            (Format::Rgb, 2, true),
            (Format::Rgb, 8, false),
        ] {
            let (library, _) = decode(decoder, &file, format, reduction, region, false);
            let (fast, used) = decode(decoder, &file, format, reduction, region, true);
            let what = format!("{name}, {damage}, {format:?} 1/{reduction}, region {region}");
            match (&library, &fast) {
                (Ok((a, wa)), Ok((b, wb))) => {
                    assert!(a == b, "{what}: the pixels differ");
                    assert_eq!(
                        wa.as_deref().map(without_counts),
                        wb.as_deref().map(without_counts),
                        "{what}: the warnings differ"
                    );
                }
                _ => assert_eq!(library.clone().err(), fast.clone().err(), "{what}"),
            }
            if damage == "clean" && fast_expected {
                assert!(used, "{what}: the shim's decoder did not take the file");
            }
            fast_used += usize::from(used);
        }
    }
    fast_used
}

#[test]
fn fast_huffman_decodes_as_the_library_on_clean_and_damaged_files() {
    let mut decoder = Decoder::new().expect("decoder");
    let mut mix = Mix(7);
    let mut taken = 0;
    for name in ["rocket.jpg", "retina.jpg", "hubble_deep_field.jpg"] {
        taken += compare(&mut decoder, name, &asset(name), &mut mix, true);
    }
    let layouts = [
        (Sampling::S420, 90, false, Restart::None),
        (Sampling::S444, 100, false, Restart::None),
        (Sampling::S422, 40, true, Restart::Mcus(3)),
        (Sampling::S440, 75, false, Restart::Rows(1)),
        (Sampling::S411, 95, true, Restart::None),
        (Sampling::S420, 10, false, Restart::Mcus(1)),
    ];
    for (i, &(sampling, quality, optimize, restart)) in layouts.iter().enumerate() {
        for (w, h) in [(301, 199), (37, 53), (640, 24)] {
            let pixels = picture(w, h, i as u64 * 31 + u64::from(w));
            for colorspace in [Colorspace::YCbCr, Colorspace::Gray] {
                let options = EncodeOptions {
                    quality,
                    colorspace,
                    sampling,
                    optimize,
                    restart,
                    ..EncodeOptions::default()
                };
                let jpeg = encode(&pixels, w, h, Format::Rgb, &options).expect("encode");
                let name = format!("{w}x{h} {colorspace:?} {sampling:?} q{quality} {restart:?}");
                taken += compare(&mut decoder, &name, &jpeg, &mut mix, true);
            }
        }
    }
    // Progressive and arithmetic-coded files stay with the library's decoders.
    let pixels = picture(64, 48, 3);
    for (progressive, arithmetic) in [(true, false), (false, true)] {
        let options = EncodeOptions {
            progressive,
            arithmetic,
            ..EncodeOptions::default()
        };
        let jpeg = encode(&pixels, 64, 48, Format::Rgb, &options).expect("encode");
        let used = compare(
            &mut decoder,
            "progressive or arithmetic",
            &jpeg,
            &mut mix,
            false,
        );
        assert_eq!(
            used, 0,
            "progressive {progressive}, arithmetic {arithmetic}"
        );
    }
    assert!(taken > 1000, "the shim's decoder took {taken} decodes");
}

/// A file with restart markers, a stray marker inside its first interval and its end cut off:
/// libjpeg's first warning is about the stray marker, and the cut is still reported, whichever
/// decoder runs.
#[test]
fn a_premature_end_is_reported_after_other_warnings() {
    let (w, h) = (160, 120);
    let options = EncodeOptions {
        restart: Restart::Rows(1),
        ..EncodeOptions::default()
    };
    let jpeg = encode(&picture(w, h, 5), w, h, Format::Rgb, &options).expect("encode");
    let start = scan_start(&jpeg);
    let first_restart = start
        + jpeg[start..]
            .windows(2)
            .position(|p| p[0] == 0xFF && (0xD0..=0xD7).contains(&p[1]))
            .expect("a restart marker");
    let mut damaged = jpeg.clone();
    let inside = (start + first_restart) / 2;
    damaged.splice(inside..inside, [0xFF, 0xD7]);
    damaged.truncate(damaged.len() * 3 / 4);
    let mut decoder = Decoder::new().expect("decoder");
    for fast in [false, true] {
        decoder.set_fast_huffman(fast);
        let header = decoder.read_header(&damaged).expect("header");
        let request = Request {
            format: Format::Rgb,
            reduction: 1,
            region: None,
        };
        let mut pixels = vec![0; request.output_len(&header)];
        let decoded = decoder
            .decompress(&damaged, &request, &mut pixels)
            .expect("decoded with warnings");
        let warning = decoded.warning.expect("a warning");
        assert!(
            !warning.contains("Premature end of JPEG"),
            "fast {fast}: {warning}"
        );
        assert!(decoded.premature_end, "fast {fast}");
    }
}

/// The same file with the first two symbols of one code length swapped in its first AC table:
/// the same code counts, other symbols (a decoder keeping tables by their counts alone would
/// decode it with the original's).
fn symbols_swapped(jpeg: &[u8]) -> Vec<u8> {
    let mut out = jpeg.to_vec();
    let mut at = 2;
    while at + 4 <= out.len() && out[at] == 0xFF {
        let marker = out[at + 1];
        let length = usize::from(out[at + 2]) * 256 + usize::from(out[at + 3]);
        if marker == 0xC4 {
            // Tables in the segment: class and id, 16 counts, the symbols.
            let mut table = at + 4;
            while table < at + 2 + length {
                let counts = &out[table + 1..table + 17];
                let symbols: usize = counts.iter().map(|&c| usize::from(c)).sum();
                if out[table] >> 4 == 1 {
                    let mut first = table + 17;
                    for &count in counts {
                        if count >= 2 {
                            out.swap(first, first + 1);
                            return out;
                        }
                        first += usize::from(count);
                    }
                }
                table += 17 + symbols;
            }
        }
        at += 2 + length;
    }
    panic!("no AC table with two codes of one length");
}

/// Tables are kept from image to image by one decoder: files of many different tables (more
/// than it keeps), files sharing theirs, and a file whose table differs from another's only in
/// its symbols, in turn and again, each decoded as the library decodes it.
#[test]
fn tables_kept_between_images_are_matched_by_their_codes_and_symbols() {
    let mut files = Vec::new();
    for (i, quality) in [20, 45, 70, 85, 95, 100].into_iter().enumerate() {
        let (w, h) = (96 + 8 * i as u32, 64);
        let options = EncodeOptions {
            quality,
            optimize: true,
            ..EncodeOptions::default()
        };
        let jpeg =
            encode(&picture(w, h, 40 + i as u64), w, h, Format::Rgb, &options).expect("encode");
        files.push((format!("q{quality} optimized"), jpeg));
    }
    let standard = encode(
        &picture(80, 80, 9),
        80,
        80,
        Format::Rgb,
        &EncodeOptions::default(),
    )
    .expect("encode");
    files.push(("standard tables".into(), standard.clone()));
    files.push((
        "standard tables, swapped".into(),
        symbols_swapped(&standard),
    ));
    let optimized = files[2].1.clone();
    files.push(("q70 optimized, swapped".into(), symbols_swapped(&optimized)));

    let mut decoder = Decoder::new().expect("decoder");
    let order: Vec<usize> = (0..files.len()).chain((0..files.len()).rev()).collect();
    for round in 0..2 {
        for &i in &order {
            let (name, jpeg) = &files[i];
            let (library, _) = decode(&mut decoder, jpeg, Format::Rgb, 1, false, false);
            // Twice in a row: the second finds every table kept.
            for _ in 0..2 {
                let (fast, used) = decode(&mut decoder, jpeg, Format::Rgb, 1, false, true);
                assert!(used, "{name}: the shim's decoder did not take the file");
                assert!(library == fast, "{name}, round {round}: the pixels differ");
            }
        }
    }
    // The swapped symbols do change the pixels: the test tells the tables apart.
    let (a, _) = decode(&mut decoder, &standard, Format::Rgb, 1, false, true);
    let (b, _) = decode(&mut decoder, &files[7].1, Format::Rgb, 1, false, true);
    assert!(a != b, "swapping the symbols left the pixels as they were");
}
