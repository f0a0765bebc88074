//! Patch sequences on the CPU: an image decoded as the reference converts it to RGB, resized
//! with the reference's arithmetic into the size [`Patches`] plans, then cut into tokens,
//! normalized with the reference's float operations and laid out packed or padded. The oracle
//! `kernels/patches.cu` is tested against, and the output of the CPU device.
//!
//! The RGB conversion is transformers' `convert_to_rgb`: an image with transparency (an alpha
//! channel, or a palette or colour marked transparent) is composited onto white with Pillow's
//! `alpha_composite` arithmetic; gray is spread to three channels; CMYK is converted as Pillow
//! converts it; 16-bit samples keep their high byte.

use half::{bf16, f16};
use image::{ColorType, ImageDecoder, ImageFormat};

use super::decode::{decode, DecodeWindow, Decoded};
use super::probe::check_size;
use crate::error::{Error, ItemError, ItemErrorKind, Result};
use crate::memory::BufferPool;
use crate::options::{DType, DecodeOptions};
use crate::patches::{BatchLayout, ImageTokens, PatchPlan, PatchResize, Patches, TokenOrder};
use crate::resample::{AxisPlan, Filter, HostImage, ImagePlan, Kernels, PassOrder, Slot};
use crate::source::sniff_format;
use crate::tensor::HostData;

/// One image resized for its patches: packed RGB8 pixels of `plan.width` x `plan.height`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PatchImage {
    /// The resized pixels, rows packed, RGB.
    pub pixels: Vec<u8>,
    /// What was planned for it.
    pub plan: PatchPlan,
}

/// A decoded image in RGB (or gray) before the resize.
struct Rgb {
    pixels: Vec<u8>,
    width: u32,
    height: u32,
    channels: u32,
}

/// What a timm training image draws from: the batch's sequence length and (seed, epoch,
/// index).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PatchDraw {
    /// The batch's sequence length.
    pub seq_len: u32,
    /// The seed of the run.
    pub seed: u64,
    /// The epoch.
    pub epoch: u64,
    /// The image's index in the source.
    pub index: usize,
}

/// Decodes `bytes` as the reference converts it to RGB, plans its size under `patches` (with
/// timm's random crop when `draw` is given) and resizes it. Errors name the image by `id`.
pub fn patch_image(
    bytes: &[u8],
    id: &str,
    decode: &DecodeOptions,
    patches: &Patches,
    draw: Option<PatchDraw>,
) -> Result<PatchImage> {
    patches.validate()?;
    let item = |kind| {
        Error::Item(ItemError {
            id: id.to_string(),
            index: draw.map_or(0, |d| d.index),
            kind,
        })
    };
    let rgb = decode_rgb(bytes, decode, patches.composite_alpha).map_err(item)?;
    let planned = match draw {
        Some(d) => {
            patches.plan_random(rgb.width, rgb.height, d.seq_len, (d.seed, d.epoch, d.index))
        }
        None => patches.plan(rgb.width, rgb.height),
    };
    let plan = planned.map_err(|e| item(ItemErrorKind::Resize(e.to_string())))?;
    let pixels = resize(&rgb, &plan, patches).map_err(|e| item(ItemErrorKind::Resize(e)))?;
    Ok(PatchImage { pixels, plan })
}

/// Resizes the plan's region of `rgb` to its size with the reference's arithmetic, then flips.
fn resize(rgb: &Rgb, plan: &PatchPlan, patches: &Patches) -> std::result::Result<Vec<u8>, String> {
    let x = AxisPlan::crop_then_resize(plan.left, plan.crop_width, plan.width);
    let y = AxisPlan::crop_then_resize(plan.top, plan.crop_height, plan.height);
    let filter = match patches.interpolation {
        crate::Interpolation::Bicubic => Filter::Bicubic,
        crate::Interpolation::Bilinear => Filter::Bilinear,
        crate::Interpolation::Lanczos => Filter::Lanczos,
        crate::Interpolation::Box => Filter::Box,
        crate::Interpolation::Hamming => Filter::Hamming,
        crate::Interpolation::Nearest => {
            return Err("nearest is not a patch preset's filter".into());
        }
    };
    let mut image_plan = ImagePlan::default();
    match patches.resize {
        PatchResize::Pillow => {
            let (major, minor) = patches.pillow_version;
            let order = PassOrder::for_pillow(major, minor);
            image_plan.plan(&x, &y, crate::resample::Resampling::Filter(filter), order)
        }
        PatchResize::TorchvisionUint8 => image_plan.plan_torchvision(&x, &y, filter),
    }
    .map_err(|e| e.to_string())?;
    let mut pixels = vec![0u8; plan.width as usize * plan.height as usize * 3];
    let source = HostImage {
        pixels: &rgb.pixels,
        width: rgb.width,
        height: rgb.height,
        channels: rgb.channels,
    };
    let mut slot = Slot {
        bytes: &mut pixels,
        width: plan.width,
        height: plan.height,
    };
    image_plan
        .resample_into(&source, 0, &mut slot, Kernels::detect(), &mut Vec::new())
        .map_err(|e| e.to_string())?;
    if plan.flipped {
        for row in pixels.chunks_exact_mut(plan.width as usize * 3) {
            let w = plan.width as usize;
            for i in 0..w / 2 {
                for c in 0..3 {
                    row.swap(i * 3 + c, (w - 1 - i) * 3 + c);
                }
            }
        }
    }
    Ok(pixels)
}

/// Decodes `bytes` composited onto white into `pixels` when the image has transparency (an
/// alpha channel, or a palette or colour marked transparent), as transformers'
/// `convert_to_rgb` makes it: what a pipeline's CPU lane does for the transformers presets.
/// `None` for an image without transparency, which the lane's own decoders take.
pub(crate) fn decode_composited(
    bytes: &[u8],
    options: &DecodeOptions,
    pixels: &mut Vec<u8>,
) -> std::result::Result<Option<Decoded>, ItemErrorKind> {
    let Some(format) = sniff_format(bytes).filter(|&f| may_be_transparent(f)) else {
        return Ok(None);
    };
    let Some(rgb) = decode_transparent(bytes, format, options)? else {
        return Ok(None);
    };
    pixels.clear();
    pixels.extend_from_slice(&rgb.pixels);
    Ok(Some(Decoded::full(rgb.width, rgb.height)))
}

/// Whether the bytes are a format that can carry transparency.
fn may_be_transparent(format: ImageFormat) -> bool {
    matches!(
        format,
        ImageFormat::Png
            | ImageFormat::WebP
            | ImageFormat::Gif
            | ImageFormat::Tiff
            | ImageFormat::Bmp
    )
}

/// The image in RGB (or one gray channel) as transformers' `convert_to_rgb` makes it, or with
/// any alpha dropped as Pillow's `convert("RGB")` drops it.
fn decode_rgb(
    bytes: &[u8],
    options: &DecodeOptions,
    composite_alpha: bool,
) -> std::result::Result<Rgb, ItemErrorKind> {
    let format = sniff_format(bytes).ok_or(ItemErrorKind::UnknownFormat)?;
    if composite_alpha && may_be_transparent(format) {
        if let Some(rgb) = decode_transparent(bytes, format, options)? {
            return Ok(rgb);
        }
    }
    let pool = BufferPool::new(0);
    let mut pixels = Vec::new();
    let whole = |_, _| DecodeWindow {
        reduction: 1,
        region: None,
    };
    let decoded = decode(
        bytes,
        options,
        &whole,
        &mut pixels,
        &pool,
        options.memory_limit,
    )?;
    Ok(Rgb {
        pixels,
        width: decoded.width,
        height: decoded.height,
        channels: decoded.channels,
    })
}

/// An image with transparency, composited onto white; `None` for one without (decoded by the
/// lane's own decoders).
fn decode_transparent(
    bytes: &[u8],
    format: ImageFormat,
    options: &DecodeOptions,
) -> std::result::Result<Option<Rgb>, ItemErrorKind> {
    let name = format!("{format:?}").to_uppercase();
    let fail = |e: image::ImageError| super::decode::image_error(&name, e);
    if format == ImageFormat::WebP {
        // libwebp, Pillow's decoder, as the lane decodes WebP.
        let Some(features) = webp::BitstreamFeatures::new(bytes) else {
            return Ok(None);
        };
        if !features.has_alpha() || features.has_animation() {
            return Ok(None);
        }
        check_size(
            u64::from(features.width()),
            u64::from(features.height()),
            options,
        )?;
        let Some(image) = webp::Decoder::new(bytes).decode() else {
            return Ok(None);
        };
        if !image.is_alpha() {
            return Ok(None);
        }
        let rgba: &[u8] = &image;
        let pixels = rgba.chunks_exact(4).flat_map(composite).collect();
        return Ok(Some(Rgb {
            pixels,
            width: features.width(),
            height: features.height(),
            channels: 3,
        }));
    }
    let mut reader = image::ImageReader::with_format(std::io::Cursor::new(bytes), format);
    let mut limits = image::Limits::default();
    limits.max_alloc = Some(options.memory_limit);
    reader.limits(limits);
    let decoder = reader.into_decoder().map_err(fail)?;
    let color = decoder.color_type();
    if !color.has_alpha() {
        return Ok(None);
    }
    let (width, height) = decoder.dimensions();
    check_size(u64::from(width), u64::from(height), options)?;
    let total = usize::try_from(decoder.total_bytes())
        .map_err(|_| ItemErrorKind::Decode(format!("{name}: too large for memory")))?;
    let mut native = vec![0u8; total];
    decoder.read_image(&mut native).map_err(fail)?;
    let pixels = composite_native(color, &native)?;
    Ok(Some(Rgb {
        pixels,
        width,
        height,
        channels: 3,
    }))
}

/// RGB from a decoder's pixels with alpha, each composited onto white.
fn composite_native(
    color: ColorType,
    native: &[u8],
) -> std::result::Result<Vec<u8>, ItemErrorKind> {
    let hi = |px: &[u8], c: usize| (u16::from_ne_bytes([px[2 * c], px[2 * c + 1]]) >> 8) as u8;
    let rgba: Vec<[u8; 4]> = match color {
        ColorType::La8 => native
            .chunks_exact(2)
            .map(|p| [p[0], p[0], p[0], p[1]])
            .collect(),
        ColorType::Rgba8 => native
            .chunks_exact(4)
            .map(|p| [p[0], p[1], p[2], p[3]])
            .collect(),
        ColorType::La16 => native
            .chunks_exact(4)
            .map(|p| [hi(p, 0), hi(p, 0), hi(p, 0), hi(p, 1)])
            .collect(),
        ColorType::Rgba16 => native
            .chunks_exact(8)
            .map(|p| [hi(p, 0), hi(p, 1), hi(p, 2), hi(p, 3)])
            .collect(),
        other => {
            return Err(ItemErrorKind::Decode(format!(
                "pixels of type {other:?} are not supported"
            )))
        }
    };
    Ok(rgba.iter().flat_map(|p| composite(p)).collect())
}

/// Pillow's `alpha_composite(white, pixel)` (`libImaging/AlphaComposite.c`, 7 extra bits of
/// precision), then `convert("RGB")`: the pixel over an opaque white background.
pub(crate) fn composite(rgba: &[u8]) -> [u8; 3] {
    const PRECISION_BITS: u32 = 7;
    let a = u32::from(rgba[3]);
    if a == 0 {
        return [255; 3];
    }
    let shift_div_255 = |v: u32| ((v >> 8) + v) >> 8;
    // dst = white, opaque: blend = 255 * (255 - a), outa255 = a * 255 + blend.
    let blend = 255 * (255 - a);
    let outa255 = a * 255 + blend;
    let coef1 = a * 255 * 255 * (1 << PRECISION_BITS) / outa255;
    let coef2 = 255 * (1 << PRECISION_BITS) - coef1;
    [0, 1, 2].map(|c| {
        let t = u32::from(rgba[c]) * coef1 + 255 * coef2;
        (shift_div_255(t + (0x80 << PRECISION_BITS)) >> PRECISION_BITS) as u8
    })
}

/// A batch of patch sequences on the host: the token tensor and what describes it.
#[derive(Debug, Clone, PartialEq)]
pub struct PatchBatch {
    /// `[rows, patch_dim]`, row-major.
    pub tokens: HostData,
    /// Values per token.
    pub patch_dim: usize,
    /// Where each image's tokens are.
    pub layout: BatchLayout,
    /// Each image's plan.
    pub plans: Vec<PatchPlan>,
}

impl PatchBatch {
    /// `cu_seqlens`: each image's first row, then the rows.
    pub fn cu_seqlens(&self) -> Vec<i32> {
        self.layout.cu_seqlens()
    }

    /// Qwen2-VL's `image_grid_thw`: (t, h, w) per image.
    pub fn grids(&self) -> Vec<[u32; 3]> {
        self.plans
            .iter()
            .map(|p| [p.grid_t, p.grid_h, p.grid_w])
            .collect()
    }
}

/// Lays out `images` as one batch under `patches` in `dtype`, for sequences of `seq_len`
/// (timm): the CPU rendition of `kernels/patches.cu`.
pub fn patch_batch(
    images: &[PatchImage],
    patches: &Patches,
    dtype: DType,
    seq_len: Option<u32>,
) -> Result<PatchBatch> {
    let plans: Vec<PatchPlan> = images.iter().map(|i| i.plan).collect();
    let grids: Vec<(u32, u32)> = plans.iter().map(|p| (p.grid_h, p.grid_w)).collect();
    let longest = grids.iter().map(|&(h, w)| h * w).max().unwrap_or(0);
    let layout = BatchLayout::new(&grids, patches.packing(longest, seq_len))
        .map_err(|e| Error::Mismatch(e.to_string()))?;
    let dim = patches.patch_dim();
    let mut tokens = match dtype {
        DType::F16 => HostData::F16(vec![f16::ZERO; layout.rows * dim]),
        DType::BF16 => HostData::BF16(vec![bf16::ZERO; layout.rows * dim]),
        DType::F32 => HostData::F32(vec![0.0; layout.rows * dim]),
        other => return Err(other.not_an_output()),
    };
    let pixels: Vec<&[u8]> = images.iter().map(|i| i.pixels.as_slice()).collect();
    TokenWriter::new(patches, dtype)?.write(&pixels, &plans, &layout, &mut tokens)?;
    Ok(PatchBatch {
        tokens,
        patch_dim: dim,
        layout,
        plans,
    })
}

/// Writes the tokens of images into a batch's rows as one preset lays them out, in one element
/// type: the CPU rendition of `kernels/patches.cu`. Made once for a pipeline's batches.
pub(crate) struct TokenWriter {
    dim: usize,
    patch: u32,
    typed: TypedWriter,
}

/// The writer of each element type.
enum TypedWriter {
    F16(ElementWriter<f16>),
    BF16(ElementWriter<bf16>),
    F32(ElementWriter<f32>),
}

impl TokenWriter {
    /// The writer of `patches`' tokens in `dtype`.
    pub(crate) fn new(patches: &Patches, dtype: DType) -> Result<TokenWriter> {
        let table = patches.constants().table();
        let pad = patches.pad_values();
        let order = patches.token_order();
        let patch = patches.patch_size;
        let typed = match dtype {
            DType::F16 => {
                TypedWriter::F16(ElementWriter::new(order, patch, &table, pad, f16::from_f32))
            }
            DType::BF16 => TypedWriter::BF16(ElementWriter::new(
                order,
                patch,
                &table,
                pad,
                bf16::from_f32,
            )),
            DType::F32 => TypedWriter::F32(ElementWriter::new(order, patch, &table, pad, |x| x)),
            other => return Err(other.not_an_output()),
        };
        Ok(TokenWriter {
            dim: patches.patch_dim(),
            patch,
            typed,
        })
    }

    /// Writes the tokens of `images` (each the resized pixels of its plan in `plans`, rows
    /// packed) into `out` (`layout.rows` rows of `patch_dim` elements), an image at a time on
    /// the current rayon pool.
    pub(crate) fn write(
        &self,
        images: &[&[u8]],
        plans: &[PatchPlan],
        layout: &BatchLayout,
        out: &mut HostData,
    ) -> Result<()> {
        let fits = images.len() == plans.len()
            && plans.len() == layout.images.len()
            && out.len() == layout.rows * self.dim
            && layout.images.iter().map(|p| p.rows).sum::<usize>() == layout.rows
            && images
                .iter()
                .zip(plans)
                .zip(&layout.images)
                .all(|((pixels, plan), place)| {
                    pixels.len() >= plan.width as usize * plan.height as usize * 3
                        && plan.grid_w * self.patch <= plan.width
                        && plan.grid_h * self.patch <= plan.height
                        && (place.grid_h, place.grid_w) == (plan.grid_h, plan.grid_w)
                        && place.rows >= place.tokens()
                });
        if !fits {
            return Err(Error::Mismatch(format!(
                "{} images and {} plans for a layout of {} images in {} elements",
                images.len(),
                plans.len(),
                layout.images.len(),
                out.len()
            )));
        }
        match (&self.typed, out) {
            (TypedWriter::F16(w), HostData::F16(v)) => w.write_all(images, plans, layout, v),
            (TypedWriter::BF16(w), HostData::BF16(v)) => w.write_all(images, plans, layout, v),
            (TypedWriter::F32(w), HostData::F32(v)) => w.write_all(images, plans, layout, v),
            (_, other) => {
                return Err(Error::Mismatch(format!(
                    "tokens of another type than the writer's: {:?}",
                    other.dtype()
                )))
            }
        }
        Ok(())
    }
}

/// Writes images' tokens of element type `T`: every (channel, byte) value and the padding
/// converted to `T` once, each token a gather from its patch through that table, the values it
/// repeats copied.
struct ElementWriter<T> {
    order: TokenOrder,
    patch: u32,
    dim: usize,
    /// The value of byte `x` of channel `c` at `c * 256 + x`.
    values: Vec<T>,
    /// A padding token.
    pad: Vec<T>,
    /// The token's values read from its patch, as runs along the patch's rows.
    gathers: Vec<Gather>,
    /// The token's values that repeat earlier ones (Qwen2-VL's frames along time), as runs:
    /// `len` values from `from` copied to `to`.
    repeats: Vec<Repeat>,
}

/// A run of a token's values read from one row of its patch, one channel, along the row:
/// value `d + i * d_step` is sample `within + i * 3` of patch row `row`, for `i < len`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Gather {
    /// The place of its first value in the token.
    d: usize,
    /// How far apart its values are in the token.
    d_step: usize,
    /// The patch row it is read from.
    row: usize,
    /// Its first sample's place within that row of the image (`column * 3 + channel`).
    within: usize,
    /// Its channel's first place in the value table (`channel * 256`).
    channel: usize,
    /// Its values.
    len: usize,
}

/// A run of a token's values repeating earlier ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Repeat {
    to: usize,
    from: usize,
    len: usize,
}

impl<T: Copy + Send + Sync> ElementWriter<T> {
    fn new(
        order: TokenOrder,
        patch: u32,
        table: &[[f32; 256]; 3],
        pad: [f32; 3],
        convert: impl Fn(f32) -> T,
    ) -> ElementWriter<T> {
        let dim = order.patch_dim(patch);
        let values = table.iter().flatten().map(|&v| convert(v)).collect();
        let mut first = std::collections::HashMap::new();
        let mut pad_token = Vec::with_capacity(dim);
        let mut read = Vec::with_capacity(dim);
        let mut repeats: Vec<Repeat> = Vec::new();
        for d in 0..dim {
            let (c, y, x) = order.value_source(d as u32, patch);
            pad_token.push(convert(pad[c as usize]));
            match first.entry((c, y, x)) {
                std::collections::hash_map::Entry::Occupied(seen) => {
                    let from = *seen.get();
                    match repeats.last_mut() {
                        Some(run) if run.to + run.len == d && run.from + run.len == from => {
                            run.len += 1
                        }
                        _ => repeats.push(Repeat {
                            to: d,
                            from,
                            len: 1,
                        }),
                    }
                }
                std::collections::hash_map::Entry::Vacant(slot) => {
                    slot.insert(d);
                    read.push((c as usize, y as usize, x as usize, d));
                }
            }
        }
        // The values read, channel by channel and row by row along the patch, as runs whose
        // places in the token are evenly spaced (Qwen2-VL: one after the other; SigLIP2 and
        // timm: every third).
        read.sort_unstable();
        let mut gathers: Vec<Gather> = Vec::new();
        for (c, row, x, d) in read {
            let (within, channel) = (x * 3 + c, c * 256);
            match gathers.last_mut() {
                Some(run)
                    if run.row == row
                        && run.channel == channel
                        && run.within + run.len * 3 == within
                        && d > run.d
                        && (run.len == 1 || run.d + run.len * run.d_step == d) =>
                {
                    if run.len == 1 {
                        run.d_step = d - run.d;
                    }
                    run.len += 1;
                }
                _ => gathers.push(Gather {
                    d,
                    d_step: 1,
                    row,
                    within,
                    channel,
                    len: 1,
                }),
            }
        }
        ElementWriter {
            order,
            patch,
            dim,
            values,
            pad: pad_token,
            gathers,
            repeats,
        }
    }

    /// Every image's rows of `out`, in parallel (each image's rows are its own).
    fn write_all(
        &self,
        images: &[&[u8]],
        plans: &[PatchPlan],
        layout: &BatchLayout,
        out: &mut [T],
    ) {
        use rayon::prelude::*;
        let mut rest = out;
        let mut chunks = Vec::with_capacity(layout.images.len());
        for place in &layout.images {
            let (mine, after) = std::mem::take(&mut rest).split_at_mut(place.rows * self.dim);
            chunks.push(mine);
            rest = after;
        }
        chunks
            .into_par_iter()
            .zip(images.par_iter().zip(plans).zip(&layout.images))
            .for_each(|(rows, ((pixels, plan), place))| {
                self.write(pixels, plan.width as usize, place, rows)
            });
    }

    /// One image's rows (`rows`, from its first): its tokens, then the padding. The caller
    /// has checked that every patch of `place`'s grid lies within `pixels`.
    fn write(&self, pixels: &[u8], width: usize, place: &ImageTokens, rows: &mut [T]) {
        let patch = self.patch as usize;
        let stride = width * 3;
        for (k, token) in rows.chunks_exact_mut(self.dim).enumerate() {
            if k >= place.tokens() {
                token.copy_from_slice(&self.pad);
                continue;
            }
            let (pr, pc) = self.order.token_patch(k as u32, place.grid_w);
            let first = pr as usize * patch * stride + pc as usize * patch * 3;
            let patch_pixels = &pixels[first..];
            for g in &self.gathers {
                let values = &self.values[g.channel..g.channel + 256];
                let from = g.row * stride + g.within;
                let samples = patch_pixels[from..from + 3 * (g.len - 1) + 1]
                    .iter()
                    .step_by(3);
                let to = token[g.d..].iter_mut().step_by(g.d_step);
                for (v, &sample) in to.zip(samples) {
                    *v = values[usize::from(sample)];
                }
            }
            for r in &self.repeats {
                token.copy_within(r.from..r.from + r.len, r.to);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compositing_onto_white_is_pillows() {
        assert_eq!(composite(&[10, 20, 30, 0]), [255; 3]);
        for v in 0..=255u8 {
            assert_eq!(composite(&[v, v, v, 255]), [v; 3], "opaque keeps {v}");
        }
        // Half transparent black over white: about 127.
        let half = composite(&[0, 0, 0, 128]);
        assert!((126..=128).contains(&half[0]), "{half:?}");
    }

    #[test]
    fn the_qwen_layout_of_a_real_photo() {
        let bytes = std::fs::read("assets/rocket.jpg").expect("asset");
        let q = Patches::qwen2_vl();
        let image = patch_image(&bytes, "rocket.jpg", &DecodeOptions::default(), &q, None)
            .expect("patches");
        let batch = patch_batch(std::slice::from_ref(&image), &q, DType::F32, None).expect("batch");
        let p = image.plan;
        assert_eq!(batch.layout.rows, p.tokens());
        assert_eq!(batch.cu_seqlens(), [0, p.tokens() as i32]);
        let HostData::F32(v) = &batch.tokens else {
            panic!("f32 asked for")
        };
        // Token 2 is the patch below the first one (a merge block's second row); its value 0
        // is channel 0 of pixel (14, 0), and value 196 (time 1) repeats it.
        let k = q.constants();
        let px = image.pixels[14 * p.width as usize * 3];
        assert_eq!(v[2 * 1176], k.value(0, px));
        assert_eq!(v[2 * 1176 + 196], k.value(0, px));
    }

    /// Each value as the kernel's definition reads it: token `k`'s patch, value `d`'s
    /// (channel, row, column) in it, the table's value; the padding's after an image's tokens.
    fn value_by_value(image: &PatchImage, patches: &Patches, k: usize, d: usize) -> f32 {
        let order = patches.token_order();
        let (c, y, x) = order.value_source(d as u32, patches.patch_size);
        if k >= image.plan.tokens() {
            return patches.pad_values()[c as usize];
        }
        let (pr, pc) = order.token_patch(k as u32, image.plan.grid_w);
        let row = (pr * patches.patch_size + y) as usize;
        let col = (pc * patches.patch_size + x) as usize;
        let sample = image.pixels[(row * image.plan.width as usize + col) * 3 + c as usize];
        patches.constants().table()[c as usize][usize::from(sample)]
    }

    #[test]
    fn tokens_are_the_table_values_of_their_patches_samples() {
        let files = [
            "assets/rocket.jpg",
            "assets/chelsea.png",
            "assets/camera.png",
        ];
        let presets = [
            Patches::qwen2_vl().max_pixels(60_000),
            Patches::siglip2_naflex().max_patches(64),
            Patches::siglip2_naflex().max_patches(64).packed(true),
            Patches::timm_naflex(),
        ];
        for patches in &presets {
            let images: Vec<PatchImage> = files
                .iter()
                .enumerate()
                .map(|(index, f)| {
                    let bytes = std::fs::read(f).expect("asset");
                    let draw = PatchDraw {
                        seq_len: 144,
                        seed: 3,
                        epoch: 1,
                        index,
                    };
                    let draw =
                        (patches.preset == crate::patches::Preset::TimmNaflex).then_some(draw);
                    patch_image(&bytes, f, &DecodeOptions::default(), patches, draw).expect("image")
                })
                .collect();
            let seq_len = (patches.preset == crate::patches::Preset::TimmNaflex).then_some(144);
            for dtype in [DType::F32, DType::F16, DType::BF16] {
                let batch = patch_batch(&images, patches, dtype, seq_len).expect("batch");
                let dim = batch.patch_dim;
                let mut checked = 0;
                for (image, place) in images.iter().zip(&batch.layout.images) {
                    for k in 0..place.rows {
                        for d in 0..dim {
                            let want = value_by_value(image, patches, k, d);
                            let at = (place.first_row + k) * dim + d;
                            let got = match &batch.tokens {
                                HostData::F32(v) => v[at].to_bits() == want.to_bits(),
                                HostData::F16(v) => v[at] == f16::from_f32(want),
                                HostData::BF16(v) => v[at] == bf16::from_f32(want),
                                _ => false,
                            };
                            assert!(got, "{:?} {dtype:?}: token {k} value {d}", patches.preset);
                            checked += 1;
                        }
                    }
                }
                assert_eq!(checked, batch.layout.rows * dim);
            }
        }
    }

    #[test]
    fn a_layout_that_does_not_fit_its_plans_is_an_error() {
        let bytes = std::fs::read("assets/rocket.jpg").expect("asset");
        let q = Patches::qwen2_vl().max_pixels(60_000);
        let image = patch_image(&bytes, "rocket.jpg", &DecodeOptions::default(), &q, None)
            .expect("patches");
        let batch = patch_batch(std::slice::from_ref(&image), &q, DType::F32, None).expect("batch");
        let writer = TokenWriter::new(&q, DType::F32).expect("writer");
        let pixels = [image.pixels.as_slice()];
        let mut out = batch.tokens.clone();
        writer
            .write(&pixels, &batch.plans, &batch.layout, &mut out)
            .expect("the batch's own layout");
        assert_eq!(out, batch.tokens);
        let mut wider = batch.layout.clone();
        wider.images[0].grid_w += 1;
        assert!(writer
            .write(&pixels, &batch.plans, &wider, &mut out)
            .is_err());
        let mut longer = batch.layout.clone();
        longer.images[0].rows += 1;
        assert!(writer
            .write(&pixels, &batch.plans, &longer, &mut out)
            .is_err());
        let mut halves = HostData::F16(vec![f16::ZERO; out.len()]);
        assert!(writer
            .write(&pixels, &batch.plans, &batch.layout, &mut halves)
            .is_err());
    }

    #[test]
    fn bad_images_are_errors_naming_them() {
        let q = Patches::qwen2_vl();
        let e = patch_image(
            b"not an image",
            "x.bin",
            &DecodeOptions::default(),
            &q,
            None,
        )
        .expect_err("refused");
        assert!(e.to_string().starts_with("x.bin: "), "{e}");
    }
}
