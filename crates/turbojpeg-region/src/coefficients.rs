//! A JPEG's quantized DCT coefficients, as libjpeg-turbo's entropy decoder leaves them
//! (`jpeg_read_coefficients`): baseline, progressive or arithmetic-coded, with or without restart
//! intervals. Nothing is inverse-transformed here.
//!
//! ```
//! use turbojpeg_region::CoefficientReader;
//!
//! let jpeg = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/../../assets/rocket.jpg"))?;
//! let mut reader = CoefficientReader::new()?;
//! let opened = reader.open(&jpeg)?;
//! let header = opened.header().clone();
//! // Only the iMCU rows covering the top quarter (a single-scan file stops there).
//! let rows = header.imcu_rows_covering(header.height / 4);
//! let coefficients = opened.read(Some(rows))?;
//! let luma = &header.components()[0];
//! let first_row = coefficients.block_row(0, 0)?;
//! assert_eq!(first_row.len(), luma.blocks_wide as usize * 64);
//! // Block 0's DC coefficient, dequantized.
//! let dc = first_row[0] as i32 * coefficients.quant_table(0).unwrap()[0] as i32;
//! # let _ = dc;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # What the coefficients are
//!
//! Per component, a grid of 8x8 blocks, each 64 `i16` coefficients in **natural** (row-major)
//! order, as libjpeg stores them: coefficient `(u, v)` (horizontal frequency `u`, vertical `v`)
//! at index `8 v + u`. They are quantized: multiply by the component's quantization table
//! ([`Coefficients::quant_table`], natural order too) to dequantize. A component's grid is
//! [`ComponentInfo::blocks_wide`] x [`ComponentInfo::blocks_high`] blocks, the blocks holding its
//! `samples_wide` x `samples_high` samples (the last block of a row or column partly padding);
//! libjpeg's arrays are larger ([`ComponentInfo::padded_blocks_wide`], `padded_blocks_high`: up
//! to a whole MCU), but the extra blocks of interleaved scans never reach a pixel and are not
//! handed out.
//!
//! # Stopping early
//!
//! A single-scan Huffman file (baseline, or extended sequential with all components interleaved
//! in one scan) is decoded iMCU row by iMCU row; [`Opened::read`] with `Some(rows)` stops it
//! after `rows` iMCU rows: the data below is never entropy-decoded. libjpeg-turbo's API has no
//! call for this: the shim's progress monitor, which `jpeg_read_coefficients` calls between
//! rows, empties the data source once the rows are in, so the decoder meets the end of the data
//! at its next MCU and leaves the remaining MCUs zero without decoding them (`jdhuff.c`). The
//! cost of the rows below is then a loop over empty MCUs. Progressive, multi-scan and
//! arithmetic-coded files are always read whole (a later scan refines every row).
//!
//! # Memory
//!
//! libjpeg-turbo keeps the whole image's coefficients in arrays of its own (2 bytes a
//! coefficient, allocated by its memory manager per image and freed when the next image is
//! opened); [`Coefficients::block_row`] lends them out without a copy, and
//! [`Coefficients::copy_component`] writes them into the caller's buffer.

use std::ffi::CStr;
use std::ptr::NonNull;

use crate::ffi;
use crate::Colorspace;

/// Why coefficients could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CoefficientError {
    /// libjpeg-turbo could not read the data (not a JPEG, corrupt markers, a file cut short
    /// before its first scan): its message.
    Corrupt(String),
    /// A JPEG whose coefficients this reader does not give: 12- or 16-bit samples, lossless,
    /// CCIR 601 sampling, an unknown colour space or more than 4 components.
    Unsupported(String),
    /// A progressive JPEG with more scans than [`CoefficientReader::set_scan_limit`] allows.
    TooManyScans(u32),
    /// A call that does not fit the image (a component or row that does not exist, a buffer of
    /// the wrong size).
    Request(String),
}

impl std::fmt::Display for CoefficientError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CoefficientError::Corrupt(m) => write!(f, "libjpeg-turbo: {m}"),
            CoefficientError::Unsupported(m) => write!(f, "unsupported JPEG: {m}"),
            CoefficientError::TooManyScans(n) => {
                write!(f, "progressive JPEG with more than {n} scans")
            }
            CoefficientError::Request(m) => write!(f, "{m}"),
        }
    }
}

impl std::error::Error for CoefficientError {}

/// One component of a JPEG: its sampling and its block grid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ComponentInfo {
    /// The component identifier of the frame header.
    pub id: u8,
    /// Horizontal sampling factor (1 to 4).
    pub h_samp: u8,
    /// Vertical sampling factor (1 to 4).
    pub v_samp: u8,
    /// Blocks per block row holding the component's samples (libjpeg's `width_in_blocks`).
    pub blocks_wide: u32,
    /// Block rows holding the component's samples (`height_in_blocks`).
    pub blocks_high: u32,
    /// Width of libjpeg's coefficient array: `blocks_wide` up to a multiple of `h_samp`.
    pub padded_blocks_wide: u32,
    /// Height of libjpeg's coefficient array: `blocks_high` up to a multiple of `v_samp`.
    pub padded_blocks_high: u32,
    /// Samples per row (libjpeg's `downsampled_width`: `ceil(width * h_samp / max_h_samp)`).
    pub samples_wide: u32,
    /// Sample rows (`downsampled_height`).
    pub samples_high: u32,
}

/// What the headers of a JPEG say, up to its first scan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CoefficientHeader {
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
    /// Colour space of the data, as libjpeg guesses it from the JFIF and Adobe markers and the
    /// component identifiers.
    pub colorspace: Colorspace,
    /// Progressive (several scans refine the coefficients).
    pub progressive: bool,
    /// Arithmetic-coded.
    pub arithmetic: bool,
    /// MCUs per restart interval (0: none).
    pub restart_interval: u32,
    /// A JFIF APP0 marker was seen.
    pub jfif: bool,
    /// The Adobe APP14 marker's colour transform (0: none, 1: YCbCr, 2: YCCK), if one was seen.
    pub adobe_transform: Option<u8>,
    /// Largest horizontal sampling factor.
    pub max_h_samp: u8,
    /// Largest vertical sampling factor.
    pub max_v_samp: u8,
    /// iMCU rows of the image (each `8 * max_v_samp` pixel rows).
    pub imcu_rows: u32,
    /// All components in one scan, Huffman-coded: reading may stop after any iMCU row.
    pub stops_early: bool,
    components: Vec<ComponentInfo>,
}

impl CoefficientHeader {
    /// The components, in the frame header's order (Y, Cb, Cr for YCbCr).
    pub fn components(&self) -> &[ComponentInfo] {
        &self.components
    }

    /// Pixel rows of one iMCU row.
    pub fn imcu_height(&self) -> u32 {
        8 * u32::from(self.max_v_samp)
    }

    /// iMCU rows that hold pixel rows `0..rows` of every component (at least 1, at most all).
    pub fn imcu_rows_covering(&self, rows: u32) -> u32 {
        rows.div_ceil(self.imcu_height())
            .clamp(1, self.imcu_rows.max(1))
    }
}

/// A libjpeg-turbo decompressor that reads coefficients, reused across images by one thread.
pub struct CoefficientReader {
    raw: NonNull<ffi::Reader>,
    scan_limit: u32,
}

impl std::fmt::Debug for CoefficientReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CoefficientReader").finish_non_exhaustive()
    }
}

// SAFETY: the reader owns its libjpeg state outright (no thread-local or shared data inside
// libjpeg-turbo's decompressor), so it may move to another thread; `&mut self` on every call
// keeps it used by one thread at a time.
unsafe impl Send for CoefficientReader {}

impl CoefficientReader {
    /// A new reader.
    pub fn new() -> Result<CoefficientReader, CoefficientError> {
        if !ffi::layout_matches() {
            return Err(CoefficientError::Unsupported(
                "the shim was compiled with other structure layouts".into(),
            ));
        }
        // SAFETY: gf_reader_new takes nothing and returns an owned reader or null.
        let raw = unsafe { ffi::gf_reader_new() };
        NonNull::new(raw)
            .map(|raw| CoefficientReader { raw, scan_limit: 0 })
            .ok_or_else(|| CoefficientError::Corrupt("cannot create a decompressor".into()))
    }

    /// Stops reading a progressive JPEG with an error after this many scans (0: no limit),
    /// against files crafted to take seconds.
    pub fn set_scan_limit(&mut self, scans: u32) {
        let scans = scans.min(libc::c_int::MAX as u32);
        // SAFETY: the reader is live and owned by `self`.
        unsafe { ffi::gf_reader_set_scan_limit(self.raw.as_ptr(), scans as libc::c_int) }
        self.scan_limit = scans;
    }

    fn message(&self) -> String {
        // SAFETY: the reader is live; its message is a NUL-terminated buffer inside it, copied
        // here before any other call.
        let message = unsafe { CStr::from_ptr(ffi::gf_reader_message(self.raw.as_ptr())) };
        message.to_string_lossy().trim().replace('\n', " ")
    }

    fn error(&self, status: libc::c_int) -> CoefficientError {
        match status {
            ffi::UNSUPPORTED => CoefficientError::Unsupported(self.message()),
            ffi::BAD_CALL => CoefficientError::Request(self.message()),
            ffi::ERROR => CoefficientError::Corrupt(self.message()),
            other => CoefficientError::Corrupt(format!("{} (status {other})", self.message())),
        }
    }

    /// Reads the headers of `jpeg` up to its first scan. `jpeg` stays borrowed until the
    /// coefficients are read and dropped.
    pub fn open<'r>(&'r mut self, jpeg: &'r [u8]) -> Result<Opened<'r>, CoefficientError> {
        if jpeg.is_empty() {
            return Err(CoefficientError::Request("no data".into()));
        }
        let mut raw = ffi::Header::default();
        // SAFETY: the reader is live; `jpeg` is only read, by libjpeg's memory source, and stays
        // borrowed (through the returned value's lifetime) for as long as libjpeg may read it:
        // until the coefficients are read. `raw` is a plain structure of the shim's layout
        // (checked in `new`), written by the call.
        let status =
            unsafe { ffi::gf_open(self.raw.as_ptr(), jpeg.as_ptr(), jpeg.len(), &mut raw) };
        if status != ffi::OK {
            return Err(self.error(status));
        }
        let header = match header_of(&raw) {
            Ok(header) => header,
            Err(e) => {
                // SAFETY: the reader is live; closing frees libjpeg's state for this image.
                unsafe { ffi::gf_reader_close(self.raw.as_ptr()) };
                return Err(e);
            }
        };
        Ok(Opened {
            reader: self,
            header,
        })
    }
}

impl Drop for CoefficientReader {
    fn drop(&mut self) {
        // SAFETY: the reader came from gf_reader_new, is owned by `self` and not used after.
        unsafe { ffi::gf_reader_free(self.raw.as_ptr()) }
    }
}

fn header_of(raw: &ffi::Header) -> Result<CoefficientHeader, CoefficientError> {
    let colorspace = match raw.color_space {
        ffi::JCS_GRAYSCALE => Colorspace::Gray,
        ffi::JCS_RGB => Colorspace::Rgb,
        ffi::JCS_YCBCR => Colorspace::YCbCr,
        ffi::JCS_CMYK => Colorspace::Cmyk,
        ffi::JCS_YCCK => Colorspace::Ycck,
        other => {
            return Err(CoefficientError::Unsupported(format!(
                "unknown colour space ({} components, libjpeg's code {other})",
                raw.num_components
            )))
        }
    };
    if raw.ccir601 != 0 {
        return Err(CoefficientError::Unsupported(
            "CCIR 601 sampling (libjpeg does not decode it)".into(),
        ));
    }
    let count = usize::try_from(raw.num_components)
        .ok()
        .filter(|n| (1..=ffi::MAX_COMPONENTS).contains(n))
        .ok_or_else(|| {
            CoefficientError::Unsupported(format!("{} components", raw.num_components))
        })?;
    let factor = |f: i32| u8::try_from(f).ok().filter(|f| (1..=4).contains(f));
    let components = raw.comp[..count]
        .iter()
        .map(|c| {
            let (Some(h_samp), Some(v_samp)) = (factor(c.h_samp), factor(c.v_samp)) else {
                return Err(CoefficientError::Corrupt(format!(
                    "sampling factors {}x{}",
                    c.h_samp, c.v_samp
                )));
            };
            Ok(ComponentInfo {
                id: c.id as u8,
                h_samp,
                v_samp,
                blocks_wide: c.blocks_wide,
                blocks_high: c.blocks_high,
                padded_blocks_wide: c.padded_blocks_wide,
                padded_blocks_high: c.padded_blocks_high,
                samples_wide: c.samples_wide,
                samples_high: c.samples_high,
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let (Some(max_h_samp), Some(max_v_samp)) = (factor(raw.max_h_samp), factor(raw.max_v_samp))
    else {
        return Err(CoefficientError::Corrupt("sampling factors".into()));
    };
    Ok(CoefficientHeader {
        width: raw.width,
        height: raw.height,
        colorspace,
        progressive: raw.progressive != 0,
        arithmetic: raw.arithmetic != 0,
        restart_interval: u32::try_from(raw.restart_interval).unwrap_or(0),
        jfif: raw.saw_jfif != 0,
        adobe_transform: (raw.saw_adobe != 0).then_some(raw.adobe_transform as u8),
        max_h_samp,
        max_v_samp,
        imcu_rows: raw.imcu_rows,
        stops_early: raw.single_scan != 0 && raw.arithmetic == 0,
        components,
    })
}

/// A JPEG whose headers are read, before its coefficients are.
#[derive(Debug)]
pub struct Opened<'r> {
    reader: &'r mut CoefficientReader,
    header: CoefficientHeader,
}

impl<'r> Opened<'r> {
    /// The headers.
    pub fn header(&self) -> &CoefficientHeader {
        &self.header
    }

    /// Entropy-decodes the coefficients: all of them with `None`; with `Some(rows)`, a file
    /// that [stops early](CoefficientHeader::stops_early) is decoded only down to iMCU row
    /// `rows` (the rows below read as zero), any other file whole.
    pub fn read(self, stop_after: Option<u32>) -> Result<Coefficients<'r>, CoefficientError> {
        let mut raw = ffi::Coefficients::default();
        // 0 tells the shim to read everything.
        let stop = match stop_after {
            Some(rows) if rows < self.header.imcu_rows => rows.max(1),
            _ => 0,
        };
        let reader = self.reader;
        // SAFETY: the reader is live and holds the image `open` read the headers of, whose data
        // is still borrowed (lifetime 'r); `raw` is a plain structure of the shim's layout.
        let status = unsafe { ffi::gf_read_coefficients(reader.raw.as_ptr(), stop, &mut raw) };
        if status == ffi::SCAN_LIMIT {
            return Err(CoefficientError::TooManyScans(reader.scan_limit));
        }
        if status != ffi::OK {
            return Err(reader.error(status));
        }
        let warning = (raw.warnings > 0).then(|| reader.message());
        let header = self.header;
        let rows_read = header
            .components
            .iter()
            .map(|c| {
                if raw.stopped_early != 0 {
                    (raw.imcu_rows_read * u32::from(c.v_samp)).min(c.blocks_high)
                } else {
                    c.blocks_high
                }
            })
            .collect();
        Ok(Coefficients {
            reader,
            header,
            quant: raw.quant,
            rows_read,
            stopped_early: raw.stopped_early != 0,
            block_smoothing: raw.block_smoothing != 0,
            warning,
        })
    }
}

/// The coefficients of one JPEG, lent from libjpeg-turbo's arrays.
#[derive(Debug)]
pub struct Coefficients<'r> {
    reader: &'r mut CoefficientReader,
    header: CoefficientHeader,
    quant: [[u16; 64]; ffi::MAX_COMPONENTS],
    rows_read: Vec<u32>,
    stopped_early: bool,
    block_smoothing: bool,
    warning: Option<String>,
}

impl Coefficients<'_> {
    /// The headers.
    pub fn header(&self) -> &CoefficientHeader {
        &self.header
    }

    /// Component `component`'s quantization table, natural order, as libjpeg latched it for
    /// the component's first scan. (libjpeg-turbo's integer inverse DCT multiplies by these
    /// values taken as `i16`: a table entry above 32767, possible only in 16-bit tables, acts
    /// as negative.) `None` for a component that does not exist.
    pub fn quant_table(&self, component: usize) -> Option<&[u16; 64]> {
        (component < self.header.components.len()).then(|| &self.quant[component])
    }

    /// Block rows of `component` that hold decoded data: all of them, unless the read stopped
    /// early (then the rows of the iMCU rows read).
    pub fn block_rows_read(&self, component: usize) -> u32 {
        self.rows_read.get(component).copied().unwrap_or(0)
    }

    /// Whether the read stopped before the end of the image.
    pub fn stopped_early(&self) -> bool {
        self.stopped_early
    }

    /// Whether libjpeg-turbo's own decoder would smooth these blocks before its inverse DCT
    /// (`jdcoefct.c`, `smoothing_ok`): a progressive file whose first AC coefficients are not
    /// all complete, as when it ends before its last scans. Pixels made from the coefficients
    /// alone then differ from its decode.
    pub fn block_smoothing(&self) -> bool {
        self.block_smoothing
    }

    /// libjpeg's first warning about the data, when it had a recoverable fault ("Premature end
    /// of JPEG file" for a file cut short, "Corrupt JPEG data: ..."): the missing or damaged part
    /// reads as zero coefficients, as in its own decode.
    pub fn warning(&self) -> Option<&str> {
        self.warning.as_deref()
    }

    fn check_row(&self, component: usize, row: u32) -> Result<&ComponentInfo, CoefficientError> {
        let info = self.header.components.get(component).ok_or_else(|| {
            CoefficientError::Request(format!(
                "component {component} of {}",
                self.header.components.len()
            ))
        })?;
        if row >= self.block_rows_read(component) {
            return Err(CoefficientError::Request(format!(
                "block row {row} of component {component}: {} read",
                self.block_rows_read(component)
            )));
        }
        Ok(info)
    }

    /// Block row `row` of `component`: `blocks_wide` blocks of 64 coefficients, natural order,
    /// block after block. Only rows below [`Coefficients::block_rows_read`] exist.
    pub fn block_row(&self, component: usize, row: u32) -> Result<&[i16], CoefficientError> {
        let info = self.check_row(component, row)?;
        let mut address: *const i16 = std::ptr::null();
        // SAFETY: the reader is live and holds this image's coefficients (read by `read`, not
        // closed: `self` borrows the reader mutably); the component and row are inside the
        // array (checked above), and the call writes one pointer into `address`.
        let status = unsafe {
            ffi::gf_block_rows(
                self.reader.raw.as_ptr(),
                component as libc::c_int,
                row,
                1,
                &mut address,
            )
        };
        if status != ffi::OK || address.is_null() {
            return Err(self.reader.error(status));
        }
        // SAFETY: libjpeg's block row holds `padded_blocks_wide >= blocks_wide` blocks of 64
        // `JCOEF` (i16), contiguous (a JBLOCKROW), owned by its image pool, which stays until
        // the reader opens another image or is dropped, both impossible while `self` (and so
        // the returned slice) borrows the reader.
        Ok(unsafe { std::slice::from_raw_parts(address, info.blocks_wide as usize * 64) })
    }

    /// Copies the block rows read of `component` into `out`, rows packed: `blocks_wide * 64`
    /// values a row, [`Coefficients::block_rows_read`] rows; `out` must hold exactly that.
    pub fn copy_component(
        &self,
        component: usize,
        out: &mut [i16],
    ) -> Result<(), CoefficientError> {
        let info = self.check_row(component, 0)?;
        let row_len = info.blocks_wide as usize * 64;
        let rows = self.block_rows_read(component) as usize;
        if out.len() != row_len * rows {
            return Err(CoefficientError::Request(format!(
                "component {component}: the buffer holds {} coefficients, {rows} rows of \
                 {row_len} need {}",
                out.len(),
                row_len * rows
            )));
        }
        for (row, chunk) in out.chunks_exact_mut(row_len).enumerate() {
            chunk.copy_from_slice(self.block_row(component, row as u32)?);
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "coefficients_tests.rs"]
mod tests;
