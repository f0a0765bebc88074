//! A batch of parsed JPEGs ([`ParsedJpeg`]) planned for `kernels/entropy.cu`: where each image's
//! data, tables and coefficient planes lie in the batch's buffers, its restart intervals cut into
//! subsequences of [`SUB_BITS`] bits (one GPU thread each), and the launch sizes. Pure arithmetic,
//! shared by the GPU side and the host run of the kernel source, so both launch the same work.

use super::entropy::{ParsedJpeg, MAX_BLOCKS_IN_MCU, TABLE_WORDS};
use super::reference::multiplier_table;
use super::Error;

/// Bits of entropy-coded data one thread decodes (the last subsequence of an interval may be
/// shorter).
pub const SUB_BITS: u32 = 1024;
/// Most synchronisation passes a batch launches ([`super::sync_passes`] picks how many); the
/// first that changes nothing ends them (the rest return at once). An image whose decode has not
/// synchronised by the last is flagged.
pub const PASSES: u32 = 64;
/// Threads per block of every entropy launch.
pub const HUFF_THREADS: u32 = 128;
/// Alignment of each image's planes, in coefficients.
const PLANE_ALIGN: u64 = 64;

/// Status bits of an image the kernels could not decode exactly (its status word).
pub mod status {
    /// A code no table holds.
    pub const BAD_CODE: u32 = 1;
    /// A run of zeros past coefficient 63.
    pub const BAD_RUN: u32 = 2;
    /// A symbol past the end of its interval's data.
    pub const OVERRUN: u32 = 4;
    /// Fewer blocks than the interval codes (a file cut short).
    pub const SHORT: u32 = 8;
    /// The subsequences' decodes did not agree within the passes.
    pub const NO_SYNC: u32 = 16;
}

/// `struct GfHuffImage` of kernels/entropy.cu.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HuffImage {
    /// `u32` word offset of its data in the data buffer.
    pub data: u64,
    /// `i16` offset of its first plane in the coefficient buffer.
    pub coef: u64,
    /// Words of its data.
    pub words: u32,
    /// Index of its first table.
    pub tables: u32,
    /// MCUs per MCU row.
    pub mcus_wide: u32,
    /// Blocks in an MCU.
    pub blocks_in_mcu: u32,
    /// `i16` offset of each plane from `coef`.
    pub plane: [u32; 3],
    /// Blocks per row of each plane.
    pub plane_wide: [u32; 3],
    /// Blocks across each component's part of an MCU.
    pub h: [u32; 3],
    /// Blocks down each component's part of an MCU.
    pub v: [u32; 3],
    /// Each block of an MCU: component | column << 8 | row << 16.
    pub block: [u32; MAX_BLOCKS_IN_MCU],
    /// Index of its status word.
    pub status: u32,
    /// The MCU's blocks repeat their Huffman tables every `period` blocks ([`table_period`]).
    pub period: u32,
}

/// `struct GfHuffSub` of kernels/entropy.cu.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HuffSub {
    /// Its image in the batch.
    pub image: u32,
    /// Its interval in the batch's list.
    pub interval: u32,
    /// Its first bit in the image's data.
    pub start: u32,
    /// One past its last bit.
    pub end: u32,
    /// One past its interval's last bit.
    pub limit: u32,
    /// 1 for the first subsequence of an interval.
    pub first: u32,
}

/// `struct GfHuffInterval` of kernels/entropy.cu.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HuffInterval {
    /// Its image in the batch.
    pub image: u32,
    /// Its first subsequence.
    pub first_sub: u32,
    /// Its subsequences.
    pub subs: u32,
    /// Its first block in the image.
    pub first_block: u32,
    /// Blocks it codes.
    pub blocks: u32,
    /// Padding to the kernel's layout.
    pub unused: u32,
}

/// Bytes of one `GfHuffExit` (two per subsequence on the device).
pub const EXIT_BYTES: usize = 36;
/// Bytes of one `GfHuffBase` (one per subsequence on the device).
pub const BASE_BYTES: usize = 16;
/// Subsequences of one group of the two-level prefix sum (kernels/entropy.cu `GF_GROUP_SUBS`).
pub const GROUP_SUBS: usize = 32;

/// Where one image's coefficient planes are in the coefficient buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DensePlanes {
    /// `i16` offset of each component's plane (unused components 0).
    pub offset: [u64; 3],
    /// Blocks per row of each plane.
    pub blocks_wide: [u32; 3],
    /// Block rows of each plane.
    pub blocks_high: [u32; 3],
    /// Components.
    pub components: usize,
}

/// One planned batch, reused from batch to batch (its vectors keep their capacity).
#[derive(Debug, Default, Clone)]
pub struct EntropyPlan {
    /// One per image.
    pub images: Vec<HuffImage>,
    /// Every image's subsequences, interval after interval.
    pub subs: Vec<HuffSub>,
    /// Every image's intervals.
    pub intervals: Vec<HuffInterval>,
    /// Where each image's planes are.
    pub planes: Vec<DensePlanes>,
    /// One past the last word of the data buffer the batch's data takes.
    pub data_words: u64,
    /// One past the last word of the table buffer the batch's tables take.
    pub table_words: u64,
    /// Coefficients (`i16`) of the coefficient buffer the batch uses (a multiple of 64).
    pub coefficients: u64,
}

/// Words, tables and coefficients `image` takes in a batch.
pub fn entropy_footprint(image: &ParsedJpeg) -> (u64, u64, u64) {
    let words = (image.data.len() as u64).div_ceil(4);
    let coefficients = (0..image.components.len())
        .map(|c| (image.plane_len(c) as u64).next_multiple_of(PLANE_ALIGN))
        .sum();
    (words, image.tables.len() as u64, coefficients)
}

/// Subsequences `image` takes.
pub fn subsequences(image: &ParsedJpeg) -> u64 {
    image
        .intervals
        .iter()
        .map(|iv| {
            (u64::from(iv.end - iv.start) * 8)
                .div_ceil(u64::from(SUB_BITS))
                .max(1)
        })
        .sum()
}

/// The smallest `d` dividing the MCU's block count such that block `b` and block `b + d` of an
/// MCU decode with the same Huffman tables (the same contents), for every `b`. The decoder's
/// state needs the block's place in the MCU only modulo `d`: a decode started at a guessed place
/// can agree with the true one only modulo `d` (with an RGB file's three components on one pair
/// of tables, never more), and the place itself follows from the block's index.
pub fn table_period(image: &ParsedJpeg) -> u32 {
    let bim = image.mcu_blocks.len();
    let tables = |b: usize| {
        let c = usize::from(image.mcu_blocks[b].0);
        image
            .tables
            .get(2 * c * TABLE_WORDS..(2 * c + 2) * TABLE_WORDS)
    };
    (1..bim)
        .find(|&d| bim.is_multiple_of(d) && (0..bim).all(|b| tables(b) == tables((b + d) % bim)))
        .unwrap_or(bim)
        .max(1) as u32
}

impl EntropyPlan {
    /// Forgets the images planned.
    pub fn clear(&mut self) {
        self.images.clear();
        self.subs.clear();
        self.intervals.clear();
        self.planes.clear();
        self.data_words = 0;
        self.table_words = 0;
        self.coefficients = 0;
    }

    /// Adds `image` to the plan, its data at word `data` of the data buffer and its tables at
    /// word `tables` of the table buffer (one buffer on the GPU side: where [`stage`] put them);
    /// its planes follow the planes planned. On an error the plan is as it was.
    pub fn push(&mut self, image: &ParsedJpeg, data: u64, tables: u64) -> Result<(), Error> {
        let too_large = |what: &str| Error::Request(format!("{what} too large for the kernels"));
        let index = self.images.len() as u32;
        let ncomp = image.components.len();
        if !(1..=3).contains(&ncomp)
            || image.mcu_blocks.is_empty()
            || image.mcu_blocks.len() > MAX_BLOCKS_IN_MCU
            || image.tables.len() != ncomp * 2 * TABLE_WORDS
        {
            return Err(Error::Request("not a parsed baseline JPEG".into()));
        }
        // Bits must be addressable by a u32.
        if image.data.len() as u64 * 8 >= u64::from(u32::MAX) {
            return Err(too_large("a scan"));
        }
        let mut job = HuffImage {
            data,
            coef: self.coefficients,
            words: u32::try_from((image.data.len() as u64).div_ceil(4))
                .map_err(|_| too_large("a scan"))?,
            tables: u32::try_from(tables).map_err(|_| too_large("a batch"))?,
            mcus_wide: image.mcus_wide,
            blocks_in_mcu: image.blocks_in_mcu(),
            status: index,
            period: table_period(image),
            ..HuffImage::default()
        };
        let mut planes = DensePlanes {
            offset: [0; 3],
            blocks_wide: [0; 3],
            blocks_high: [0; 3],
            components: ncomp,
        };
        let mut at = 0u64;
        for (c, comp) in image.components.iter().enumerate() {
            job.plane[c] = u32::try_from(at).map_err(|_| too_large("an image"))?;
            job.plane_wide[c] = comp.plane_blocks_wide;
            let single = ncomp == 1;
            job.h[c] = if single { 1 } else { comp.h_samp };
            job.v[c] = if single { 1 } else { comp.v_samp };
            planes.offset[c] = self.coefficients + at;
            planes.blocks_wide[c] = comp.plane_blocks_wide;
            planes.blocks_high[c] = comp.plane_blocks_high;
            at += (image.plane_len(c) as u64).next_multiple_of(PLANE_ALIGN);
        }
        u32::try_from(at).map_err(|_| too_large("an image"))?;
        for (b, &(c, x, y)) in image.mcu_blocks.iter().enumerate() {
            job.block[b] = u32::from(c) | u32::from(x) << 8 | u32::from(y) << 16;
        }
        let bim = image.blocks_in_mcu();
        let (subs, intervals) = (self.subs.len(), self.intervals.len());
        for iv in &image.intervals {
            let first_sub = self.subs.len() as u32;
            let (start, limit) = (iv.start * 8, iv.end * 8);
            let count = (limit - start).div_ceil(SUB_BITS).max(1);
            for s in 0..count {
                let sub_start = start + s * SUB_BITS;
                self.subs.push(HuffSub {
                    image: index,
                    interval: self.intervals.len() as u32,
                    start: sub_start,
                    end: (sub_start + SUB_BITS).min(limit),
                    limit,
                    first: u32::from(s == 0),
                });
            }
            let first_block = iv.first_mcu.checked_mul(bim);
            let Some(first_block) = first_block.filter(|f| f.checked_add(iv.mcus * bim).is_some())
            else {
                self.subs.truncate(subs);
                self.intervals.truncate(intervals);
                return Err(too_large("an image"));
            };
            self.intervals.push(HuffInterval {
                image: index,
                first_sub,
                subs: count,
                first_block,
                blocks: iv.mcus * bim,
                unused: 0,
            });
        }
        if self.subs.len() >= u32::MAX as usize / 2 {
            self.subs.truncate(subs);
            self.intervals.truncate(intervals);
            return Err(too_large("a batch"));
        }
        let (words, table_words, coefficients) = entropy_footprint(image);
        self.data_words = self.data_words.max(data + words);
        self.table_words = self.table_words.max(tables + table_words);
        self.coefficients += coefficients;
        self.images.push(job);
        self.planes.push(planes);
        Ok(())
    }
}

/// Bytes [`stage`] writes for `image`: per component its multiplier table (128 bytes), its
/// Huffman tables, its data, padded to a multiple of 8.
pub fn staged_len(image: &ParsedJpeg) -> usize {
    128 * image.components.len() + image.tables.len() * 4 + image.data.len().next_multiple_of(8)
}

/// Where [`stage`] puts each component's multiplier table, in bytes from the image's start.
pub const QUANT_SECTIONS: [u32; 3] = [0, 128, 256];

/// Where [`stage`] puts the parts of an image, in bytes from its start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Staged {
    /// Component `c`'s multiplier table (`i16`, natural order) is at `128 * c`.
    pub quant: [u32; 3],
    /// The Huffman tables (`u32` words).
    pub tables: usize,
    /// The data, then zeros up to a multiple of 8.
    pub data: usize,
}

/// Writes what the GPU needs of `image` into `out` ([`staged_len`] bytes): the multiplier tables
/// the inverse DCT reads, the Huffman tables and the data the entropy kernels read. The caller
/// places it at a multiple of 8 bytes in the batch's buffer and plans the image with
/// [`EntropyPlan::push`] at the words where the tables and the data landed.
pub fn stage(image: &ParsedJpeg, out: &mut [u8]) -> Result<Staged, Error> {
    if out.len() != staged_len(image) {
        return Err(Error::Request(format!(
            "{} bytes to stage an image of {}",
            out.len(),
            staged_len(image)
        )));
    }
    let n = image.components.len();
    for (c, component) in image.components.iter().enumerate() {
        for (k, q) in multiplier_table(&component.quant).iter().enumerate() {
            let o = 128 * c + 2 * k;
            out[o..o + 2].copy_from_slice(&q.to_le_bytes());
        }
    }
    let tables = 128 * n;
    for (k, w) in image.tables.iter().enumerate() {
        out[tables + 4 * k..tables + 4 * k + 4].copy_from_slice(&w.to_le_bytes());
    }
    let data = tables + image.tables.len() * 4;
    out[data..data + image.data.len()].copy_from_slice(&image.data);
    out[data + image.data.len()..].fill(0);
    Ok(Staged {
        quant: QUANT_SECTIONS,
        tables,
        data,
    })
}

/// Copies component `c` of `image`'s planes (as the kernels wrote them into `coefficients`) into
/// `out`, libjpeg's coefficient rows: `blocks_wide` blocks of 64 a row, `rows` rows.
pub fn copy_plane(
    coefficients: &[i16],
    planes: &DensePlanes,
    c: usize,
    blocks_wide: u32,
    rows: u32,
    out: &mut Vec<i16>,
) -> Result<(), Error> {
    if c >= planes.components || blocks_wide > planes.blocks_wide[c] || rows > planes.blocks_high[c]
    {
        return Err(Error::Request(format!("component {c}: outside its plane")));
    }
    out.clear();
    let pitch = planes.blocks_wide[c] as usize * 64;
    for row in 0..rows as usize {
        let start = planes.offset[c] as usize + row * pitch;
        let part = coefficients
            .get(start..start + blocks_wide as usize * 64)
            .ok_or_else(|| Error::Request("the coefficient buffer is too short".into()))?;
        out.extend_from_slice(part);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The structures have the sizes of the kernel's, the tables its lookup width.
    #[test]
    fn descriptors_have_the_kernels_layout() {
        assert_eq!(std::mem::size_of::<HuffImage>(), 128);
        assert_eq!(std::mem::size_of::<HuffSub>(), 24);
        assert_eq!(std::mem::size_of::<HuffInterval>(), 24);
        // The tables' lookup form is the kernels' too.
        let lookup_bits = format!(
            "#define GF_LOOKUP_BITS {}\n",
            crate::coefficients::entropy::LOOKUP_BITS
        );
        assert!(crate::coefficients::gpu::ENTROPY_SOURCE.contains(&lookup_bits));
    }
}
