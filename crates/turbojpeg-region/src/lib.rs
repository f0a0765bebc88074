//! Partial JPEG decoding with libjpeg-turbo, behind a safe interface.
//!
//! A [`Decoder`] decodes a JPEG to packed RGB8 or gray at full size or reduced in the DCT domain
//! (1/2, 1/4, 1/8), and optionally only a [`Region`] of it. Rows above the region are entropy
//! decoded but never transformed, rows below it are not decoded at all, and columns outside it
//! skip the inverse DCT, upsampling and colour conversion (libjpeg-turbo's
//! `jpeg_skip_scanlines` and `jpeg_crop_scanline`, the steps of TurboJPEG 3's cropped
//! `tj3Decompress8`), and the common baseline files are entropy-decoded by a faster Huffman
//! decoder than the library's (see [`Decoder`]). The pixels of a region equal those of a full
//! decode, except along the region's own border where chroma upsampling lacks its outside
//! neighbours: callers that need exact pixels keep one pixel of margin. The output buffer always
//! has the whole image's layout, so coordinates stay those of the whole image.
//!
//! ```
//! use turbojpeg_region::{Decoder, Format, Region, Request};
//!
//! let jpeg = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/../../assets/rocket.jpg"))?;
//! let mut decoder = Decoder::new()?;
//! let header = decoder.read_header(&jpeg)?;
//! // The middle half of the image; the left edge is aligned down to the MCU grid.
//! let region = Region::aligned(&header, 1, header.width / 4, header.height / 4,
//!                              header.width / 2, header.height / 2);
//! let request = Request { format: Format::Rgb, reduction: 1, region: Some(region) };
//! // The buffer is image-sized; the region's pixels land at their place in it.
//! let mut pixels = vec![0; request.output_len(&header)];
//! let decoded = decoder.decompress(&jpeg, &request, &mut pixels)?;
//! assert_eq!(decoded.region, region);
//! assert_eq!((decoded.width, decoded.height), (header.width, header.height));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Two more things libjpeg-turbo does, through its libjpeg API (a small C shim, `src/shim.c`,
//! keeps libjpeg's `setjmp`/`longjmp` error handling on the C side):
//!
//! - [`CoefficientReader`] reads a JPEG's quantized DCT coefficients without transforming them
//!   (`jpeg_read_coefficients`), optionally stopping a baseline file after the rows a caller
//!   needs (see [`coefficients`](CoefficientReader) for the layout and what can stop early);
//! - [`encode`] writes JPEGs with any sampling factors, progressive or arithmetic-coded, with
//!   restart markers: the files tests and benchmarks need.
//!
//! All `unsafe` of this crate is in this file, `coefficients.rs`, `encoder.rs` and `ffi.rs`;
//! each block states why it is sound.

#![warn(missing_docs)]

mod coefficients;
mod encoder;
mod ffi;
#[cfg(test)]
mod huffman_tests;

use std::ffi::CStr;
use std::ptr::NonNull;

use turbojpeg_sys as sys;

pub use coefficients::{
    CoefficientError, CoefficientHeader, CoefficientReader, Coefficients, ComponentInfo, Opened,
};
pub use encoder::{encode, EncodeOptions, Restart, Sampling};

/// What went wrong, in libjpeg-turbo's words or ours.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// libjpeg-turbo refused the data or the request (its message).
    Library(String),
    /// The request does not fit the image or the output buffer.
    Request(String),
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Library(message) => write!(f, "libjpeg-turbo: {message}"),
            Error::Request(message) => write!(f, "{message}"),
        }
    }
}

impl std::error::Error for Error {}

/// Colour space of the compressed data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Colorspace {
    /// Luminance and chrominance, the usual photo.
    YCbCr,
    /// RGB without colour transform.
    Rgb,
    /// One channel.
    Gray,
    /// Four channels, ink.
    Cmyk,
    /// CMYK with a YCC transform (Adobe transform 2).
    Ycck,
}

/// What the header says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Full-size width in pixels.
    pub width: u32,
    /// Full-size height in pixels.
    pub height: u32,
    /// Colour space of the data.
    pub colorspace: Colorspace,
    /// Width of the MCU in full-size pixels (8, 16 or 32), `None` when libjpeg-turbo cannot
    /// tell the subsampling (then no region can be decoded).
    pub mcu_width: Option<u32>,
    /// Lossless JPEG (no DCT: neither regions nor reductions apply).
    pub lossless: bool,
}

impl Header {
    /// Width and height after a DCT-domain reduction by `reduction` (1, 2, 4 or 8), rounded up
    /// as libjpeg-turbo does.
    pub fn scaled_size(&self, reduction: u32) -> (u32, u32) {
        let r = reduction.max(1);
        (self.width.div_ceil(r), self.height.div_ceil(r))
    }
}

/// A rectangle of the (scaled) image, in pixels. `x` must be a multiple of the scaled MCU width;
/// [`Region::aligned`] makes one that is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Region {
    /// Left edge.
    pub x: u32,
    /// Top edge.
    pub y: u32,
    /// Width.
    pub width: u32,
    /// Height.
    pub height: u32,
}

impl Region {
    /// The smallest decodable region that covers `x..x + width`, `y..y + height` of the image
    /// scaled by 1/`reduction`: the left edge moves down to the MCU grid and the rectangle is
    /// clipped to the image. Without a known MCU width the whole image is returned.
    pub fn aligned(
        header: &Header,
        reduction: u32,
        x: u32,
        y: u32,
        width: u32,
        height: u32,
    ) -> Region {
        let (scaled_w, scaled_h) = header.scaled_size(reduction);
        let Some(mcu) = header.mcu_width else {
            return Region {
                x: 0,
                y: 0,
                width: scaled_w,
                height: scaled_h,
            };
        };
        let mcu = mcu.div_ceil(reduction.max(1)).max(1);
        let x0 = (x.min(scaled_w.saturating_sub(1)) / mcu) * mcu;
        let y0 = y.min(scaled_h.saturating_sub(1));
        let x1 = x.saturating_add(width).clamp(x0 + 1, scaled_w);
        let y1 = y.saturating_add(height).clamp(y0 + 1, scaled_h);
        Region {
            x: x0,
            y: y0,
            width: x1 - x0,
            height: y1 - y0,
        }
    }
}

/// Output pixel format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Packed RGB8, 3 bytes a pixel.
    Rgb,
    /// 8-bit gray, 1 byte a pixel (a colour image is converted to its luminance).
    Gray,
    /// CMYK as stored, 4 bytes a pixel (a YCCK image is converted to CMYK); for CMYK and YCCK
    /// JPEGs only.
    Cmyk,
}

impl Format {
    /// Bytes a pixel.
    pub fn bytes_per_pixel(self) -> usize {
        match self {
            Format::Rgb => 3,
            Format::Gray => 1,
            Format::Cmyk => 4,
        }
    }

    /// The shim's code for the format.
    fn shim_code(self) -> i32 {
        match self {
            Format::Rgb => ffi::FORMAT_RGB,
            Format::Gray => ffi::FORMAT_GRAY,
            Format::Cmyk => ffi::FORMAT_CMYK,
        }
    }
}

/// One decode: the output format, a DCT-domain reduction and an optional region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    /// Output pixel format.
    pub format: Format,
    /// 1 (full size), 2, 4 or 8.
    pub reduction: u32,
    /// The part to decode, in scaled pixels; `None` for the whole image.
    pub region: Option<Region>,
}

impl Request {
    /// Bytes the output buffer must hold: the whole scaled image, rows packed, whatever the
    /// region.
    pub fn output_len(&self, header: &Header) -> usize {
        let (w, h) = header.scaled_size(self.reduction);
        w as usize * h as usize * self.format.bytes_per_pixel()
    }
}

/// What a decode wrote: the scaled image's size and the part of it that holds decoded pixels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decoded {
    /// Width of the scaled image in pixels (the output buffer's row length).
    pub width: u32,
    /// Height of the scaled image in pixels.
    pub height: u32,
    /// The pixels written; the rest of the buffer is left as it was.
    pub region: Region,
    /// libjpeg's warning, when the data had a recoverable fault ("Premature end of JPEG file"
    /// for a truncated file, "Corrupt JPEG data: ..."): the image was decoded to its end, the
    /// damaged part filled in by libjpeg.
    pub warning: Option<String>,
    /// The data ended before the image did and libjpeg filled in the rest (its warning
    /// "Premature end of JPEG file", whichever warning came first): a truncated file.
    pub premature_end: bool,
    /// Whether the shim's faster Huffman decoder entropy-decoded the image (see [`Decoder`]);
    /// `false` for progressive, arithmetic-coded, multi-scan and lossless files, or when turned
    /// off.
    pub fast_huffman: bool,
}

/// A libjpeg-turbo decompressor, reused across images by one thread.
///
/// Headers are read through TurboJPEG; pixels are decoded through libjpeg's API in the shim,
/// the steps TurboJPEG's `tj3Decompress8` takes, with one difference: a single-scan sequential
/// Huffman JPEG (baseline and extended, the common kind) is entropy-decoded by the shim's own
/// Huffman decoder (`src/huffman.c`), libjpeg-turbo's with a combined lookup of each code and
/// its magnitude bits, and with its fast path taken by files with restart markers too: the same
/// coefficients, and so the same pixels, with the whole decode 1.07-1.10x as fast (1.10x too on
/// files with restart markers, which the library decodes on its slow path throughout). A damaged file's warnings
/// are libjpeg's too, but for the count of stray bytes before a marker and a bad code the
/// library's slow path reports (see `src/huffman.c`). [`Decoder::set_fast_huffman`] turns it
/// off.
pub struct Decoder {
    handle: NonNull<libc::c_void>,
    /// The libjpeg decompressor pixels are decoded with.
    reader: NonNull<ffi::Reader>,
    /// The scan limit in force, applied again when the handle is renewed.
    scan_limit: libc::c_int,
    /// Whether the shim's Huffman decoder takes the images it can.
    fast_huffman: bool,
}

impl std::fmt::Debug for Decoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Decoder").finish_non_exhaustive()
    }
}

/// MCU widths of TurboJPEG's subsampling codes 0..=6 (444, 422, 420, gray, 440, 411, 441).
const MCU_WIDTHS: [u32; 7] = [8, 16, 16, 8, 8, 32, 8];

impl Decoder {
    /// A new decompressor.
    pub fn new() -> Result<Decoder, Error> {
        if !ffi::layout_matches() {
            return Err(Error::Library(
                "the shim was compiled with other structure layouts".into(),
            ));
        }
        // SAFETY: gf_reader_new takes nothing and returns an owned reader or null.
        let reader = NonNull::new(unsafe { ffi::gf_reader_new() })
            .ok_or_else(|| Error::Library("cannot create a decompressor".into()))?;
        // SAFETY: tj3Init takes a plain integer and returns an owned handle or null.
        let raw = unsafe { sys::tj3Init(sys::TJINIT_TJINIT_DECOMPRESS as libc::c_int) };
        let Some(handle) = NonNull::new(raw) else {
            // SAFETY: the reader came from gf_reader_new and is not used afterwards.
            unsafe { ffi::gf_reader_free(reader.as_ptr()) };
            return Err(Error::Library("cannot create a decompressor".into()));
        };
        Ok(Decoder {
            handle,
            reader,
            scan_limit: 0,
            fast_huffman: true,
        })
    }

    /// Whether single-scan sequential Huffman JPEGs are entropy-decoded by the shim's faster
    /// decoder (the default) or by libjpeg-turbo's own: the same pixels either way.
    pub fn set_fast_huffman(&mut self, on: bool) {
        self.fast_huffman = on;
    }

    /// The library's message for the last failure. The handle is then renewed: after an error
    /// libjpeg is left mid-stream, and the next image would be read from that state.
    fn error(&mut self) -> Error {
        // SAFETY: the handle is live; tj3GetErrorStr returns a NUL-terminated string owned by
        // the handle (or a static one), valid until the next call on it, and copied here.
        let message = unsafe { CStr::from_ptr(sys::tj3GetErrorStr(self.handle.as_ptr())) };
        let error = Error::Library(message.to_string_lossy().trim().replace('\n', " "));
        // SAFETY: tj3Init takes a plain integer and returns an owned handle or null.
        let raw = unsafe { sys::tj3Init(sys::TJINIT_TJINIT_DECOMPRESS as libc::c_int) };
        if let Some(fresh) = NonNull::new(raw) {
            let param = sys::TJPARAM_TJPARAM_SCANLIMIT as libc::c_int;
            // SAFETY: `fresh` is live and owned here; tj3Set validates its arguments. The old
            // handle came from tj3Init, is owned by `self` and is not used after it is replaced.
            unsafe {
                if sys::tj3Set(fresh.as_ptr(), param, self.scan_limit) == 0 {
                    sys::tj3Destroy(std::mem::replace(&mut self.handle, fresh).as_ptr());
                } else {
                    sys::tj3Destroy(fresh.as_ptr());
                }
            }
        }
        error
    }

    /// The shim's message for its last failure or first warning.
    fn reader_message(&self) -> String {
        // SAFETY: the reader is live; its message is a NUL-terminated buffer inside it, copied
        // here before any other call.
        let message = unsafe { CStr::from_ptr(ffi::gf_reader_message(self.reader.as_ptr())) };
        message.to_string_lossy().trim().replace('\n', " ")
    }

    fn get(&self, param: sys::TJPARAM) -> libc::c_int {
        // SAFETY: the handle is live; tj3Get only reads a parameter.
        unsafe { sys::tj3Get(self.handle.as_ptr(), param as libc::c_int) }
    }

    fn set(&mut self, param: sys::TJPARAM, value: libc::c_int) -> Result<(), Error> {
        // SAFETY: the handle is live and owned by `self`; tj3Set validates `param` and `value`.
        match unsafe { sys::tj3Set(self.handle.as_ptr(), param as libc::c_int, value) } {
            0 => Ok(()),
            _ => Err(self.error()),
        }
    }

    /// Stops a progressive JPEG after this many scans with an error (0: no limit); guards
    /// against files crafted to take seconds.
    pub fn set_scan_limit(&mut self, scans: u32) -> Result<(), Error> {
        self.set_scan_limit_raw(libc::c_int::try_from(scans).unwrap_or(libc::c_int::MAX))
    }

    fn set_scan_limit_raw(&mut self, scans: libc::c_int) -> Result<(), Error> {
        self.set(sys::TJPARAM_TJPARAM_SCANLIMIT, scans)?;
        // SAFETY: the reader is live and owned by `self`.
        unsafe { ffi::gf_reader_set_scan_limit(self.reader.as_ptr(), scans) }
        self.scan_limit = scans;
        Ok(())
    }

    /// Reads the headers of `jpeg`.
    pub fn read_header(&mut self, jpeg: &[u8]) -> Result<Header, Error> {
        if jpeg.is_empty() {
            return Err(Error::Request("no data".into()));
        }
        // SAFETY: the handle is live; the pointer and length describe `jpeg`, which outlives
        // the call and is only read.
        let status = unsafe {
            sys::tj3DecompressHeader(self.handle.as_ptr(), jpeg.as_ptr(), jpeg.len() as _)
        };
        if status != 0 {
            return Err(self.error());
        }
        let colorspace = match self.get(sys::TJPARAM_TJPARAM_COLORSPACE) {
            c if c == sys::TJCS_TJCS_RGB as libc::c_int => Colorspace::Rgb,
            c if c == sys::TJCS_TJCS_YCbCr as libc::c_int => Colorspace::YCbCr,
            c if c == sys::TJCS_TJCS_GRAY as libc::c_int => Colorspace::Gray,
            c if c == sys::TJCS_TJCS_CMYK as libc::c_int => Colorspace::Cmyk,
            c if c == sys::TJCS_TJCS_YCCK as libc::c_int => Colorspace::Ycck,
            c => return Err(Error::Library(format!("unknown colour space {c}"))),
        };
        let dimension = |param| u32::try_from(self.get(param)).ok().filter(|&d| d > 0);
        let (Some(width), Some(height)) = (
            dimension(sys::TJPARAM_TJPARAM_JPEGWIDTH),
            dimension(sys::TJPARAM_TJPARAM_JPEGHEIGHT),
        ) else {
            return Err(Error::Library("no image size in the header".into()));
        };
        let mcu_width = usize::try_from(self.get(sys::TJPARAM_TJPARAM_SUBSAMP))
            .ok()
            .and_then(|s| MCU_WIDTHS.get(s).copied());
        Ok(Header {
            width,
            height,
            colorspace,
            mcu_width,
            lossless: self.get(sys::TJPARAM_TJPARAM_LOSSLESS) != 0,
        })
    }

    /// Decodes `jpeg` as `request` says into `out`, which must hold exactly
    /// [`Request::output_len`] bytes: the whole scaled image, rows packed. A region's pixels land
    /// at their place in it and the rest of `out` is not touched, so positions (and resampling
    /// arithmetic) are those of the whole image. The headers are read again here, so the request
    /// is checked against this very data.
    pub fn decompress(
        &mut self,
        jpeg: &[u8],
        request: &Request,
        out: &mut [u8],
    ) -> Result<Decoded, Error> {
        let header = self.read_header(jpeg)?;
        let (scaled_w, scaled_h) = header.scaled_size(request.reduction);
        if !matches!(request.reduction, 1 | 2 | 4 | 8) {
            return Err(Error::Request(format!(
                "reduction 1/{} is not 1, 1/2, 1/4 or 1/8",
                request.reduction
            )));
        }
        if header.lossless && (request.reduction != 1 || request.region.is_some()) {
            return Err(Error::Request(
                "a lossless JPEG is decoded whole, at full size".into(),
            ));
        }
        let region = match request.region {
            Some(r) if (r.x, r.y, r.width, r.height) != (0, 0, scaled_w, scaled_h) => {
                let mcu = header
                    .mcu_width
                    .ok_or_else(|| Error::Request("unknown subsampling: no region".into()))?
                    .div_ceil(request.reduction);
                let fits = r.width > 0
                    && r.height > 0
                    && r.x % mcu == 0
                    && r.x.checked_add(r.width).is_some_and(|e| e <= scaled_w)
                    && r.y.checked_add(r.height).is_some_and(|e| e <= scaled_h);
                if !fits {
                    return Err(Error::Request(format!(
                        "region {r:?} is not MCU-aligned ({mcu}) inside {scaled_w}x{scaled_h}"
                    )));
                }
                Some(r)
            }
            _ => None,
        };
        let bytes_per_pixel = request.format.bytes_per_pixel();
        let pitch = scaled_w as usize * bytes_per_pixel;
        let needed = pitch
            .checked_mul(scaled_h as usize)
            .ok_or_else(|| Error::Request("output size overflows".into()))?;
        if out.len() != needed {
            return Err(Error::Request(format!(
                "output buffer holds {} bytes, {scaled_w}x{scaled_h} needs {needed}",
                out.len()
            )));
        }
        let written = region.unwrap_or(Region {
            x: 0,
            y: 0,
            width: scaled_w,
            height: scaled_h,
        });
        // The region's first pixel; its rows follow `pitch` apart, all inside `out`.
        let first = written.y as usize * pitch + written.x as usize * bytes_per_pixel;
        let dst = &mut out[first..];
        let wanted = region.unwrap_or(Region {
            x: 0,
            y: 0,
            width: 0,
            height: 0,
        });
        let shim_request = ffi::DecodeRequest {
            format: request.format.shim_code(),
            denom: request.reduction as i32,
            x: wanted.x,
            y: wanted.y,
            width: wanted.width,
            height: wanted.height,
            fast_huffman: i32::from(self.fast_huffman),
        };
        let mut done = ffi::Decompressed::default();
        // SAFETY: the reader is live and owned by `self`. The shim reads the headers of `jpeg`
        // again (the same bytes as above, so the same size) and writes `written.height` rows of
        // `written.width * bytes_per_pixel` bytes (it refuses any other cropped width before
        // writing), `pitch` apart, from the start of `dst`: the last byte is at
        // `first + (y1 - y0 - 1) * pitch + width * bpp - 1 < (y1 - 1) * pitch + scaled_w * bpp
        // <= out.len()`, since the region lies inside the scaled image (checked above). `jpeg` is
        // only read, and both slices outlive the call. Errors longjmp inside the shim and
        // libjpeg, never through Rust frames.
        let status = unsafe {
            ffi::gf_decompress(
                self.reader.as_ptr(),
                jpeg.as_ptr(),
                jpeg.len(),
                &shim_request,
                dst.as_mut_ptr(),
                pitch,
                &mut done,
            )
        };
        if status != ffi::OK {
            return Err(Error::Library(self.reader_message()));
        }
        // A warning: libjpeg finished the image; its first message is kept.
        let warning = (done.warnings > 0).then(|| self.reader_message());
        Ok(Decoded {
            width: scaled_w,
            height: scaled_h,
            region: written,
            warning,
            premature_end: done.premature_end != 0,
            fast_huffman: done.fast_huffman != 0,
        })
    }
}

impl Drop for Decoder {
    fn drop(&mut self) {
        // SAFETY: the handle came from tj3Init and the reader from gf_reader_new; both are owned
        // by `self` and not used afterwards.
        unsafe {
            sys::tj3Destroy(self.handle.as_ptr());
            ffi::gf_reader_free(self.reader.as_ptr());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A bundled photo, found from wherever the tests run: the crate's folder under cargo, the
    /// repository's root when the test executable is carried to another machine.
    pub(crate) fn asset(name: &str) -> Vec<u8> {
        let cwd = std::env::current_dir().expect("current directory");
        let path = cwd
            .ancestors()
            .map(|dir| dir.join("assets").join(name))
            .find(|path| path.is_file())
            .unwrap_or_else(|| panic!("assets/{name} not found above {}", cwd.display()));
        std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    fn full(decoder: &mut Decoder, jpeg: &[u8], format: Format, reduction: u32) -> Vec<u8> {
        let header = decoder.read_header(jpeg).unwrap();
        let request = Request {
            format,
            reduction,
            region: None,
        };
        let mut out = vec![0xA5; request.output_len(&header)];
        decoder.decompress(jpeg, &request, &mut out).unwrap();
        out
    }

    /// A region's pixels equal the full decode's, away from the region's one-pixel border.
    #[test]
    fn region_matches_full_decode_inside_its_border() {
        let mut decoder = Decoder::new().unwrap();
        for name in ["rocket.jpg", "retina.jpg", "hubble_deep_field.jpg"] {
            let jpeg = asset(name);
            let header = decoder.read_header(&jpeg).unwrap();
            for (format, reduction) in [(Format::Rgb, 1), (Format::Gray, 1), (Format::Rgb, 2)] {
                let whole = full(&mut decoder, &jpeg, format, reduction);
                let (sw, sh) = header.scaled_size(reduction);
                let bpp = format.bytes_per_pixel();
                for (x, y, w, h) in [(37, 21, 101, 77), (sw / 3, sh / 5, sw / 2, sh / 2)] {
                    let region = Region::aligned(&header, reduction, x, y, w, h);
                    assert!(region.x <= x && region.x + region.width >= (x + w).min(sw));
                    let request = Request {
                        format,
                        reduction,
                        region: Some(region),
                    };
                    let mut out = vec![0xA5; request.output_len(&header)];
                    let got = decoder.decompress(&jpeg, &request, &mut out).unwrap();
                    assert_eq!((got.width, got.height, got.region), (sw, sh, region));
                    for row in 0..sh {
                        for col in 0..sw {
                            let at = ((row * sw + col) as usize) * bpp;
                            let inside =
                                |v: u32, start: u32, len: u32| v >= start && v < start + len;
                            let border =
                                |v: u32, start: u32, len: u32| v == start || v + 1 == start + len;
                            let (in_x, in_y) = (
                                inside(col, region.x, region.width),
                                inside(row, region.y, region.height),
                            );
                            let expected = if !(in_x && in_y) {
                                &[0xA5u8; 3][..bpp]
                            } else if border(col, region.x, region.width)
                                || border(row, region.y, region.height)
                            {
                                continue;
                            } else {
                                &whole[at..at + bpp]
                            };
                            assert_eq!(
                                &out[at..at + bpp],
                                expected,
                                "{name} {format:?} 1/{reduction} {region:?} at ({col}, {row})"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn bad_requests_and_data_are_errors() {
        let mut decoder = Decoder::new().unwrap();
        let jpeg = asset("rocket.jpg");
        let header = decoder.read_header(&jpeg).unwrap();
        let unaligned = Request {
            format: Format::Rgb,
            reduction: 1,
            region: Some(Region {
                x: 3,
                y: 0,
                width: 10,
                height: 10,
            }),
        };
        let mut out = vec![0; 300];
        assert!(matches!(
            decoder.decompress(&jpeg, &unaligned, &mut out),
            Err(Error::Request(_))
        ));
        let outside = Request {
            region: Some(Region {
                x: 0,
                y: header.height - 5,
                width: 10,
                height: 10,
            }),
            ..unaligned
        };
        assert!(matches!(
            decoder.decompress(&jpeg, &outside, &mut out),
            Err(Error::Request(_))
        ));
        let whole = Request {
            region: None,
            ..unaligned
        };
        let mut small = vec![0; 10];
        assert!(matches!(
            decoder.decompress(&jpeg, &whole, &mut small),
            Err(Error::Request(_))
        ));
        let odd = Request {
            reduction: 3,
            ..whole
        };
        assert!(decoder.decompress(&jpeg, &odd, &mut small).is_err());
        assert!(decoder.read_header(b"").is_err());
        assert!(matches!(
            decoder.read_header(b"\xFF\xD8\xFF not a jpeg"),
            Err(Error::Library(_))
        ));
        // A file cut short decodes to its end with libjpeg's warning saying so.
        let truncated = &jpeg[..jpeg.len() / 2];
        let mut out = vec![0; whole.output_len(&header)];
        let decoded = decoder
            .decompress(truncated, &whole, &mut out)
            .expect("decoded with a warning");
        let warning = decoded.warning.expect("a warning");
        assert!(warning.contains("Premature end of JPEG file"), "{warning}");
        assert!(decoded.premature_end);
        // A complete file has none.
        let complete = decoder
            .decompress(&jpeg, &whole, &mut out)
            .expect("decoded");
        assert_eq!(complete.warning, None);
        assert!(!complete.premature_end);
        // The decoder is still usable after errors.
        assert_eq!(full(&mut decoder, &jpeg, Format::Rgb, 1).len(), out.len());
    }

    #[test]
    fn aligned_regions_stay_inside_the_image() {
        let header = Header {
            width: 500,
            height: 375,
            colorspace: Colorspace::YCbCr,
            mcu_width: Some(16),
            lossless: false,
        };
        let r = Region::aligned(&header, 1, 70, 20, 330, 340);
        assert_eq!((r.x, r.y, r.width, r.height), (64, 20, 336, 340));
        let r = Region::aligned(&header, 1, 490, 370, 100, 100);
        assert_eq!((r.x, r.y, r.width, r.height), (480, 370, 20, 5));
        let r = Region::aligned(&header, 2, 70, 20, 330, 340);
        assert_eq!((r.x, r.width, r.height), (64, 186, 168)); // 250x188 scaled, MCU 8
        let unknown = Header {
            mcu_width: None,
            ..header
        };
        let r = Region::aligned(&unknown, 1, 70, 20, 30, 40);
        assert_eq!((r.x, r.y, r.width, r.height), (0, 0, 500, 375));
    }
}
