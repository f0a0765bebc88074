//! Progressive JPEGs entropy-decoded on the CPU into libjpeg-turbo's coefficients, bit for bit,
//! faster than libjpeg-turbo reads them (`jdphuff.c` decodes one block a call, through its
//! coefficient controller's virtual arrays, a byte at a time into its bit buffer): every scan's
//! data is destuffed first, then the image is decoded in stripes of block rows small enough to
//! stay in the core's cache, every scan in turn taking up the stripe where its decoding left the
//! last one (a block's coefficients depend on the earlier scans of that block alone), 64 bits
//! of data at a time, into planes of the whole image ([`ProgressiveDecoder::decode`]) or of one
//! stripe, packed for the GPU as soon as every scan has decoded it
//! ([`ProgressiveDecoder::decode_packed`], what the pipeline uses: the planes never leave the
//! core's cache). Decoding scan by scan over the whole image instead passes over the planes (3.7
//! MB a megapixel) once a scan, ten times an image, from memory rather than the cache (1.12-1.17x
//! slower on 16 threads). The GPU then does the rest ([`super::pack`], [`super::gpu`]).
//!
//! Only what decodes cleanly is taken: a progressive Huffman frame (SOF2), 8-bit samples, 1 or 3
//! components, a scan script libjpeg accepts without a warning, every coefficient complete at the
//! end (so libjpeg's block smoothing never applies), data that holds every block its scan codes
//! and a Huffman code for every symbol, restart markers in sequence, and an EOI marker. Anything
//! else (a file libjpeg would decode with a warning, or not at all) is refused with
//! [`Error::Unsupported`], and the caller decodes it with libjpeg-turbo, which reports it if it
//! is broken. Every byte is read through checked slices, every loop is bounded by the blocks of
//! a scan: bad input is refused, never a panic.
//!
//! `jdphuff.c`'s four decoders, as they behave on such files:
//!
//! - DC first scans (`decode_mcu_DC_first`): the DC difference's Huffman code and bits, the
//!   component's predictor summed (reset at each restart), shifted left by `Al`;
//! - DC refinement (`decode_mcu_DC_refine`): one bit a block, or'ed in at bit `Al`;
//! - AC first scans (`decode_mcu_AC_first`), one component: run/size symbols, ZRL, and end of
//!   band runs (`EOBRUN`, reset at each restart) that skip whole blocks;
//! - AC refinement (`decode_mcu_AC_refine`): new coefficients of +-`1 << Al` placed past the
//!   run of still-zero coefficients, a correction bit for every coefficient already nonzero in
//!   the band, in and after the end of band run.

use super::entropy::{table_words, Interval, MAX_BLOCKS_IN_MCU, NATURAL_ORDER};
use super::layout::{Layout, Window};
use super::markers::{
    derive_table, destuff_scan, parse_dht, parse_dqt, parse_dri, parse_frame, unsupported, Cursor,
    FrameComponent, ScanEnd, Tables,
};
use super::pack::{PackedImage, RowsPacker};
use super::{CoefficientSource, Error};

/// Bits of this decoder's first-level Huffman lookup: the kernels' lookup form, narrower than
/// the kernels' own. A progressive file holds a table for every scan and component, and
/// [`packed_decode_bytes`] does not count them: at 9 bits they stay within its margin.
const LOOKUP_BITS: u32 = 9;
/// `u32` words of one of this decoder's tables.
const TABLE_WORDS: usize = table_words(LOOKUP_BITS);
/// The most scans a file may have (the CPU lane's libjpeg-turbo stops there too): real files
/// have about ten; a crafted file with thousands would take seconds.
pub const MAX_SCANS: u32 = crate::options::MAX_PROGRESSIVE_SCANS;

/// A component's coefficients: every block of libjpeg's coefficient array (the padding blocks
/// of partial MCUs included), 64 coefficients a block in natural order, row by row.
#[derive(Debug, Default)]
struct Plane {
    blocks_wide: usize,
    blocks_high: usize,
    /// Blocks across and down that the component's non-interleaved scans code (libjpeg's
    /// `width_in_blocks`, `height_in_blocks`).
    coded_wide: usize,
    coded_high: usize,
    /// The block row at the start of `coefficients`: 0 where the plane holds the whole image, a
    /// stripe's first row where it holds one stripe ([`ProgressiveDecoder::decode_packed`]).
    first_row: usize,
    coefficients: Vec<i16>,
    /// Per block, which of its coefficients are nonzero, bit `k` for zigzag position `k`: what
    /// lets a refinement scan read the correction bits of a block in an end of band run without
    /// looking at its zero coefficients.
    nonzero: Vec<u64>,
}

impl Plane {
    /// Holds `rows` block rows from the first on (their memory not zeroed yet).
    fn hold(&mut self, rows: usize) {
        let blocks = rows * self.blocks_wide;
        self.first_row = 0;
        self.coefficients.resize(blocks * 64, 0);
        self.nonzero.resize(blocks, 0);
    }

    /// Where block row `row` starts in the plane (its first coefficient's index), if held.
    fn row_at(&self, row: usize) -> Option<usize> {
        let at = row.checked_sub(self.first_row)? * self.blocks_wide * 64;
        (at < self.coefficients.len()).then_some(at)
    }

    /// Block row `row`'s coefficients, if held.
    fn row(&self, row: usize) -> Option<&[i16]> {
        let at = self.row_at(row)?;
        self.coefficients.get(at..at + self.blocks_wide * 64)
    }

    /// Zeroes block rows `rows` (coefficients and masks) before a stripe is decoded into them.
    fn zero_rows(&mut self, rows: std::ops::Range<usize>) {
        let first = self.first_row;
        let rows = rows.start.saturating_sub(first)..rows.end.saturating_sub(first);
        let blocks = rows.start * self.blocks_wide..rows.end * self.blocks_wide;
        if let Some(coefficients) = self
            .coefficients
            .get_mut(blocks.start * 64..blocks.end * 64)
        {
            coefficients.fill(0);
        }
        if let Some(masks) = self.nonzero.get_mut(blocks) {
            masks.fill(0);
        }
    }
}

/// A progressive JPEG decoder, reused across images by one thread: its planes, scan data and
/// tables keep their memory (no allocation once they have grown to the largest image).
#[derive(Debug)]
pub struct ProgressiveDecoder {
    planes: Vec<Plane>,
    quant: Vec<[u16; 64]>,
    /// Every scan's destuffed data, one after another.
    data: Vec<u8>,
    /// Every scan's restart intervals, their bounds counted in `data`.
    intervals: Vec<Interval>,
    /// Every scan's Huffman tables in lookup form.
    tables: Vec<u32>,
    scans: Vec<ScanPlan>,
    /// The packed sections of the components after the first, while an image is packed.
    later_sections: Vec<Vec<u8>>,
    /// Bytes of planes a stripe holds at most (a stripe is one MCU row at least).
    stripe_bytes: usize,
}

/// What the stripes are decoded for: every block row kept in planes of the whole image (down
/// to the given rows of each component, or all of them), or each stripe's rows packed as it is
/// finished, in planes of one stripe.
enum Stripes<'p, 'b> {
    Whole(Option<&'p [u32]>),
    Packed(&'p mut RowsPacker<'b>),
}

/// Bytes of planes in a stripe: well within a core's L2 cache, with the scans' data beside it.
const STRIPE_BYTES: usize = 256 * 1024;

/// What [`ProgressiveDecoder::decode_packed`] holds at most for `window` of an image of
/// `layout` from a file of `file_bytes`: one stripe of planes (2 bytes a coefficient and a mask
/// word a block, each component padded to whole MCUs: at most 3 blocks more each way; 256 KB, or
/// one MCU row where that is larger, or the whole image where that is smaller), the scans'
/// destuffed data (no more than the file) and the packed sections
/// ([`packed_bound`](super::pack::packed_bound)), those of the components after the first twice
/// (in buffers of their own, then appended to the first's).
pub fn packed_decode_bytes(layout: &Layout, window: &Window, file_bytes: usize) -> u64 {
    let block_bytes = 64 * 2 + 8;
    let padded = |blocks: u32| u64::from(blocks) + 3;
    let (mut mcu_row, mut whole) = (0, 0);
    for c in &layout.components {
        mcu_row += padded(c.blocks_wide) * u64::from(c.v_samp.max(1)) * block_bytes;
        whole += padded(c.blocks_wide) * padded(c.blocks_high) * block_bytes;
    }
    let stripe = mcu_row.max(STRIPE_BYTES as u64).min(whole);
    let packed = super::pack::packed_bound(layout, window) as u64;
    let later: u64 = (1..layout.components.len())
        .map(|c| super::pack::section_bound(layout, window, c) as u64)
        .sum();
    stripe + file_bytes as u64 + packed + later
}

/// The coefficients of the last image decoded, lent from the decoder.
#[derive(Debug)]
pub struct ProgressiveCoefficients<'d> {
    decoder: &'d ProgressiveDecoder,
}

impl CoefficientSource for ProgressiveCoefficients<'_> {
    fn quant_table(&self, component: usize) -> Option<&[u16; 64]> {
        self.decoder.quant.get(component)
    }

    fn block_row(&self, component: usize, row: u32) -> Option<&[i16]> {
        self.decoder.planes.get(component)?.row(row as usize)
    }
}

/// A scan's header, checked.
#[derive(Debug)]
struct Scan {
    /// Its components' indices in the frame, in the frame's order, with their DC and AC table
    /// slots.
    components: Vec<(usize, usize, usize)>,
    ss: usize,
    se: usize,
    ah: u32,
    al: u32,
}

/// A scan read from the file, ready to decode: its header, its tables and intervals, and how
/// far its decoding has gone.
#[derive(Debug)]
struct ScanPlan {
    scan: Scan,
    /// Where its Huffman tables start in the decoder's `tables`.
    tables: usize,
    /// Its intervals in the decoder's `intervals`.
    intervals: std::ops::Range<usize>,
    /// The blocks of an MCU of an interleaved scan: (component's index in the scan, column, row
    /// inside the MCU); empty for a scan of one component.
    mcu_blocks: Vec<(usize, usize, usize)>,
    /// MCUs (a scan of several components) or blocks (of one) it codes.
    units: usize,
    progress: ScanProgress,
}

/// Where a scan's decoding stopped: the next MCU or block, the interval it is in and the state
/// of that interval's decoding.
#[derive(Debug, Default, Clone, Copy)]
struct ScanProgress {
    next: usize,
    interval: usize,
    bits: BitsState,
    eobrun: u32,
    predictors: [i32; 4],
}

impl Default for ProgressiveDecoder {
    fn default() -> ProgressiveDecoder {
        ProgressiveDecoder {
            planes: Vec::new(),
            quant: Vec::new(),
            data: Vec::new(),
            intervals: Vec::new(),
            tables: Vec::new(),
            scans: Vec::new(),
            later_sections: Vec::new(),
            stripe_bytes: STRIPE_BYTES,
        }
    }
}

impl ProgressiveDecoder {
    /// A decoder with no memory yet.
    pub fn new() -> ProgressiveDecoder {
        ProgressiveDecoder::default()
    }

    /// Bytes the decoder holds: its planes, scan data and tables, as they have grown.
    pub fn memory_bytes(&self) -> usize {
        let planes: usize = self
            .planes
            .iter()
            .map(|p| p.coefficients.capacity() * 2 + p.nonzero.capacity() * 8)
            .sum();
        planes
            + self.data.capacity()
            + self.intervals.capacity() * std::mem::size_of::<Interval>()
            + self.tables.capacity() * 4
            + self.quant.capacity() * std::mem::size_of::<[u16; 64]>()
            + self.scans.capacity() * std::mem::size_of::<ScanPlan>()
            + self.later_sections.iter().map(Vec::capacity).sum::<usize>()
    }

    /// Frees what the decoder holds; the next image allocates afresh.
    pub fn release_memory(&mut self) {
        *self = ProgressiveDecoder {
            stripe_bytes: self.stripe_bytes,
            ..ProgressiveDecoder::default()
        };
    }

    /// A decoder whose stripes hold at most `bytes` of planes (one MCU row at least).
    #[cfg(test)]
    pub(super) fn with_stripe_bytes(bytes: usize) -> ProgressiveDecoder {
        ProgressiveDecoder {
            stripe_bytes: bytes,
            ..ProgressiveDecoder::default()
        }
    }

    /// Entropy-decodes `jpeg`, a progressive JPEG, into its coefficients, or says why libjpeg-
    /// turbo must read it.
    pub fn decode(&mut self, jpeg: &[u8]) -> Result<ProgressiveCoefficients<'_>, Error> {
        self.decode_top(jpeg, None)
    }

    /// [`ProgressiveDecoder::decode`], with `block_rows` the block rows of each component (in
    /// the frame's order) that must be decoded: every scan stops after the stripe that holds
    /// them, the rest of its data is left unread and the blocks below are zero. What a resize
    /// reading only the image's upper rows needs (the file is still read whole for its markers,
    /// and a scan's data must hold the blocks decoded). `None`: every block row.
    pub fn decode_top(
        &mut self,
        jpeg: &[u8],
        block_rows: Option<&[u32]>,
    ) -> Result<ProgressiveCoefficients<'_>, Error> {
        let components = self.read_scans(jpeg)?;
        self.decode_stripes(&components, Stripes::Whole(block_rows))?;
        Ok(ProgressiveCoefficients { decoder: self })
    }

    /// Entropy-decodes `jpeg`, a progressive JPEG of `layout` (libjpeg-turbo's reading of its
    /// header), and packs the blocks `window` needs at the end of `out` as
    /// [`pack`](super::pack::pack) would pack them from [`ProgressiveDecoder::decode`]'s
    /// coefficients, byte for byte; or says why libjpeg-turbo must read it. Each stripe of
    /// block rows is packed as soon as every scan has decoded it, while it is in the core's
    /// cache: the decoder holds one stripe of planes, never the whole image's (3.7 MB a
    /// megapixel), and stops after the stripe holding the window's last row. On an error `out`
    /// is left as it was.
    pub fn decode_packed(
        &mut self,
        jpeg: &[u8],
        layout: &Layout,
        window: &Window,
        out: &mut Vec<u8>,
    ) -> Result<PackedImage, Error> {
        let components = self.read_scans(jpeg)?;
        if layout.components.len() != components.len() {
            return Err(unsupported(format!(
                "a layout of {} components for a frame of {}",
                layout.components.len(),
                components.len()
            )));
        }
        let mut later = std::mem::take(&mut self.later_sections);
        let start = out.len();
        let packed = RowsPacker::begin(layout, window, &self.quant, out, &mut later).and_then(
            |mut packer| {
                self.decode_stripes(&components, Stripes::Packed(&mut packer))?;
                packer.finish()
            },
        );
        self.later_sections = later;
        if packed.is_err() {
            out.truncate(start);
        }
        packed
    }

    /// Reads the file's frame and every scan (headers, tables, destuffed data) and checks its
    /// progression; nothing is decoded yet. Returns the frame's components.
    fn read_scans(&mut self, jpeg: &[u8]) -> Result<Vec<FrameComponent>, Error> {
        let mut cur = Cursor::start(jpeg)?;
        let mut tables = Tables::default();
        let mut frame: Option<Vec<FrameComponent>> = None;
        let mut latched: Vec<Option<[u16; 64]>> = Vec::new();
        // Per component, the point transform of each coefficient's last scan (-1: none yet).
        let mut coef_bits: Vec<[i8; 64]> = Vec::new();
        let mut restart = 0u32;
        self.scans.clear();
        self.data.clear();
        // The scans' data, destuffed, is no longer than the file: no growth past it.
        self.data.reserve_exact(jpeg.len());
        self.intervals.clear();
        self.tables.clear();
        loop {
            match cur.marker()? {
                0xC2 => {
                    if frame.is_some() {
                        return Err(unsupported("two frame headers"));
                    }
                    let (width, height, components) = parse_frame(&mut cur.segment()?)?;
                    self.frame(width, height, &components)?;
                    latched = vec![None; components.len()];
                    coef_bits = vec![[-1; 64]; components.len()];
                    frame = Some(components);
                }
                0xC0 | 0xC1 => return Err(unsupported("not a progressive JPEG")),
                0xC3 | 0xC5..=0xC7 | 0xC9..=0xCB | 0xCD..=0xCF => {
                    return Err(unsupported("not a progressive Huffman JPEG"))
                }
                0xC4 => parse_dht(&mut cur.segment()?, &mut tables.dc, &mut tables.ac)?,
                0xDB => parse_dqt(&mut cur.segment()?, &mut tables.quant)?,
                0xDD => restart = parse_dri(&mut cur.segment()?)?,
                0xDA => {
                    let components = frame
                        .as_deref()
                        .ok_or_else(|| unsupported("a scan before the frame header"))?;
                    if self.scans.len() >= MAX_SCANS as usize {
                        return Err(unsupported(format!("more than {MAX_SCANS} scans")));
                    }
                    let scan = parse_scan(&mut cur.segment()?, components)?;
                    check_progression(&scan, &mut coef_bits)?;
                    for &(c, _, _) in &scan.components {
                        if latched[c].is_none() {
                            let slot = components[c].tq;
                            latched[c] = Some(tables.quant[slot].ok_or_else(|| {
                                unsupported(format!("quantization table {slot} missing"))
                            })?);
                        }
                    }
                    let first_table = self.tables.len();
                    self.tables(&scan, &tables)?;
                    let mcu_blocks = mcu_blocks(&scan, components)?;
                    let rest = jpeg.get(cur.at..).unwrap_or(&[]);
                    let units = self.units(&scan, components);
                    let per_interval = if restart == 0 { units } else { restart };
                    let first_interval = self.intervals.len();
                    let end = destuff_scan(
                        rest,
                        units,
                        per_interval,
                        &mut self.data,
                        &mut self.intervals,
                    )?;
                    self.scans.push(ScanPlan {
                        scan,
                        tables: first_table,
                        intervals: first_interval..self.intervals.len(),
                        mcu_blocks,
                        units: units as usize,
                        progress: ScanProgress {
                            interval: first_interval,
                            ..ScanProgress::default()
                        },
                    });
                    match end {
                        ScanEnd::Marker { at, .. } => cur.at += at,
                        ScanEnd::EndOfFile => {
                            return Err(unsupported("the file ends before its EOI marker"))
                        }
                    }
                }
                0xD9 => break,
                0xD8 => return Err(unsupported("a second SOI marker")),
                0xDC => return Err(unsupported("a DNL marker")),
                0xD0..=0xD7 | 0x01 => return Err(unsupported("a restart marker outside a scan")),
                _ => {
                    cur.segment()?;
                }
            }
        }
        let components = frame.ok_or_else(|| unsupported("no frame header"))?;
        // libjpeg smooths the blocks of a file whose coefficients are not all complete; one
        // where every coefficient's last scan had a point transform of 0 decodes as they are.
        if coef_bits.iter().any(|bits| bits.iter().any(|&b| b != 0)) {
            return Err(unsupported(
                "coefficients left incomplete (libjpeg would smooth the blocks)",
            ));
        }
        self.quant.clear();
        for table in latched {
            self.quant
                .push(table.ok_or_else(|| unsupported("a component no scan codes"))?);
        }
        Ok(components)
    }

    /// Sizes the planes' blocks for the frame (their memory is held and zeroed stripe by stripe
    /// as it is decoded); a frame of more than [`DEFAULT_MAX_PIXELS`](crate::DEFAULT_MAX_PIXELS) pixels
    /// is refused before anything is allocated.
    fn frame(
        &mut self,
        width: u32,
        height: u32,
        components: &[FrameComponent],
    ) -> Result<(), Error> {
        if u64::from(width) * u64::from(height) > crate::DEFAULT_MAX_PIXELS {
            return Err(unsupported(format!(
                "a {width}x{height} image, over {} pixels",
                crate::DEFAULT_MAX_PIXELS
            )));
        }
        let hmax = components.iter().map(|c| c.h).max().unwrap_or(1);
        let vmax = components.iter().map(|c| c.v).max().unwrap_or(1);
        let mcus_wide = width.div_ceil(8 * hmax) as usize;
        let mcus_high = height.div_ceil(8 * vmax) as usize;
        self.planes.resize_with(components.len(), Plane::default);
        for (plane, c) in self.planes.iter_mut().zip(components) {
            plane.coded_wide = (width * c.h).div_ceil(hmax).div_ceil(8) as usize;
            plane.coded_high = (height * c.v).div_ceil(vmax).div_ceil(8) as usize;
            (plane.blocks_wide, plane.blocks_high) = match components.len() {
                1 => (plane.coded_wide, plane.coded_high),
                _ => (mcus_wide * c.h as usize, mcus_high * c.v as usize),
            };
            plane
                .blocks_wide
                .checked_mul(plane.blocks_high)
                .and_then(|b| b.checked_mul(64))
                .ok_or_else(|| unsupported("an image too large"))?;
        }
        Ok(())
    }

    /// Appends the scan's Huffman tables in lookup form to `self.tables`: per scan component,
    /// its DC table (DC first scans) or its AC table (AC scans), [`TABLE_WORDS`] words each.
    fn tables(&mut self, scan: &Scan, tables: &Tables) -> Result<(), Error> {
        if scan.ss == 0 && scan.ah != 0 {
            return Ok(());
        }
        for &(_, td, ta) in &scan.components {
            let (table, is_dc, slot) = match scan.ss {
                0 => (&tables.dc[td], true, td),
                _ => (&tables.ac[ta], false, ta),
            };
            let table = table
                .as_ref()
                .ok_or_else(|| unsupported(format!("Huffman table {slot} missing")))?;
            derive_table(table, is_dc, LOOKUP_BITS, &mut self.tables)?;
        }
        Ok(())
    }

    /// MCUs the scan codes: the frame's MCUs for several components, the component's blocks
    /// for one.
    fn units(&self, scan: &Scan, components: &[FrameComponent]) -> u32 {
        match scan.components.as_slice() {
            [(c, _, _)] => {
                let plane = &self.planes[*c];
                (plane.coded_wide * plane.coded_high) as u32
            }
            _ => {
                let (wide, high) = self.mcus_across(components);
                (wide * high) as u32
            }
        }
    }

    /// The frame's MCUs across and down (its planes are a whole number of them).
    fn mcus_across(&self, components: &[FrameComponent]) -> (usize, usize) {
        let plane = &self.planes[0];
        let (h, v) = (components[0].h as usize, components[0].v as usize);
        (plane.blocks_wide / h, plane.blocks_high / v)
    }

    /// Block rows of component `c` in one MCU row (a frame of one component has one block an
    /// MCU, whatever its sampling factors say).
    fn rows_per_mcu_row(components: &[FrameComponent], c: usize) -> usize {
        match components.len() {
            1 => 1,
            _ => components[c].v as usize,
        }
    }

    /// Decodes the scans read by [`ProgressiveDecoder::read_scans`], stripe by stripe: for
    /// each stripe of MCU rows, its planes' memory zeroed, then every scan in the file's order
    /// over the stripe's MCUs or blocks, then (packing) the stripe's rows packed; up to the
    /// stripe holding the rows wanted.
    fn decode_stripes(
        &mut self,
        components: &[FrameComponent],
        stripes: Stripes<'_, '_>,
    ) -> Result<(), Error> {
        // The scans and their data lent out while the planes are written.
        let mut scans = std::mem::take(&mut self.scans);
        let data = std::mem::take(&mut self.data);
        let intervals = std::mem::take(&mut self.intervals);
        let result =
            self.decode_scans_in_stripes(&mut scans, &data, &intervals, components, stripes);
        self.scans = scans;
        self.data = data;
        self.intervals = intervals;
        result
    }

    /// [`ProgressiveDecoder::decode_stripes`] with the scans, their data and intervals lent.
    fn decode_scans_in_stripes(
        &mut self,
        scans: &mut [ScanPlan],
        data: &[u8],
        intervals: &[Interval],
        components: &[FrameComponent],
        mut stripes: Stripes<'_, '_>,
    ) -> Result<(), Error> {
        let all_rows = match components.len() {
            1 => self.planes[0].blocks_high,
            _ => self.mcus_across(components).1,
        };
        // Component `c`'s block rows wanted, if not all.
        let wanted = |c: usize| match &stripes {
            Stripes::Whole(rows) => {
                rows.map(|rows| rows.get(c).map_or(usize::MAX, |&r| r as usize))
            }
            Stripes::Packed(packer) => Some(packer.rows(c).end as usize),
        };
        // The MCU rows holding every component's wanted block rows.
        let mcu_rows = (0..components.len())
            .map(|c| match wanted(c) {
                Some(rows) => rows.div_ceil(Self::rows_per_mcu_row(components, c)),
                None => all_rows,
            })
            .max()
            .unwrap_or(all_rows)
            .min(all_rows);
        let row_bytes: usize = (0..components.len())
            .map(|c| {
                let plane = &self.planes[c];
                plane.blocks_wide * Self::rows_per_mcu_row(components, c) * (64 * 2 + 8)
            })
            .sum();
        let stripe_rows = (self.stripe_bytes / row_bytes.max(1)).max(1);
        let packing = matches!(stripes, Stripes::Packed(_));
        for (c, plane) in self.planes.iter_mut().enumerate() {
            let per = Self::rows_per_mcu_row(components, c);
            let held = match packing {
                true => (stripe_rows * per).min(plane.blocks_high),
                false => plane.blocks_high,
            };
            plane.hold(held);
        }
        let mut first_row = 0;
        while first_row < mcu_rows {
            let end_row = (first_row + stripe_rows).min(mcu_rows);
            for (c, plane) in self.planes.iter_mut().enumerate() {
                let per = Self::rows_per_mcu_row(components, c);
                if packing {
                    plane.first_row = first_row * per;
                }
                plane.zero_rows(first_row * per..end_row * per);
            }
            for plan in scans.iter_mut() {
                let until = match plan.scan.components.as_slice() {
                    [(c, _, _)] => {
                        let plane = &self.planes[*c];
                        let rows = end_row * Self::rows_per_mcu_row(components, *c);
                        rows.min(plane.coded_high) * plane.coded_wide
                    }
                    _ => end_row * self.mcus_across(components).0,
                };
                self.decode_until(plan, until, components, data, intervals)?;
            }
            if let Stripes::Packed(packer) = &mut stripes {
                for (c, plane) in self.planes.iter().enumerate() {
                    let per = Self::rows_per_mcu_row(components, c);
                    for by in first_row * per..(end_row * per).min(plane.blocks_high) {
                        let row = plane
                            .row(by)
                            .ok_or_else(|| unsupported("a block row outside its stripe"))?;
                        packer.offer(c, by as u32, row)?;
                    }
                }
            }
            first_row = end_row;
        }
        if first_row < all_rows && !packing {
            // Stopped early: the blocks below are zero, not an earlier image's.
            for (c, plane) in self.planes.iter_mut().enumerate() {
                let per = Self::rows_per_mcu_row(components, c);
                plane.zero_rows(first_row * per..plane.blocks_high);
            }
        }
        // Every scan decoded as far as asked (to its end unless stopped early): the data of the
        // interval it stopped in must have held what it decoded.
        scans.iter().try_for_each(|plan| {
            if first_row == all_rows && plan.progress.next != plan.units {
                return Err(unsupported("a scan not decoded to its end"));
            }
            interval_bits(data, intervals, plan.progress.interval)?
                .resume(plan.progress.bits)
                .check()
        })
    }

    /// Decodes `plan`'s scan on from where it stopped, up to MCU or block `until` of it,
    /// crossing into its next restart intervals as it reaches them.
    fn decode_until(
        &mut self,
        plan: &mut ScanPlan,
        until: usize,
        components: &[FrameComponent],
        data: &[u8],
        intervals: &[Interval],
    ) -> Result<(), Error> {
        let until = until.min(plan.units);
        while plan.progress.next < until {
            let interval = intervals
                .get(plan.progress.interval)
                .filter(|_| plan.intervals.contains(&plan.progress.interval))
                .ok_or_else(|| unsupported("a scan past its last interval"))?;
            let interval_end = (interval.first_mcu + interval.mcus) as usize;
            if plan.progress.next >= interval_end {
                // The interval is done: its data must have held it; the next one starts afresh.
                interval_bits(data, intervals, plan.progress.interval)?
                    .resume(plan.progress.bits)
                    .check()?;
                plan.progress = ScanProgress {
                    next: plan.progress.next,
                    interval: plan.progress.interval + 1,
                    ..ScanProgress::default()
                };
                continue;
            }
            let stop = until.min(interval_end);
            let mut bits =
                interval_bits(data, intervals, plan.progress.interval)?.resume(plan.progress.bits);
            let units = plan.progress.next..stop;
            let progress = &mut plan.progress;
            let scan = &plan.scan;
            let tables = self
                .tables
                .get(plan.tables..)
                .ok_or_else(|| unsupported("a scan's tables missing"))?;
            let mcus_wide = self.mcus_across(components).0;
            let planes = &mut self.planes;
            match (scan.ss, scan.ah, plan.mcu_blocks.is_empty()) {
                (0, _, false) => dc_interleaved(
                    scan,
                    &McuLayout {
                        components,
                        mcus_wide,
                        blocks: &plan.mcu_blocks,
                        tables,
                    },
                    planes,
                    units,
                    &mut bits,
                    &mut progress.predictors,
                ),
                (0, _, true) => dc_single(
                    scan,
                    tables,
                    &mut planes[scan.components[0].0],
                    units,
                    &mut bits,
                    &mut progress.predictors[0],
                ),
                (_, 0, _) => ac_first(
                    scan,
                    ac_table(tables)?,
                    &mut planes[scan.components[0].0],
                    units,
                    &mut bits,
                    &mut progress.eobrun,
                ),
                _ => ac_refine(
                    scan,
                    ac_table(tables)?,
                    &mut planes[scan.components[0].0],
                    units,
                    &mut bits,
                    &mut progress.eobrun,
                ),
            }?;
            progress.bits = bits.state();
            progress.next = stop;
        }
        Ok(())
    }
}

/// The blocks of an MCU of `scan` if it has several components (at most libjpeg's
/// [`MAX_BLOCKS_IN_MCU`]), else none: (component's index in the scan, column, row inside the MCU).
fn mcu_blocks(
    scan: &Scan,
    components: &[FrameComponent],
) -> Result<Vec<(usize, usize, usize)>, Error> {
    let mut blocks = Vec::new();
    if scan.components.len() > 1 {
        for (i, &(c, _, _)) in scan.components.iter().enumerate() {
            let fc = components[c];
            for y in 0..fc.v as usize {
                for x in 0..fc.h as usize {
                    blocks.push((i, x, y));
                }
            }
        }
        if blocks.len() > MAX_BLOCKS_IN_MCU {
            return Err(unsupported(format!(
                "{} blocks in an MCU (libjpeg takes at most {MAX_BLOCKS_IN_MCU})",
                blocks.len()
            )));
        }
    }
    Ok(blocks)
}

/// An AC scan's Huffman table, the first of its tables.
fn ac_table(tables: &[u32]) -> Result<&[u32], Error> {
    tables
        .get(..TABLE_WORDS)
        .ok_or_else(|| unsupported("no AC table"))
}

/// A reader of interval `index`'s data, from its start.
fn interval_bits<'a>(
    data: &'a [u8],
    intervals: &[Interval],
    index: usize,
) -> Result<Bits<'a>, Error> {
    intervals
        .get(index)
        .and_then(|interval| data.get(interval.start as usize..interval.end as usize))
        .map(Bits::new)
        .ok_or_else(|| unsupported("an interval outside its scan"))
}

/// What a DC scan of several components needs to find its blocks: the frame's components and
/// MCUs across, the blocks of an MCU and the scan's DC tables.
struct McuLayout<'a> {
    components: &'a [FrameComponent],
    mcus_wide: usize,
    blocks: &'a [(usize, usize, usize)],
    tables: &'a [u32],
}

/// A DC scan of several components: MCU by MCU, every block of every component in it.
fn dc_interleaved(
    scan: &Scan,
    layout: &McuLayout<'_>,
    planes: &mut [Plane],
    mcus: std::ops::Range<usize>,
    bits: &mut Bits<'_>,
    predictors: &mut [i32; 4],
) -> Result<(), Error> {
    for mcu in mcus {
        let (mx, my) = (mcu % layout.mcus_wide, mcu / layout.mcus_wide);
        for &(i, x, y) in layout.blocks {
            let c = scan.components[i].0;
            let fc = layout.components[c];
            let plane = &mut planes[c];
            let bx = mx * fc.h as usize + x;
            let by = my * fc.v as usize + y;
            let at = plane
                .row_at(by)
                .ok_or_else(|| unsupported("a block outside its plane"))?
                + bx * 64;
            let table = layout.tables.get(i * TABLE_WORDS..(i + 1) * TABLE_WORDS);
            dc_block(scan, table, &mut predictors[i], plane, at, bits)?;
        }
    }
    Ok(())
}

/// A DC scan of one component: its blocks in rows of `width_in_blocks`.
///
/// The scan decoders take the plane, the reader and their state as parameters of their own, not
/// gathered in a struct: a reference that is a parameter tells the compiler nothing else points
/// where it does, so the reader's buffer stays in registers across the planes' stores (gathered,
/// the decoder was 3-5% slower).
fn dc_single(
    scan: &Scan,
    tables: &[u32],
    plane: &mut Plane,
    blocks: std::ops::Range<usize>,
    bits: &mut Bits<'_>,
    predictor: &mut i32,
) -> Result<(), Error> {
    let table = tables.get(..TABLE_WORDS);
    let mut walk = BlockWalk::new(plane, blocks.start);
    for _ in blocks {
        let at = walk.next();
        dc_block(scan, table, predictor, plane, at, bits)?;
    }
    Ok(())
}

/// An AC first scan: `decode_mcu_AC_first` over `blocks`.
fn ac_first(
    scan: &Scan,
    table: &[u32],
    plane: &mut Plane,
    blocks: std::ops::Range<usize>,
    bits: &mut Bits<'_>,
    eobrun: &mut u32,
) -> Result<(), Error> {
    let (ss, se, al) = (scan.ss, scan.se, scan.al);
    let mut walk = BlockWalk::new(plane, blocks.start);
    for _ in blocks {
        let at = walk.next();
        if *eobrun > 0 {
            *eobrun -= 1;
            continue;
        }
        let (coefficients, nonzero) = block_mut(plane, at)?;
        let mut k = ss;
        while k <= se {
            let symbol = bits.huffman(table)?;
            let (r, s) = (u32::from(symbol >> 4), u32::from(symbol & 15));
            if s != 0 {
                k += r as usize;
                if k > se {
                    return Err(unsupported("a run past the end of the band"));
                }
                let value = (extend(bits.take(s), s) << al) as i16;
                coefficients[usize::from(NATURAL_ORDER[k])] = value;
                *nonzero |= u64::from(value != 0) << k;
            } else if r == 15 {
                k += 15;
            } else {
                *eobrun = (1 << r) + bits.take(r) - 1;
                break;
            }
            k += 1;
        }
    }
    Ok(())
}

/// An AC refinement scan: `decode_mcu_AC_refine` over `blocks`. Most of a progressive photo's
/// decoding time is spent here, finding where each new coefficient goes: with BMI2's bit
/// deposit where the CPU has a fast one ([`fast_bit_deposit`]; 1.2x faster on the refinement
/// scans), else one bit at a time.
fn ac_refine(
    scan: &Scan,
    table: &[u32],
    plane: &mut Plane,
    blocks: std::ops::Range<usize>,
    bits: &mut Bits<'_>,
    eobrun: &mut u32,
) -> Result<(), Error> {
    #[cfg(target_arch = "x86_64")]
    if fast_bit_deposit() {
        // SAFETY: the CPU has BMI1, BMI2 and POPCNT (checked by `fast_bit_deposit`).
        #[allow(unsafe_code)]
        return unsafe { ac_refine_deposit(scan, table, plane, blocks, bits, eobrun) };
    }
    refine_blocks::<false>(scan, table, plane, blocks, bits, eobrun)
}

/// [`ac_refine`] compiled for BMI2, its bit deposit finding the new coefficients' places, with
/// the population count instruction (every CPU with BMI2 has it; without it, counting a block's
/// correction bits is a dozen instructions).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "bmi1,bmi2,popcnt")]
fn ac_refine_deposit(
    scan: &Scan,
    table: &[u32],
    plane: &mut Plane,
    blocks: std::ops::Range<usize>,
    bits: &mut Bits<'_>,
    eobrun: &mut u32,
) -> Result<(), Error> {
    refine_blocks::<true>(scan, table, plane, blocks, bits, eobrun)
}

/// Whether the CPU has BMI2 and its bit deposit (`pdep`) takes a few cycles: every x86-64 CPU
/// with BMI2 but AMD's before Zen 3 (family 0x19), which run it in microcode, tens to hundreds
/// of cycles a call.
#[cfg(target_arch = "x86_64")]
fn fast_bit_deposit() -> bool {
    static FAST: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *FAST.get_or_init(|| {
        use std::arch::x86_64::__cpuid;
        if !std::is_x86_feature_detected!("bmi2")
            || !std::is_x86_feature_detected!("bmi1")
            || !std::is_x86_feature_detected!("popcnt")
        {
            return false;
        }
        let vendor = __cpuid(0);
        let amd = (vendor.ebx, vendor.edx, vendor.ecx) == (0x6874_7541, 0x6974_6E65, 0x444D_4163);
        let signature = __cpuid(1).eax;
        let family = ((signature >> 8) & 0xF) + ((signature >> 20) & 0xFF);
        !amd || family >= 0x19
    })
}

/// The body of [`ac_refine`]: with `DEPOSIT`, inlined into [`ac_refine_deposit`] and its bit
/// deposit used.
#[inline(always)]
fn refine_blocks<const DEPOSIT: bool>(
    scan: &Scan,
    table: &[u32],
    plane: &mut Plane,
    blocks: std::ops::Range<usize>,
    bits: &mut Bits<'_>,
    eobrun: &mut u32,
) -> Result<(), Error> {
    let (ss, se) = (scan.ss, scan.se);
    let p1 = (1i32 << scan.al) as i16;
    let m1 = ((-1i32) << scan.al) as i16;
    let mut walk = BlockWalk::new(plane, blocks.start);
    for _ in blocks {
        let at = walk.next();
        let (coefficients, nonzero) = block_mut(plane, at)?;
        let mut k = ss;
        if *eobrun == 0 {
            while k <= se {
                let symbol = bits.huffman(table)?;
                let (r, s) = (u32::from(symbol >> 4), symbol & 15);
                let mut value = 0i16;
                if s != 0 {
                    if s != 1 {
                        return Err(unsupported("a refined coefficient of more than 1 bit"));
                    }
                    value = if bits.take(1) != 0 { p1 } else { m1 };
                } else if r != 15 {
                    *eobrun = (1 << r) + bits.take(r);
                    break;
                }
                // Past the nonzero coefficients (a correction bit each) and `r` zero ones,
                // to the zero coefficient the new value goes to.
                let zeros = !*nonzero & band(k, se);
                match nth_bit::<DEPOSIT>(zeros, r) {
                    Some(target) => {
                        let passed = match target > k {
                            true => *nonzero & band(k, target - 1),
                            false => 0,
                        };
                        correct_all(coefficients, passed, bits, p1, m1);
                        k = target;
                        if value != 0 {
                            coefficients[usize::from(NATURAL_ORDER[k])] = value;
                            *nonzero |= 1 << k;
                        }
                    }
                    None => {
                        correct_all(coefficients, *nonzero & band(k, se), bits, p1, m1);
                        if value != 0 {
                            return Err(unsupported("a new coefficient past the end of the band"));
                        }
                        k = se + 1;
                    }
                }
                k += 1;
            }
        }
        if *eobrun > 0 {
            // A correction bit for each nonzero coefficient left in the band.
            if k <= se {
                correct_all(coefficients, *nonzero & band(k, se), bits, p1, m1);
            }
            *eobrun -= 1;
        }
    }
    Ok(())
}

/// Block `at` (its first coefficient's index) of `plane`: its coefficients and its nonzero mask.
fn block_mut(plane: &mut Plane, at: usize) -> Result<(&mut [i16], &mut u64), Error> {
    let coefficients = plane.coefficients.get_mut(at..at + 64);
    let nonzero = plane.nonzero.get_mut(at / 64);
    coefficients
        .zip(nonzero)
        .ok_or_else(|| unsupported("a block outside its plane"))
}

/// Bits `from..=to` (zigzag positions) of a nonzero mask.
fn band(from: usize, to: usize) -> u64 {
    (u64::MAX >> (63 - to)) & (u64::MAX << from)
}

/// The blocks of a non-interleaved scan (rows of `width_in_blocks`) from a given one on: where
/// each is in its plane (its first coefficient's index), one addition a block.
struct BlockWalk {
    /// The next block's first coefficient.
    at: usize,
    /// Its column in the scan's rows.
    column: usize,
    /// The scan's blocks in a row...
    wide: usize,
    /// ...and the coefficients of the plane's padding blocks past them.
    padding: usize,
}

impl BlockWalk {
    /// From block `first` of the scan on.
    fn new(plane: &Plane, first: usize) -> BlockWalk {
        let wide = plane.coded_wide.max(1);
        let row = (first / wide).saturating_sub(plane.first_row);
        BlockWalk {
            at: (row * plane.blocks_wide + first % wide) * 64,
            column: first % wide,
            wide,
            padding: plane.blocks_wide.saturating_sub(wide) * 64,
        }
    }

    /// The next block's first coefficient.
    #[inline(always)]
    fn next(&mut self) -> usize {
        let at = self.at;
        self.at += 64;
        self.column += 1;
        if self.column == self.wide {
            self.column = 0;
            self.at += self.padding;
        }
        at
    }
}

/// One block of a DC scan: the first scan's difference summed into `predictor` and shifted, or a
/// refinement bit.
#[inline(always)]
fn dc_block(
    scan: &Scan,
    table: Option<&[u32]>,
    predictor: &mut i32,
    plane: &mut Plane,
    at: usize,
    bits: &mut Bits<'_>,
) -> Result<(), Error> {
    let coefficient = plane
        .coefficients
        .get_mut(at)
        .ok_or_else(|| unsupported("a block outside its plane"))?;
    if scan.ah != 0 {
        if bits.take(1) != 0 {
            *coefficient |= (1i32 << scan.al) as i16;
        }
        return Ok(());
    }
    let table = table.ok_or_else(|| unsupported("no DC table"))?;
    let s = u32::from(bits.huffman(table)?);
    let difference = match s {
        0 => 0,
        s => extend(bits.take(s), s),
    };
    *predictor = predictor
        .checked_add(difference)
        .ok_or_else(|| unsupported("a DC coefficient out of range"))?;
    *coefficient = ((*predictor as u32) << scan.al) as i16;
    Ok(())
}

/// `HUFF_EXTEND`: the `s`-bit value `r` as a signed number.
fn extend(r: u32, s: u32) -> i32 {
    if s == 0 {
        return 0;
    }
    if r < 1 << (s - 1) {
        r as i32 - (1 << s) + 1
    } else {
        r as i32
    }
}

/// A correction bit for each coefficient of `positions` (zigzag bits, all nonzero ones), in
/// order, read at most 16 at once: a 1 makes the coefficient's magnitude larger by `p1`, unless
/// that bit is set already. Without branches on the bits, which are close to random.
#[inline(always)]
fn correct_all(
    coefficients: &mut [i16],
    mut positions: u64,
    bits: &mut Bits<'_>,
    p1: i16,
    m1: i16,
) {
    while positions != 0 {
        let n = positions.count_ones().min(16);
        let word = bits.take(n);
        for i in (0..n).rev() {
            let at = positions.trailing_zeros() as usize;
            positions &= positions - 1;
            let coefficient = &mut coefficients[usize::from(NATURAL_ORDER[at])];
            let grow = ((word >> i) & 1) as i16 & i16::from(*coefficient & p1 == 0);
            let step = if *coefficient >= 0 { p1 } else { m1 };
            *coefficient = coefficient.wrapping_add(grow.wrapping_mul(step));
        }
    }
}

/// The position of `mask`'s set bit number `n` (from 0, lowest first, `n` below 64), if it has
/// that many: with `DEPOSIT`, one bit deposit (only inside [`ac_refine_deposit`]).
#[inline(always)]
fn nth_bit<const DEPOSIT: bool>(mut mask: u64, n: u32) -> Option<usize> {
    #[cfg(target_arch = "x86_64")]
    if DEPOSIT {
        // SAFETY: `DEPOSIT` is set only where the CPU has BMI2 (`ac_refine_deposit`, and the test
        // comparing the two searches).
        #[allow(unsafe_code)]
        let bit = unsafe { std::arch::x86_64::_pdep_u64(1 << n, mask) };
        return (bit != 0).then(|| bit.trailing_zeros() as usize);
    }
    for _ in 0..n {
        mask &= mask.wrapping_sub(1);
    }
    (mask != 0).then(|| mask.trailing_zeros() as usize)
}

/// The scan header after the SOS marker, checked as `jdmarker.c` `get_sos` checks it.
fn parse_scan(s: &mut Cursor<'_>, frame: &[FrameComponent]) -> Result<Scan, Error> {
    let n = usize::from(s.u8()?);
    if n == 0 || n > frame.len() {
        return Err(unsupported(format!("a scan of {n} components")));
    }
    let mut components: Vec<(usize, usize, usize)> = Vec::with_capacity(n);
    for _ in 0..n {
        let id = s.u8()?;
        let t = s.u8()?;
        let c = frame
            .iter()
            .position(|f| f.id == id)
            .ok_or_else(|| unsupported(format!("a scan of component {id}, not in the frame")))?;
        // Components in the frame's order, each once: libjpeg codes an MCU in the scan's order,
        // the planes are in the frame's.
        if components.last().is_some_and(|&(last, _, _)| last >= c) {
            return Err(unsupported(
                "a scan whose components are not in the frame's order",
            ));
        }
        let (td, ta) = (usize::from(t >> 4), usize::from(t & 15));
        if td > 3 || ta > 3 {
            return Err(unsupported(format!("Huffman table selectors {t:#04x}")));
        }
        components.push((c, td, ta));
    }
    let (ss, se, ahal) = (usize::from(s.u8()?), usize::from(s.u8()?), s.u8()?);
    if !s.done() {
        return Err(unsupported("a scan header of the wrong length"));
    }
    Ok(Scan {
        components,
        ss,
        se,
        ah: u32::from(ahal >> 4),
        al: u32::from(ahal & 15),
    })
}

/// `jdphuff.c` `start_pass_phuff_decoder`'s checks: a scan that libjpeg refuses or warns about is
/// refused here; otherwise each coefficient the scan codes records its point transform.
fn check_progression(scan: &Scan, coef_bits: &mut [[i8; 64]]) -> Result<(), Error> {
    let dc = scan.ss == 0;
    let bad = (dc && scan.se != 0)
        || (!dc && (scan.ss > scan.se || scan.se > 63 || scan.components.len() != 1))
        || (scan.ah != 0 && scan.al + 1 != scan.ah)
        || scan.al > 13;
    if bad {
        return Err(unsupported(format!(
            "a progression libjpeg refuses (Ss {}, Se {}, Ah {}, Al {})",
            scan.ss, scan.se, scan.ah, scan.al
        )));
    }
    for &(c, _, _) in &scan.components {
        let bits = &mut coef_bits[c];
        if !dc && bits[0] < 0 {
            return Err(unsupported("an AC scan before its component's DC"));
        }
        for bit in &mut bits[scan.ss..=scan.se] {
            if scan.ah != (*bit).max(0) as u32 {
                return Err(unsupported("a progression libjpeg warns about"));
            }
            *bit = scan.al as i8;
        }
    }
    Ok(())
}

/// A reader of an interval's destuffed data, most significant bit first, 64 bits buffered. Past
/// the data it reads zeros, and [`Bits::check`] then refuses the interval (libjpeg would warn).
struct Bits<'a> {
    data: &'a [u8],
    /// Next byte to load (past the data's end once zeros were loaded).
    at: usize,
    /// Bits buffered, from the top.
    buffer: u64,
    count: u32,
}

/// Where a [`Bits`] reader is in its data, to take it up again later.
#[derive(Debug, Default, Clone, Copy)]
struct BitsState {
    at: usize,
    buffer: u64,
    count: u32,
}

impl<'a> Bits<'a> {
    fn new(data: &'a [u8]) -> Bits<'a> {
        Bits {
            data,
            at: 0,
            buffer: 0,
            count: 0,
        }
    }

    /// The reader over the same data at `state`.
    fn resume(self, state: BitsState) -> Bits<'a> {
        Bits {
            data: self.data,
            at: state.at,
            buffer: state.buffer,
            count: state.count,
        }
    }

    /// Where the reader is.
    fn state(&self) -> BitsState {
        BitsState {
            at: self.at,
            buffer: self.buffer,
            count: self.count,
        }
    }

    /// Fills the buffer to at least 56 bits.
    #[inline(always)]
    fn refill(&mut self) {
        if let Some(bytes) = self.data.get(self.at..self.at + 8) {
            let mut word = [0u8; 8];
            word.copy_from_slice(bytes);
            self.buffer |= u64::from_be_bytes(word) >> self.count;
            let loaded = (63 - self.count) / 8;
            self.at += loaded as usize;
            self.count += loaded * 8;
        } else {
            while self.count <= 56 {
                let byte = self.data.get(self.at).copied().unwrap_or(0);
                self.buffer |= u64::from(byte) << (56 - self.count);
                self.at += 1;
                self.count += 8;
            }
        }
    }

    /// The next `n` bits (0 to 16) as a number.
    #[inline(always)]
    fn take(&mut self, n: u32) -> u32 {
        if n == 0 {
            return 0;
        }
        if self.count < n {
            self.refill();
        }
        let value = (self.buffer >> (64 - n)) as u32;
        self.buffer <<= n;
        self.count -= n;
        value
    }

    /// The next Huffman code's symbol in `table` (the kernels' lookup form).
    #[inline(always)]
    fn huffman(&mut self, table: &[u32]) -> Result<u8, Error> {
        if self.count < 16 {
            self.refill();
        }
        let bits = (self.buffer >> 32) as u32;
        let lookup_bits = LOOKUP_BITS;
        let entry = table[(bits >> (32 - lookup_bits)) as usize];
        if entry != 0 {
            let len = entry >> 8;
            self.buffer <<= len;
            self.count -= len;
            return Ok(entry as u8);
        }
        let maxcode = 1usize << lookup_bits;
        let valoffset = maxcode + 18;
        let symbols = valoffset + 18;
        for l in lookup_bits + 1..=16 {
            let code = (bits >> (32 - l)) as i32;
            if code <= table[maxcode + l as usize] as i32 {
                let index =
                    (table[valoffset + l as usize] as i32).wrapping_add(code) as usize & 255;
                self.buffer <<= l;
                self.count -= l;
                return Ok((table[symbols + index / 4] >> (8 * (index % 4))) as u8);
            }
        }
        Err(unsupported("a Huffman code no table holds"))
    }

    /// Refuses the interval if its decode read past its data.
    fn check(&self) -> Result<(), Error> {
        let read = self.at as u64 * 8 - u64::from(self.count);
        match read <= self.data.len() as u64 * 8 {
            true => Ok(()),
            false => Err(unsupported("a scan whose data ends before its last block")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bit deposit and the bit-by-bit search find the same bit, so the refinement scans decode
    /// alike on either (the tests of the decoder run on the one this CPU takes).
    #[test]
    fn the_bit_deposit_finds_the_bit_the_search_finds() {
        let mut masks = vec![0, 1, u64::MAX, 1 << 63, 0x8000_0000_0000_0001];
        masks.extend(
            gpufeed_bench::upload::random_bytes(8 * 4096, 9)
                .chunks(16)
                .map(|c| {
                    let word = |b: &[u8]| u64::from_le_bytes(b.try_into().expect("8 bytes"));
                    // Sparse and dense masks, like the zero coefficients of a band.
                    word(&c[..8]) & word(&c[8..]) >> (c[0] % 64)
                }),
        );
        let mut compared = 0;
        for mask in masks {
            for n in 0..64 {
                let searched = nth_bit::<false>(mask, n);
                #[cfg(target_arch = "x86_64")]
                if std::is_x86_feature_detected!("bmi2") {
                    assert_eq!(nth_bit::<true>(mask, n), searched, "{mask:#x}, bit {n}");
                    compared += 1;
                }
                let want = (0..64).filter(|b| mask >> b & 1 == 1).nth(n as usize);
                assert_eq!(searched, want, "{mask:#x}, bit {n}");
            }
        }
        #[cfg(target_arch = "x86_64")]
        if std::is_x86_feature_detected!("bmi2") {
            assert!(compared > 100_000, "{compared}");
        }
    }
}
