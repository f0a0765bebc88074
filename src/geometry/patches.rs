//! The planner of a patch-sequence output: each image resized to the size its preset's rule
//! gives it ([`Patches::plan`], or timm's crop drawn for the batch's sequence length), into
//! the top-left of its place in the staging, rows packed at its own width. The rest is the
//! fixed output's: one integer plan per axis, from which the decode window and both lanes'
//! resizes come, Pillow's arithmetic (or PyTorch's `uint8` weights for the torchvision
//! variant).

use super::{CropDraw, Geometry};
use crate::patches::{PatchError, PatchPlan, PatchResize, Patches, Preset};
use crate::resample::{
    plan_passes_torchvision, plan_passes_weights_on_device, AxisPlan, PassOrder, PassPlan,
    PlanError, Resampling,
};

/// How a patch-sequence output sizes its images: the preset's rule, and the sequence length of
/// the batch an image goes to (timm; 0 for the others).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct PatchSizing {
    pub patches: Patches,
    pub seq_len: u32,
}

/// Bytes an image's place is a multiple of: places one after another then all start on 16
/// bytes, so the GPU's copy of a batch's images (`gpufeed_gather`) moves 16 bytes at a time (it
/// copies byte by byte otherwise: Qwen2-VL's bound at 50,176 pixels is 268,452 bytes).
pub(crate) const PLACE_ALIGN: usize = 16;

impl PatchSizing {
    /// The most bytes an image's resized pixels take (RGB8), rounded up to a multiple of
    /// [`PLACE_ALIGN`]: its place in a batch's staging and in the GPU lane's ring.
    pub fn image_bytes(&self) -> usize {
        let bytes = usize::try_from(self.patches.max_image_pixels().saturating_mul(3))
            .unwrap_or(usize::MAX);
        bytes
            .checked_next_multiple_of(PLACE_ALIGN)
            .unwrap_or(usize::MAX)
    }

    /// Whether the resize is PyTorch's `uint8` one (transformers' torchvision processors).
    pub fn is_torchvision(&self) -> bool {
        self.patches.resize == PatchResize::TorchvisionUint8
    }
}

/// Where an image lands: what its random transforms drew (its box and flip; always there for a
/// patch-sequence output, whose box is the whole image but for timm's crops) and the plan of
/// each axis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Placement {
    pub draw: Option<CropDraw>,
    pub x: AxisPlan,
    pub y: AxisPlan,
}

impl Geometry {
    /// The geometry of `patches`' output (the seed of timm's draws from `self`): each image
    /// sized by its rule, with its filter and Pillow version.
    pub fn with_patches(self, patches: Option<&Patches>) -> Geometry {
        let Some(patches) = patches else {
            return self;
        };
        let (major, minor) = patches.pillow_version;
        Geometry {
            interpolation: patches.interpolation,
            horizontal_flip: 0.0,
            pass_order: PassOrder::for_pillow(major, minor),
            patches: Some(PatchSizing {
                patches: *patches,
                seq_len: 0,
            }),
            ..self
        }
    }

    /// The geometry of the images of a batch of sequences of `seq_len` (timm's; any other
    /// geometry is the same for every batch).
    pub fn for_sequence(self, seq_len: u32) -> Geometry {
        match self.patches {
            Some(sizing) if sizing.patches.preset == Preset::TimmNaflex => Geometry {
                patches: Some(PatchSizing { seq_len, ..sizing }),
                ..self
            },
            _ => self,
        }
    }

    /// Whether transparent pixels are composited onto white before the resize (transformers'
    /// `convert_to_rgb`), rather than their alpha dropped.
    pub fn composites_alpha(&self) -> bool {
        self.patches
            .as_ref()
            .is_some_and(|s| s.patches.composite_alpha)
    }

    /// Where the image with source index `index` of `epoch`, `width` x `height` pixels (after
    /// any EXIF turn), lands: its draws and axes. A patch-sequence output's rule may refuse the
    /// image (Qwen2-VL's aspect ratio over 200; no scale fits timm's sequence).
    pub fn placement(
        &self,
        width: u32,
        height: u32,
        index: usize,
        epoch: u64,
    ) -> Result<Placement, PatchError> {
        let Some(sizing) = &self.patches else {
            let draw = self.draw(width, height, index, epoch);
            let (x, y) = self.axis_plans(width, height, draw.as_ref());
            return Ok(Placement { draw, x, y });
        };
        let patches = &sizing.patches;
        let plan = match patches.preset {
            Preset::TimmNaflex => {
                let seq_len = match sizing.seq_len {
                    0 => patches.seq_lens.longest(),
                    len => len,
                };
                patches.plan_random(width, height, seq_len, (self.seed, epoch, index))?
            }
            _ => patches.plan(width, height)?,
        };
        let pixels = u64::from(plan.width) * u64::from(plan.height);
        let bound = patches.max_image_pixels();
        if pixels > bound {
            return Err(PatchError::OverBound { pixels, bound });
        }
        Ok(Placement {
            draw: Some(CropDraw {
                top: plan.top,
                left: plan.left,
                height: plan.crop_height,
                width: plan.crop_width,
                flipped: plan.flipped,
            }),
            x: AxisPlan::crop_then_resize(plan.left, plan.crop_width, plan.width),
            y: AxisPlan::crop_then_resize(plan.top, plan.crop_height, plan.height),
        })
    }

    /// The plan of a patch-sequence output's image from what its lane drew (its box and flip):
    /// its resized size and grid. `None` for a fixed-size output, or a draw the rule refuses
    /// (no lane makes one).
    pub fn patch_plan(&self, draw: &CropDraw) -> Option<PatchPlan> {
        let sizing = self.patches.as_ref()?;
        let bounds = (draw.left, draw.top, draw.width, draw.height);
        sizing
            .patches
            .plan_of_box(bounds, draw.flipped, sizing.seq_len)
            .ok()
    }

    /// The size an image of axes `x` and `y` is written at: the output's, or (a patch-sequence
    /// output) its own resized size.
    pub fn out_size(&self, x: &AxisPlan, y: &AxisPlan) -> (u32, u32) {
        match self.patches {
            Some(_) => (x.resized, y.resized),
            None => (self.width, self.height),
        }
    }

    /// The passes of axes `x` and `y` under this geometry's filter, for the GPU lane's resize
    /// kernels: Pillow's in its version's order, its bilinear and bicubic weights left to the
    /// device ([`plan_passes_weights_on_device`], the same double operations there), or
    /// PyTorch's `uint8` ones. `None` for nearest (no passes: the GPU lane leaves it to the CPU
    /// lane).
    pub fn pass_plan(&self, x: &AxisPlan, y: &AxisPlan) -> Option<Result<PassPlan, PlanError>> {
        let Resampling::Filter(filter) = self.resampling() else {
            return None;
        };
        Some(match &self.patches {
            Some(sizing) if sizing.is_torchvision() => plan_passes_torchvision(x, y, filter),
            _ => plan_passes_weights_on_device(x, y, filter, self.pass_order),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::options::ResizeOptions;

    fn geometry(patches: &Patches) -> Geometry {
        Geometry::new(&ResizeOptions::default()).with_patches(Some(patches))
    }

    #[test]
    fn each_image_is_planned_at_its_own_size() {
        let q = Patches::qwen2_vl();
        let g = geometry(&q);
        let p = g.placement(451, 300, 0, 0).expect("plan");
        // transformers: 451 x 300 -> 448 x 308.
        assert_eq!((p.x.resized, p.y.resized), (448, 308));
        assert_eq!(g.out_size(&p.x, &p.y), (448, 308));
        let draw = p.draw.expect("the box");
        assert_eq!((draw.width, draw.height, draw.flipped), (451, 300, false));
        let plan = g.patch_plan(&draw).expect("plan");
        assert_eq!(plan, q.plan(451, 300).expect("plan"));
        assert_eq!(g.image_bytes(), 28 * 28 * 1280 * 3);
        // A bound that is not a multiple of 16 bytes gets a place that is.
        let small = geometry(&Patches::qwen2_vl().max_pixels(50_176));
        let bound = Patches::qwen2_vl().max_pixels(50_176).max_image_pixels() as usize * 3;
        assert_eq!(bound, 268_452);
        assert_eq!(small.image_bytes(), 268_464);
        let e = g.placement(10_050, 50, 0, 0).expect_err("aspect");
        assert!(e.to_string().contains("aspect ratio"), "{e}");
    }

    #[test]
    fn timm_draws_for_the_batch_sequence_length_and_rebuilds_from_the_draw() {
        let t = Patches::timm_naflex();
        let g = Geometry::new(&ResizeOptions::default().seed(9)).with_patches(Some(&t));
        for (i, seq_len) in [128u32, 256, 576, 784, 1024].into_iter().enumerate() {
            let g = g.for_sequence(seq_len);
            let p = g.placement(640, 480, i, 3).expect("plan");
            let draw = p.draw.expect("a crop");
            let want = t.plan_random(640, 480, seq_len, (9, 3, i)).expect("plan");
            let plan = g.patch_plan(&draw).expect("rebuilt");
            assert_eq!(plan, want, "seq {seq_len}");
            assert_eq!((p.x.src_offset, p.x.src_len), (want.left, want.crop_width));
            assert!(plan.tokens() <= seq_len as usize);
            assert!(plan.width as usize * plan.height as usize * 3 <= g.image_bytes());
        }
    }

    #[test]
    fn qwen_bounds_hold_every_size_the_rule_gives() {
        // Budgets small enough that smart_resize's floors and ceilings go past them.
        for (min, max) in [
            (56 * 56, 28 * 28),
            (56 * 56, 56 * 56),
            (3136, 28 * 28 * 1280),
        ] {
            let q = Patches::qwen2_vl().min_pixels(min).max_pixels(max);
            let bound = q.max_image_pixels();
            for (w, h) in [
                (1, 200),
                (200, 1),
                (1, 1),
                (3, 600),
                (9000, 45),
                (4000, 3000),
            ] {
                let p = q.plan(w, h).expect("plan");
                let pixels = u64::from(p.width) * u64::from(p.height);
                assert!(
                    pixels <= bound,
                    "{w}x{h} at {min}..{max}: {pixels} > {bound}"
                );
            }
        }
    }
}
