//! Instance masks as pycocotools makes them (`common/maskApi.c`): run-length encodings (RLE,
//! column-major counts starting with a run of zeros), polygons rasterized to RLE
//! (`rleFrPoly`: the boundary upsampled five times, walked, and the column crossings kept),
//! COCO's compressed counts strings (`rleFrString`), the union of an object's parts
//! (`rleMerge`), and the decode to a `u8` mask, row-major here (pycocotools returns the same
//! array in Fortran order).

use std::fmt;

/// A run-length encoded `height` x `width` binary mask: alternating runs of 0s and 1s down the
/// columns (column-major), the first run of 0s (possibly empty).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rle {
    /// Rows.
    pub height: u32,
    /// Columns.
    pub width: u32,
    /// The runs.
    pub counts: Vec<u32>,
}

/// Why a mask could not be made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MaskError {
    /// The runs of an RLE do not add up to its height times its width.
    RleSize {
        /// Sum of the runs.
        sum: u64,
        /// `height * width`.
        area: u64,
    },
    /// A compressed counts string holds a character outside COCO's alphabet (`0`..`o`).
    BadCounts,
    /// A polygon of fewer than three points (pycocotools needs at least six numbers).
    ShortPolygon(usize),
    /// A coordinate that is not a finite number.
    NotFinite,
}

impl fmt::Display for MaskError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MaskError::RleSize { sum, area } => {
                write!(f, "RLE runs add up to {sum} pixels, the mask has {area}")
            }
            MaskError::BadCounts => write!(f, "RLE counts string has a character outside 0..o"),
            MaskError::ShortPolygon(n) => {
                write!(
                    f,
                    "polygon of {n} numbers (at least 6, three points, needed)"
                )
            }
            MaskError::NotFinite => write!(f, "polygon coordinate is not a finite number"),
        }
    }
}

impl std::error::Error for MaskError {}

impl Rle {
    /// An RLE from COCO's uncompressed counts (`{"counts": [..], "size": [h, w]}`), checked.
    pub fn from_counts(height: u32, width: u32, counts: Vec<u32>) -> Result<Rle, MaskError> {
        let rle = Rle {
            height,
            width,
            counts,
        };
        rle.check()?;
        Ok(rle)
    }

    /// An RLE from COCO's compressed counts string (`rleFrString`): LEB128-like, 5 bits a
    /// character offset by 48, the runs after the second stored as differences to the run two
    /// before. Checked against the size.
    pub fn from_string(height: u32, width: u32, text: &[u8]) -> Result<Rle, MaskError> {
        let mut counts: Vec<u32> = Vec::with_capacity(text.len());
        let mut p = 0;
        while p < text.len() {
            let (mut x, mut k) = (0i64, 0u32);
            loop {
                let Some(&ch) = text.get(p) else {
                    return Err(MaskError::BadCounts);
                };
                if !(48..=111).contains(&ch) {
                    return Err(MaskError::BadCounts);
                }
                let c = i64::from(ch - 48);
                if k >= 12 {
                    return Err(MaskError::BadCounts);
                }
                x |= (c & 0x1f) << (5 * k);
                p += 1;
                k += 1;
                if c & 0x20 == 0 {
                    if c & 0x10 != 0 {
                        x |= -1i64 << (5 * k);
                    }
                    break;
                }
            }
            let m = counts.len();
            if m > 2 {
                x += i64::from(counts[m - 2]);
            }
            // C's `(uint) x`: the low 32 bits.
            counts.push(x as u32);
        }
        Rle::from_counts(height, width, counts)
    }

    /// The compressed counts string of this RLE (`rleToString`).
    pub fn to_counts_string(&self) -> String {
        let mut s = String::new();
        for (i, &c) in self.counts.iter().enumerate() {
            let mut x = i64::from(c);
            if i > 2 {
                x -= i64::from(self.counts[i - 2]);
            }
            loop {
                let mut ch = (x & 0x1f) as u8;
                x >>= 5;
                let more = if ch & 0x10 != 0 { x != -1 } else { x != 0 };
                if more {
                    ch |= 0x20;
                }
                s.push(char::from(ch + 48));
                if !more {
                    break;
                }
            }
        }
        s
    }

    /// Checks that the runs cover the mask exactly.
    pub fn check(&self) -> Result<(), MaskError> {
        let sum: u64 = self.counts.iter().map(|&c| u64::from(c)).sum();
        let area = u64::from(self.height) * u64::from(self.width);
        if sum != area {
            return Err(MaskError::RleSize { sum, area });
        }
        Ok(())
    }

    /// A polygon (`[x0, y0, x1, y1, ...]` in pixels) rasterized as `rleFrPoly` does.
    pub fn from_polygon(height: u32, width: u32, xy: &[f64]) -> Result<Rle, MaskError> {
        if xy.len() < 6 {
            return Err(MaskError::ShortPolygon(xy.len()));
        }
        if xy.iter().any(|v| !v.is_finite()) {
            return Err(MaskError::NotFinite);
        }
        Ok(poly_to_rle(height, width, xy))
    }

    /// The union of `parts` (`rleMerge` with `intersect = 0`); all of one size, else an empty
    /// 0 x 0 mask as pycocotools gives.
    pub fn merge(parts: &[Rle]) -> Rle {
        let Some(first) = parts.first() else {
            return Rle {
                height: 0,
                width: 0,
                counts: Vec::new(),
            };
        };
        let (h, w) = (first.height, first.width);
        let mut cnts = first.counts.clone();
        for b in &parts[1..] {
            if b.height != h || b.width != w {
                return Rle {
                    height: 0,
                    width: 0,
                    counts: Vec::new(),
                };
            }
            cnts = union(&cnts, &b.counts);
        }
        Rle {
            height: h,
            width: w,
            counts: cnts,
        }
    }

    /// The mask's pixels set (`rleArea`).
    pub fn area(&self) -> u64 {
        self.counts
            .iter()
            .skip(1)
            .step_by(2)
            .map(|&c| u64::from(c))
            .sum()
    }

    /// Decodes into `out`, `height * width` bytes row-major, 1 inside and 0 outside. The RLE
    /// must be [checked](Rle::check) (runs past the end are cut).
    pub fn decode_into(&self, out: &mut [u8]) {
        let h = self.height as usize;
        let total = h * self.width as usize;
        out[..total].fill(0);
        if h == 0 {
            return;
        }
        let mut pos = 0usize;
        let mut v = false;
        for &c in &self.counts {
            let end = (pos + c as usize).min(total);
            if v {
                for p in pos..end {
                    // Column-major position p is row p % h, column p / h.
                    out[(p % h) * self.width as usize + p / h] = 1;
                }
            }
            pos = end;
            v = !v;
        }
    }

    /// The decoded mask, `height * width` bytes row-major.
    pub fn decode(&self) -> Vec<u8> {
        let mut out = vec![0u8; self.height as usize * self.width as usize];
        self.decode_into(&mut out);
        out
    }
}

/// `rleMerge`'s walk of two RLEs for their union.
fn union(a: &[u32], b: &[u32]) -> Vec<u32> {
    let mut out = Vec::with_capacity(a.len() + b.len());
    let (mut ca, mut cb) = (
        a.first().copied().unwrap_or(0),
        b.first().copied().unwrap_or(0),
    );
    let (mut va, mut vb, mut v) = (false, false, false);
    let (mut ia, mut ib) = (1usize, 1usize);
    let mut cc: u32 = 0;
    let mut ct: u32 = 1;
    while ct > 0 {
        let c = ca.min(cb);
        cc = cc.wrapping_add(c);
        ct = 0;
        ca -= c;
        if ca == 0 && ia < a.len() {
            ca = a[ia];
            ia += 1;
            va = !va;
        }
        ct = ct.wrapping_add(ca);
        cb -= c;
        if cb == 0 && ib < b.len() {
            cb = b[ib];
            ib += 1;
            vb = !vb;
        }
        ct = ct.wrapping_add(cb);
        let vp = v;
        v = va || vb;
        if v != vp || ct == 0 {
            out.push(cc);
            cc = 0;
        }
    }
    out
}

/// C's `(int)(v)`: truncation toward zero, saturating where C would be undefined.
fn c_int(v: f64) -> i64 {
    v.trunc().clamp(i32::MIN as f64, i32::MAX as f64) as i64
}

/// `rleFrPoly`, step for step.
fn poly_to_rle(h: u32, w: u32, xy: &[f64]) -> Rle {
    const SCALE: f64 = 5.0;
    let k = xy.len() / 2;
    // Upsample and get discrete points densely along the entire boundary.
    let mut x: Vec<i64> = (0..k).map(|j| c_int(SCALE * xy[2 * j] + 0.5)).collect();
    let mut y: Vec<i64> = (0..k).map(|j| c_int(SCALE * xy[2 * j + 1] + 0.5)).collect();
    x.push(x[0]);
    y.push(y[0]);
    let mut u: Vec<i64> = Vec::new();
    let mut v: Vec<i64> = Vec::new();
    for j in 0..k {
        let (mut xs, mut xe, mut ys, mut ye) = (x[j], x[j + 1], y[j], y[j + 1]);
        let dx = (xe - xs).abs();
        let dy = (ys - ye).abs();
        let flip = (dx >= dy && xs > xe) || (dx < dy && ys > ye);
        if flip {
            std::mem::swap(&mut xs, &mut xe);
            std::mem::swap(&mut ys, &mut ye);
        }
        if dx >= dy {
            let s = if dx == 0 {
                // C divides 0 by 0 here; the value is never used with t = 0 alone... except
                // that ys + NaN * 0 is NaN, which `(int)` turns into INT_MIN on x86.
                f64::NAN
            } else {
                (ye - ys) as f64 / dx as f64
            };
            for d in 0..=dx {
                let t = if flip { dx - d } else { d };
                u.push(t + xs);
                v.push(c_nan_int(ys as f64 + s * t as f64 + 0.5));
            }
        } else {
            let s = (xe - xs) as f64 / dy as f64;
            for d in 0..=dy {
                let t = if flip { dy - d } else { d };
                v.push(t + ys);
                u.push(c_int(xs as f64 + s * t as f64 + 0.5));
            }
        }
    }
    // Points along the y-boundary, downsampled.
    let (hf, wf) = (f64::from(h), f64::from(w));
    let mut a: Vec<u32> = Vec::with_capacity(u.len() + 1);
    for j in 1..u.len() {
        if u[j] == u[j - 1] {
            continue;
        }
        let xd = if u[j] < u[j - 1] { u[j] } else { u[j] - 1 } as f64;
        let xd = (xd + 0.5) / SCALE - 0.5;
        if xd.floor() != xd || xd < 0.0 || xd > wf - 1.0 {
            continue;
        }
        let yd = if v[j] < v[j - 1] { v[j] } else { v[j - 1] } as f64;
        let mut yd = (yd + 0.5) / SCALE - 0.5;
        if yd < 0.0 {
            yd = 0.0;
        } else if yd > hf {
            yd = hf;
        }
        let yd = yd.ceil();
        let (xi, yi) = (xd as i64, yd as i64);
        a.push((xi * i64::from(h) + yi) as u32);
    }
    // The RLE from the y-boundary points.
    a.push(h.wrapping_mul(w));
    a.sort_unstable();
    let mut p = 0u32;
    for t in a.iter_mut() {
        let cur = *t;
        *t = t.wrapping_sub(p);
        p = cur;
    }
    let mut b: Vec<u32> = Vec::with_capacity(a.len());
    let mut j = 0;
    b.push(a[j]);
    j += 1;
    while j < a.len() {
        if a[j] > 0 {
            b.push(a[j]);
            j += 1;
        } else {
            j += 1;
            if j < a.len() {
                if let Some(last) = b.last_mut() {
                    *last = last.wrapping_add(a[j]);
                }
                j += 1;
            }
        }
    }
    Rle {
        height: h,
        width: w,
        counts: b,
    }
}

/// C's `(int)` of a double on x86-64 (`cvttsd2si`): NaN and out-of-range values become
/// `INT_MIN`.
fn c_nan_int(v: f64) -> i64 {
    if v.is_nan() || v >= 2_147_483_648.0 || v <= -2_147_483_649.0 {
        i64::from(i32::MIN)
    } else {
        v.trunc() as i64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn string_counts_round_trip() {
        let rle = Rle::from_counts(4, 5, vec![3, 4, 0, 2, 11]).unwrap();
        let s = rle.to_counts_string();
        assert_eq!(Rle::from_string(4, 5, s.as_bytes()).unwrap(), rle);
        assert!(Rle::from_string(4, 4, s.as_bytes()).is_err());
        assert!(Rle::from_string(4, 5, b"3~").is_err());
    }

    #[test]
    fn decode_is_column_major_runs() {
        // 2 x 3: zeros 1, ones 2, zeros 3 -> column 0 rows (1), column 1 row 0.
        let rle = Rle::from_counts(2, 3, vec![1, 2, 3]).unwrap();
        assert_eq!(rle.decode(), vec![0, 1, 0, 1, 0, 0]);
        assert_eq!(rle.area(), 2);
    }

    #[test]
    fn square_polygon_covers_its_pixels() {
        let rle = Rle::from_polygon(10, 10, &[2.0, 2.0, 6.0, 2.0, 6.0, 6.0, 2.0, 6.0]).unwrap();
        rle.check().unwrap();
        let m = rle.decode();
        assert_eq!(rle.area(), m.iter().map(|&v| u64::from(v)).sum::<u64>());
        assert!(rle.area() > 9 && rle.area() <= 25, "{}", rle.area());
        assert!(Rle::from_polygon(10, 10, &[1.0, 1.0, 2.0, 2.0]).is_err());
    }

    #[test]
    fn merge_is_the_union() {
        let a = Rle::from_counts(2, 2, vec![0, 1, 3]).unwrap();
        let b = Rle::from_counts(2, 2, vec![3, 1]).unwrap();
        let m = Rle::merge(&[a, b]);
        assert_eq!(m.decode(), vec![1, 0, 0, 1]);
    }
}
