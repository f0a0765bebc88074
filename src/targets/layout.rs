//! A row's pixels and masks laid out straight into its batch slot: the calls after the first
//! resize (crops, pads, flips) are per-axis index maps, so the image is resampled once over the
//! window the maps keep (Pillow's bilinear, `src/resample`) and every output pixel, mask byte
//! and padding byte is written once, into the batch. The result is byte for byte the one of
//! [`super::Sample::apply`] followed by the copy into the padded batch (tested in
//! `tests/targets.rs`); calls this cannot map (a colour call after a geometric one, a second
//! resize) are applied whole first and the result copied.

use crate::resample::{
    AxisPlan, Filter, HostImage, ImagePlan, Kernels, PassOrder, Resampling, Slot,
};

use super::transform::nearest_indices;
use super::{JointOp, Sample};

/// One axis of the output: each index's place in the resized image (`>= 0`), or the padding
/// of pad call `-v` (`1` the first).
type AxisMap = Vec<i32>;

/// How a row's output comes from its loaded sample.
#[derive(Debug, Clone)]
pub(crate) struct Layout {
    /// The size the source is resized to first (rows, columns), when it is.
    resize: Option<(u32, u32)>,
    /// The source's size.
    source: (u32, u32),
    /// Output columns.
    xs: AxisMap,
    /// Output rows.
    ys: AxisMap,
    /// Each pad call's image fill and semantic fill.
    fills: Vec<([u8; 3], u8)>,
}

impl Layout {
    /// The identity over a `width` x `height` sample.
    pub(crate) fn identity(width: u32, height: u32) -> Layout {
        Layout {
            resize: None,
            source: (height, width),
            xs: (0..width as i32).collect(),
            ys: (0..height as i32).collect(),
            fills: Vec::new(),
        }
    }

    /// The layout of `ops` on a `width` x `height` source and the leading colour calls, or
    /// `None` when the calls cannot be mapped (then they are applied whole).
    pub(crate) fn plan(ops: &[JointOp], width: u32, height: u32) -> Option<(Layout, usize)> {
        let lead = ops
            .iter()
            .take_while(|o| matches!(o, JointOp::Color(_) | JointOp::PermuteChannels(_)))
            .count();
        let mut layout = Layout::identity(width, height);
        for (k, op) in ops[lead..].iter().enumerate() {
            match *op {
                JointOp::Resize {
                    height: h,
                    width: w,
                } if k == 0 && h > 0 && w > 0 => {
                    if (w, h) != (width, height) {
                        layout.resize = Some((h, w));
                        layout.xs = (0..w as i32).collect();
                        layout.ys = (0..h as i32).collect();
                    }
                }
                JointOp::Crop {
                    top,
                    left,
                    height: h,
                    width: w,
                }
                | JointOp::IouCrop {
                    top,
                    left,
                    height: h,
                    width: w,
                } => {
                    let (t, l, h, w) = (top as usize, left as usize, h as usize, w as usize);
                    if t + h > layout.ys.len() || l + w > layout.xs.len() {
                        return None;
                    }
                    layout.xs = layout.xs[l..l + w].to_vec();
                    layout.ys = layout.ys[t..t + h].to_vec();
                }
                JointOp::Pad {
                    left,
                    top,
                    right,
                    bottom,
                    fill,
                    mask_fill,
                } => {
                    layout.fills.push((fill, mask_fill));
                    let g = -(layout.fills.len() as i32);
                    let grow = |m: &AxisMap, a: u32, b: u32| {
                        let mut out = vec![g; a as usize];
                        out.extend_from_slice(m);
                        out.resize(out.len() + b as usize, g);
                        out
                    };
                    layout.xs = grow(&layout.xs, left, right);
                    layout.ys = grow(&layout.ys, top, bottom);
                }
                JointOp::HorizontalFlip => layout.xs.reverse(),
                JointOp::Sanitize => {}
                JointOp::Resize { .. } | JointOp::Color(_) | JointOp::PermuteChannels(_) => {
                    return None
                }
            }
        }
        layout.source = (height, width);
        Some((layout, lead))
    }

    /// Bytes of the source's pixels (RGB8).
    pub(crate) fn source_len(&self) -> usize {
        self.source.0 as usize * self.source.1 as usize * 3
    }

    /// The source's size (rows, columns): its masks' planes.
    pub(crate) fn source_size(&self) -> (u32, u32) {
        self.source
    }

    /// Each pad call's semantic fill, in call order (pad call `g` is the `g`-th).
    pub(crate) fn semantic_fills(&self) -> impl Iterator<Item = u8> + '_ {
        self.fills.iter().map(|f| f.1)
    }

    /// The output's size (rows, columns).
    pub(crate) fn size(&self) -> (u32, u32) {
        (self.ys.len() as u32, self.xs.len() as u32)
    }

    /// The resized image's kept window on one axis: its first index and length.
    fn window(map: &[i32]) -> (u32, u32) {
        let kept = map.iter().filter(|&&v| v >= 0);
        let lo = kept.clone().min().copied().unwrap_or(0);
        let hi = kept.max().copied().unwrap_or(-1);
        (lo as u32, (hi - lo + 1).max(0) as u32)
    }

    /// Whether the output is one stretch of the resized image, `[x0, x0 + xn)` x `[y0, y0 + yn)`,
    /// with no padding, its columns ascending (`Some(false)`) or mirrored (`Some(true)`).
    fn straight(&self, (x0, xn): (u32, u32), (y0, yn): (u32, u32)) -> Option<bool> {
        let (x0, y0) = (x0 as i32, y0 as i32);
        let rows = self.ys.len() == yn as usize
            && self.ys.iter().enumerate().all(|(i, &v)| v == y0 + i as i32);
        if !rows || self.xs.len() != xn as usize {
            return None;
        }
        let last = x0 + xn as i32 - 1;
        if self.xs.iter().enumerate().all(|(i, &v)| v == x0 + i as i32) {
            Some(false)
        } else if self
            .xs
            .iter()
            .enumerate()
            .all(|(i, &v)| v == last - i as i32)
        {
            Some(true)
        } else {
            None
        }
    }

    /// Writes the sample's image into `slot` (`rows` x `columns` x 3, row-major): the mapped
    /// output, then `pad` beyond it. A resized output that is one stretch of the resized image
    /// (a resize, a crop inside it, a flip) is resampled straight into the slot; otherwise the
    /// kept window is resampled into `scratch` and copied from there.
    pub(crate) fn image_into(
        &self,
        sample: &Sample,
        slot: &mut [u8],
        columns: usize,
        pad: u8,
        scratch: &mut LayoutScratch,
    ) -> Result<(), String> {
        let (sh, sw) = self.source;
        let (x0, xn) = Layout::window(&self.xs);
        let (y0, yn) = Layout::window(&self.ys);
        let source = HostImage {
            pixels: &sample.pixels,
            width: sw,
            height: sh,
            channels: 3,
        };
        let row_bytes = columns * 3;
        let (pixels, stride) = match self.resize {
            Some((rh, rw)) if xn > 0 && yn > 0 => {
                let axis = |src: u32, resized: u32, first: u32, len: u32| AxisPlan {
                    src_len: src,
                    resized,
                    out_first: first,
                    out_len: len,
                    ..AxisPlan::default()
                };
                let mut plan = ImagePlan::default();
                plan.plan(
                    &axis(sw, rw, x0, xn),
                    &axis(sh, rh, y0, yn),
                    Resampling::Filter(Filter::Bilinear),
                    PassOrder::default(),
                )
                .map_err(|e| e.to_string())?;
                // Straight into the slot (the padding around the kept rectangle filled by the
                // resample), or the kept window into the thread's buffer, copied below.
                let straight = self.straight((x0, xn), (y0, yn));
                let len = xn as usize * yn as usize * 3;
                let rows = slot.len().checked_div(row_bytes).unwrap_or(0);
                if straight.is_none() && scratch.window.len() < len {
                    scratch.window.resize(len, 0);
                }
                let mut into = match straight {
                    Some(_) => Slot {
                        bytes: &mut *slot,
                        width: columns as u32,
                        height: rows as u32,
                    },
                    None => Slot {
                        bytes: &mut scratch.window[..len],
                        width: xn,
                        height: yn,
                    },
                };
                plan.resample_into(
                    &source,
                    pad,
                    &mut into,
                    Kernels::detect(),
                    &mut scratch.work,
                )
                .map_err(|e| e.to_string())?;
                if let Some(mirrored) = straight {
                    if mirrored {
                        for row in slot.chunks_exact_mut(row_bytes).take(yn as usize) {
                            mirror_pixels(&mut row[..xn as usize * 3]);
                        }
                    }
                    return Ok(());
                }
                (&scratch.window[..len], xn as usize)
            }
            _ => (&sample.pixels[..], sw as usize),
        };
        let (wx, wy) = match self.resize {
            Some(_) => (x0 as i32, y0 as i32),
            None => (0, 0),
        };
        let runs = runs(&self.xs);
        let out_w = self.xs.len();
        for (y, row) in slot.chunks_exact_mut(row_bytes).enumerate() {
            let Some(&sy) = self.ys.get(y) else {
                row.fill(pad);
                continue;
            };
            let (visible, rest) = row.split_at_mut(out_w * 3);
            rest.fill(pad);
            if sy < 0 {
                for (px, &sx) in visible.chunks_exact_mut(3).zip(&self.xs) {
                    px.copy_from_slice(&self.fills[(-sy.min(sx)) as usize - 1].0);
                }
                continue;
            }
            let src = &pixels[(sy - wy) as usize * stride * 3..];
            for run in &runs {
                let dst = &mut visible[run.dst * 3..(run.dst + run.len) * 3];
                match run.kind {
                    RunKind::Fill(g) => {
                        let fill = self.fills[g - 1].0;
                        for px in dst.chunks_exact_mut(3) {
                            px.copy_from_slice(&fill);
                        }
                    }
                    RunKind::Ascending(v) => {
                        let s = (v - wx) as usize * 3;
                        dst.copy_from_slice(&src[s..s + run.len * 3]);
                    }
                    RunKind::Descending(v) => {
                        let s = (v - wx) as usize * 3 + 3 - run.len * 3;
                        dst.copy_from_slice(&src[s..s + run.len * 3]);
                        mirror_pixels(dst);
                    }
                }
            }
        }
        Ok(())
    }

    /// The row as the device's resize writes it (`src/cuda/resize`), when it is one rectangle
    /// of the resized image, ascending or mirrored, inside padding of one colour: `None` for
    /// an output of padding only, of runs cut apart, or of pads of different colours.
    pub(crate) fn placement(&self) -> Option<Placement> {
        let (sh, sw) = self.source;
        let (rh, rw) = self.resize.unwrap_or(self.source);
        let (x, flip) = single_run(&self.xs)?;
        let (y, flipped_rows) = single_run(&self.ys)?;
        if flipped_rows {
            return None;
        }
        let (lead, xn) = (x.dst as u32, x.len as u32);
        let (top, yn) = (y.dst as u32, y.len as u32);
        let first = |kind: RunKind, len: u32| match kind {
            RunKind::Ascending(v) => v as u32,
            RunKind::Descending(v) => v as u32 + 1 - len,
            RunKind::Fill(_) => 0,
        };
        let (valid_w, valid_h) = (self.xs.len() as u32, self.ys.len() as u32);
        let fills: Vec<[u8; 3]> = (self.xs.iter().chain(&self.ys))
            .filter(|&&v| v < 0)
            .map(|&v| self.fills[(-v) as usize - 1].0)
            .collect();
        if fills.windows(2).any(|w| w[0] != w[1]) {
            return None;
        }
        let axis = |src: u32, resized: u32, out_first: u32, out_len: u32, at: u32| AxisPlan {
            src_len: src,
            resized,
            out_first,
            out_len,
            dst_offset: at,
            ..AxisPlan::default()
        };
        // Mirrored, the kept columns start where the unmirrored output had them.
        let left = if flip { valid_w - lead - xn } else { lead };
        Some(Placement {
            x: axis(sw, rw, first(x.kind, xn), xn, left),
            y: axis(sh, rh, first(y.kind, yn), yn, top),
            flip,
            fill: fills.first().copied(),
            valid: (valid_h, valid_w),
        })
    }

    /// Each output index's source index on a mask (PyTorch's `nearest` after a resize), or the
    /// padding's `-v`.
    fn mask_map(map: &[i32], source: u32, resized: Option<u32>) -> AxisMap {
        let Some(resized) = resized else {
            return map.to_vec();
        };
        let near = nearest_indices(source, resized, 0, resized);
        map.iter()
            .map(|&v| if v < 0 { v } else { near[v as usize] as i32 })
            .collect()
    }

    /// Each mask axis map: (columns, rows).
    pub(crate) fn mask_maps(&self) -> (AxisMap, AxisMap) {
        let (sh, sw) = self.source;
        (
            Layout::mask_map(&self.xs, sw, self.resize.map(|r| r.1)),
            Layout::mask_map(&self.ys, sh, self.resize.map(|r| r.0)),
        )
    }

    /// Writes one source mask plane (the source's size) into `out` (`rows` x `columns`): the
    /// mapped output, `pad_fill` (instance masks 0, or each pad call's semantic fill when
    /// `semantic`), then `beyond` past the output. Rows repeated by the resize are copied, and
    /// an instance mask's empty source rows are written as zeros without a lookup.
    pub(crate) fn mask_into(
        &self,
        maps: &(AxisMap, AxisMap),
        plane: &[u8],
        out: &mut [u8],
        (columns, semantic, beyond): (usize, bool, u8),
    ) {
        let (xs, ys) = maps;
        let sw = self.source.1 as usize;
        let fill = |g: usize| -> u8 {
            if semantic {
                self.fills[g - 1].1
            } else {
                0
            }
        };
        let (m0, m1) = middle(xs);
        let mid: Vec<usize> = xs[m0..m1].iter().map(|&v| v as usize).collect();
        let out_w = xs.len();
        let mut last: Option<(usize, i32)> = None;
        for y in 0..out.len() / columns.max(1) {
            let start = y * columns;
            let Some(&sy) = ys.get(y) else {
                out[start..start + columns].fill(beyond);
                continue;
            };
            if let Some((prev, psy)) = last {
                if psy == sy {
                    out.copy_within(prev..prev + columns, start);
                    continue;
                }
            }
            last = Some((start, sy));
            let row = &mut out[start..start + columns];
            let (visible, rest) = row.split_at_mut(out_w);
            rest.fill(beyond);
            if sy < 0 {
                for (b, &sx) in visible.iter_mut().zip(xs) {
                    *b = fill((-sy.min(sx)) as usize);
                }
                continue;
            }
            let src = &plane[sy as usize * sw..(sy as usize + 1) * sw];
            for (b, &sx) in visible[..m0].iter_mut().zip(&xs[..m0]) {
                *b = fill((-sx) as usize);
            }
            for (b, &sx) in visible[m1..].iter_mut().zip(&xs[m1..]) {
                *b = fill((-sx) as usize);
            }
            let dst = &mut visible[m0..m1];
            if !semantic && src.iter().all(|&v| v == 0) {
                dst.fill(0);
            } else {
                for (b, &sx) in dst.iter_mut().zip(&mid) {
                    *b = src.get(sx).copied().unwrap_or(0);
                }
            }
        }
    }
}

/// The part of an axis map between its leading and trailing padding: `[first, end)` (pads
/// only add indices at the ends, and crops and flips keep them there).
fn middle(map: &[i32]) -> (usize, usize) {
    let first = map.iter().position(|&v| v >= 0).unwrap_or(map.len());
    let end = map.iter().rposition(|&v| v >= 0).map_or(first, |e| e + 1);
    (first, end)
}

/// What a run of output columns holds.
#[derive(Debug, Clone, Copy, PartialEq)]
enum RunKind {
    /// The fill of pad call `g` (`1` the first).
    Fill(usize),
    /// Source columns ascending from this one.
    Ascending(i32),
    /// Source columns descending from this one.
    Descending(i32),
}

/// A stretch of output columns: `len` of them from `dst`.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Run {
    dst: usize,
    len: usize,
    kind: RunKind,
}

/// An axis map cut into runs (one pad call's fill, or consecutive source columns either way),
/// found once for all the rows an image's map serves.
fn runs(map: &[i32]) -> Vec<Run> {
    let mut out: Vec<Run> = Vec::new();
    for (x, &v) in map.iter().enumerate() {
        if let Some(last) = out.last_mut() {
            let len = last.len as i32;
            let next = match last.kind {
                RunKind::Fill(g) if v == -(g as i32) => Some(last.kind),
                RunKind::Ascending(first) if v >= 0 && v == first + len => Some(last.kind),
                // A one-column run turns descending when the next column is the one before it.
                RunKind::Ascending(first) if v >= 0 && len == 1 && v == first - 1 => {
                    Some(RunKind::Descending(first))
                }
                RunKind::Descending(first) if v >= 0 && v == first - len => Some(last.kind),
                _ => None,
            };
            if let Some(kind) = next {
                last.kind = kind;
                last.len += 1;
                continue;
            }
        }
        let kind = if v < 0 {
            RunKind::Fill((-v) as usize)
        } else {
            RunKind::Ascending(v)
        };
        out.push(Run {
            dst: x,
            len: 1,
            kind,
        });
    }
    out
}

/// The one run of source indices of an axis map between its fills, and whether it descends;
/// `None` when there is none or more than one.
fn single_run(map: &[i32]) -> Option<(Run, bool)> {
    let mut kept = runs(map)
        .into_iter()
        .filter(|r| !matches!(r.kind, RunKind::Fill(_)));
    let run = kept.next()?;
    if kept.next().is_some() {
        return None;
    }
    Some((run, matches!(run.kind, RunKind::Descending(_))))
}

/// A row as the device's resize writes it: the kept window of the resize (the plans' source
/// and resized lengths, first kept sample and count) at its place in the row's valid
/// rectangle, the rest of which is `fill`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Placement {
    /// Columns: the resize, the kept window, where it lands (before a mirror).
    pub(crate) x: AxisPlan,
    /// Rows: the same.
    pub(crate) y: AxisPlan,
    /// Whether the valid rectangle is mirrored left to right.
    pub(crate) flip: bool,
    /// The colour of the valid rectangle around the kept window, when there is any.
    pub(crate) fill: Option<[u8; 3]>,
    /// The valid rectangle (rows, columns).
    pub(crate) valid: (u32, u32),
}

/// Reverses the order of the 3-byte pixels of `row`.
fn mirror_pixels(row: &mut [u8]) {
    row.reverse();
    for px in row.chunks_exact_mut(3) {
        px.swap(0, 2);
    }
}

/// Buffers [`Layout::image_into`] reuses from row to row: the resampled window and the
/// resampling's intermediate.
#[derive(Debug, Default)]
pub(crate) struct LayoutScratch {
    window: Vec<u8>,
    work: Vec<u8>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(dst: usize, len: usize, kind: RunKind) -> Run {
        Run { dst, len, kind }
    }

    #[test]
    fn maps_cut_into_fills_and_runs_either_way() {
        use RunKind::*;
        // Pad call 1, four columns up, pad call 2.
        assert_eq!(
            runs(&[-1, -1, 5, 6, 7, 8, -2]),
            [
                run(0, 2, Fill(1)),
                run(2, 4, Ascending(5)),
                run(6, 1, Fill(2))
            ]
        );
        // A flip: one descending run; a lone column stays ascending.
        assert_eq!(
            runs(&[9, 8, 7, 3]),
            [run(0, 3, Descending(9)), run(3, 1, Ascending(3))]
        );
        // A jump ends a run; a turn after two columns starts another.
        assert_eq!(
            runs(&[0, 1, 0, 4, 3]),
            [
                run(0, 2, Ascending(0)),
                run(2, 1, Ascending(0)),
                run(3, 2, Descending(4))
            ]
        );
        // Column 0 does not continue into pad call 1 (-1) descending.
        assert_eq!(
            runs(&[1, 0, -1]),
            [run(0, 2, Descending(1)), run(2, 1, Fill(1))]
        );
        assert!(runs(&[]).is_empty());
    }

    #[test]
    fn mirrored_pixels_keep_their_channels() {
        let mut row = [1, 2, 3, 4, 5, 6, 7, 8, 9];
        mirror_pixels(&mut row);
        assert_eq!(row, [7, 8, 9, 4, 5, 6, 1, 2, 3]);
    }
}
