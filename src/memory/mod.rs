//! Host memory both decode lanes and the device stage share, below all of them: the decode memory
//! budget the CPU threads and the GPU lane's coefficient threads reserve their images from, and
//! page-locked host memory (the staging ring's, the CPU lane's images of their own, and those it
//! laid out by position while the device opened). The lanes prepare into it; the device stage
//! uploads from it.

mod budget;
mod page_locked;
mod pinned;
mod positioned;

pub(crate) use budget::{BufferPool, MemoryBudget};
pub(crate) use page_locked::{HostPages, PageLocked};
pub(crate) use pinned::{PinnedChunks, PinnedImage};
pub(crate) use positioned::{PositionedImage, PositionedImages};
