//! One image's resample, planned once: both [`AxisPlan`]s, their integer coefficients, Pillow's
//! pass order, and so the exact source samples the resample reads. The CPU lane decodes that
//! window, scales the decode by it, and resamples with it.

use std::ops::Range;

use super::coefficients::AxisCoefficients;
use super::cpu::{self, HostImage, Kernels, Slot, SplitWeights};
use super::filter::Resampling;
use super::passes::PassOrder;
use super::plan::{Axis, AxisPlan, PlanError};

/// Both axes of one image's resample with everything the passes need, reusable: planning again
/// into the same value allocates nothing once its buffers have grown.
#[derive(Debug, Clone, Default)]
pub(crate) struct ImagePlan {
    /// The horizontal plan.
    pub x: AxisPlan,
    /// The vertical plan.
    pub y: AxisPlan,
    pub(super) xc: AxisCoefficients,
    pub(super) yc: AxisCoefficients,
    pub(super) x_split: SplitWeights,
    pub(super) y_split: SplitWeights,
    /// Both axes filtered and Pillow runs the vertical pass first.
    pub(super) vertical_first: bool,
}

impl ImagePlan {
    /// Plans `x` and `y` under `resampling`, with Pillow's pass order `order`.
    #[cfg(test)]
    pub fn new(
        x: &AxisPlan,
        y: &AxisPlan,
        resampling: Resampling,
        order: PassOrder,
    ) -> Result<ImagePlan, PlanError> {
        let mut plan = ImagePlan::default();
        plan.plan(x, y, resampling, order)?;
        Ok(plan)
    }

    /// Plans `x` and `y` under `resampling`, with Pillow's pass order `order`, into `self`,
    /// reusing its buffers.
    pub fn plan(
        &mut self,
        x: &AxisPlan,
        y: &AxisPlan,
        resampling: Resampling,
        order: PassOrder,
    ) -> Result<(), PlanError> {
        self.x = *x;
        self.y = *y;
        self.xc.compute(x, resampling, Axis::X)?;
        self.yc.compute(y, resampling, Axis::Y)?;
        self.x_split.split(&self.xc);
        self.y_split.split(&self.yc);
        self.vertical_first = self.xc.resampled && self.yc.resampled && order.vertical_first(x, y);
        Ok(())
    }

    /// Plans `x` and `y` as torchvision resizes a `uint8` tensor on the CPU: PyTorch's 16-bit
    /// antialiased weights of `filter` (bilinear or bicubic), the width first.
    pub fn plan_torchvision(
        &mut self,
        x: &AxisPlan,
        y: &AxisPlan,
        filter: super::filter::Filter,
    ) -> Result<(), PlanError> {
        self.x = *x;
        self.y = *y;
        super::torch::compute(&mut self.xc, x, filter, Axis::X)?;
        super::torch::compute(&mut self.yc, y, filter, Axis::Y)?;
        self.x_split.split(&self.xc);
        self.y_split.split(&self.yc);
        self.vertical_first = false;
        Ok(())
    }

    /// The samples of the decoded image the resample reads: `[x0, x1)` and `[y0, y1)`, every
    /// tap of every kept output (whatever the pass order: the first pass covers just what the
    /// second reads).
    pub fn source_span(&self) -> (Range<u32>, Range<u32>) {
        (self.xc.source_span(&self.x), self.yc.source_span(&self.y))
    }

    /// Resamples `source` into `slot` (the kept outputs at the plans' destination, `pad`
    /// elsewhere) with `kernels`; `scratch` holds the intermediate.
    pub fn resample_into(
        &self,
        source: &HostImage,
        pad: u8,
        slot: &mut Slot,
        kernels: Kernels,
        scratch: &mut Vec<u8>,
    ) -> Result<(), PlanError> {
        cpu::resample_into(self, source, pad, slot, kernels, scratch, 1)
    }

    /// [`ImagePlan::resample_into`] with each large pass cut into bands of rows on up to
    /// `threads` threads (the calling one and others started for it): the same bytes.
    pub fn resample_into_bands(
        &self,
        source: &HostImage,
        pad: u8,
        slot: &mut Slot,
        kernels: Kernels,
        scratch: &mut Vec<u8>,
        threads: usize,
    ) -> Result<(), PlanError> {
        cpu::resample_into(self, source, pad, slot, kernels, scratch, threads)
    }
}
