//! The augmentations of modern training recipes, on the `u8` batch after the resize and before
//! the normalize: torchvision v2's automatic policies ([`Augment`]: `TrivialAugmentWide`,
//! `RandAugment`, `AutoAugment`), [`ColorJitter`], [`RandomErasing`], and across the batch
//! `MixUp` and `CutMix` ([`Mix`]) with soft labels.
//!
//! Pure: what each image draws (`AugmentPlan`, from (seed, epoch, source index) alone, like
//! the crops) and what each batch draws (from (seed, epoch, batch number)), the operations as
//! torchvision's functional calls ([`Op`]), and the CPU rendition of the kernels
//! (`kernels/augment.cu`), bit for bit: the oracle the kernels are tested against and what the
//! CPU device runs.

mod mix;
mod ops;
mod policy;

use rayon::prelude::*;

pub use crate::options::{
    Augment, AugmentOptions, ColorJitter, RandomErasing, Recipe, ERASE_TO_MEAN,
    MAX_RAND_AUGMENT_OPS,
};
pub use mix::Mix;
pub use ops::Op;

pub(crate) use mix::{mix_normalize, soft_labels};
pub(crate) use ops::KernelOp;

use crate::error::{Error, Result};
use crate::random::Draws;

impl RandomErasing {
    /// RandomErasing's draws for an image of `width` x `height`: `torch.rand(1) < p`, then
    /// ten tries of an area and a log-uniform ratio (float32 draws) for a box
    /// `h = round(sqrt(area * ratio))`, `w = round(sqrt(area / ratio))` smaller than the
    /// image, at `randint(0, H - h + 1)`, `randint(0, W - w + 1)`.
    fn draw(&self, width: u32, height: u32, draws: &mut Draws) -> Option<Op> {
        if draws.uniform_f32(0.0, 1.0) >= self.p as f32 {
            return None;
        }
        let area = f64::from(width) * f64::from(height);
        let log_ratio = ((self.ratio.min as f32).ln(), (self.ratio.max as f32).ln());
        for _ in 0..10 {
            let erase_area =
                area * f64::from(draws.uniform_f32(self.scale.min as f32, self.scale.max as f32));
            let aspect = f64::from(draws.uniform_f32(log_ratio.0, log_ratio.1).exp());
            let h = (erase_area * aspect).sqrt().round_ties_even() as u64;
            let w = (erase_area / aspect).sqrt().round_ties_even() as u64;
            if !(h < u64::from(height) && w < u64::from(width)) {
                continue;
            }
            let i = draws.below(u64::from(height) - h + 1) as u32;
            let j = draws.below(u64::from(width) - w + 1) as u32;
            return Some(Op::Erase {
                i,
                j,
                h: h as u32,
                w: w as u32,
                v: self.value,
            });
        }
        None
    }
}

/// Salts that keep the augmentations' streams apart from the crops' (same seed, epoch and
/// index) and from each other.
const IMAGE_SALT: u64 = 0x6A09_E667_F3BC_C908;
const BATCH_SALT: u64 = 0xBB67_AE85_84CA_A73B;

/// What one image's augmentations drew: torchvision's functional calls, in order.
pub type ImageOps = Vec<Op>;

/// The draws of a pipeline's augmentations: the options, the seed and the output size.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Augmenter {
    pub options: AugmentOptions,
    pub seed: u64,
    pub width: u32,
    pub height: u32,
}

impl Augmenter {
    /// The calls image `index` of `epoch` draws: the colour jitter's (in its random order), the
    /// policy's, the erasing.
    pub fn image_ops(&self, index: usize, epoch: u64) -> ImageOps {
        let mut draws = Draws::for_image(self.seed ^ IMAGE_SALT, epoch, index);
        let mut ops = Vec::new();
        let o = &self.options;
        if o.color_jitter.is_on() {
            // torch.randperm(4), then each factor in order b, c, s, h.
            let mut order = [0usize, 1, 2, 3];
            for i in (1..4).rev() {
                let j = draws.below(i as u64 + 1) as usize;
                order.swap(i, j);
            }
            let factors = o
                .color_jitter
                .ranges()
                .map(|r| r.map(|(lo, hi)| f64::from(draws.uniform_f32(lo as f32, hi as f32))));
            for k in order {
                match (k, factors[k]) {
                    (0, Some(f)) => ops.push(Op::Brightness(f)),
                    (1, Some(f)) => ops.push(Op::Contrast(f)),
                    (2, Some(f)) => ops.push(Op::Saturation(f)),
                    (3, Some(f)) => ops.push(Op::Hue(f)),
                    _ => {}
                }
            }
        }
        policy::draw_policy(
            o.policy,
            self.width,
            self.height,
            o.fill,
            &mut draws,
            &mut ops,
            None,
        );
        if let Some(erasing) = &o.random_erasing {
            if let Some(op) = erasing.draw(self.width, self.height, &mut draws) {
                ops.push(op);
            }
        }
        ops
    }

    /// What batch `batch` of `epoch` mixes, when batches are mixed.
    pub fn batch_mix(&self, batch: u64, epoch: u64) -> Option<Mix> {
        let mut draws = Draws::for_image(self.seed ^ BATCH_SALT, epoch, batch as usize);
        mix::draw_mix(
            self.options.mixup,
            self.options.cutmix,
            self.width,
            self.height,
            &mut draws,
        )
    }

    /// The plan of a batch of the images `indices` (source indices), batch number `batch` of
    /// `epoch`.
    pub fn plan(&self, indices: &[usize], epoch: u64, batch: u64) -> AugmentPlan {
        let rows: Vec<ImageOps> = if self.options.per_image() {
            indices
                .iter()
                .map(|&index| self.image_ops(index, epoch))
                .collect()
        } else {
            vec![Vec::new(); indices.len()]
        };
        let (w, h) = (self.width as usize, self.height as usize);
        let mut kernel_ops = Vec::new();
        let mut starts = Vec::with_capacity(rows.len() + 1);
        for ops in &rows {
            starts.push(kernel_ops.len() as u32);
            kernel_ops.extend(ops.iter().filter_map(|op| op.kernel(w, h)));
        }
        starts.push(kernel_ops.len() as u32);
        AugmentPlan {
            rows,
            kernel_ops,
            starts,
            mix: if self.options.mixes() {
                self.batch_mix(batch, epoch)
            } else {
                None
            },
        }
    }
}

/// What a batch's augmentations drew: each row's calls, the kernel's work for them, and the
/// batch's mixing.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct AugmentPlan {
    /// Each row's calls.
    pub rows: Vec<ImageOps>,
    /// The kernel's operations, row after row.
    pub kernel_ops: Vec<KernelOp>,
    /// Where each row's operations start in `kernel_ops` (one more entry: the end).
    pub starts: Vec<u32>,
    /// The batch's mixing.
    pub mix: Option<Mix>,
}

impl AugmentPlan {
    /// Whether any row has work for the kernel.
    pub fn has_image_ops(&self) -> bool {
        !self.kernel_ops.is_empty()
    }
}

/// The CPU rendition of `kernels/augment.cu` on a batch: each of the first `n` images of
/// `height` x `width` packed RGB8 in `pixels` gets its row's operations, in order; images in
/// parallel on the current rayon pool.
pub(crate) fn augment_batch(pixels: &mut [u8], height: usize, width: usize, plan: &AugmentPlan) {
    let image = height * width * 3;
    let n = plan.starts.len().saturating_sub(1);
    if image == 0 {
        return;
    }
    pixels[..n * image]
        .par_chunks_mut(image)
        .enumerate()
        .for_each_init(
            || vec![0u8; image],
            |scratch, (row, img)| {
                let ops =
                    &plan.kernel_ops[plan.starts[row] as usize..plan.starts[row + 1] as usize];
                for op in ops {
                    ops::apply(op, img, scratch, height, width);
                }
            },
        );
}

/// Applies `ops` (torchvision calls) to one image of `height` x `width` packed RGB8, as the
/// kernel and the CPU device do: what a test or a user holding `u8` pixels calls to reproduce a
/// row.
pub fn apply_ops(ops: &[Op], pixels: &mut [u8], height: usize, width: usize) -> Result<()> {
    let image = height * width * 3;
    if pixels.len() < image {
        return Err(Error::Mismatch(format!(
            "{} bytes hold no {width}x{height} RGB image",
            pixels.len()
        )));
    }
    let mut scratch = vec![0u8; image];
    for op in ops {
        if let Some(k) = op.kernel(width, height) {
            ops::apply(&k, pixels, &mut scratch, height, width);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
