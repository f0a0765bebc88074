//! Pillow's 8-bit resampling (`libImaging/Resample.c`, and `Image.resize`'s `NEAREST`), ported
//! bit for bit and shared by both decode lanes: the CPU lane runs it here ([`ImagePlan`], AVX2 or
//! portable), the GPU lane's kernels run the same [`PassPlan`].
//!
//! - [`AxisPlan`] ([`plan`]): the integer geometry of one axis (region, box, resize, kept
//!   outputs, destination), with torchvision's sizes and crop rounding;
//! - [`Filter`] ([`filter`]): the filters, value for value;
//! - [`AxisCoefficients`](coefficients::AxisCoefficients) ([`coefficients`]): Pillow's integer
//!   weights (22 fraction bits) and nearest positions for an axis's kept outputs;
//! - [`PassPlan`] ([`passes`]): the passes in Pillow's order ([`PassOrder`]: Pillow 13's by
//!   default, older Pillows' on request);
//! - [`ImagePlan`] ([`image`]): one image's plan, its source span, and its run on the CPU
//!   ([`cpu`]).
//!
//! The region an [`AxisPlan`] names is resized as if it were an image of its own (Pillow's
//! `crop` then `resize`, or `resize(box=...)` within it), and only the outputs the plan keeps are
//! computed: every output sample depends on its own taps only, so the kept ones equal those of
//! the full resize.

mod coefficients;
mod cpu;
mod filter;
mod image;
mod passes;
mod plan;
#[cfg(test)]
mod reference;
#[cfg(test)]
mod tests;
mod torch;
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod weights_avx2;

pub use coefficients::WeightRule;
#[cfg(test)]
pub use coefficients::{clip8, HALF};
pub use filter::{Filter, Resampling};
pub use passes::{
    plan_passes, plan_passes_torchvision, plan_passes_weights_on_device, Direction, Pass,
    PassOrder, PassPlan,
};
#[cfg(test)]
pub use plan::torchvision_center_crop;
pub use plan::{letterbox_fit, torchvision_resize, Axis, AxisPlan, PlanError, Window};

pub(crate) use cpu::{HostImage, Kernels, Slot};
pub(crate) use image::ImagePlan;
#[cfg(test)]
pub(crate) use reference::resample;
