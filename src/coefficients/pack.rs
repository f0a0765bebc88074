//! The transfer format: a window's blocks packed for the trip across PCIe, written by the CPU
//! thread that entropy-decoded the image and expanded by the kernels (`kernels/idct.cu`,
//! `gf_expand`). Lossless: the kernels see exactly the coefficients libjpeg decoded.
//!
//! Most quantized coefficients are zero (measured: 80-92 % on camera-size photos at quality
//! 90), and the nonzero AC ones are small (fewer than 0.3 % of them outside -127..=127), so each
//! block is stored as
//!
//! - its DC coefficient, an `i16` (one array per component: `dc`);
//! - a 64-bit mask (`masks`): bit `k` (1 to 63) set when AC coefficient `k` (natural order) is
//!   not zero; bit 0 set when the block's AC values are stored as `i16`, else as `i8`;
//! - its nonzero AC values in natural order, 1 or 2 bytes each (`ac`, little-endian).
//!
//! A thread expands one block: it needs the offset of the block's values in `ac`, which is the
//! offset of its group of 32 blocks (`groups`, a `u32` each) plus the sizes of the blocks before
//! it in the group, popcounts of their masks.
//!
//! One image is, per component, in the window's block rectangle (rows, then columns):
//!
//! ```text
//! quant  [i16; 64]           the multiplier table (quantization table as shorts), natural order
//! dc     [i16; blocks]       padded to 8 bytes
//! masks  [u64; blocks]
//! groups [u32; ceil(blocks / 32)]
//! ac     [u8; ...]           padded to 8 bytes
//! ```
//!
//! Expected size (`benches/coefficients.rs` prints it for any folder): 0.5 MB a megapixel on
//! camera-size photos at quality 90 with sensor-like grain, 0.3 on smooth ones, 0.7 on the
//! published photos of `assets/` (4:4:4 among them); dense `i16` coefficients are 3.0-4.1.

use super::layout::{BlockRect, ComponentLayout, Conversion, Layout, Window};
use super::reference::multiplier_table;
use super::{CoefficientSource, Error};

/// Blocks per group (one `u32` offset each).
pub const GROUP: u32 = 32;

/// Bit 0 of a block's mask: its AC values are `i16`.
pub const WIDE: u64 = 1;

/// One component of a packed image: what its kernels read and write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PackedComponent {
    /// The component as the path treats it.
    pub layout: ComponentLayout,
    /// The blocks packed: the window's.
    pub blocks: BlockRect,
    /// Byte offset of the component's section (its multiplier table) from the image's start.
    pub section: u32,
    /// Offsets of `dc`, `masks`, `groups` and `ac` from the section's start.
    pub dc: u32,
    /// Offset of the masks.
    pub masks: u32,
    /// Offset of the group offsets.
    pub groups: u32,
    /// Offset of the AC values.
    pub ac: u32,
}

impl PackedComponent {
    /// Bytes of the component's plane after the inverse DCT: the block rectangle's samples.
    pub fn plane_bytes(&self) -> u64 {
        self.blocks.blocks() * 64
    }
}

/// One image's packed coefficients, as [`pack`] wrote them, and what to render of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PackedImage {
    /// The window rendered.
    pub window: Window,
    /// The colour conversion.
    pub conversion: Conversion,
    components: [Option<PackedComponent>; 3],
    /// Bytes written, a multiple of 8.
    pub bytes: usize,
}

impl PackedImage {
    /// The components.
    pub fn components(&self) -> impl Iterator<Item = &PackedComponent> {
        self.components.iter().flatten()
    }

    /// Component `c`.
    pub fn component(&self, c: usize) -> Option<&PackedComponent> {
        self.components.get(c).and_then(Option::as_ref)
    }

    /// An image whose coefficients the GPU decodes itself into dense planes
    /// ([`super::entropy`]): the blocks `window` needs of each component, whose staged section
    /// (the multiplier table only) starts `sections[c]` bytes from the image's staged start;
    /// `bytes` staged in all. The packed offsets are not used (the IDCT jobs point at the dense
    /// planes instead).
    pub(crate) fn dense(
        layout: &Layout,
        window: &Window,
        sections: [u32; 3],
        bytes: usize,
    ) -> Result<PackedImage, Error> {
        check(layout, window)?;
        let mut components = [None; 3];
        for (c, slot) in components
            .iter_mut()
            .enumerate()
            .take(layout.components.len())
        {
            *slot = Some(PackedComponent {
                layout: layout.components[c],
                blocks: layout.blocks(c, window),
                section: sections[c],
                dc: 0,
                masks: 0,
                groups: 0,
                ac: 0,
            });
        }
        Ok(PackedImage {
            window: *window,
            conversion: layout.conversion,
            components,
            bytes,
        })
    }

    /// Output channels (1 or 3).
    pub fn channels(&self) -> usize {
        self.conversion.channels()
    }

    /// Bytes of the rendered window, rows packed.
    pub fn output_bytes(&self) -> u64 {
        self.window.pixels() * self.channels() as u64
    }

    /// Bytes of all the component planes.
    pub fn plane_bytes(&self) -> u64 {
        self.components().map(PackedComponent::plane_bytes).sum()
    }
}

/// The most bytes [`pack`] writes for `window` of an image of `layout` (every coefficient
/// nonzero and wide): what to reserve before packing.
pub fn packed_bound(layout: &Layout, window: &Window) -> usize {
    (0..layout.components.len())
        .map(|c| section_bound(layout, window, c))
        .sum()
}

/// The most bytes the section of component `c` takes in [`packed_bound`].
pub fn section_bound(layout: &Layout, window: &Window, c: usize) -> usize {
    let blocks = layout.blocks(c, window).blocks() as usize;
    128 + (blocks * 2).next_multiple_of(8)
        + blocks * 8
        + blocks.div_ceil(GROUP as usize) * 4
        + (blocks * 63 * 2).next_multiple_of(8)
        + 8
}

/// The mask of a block's nonzero AC coefficients (bits 1 to 63) and whether one of them lies
/// outside -127..=127. `block` holds 64 coefficients.
fn scan(block: &[i16]) -> (u64, bool) {
    #[cfg(target_arch = "x86_64")]
    {
        scan_sse2(block)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        scan_portable(block)
    }
}

/// [`scan`] one coefficient at a time.
#[cfg(any(not(target_arch = "x86_64"), test))]
fn scan_portable(block: &[i16]) -> (u64, bool) {
    let mut mask = 0u64;
    let mut wide = false;
    for (k, &v) in block.iter().enumerate().take(64).skip(1) {
        mask |= u64::from(v != 0) << k;
        wide |= !(-127..=127).contains(&v);
    }
    (mask, wide)
}

/// [`scan`] eight coefficients at a time with SSE2 (part of every x86-64).
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
fn scan_sse2(block: &[i16]) -> (u64, bool) {
    use std::arch::x86_64::*;
    assert!(block.len() >= 64);
    // SAFETY: SSE2 is in the x86-64 baseline, so the intrinsics exist on every x86-64 CPU; each
    // load reads 16 bytes (8 coefficients) at `8 * i` for i < 8, inside the 64 coefficients
    // checked above, and unaligned loads accept any address.
    unsafe {
        let zero = _mm_setzero_si128();
        let high = _mm_set1_epi16(127);
        let low = _mm_set1_epi16(-127);
        let mut outside = zero;
        let mut zeros = 0u64;
        for i in 0..8 {
            let mut v = _mm_loadu_si128(block.as_ptr().add(8 * i) as *const __m128i);
            if i == 0 {
                // the DC coefficient is stored apart: neither in the mask nor in the range
                v = _mm_insert_epi16::<0>(v, 0);
            }
            let eq = _mm_cmpeq_epi16(v, zero);
            // 8 words of 0 or -1 packed to 8 bytes; one bit each
            let bits = _mm_movemask_epi8(_mm_packs_epi16(eq, zero)) as u64 & 0xFF;
            zeros |= bits << (8 * i);
            let out_of_range = _mm_or_si128(_mm_cmpgt_epi16(v, high), _mm_cmplt_epi16(v, low));
            outside = _mm_or_si128(outside, out_of_range);
        }
        (!zeros & !1, _mm_movemask_epi8(outside) != 0)
    }
}

fn put_u16(out: &mut Vec<u8>, v: i16) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn pad8(out: &mut Vec<u8>, from: usize) {
    let len = out.len() - from;
    out.resize(from + len.next_multiple_of(8), 0);
}

/// Whether `window` of an image of `layout` can be packed: inside the image, 3 components at most.
fn check(layout: &Layout, window: &Window) -> Result<(), Error> {
    layout.check(window)?;
    if layout.components.len() > 3 {
        return Err(Error::Unsupported(format!(
            "{} components",
            layout.components.len()
        )));
    }
    Ok(())
}

/// Packs the blocks `window` needs of every component of `source` (read with `layout`) at the
/// end of `out`, which must be a multiple of 8 bytes long. `out` only grows (no allocation once
/// it has grown to the largest image). Offsets in the result count from where the image starts.
pub fn pack<S: CoefficientSource + ?Sized>(
    source: &S,
    layout: &Layout,
    window: &Window,
    out: &mut Vec<u8>,
) -> Result<PackedImage, Error> {
    check(layout, window)?;
    let start = image_start(out)?;
    let mut components = [None; 3];
    for (c, slot) in components
        .iter_mut()
        .enumerate()
        .take(layout.components.len())
    {
        let quant = source
            .quant_table(c)
            .ok_or_else(|| Error::Request(format!("component {c} has no quantization table")))?;
        let mut packer = ComponentPacker::begin(layout, window, c, quant, out);
        for by in packer.rect.y0..packer.rect.y1 {
            let row = source.block_row(c, by).ok_or_else(|| {
                Error::Request(format!("block row {by} of component {c} was not read"))
            })?;
            packer.row(row, out)?;
        }
        *slot = Some(packer.finish(out, start)?);
    }
    Ok(PackedImage {
        window: *window,
        conversion: layout.conversion,
        components,
        bytes: out.len() - start,
    })
}

/// Where an image packed at the end of `out` starts: its length, which must be a multiple of 8.
fn image_start(out: &[u8]) -> Result<usize, Error> {
    match out.len().is_multiple_of(8) {
        true => Ok(out.len()),
        false => Err(Error::Request(
            "packed images start at a multiple of 8 bytes".into(),
        )),
    }
}

/// One component's section being written at the end of a buffer, the window's block rows one
/// after another from its first: the multiplier table, the DC and mask of each block at their
/// places, its nonzero AC values appended.
struct ComponentPacker {
    component: usize,
    layout: ComponentLayout,
    rect: BlockRect,
    /// Where the section starts in its buffer, and its parts' offsets from there.
    section: usize,
    dc: usize,
    masks: usize,
    groups: usize,
    ac: usize,
    /// Blocks packed so far, and their AC values' bytes.
    index: usize,
    ac_bytes: u32,
}

impl ComponentPacker {
    /// Starts component `c`'s section at the end of `out`: its multiplier table (from `quant`),
    /// then room for its blocks' DC coefficients, masks and group offsets.
    fn begin(
        layout: &Layout,
        window: &Window,
        c: usize,
        quant: &[u16; 64],
        out: &mut Vec<u8>,
    ) -> ComponentPacker {
        let rect = layout.blocks(c, window);
        let section = out.len();
        for q in multiplier_table(quant) {
            put_u16(out, q);
        }
        // dc, then masks, both written block by block; the AC values go to the end.
        let dc = out.len() - section;
        let blocks = rect.blocks() as usize;
        let masks = dc + (blocks * 2).next_multiple_of(8);
        let groups = masks + blocks * 8;
        let ac = groups + blocks.div_ceil(GROUP as usize) * 4;
        out.resize(section + ac, 0);
        ComponentPacker {
            component: c,
            layout: layout.components[c],
            rect,
            section,
            dc,
            masks,
            groups,
            ac,
            index: 0,
            ac_bytes: 0,
        }
    }

    /// Whether every block row of the window has been packed.
    fn complete(&self) -> bool {
        self.index as u64 == self.rect.blocks()
    }

    /// The block row the next [`ComponentPacker::row`] packs.
    fn next_row(&self) -> u32 {
        self.rect.y0 + (self.index as u64 / u64::from(self.rect.width().max(1))) as u32
    }

    /// Packs the window's blocks of `row` (a whole block row of the component: its blocks'
    /// coefficients in natural order), the window's next row, into `out`.
    fn row(&mut self, row: &[i16], out: &mut Vec<u8>) -> Result<(), Error> {
        let (by, c) = (self.next_row(), self.component);
        if self.complete() {
            return Err(Error::Request(format!(
                "block row {by} of component {c} is past the window"
            )));
        }
        let (first, last) = (self.rect.x0 as usize * 64, self.rect.x1 as usize * 64);
        let row = row.get(first..last).ok_or_else(|| {
            Error::Request(format!(
                "blocks {}..{} of row {by} of component {c}",
                self.rect.x0, self.rect.x1
            ))
        })?;
        let section = self.section;
        for block in row.chunks_exact(64) {
            let index = self.index;
            if index.is_multiple_of(GROUP as usize) {
                let at = section + self.groups + index / GROUP as usize * 4;
                out[at..at + 4].copy_from_slice(&self.ac_bytes.to_le_bytes());
            }
            let (mask, wide) = scan(block);
            let at = section + self.dc + index * 2;
            out[at..at + 2].copy_from_slice(&block[0].to_le_bytes());
            let at = section + self.masks + index * 8;
            out[at..at + 8].copy_from_slice(&(mask | u64::from(wide)).to_le_bytes());
            // The values go through a small buffer: one copy into `out` a block.
            let mut values = [0u8; 126];
            let mut len = 0;
            let mut bits = mask;
            while bits != 0 {
                let v = block[bits.trailing_zeros() as usize];
                if wide {
                    let [a, b] = v.to_le_bytes();
                    values[len] = a;
                    values[len + 1] = b;
                    len += 2;
                } else {
                    values[len] = v as i8 as u8;
                    len += 1;
                }
                bits &= bits - 1;
            }
            out.extend_from_slice(&values[..len]);
            self.ac_bytes = self
                .ac_bytes
                .checked_add(mask.count_ones() << u32::from(wide))
                .ok_or_else(|| Error::Request("image too large to pack".into()))?;
            self.index += 1;
        }
        Ok(())
    }

    /// Ends the section (padded to 8 bytes) once every block row is packed: the component as
    /// the kernels read it, its section's offset counted from `image_start` in `out`.
    fn finish(self, out: &mut Vec<u8>, image_start: usize) -> Result<PackedComponent, Error> {
        if !self.complete() {
            return Err(Error::Request(format!(
                "block row {} of component {} was not packed",
                self.next_row(),
                self.component
            )));
        }
        pad8(out, self.section);
        let offset =
            |v: usize| u32::try_from(v).map_err(|_| Error::Request("image too large".into()));
        Ok(PackedComponent {
            layout: self.layout,
            blocks: self.rect,
            section: offset(self.section - image_start)?,
            dc: offset(self.dc)?,
            masks: offset(self.masks)?,
            groups: offset(self.groups)?,
            ac: offset(self.ac)?,
        })
    }
}

/// A window packed while its image is decoded, a block row at a time as each becomes final (the
/// progressive decoder's stripes, [`super::progressive::ProgressiveDecoder::decode_packed`]), so
/// that no plane of the whole image is ever held. The first component's section is written
/// straight into the image's buffer; each later one into a buffer of its own (a section's AC
/// values must end before the next section starts), appended when the image is complete.
pub(crate) struct RowsPacker<'b> {
    out: &'b mut Vec<u8>,
    start: usize,
    /// Buffers of the sections after the first.
    later: &'b mut [Vec<u8>],
    /// Each component's packer (three at most: [`check`]), no allocation an image.
    packers: [Option<ComponentPacker>; 3],
    window: Window,
    conversion: Conversion,
}

impl<'b> RowsPacker<'b> {
    /// Starts packing `window` of an image of `layout` at the end of `out` (a multiple of 8
    /// bytes long), `quant` giving each component's quantization table, with `later` (grown to
    /// hold a buffer for each component after the first) for the later sections.
    pub(crate) fn begin(
        layout: &Layout,
        window: &Window,
        quant: &[[u16; 64]],
        out: &'b mut Vec<u8>,
        later: &'b mut Vec<Vec<u8>>,
    ) -> Result<RowsPacker<'b>, Error> {
        check(layout, window)?;
        let start = image_start(out)?;
        let components = layout.components.len();
        if later.len() < components {
            later.resize_with(components, Vec::new);
        }
        let mut packers = [None, None, None];
        let sections = later.iter_mut().enumerate().take(components);
        for ((c, section), packer) in sections.zip(&mut packers) {
            let quant = quant.get(c).ok_or_else(|| {
                Error::Request(format!("component {c} has no quantization table"))
            })?;
            let buffer = match c {
                0 => &mut *out,
                _ => {
                    section.clear();
                    section
                }
            };
            *packer = Some(ComponentPacker::begin(layout, window, c, quant, buffer));
        }
        Ok(RowsPacker {
            out,
            start,
            later: later.as_mut_slice(),
            packers,
            window: *window,
            conversion: layout.conversion,
        })
    }

    /// The block rows of component `c` the window needs (empty past the components).
    pub(crate) fn rows(&self, c: usize) -> std::ops::Range<u32> {
        match self.packers.get(c) {
            Some(Some(p)) => p.rect.y0..p.rect.y1,
            _ => 0..0,
        }
    }

    /// Offers block row `by` of component `c` (the component's whole row of blocks, final):
    /// packed if it is the window's next row of that component, passed over if outside the
    /// window. Rows must come in order.
    pub(crate) fn offer(&mut self, c: usize, by: u32, row: &[i16]) -> Result<(), Error> {
        let Some(Some(packer)) = self.packers.get_mut(c) else {
            return Ok(());
        };
        if !(packer.rect.y0..packer.rect.y1).contains(&by) {
            return Ok(());
        }
        if by != packer.next_row() {
            return Err(Error::Request(format!(
                "block row {by} of component {c} offered out of order (row {} expected)",
                packer.next_row()
            )));
        }
        let buffer = match c {
            0 => &mut *self.out,
            _ => &mut self.later[c],
        };
        packer.row(row, buffer)
    }

    /// The packed image, once every row of the window has been offered: the later sections
    /// appended to the image's buffer.
    pub(crate) fn finish(self) -> Result<PackedImage, Error> {
        let mut components = [None; 3];
        for (c, packer) in self.packers.into_iter().enumerate() {
            let Some(packer) = packer else {
                continue;
            };
            components[c] = Some(match c {
                0 => packer.finish(self.out, self.start)?,
                _ => {
                    let section = &mut self.later[c];
                    let mut component = packer.finish(section, 0)?;
                    component.section = u32::try_from(self.out.len() - self.start)
                        .map_err(|_| Error::Request("image too large".into()))?;
                    self.out.extend_from_slice(section);
                    component
                }
            });
        }
        Ok(PackedImage {
            window: self.window,
            conversion: self.conversion,
            components,
            bytes: self.out.len() - self.start,
        })
    }
}

/// The coefficients of a packed image, expanded on the CPU as the kernels expand them: the test
/// of the format, and a [`CoefficientSource`] for the CPU rendition. Blocks outside the window's
/// rectangles read as zero.
#[derive(Debug, Clone)]
pub struct Unpacked {
    tables: Vec<[u16; 64]>,
    /// Per component: first block row, blocks per row (the component's full width), rows.
    rows: Vec<(u32, usize, Vec<i16>)>,
}

/// Little-endian reads that fail instead of panicking on a short buffer.
fn read<const N: usize>(bytes: &[u8], at: usize) -> Result<[u8; N], Error> {
    bytes
        .get(at..at + N)
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| Error::Request(format!("packed data ends before byte {}", at + N)))
}

impl Unpacked {
    /// Expands `image` from `bytes` (the image's packed bytes, from its start).
    pub fn new(bytes: &[u8], image: &PackedImage) -> Result<Unpacked, Error> {
        let mut tables = Vec::new();
        let mut rows = Vec::new();
        for p in image.components() {
            let section = p.section as usize;
            let mut table = [0u16; 64];
            for (k, q) in table.iter_mut().enumerate() {
                *q = u16::from_le_bytes(read(bytes, section + 2 * k)?);
            }
            tables.push(table);
            let wide_row = p.layout.blocks_wide as usize * 64;
            let mut plane = vec![0i16; p.blocks.height() as usize * wide_row];
            let blocks = p.blocks.blocks() as usize;
            for b in 0..blocks {
                let mask = u64::from_le_bytes(read(bytes, section + p.masks as usize + 8 * b)?);
                // gf_expand: the group's offset plus the blocks before this one in the group
                let group = b / GROUP as usize;
                let mut at =
                    u32::from_le_bytes(read(bytes, section + p.groups as usize + 4 * group)?)
                        as usize;
                for j in group * GROUP as usize..b {
                    let m = u64::from_le_bytes(read(bytes, section + p.masks as usize + 8 * j)?);
                    at += ((m & !WIDE).count_ones() << (m & WIDE)) as usize;
                }
                let (bx, by) = (b as u32 % p.blocks.width(), b as u32 / p.blocks.width());
                let block_at = by as usize * wide_row + (p.blocks.x0 + bx) as usize * 64;
                let block = &mut plane[block_at..block_at + 64];
                block[0] = i16::from_le_bytes(read(bytes, section + p.dc as usize + 2 * b)?);
                let ac = section + p.ac as usize;
                for (k, v) in block.iter_mut().enumerate().skip(1) {
                    if mask >> k & 1 == 1 {
                        if mask & WIDE != 0 {
                            *v = i16::from_le_bytes(read(bytes, ac + at)?);
                            at += 2;
                        } else {
                            *v = i16::from(read::<1>(bytes, ac + at)?[0] as i8);
                            at += 1;
                        }
                    }
                }
            }
            rows.push((p.blocks.y0, wide_row, plane));
        }
        Ok(Unpacked { tables, rows })
    }
}

impl CoefficientSource for Unpacked {
    fn quant_table(&self, component: usize) -> Option<&[u16; 64]> {
        self.tables.get(component)
    }

    fn block_row(&self, component: usize, row: u32) -> Option<&[i16]> {
        let (first, len, plane) = self.rows.get(component)?;
        let r = row.checked_sub(*first)? as usize;
        plane.get(r * len..(r + 1) * len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpufeed_bench::upload::random_bytes;

    /// The vector scan equals the plain one on blocks of every density and range.
    #[test]
    fn scans_agree() {
        let noise = random_bytes(64 * 2 * 4096, 21);
        for (b, raw) in noise.chunks_exact(128).enumerate() {
            let keep = b % 9; // 0: all zero ... 8: all nonzero
            let block: Vec<i16> = raw
                .chunks_exact(2)
                .enumerate()
                .map(|(k, pair)| {
                    let v = i16::from_le_bytes([pair[0], pair[1]]);
                    let v = if b.is_multiple_of(3) { v } else { v % 130 };
                    if (k + b) % 8 < keep {
                        v
                    } else {
                        0
                    }
                })
                .collect();
            assert_eq!(scan(&block), scan_portable(&block), "block {b}");
        }
        let mut edge = [0i16; 64];
        edge[0] = i16::MIN; // the DC never counts
        assert_eq!(scan(&edge), (0, false));
        edge[63] = -127;
        assert_eq!(scan(&edge), (1 << 63, false));
        edge[5] = 128;
        assert_eq!(scan(&edge), (1 << 63 | 1 << 5, true));
        edge[5] = -128;
        assert_eq!(scan(&edge), (1 << 63 | 1 << 5, true));
    }
}
