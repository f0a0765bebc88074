//! The CPU stage (format sniffing, decode, resize and crop) on arbitrary bytes: it must return
//! `Ok` or an item error, never panic, hang or touch memory it does not own.
#![no_main]

use gpufeed::{Config, Interpolation, ResizeMode};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // The first byte picks the geometry and filter, so every mode and filter gets fuzzed; the
    // output is small and the pixel limit low so each run stays fast.
    let (selector, bytes) = data.split_first().unwrap_or((&0, data));
    let resize_mode = match selector % 3 {
        0 => ResizeMode::ShorterSideThenCenterCrop { shorter_side: 40 },
        1 => ResizeMode::Stretch,
        _ => ResizeMode::Letterbox { pad: 114 },
    };
    let interpolation = match (selector / 3) % 4 {
        0 => Interpolation::Bilinear,
        1 => Interpolation::Bicubic,
        2 => Interpolation::Nearest,
        _ => Interpolation::Lanczos,
    };
    let config = Config {
        resize_mode,
        interpolation,
        height: 24 + (selector % 16) as u32,
        width: 32,
        max_pixels: 1 << 22,
        exif_orientation: selector & 0x80 != 0,
        ..Config::default()
    };
    let mut out = vec![0u8; config.image_bytes()];
    let _ = gpufeed::prepare_image(bytes, &config, &mut out);
});
