//! What the coefficient path's two parsers share: JPEG marker segments read through a cursor
//! that never reads past the file's end (frame header, Huffman and quantization tables), Huffman
//! tables derived as `jpeg_make_d_derived_tbl` derives them, and a scan's entropy-coded data
//! destuffed and cut at its restart markers as libjpeg's bit reader sees it.

use super::entropy::{table_words, Interval, NATURAL_ORDER};
use super::Error;

/// [`Error::Unsupported`] with `reason`.
pub(super) fn unsupported(reason: impl Into<String>) -> Error {
    Error::Unsupported(reason.into())
}

/// A Huffman table as the file gives it.
#[derive(Debug, Clone)]
pub(super) struct RawTable {
    pub(super) counts: [u8; 17],
    pub(super) values: Vec<u8>,
}

/// A frame component before the scan.
#[derive(Debug, Clone, Copy)]
pub(super) struct FrameComponent {
    pub(super) id: u8,
    pub(super) h: u32,
    pub(super) v: u32,
    pub(super) tq: usize,
}

/// A byte reader over the file that never reads past its end.
pub(super) struct Cursor<'a> {
    pub(super) bytes: &'a [u8],
    pub(super) at: usize,
}

/// The tables a file defined so far: quantization (natural order), DC and AC Huffman, by slot.
#[derive(Default)]
pub(super) struct Tables {
    pub(super) quant: [Option<[u16; 64]>; 4],
    pub(super) dc: [Option<RawTable>; 4],
    pub(super) ac: [Option<RawTable>; 4],
}

impl<'a> Cursor<'a> {
    /// A cursor past `jpeg`'s SOI marker.
    pub(super) fn start(jpeg: &'a [u8]) -> Result<Cursor<'a>, Error> {
        let mut cur = Cursor { bytes: jpeg, at: 0 };
        if cur.u16()? != 0xFFD8 {
            return Err(unsupported("not a JPEG (no SOI marker)"));
        }
        Ok(cur)
    }

    pub(super) fn u8(&mut self) -> Result<u8, Error> {
        let b = *self
            .bytes
            .get(self.at)
            .ok_or_else(|| unsupported("the file ends inside its headers"))?;
        self.at += 1;
        Ok(b)
    }

    pub(super) fn u16(&mut self) -> Result<u16, Error> {
        Ok(u16::from(self.u8()?) << 8 | u16::from(self.u8()?))
    }

    pub(super) fn take(&mut self, n: usize) -> Result<&'a [u8], Error> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.bytes.len())
            .ok_or_else(|| unsupported("the file ends inside a marker segment"))?;
        let s = &self.bytes[self.at..end];
        self.at = end;
        Ok(s)
    }

    /// A marker segment's payload (after its 2-byte length).
    pub(super) fn segment(&mut self) -> Result<Cursor<'a>, Error> {
        let len = usize::from(self.u16()?);
        if len < 2 {
            return Err(unsupported(
                "a marker segment shorter than its length field",
            ));
        }
        Ok(Cursor {
            bytes: self.take(len - 2)?,
            at: 0,
        })
    }

    pub(super) fn done(&self) -> bool {
        self.at >= self.bytes.len()
    }

    /// The next marker's code: 0xFF, any fill bytes, the code; bytes between markers are
    /// refused.
    pub(super) fn marker(&mut self) -> Result<u8, Error> {
        if self.u8()? != 0xFF {
            return Err(unsupported("bytes between markers"));
        }
        let mut code = self.u8()?;
        while code == 0xFF {
            code = self.u8()?;
        }
        Ok(code)
    }
}

pub(super) fn parse_frame(s: &mut Cursor<'_>) -> Result<(u32, u32, Vec<FrameComponent>), Error> {
    let precision = s.u8()?;
    if precision != 8 {
        return Err(unsupported(format!("{precision}-bit samples")));
    }
    let height = u32::from(s.u16()?);
    let width = u32::from(s.u16()?);
    if height == 0 {
        return Err(unsupported("a height given by a DNL marker"));
    }
    if width == 0 {
        return Err(unsupported("an image 0 pixels wide"));
    }
    let n = s.u8()?;
    if n != 1 && n != 3 {
        return Err(unsupported(format!("{n} components")));
    }
    let mut components = Vec::with_capacity(3);
    for _ in 0..n {
        let id = s.u8()?;
        let hv = s.u8()?;
        let tq = s.u8()?;
        let (h, v) = (u32::from(hv >> 4), u32::from(hv & 15));
        if !(1..=4).contains(&h) || !(1..=4).contains(&v) {
            return Err(unsupported(format!("sampling factors {h}x{v}")));
        }
        if tq > 3 {
            return Err(unsupported(format!("quantization table {tq}")));
        }
        if components.iter().any(|c: &FrameComponent| c.id == id) {
            return Err(unsupported("two components with one identifier"));
        }
        components.push(FrameComponent {
            id,
            h,
            v,
            tq: usize::from(tq),
        });
    }
    if !s.done() {
        return Err(unsupported("a frame header of the wrong length"));
    }
    Ok((width, height, components))
}

pub(super) fn parse_dht(
    s: &mut Cursor<'_>,
    dc: &mut [Option<RawTable>; 4],
    ac: &mut [Option<RawTable>; 4],
) -> Result<(), Error> {
    while !s.done() {
        let tc_th = s.u8()?;
        let (class, slot) = (tc_th >> 4, usize::from(tc_th & 15));
        if class > 1 || slot > 3 {
            return Err(unsupported(format!("Huffman table {tc_th:#04x}")));
        }
        let mut counts = [0u8; 17];
        for count in &mut counts[1..] {
            *count = s.u8()?;
        }
        let total: usize = counts.iter().map(|&c| usize::from(c)).sum();
        if total > 256 {
            return Err(unsupported("a Huffman table of more than 256 symbols"));
        }
        let values = s.take(total)?.to_vec();
        let table = RawTable { counts, values };
        if class == 0 {
            dc[slot] = Some(table);
        } else {
            ac[slot] = Some(table);
        }
    }
    Ok(())
}

/// A DRI segment: MCUs a restart interval (0: none).
pub(super) fn parse_dri(s: &mut Cursor<'_>) -> Result<u32, Error> {
    let restart = u32::from(s.u16()?);
    if !s.done() {
        return Err(unsupported("a DRI segment of the wrong length"));
    }
    Ok(restart)
}

pub(super) fn parse_dqt(
    s: &mut Cursor<'_>,
    quant: &mut [Option<[u16; 64]>; 4],
) -> Result<(), Error> {
    while !s.done() {
        let pq_tq = s.u8()?;
        let (precision, slot) = (pq_tq >> 4, usize::from(pq_tq & 15));
        if precision > 1 || slot > 3 {
            return Err(unsupported(format!("quantization table {pq_tq:#04x}")));
        }
        let mut table = [0u16; 64];
        for &natural in &NATURAL_ORDER {
            table[usize::from(natural)] = if precision == 0 {
                u16::from(s.u8()?)
            } else {
                s.u16()?
            };
        }
        quant[slot] = Some(table);
    }
    Ok(())
}

/// `jpeg_make_d_derived_tbl` in the kernels' form with a first-level lookup of `lookup_bits`
/// bits ([`table_words`] of them), appended to `out`.
pub(super) fn derive_table(
    table: &RawTable,
    is_dc: bool,
    lookup_bits: u32,
    out: &mut Vec<u32>,
) -> Result<(), Error> {
    let base = out.len();
    out.resize(base + table_words(lookup_bits), 0);
    let words = &mut out[base..];
    let (lookup, rest) = words.split_at_mut(1 << lookup_bits);
    let (maxcode, rest) = rest.split_at_mut(18);
    let (valoffset, symbols) = rest.split_at_mut(18);
    // Canonical codes, shortest first (Figure C.1 and C.2 of the standard).
    let mut code = 0u32;
    let mut p = 0usize;
    for l in 1..=16usize {
        let n = usize::from(table.counts[l]);
        valoffset[l] = (p as i32).wrapping_sub(code as i32) as u32;
        for _ in 0..n {
            // The codes of this length must fit in it, the all-ones code left free (libjpeg's
            // check, `code >= 1 << l` after the length's last code).
            if code + 1 >= 1 << l {
                return Err(unsupported("a Huffman table whose codes overflow"));
            }
            let symbol = table.values[p];
            if l as u32 <= lookup_bits {
                let shift = lookup_bits - l as u32;
                let first = (code << shift) as usize;
                for entry in &mut lookup[first..first + (1 << shift)] {
                    *entry = (l as u32) << 8 | u32::from(symbol);
                }
            }
            code += 1;
            p += 1;
        }
        maxcode[l] = if n > 0 { code - 1 } else { u32::MAX };
        code <<= 1;
    }
    maxcode[17] = 0xF_FFFF; // ends the slow path's search
    for (i, &v) in table.values.iter().enumerate() {
        if is_dc && v > 15 {
            return Err(unsupported("a DC Huffman symbol above 15"));
        }
        symbols[i / 4] |= u32::from(v) << (8 * (i % 4));
    }
    Ok(())
}

/// How a scan's entropy-coded data ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ScanEnd {
    /// The file ended (inside the data or inside a marker).
    EndOfFile,
    /// A marker other than RSTn: its code, and where its 0xFF is in the scan's bytes.
    Marker { code: u8, at: usize },
}

/// Appends the entropy-coded data of `scan` (the bytes after a scan header), destuffed, to
/// `data`, and its restart intervals to `intervals`: exactly `ceil(mcus / per_interval)` of them,
/// RST0..RST7 in turn between them, each interval's bounds counted in `data`. A 0xFF byte
/// followed by any number of 0xFF fill bytes and a 0x00 is one 0xFF data byte; the data ends at
/// the end of the file or at a marker other than RSTn, which this says.
pub(super) fn destuff_scan(
    scan: &[u8],
    mcus: u32,
    per_interval: u32,
    data: &mut Vec<u8>,
    intervals: &mut Vec<Interval>,
) -> Result<ScanEnd, Error> {
    let count = mcus.div_ceil(per_interval.max(1)) as usize;
    let first = intervals.len();
    let mut start = data.len();
    let mut i = 0usize;
    let close = |intervals: &mut Vec<Interval>, start: usize, end: usize| -> Result<(), Error> {
        let n = (intervals.len() - first) as u32;
        let first_mcu = n * per_interval;
        let (start, end) = (
            u32::try_from(start).map_err(|_| unsupported("a scan of 4 GB or more"))?,
            u32::try_from(end).map_err(|_| unsupported("a scan of 4 GB or more"))?,
        );
        intervals.push(Interval {
            start,
            end,
            first_mcu,
            mcus: per_interval.min(mcus - first_mcu),
        });
        Ok(())
    };
    let end = loop {
        // The next 0xFF in the rest of the data: everything before it is data.
        let rest = scan.get(i..).unwrap_or(&[]);
        let Some(ff) = memchr::memchr(0xFF, rest) else {
            data.extend_from_slice(rest);
            // The file ends without a marker: what was there is the last interval.
            break ScanEnd::EndOfFile;
        };
        data.extend_from_slice(&rest[..ff]);
        let marker = i + ff;
        i = marker + 1;
        let mut code = scan.get(i).copied();
        while code == Some(0xFF) {
            i += 1;
            code = scan.get(i).copied();
        }
        i += 1;
        match code {
            None => break ScanEnd::EndOfFile,
            Some(0x00) => data.push(0xFF),
            Some(c @ 0xD0..=0xD7) => {
                if intervals.len() - first + 1 >= count {
                    return Err(unsupported("more restart markers than intervals"));
                }
                if u32::from(c - 0xD0) != (intervals.len() - first) as u32 % 8 {
                    return Err(unsupported("restart markers out of sequence"));
                }
                close(intervals, start, data.len())?;
                start = data.len();
            }
            Some(code) => break ScanEnd::Marker { code, at: marker },
        }
    };
    if intervals.len() - first + 1 != count {
        return Err(unsupported("fewer restart markers than intervals"));
    }
    close(intervals, start, data.len())?;
    Ok(end)
}

#[cfg(test)]
mod tests {
    use super::super::entropy::LOOKUP_BITS;
    use super::*;

    /// A tiny table: symbols 0 (code 0), 1 (10), 2 (110).
    #[test]
    fn tables_are_canonical() {
        let mut counts = [0u8; 17];
        counts[1] = 1;
        counts[2] = 1;
        counts[3] = 1;
        let table = RawTable {
            counts,
            values: vec![5, 7, 9],
        };
        let mut out = Vec::new();
        derive_table(&table, true, LOOKUP_BITS, &mut out).unwrap();
        let n = 1usize << LOOKUP_BITS;
        let lookup = &out[..n];
        assert_eq!(lookup[0], 1 << 8 | 5);
        assert_eq!(lookup[n / 2 - 1], 1 << 8 | 5);
        assert_eq!(lookup[n / 2], 2 << 8 | 7);
        assert_eq!(lookup[0b110 << (LOOKUP_BITS - 3)], 3 << 8 | 9);
        assert_eq!(lookup[n - 1], 0);
        // An overflowing table: three codes of length 1.
        counts[1] = 3;
        counts[2] = 0;
        counts[3] = 0;
        let bad = RawTable {
            counts,
            values: vec![1, 2, 3],
        };
        assert!(derive_table(&bad, true, LOOKUP_BITS, &mut out).is_err());
    }
}
