//! Writing JPEGs with libjpeg-turbo's libjpeg API, for tests and benchmarks that need files of
//! every kind a decoder meets: any sampling factors per component (4:4:4, 4:2:2, 4:2:0, 4:4:0,
//! 4:1:1, and odd ones such as 3x1 or luma smaller than chroma), baseline or progressive,
//! Huffman or arithmetic coding, restart intervals, YCbCr, RGB or gray.
//!
//! ```
//! use turbojpeg_region::{encode, Colorspace, EncodeOptions, Format, Restart, Sampling};
//!
//! let (w, h) = (33, 17);
//! let pixels: Vec<u8> = (0..w * h * 3).map(|i| (i * 7 % 256) as u8).collect();
//! let options = EncodeOptions {
//!     sampling: Sampling::S420,
//!     progressive: true,
//!     restart: Restart::Rows(1),
//!     ..EncodeOptions::default()
//! };
//! let jpeg = encode(&pixels, w, h, Format::Rgb, &options)?;
//! assert_eq!(&jpeg[..2], b"\xFF\xD8");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::ffi::CStr;

use crate::ffi;
use crate::{Colorspace, Error, Format};

/// Sampling factors `(horizontal, vertical)` of the first three components (Y, Cb, Cr); a gray
/// JPEG uses the first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sampling(pub [(u8, u8); 3]);

impl Sampling {
    /// No subsampling.
    pub const S444: Sampling = Sampling([(1, 1), (1, 1), (1, 1)]);
    /// Chroma halved across.
    pub const S422: Sampling = Sampling([(2, 1), (1, 1), (1, 1)]);
    /// Chroma halved both ways.
    pub const S420: Sampling = Sampling([(2, 2), (1, 1), (1, 1)]);
    /// Chroma halved down.
    pub const S440: Sampling = Sampling([(1, 2), (1, 1), (1, 1)]);
    /// Chroma quartered across.
    pub const S411: Sampling = Sampling([(4, 1), (1, 1), (1, 1)]);
}

/// Restart markers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Restart {
    /// None.
    None,
    /// One every this many MCUs.
    Mcus(u16),
    /// One every this many MCU rows.
    Rows(u16),
}

/// How to write a JPEG.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EncodeOptions {
    /// 1 to 100, libjpeg's scale of its standard tables.
    pub quality: u8,
    /// The JPEG's colour space: [`Colorspace::YCbCr`], [`Colorspace::Rgb`] (with an Adobe
    /// marker, no transform) or [`Colorspace::Gray`].
    pub colorspace: Colorspace,
    /// Sampling factors of each component.
    pub sampling: Sampling,
    /// Progressive (libjpeg's standard scan script).
    pub progressive: bool,
    /// Arithmetic coding instead of Huffman.
    pub arithmetic: bool,
    /// Optimized Huffman tables (ignored with arithmetic coding).
    pub optimize: bool,
    /// Restart markers.
    pub restart: Restart,
}

impl Default for EncodeOptions {
    /// Quality 90, YCbCr 4:2:0, baseline, standard Huffman tables, no restart markers.
    fn default() -> EncodeOptions {
        EncodeOptions {
            quality: 90,
            colorspace: Colorspace::YCbCr,
            sampling: Sampling::S420,
            progressive: false,
            arithmetic: false,
            optimize: false,
            restart: Restart::None,
        }
    }
}

/// Compresses `pixels` (`width` x `height`, rows packed, RGB8 or gray as `format` says).
pub fn encode(
    pixels: &[u8],
    width: u32,
    height: u32,
    format: Format,
    options: &EncodeOptions,
) -> Result<Vec<u8>, Error> {
    if !ffi::layout_matches() {
        return Err(Error::Library(
            "the shim was compiled with other structure layouts".into(),
        ));
    }
    let needed = (width as usize)
        .checked_mul(height as usize)
        .and_then(|n| n.checked_mul(format.bytes_per_pixel()))
        .ok_or_else(|| Error::Request("image size overflows".into()))?;
    if width == 0 || height == 0 || pixels.len() != needed {
        return Err(Error::Request(format!(
            "{} bytes of pixels for a {width}x{height} {format:?} image of {needed}",
            pixels.len()
        )));
    }
    if !(1..=100).contains(&options.quality) {
        return Err(Error::Request(format!(
            "quality {} is not 1 to 100",
            options.quality
        )));
    }
    let jpeg_color_space = match options.colorspace {
        Colorspace::YCbCr => ffi::JCS_YCBCR,
        Colorspace::Rgb => ffi::JCS_RGB,
        Colorspace::Gray => ffi::JCS_GRAYSCALE,
        other => {
            return Err(Error::Request(format!("cannot write {other:?} JPEGs")));
        }
    };
    if format == Format::Gray && options.colorspace != Colorspace::Gray {
        return Err(Error::Request("gray pixels make a gray JPEG".into()));
    }
    let mut params = ffi::Encode {
        width,
        height,
        input_components: format.bytes_per_pixel() as i32,
        jpeg_color_space,
        quality: i32::from(options.quality),
        progressive: options.progressive.into(),
        arithmetic: options.arithmetic.into(),
        optimize: options.optimize.into(),
        ..ffi::Encode::default()
    };
    match options.restart {
        Restart::None => {}
        Restart::Mcus(n) => params.restart_interval = i32::from(n),
        Restart::Rows(n) => params.restart_rows = i32::from(n),
    }
    for (c, &(h, v)) in options.sampling.0.iter().enumerate() {
        params.h_samp[c] = i32::from(h);
        params.v_samp[c] = i32::from(v);
    }
    let mut out: *mut u8 = std::ptr::null_mut();
    let mut len: usize = 0;
    let mut message = [0 as libc::c_char; ffi::MESSAGE_LENGTH];
    // SAFETY: `params` is a plain structure of the shim's layout (checked above); `pixels`
    // holds `height` rows of `width * input_components` bytes (checked above) and is only
    // read; `out`, `len` and `message` (JMSG_LENGTH_MAX bytes) are written by the call.
    let status = unsafe {
        ffi::gf_compress(
            &params,
            pixels.as_ptr(),
            &mut out,
            &mut len,
            message.as_mut_ptr(),
        )
    };
    if status != ffi::OK || out.is_null() {
        // SAFETY: on failure the shim wrote a NUL-terminated message into `message`.
        let text = unsafe { CStr::from_ptr(message.as_ptr()) };
        return Err(Error::Library(text.to_string_lossy().trim().to_string()));
    }
    // SAFETY: on success `out` is a malloc'd buffer of `len` bytes holding the file; it is
    // copied here, then released by the shim's `free` once.
    let jpeg = unsafe { std::slice::from_raw_parts(out, len) }.to_vec();
    // SAFETY: `out` came from the shim's malloc and is not used after.
    unsafe { ffi::gf_free(out) };
    Ok(jpeg)
}
