//! The CPU lane: read, decode, resize and crop on a pool of threads, pixels kept `u8`, each image
//! written straight into its place in the batch's staging (and, on the CPU device, normalized
//! there by the same thread).

mod ahead;
mod decode;
mod normalize;
#[allow(unsafe_code)]
mod paeth;
mod patches;
mod png;
mod png_direct;
mod prepare;
mod priority;
mod probe;
mod resize;
mod stage;
mod views;
mod webp;

pub use normalize::normalize;
pub use patches::{patch_batch, patch_image, PatchBatch, PatchDraw, PatchImage};
pub use prepare::prepare_image;
pub use stage::{CpuStage, PreparedBatch};
pub use views::{render_views, ViewImage};

pub(crate) use crate::views::LaneViews;
pub(crate) use ahead::{AheadImage, AheadWork, CpuAhead};
pub(crate) use decode::decode_whole;
pub(crate) use normalize::NormalizeTable;
pub(crate) use patches::TokenWriter;
pub(crate) use stage::{BatchRequest, CpuLane, Filled, LaneCore, Staging};
