//! A baseline JPEG made ready for the GPU's entropy decoding (`kernels/entropy.cu`): its markers
//! parsed, its entropy-coded data destuffed and cut at the restart markers, its Huffman tables
//! built in the kernels' lookup form.
//!
//! Only what the kernels reproduce exactly is taken: sequential Huffman coding (SOF0 or SOF1),
//! 8-bit samples, 1 or 3 components, and one scan that holds every component (interleaved, or the
//! single component of a gray file). Everything else (progressive, arithmetic, lossless or
//! hierarchical files, 12-bit samples, 4 components, several scans, a height given by a DNL
//! marker, malformed tables or markers) is refused with [`Error::Unsupported`], and the caller
//! decodes the file on the CPU. Parsing reads every byte through checked slices: bad input is
//! refused, never a panic or an endless loop.
//!
//! The entropy-coded data is kept as libjpeg's bit reader sees it (`jdhuff.c`
//! `jpeg_fill_bit_buffer`): a 0xFF byte followed by any number of 0xFF fill bytes and a 0x00 is
//! one 0xFF data byte; any other marker ends a restart interval (RSTn, in sequence) or the scan.
//! Each interval starts on a byte boundary of the destuffed data ([`Interval`]).
//!
//! The Huffman tables follow `jpeg_make_d_derived_tbl`: canonical codes, the same validity checks
//! (a table whose codes overflow, more than 256 symbols, a DC symbol above 15), a first-level
//! lookup of [`LOOKUP_BITS`] bits and the `maxcode`/`valoffset` slow path for longer codes.

use super::markers::{
    derive_table, destuff_scan, parse_dht, parse_dqt, parse_dri, parse_frame, unsupported, Cursor,
    FrameComponent, ScanEnd, Tables,
};
use super::Error;

/// Bits the kernels' first-level Huffman lookup reads at once (`GF_LOOKUP_BITS`): codes longer
/// than that take the slow path, a warp's threads waiting while one of them walks it.
pub const LOOKUP_BITS: u32 = 10;
/// `u32` words of one table in the kernels' form: the lookup (`1 << LOOKUP_BITS` entries,
/// `length << 8 | symbol`, 0 for a longer code), `maxcode[0..18]` and `valoffset[0..18]` (as
/// `i32`), the 256 symbols 4 to a word.
pub const TABLE_WORDS: usize = table_words(LOOKUP_BITS);

/// `u32` words of one table in lookup form with a first-level lookup of `lookup_bits` bits.
pub const fn table_words(lookup_bits: u32) -> usize {
    (1 << lookup_bits) + 18 + 18 + 64
}
/// Blocks an MCU holds at most (libjpeg's `D_MAX_BLOCKS_IN_MCU`).
pub const MAX_BLOCKS_IN_MCU: usize = 10;

/// libjpeg's `jpeg_natural_order`: the natural-order index of the `k`-th coefficient in zigzag
/// order.
pub(crate) const NATURAL_ORDER: [u8; 64] = [
    0, 1, 8, 16, 9, 2, 3, 10, 17, 24, 32, 25, 18, 11, 4, 5, 12, 19, 26, 33, 40, 48, 41, 34, 27, 20,
    13, 6, 7, 14, 21, 28, 35, 42, 49, 56, 57, 50, 43, 36, 29, 22, 15, 23, 30, 37, 44, 51, 58, 59,
    52, 45, 38, 31, 39, 46, 53, 60, 61, 54, 47, 55, 62, 63,
];

/// One component of the scan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScanComponent {
    /// Its identifier in the frame header.
    pub id: u8,
    /// Horizontal sampling factor.
    pub h_samp: u32,
    /// Vertical sampling factor.
    pub v_samp: u32,
    /// Blocks per row of its coefficient plane: every block the scan codes, the padding blocks
    /// of partial MCUs included (`MCUs across * h_samp` when interleaved, libjpeg's
    /// `width_in_blocks` for a single component).
    pub plane_blocks_wide: u32,
    /// Block rows of its plane (likewise).
    pub plane_blocks_high: u32,
    /// Its quantization table as the scan found it, natural order.
    pub quant: [u16; 64],
}

/// One restart interval: where its data starts and ends in [`ParsedJpeg::data`] and which MCUs
/// it codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Interval {
    /// First byte of its data.
    pub start: u32,
    /// One past its last byte.
    pub end: u32,
    /// Its first MCU.
    pub first_mcu: u32,
    /// MCUs it codes.
    pub mcus: u32,
}

/// A baseline JPEG parsed for the GPU's entropy decoding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedJpeg {
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
    /// The components, in the frame header's order (which is also the scan's).
    pub components: Vec<ScanComponent>,
    /// MCUs per MCU row.
    pub mcus_wide: u32,
    /// MCU rows.
    pub mcus_high: u32,
    /// The component of each block of an MCU, in coding order, with its column and row inside
    /// the MCU.
    pub mcu_blocks: Vec<(u8, u8, u8)>,
    /// The restart intervals, in order (one when the file has no restart markers).
    pub intervals: Vec<Interval>,
    /// The destuffed entropy-coded data of every interval, one after the other.
    pub data: Vec<u8>,
    /// Per component, its DC table then its AC table, [`TABLE_WORDS`] words each.
    pub tables: Vec<u32>,
}

impl ParsedJpeg {
    /// MCUs in the image.
    pub fn mcus(&self) -> u32 {
        self.mcus_wide * self.mcus_high
    }

    /// Blocks in one MCU.
    pub fn blocks_in_mcu(&self) -> u32 {
        self.mcu_blocks.len() as u32
    }

    /// Coefficients (`i16`) of component `c`'s plane.
    pub fn plane_len(&self, c: usize) -> usize {
        self.components.get(c).map_or(0, |p| {
            p.plane_blocks_wide as usize * p.plane_blocks_high as usize * 64
        })
    }
}

/// Parses `jpeg` for the GPU's entropy decoding, or says why the CPU must decode it.
pub fn parse(jpeg: &[u8]) -> Result<ParsedJpeg, Error> {
    let mut cur = Cursor::start(jpeg)?;
    let mut tables = Tables::default();
    let mut frame: Option<(u32, u32, Vec<FrameComponent>)> = None;
    let mut restart = 0u32;
    loop {
        match cur.marker()? {
            0xC0 | 0xC1 => {
                if frame.is_some() {
                    return Err(unsupported("two frame headers"));
                }
                frame = Some(parse_frame(&mut cur.segment()?)?);
            }
            0xC2 | 0xC6 | 0xCA | 0xCE => return Err(unsupported("a progressive JPEG")),
            0xC3 | 0xC7 | 0xCB | 0xCF => return Err(unsupported("a lossless JPEG")),
            0xC5 | 0xCD => return Err(unsupported("a hierarchical JPEG")),
            0xC9 | 0xCC => return Err(unsupported("an arithmetic-coded JPEG")),
            0xC4 => parse_dht(&mut cur.segment()?, &mut tables.dc, &mut tables.ac)?,
            0xDB => parse_dqt(&mut cur.segment()?, &mut tables.quant)?,
            0xDD => restart = parse_dri(&mut cur.segment()?)?,
            0xDA => {
                let (width, height, fc) = frame
                    .take()
                    .ok_or_else(|| unsupported("a scan before the frame header"))?;
                let mut s = cur.segment()?;
                let scan = parse_sos(&mut s, &fc)?;
                return build(jpeg, cur.at, width, height, &fc, &scan, &tables, restart);
            }
            0xD8 => return Err(unsupported("a second SOI marker")),
            0xD9 => return Err(unsupported("the file ends before its scan")),
            0xDC => return Err(unsupported("a DNL marker")),
            0xD0..=0xD7 | 0x01 => return Err(unsupported("a restart marker outside a scan")),
            _ => {
                // APPn, COM and the rest: skipped.
                cur.segment()?;
            }
        }
    }
}

/// The scan's components: per frame component (in frame order), its DC and AC table slots.
fn parse_sos(s: &mut Cursor<'_>, frame: &[FrameComponent]) -> Result<Vec<(usize, usize)>, Error> {
    let n = usize::from(s.u8()?);
    if n != frame.len() {
        return Err(unsupported(format!(
            "a scan of {n} of the {} components (several scans)",
            frame.len()
        )));
    }
    let mut tables = Vec::with_capacity(n);
    for component in frame {
        let id = s.u8()?;
        let t = s.u8()?;
        // libjpeg codes the MCU in the scan's order; the frame's order is what the planes are in,
        // and the two must agree for the MCU layout below.
        if component.id != id {
            return Err(unsupported(
                "a scan whose components are not in the frame's order",
            ));
        }
        let (td, ta) = (usize::from(t >> 4), usize::from(t & 15));
        if td > 3 || ta > 3 {
            return Err(unsupported(format!("Huffman table selectors {t:#04x}")));
        }
        tables.push((td, ta));
    }
    let (ss, se, ahal) = (s.u8()?, s.u8()?, s.u8()?);
    if ss != 0 || se != 63 || ahal != 0 {
        return Err(unsupported(
            "a scan that is not sequential (Ss, Se, Ah, Al)",
        ));
    }
    if !s.done() {
        return Err(unsupported("a scan header of the wrong length"));
    }
    Ok(tables)
}

/// Everything the kernels need, from the scan header on (`at`: the first byte of the
/// entropy-coded data).
#[allow(clippy::too_many_arguments)]
fn build(
    jpeg: &[u8],
    at: usize,
    width: u32,
    height: u32,
    frame: &[FrameComponent],
    scan: &[(usize, usize)],
    defined: &Tables,
    restart: u32,
) -> Result<ParsedJpeg, Error> {
    let hmax = frame.iter().map(|c| c.h).max().unwrap_or(1);
    let vmax = frame.iter().map(|c| c.v).max().unwrap_or(1);
    let mut components = Vec::with_capacity(frame.len());
    let mut mcu_blocks = Vec::new();
    let (mcus_wide, mcus_high);
    if frame.len() == 1 {
        // A single-component scan is not interleaved: one block an MCU, the component's own
        // block grid (jdinput.c per_scan_setup).
        let c = frame[0];
        let samples_wide = (width * c.h).div_ceil(hmax);
        let samples_high = (height * c.v).div_ceil(vmax);
        mcus_wide = samples_wide.div_ceil(8);
        mcus_high = samples_high.div_ceil(8);
        mcu_blocks.push((0, 0, 0));
    } else {
        mcus_wide = width.div_ceil(8 * hmax);
        mcus_high = height.div_ceil(8 * vmax);
        for (i, c) in frame.iter().enumerate() {
            for y in 0..c.v {
                for x in 0..c.h {
                    mcu_blocks.push((i as u8, x as u8, y as u8));
                }
            }
        }
        if mcu_blocks.len() > MAX_BLOCKS_IN_MCU {
            return Err(unsupported(format!(
                "{} blocks in an MCU (libjpeg takes at most {MAX_BLOCKS_IN_MCU})",
                mcu_blocks.len()
            )));
        }
    }
    let mut tables = Vec::with_capacity(frame.len() * 2 * TABLE_WORDS);
    for (c, &(td, ta)) in frame.iter().zip(scan) {
        let q = defined.quant[c.tq]
            .ok_or_else(|| unsupported(format!("quantization table {} missing", c.tq)))?;
        let (wide, high) = if frame.len() == 1 {
            (mcus_wide, mcus_high)
        } else {
            (mcus_wide * c.h, mcus_high * c.v)
        };
        components.push(ScanComponent {
            id: c.id,
            h_samp: c.h,
            v_samp: c.v,
            plane_blocks_wide: wide,
            plane_blocks_high: high,
            quant: q,
        });
        let dc_table = defined.dc[td]
            .as_ref()
            .ok_or_else(|| unsupported(format!("DC Huffman table {td} missing")))?;
        let ac_table = defined.ac[ta]
            .as_ref()
            .ok_or_else(|| unsupported(format!("AC Huffman table {ta} missing")))?;
        derive_table(dc_table, true, LOOKUP_BITS, &mut tables)?;
        derive_table(ac_table, false, LOOKUP_BITS, &mut tables)?;
    }
    let mcus = mcus_wide
        .checked_mul(mcus_high)
        .ok_or_else(|| unsupported("too many MCUs"))?;
    let per_interval = if restart == 0 { mcus } else { restart };
    let (data, intervals) = destuff(&jpeg[at.min(jpeg.len())..], mcus, per_interval)?;
    Ok(ParsedJpeg {
        width,
        height,
        components,
        mcus_wide,
        mcus_high,
        mcu_blocks,
        intervals,
        data,
        tables,
    })
}

/// The entropy-coded data from `scan` on, destuffed and cut at its restart markers: exactly
/// `ceil(mcus / per_interval)` intervals, RST0..RST7 in turn between them. The scan ends at the
/// end of the file or at a marker other than RSTn, which must be EOI.
fn destuff(scan: &[u8], mcus: u32, per_interval: u32) -> Result<(Vec<u8>, Vec<Interval>), Error> {
    let mut data = Vec::with_capacity(scan.len());
    let mut intervals = Vec::new();
    match destuff_scan(scan, mcus, per_interval, &mut data, &mut intervals)? {
        ScanEnd::EndOfFile | ScanEnd::Marker { code: 0xD9, .. } => Ok((data, intervals)),
        ScanEnd::Marker { .. } => Err(unsupported("a marker after the scan other than EOI")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn destuffing_and_restart_intervals() {
        // Two intervals of 1 MCU each: data FF00 12 | RST0 | 34 FF FF 00 | EOI.
        let scan = [
            0xFF, 0x00, 0x12, 0xFF, 0xD0, 0x34, 0xFF, 0xFF, 0x00, 0xFF, 0xD9,
        ];
        let (data, intervals) = destuff(&scan, 2, 1).unwrap();
        assert_eq!(data, [0xFF, 0x12, 0x34, 0xFF]);
        assert_eq!(intervals.len(), 2);
        assert_eq!((intervals[0].start, intervals[0].end), (0, 2));
        assert_eq!(
            (intervals[1].start, intervals[1].end, intervals[1].first_mcu),
            (2, 4, 1)
        );
        // Out of sequence, too many, too few.
        assert!(destuff(&[0x00, 0xFF, 0xD1, 0x00], 2, 1).is_err());
        assert!(destuff(&[0x00, 0xFF, 0xD0, 0x00], 1, 1).is_err());
        assert!(destuff(&[0x00, 0xFF, 0xD9], 2, 1).is_err());
    }
}
