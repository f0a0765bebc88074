//! Images as patch sequences for vision transformers and vision-language models: per image a
//! size chosen by the model's rule (keeping the aspect ratio within a patch budget), then
//! patches in the model's order, normalized with the reference's own float arithmetic, packed
//! one image after another (`cu_seqlens`) or padded with a mask and patch coordinates.
//!
//! The presets ([`Preset`]) follow their references exactly:
//!
//! - `qwen2-vl`: transformers' `Qwen2VLImageProcessor` (its PIL processor; the torchvision one
//!   with [`PatchResize::TorchvisionUint8`] and [`Arithmetic::TorchFused`]): `smart_resize`
//!   to multiples of 28 between `min_pixels` and `max_pixels`, bicubic, patches of 14, a
//!   temporal patch of 2 (the still image repeated), 2 x 2 merged; `pixel_values` and
//!   `image_grid_thw`; `qwen3-vl` ([`Patches::qwen3_vl`]) is the same processor with the
//!   settings Qwen3-VL's checkpoints publish (patches of 16, multiples of 32, mean and std 0.5);
//! - `siglip2-naflex`: transformers' `Siglip2ImageProcessor`: the largest size of at most
//!   `max_patches` patches of 16 keeping the aspect ratio, bilinear; `pixel_values` padded to
//!   `max_patches`, `pixel_attention_mask`, `spatial_shapes`;
//! - `timm-naflex`: timm's NaFlex training ([`naflex`]'s module doc says what is reproduced):
//!   a sequence length per batch, the batch size from a token budget, a random resized crop to
//!   that length's patch grid, a flip, patch coordinates and a valid mask.
//!
//! This module is the pure planning: sizes, grids, draws, the token order, the batch layout and
//! the arithmetic; the options themselves are [`Patches`]. The CPU lane renders it
//! (`gpufeed::cpu::patch_batch`), `kernels/patches.cu` lays tokens out on the GPU from resized
//! images, and a pipeline built with `PipelineBuilder::patches` does both for every batch.

mod eval;
mod layout;
pub mod naflex;
mod normalize;
mod qwen2_vl;
mod siglip2;

use crate::random::Draws;

pub use crate::options::{
    Arithmetic, PatchResize, Patches, Preset, SeqLens, MAX_SEQ_LENS, OPENAI_CLIP_MEAN,
    OPENAI_CLIP_STD, TIMM_IMAGENET_MEAN, TIMM_IMAGENET_STD,
};
pub use eval::EvalPreset;
pub use layout::{BatchLayout, ImageTokens, Packing, TokenOrder};
pub use naflex::{NaflexBatch, NaflexCrop, NaflexSchedule};
pub use normalize::{NormalizeConstants, RESCALE};
pub use qwen2_vl::{smart_resize, MAX_ASPECT_RATIO};
pub use siglip2::size_for_max_patches;

/// Why an image cannot be planned as patches (the caller names the image).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum PatchError {
    /// The image has no pixels.
    #[error("the image has no pixels")]
    Empty,
    /// Qwen2-VL's `smart_resize` refuses this aspect ratio.
    #[error(
        "{width}x{height}: aspect ratio {ratio:.1} is over the limit of {limit} that Qwen2-VL's \
         smart_resize accepts"
    )]
    AspectRatio {
        /// Image width.
        width: u32,
        /// Image height.
        height: u32,
        /// `max / min` of the sides.
        ratio: f64,
        /// The limit.
        limit: f64,
    },
    /// A resized side would not fit 32 bits.
    #[error("a resized side of {side} pixels is too large")]
    TooLarge {
        /// The side.
        side: u64,
    },
    /// timm's bisection found no scale (an image far too large for the sequence).
    #[error("{width}x{height}: no scale fits the sequence length")]
    NoScale {
        /// Width of the region.
        width: u32,
        /// Height of the region.
        height: u32,
    },
    /// A resized size over the most pixels the settings give an image (what its staging holds).
    #[error("a resized size of {pixels} pixels is over the {bound} the settings allow")]
    OverBound {
        /// The resized image's pixels.
        pixels: u64,
        /// The most allowed ([`Patches::max_image_pixels`]).
        bound: u64,
    },
    /// A schedule without a sequence length.
    #[error("no sequence length above zero")]
    NoSequenceLength,
    /// An image with more tokens than the padded length.
    #[error("{tokens} tokens do not fit a padded length of {len}")]
    OverLength {
        /// The image's tokens.
        tokens: usize,
        /// The length.
        len: u32,
    },
}

impl Patches {
    /// The order of tokens and values.
    pub fn token_order(&self) -> TokenOrder {
        match self.preset {
            Preset::Qwen2Vl => TokenOrder::Merged {
                merge: self.merge_size,
                temporal: self.temporal_patch_size,
            },
            Preset::Siglip2Naflex | Preset::TimmNaflex => TokenOrder::RowMajorChannelsLast,
        }
    }

    /// Values per token.
    pub fn patch_dim(&self) -> usize {
        self.token_order().patch_dim(self.patch_size)
    }

    /// The arithmetic's per-channel constants.
    pub fn constants(&self) -> NormalizeConstants {
        NormalizeConstants::new(self.arithmetic, self.mean, self.std)
    }

    /// The value of a padding token's elements, per channel: 0 where the reference pads after
    /// normalizing (SigLIP2), a black pixel's value where it pads before (timm's collator pads
    /// `uint8` patches that its prefetcher then normalizes).
    pub fn pad_values(&self) -> [f32; 3] {
        match self.preset {
            Preset::TimmNaflex => {
                let k = self.constants();
                [0, 1, 2].map(|c| k.value(c, 0))
            }
            Preset::Qwen2Vl | Preset::Siglip2Naflex => [0.0; 3],
        }
    }

    /// How a batch whose longest image has `longest` tokens, cut for sequences of `seq_len`
    /// (timm), is laid out.
    pub fn packing(&self, longest: u32, seq_len: Option<u32>) -> Packing {
        if self.packed {
            return Packing::Packed;
        }
        let len = match self.preset {
            Preset::Qwen2Vl => longest,
            Preset::Siglip2Naflex => self.max_patches,
            Preset::TimmNaflex => seq_len
                .or_else(|| Some(self.seq_lens.longest()).filter(|&l| l > 0))
                .unwrap_or(longest),
        };
        Packing::Padded {
            len: len.max(longest),
        }
    }

    /// The plan of a `width` x `height` image without random draws: Qwen2-VL's and SigLIP2's
    /// sizes, and timm's evaluation resize (`ResizeToSequence` at the longest sequence length).
    pub fn plan(&self, width: u32, height: u32) -> std::result::Result<PatchPlan, PatchError> {
        if width == 0 || height == 0 {
            return Err(PatchError::Empty);
        }
        let p = self.patch_size;
        let (rh, rw) = match self.preset {
            Preset::Qwen2Vl => smart_resize(
                height,
                width,
                p * self.merge_size,
                self.min_pixels,
                self.max_pixels,
            )?,
            Preset::Siglip2Naflex => size_for_max_patches(height, width, p, self.max_patches),
            Preset::TimmNaflex => {
                let longest = self.seq_lens.longest().max(1);
                naflex::size_for_seq(height, width, p, longest)?.1
            }
        };
        Ok(PatchPlan::whole(width, height, rw, rh, p))
    }

    /// timm's training plan of image `index` of `epoch` (`width` x `height`) for a batch of
    /// sequences of `seq_len`: the random resized crop and flip drawn from (`seed`, `epoch`,
    /// `index`).
    pub fn plan_random(
        &self,
        width: u32,
        height: u32,
        seq_len: u32,
        (seed, epoch, index): (u64, u64, usize),
    ) -> std::result::Result<PatchPlan, PatchError> {
        let mut draws = Draws::for_image(seed, epoch, index);
        let ranges = (self.crop_scale, self.crop_ratio, self.horizontal_flip);
        let c = naflex::draw_crop(width, height, self.patch_size, seq_len, ranges, &mut draws)?;
        Ok(PatchPlan {
            left: c.left,
            top: c.top,
            crop_width: c.width,
            crop_height: c.height,
            flipped: c.flipped,
            ..PatchPlan::whole(
                width,
                height,
                c.resized_width,
                c.resized_height,
                self.patch_size,
            )
        })
    }

    /// The plan of an image whose box (the whole image, or timm's drawn crop: `left`, `top`,
    /// `width` x `height` of the source) is already known, for a batch of sequences of
    /// `seq_len` (timm): the resized size follows from the box alone, so a lane's draw is
    /// enough to rebuild the plan it resized by.
    pub fn plan_of_box(
        &self,
        (left, top, width, height): (u32, u32, u32, u32),
        flipped: bool,
        seq_len: u32,
    ) -> std::result::Result<PatchPlan, PatchError> {
        if width == 0 || height == 0 {
            return Err(PatchError::Empty);
        }
        let whole = match self.preset {
            Preset::TimmNaflex => {
                let len = match seq_len {
                    0 => self.seq_lens.longest().max(1),
                    len => len,
                };
                let (_, (rh, rw)) = naflex::size_for_seq(height, width, self.patch_size, len)?;
                PatchPlan::whole(width, height, rw, rh, self.patch_size)
            }
            Preset::Qwen2Vl | Preset::Siglip2Naflex => self.plan(width, height)?,
        };
        Ok(PatchPlan {
            left,
            top,
            flipped,
            ..whole
        })
    }

    /// The most pixels an image's resized size may have under these settings, whatever its
    /// size (timm: at its longest sequence length): what a batch's staging holds per image.
    ///
    /// Qwen2-VL's `smart_resize` may go past `max_pixels` where its floor keeps a side at one
    /// unit (`factor`: at most `factor * (sqrt(200 * max_pixels) + factor)` pixels for an
    /// aspect ratio of 200) and past `min_pixels` where it rounds both sides up (at most
    /// `min_pixels + factor * sqrt(min_pixels) * 201 / sqrt(200) + factor^2`).
    pub fn max_image_pixels(&self) -> u64 {
        let p = u64::from(self.patch_size);
        match self.preset {
            Preset::Qwen2Vl => {
                let f = (p * u64::from(self.merge_size)) as f64;
                let (min, max) = (self.min_pixels as f64, self.max_pixels as f64);
                let r = qwen2_vl::MAX_ASPECT_RATIO;
                let floored = f * ((r * max).sqrt() + f);
                let ceiled = min + f * min.sqrt() * (1.0 + r) / r.sqrt() + f * f;
                (max.max(floored).max(ceiled).ceil() as u64).max(1)
            }
            Preset::Siglip2Naflex => u64::from(self.max_patches) * p * p,
            Preset::TimmNaflex => u64::from(self.seq_lens.longest()) * p * p,
        }
    }

    /// The setting that bounds [`Patches::max_image_pixels`]: `max_pixels` (Qwen2-VL),
    /// `max_patches` (SigLIP2) or `seq_lens` (timm), for errors that say what to lower.
    pub fn budget_option(&self) -> &'static str {
        match self.preset {
            Preset::Qwen2Vl => "max_pixels",
            Preset::Siglip2Naflex => "max_patches",
            Preset::TimmNaflex => "seq_lens",
        }
    }

    /// timm's schedule of batches for `images` images an epoch under `seed`.
    pub fn schedule(
        &self,
        seed: u64,
        images: usize,
    ) -> std::result::Result<NaflexSchedule, PatchError> {
        NaflexSchedule::new(
            seed,
            images,
            self.seq_lens.as_slice(),
            self.tokens_per_batch,
            self.batch_divisor,
        )
    }
}

/// One image's plan: the region of the source resized, the resized size, the flip, the grid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PatchPlan {
    /// First column of the region of the source that is resized.
    pub left: u32,
    /// First row of the region.
    pub top: u32,
    /// Columns of the region.
    pub crop_width: u32,
    /// Rows of the region.
    pub crop_height: u32,
    /// Width of the resized image, a multiple of the patch.
    pub width: u32,
    /// Height of the resized image, a multiple of the patch.
    pub height: u32,
    /// Mirrored left to right after the resize.
    pub flipped: bool,
    /// Temporal patches (Qwen2-VL's `grid_t`: 1 for a still image).
    pub grid_t: u32,
    /// Patches down.
    pub grid_h: u32,
    /// Patches across.
    pub grid_w: u32,
}

impl PatchPlan {
    fn whole(width: u32, height: u32, rw: u32, rh: u32, patch: u32) -> PatchPlan {
        PatchPlan {
            left: 0,
            top: 0,
            crop_width: width,
            crop_height: height,
            width: rw,
            height: rh,
            flipped: false,
            grid_t: 1,
            grid_h: rh / patch,
            grid_w: rw / patch,
        }
    }

    /// Tokens of the image.
    pub fn tokens(&self) -> usize {
        self.grid_t as usize * self.grid_h as usize * self.grid_w as usize
    }
}

#[cfg(test)]
mod tests;
