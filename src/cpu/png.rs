//! PNG files as the decoder sees them: without the metadata chunks that nothing here uses and
//! that a hostile file can make the `png` crate keep or inflate far beyond the image's size (a
//! colour profile whose 3 MB inflate to 3 GiB, text chunks by the hundred thousand, an EXIF
//! chunk as large as the file). The chunks are skipped in place, without copying the file, so
//! what a PNG's decode allocates follows from its header: its pixels.

use std::io::{BufRead, Read, Seek, SeekFrom};

/// The PNG signature.
const SIGNATURE: &[u8; 8] = b"\x89PNG\r\n\x1a\n";

/// Ancillary chunks the decoder never sees: the colour profile (`iCCP`, compressed), the text
/// chunks (`tEXt`, `zTXt`, `iTXt`) and, unless EXIF orientation is asked for, `eXIf`. Neither
/// Pillow's `convert("RGB")` nor torchvision use them for the pixels.
const SKIPPED: [&[u8; 4]; 5] = [b"iCCP", b"tEXt", b"zTXt", b"iTXt", b"eXIf"];

/// The largest `eXIf` chunk kept for EXIF orientation: what a JPEG's EXIF segment can hold. A
/// larger one is skipped (the image is then read as stored).
pub(crate) const MAX_EXIF_BYTES: u32 = 64 << 10;

/// What a PNG's header says, read from its first 33 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PngHeader {
    pub width: u32,
    pub height: u32,
    /// Bytes a pixel takes once decoded as the `image` crate gives it: samples of 1 or 2 bytes,
    /// palette images expanded to RGBA (the most a palette can become).
    pub decoded_bytes_per_pixel: u64,
}

/// The header of a PNG from its first bytes; `None` when they are not a PNG's signature and
/// `IHDR` chunk (the decoder then says what is wrong).
pub(crate) fn header(head: &[u8]) -> Option<PngHeader> {
    if head.get(..8)? != SIGNATURE || head.get(12..16)? != b"IHDR" {
        return None;
    }
    let be = |at: usize| -> Option<u32> {
        Some(u32::from_be_bytes(head.get(at..at + 4)?.try_into().ok()?))
    };
    let (width, height) = (be(16)?, be(20)?);
    let depth = *head.get(24)?;
    let channels: u64 = match head.get(25)? {
        0 => 1,
        2 => 3,
        3 => 4,
        4 => 2,
        6 => 4,
        _ => return None,
    };
    let sample = if depth == 16 { 2 } else { 1 };
    Some(PngHeader {
        width,
        height,
        decoded_bytes_per_pixel: channels * sample,
    })
}

/// A PNG's bytes without its [`SKIPPED`] chunks, read in place: `Read + BufRead + Seek` over the
/// kept ranges of `bytes`. Anything that is not a well-formed chunk sequence is kept as it is,
/// for the decoder to report.
pub(crate) struct PngView<'a> {
    bytes: &'a [u8],
    /// The kept ranges of `bytes`, in order, with where each starts in the view.
    parts: Vec<Part>,
    len: u64,
    at: u64,
}

#[derive(Debug, Clone, Copy)]
struct Part {
    start: usize,
    end: usize,
    /// Where the part starts in the view.
    offset: u64,
}

impl<'a> PngView<'a> {
    /// The view of `bytes` (a PNG) with its metadata chunks skipped; `keep_exif` keeps an
    /// `eXIf` chunk of at most [`MAX_EXIF_BYTES`].
    pub fn new(bytes: &'a [u8], keep_exif: bool) -> PngView<'a> {
        let mut ranges = Vec::new();
        let mut kept_from = 0;
        if bytes.starts_with(SIGNATURE) {
            let mut at = SIGNATURE.len();
            while let Some(chunk) = bytes.get(at..at + 8) {
                let length = u32::from_be_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
                let kind = [chunk[4], chunk[5], chunk[6], chunk[7]];
                // Length, type, data and CRC; a chunk past the end is left to the decoder.
                let Some(end) = at
                    .checked_add(12)
                    .and_then(|e| e.checked_add(length as usize))
                    .filter(|&e| e <= bytes.len())
                else {
                    break;
                };
                let exif_kept = keep_exif && &kind == b"eXIf" && length <= MAX_EXIF_BYTES;
                if SKIPPED.contains(&&kind) && !exif_kept {
                    if at > kept_from {
                        ranges.push((kept_from, at));
                    }
                    kept_from = end;
                }
                at = end;
                if &kind == b"IEND" {
                    break;
                }
            }
        }
        if kept_from < bytes.len() || ranges.is_empty() {
            ranges.push((kept_from, bytes.len()));
        }
        let mut offset = 0u64;
        let parts = ranges
            .into_iter()
            .map(|(start, end)| {
                let part = Part { start, end, offset };
                offset += (end - start) as u64;
                part
            })
            .collect();
        PngView {
            bytes,
            parts,
            len: offset,
            at: 0,
        }
    }

    /// Bytes the view holds (the file's, less the skipped chunks).
    #[cfg(test)]
    fn len(&self) -> u64 {
        self.len
    }

    /// The rest of the part holding the current position.
    fn current(&self) -> &'a [u8] {
        // The last part starting at or before the position.
        let i = self.parts.partition_point(|p| p.offset <= self.at);
        let Some(part) = i.checked_sub(1).and_then(|i| self.parts.get(i)) else {
            return &[];
        };
        let skip = (self.at - part.offset) as usize;
        let bytes: &'a [u8] = self.bytes;
        bytes.get(part.start + skip..part.end).unwrap_or(&[])
    }
}

impl Read for PngView<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let rest = self.current();
        let n = rest.len().min(buf.len());
        buf[..n].copy_from_slice(&rest[..n]);
        self.at += n as u64;
        Ok(n)
    }
}

impl BufRead for PngView<'_> {
    fn fill_buf(&mut self) -> std::io::Result<&[u8]> {
        Ok(self.current())
    }

    fn consume(&mut self, amount: usize) {
        self.at = (self.at + amount as u64).min(self.len);
    }
}

impl Seek for PngView<'_> {
    fn seek(&mut self, to: SeekFrom) -> std::io::Result<u64> {
        self.at = match to {
            SeekFrom::Start(n) => Some(n),
            SeekFrom::End(d) => self.len.checked_add_signed(d),
            SeekFrom::Current(d) => self.at.checked_add_signed(d),
        }
        .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
        Ok(self.at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(kind: &[u8; 4], data: &[u8]) -> Vec<u8> {
        let mut out = (data.len() as u32).to_be_bytes().to_vec();
        out.extend_from_slice(kind);
        out.extend_from_slice(data);
        out.extend_from_slice(&[0, 0, 0, 0]); // CRC: the view does not check it
        out
    }

    fn read_all(mut view: PngView) -> Vec<u8> {
        let mut out = Vec::new();
        view.read_to_end(&mut out).expect("read");
        out
    }

    #[test]
    fn metadata_chunks_are_skipped_and_the_rest_kept_in_order() {
        let ihdr = chunk(b"IHDR", &[0, 0, 0, 2, 0, 0, 0, 3, 8, 2, 0, 0, 0]);
        let iccp = chunk(b"iCCP", &[b'x'; 100]);
        let idat = chunk(b"IDAT", b"pixels");
        let text = chunk(b"tEXt", b"k\0v");
        let exif = chunk(b"eXIf", b"MM\0*");
        let iend = chunk(b"IEND", b"");
        let file = [
            &SIGNATURE[..],
            &ihdr,
            &iccp,
            &exif,
            &idat,
            &text,
            &text,
            &iend,
        ]
        .concat();
        let want = [&SIGNATURE[..], &ihdr, &idat, &iend].concat();
        let view = PngView::new(&file, false);
        assert_eq!(view.len(), want.len() as u64);
        assert_eq!(read_all(view), want);
        let with_exif = [&SIGNATURE[..], &ihdr, &exif, &idat, &iend].concat();
        assert_eq!(read_all(PngView::new(&file, true)), with_exif);

        // Seeking lands on the same bytes as in the kept sequence.
        let mut view = PngView::new(&file, false);
        view.seek(SeekFrom::Start(want.len() as u64 - 15))
            .expect("seek");
        let mut tail = Vec::new();
        view.read_to_end(&mut tail).expect("read");
        assert_eq!(tail, want[want.len() - 15..]);
        assert_eq!(
            header(&file),
            Some(PngHeader {
                width: 2,
                height: 3,
                decoded_bytes_per_pixel: 3
            })
        );
    }

    #[test]
    fn what_is_not_a_chunk_sequence_is_kept_as_it_is() {
        let ihdr = chunk(b"IHDR", &[0; 13]);
        let mut cut = [&SIGNATURE[..], &ihdr, &chunk(b"iCCP", &[1; 50])].concat();
        cut.truncate(cut.len() - 10);
        assert_eq!(read_all(PngView::new(&cut, false)), cut);
        let not_png = b"GIF89a and more".to_vec();
        assert_eq!(read_all(PngView::new(&not_png, false)), not_png);
        assert_eq!(header(&not_png), None);
        let big_exif = [
            &SIGNATURE[..],
            &ihdr,
            &chunk(b"eXIf", &vec![0; MAX_EXIF_BYTES as usize + 1]),
        ]
        .concat();
        assert_eq!(
            read_all(PngView::new(&big_exif, true)),
            [&SIGNATURE[..], &ihdr].concat()
        );
    }
}
