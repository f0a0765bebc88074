//! timm's NaFlex training semantics (`timm/data/naflex_transforms.py`, `naflex_dataset.py`),
//! with gpufeed's draws in place of Python's and torch's random generators.
//!
//! Reproduced computation for computation, given the drawn numbers:
//!
//! - `get_image_size_for_seq`: the bisection on the scale (`f64`, tolerance 1e-5 from 1e-6 to
//!   100) for the largest patch grid of at most `max_seq_len` patches, each side
//!   `patch * ceil(side * ratio / patch)`, at least one patch ([`size_for_seq`]);
//! - `RandomResizedCropToSequence.get_params`: ten tries of an area `A * U(scale)` and an aspect
//!   ratio `(w / h) * exp(U(log ratio))` (the ratio range is relative to the image's own),
//!   `crop_h = round(sqrt(area / aspect))`, `crop_w = round(sqrt(area * aspect))` (Python's
//!   round), kept if it fits, at `randint(0, H - crop_h)`, `randint(0, W - crop_w)`; else the
//!   centre fallback with the ratio clamped; then the crop's size for the sequence length
//!   (`draw_crop`). The crop is cut, then resized (`F.resized_crop` on a PIL image: Pillow's
//!   resize, which the resampler reproduces bit for bit);
//! - `RandomHorizontalFlip`: `torch.rand(1) < p`, after the crop;
//! - `calculate_naflex_batch_size`: `floor(tokens_per_batch / seq_len / divisor) * divisor`,
//!   at least 1, at most the images left ([`batch_size`]);
//! - `NaFlexMapDatasetWrapper`'s schedule: a canonical list of (sequence length, batch size)
//!   drawn once from the seed until the epoch's images are covered, its order shuffled anew each
//!   epoch, the epoch's images (in the epoch's order) dealt to the batches in turn
//!   ([`NaflexSchedule`]).
//!
//! What differs: the numbers themselves. Python's `random` and torch's generator are replaced
//! by gpufeed's streams: image `i` of epoch `e` draws its crop and flip from (seed, e, i) alone;
//! the canonical schedule from the seed alone; epoch `e`'s order of it from (seed, e). So the
//! sequence length and size of batch `b` of epoch `e` depend on (seed, e, b) and the number of
//! images, and a saved position (epoch, batches done) resumes exactly. timm's `final_scale_range`
//! (off by default) and its `'random'` interpolation are not offered; colour jitter and the
//! other augmentations of timm's training transform are separate options.

use crate::options::DrawRange;
use crate::random::Draws;

use super::PatchError;

/// The bisection's tolerance (`eps` of the reference).
const EPS: f64 = 1e-5;

/// `get_image_size_for_seq((height, width), (patch, patch), max_seq_len)` with
/// `divisible_by_patch=True` and no `max_ratio`: the scale and the resized `(height, width)`.
pub fn size_for_seq(
    height: u32,
    width: u32,
    patch: u32,
    max_seq_len: u32,
) -> Result<(f64, (u32, u32)), PatchError> {
    let p = f64::from(patch);
    let target = |ratio: f64| -> (u64, u64) {
        let side = |size: u32| {
            let scaled = p * ((f64::from(size) * ratio) / p).ceil();
            scaled.max(p) as u64
        };
        (side(height), side(width))
    };
    let feasible = |ratio: f64| {
        let (th, tw) = target(ratio);
        (th / u64::from(patch)) * (tw / u64::from(patch)) <= u64::from(max_seq_len)
    };
    let (mut lb, mut rb) = (EPS / 10.0, 100.0);
    while rb - lb >= EPS {
        let mid = (lb + rb) / 2.0;
        if feasible(mid) {
            lb = mid;
        } else {
            rb = mid;
        }
    }
    if lb <= EPS {
        return Err(PatchError::NoScale { width, height });
    }
    let (th, tw) = target(lb);
    let side = |v: u64| u32::try_from(v).map_err(|_| PatchError::TooLarge { side: v });
    Ok((lb, (side(th)?, side(tw)?)))
}

/// A crop drawn for one image: the box of the source image (`F.resized_crop`'s `top`, `left`,
/// `height`, `width`), the size it is resized to, and whether it is mirrored after.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NaflexCrop {
    /// First row of the box.
    pub top: u32,
    /// First column of the box.
    pub left: u32,
    /// Rows of the box.
    pub height: u32,
    /// Columns of the box.
    pub width: u32,
    /// Rows of the resized crop, a multiple of the patch.
    pub resized_height: u32,
    /// Columns of the resized crop, a multiple of the patch.
    pub resized_width: u32,
    /// Mirrored left to right after the resize.
    pub flipped: bool,
}

/// Uniform in `[from, to)` as Python's `random.uniform` computes it: `a + (b - a) * u`, with `u`
/// 53 random bits.
fn uniform(draws: &mut Draws, from: f64, to: f64) -> f64 {
    let u = (draws.next() >> 11) as f64 * (1.0 / (1u64 << 53) as f64);
    from + (to - from) * u
}

/// `int(round(v))` for a non-negative float: ties to even.
fn round_even(v: f64) -> u64 {
    v.round_ties_even() as u64
}

/// `RandomResizedCropToSequence.get_params` then `RandomHorizontalFlip` for a `width` x
/// `height` image and a sequence of `max_seq_len` patches, from `draws`.
pub(crate) fn draw_crop(
    width: u32,
    height: u32,
    patch: u32,
    max_seq_len: u32,
    (scale, ratio, flip): (DrawRange, DrawRange, f64),
    draws: &mut Draws,
) -> Result<NaflexCrop, PatchError> {
    if width == 0 || height == 0 {
        return Err(PatchError::Empty);
    }
    let (w, h) = (u64::from(width), u64::from(height));
    let area = (w * h) as f64;
    let orig_aspect = w as f64 / h as f64;
    let log_ratio = (ratio.min.ln(), ratio.max.ln());
    let mut found = None;
    for _ in 0..10 {
        let target_area = area * uniform(draws, scale.min, scale.max);
        let aspect = orig_aspect * uniform(draws, log_ratio.0, log_ratio.1).exp();
        let crop_h = round_even((target_area / aspect).sqrt());
        let crop_w = round_even((target_area * aspect).sqrt());
        if 0 < crop_w && crop_w <= w && 0 < crop_h && crop_h <= h {
            let top = draws.below(h - crop_h + 1);
            let left = draws.below(w - crop_w + 1);
            found = Some((top, left, crop_h, crop_w));
            break;
        }
    }
    let (top, left, crop_h, crop_w) = found.unwrap_or_else(|| {
        let (min_aspect, max_aspect) = (orig_aspect * ratio.min, orig_aspect * ratio.max);
        let (cw, ch) = if orig_aspect < min_aspect {
            (w, round_even(w as f64 / min_aspect).min(h))
        } else if orig_aspect > max_aspect {
            (round_even(h as f64 * max_aspect).min(w), h)
        } else {
            (w, h)
        };
        let (cw, ch) = (cw.max(1), ch.max(1));
        ((h - ch) / 2, (w - cw) / 2, ch, cw)
    });
    let (crop_h, crop_w) = (crop_h as u32, crop_w as u32);
    let (_, (resized_height, resized_width)) = size_for_seq(crop_h, crop_w, patch, max_seq_len)?;
    let flipped = f64::from(draws.uniform_f32(0.0, 1.0)) < flip;
    Ok(NaflexCrop {
        top: top as u32,
        left: left as u32,
        height: crop_h,
        width: crop_w,
        resized_height,
        resized_width,
        flipped,
    })
}

/// `calculate_naflex_batch_size(tokens_per_batch, seq_len, max_size=left, divisor,
/// rounding='floor')`.
pub fn batch_size(tokens_per_batch: u64, seq_len: u32, left: usize, divisor: u32) -> usize {
    let raw = tokens_per_batch as f64 / f64::from(seq_len);
    let size = if divisor > 1 {
        (raw / f64::from(divisor)).floor() as usize * divisor as usize
    } else {
        raw as usize
    };
    size.max(1).min(left).max(1)
}

/// Mixes `seed` so the schedule's streams are unrelated to the images' own.
const SCHEDULE_SALT: u64 = 0x6E61_666C_6578_5343;

/// One epoch plan of batches for timm's NaFlex training: a canonical list of (sequence length,
/// batch size), drawn once from the seed so that every epoch has the same number of batches,
/// dealt in an order drawn per epoch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NaflexSchedule {
    seed: u64,
    /// (sequence length, batch size) in canonical order; the sizes add up to the images.
    canonical: Vec<(u32, usize)>,
}

impl NaflexSchedule {
    /// The canonical schedule of `images` images an epoch: `_create_canonical_schedule` with
    /// the draws of `seed`.
    pub fn new(
        seed: u64,
        images: usize,
        seq_lens: &[u32],
        tokens_per_batch: u64,
        divisor: u32,
    ) -> Result<NaflexSchedule, PatchError> {
        let mut lens = seq_lens.to_vec();
        lens.sort_unstable();
        lens.dedup();
        if lens.is_empty() || lens[0] == 0 {
            return Err(PatchError::NoSequenceLength);
        }
        let mut draws = Draws::for_image(seed ^ SCHEDULE_SALT, 0, 0);
        let mut canonical = Vec::new();
        let mut left = images;
        while left > 0 {
            let seq_len = lens[draws.below(lens.len() as u64) as usize];
            let size = batch_size(tokens_per_batch, seq_len, left, divisor);
            canonical.push((seq_len, size));
            left -= size;
        }
        Ok(NaflexSchedule { seed, canonical })
    }

    /// Batches an epoch: the same every epoch (timm's `len()`).
    pub fn len(&self) -> usize {
        self.canonical.len()
    }

    /// The most images of any batch: what a batch's memory is sized for.
    pub fn largest(&self) -> usize {
        self.canonical
            .iter()
            .map(|&(_, size)| size)
            .max()
            .unwrap_or(0)
    }

    /// Whether an epoch has no batch (no image).
    pub fn is_empty(&self) -> bool {
        self.canonical.is_empty()
    }

    /// The batches of `epoch` in order: (sequence length, batch size, position of its first
    /// image in the epoch's order of images).
    pub fn epoch(&self, epoch: u64) -> Vec<NaflexBatch> {
        let mut order: Vec<usize> = (0..self.canonical.len()).collect();
        let mut draws = Draws::for_image(self.seed ^ SCHEDULE_SALT, epoch, 1);
        // Fisher-Yates, from the last place down.
        for i in (1..order.len()).rev() {
            let j = draws.below(i as u64 + 1) as usize;
            order.swap(i, j);
        }
        let mut first = 0;
        order
            .into_iter()
            .map(|k| {
                let (seq_len, size) = self.canonical[k];
                let batch = NaflexBatch {
                    seq_len,
                    size,
                    first,
                };
                first += size;
                batch
            })
            .collect()
    }
}

/// One batch of an epoch of [`NaflexSchedule`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NaflexBatch {
    /// The sequence length its images are cropped to and padded to.
    pub seq_len: u32,
    /// Its images.
    pub size: usize,
    /// Where its first image stands in the epoch's order.
    pub first: usize,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::options::{RANDOM_CROP_RATIO, RANDOM_CROP_SCALE};

    #[test]
    fn sequence_sizes_match_timm() {
        // Printed by timm 1.0.31's get_image_size_for_seq (patch 16).
        let cases = [
            ((300, 451), 576, (304, 464)),
            ((37, 53), 576, (320, 448)),
            ((1, 1), 576, (112, 112)),
            ((3000, 4000), 576, (336, 432)),
            ((50, 10000), 576, (32, 4608)),
            ((14, 14), 576, (384, 384)),
            ((1080, 1920), 576, (288, 512)),
            ((13, 2600), 576, (32, 4608)),
            ((300, 451), 128, (144, 224)),
            ((50, 10000), 128, (16, 2048)),
            ((1080, 1920), 128, (128, 240)),
        ];
        for ((h, w), n, want) in cases {
            assert_eq!(
                size_for_seq(h, w, 16, n).expect("size").1,
                want,
                "{h}x{w} at {n}"
            );
        }
        let (ratio, _) = size_for_seq(300, 451, 16, 576).expect("size");
        assert_eq!(ratio, 1.0133276347641944);
    }

    #[test]
    fn crops_fit_their_sequence_and_depend_on_their_stream_alone() {
        let ranges = (RANDOM_CROP_SCALE, RANDOM_CROP_RATIO, 0.5);
        let mut flips = 0;
        for i in 0..2000u64 {
            let (w, h) = (50 + (i * 37 % 2000) as u32, 40 + (i * 53 % 1500) as u32);
            let seq = [128, 256, 576, 784, 1024][(i % 5) as usize];
            let c = draw_crop(
                w,
                h,
                16,
                seq,
                ranges,
                &mut Draws::for_image(3, 1, i as usize),
            )
            .expect("crop");
            let again = draw_crop(
                w,
                h,
                16,
                seq,
                ranges,
                &mut Draws::for_image(3, 1, i as usize),
            );
            assert_eq!(Ok(c), again);
            assert!(
                c.left + c.width <= w && c.top + c.height <= h,
                "{c:?} in {w}x{h}"
            );
            assert_eq!(c.resized_height % 16, 0);
            let tokens = (c.resized_height / 16) * (c.resized_width / 16);
            assert!(tokens <= seq && tokens > 0, "{tokens} tokens for {seq}");
            flips += u32::from(c.flipped);
        }
        assert!((900..1100).contains(&flips), "{flips} of 2000 flipped");
    }

    #[test]
    fn batch_sizes_follow_the_token_budget() {
        // timm's create_naflex_loader: tokens = batch_size (32) * max(seq_lens) (1024), divisor 8.
        let tokens = 32 * 1024;
        assert_eq!(batch_size(tokens, 128, 10_000, 8), 256);
        assert_eq!(batch_size(tokens, 576, 10_000, 8), 56);
        assert_eq!(batch_size(tokens, 784, 10_000, 8), 40);
        assert_eq!(batch_size(tokens, 1024, 10_000, 8), 32);
        assert_eq!(batch_size(tokens, 1024, 5, 8), 5, "at most the images left");
        assert_eq!(batch_size(100, 1024, 5, 8), 1, "at least one");
        assert_eq!(batch_size(tokens, 576, 10_000, 1), 56);
    }

    #[test]
    fn the_schedule_covers_every_image_with_the_same_batches_each_epoch() {
        let lens = [128, 256, 576, 784, 1024];
        let s = NaflexSchedule::new(42, 10_007, &lens, 32 * 1024, 8).expect("schedule");
        let total: usize = s.canonical.iter().map(|b| b.1).sum();
        assert_eq!(total, 10_007);
        let (a, b) = (s.epoch(0), s.epoch(1));
        assert_eq!((a.len(), b.len()), (s.len(), s.len()));
        assert_ne!(a, b, "each epoch deals the batches in its own order");
        for epoch in [a, b] {
            let mut next = 0;
            for batch in &epoch {
                assert_eq!(batch.first, next);
                assert!(lens.contains(&batch.seq_len));
                assert!(
                    batch.size as u64 * u64::from(batch.seq_len) <= 32 * 1024 || batch.size == 1
                );
                next += batch.size;
            }
            assert_eq!(next, 10_007);
        }
        assert_eq!(s.epoch(3), s.epoch(3), "an epoch's plan is drawn, not kept");
        assert!(NaflexSchedule::new(1, 10, &[], 100, 8).is_err());
        assert!(NaflexSchedule::new(1, 10, &[0, 16], 100, 8).is_err());
        assert!(NaflexSchedule::new(1, 0, &[16], 100, 8)
            .expect("empty")
            .is_empty());
    }
}
