//! A batch of packed images planned for `kernels/idct.cu`: one IDCT job per component of every
//! image, one colour job per image, the layout of the plane and output buffers, and the launch
//! grids. Pure arithmetic, shared by the GPU host side ([`super::gpu`]) and the host run of the
//! kernel source (`host_check.rs`), so both launch exactly the same work.

use super::entropy_batch::DensePlanes;
use super::pack::{PackedComponent, PackedImage};
use super::Error;

/// Threads per block of the IDCT kernel (one 8x8 block each).
pub const IDCT_THREADS: u32 = 128;
/// Threads per block of the upsampling and colour kernel (two pixels of a row each, a block a
/// row: 256 pixels a pass over the row).
pub const COLOR_THREADS: u32 = 128;
/// Most blocks along the grid's x for one job or image (the threads loop past it).
const MAX_GRID_X: u32 = 4096;
/// The most jobs or images of one launch (the grid's y).
pub const MAX_JOBS: usize = 65_535;
/// Alignment of each plane and each rendered window in their buffers.
pub const ALIGN: u64 = 256;

/// `struct GfIdctJob` of kernels/idct.cu, field for field.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IdctJob {
    /// Byte offset of the component's packed section in the coefficient buffer.
    pub section: u64,
    /// Byte offset of its plane in the plane buffer.
    pub plane: u64,
    /// Blocks in the rectangle.
    pub blocks: u32,
    /// The rectangle's width in blocks.
    pub blocks_wide: u32,
    /// Offsets of the DC values, masks, group offsets and AC values from the section.
    pub dc: u32,
    /// Offset of the masks.
    pub masks: u32,
    /// Offset of the group offsets.
    pub groups: u32,
    /// Offset of the AC values.
    pub ac: u32,
}

/// `struct GfPlane` of kernels/idct.cu.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PlaneRef {
    /// Byte offset of the plane in the plane buffer.
    pub offset: u64,
    /// Bytes a row.
    pub pitch: u32,
    /// Component sample column of the plane's first sample.
    pub x0: u32,
    /// Component sample row of the plane's first sample.
    pub y0: u32,
    /// Last real sample column of the component.
    pub last_i: u32,
    /// Last real sample row.
    pub last_j: u32,
    /// `GF_UP_*`.
    pub method: u32,
    /// Replication across (box).
    pub h: u32,
    /// Replication down (box).
    pub v: u32,
}

/// `struct GfColorJob` of kernels/idct.cu.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ColorJob {
    /// The image's component planes (unused ones zero).
    pub comp: [PlaneRef; 3],
    /// Byte offset of the window's first pixel in the output buffer.
    pub out: u64,
    /// Bytes a row of output.
    pub out_pitch: u32,
    /// The window's left column.
    pub x: u32,
    /// The window's top row.
    pub y: u32,
    /// The window's width.
    pub width: u32,
    /// The window's height.
    pub height: u32,
    /// `GF_CC_*`.
    pub conversion: u32,
    /// Padding to the kernel's layout.
    pub unused: [u32; 2],
}

/// Where one image's rendered window is in the output buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rendered {
    /// Byte offset of the window's first pixel.
    pub offset: u64,
    /// Bytes a row.
    pub pitch: u32,
    /// Pixels a row.
    pub width: u32,
    /// Rows.
    pub height: u32,
    /// Bytes a pixel: 3 (RGB) or 1 (gray).
    pub channels: u32,
}

/// Bytes `image` takes in the plane and the output buffer, each part aligned as
/// [`BatchPlan::plan`] places it.
pub fn footprint(image: &PackedImage) -> (u64, u64) {
    let planes = image
        .components()
        .map(|p| p.plane_bytes().next_multiple_of(ALIGN))
        .sum();
    (planes, image.output_bytes().next_multiple_of(ALIGN))
}

/// One planned batch; reused from batch to batch (its vectors keep their capacity).
#[derive(Debug, Default, Clone)]
pub struct BatchPlan {
    /// One job per component of every image.
    pub idct: Vec<IdctJob>,
    /// One job per image.
    pub color: Vec<ColorJob>,
    /// Where each image's window lands.
    pub rendered: Vec<Rendered>,
    /// Bytes of the plane buffer the batch uses.
    pub plane_bytes: u64,
    /// Bytes of the output buffer the batch writes.
    pub output_bytes: u64,
    /// The IDCT launch's grid x (y is the job count).
    pub idct_grid_x: u32,
    /// The colour launch's grid x (y is the image count).
    pub color_grid_x: u32,
}

impl BatchPlan {
    /// Plans `images` (each packed image and the byte offset of its packed bytes in the
    /// coefficient buffer, a multiple of 8), replacing what the plan held.
    pub fn plan(&mut self, images: &[(PackedImage, u64)]) -> Result<(), Error> {
        self.idct.clear();
        self.color.clear();
        self.rendered.clear();
        self.plane_bytes = 0;
        self.output_bytes = 0;
        let mut largest_job = 0u32;
        let mut tallest_window = 0u32;
        let too_large = |what: &str| Error::Request(format!("{what} too large for one launch"));
        for (image, at) in images {
            if !at.is_multiple_of(8) {
                return Err(Error::Request(format!(
                    "packed bytes at offset {at}: not a multiple of 8"
                )));
            }
            let mut color = ColorJob::default();
            for (c, p) in image.components().enumerate() {
                let plane = self.plane_bytes;
                self.plane_bytes = (plane + p.plane_bytes()).next_multiple_of(ALIGN);
                let blocks = u32::try_from(p.blocks.blocks()).map_err(|_| too_large("a plane"))?;
                largest_job = largest_job.max(blocks);
                self.idct.push(IdctJob {
                    section: at + u64::from(p.section),
                    plane,
                    blocks,
                    blocks_wide: p.blocks.width(),
                    dc: p.dc,
                    masks: p.masks,
                    groups: p.groups,
                    ac: p.ac,
                });
                color.comp[c] = plane_ref(p, plane);
            }
            let window = image.window;
            let channels = image.channels() as u32;
            let pitch = window.width * channels;
            tallest_window = tallest_window.max(window.height);
            let out = self.output_bytes;
            self.output_bytes = (out + image.output_bytes()).next_multiple_of(ALIGN);
            color.out = out;
            color.out_pitch = pitch;
            color.x = window.x;
            color.y = window.y;
            color.width = window.width;
            color.height = window.height;
            color.conversion = image.conversion.code();
            self.color.push(color);
            self.rendered.push(Rendered {
                offset: out,
                pitch,
                width: window.width,
                height: window.height,
                channels,
            });
        }
        if self.idct.len() > MAX_JOBS || self.color.len() > MAX_JOBS {
            return Err(Error::Request(format!(
                "{} images in one batch (at most {})",
                images.len(),
                MAX_JOBS / 3
            )));
        }
        self.idct_grid_x = largest_job.div_ceil(IDCT_THREADS).clamp(1, MAX_GRID_X);
        self.color_grid_x = tallest_window.clamp(1, MAX_GRID_X);
        Ok(())
    }
}

/// `GfIdctJob.dc` of a component whose coefficients are dense (kernels/idct.cu `GF_DENSE`).
pub const DENSE: u32 = u32::MAX;

impl BatchPlan {
    /// Points the IDCT jobs of the entropy-coded images of the planned batch `images` at their
    /// dense planes: `dense` holds, per such image in the batch's order, its index in `images`
    /// and where its planes are in the dense buffer
    /// ([`super::entropy_batch::EntropyPlan::planes`]). Each job then reads its window's block
    /// rectangle from the plane (kernels/idct.cu `GF_DENSE`). Allocates nothing.
    pub fn point_at_dense(
        &mut self,
        images: &[(PackedImage, u64)],
        dense: &[(usize, DensePlanes)],
    ) {
        let mut first_job = 0usize;
        let mut dense = dense.iter().peekable();
        for (i, (image, _)) in images.iter().enumerate() {
            while dense.next_if(|(d, _)| *d < i).is_some() {}
            if let Some((_, planes)) = dense.next_if(|(d, _)| *d == i) {
                for (c, p) in image.components().enumerate() {
                    let Some(job) = self.idct.get_mut(first_job + c) else {
                        continue;
                    };
                    let pitch = planes.blocks_wide[c];
                    let offset = planes.offset[c]
                        + (u64::from(p.blocks.y0) * u64::from(pitch) + u64::from(p.blocks.x0)) * 64;
                    job.dc = DENSE;
                    job.masks = offset as u32;
                    job.groups = (offset >> 32) as u32;
                    job.ac = pitch;
                }
            }
            first_job += image.components().count();
        }
    }
}

/// The plane of `p` at `offset` in the plane buffer, as the upsampler reads it.
fn plane_ref(p: &PackedComponent, offset: u64) -> PlaneRef {
    let (h, v) = p.layout.upsampling.factors();
    PlaneRef {
        offset,
        pitch: p.blocks.width() * 8,
        x0: p.blocks.x0 * 8,
        y0: p.blocks.y0 * 8,
        last_i: p.layout.samples_wide - 1,
        last_j: p.layout.samples_high - 1,
        method: p.layout.upsampling.code(),
        h,
        v,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The structures have the sizes of the kernel's (a mismatch would shift every field).
    #[test]
    fn descriptors_have_the_kernels_layout() {
        assert_eq!(std::mem::size_of::<IdctJob>(), 40);
        assert_eq!(std::mem::size_of::<PlaneRef>(), 40);
        assert_eq!(std::mem::size_of::<ColorJob>(), 160);
        assert_eq!(std::mem::align_of::<ColorJob>(), 8);
    }
}
