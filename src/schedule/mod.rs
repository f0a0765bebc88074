//! How the two decode lanes share a pipeline's images, decided in one place, below both lanes
//! and importing neither: the decode choice read once from the options ([`DecodePlan`]), what it
//! opens for a run (the CPU lane alone, or working ahead with the GPU decode lane beside it),
//! and the one policy that schedules them ([`LanePolicy`]): the GPU lane's share and its floor
//! ([`share`]), when its JPEG engines open, and how many CPU threads work beside it at what
//! priority ([`threads`]). The share at each position of an epoch ([`ShareSchedule`]) is what
//! both lanes read to know which images are theirs.
//!
//! Its rules are unit tests that feed it simulated lane rates and check its decisions: no GPU
//! is needed to see what it does.

mod mix;
mod plan;
mod policy;
mod share;
mod steps;
mod threads;

pub(crate) use mix::{expected_cost, EpochSample, WorkMix};
pub(crate) use plan::{DecodePlan, LaneChoice};
pub(crate) use policy::{EnginesOpen, LanePolicy};
pub(crate) use share::LaneActivity;
#[cfg(test)]
pub(crate) use steps::offered;
pub(crate) use steps::ShareSchedule;
pub(crate) use threads::{ThreadPriority, GPU_LANE_HOST_THREADS};
