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

    /// Writes the sample's image into `slot` (`rows` x `columns` x 3, row-major): the mapped
    /// output, then `pad` beyond it. `scratch` holds the resampled window between calls.
    pub(crate) fn image_into(
        &self,
        sample: &Sample,
        slot: &mut [u8],
        columns: usize,
        pad: u8,
        scratch: &mut Vec<u8>,
    ) -> Result<(), String> {
        let (sh, sw) = self.source;
        let (x0, xn) = Layout::window(&self.xs);
        let (y0, yn) = Layout::window(&self.ys);
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
                let mut window = std::mem::take(scratch);
                window.clear();
                window.resize(xn as usize * yn as usize * 3, 0);
                let mut work = Vec::new();
                plan.resample_into(
                    &HostImage {
                        pixels: &sample.pixels,
                        width: sw,
                        height: sh,
                        channels: 3,
                    },
                    0,
                    &mut Slot {
                        bytes: &mut window,
                        width: xn,
                        height: yn,
                    },
                    Kernels::detect(),
                    &mut work,
                )
                .map_err(|e| e.to_string())?;
                *scratch = window;
                (&scratch[..], xn as usize)
            }
            _ => (&sample.pixels[..], sw as usize),
        };
        let (wx, wy) = match self.resize {
            Some(_) => (x0 as i32, y0 as i32),
            None => (0, 0),
        };
        let fills: Vec<[u8; 3]> = self.fills.iter().map(|f| f.0).collect();
        let row_bytes = columns * 3;
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
                    px.copy_from_slice(&fills[(-sy.min(sx)) as usize - 1]);
                }
                continue;
            }
            let src = &pixels[(sy - wy) as usize * stride * 3..];
            copy_runs(visible, &self.xs, wx, src, |g| fills[g - 1]);
        }
        Ok(())
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

/// Fills `dst` (one output row of `px`-byte pixels) from `src` (one source row) at the indices
/// `xs` less `offset`, ascending runs copied whole; padding `-g` takes `fill(g)`.
fn copy_runs<const N: usize>(
    dst: &mut [u8],
    xs: &[i32],
    offset: i32,
    src: &[u8],
    fill: impl Fn(usize) -> [u8; N],
) {
    let px = N;
    let mut x = 0;
    while x < xs.len() {
        let v = xs[x];
        if v < 0 {
            dst[x * px..(x + 1) * px].copy_from_slice(&fill((-v) as usize));
            x += 1;
            continue;
        }
        let mut end = x + 1;
        while end < xs.len() && xs[end] == v + (end - x) as i32 {
            end += 1;
        }
        let s = (v - offset) as usize * px;
        if end - x > 8 {
            dst[x * px..end * px].copy_from_slice(&src[s..s + (end - x) * px]);
        } else {
            for k in 0..end - x {
                let one: [u8; N] = src[s + k * N..s + (k + 1) * N].try_into().unwrap_or([0; N]);
                dst[(x + k) * N..(x + k + 1) * N].copy_from_slice(&one);
            }
        }
        x = end;
    }
}
