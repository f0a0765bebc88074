//! A JPEG marker walk, without decoding: enough to refuse what the hardware decoder does not take
//! (progressive, lossless, hierarchical or arithmetic-coded frames, precision other than 8 bits,
//! CMYK/YCCK or RGB-coded files, 4:1:1 and other subsamplings, several scans, truncated files)
//! before a single bad file can fail a whole batch.
//!
//! The walk reads every marker segment and skips entropy-coded data with `memchr`, so its cost is
//! one pass over the file at memory speed; it allocates nothing.

use std::fmt;

/// Chroma subsampling of a JPEG frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Subsampling {
    /// 4:4:4, or a frame whose components all share one sampling.
    S444,
    /// 4:2:2: chroma halved horizontally.
    S422,
    /// 4:2:0: chroma halved both ways.
    S420,
    /// 4:4:0: chroma halved vertically.
    S440,
    /// 4:1:1: chroma quartered horizontally (not for the hardware decoder).
    S411,
    /// 4:1:0 (not for the hardware decoder).
    S410,
    /// One component.
    Gray,
    /// Anything else (unequal chroma sampling, unusual factors).
    Unknown,
}

impl Subsampling {
    /// Whether nvJPEG's hardware backend decodes this subsampling.
    pub fn hardware_supported(self) -> bool {
        matches!(
            self,
            Subsampling::S444
                | Subsampling::S422
                | Subsampling::S420
                | Subsampling::S440
                | Subsampling::Gray
        )
    }
}

impl fmt::Display for Subsampling {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Subsampling::S444 => "4:4:4",
            Subsampling::S422 => "4:2:2",
            Subsampling::S420 => "4:2:0",
            Subsampling::S440 => "4:4:0",
            Subsampling::S411 => "4:1:1",
            Subsampling::S410 => "4:1:0",
            Subsampling::Gray => "gray",
            Subsampling::Unknown => "unknown subsampling",
        })
    }
}

/// What the markers of a JPEG file say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JpegHeader {
    /// Second byte of the frame's SOF marker: 0xC0 baseline, 0xC1 extended sequential, 0xC2
    /// progressive, 0xC3 lossless, 0xC5..=0xC7 hierarchical, 0xC9..=0xCF arithmetic-coded.
    pub frame_marker: u8,
    /// Bits per sample.
    pub precision: u8,
    /// Width in pixels, from the frame header.
    pub width: u16,
    /// Height in pixels, from the frame header (0 means a DNL marker gives it later).
    pub height: u16,
    /// Number of components.
    pub components: u8,
    /// Component identifiers (first four).
    pub component_ids: [u8; 4],
    /// Horizontal and vertical sampling factors of the first four components.
    pub sampling: [(u8, u8); 4],
    /// The Adobe APP14 segment's colour transform (0: none, i.e. RGB or CMYK; 1: YCbCr; 2: YCCK).
    pub adobe_transform: Option<u8>,
    /// Whether a JFIF APP0 segment is present.
    pub jfif: bool,
    /// Whether an Exif APP1 segment is present.
    pub exif: bool,
    /// Number of SOS markers (scans).
    pub scans: u16,
    /// Whether the file ends with an EOI marker after its scans.
    pub complete: bool,
    /// Offset in the file of the frame header's content (the byte after its length).
    pub frame_at: usize,
}

impl JpegHeader {
    /// Progressive DCT frame (SOF2, SOF6, SOF10, SOF14).
    pub fn progressive(&self) -> bool {
        matches!(self.frame_marker, 0xC2 | 0xC6 | 0xCA | 0xCE)
    }

    /// Lossless frame (SOF3, SOF7, SOF11, SOF15).
    pub fn lossless(&self) -> bool {
        matches!(self.frame_marker, 0xC3 | 0xC7 | 0xCB | 0xCF)
    }

    /// Hierarchical (differential) frame (SOF5..SOF7, SOF13..SOF15).
    pub fn hierarchical(&self) -> bool {
        matches!(self.frame_marker, 0xC5..=0xC7 | 0xCD..=0xCF)
    }

    /// Arithmetic entropy coding (SOF9..SOF15).
    pub fn arithmetic(&self) -> bool {
        self.frame_marker >= 0xC9
    }

    /// Three components stored as R, G, B rather than YCbCr (Adobe transform 0, or component ids
    /// 'R', 'G', 'B' without JFIF or Adobe segments), as libjpeg reads them.
    pub fn rgb_colorspace(&self) -> bool {
        self.components == 3
            && (self.adobe_transform == Some(0)
                || (!self.jfif
                    && self.adobe_transform.is_none()
                    && self.component_ids[..3] == *b"RGB"))
    }

    /// Whether the sampling factors are those the hardware decoder is known to decode right: for
    /// three components, chroma at 1x1 and luma at 1x1, 2x1, 1x2 or 2x2 (what encoders write for
    /// 4:4:4, 4:2:2, 4:4:0 and 4:2:0); for one component, any factors from 1 to 4, which change
    /// nothing in a one-component frame (its single scan is non-interleaved, one block per MCU) but
    /// which the engines misread unless [`JpegHeader::gray_factors_at`] is rewritten as 1x1.
    pub fn standard_factors(&self) -> bool {
        let ok = |f: u8| (1..=4).contains(&f);
        match self.components {
            1 => ok(self.sampling[0].0) && ok(self.sampling[0].1),
            3 => {
                let [y, cb, cr, _] = self.sampling;
                cb == (1, 1) && cr == (1, 1) && matches!(y, (1, 1) | (2, 1) | (1, 2) | (2, 2))
            }
            _ => false,
        }
    }

    /// For a one-component frame whose sampling factors are not 1x1 (Pillow writes 2x2 when asked
    /// for 4:2:0), the file offset of that factor byte: writing 0x11 there changes nothing in how
    /// the frame decodes, and makes the hardware decoder read it right.
    pub fn gray_factors_at(&self) -> Option<usize> {
        (self.components == 1 && self.sampling[0] != (1, 1)).then_some(self.frame_at + 7)
    }

    /// Chroma subsampling from the sampling factors.
    pub fn subsampling(&self) -> Subsampling {
        match self.components {
            1 => Subsampling::Gray,
            3 => {
                let [y, cb, cr, _] = self.sampling;
                let hmax = y.0.max(cb.0).max(cr.0);
                let vmax = y.1.max(cb.1).max(cr.1);
                if cb != cr || y != (hmax, vmax) || cb.0 == 0 || cb.1 == 0 {
                    return Subsampling::Unknown;
                }
                if hmax % cb.0 != 0 || vmax % cb.1 != 0 {
                    return Subsampling::Unknown;
                }
                match (hmax / cb.0, vmax / cb.1) {
                    (1, 1) => Subsampling::S444,
                    (2, 1) => Subsampling::S422,
                    (2, 2) => Subsampling::S420,
                    (1, 2) => Subsampling::S440,
                    (4, 1) => Subsampling::S411,
                    (4, 2) => Subsampling::S410,
                    _ => Subsampling::Unknown,
                }
            }
            _ => Subsampling::Unknown,
        }
    }
}

/// Why the marker walk stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeaderError {
    /// No SOI marker: not a JPEG file.
    NotJpeg,
    /// The file ends inside its header (before the first scan's data).
    Truncated,
    /// The markers make no sense; the text says where.
    Malformed(&'static str),
}

impl fmt::Display for HeaderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HeaderError::NotJpeg => f.write_str("not a JPEG file (no SOI marker)"),
            HeaderError::Truncated => f.write_str("truncated inside the JPEG header"),
            HeaderError::Malformed(what) => write!(f, "malformed JPEG: {what}"),
        }
    }
}

impl std::error::Error for HeaderError {}

fn be16(data: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([data[at], data[at + 1]])
}

/// Walks the markers of `data`.
///
/// A file that ends inside entropy-coded data (no EOI) is returned with
/// [`JpegHeader::complete`] false; a file that ends before its first scan is
/// [`HeaderError::Truncated`].
pub fn scan(data: &[u8]) -> Result<JpegHeader, HeaderError> {
    if data.len() < 4 || data[0] != 0xFF || data[1] != 0xD8 {
        return Err(HeaderError::NotJpeg);
    }
    let mut header = JpegHeader {
        frame_marker: 0,
        precision: 0,
        width: 0,
        height: 0,
        components: 0,
        component_ids: [0; 4],
        sampling: [(0, 0); 4],
        adobe_transform: None,
        jfif: false,
        exif: false,
        scans: 0,
        complete: false,
        frame_at: 0,
    };
    let mut have_frame = false;
    let mut pos = 2;
    loop {
        // Find the next marker: skip anything that is not 0xFF (libjpeg tolerates such bytes
        // between segments), then fill bytes.
        let Some(ff) = memchr::memchr(0xFF, &data[pos..]) else {
            return finish(header, have_frame, false);
        };
        pos += ff;
        while pos < data.len() && data[pos] == 0xFF {
            pos += 1;
        }
        if pos >= data.len() {
            return finish(header, have_frame, false);
        }
        let marker = data[pos];
        pos += 1;
        match marker {
            0x00 => continue, // a stuffed zero outside a scan: tolerate, as libjpeg does
            0xD8 => return Err(HeaderError::Malformed("a second SOI marker")),
            0xD9 => return finish(header, have_frame, true),
            0x01 | 0xD0..=0xD7 => continue, // standalone markers
            _ => {}
        }
        if pos + 2 > data.len() {
            return truncated(header, have_frame);
        }
        let length = be16(data, pos) as usize;
        if length < 2 {
            return Err(HeaderError::Malformed("a segment length below 2"));
        }
        if pos + length > data.len() {
            return truncated(header, have_frame);
        }
        let segment = &data[pos + 2..pos + length];
        pos += length;
        match marker {
            0xC0..=0xCF if !matches!(marker, 0xC4 | 0xC8 | 0xCC) => {
                if have_frame {
                    // Hierarchical files carry several frames; the first one already says so.
                    continue;
                }
                if segment.len() < 6 {
                    return Err(HeaderError::Malformed(
                        "a frame header shorter than 6 bytes",
                    ));
                }
                let count = segment[5];
                if segment.len() < 6 + 3 * count as usize {
                    return Err(HeaderError::Malformed(
                        "a frame header shorter than its components",
                    ));
                }
                header.frame_marker = marker;
                header.frame_at = pos - length + 2;
                header.precision = segment[0];
                header.height = be16(segment, 1);
                header.width = be16(segment, 3);
                header.components = count;
                for c in 0..(count as usize).min(4) {
                    let at = 6 + 3 * c;
                    header.component_ids[c] = segment[at];
                    header.sampling[c] = (segment[at + 1] >> 4, segment[at + 1] & 0x0F);
                }
                have_frame = true;
            }
            0xE0 if segment.starts_with(b"JFIF\0") => header.jfif = true,
            0xE1 if segment.starts_with(b"Exif\0") => header.exif = true,
            0xEE if segment.len() >= 12 && segment.starts_with(b"Adobe") => {
                header.adobe_transform = Some(segment[11]);
            }
            0xDA => {
                if !have_frame {
                    return Err(HeaderError::Malformed("a scan before the frame header"));
                }
                header.scans = header.scans.saturating_add(1);
                // Skip the entropy-coded data: up to the next 0xFF that is neither a stuffed zero
                // nor a restart marker.
                loop {
                    let Some(ff) = memchr::memchr(0xFF, &data[pos..]) else {
                        return finish(header, have_frame, false);
                    };
                    let at = pos + ff;
                    match data.get(at + 1) {
                        None => return finish(header, have_frame, false),
                        Some(0x00) | Some(0xD0..=0xD7) => pos = at + 2,
                        Some(0xFF) => pos = at + 1,
                        Some(_) => {
                            pos = at;
                            break;
                        }
                    }
                }
            }
            _ => {}
        }
    }
}

fn truncated(header: JpegHeader, have_frame: bool) -> Result<JpegHeader, HeaderError> {
    if have_frame && header.scans > 0 {
        finish(header, have_frame, false)
    } else {
        Err(HeaderError::Truncated)
    }
}

fn finish(
    mut header: JpegHeader,
    have_frame: bool,
    complete: bool,
) -> Result<JpegHeader, HeaderError> {
    if !have_frame || header.scans == 0 {
        return if complete {
            Err(HeaderError::Malformed("no frame or no scan before EOI"))
        } else {
            Err(HeaderError::Truncated)
        };
    }
    header.complete = complete;
    Ok(header)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> Vec<u8> {
        let path = format!("tests/jpeg-lane/{name}");
        std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    #[test]
    fn baseline_files_read_as_such() {
        for (name, subsampling) in [
            ("ok_444.jpg", Subsampling::S444),
            ("ok_422.jpg", Subsampling::S422),
            ("ok_420.jpg", Subsampling::S420),
            ("ok_440.jpg", Subsampling::S440),
            ("ok_gray.jpg", Subsampling::Gray),
            ("ok_420_restart.jpg", Subsampling::S420),
            ("ok_420_optimized.jpg", Subsampling::S420),
        ] {
            let h = scan(&fixture(name)).unwrap();
            assert_eq!(h.frame_marker, 0xC0, "{name}");
            assert_eq!((h.width, h.height), (96, 64), "{name}");
            assert_eq!(h.precision, 8, "{name}");
            assert_eq!(h.scans, 1, "{name}");
            assert!(h.complete, "{name}");
            assert!(h.jfif, "{name}");
            assert!(!h.rgb_colorspace(), "{name}");
            assert_eq!(h.subsampling(), subsampling, "{name}");
        }
        let odd = scan(&fixture("ok_420_odd_37x23.jpg")).unwrap();
        assert_eq!((odd.width, odd.height), (37, 23));
        let one = scan(&fixture("ok_420_1x1.jpg")).unwrap();
        assert_eq!((one.width, one.height), (1, 1));
    }

    #[test]
    fn what_the_hardware_refuses_is_recognised() {
        assert!(scan(&fixture("bad_progressive.jpg")).unwrap().progressive());
        let arithmetic = scan(&fixture("bad_arithmetic.jpg")).unwrap();
        assert!(arithmetic.arithmetic() && !arithmetic.progressive());
        assert_eq!(
            scan(&fixture("bad_411.jpg")).unwrap().subsampling(),
            Subsampling::S411
        );
        assert!(scan(&fixture("bad_rgb_colorspace.jpg"))
            .unwrap()
            .rgb_colorspace());
        assert_eq!(scan(&fixture("bad_multiscan.jpg")).unwrap().scans, 3);
        let cmyk = scan(&fixture("bad_cmyk.jpg")).unwrap();
        assert_eq!(cmyk.components, 4);
        assert!(cmyk.adobe_transform.is_some());
        let truncated = scan(&fixture("bad_truncated.jpg")).unwrap();
        assert!(!truncated.complete);
        assert_eq!(
            scan(&fixture("bad_truncated_header.jpg")),
            Err(HeaderError::Truncated)
        );
        let twelve = scan(&fixture("bad_12bit_header.jpg")).unwrap();
        assert_eq!((twelve.frame_marker, twelve.precision), (0xC1, 12));
        assert!(scan(&fixture("bad_lossless_header.jpg"))
            .unwrap()
            .lossless());
        assert_eq!(
            scan(&fixture("bad_not_jpeg.png")),
            Err(HeaderError::NotJpeg)
        );
        assert_eq!(scan(&[]), Err(HeaderError::NotJpeg));
    }

    #[test]
    fn gray_sampling_factors_are_found_and_unusual_colour_ones_refused() {
        let gray = fixture("ok_gray.jpg");
        let h = scan(&gray).unwrap();
        assert!(h.standard_factors());
        assert_eq!(h.gray_factors_at(), None);
        assert_eq!(gray[h.frame_at - 4..h.frame_at - 2], [0xFF, 0xC0]);
        // The same frame as Pillow writes it with subsampling=2: factors 2x2.
        let mut pillow = gray.clone();
        pillow[h.frame_at + 7] = 0x22;
        let p = scan(&pillow).unwrap();
        assert_eq!(p.sampling[0], (2, 2));
        assert!(p.standard_factors());
        assert_eq!(p.gray_factors_at(), Some(h.frame_at + 7));
        // Colour: every component at 2x2 (4:4:4 by ratio, unusual factors) is refused.
        let colour = fixture("ok_444.jpg");
        let c = scan(&colour).unwrap();
        assert!(c.standard_factors());
        let mut doubled = colour.clone();
        for k in 0..3 {
            doubled[c.frame_at + 7 + 3 * k] = 0x22;
        }
        let d = scan(&doubled).unwrap();
        assert_eq!(d.subsampling(), Subsampling::S444);
        assert!(!d.standard_factors());
        assert!(scan(&fixture("ok_420.jpg")).unwrap().standard_factors());
    }

    #[test]
    fn every_prefix_of_a_file_is_handled() {
        let data = fixture("ok_420.jpg");
        for end in 0..data.len() {
            match scan(&data[..end]) {
                Ok(h) => assert!(!h.complete || end >= data.len() - 2),
                Err(HeaderError::NotJpeg | HeaderError::Truncated) => {}
                Err(e) => panic!("prefix of {end} bytes: {e}"),
            }
        }
        assert!(scan(&data).unwrap().complete);
    }
}
