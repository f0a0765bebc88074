//! The CPU stage (format sniffing, decode, resize and crop) on arbitrary bytes: it must return
//! `Ok` or an item error, never panic, hang or touch memory it does not own.
#![no_main]

use gpufeed::{DecodeOptions, Interpolation, ResizeMode, ResizeOptions};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // The first byte picks the geometry and filter, so every mode and filter gets fuzzed; the
    // output is small and the pixel limit low so each run stays fast.
    let (selector, bytes) = data.split_first().unwrap_or((&0, data));
    let height = 24 + (selector % 16) as u32;
    let mode = match selector % 3 {
        0 => ResizeMode::ShorterSideThenCenterCrop {
            shorter_side: 40,
            height,
            width: 32,
        },
        1 => ResizeMode::stretch(height, 32),
        _ => ResizeMode::letterbox(height, 32, 114),
    };
    let interpolation = match (selector / 3) % 4 {
        0 => Interpolation::Bilinear,
        1 => Interpolation::Bicubic,
        2 => Interpolation::Nearest,
        _ => Interpolation::Lanczos,
    };
    let decode = DecodeOptions::default()
        .max_pixels(1 << 22)
        .exif_orientation(selector & 0x80 != 0);
    let resize = ResizeOptions::default()
        .mode(mode)
        .interpolation(interpolation);
    let mut out = vec![0u8; height as usize * 32 * 3];
    let _ = gpufeed::prepare_image(bytes, &decode, &resize, &mut out);
});
