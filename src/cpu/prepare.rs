//! One image through the CPU lane: read, decode (only the window the resize reads), resize and
//! crop straight into its destination, with this thread's reusable scratch buffers.

use std::cell::RefCell;
use std::sync::Arc;
use std::time::Instant;

use super::decode::{decode, DecodeWindow, Decoded};
use super::patches::decode_composited;
use super::probe::probe;
use super::resize::resize_into_slot;
use super::stage::LaneCore;
use crate::error::{panic_message, Error, ItemError, ItemErrorKind, Result};
use crate::geometry::{CropDraw, Geometry, Placement};
use crate::options::{DecodeOptions, ResizeOptions};
use crate::patches::PatchError;
use crate::profile::Stage;
use crate::resample::{ImagePlan, Kernels};
use crate::source::Source;

/// What an [`ImagePlan`] was made for: the full-size image (after any EXIF turn), the DCT
/// reduction and the decoded size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Planned {
    width: u32,
    height: u32,
    reduction: u32,
    decoded_width: u32,
    decoded_height: u32,
}

impl Planned {
    fn of(decoded: &Decoded) -> Planned {
        Planned {
            width: decoded.source_width,
            height: decoded.source_height,
            reduction: decoded.reduction,
            decoded_width: decoded.width,
            decoded_height: decoded.height,
        }
    }
}

/// Per-thread scratch, reused across images: the plan of the image in hand (made when its
/// decode window is chosen, used by its resize: the same integer plan decides both) and the
/// 8-bit intermediate of the resize's two passes. Decoded pixels live in the lane's pool.
struct Scratch {
    plan: ImagePlan,
    planned: Option<Planned>,
    intermediate: Vec<u8>,
    kernels: Kernels,
}

impl Scratch {
    fn new() -> Scratch {
        Scratch {
            plan: ImagePlan::default(),
            planned: None,
            intermediate: Vec::new(),
            kernels: Kernels::detect(),
        }
    }
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::new());
}

/// How the CPU lane turns one image into output pixels.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PrepareOptions {
    pub decode: DecodeOptions,
    pub geometry: Geometry,
}

impl PrepareOptions {
    /// Images decoded under `decode`, to the output `geometry` plans.
    pub fn new(decode: &DecodeOptions, geometry: Geometry) -> PrepareOptions {
        PrepareOptions {
            decode: *decode,
            geometry,
        }
    }
}

/// Which image of which epoch is being prepared: random transforms draw from both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ImageTask {
    /// Index of the image in the source.
    pub index: usize,
    /// The epoch it is prepared for.
    pub epoch: u64,
    /// The sequence length of the batch it goes to (timm's patch sequences; 0 otherwise).
    pub seq_len: u32,
}

/// What preparing an image made: what its random transforms drew (a patch-sequence output's
/// box and flip, always), and the bytes of its destination it wrote, from the first (the whole
/// image of a fixed-size output; its own resized size, rows packed, for a patch sequence; the
/// record of its views in a pipeline of views, with what each view drew).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Made {
    pub draw: Option<CropDraw>,
    pub bytes: usize,
    pub views: Option<Vec<crate::views::ViewDraw>>,
}

/// An image a patch-sequence output's rule refuses, as the image's error.
fn refused(e: PatchError) -> ItemErrorKind {
    ItemErrorKind::Resize(e.to_string())
}

/// Reads, decodes and resizes one image of `source` into `dst`. The image's header is read
/// first: an image over the pixel limit is refused before its file is read, and the memory its
/// decode will hold is reserved from `budget` for as long as it is in flight.
pub(crate) fn prepare_one(
    source: &Source,
    task: ImageTask,
    core: &LaneCore,
    dst: &mut [u8],
) -> std::result::Result<Made, ItemErrorKind> {
    let (options, budget, pool) = (&core.options, &core.budget, &core.buffers);
    let reading = Instant::now();
    let item = source
        .item(task.index)
        .open(options.decode.max_file_bytes)?;
    let header = probe(&item, &options.decode)?;
    refuse_early(options, &header, task)?;
    let reservation = budget.reserve(header.bytes_in_flight);
    let rgb_bytes = header.width.saturating_mul(header.height).saturating_mul(3);
    // The encoded bytes too go in a buffer of the pool.
    let buffer = pool.take(item.len() as usize);
    let lent = buffer.capacity();
    let read = item.read(buffer);
    core.stopwatch.add(Stage::CpuRead, reading.elapsed());
    let prepared = match read {
        Ok(bytes) => {
            let memory = Memory {
                reserved: header.bytes_in_flight,
                size_hint: rgb_bytes as usize,
            };
            let prepared = prepare_bytes(&bytes, core, &memory, task, dst);
            pool.give(bytes.into_buffer(), lent);
            prepared
        }
        Err((e, buffer)) => {
            pool.give(buffer, lent);
            Err(e)
        }
    };
    drop(reservation);
    prepared
}

/// Refuses, from its header and before its file is read, an image a patch-sequence output's
/// rule refuses (Qwen2-VL's aspect ratio over 200): the error the decode would end in. Not
/// where the EXIF tag may turn the image (the header's sizes are the stored image's).
fn refuse_early(
    options: &PrepareOptions,
    header: &super::probe::Probe,
    task: ImageTask,
) -> std::result::Result<(), ItemErrorKind> {
    let geometry = options.geometry.for_sequence(task.seq_len);
    if geometry.patches.is_none() || options.decode.exif_orientation {
        return Ok(());
    }
    let (Ok(width), Ok(height)) = (u32::try_from(header.width), u32::try_from(header.height))
    else {
        return Ok(());
    };
    if width == 0 || height == 0 {
        return Ok(());
    }
    geometry
        .placement(width, height, task.index, task.epoch)
        .map(|_| ())
        .map_err(refused)
}

/// The memory one image's decode may take from the lane's buffers: what was reserved for it and
/// the size of its RGB pixels.
struct Memory {
    /// Bytes reserved for the image's decode ([`super::probe::Probe::bytes_in_flight`]): what
    /// its decoder may allocate.
    reserved: u64,
    size_hint: usize,
}

/// Decodes and resizes one encoded image into `dst`, with the random transforms `task` draws.
/// A panic inside a decoder (a bug the fuzzer has not found) becomes this image's error instead
/// of taking the pipeline down.
fn prepare_bytes(
    bytes: &[u8],
    core: &LaneCore,
    memory: &Memory,
    task: ImageTask,
    dst: &mut [u8],
) -> std::result::Result<Made, ItemErrorKind> {
    let pool = &core.buffers;
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut pixels = pool.take(memory.size_hint);
        let lent = pixels.capacity();
        let prepared = prepare_bytes_unguarded(bytes, core, memory, task, &mut pixels, dst);
        pool.give(pixels, lent);
        prepared
    }))
    .unwrap_or_else(|panic| {
        // The scratch may have been left mid-update: start the next image from fresh buffers.
        let _ = SCRATCH.try_with(|s| {
            if let Ok(mut s) = s.try_borrow_mut() {
                *s = Scratch::new();
            }
        });
        Err(ItemErrorKind::DecoderPanic(panic_message(panic.as_ref())))
    })
}

/// Decodes and resizes one encoded image into `dst`, with this thread's scratch buffers; returns
/// what its random transforms drew (from the image's size after any EXIF turn) and the bytes it
/// wrote.
fn prepare_bytes_unguarded(
    bytes: &[u8],
    core: &LaneCore,
    memory: &Memory,
    task: ImageTask,
    pixels: &mut Vec<u8>,
    dst: &mut [u8],
) -> std::result::Result<Made, ItemErrorKind> {
    let (options, pool, stopwatch) = (&core.options, &core.buffers, &core.stopwatch);
    SCRATCH.with(|scratch| {
        let scratch = &mut *scratch.borrow_mut();
        let geometry = &options.geometry.for_sequence(task.seq_len);
        let Scratch {
            plan,
            planned,
            intermediate,
            kernels,
        } = scratch;
        *planned = None;
        let planning = RefCell::new((plan, planned));
        // Where the image lands for the size the window was asked for, kept for the resize:
        // each image draws once.
        let placed = RefCell::new(None);
        // Asked by the JPEG decoder with the full-size image's size (after any EXIF turn): the
        // plan decides the DCT reduction and the window, and is kept for the resize.
        let window = |w: u32, h: u32| {
            let placement = geometry.placement(w, h, task.index, task.epoch);
            let whole = DecodeWindow {
                reduction: 1,
                region: None,
            };
            let Ok(Placement { x, y, .. }) = placement else {
                // Refused by its rule: decoded whole, and the error reported after.
                placed.replace(Some((w, h, placement)));
                return whole;
            };
            placed.replace(Some((w, h, placement)));
            let reduction = if options.decode.dct_scaling {
                Geometry::max_reduction(&x, &y)
            } else {
                1
            };
            let key = Planned {
                width: w,
                height: h,
                reduction,
                decoded_width: w.div_ceil(reduction),
                decoded_height: h.div_ceil(reduction),
            };
            let mut guard = planning.borrow_mut();
            let (plan, planned) = &mut *guard;
            let made = geometry.plan_axes(
                &x,
                &y,
                reduction,
                key.decoded_width,
                key.decoded_height,
                plan,
            );
            **planned = made.is_ok().then_some(key);
            DecodeWindow {
                reduction,
                region: (made.is_ok() && options.decode.partial_decode)
                    .then(|| Geometry::decode_window(plan, reduction, w, h))
                    .flatten(),
            }
        };
        let decoded = stopwatch.time(Stage::CpuDecode, || {
            // Transparency composited onto white first, as transformers' processors do.
            if geometry.composites_alpha() {
                if let Some(decoded) = decode_composited(bytes, &options.decode, pixels)? {
                    return Ok(decoded);
                }
            }
            decode(
                bytes,
                &options.decode,
                &window,
                pixels,
                pool,
                memory.reserved,
            )
        })?;
        let (plan, planned) = planning.into_inner();
        let source = (decoded.source_width, decoded.source_height);
        let placement = match placed.into_inner() {
            Some((w, h, placement)) if (w, h) == source => placement,
            _ => geometry.placement(source.0, source.1, task.index, task.epoch),
        }
        .map_err(refused)?;
        if *planned != Some(Planned::of(&decoded)) {
            // Not a JPEG, or decoded otherwise than planned (another decoder, no reduction).
            geometry
                .plan_axes(
                    &placement.x,
                    &placement.y,
                    decoded.reduction,
                    decoded.width,
                    decoded.height,
                    plan,
                )
                .map_err(|e| ItemErrorKind::Resize(e.to_string()))?;
        }
        let (width, height) = geometry.out_size(&placement.x, &placement.y);
        let written = width as usize * height as usize * 3;
        let Some(slot) = dst.get_mut(..written) else {
            return Err(ItemErrorKind::Resize(format!(
                "{width}x{height} pixels do not fit the image's {} bytes of staging",
                dst.len()
            )));
        };
        stopwatch.time(Stage::CpuResize, || {
            resize_into_slot(
                pixels,
                decoded,
                (width, height, geometry.pad()),
                plan,
                placement.draw.is_some_and(|d| d.flipped),
                (*kernels, core.resize_threads()),
                intermediate,
                slot,
            )
        })?;
        Ok(Made {
            draw: placement.draw,
            bytes: written,
            views: None,
        })
    })
}

/// The CPU lane on one encoded image, exactly as the pipeline runs it: sniff the format, decode,
/// resize and crop into `out`, which must hold one output image as packed RGB8
/// (`height * width * 3` bytes of [`ResizeOptions::output_size`]). A bad image is
/// [`Error::Item`] with the id `"<memory>"`.
///
/// ```
/// use gpufeed::{DecodeOptions, ResizeOptions};
/// let bytes = std::fs::read("assets/rocket.jpg")?;
/// let resize = ResizeOptions::default(); // Resize(256) + CenterCrop(224)
/// let mut pixels = vec![0u8; resize.image_bytes()?];
/// gpufeed::prepare_image(&bytes, &DecodeOptions::default(), &resize, &mut pixels)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn prepare_image(
    bytes: &[u8],
    decode: &DecodeOptions,
    resize: &ResizeOptions,
    out: &mut [u8],
) -> Result<()> {
    crate::Options::default()
        .decode(*decode)
        .resize(*resize)
        .validate()?;
    let core = LaneCore::new(decode, Geometry::new(resize), Arc::default());
    let want = core.options.geometry.image_bytes();
    if out.len() != want {
        return Err(Error::Mismatch(format!(
            "output buffer holds {} bytes, one {}x{} RGB image needs {want}",
            out.len(),
            core.options.geometry.width,
            core.options.geometry.height,
        )));
    }
    let item_error = |kind| {
        Error::Item(ItemError {
            id: "<memory>".into(),
            index: 0,
            kind,
        })
    };
    let header = probe(bytes, &core.options.decode).map_err(item_error)?;
    let memory = Memory {
        reserved: header.bytes_in_flight,
        size_hint: 0,
    };
    let task = ImageTask {
        index: 0,
        epoch: 0,
        seq_len: 0,
    };
    prepare_bytes(bytes, &core, &memory, task, out)
        .map(|_| ())
        .map_err(item_error)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::BufferPool;

    fn pool() -> BufferPool {
        BufferPool::new(1 << 30)
    }

    /// A lane core that prepares images as `options` say.
    fn core_of(options: &PrepareOptions) -> LaneCore {
        LaneCore {
            options: *options,
            budget: Arc::new(crate::memory::MemoryBudget::new(1 << 30)),
            buffers: pool(),
            stopwatch: Arc::default(),
            resize_threads: Default::default(),
            views: None,
        }
    }

    /// What one image's decode may use in these tests: a large reservation.
    const MEMORY: Memory = Memory {
        reserved: 1 << 30,
        size_hint: 0,
    };

    const TASK: ImageTask = ImageTask {
        index: 0,
        epoch: 0,
        seq_len: 0,
    };
    use crate::cpu::decode::decode;
    use crate::options::{Interpolation, ResizeMode, ResizeOptions};

    /// JPEGs of every shape the partial decode meets: the bundled photos, the JPEG fixtures
    /// (`sampling_2x1_all.jpg`, made with `cjpeg -sample 2x1,2x1,2x1`, has sampling factors
    /// libjpeg-turbo cannot crop at the MCU it reports, so it is decoded whole),
    /// ImageNet-sized crops of the photos (colour 4:2:0 and 4:4:4, and gray, and every fourth
    /// also as a lossy and a lossless WebP) at random sizes and aspect ratios, the JPEGs and
    /// WebPs of the fixtures, and the files of `GPUFEED_TEST_CORPUS` if set (e.g. a make-corpus
    /// folder).
    fn jpegs() -> Vec<(String, Vec<u8>)> {
        use image::codecs::jpeg::JpegEncoder;
        let mut out: Vec<(String, Vec<u8>)> = Vec::new();
        let mut read_dir = |dir: &std::path::Path| {
            let mut stack = vec![dir.to_path_buf()];
            while let Some(d) = stack.pop() {
                for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
                    let path = entry.path();
                    let name = path.to_string_lossy().to_lowercase();
                    if path.is_dir() {
                        stack.push(path);
                    } else if name.ends_with(".jpg")
                        || name.ends_with(".jpeg")
                        || name.ends_with(".webp")
                    {
                        out.push((name, std::fs::read(&path).expect("read")));
                    }
                }
            }
        };
        read_dir(std::path::Path::new("assets"));
        read_dir(std::path::Path::new("tests/fixtures"));
        if let Ok(dir) = std::env::var("GPUFEED_TEST_CORPUS") {
            read_dir(std::path::Path::new(&dir));
        }
        let photo = image::open("assets/astronaut.png")
            .expect("photo")
            .to_rgb8();
        let photo = image::imageops::resize(&photo, 1000, 900, image::imageops::Triangle);
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = |n: u32| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % n as u64) as u32
        };
        for i in 0..24 {
            let (w, h) = (100 + next(700), 60 + next(700));
            let (x, y) = (next(photo.width() - w), next(photo.height() - h));
            let crop = image::imageops::crop_imm(&photo, x, y, w, h).to_image();
            if i % 4 == 1 {
                let webp = webp::Encoder::from_rgb(crop.as_raw(), w, h);
                out.push((format!("lossy {w}x{h} #{i}"), webp.encode(80.0).to_vec()));
                out.push((
                    format!("lossless {w}x{h} #{i}"),
                    webp.encode_lossless().to_vec(),
                ));
            }
            let mut bytes = Vec::new();
            let mut encoder = JpegEncoder::new_with_quality(&mut bytes, 75 + (i % 20) as u8);
            if i % 4 == 3 {
                let gray = image::DynamicImage::ImageRgb8(crop).to_luma8();
                encoder.encode_image(&gray).expect("encode");
            } else {
                encoder.encode_image(&crop).expect("encode");
            }
            out.push((format!("synthetic {w}x{h} #{i}"), bytes));
        }
        out
    }

    /// Decoding only the window the resize reads gives the very bytes of decoding everything,
    /// for every filter, other sizes, and with DCT scaling.
    #[test]
    fn partial_decode_is_exact() {
        let plain = DecodeOptions::default();
        let scaled = DecodeOptions::default().dct_scaling(true);
        let resize = ResizeOptions::default();
        let configs = [
            (plain, resize),
            (plain, resize.interpolation(Interpolation::Lanczos)),
            (scaled, resize.interpolation(Interpolation::Bicubic)),
            (plain, resize.interpolation(Interpolation::Nearest)),
            (
                scaled,
                resize.mode(ResizeMode::ShorterSideThenCenterCrop {
                    shorter_side: 160,
                    height: 128,
                    width: 96,
                }),
            ),
            // Random crops (a new box for every file) and flips, whole size and reduced.
            (plain, ResizeOptions::imagenet_train(224, 3)),
            (scaled, ResizeOptions::imagenet_train(112, 4)),
        ];
        let files = jpegs();
        let mut compared = 0;
        for (decode, resize) in &configs {
            let partial = PrepareOptions::new(decode, Geometry::new(resize));
            let whole = PrepareOptions::new(&decode.partial_decode(false), Geometry::new(resize));
            assert!(partial.decode.partial_decode);
            let mut a = vec![0u8; partial.geometry.image_bytes()];
            let mut b = vec![1u8; partial.geometry.image_bytes()];
            for (i, (name, bytes)) in files.iter().enumerate() {
                let task = ImageTask {
                    index: i,
                    epoch: 1,
                    seq_len: 0,
                };
                let ra = prepare_bytes(bytes, &core_of(&whole), &MEMORY, task, &mut a);
                let rb = prepare_bytes(bytes, &core_of(&partial), &MEMORY, task, &mut b);
                assert_eq!(ra.is_ok(), rb.is_ok(), "{name}");
                if ra.is_ok() {
                    assert!(
                        a == b,
                        "{name}: partial decode differs ({decode:?} {resize:?})"
                    );
                    compared += 1;
                }
            }
        }
        assert!(compared >= configs.len() * 30, "only {compared} compared");
    }

    /// A random crop and flip on the CPU lane are torchvision's `F.resized_crop` + `F.hflip` of
    /// the drawn box: equal to the scalar Pillow port on the same decoded pixels, every colour
    /// and gray photo, many draws.
    #[test]
    fn random_crops_are_torchvision_resized_crops() {
        use crate::resample::{resample, Filter};
        let resize = ResizeOptions::imagenet_train(96, 5);
        let options = PrepareOptions::new(&DecodeOptions::default(), Geometry::new(&resize));
        let mut compared = 0;
        let mut flipped = 0;
        for name in [
            "assets/chelsea.png",
            "assets/astronaut.png",
            "assets/camera.png",
        ] {
            let bytes = std::fs::read(name).expect("photo");
            let mut rgb = Vec::new();
            let decoded = decode(
                &bytes,
                &options.decode,
                &|_, _| DecodeWindow::WHOLE,
                &mut rgb,
                &pool(),
                1 << 30,
            )
            .expect("decode");
            let rgb: Vec<u8> = match decoded.channels {
                1 => rgb.iter().flat_map(|&g| [g, g, g]).collect(),
                _ => rgb,
            };
            for index in 0..12 {
                let task = ImageTask {
                    index,
                    epoch: 2,
                    seq_len: 0,
                };
                let mut got = vec![0u8; options.geometry.image_bytes()];
                let draw = prepare_bytes(&bytes, &core_of(&options), &MEMORY, task, &mut got)
                    .expect("prepare")
                    .draw
                    .expect("random");
                assert_eq!(
                    Some(draw),
                    resize.draw(decoded.width, decoded.height, index, 2),
                    "the draw the options give"
                );
                let (x, y) =
                    options
                        .geometry
                        .axis_plans(decoded.width, decoded.height, Some(&draw));
                let mut want = vec![0u8; got.len()];
                resample(
                    &rgb,
                    decoded.width,
                    decoded.height,
                    3,
                    &x,
                    &y,
                    Filter::Bilinear,
                    0,
                    &mut want,
                    96,
                    96,
                )
                .expect("Pillow port");
                if draw.flipped {
                    flipped += 1;
                    for row in want.chunks_exact_mut(96 * 3) {
                        let mirrored: Vec<u8> =
                            row.chunks_exact(3).rev().flatten().copied().collect();
                        row.copy_from_slice(&mirrored);
                    }
                }
                let differing = got.iter().zip(&want).filter(|(a, b)| a != b).count();
                assert_eq!(differing, 0, "{name} #{index} {draw:?}: bytes differ");
                compared += 1;
            }
        }
        assert_eq!(compared, 36);
        assert!((6..=30).contains(&flipped), "{flipped} of 36 flipped");
    }

    /// A gray JPEG resized as one channel equals the same image resized as RGB.
    #[test]
    fn gray_jpegs_resize_as_one_channel_exactly() {
        let jpeg = std::fs::read("tests/fixtures/gray.jpg").expect("fixture");
        let options = PrepareOptions::new(
            &DecodeOptions::default(),
            Geometry::new(&ResizeOptions::default()),
        );
        let mut one_channel = vec![0u8; options.geometry.image_bytes()];
        prepare_bytes(&jpeg, &core_of(&options), &MEMORY, TASK, &mut one_channel)
            .expect("gray path");
        // The same gray pixels spread to RGB and resized as RGB.
        let mut gray = Vec::new();
        let decoded = decode(
            &jpeg,
            &options.decode,
            &|_, _| DecodeWindow::WHOLE,
            &mut gray,
            &pool(),
            1 << 30,
        )
        .expect("decode");
        assert_eq!(decoded.channels, 1);
        let rgb: Vec<u8> = gray.iter().flat_map(|&g| [g, g, g]).collect();
        let mut three_channels = vec![0u8; options.geometry.image_bytes()];
        let mut plan = ImagePlan::default();
        let (w, h) = (decoded.width, decoded.height);
        options
            .geometry
            .plan_image(w, h, None, 1, w, h, &mut plan)
            .expect("plan");
        resize_into_slot(
            &rgb,
            Decoded {
                channels: 3,
                ..decoded
            },
            (
                options.geometry.width,
                options.geometry.height,
                options.geometry.pad(),
            ),
            &plan,
            false,
            (Kernels::detect(), 1),
            &mut Vec::new(),
            &mut three_channels,
        )
        .expect("rgb resize");
        assert!(one_channel == three_channels);
    }
}
