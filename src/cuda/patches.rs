//! `kernels/patches.cu`: resized `u8` images of different sizes, in one device buffer, to the
//! patch-sequence token tensor of a [`Patches`] preset (packed or padded, f16 / bf16 / f32), in
//! one launch. Bit for bit the CPU rendition (`gpufeed::cpu::patch_batch`).

use std::sync::Arc;

use cudarc::driver::{
    CudaFunction, CudaSlice, CudaStream, DeviceRepr, LaunchConfig, PushKernelArg,
};

use super::device::{upload_reusing, Gpu};
use super::kernel_cache::KernelSource;
use crate::error::{Error, Result};
use crate::options::DType;
use crate::patches::{BatchLayout, NormalizeConstants, Patches, TokenOrder};
use crate::tensor::DeviceData;

/// The kernel source, embedded at build time.
const SOURCE: &str = include_str!("../../kernels/patches.cu");

const THREADS_PER_BLOCK: u32 = 256;

/// Tokens a block of the kernel writes (`GF_PATCH_RUN`).
const TOKENS_PER_BLOCK: u64 = 32;

/// `struct GfPatchImage` of the kernel source.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct GfPatchImage {
    offset: u64,
    first_row: u64,
    width: u32,
    tokens: u32,
    rows: u32,
    grid_w: u32,
}

// SAFETY: `repr(C)` plain old data laid out as the kernel's struct (two u64 then four u32, no
// padding); any bit pattern is a valid value.
unsafe impl DeviceRepr for GfPatchImage {}

/// `struct GfPatchPad` of the kernel source: a padding token's value per channel.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct GfPatchPad {
    pad: [f32; 3],
}

// SAFETY: `repr(C)`, three floats, as the kernel's struct; passed by value.
unsafe impl DeviceRepr for GfPatchPad {}

/// Where one resized image lies in the input buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlacedImage {
    /// Its first byte.
    pub offset: usize,
    /// Pixels per row (packed RGB rows of `width * 3` bytes).
    pub width: u32,
    /// Rows.
    pub height: u32,
}

/// The patch kernel, compiled for one device, with the per-image table it reuses and the token
/// values of (channel, byte) it last uploaded.
#[derive(Debug)]
pub struct PatchKernel {
    f32: CudaFunction,
    f16: CudaFunction,
    bf16: CudaFunction,
    table: Option<CudaSlice<GfPatchImage>>,
    /// The kernel's 768 values of (channel, byte), `values[c * 256 + s]`...
    values: CudaSlice<f32>,
    /// ...of these constants (`None` until uploaded).
    values_of: Option<NormalizeConstants>,
}

impl PatchKernel {
    /// The kernel for the stream's device (compiled once per device in a process).
    pub fn new(stream: &Arc<CudaStream>) -> Result<PatchKernel> {
        let module = Gpu::from_stream(stream).module(&kernel_source())?;
        let load = |name: &str| {
            module
                .load_function(name)
                .map_err(|e| Error::cuda("finding the patch kernel", e))
        };
        Ok(PatchKernel {
            f32: load("gpufeed_patches_f32")?,
            f16: load("gpufeed_patches_f16")?,
            bf16: load("gpufeed_patches_bf16")?,
            table: None,
            values: stream
                .alloc_zeros::<f32>(3 * 256)
                .map_err(|e| Error::cuda("allocating the patch values", e))?,
            values_of: None,
        })
    }

    /// Writes the tokens of `images` (resized RGB8 images in `input`, one per image of
    /// `layout`, each at least its grid's pixels) into `out` (`layout.rows * patch_dim`
    /// elements or more) as `patches` lays them out, on `stream`.
    pub fn run_into(
        &mut self,
        stream: &Arc<CudaStream>,
        input: &CudaSlice<u8>,
        images: &[PlacedImage],
        layout: &BatchLayout,
        patches: &Patches,
        out: &mut DeviceData,
    ) -> Result<()> {
        let dim = patches.patch_dim();
        let table = image_table(input.len(), images, layout, patches.patch_size)?;
        let values = layout.rows as u64 * dim as u64;
        if (out.len() as u64) < values {
            return Err(Error::Mismatch(format!(
                "the token tensor holds {} values, the batch needs {values}",
                out.len()
            )));
        }
        if table.is_empty() || values == 0 {
            return Ok(());
        }
        let longest = layout.images.iter().map(|i| i.rows).max().unwrap_or(0) as u64;
        let Ok(blocks) = u32::try_from(longest.div_ceil(TOKENS_PER_BLOCK).max(1)) else {
            return Err(Error::Mismatch(format!(
                "an image of {longest} tokens is too long for one launch"
            )));
        };
        let config = LaunchConfig {
            grid_dim: (blocks, table.len() as u32, 1),
            block_dim: (THREADS_PER_BLOCK, 1, 1),
            shared_mem_bytes: 0,
        };
        let fail = |e| Error::cuda("uploading the patch table", e);
        let table = upload_reusing(stream, &table, &mut self.table).map_err(fail)?;
        let (merge, temporal) = match patches.token_order() {
            TokenOrder::Merged { merge, temporal } => (merge, temporal),
            _ => (0, 1),
        };
        let constants = patches.constants();
        if self.values_of != Some(constants) {
            self.values_of = None;
            stream
                .memcpy_htod(constants.table().as_flattened(), &mut self.values)
                .map_err(|e| Error::cuda("uploading the patch values", e))?;
            self.values_of = Some(constants);
        }
        let pad = GfPatchPad {
            pad: patches.pad_values(),
        };
        let (patch, dim) = (patches.patch_size, dim as u32);
        let function = match out.dtype() {
            DType::F32 => &self.f32,
            DType::F16 => &self.f16,
            DType::BF16 => &self.bf16,
            other => return Err(other.not_an_output()),
        };
        let mut b = stream.launch_builder(function);
        b.arg(input).arg(table);
        match out {
            DeviceData::F32(s) => b.arg(s),
            DeviceData::F16(s) => b.arg(s),
            DeviceData::BF16(s) => b.arg(s),
            DeviceData::I32(_) | DeviceData::I64(_) | DeviceData::U8(_) => {
                return Err(out.dtype().not_an_output())
            }
        };
        b.arg(&patch)
            .arg(&merge)
            .arg(&temporal)
            .arg(&dim)
            .arg(&self.values)
            .arg(&pad);
        // SAFETY: the arguments match `gpufeed_patches_*`'s parameters in order; `values` holds
        // the 768 values of (channel, byte) the kernel reads; block row `i` reads image `i` of
        // the table, whose pixels `image_table` checked lie inside `input` (every sample of its
        // grid), and writes rows `first_row .. first_row + rows` of `out` (the blocks of a row
        // past its rows write nothing), inside the `layout.rows * dim` values checked above; the
        // output element type is the entry point's.
        unsafe { b.launch(config) }
            .map(|_| ())
            .map_err(|e| Error::cuda("launching the patch kernel", e))
    }
}

/// The kernel source and its definitions.
fn kernel_source() -> KernelSource {
    KernelSource {
        name: "patches.cu",
        code: SOURCE,
        defines: vec![format!("GF_PATCH_RUN={TOKENS_PER_BLOCK}")],
    }
}

/// The kernel's per-image table, after checking that every image's grid lies inside its pixels
/// and its pixels inside the input of `input_len` bytes.
fn image_table(
    input_len: usize,
    images: &[PlacedImage],
    layout: &BatchLayout,
    patch: u32,
) -> Result<Vec<GfPatchImage>> {
    if images.len() != layout.images.len() || images.len() > 65_535 {
        return Err(Error::Mismatch(format!(
            "{} images placed for a layout of {} (at most 65535 a launch)",
            images.len(),
            layout.images.len()
        )));
    }
    images
        .iter()
        .zip(&layout.images)
        .enumerate()
        .map(|(i, (placed, tokens))| {
            let bytes = placed.width as u64 * placed.height as u64 * 3;
            let inside = placed.offset as u64 + bytes <= input_len as u64;
            let covered = u64::from(tokens.grid_w) * u64::from(patch) <= u64::from(placed.width)
                && u64::from(tokens.grid_h) * u64::from(patch) <= u64::from(placed.height);
            // The kernel keeps a sample's offset within its patch in 30 bits.
            let reachable = u64::from(patch) * u64::from(placed.width) * 3 < 1 << 30;
            if !inside || !covered || !reachable || tokens.rows < tokens.tokens() {
                return Err(Error::Mismatch(format!(
                    "image {i}: {}x{} pixels at byte {} of {input_len} do not hold a {}x{} grid \
                     of {patch}-pixel patches",
                    placed.width, placed.height, placed.offset, tokens.grid_w, tokens.grid_h
                )));
            }
            Ok(GfPatchImage {
                offset: placed.offset as u64,
                first_row: tokens.first_row as u64,
                width: placed.width,
                tokens: tokens.tokens() as u32,
                rows: tokens.rows as u32,
                grid_w: tokens.grid_w,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests;
