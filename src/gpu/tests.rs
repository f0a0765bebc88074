//! The lane against the CPU renditions: the batched resize on identical pixels, whole images
//! through the engines and the ring, gray ones in calls of their own.

use std::sync::Arc;

use cudarc::driver::DevicePtr;

use super::call::{Path, LARGE_FILES_CALL_IMAGES};
use super::prepare::SMALL_FILES_ASSISTED_SHARE;
use super::work::{span, LaneResult, CHUNK};
use super::*;
use crate::cpu::prepare_image;
use crate::cuda::resize::plan::{plan_batch, ResizeJob, SourceImage, SourcePixels};
use crate::cuda::resize::BatchResizer;
use crate::cuda::test_gpu;
use crate::options::Interpolation;
use crate::options::{DecodeOptions, ResizeMode, ResizeOptions};
use crate::order::EpochOrder;
use crate::resample::{resample, Filter, PassOrder};
use crate::schedule::{offered, ShareSchedule};
use crate::source::Source;
use gpufeed_bench::upload::random_bytes;

/// A lane for the default geometry and batches of up to `batch_size`.
fn open_lane(gpu: &Gpu, geometry: &Geometry, batch_size: usize, gray: bool) -> GpuLane {
    open_lane_assisting(
        gpu,
        geometry,
        batch_size,
        gray,
        crate::options::DEFAULT_ASSISTED_SHARE,
    )
}

/// A lane's configuration for the tests: files of any size (up to 256 Mpx and 1 GB), no EXIF
/// orientation, small files on average and a run of unknown length.
fn lane_config(geometry: &Geometry, batch_size: usize, assisted_share: f32) -> GpuLaneConfig {
    GpuLaneConfig {
        stopwatch: Arc::default(),
        geometry: *geometry,
        max_pixels: 1 << 28,
        batch_size,
        max_file_bytes: 1 << 30,
        exif_orientation: false,
        assisted_share,
        large_files: false,
        small_files_assisted: true,
        coefficient_threads: 4,
        decode_memory: Arc::new(MemoryBudget::new(1 << 32)),
        requests: false,
        views: None,
        extra_preparing_threads: 0,
    }
}

/// [`open_lane`], the assisted path taking `assisted_share` of the large baseline images.
fn open_lane_assisting(
    gpu: &Gpu,
    geometry: &Geometry,
    batch_size: usize,
    gray: bool,
    assisted_share: f32,
) -> GpuLane {
    GpuLane::open_for(
        gpu,
        &lane_config(geometry, batch_size, assisted_share),
        gray,
        super::EnginesOpen::BeforeTheLane,
        &std::sync::atomic::AtomicBool::new(false),
    )
    .expect("the GPU lane")
}

/// Runs the lane over `files` (a source of in-memory bytes, every file offered), gathers what it
/// made into a poisoned buffer, one place per file, and downloads it; `made[i]` says whether
/// the lane took file `i`.
fn run_lane(lane: &mut GpuLane, gpu: &Gpu, files: &[Vec<u8>]) -> (Vec<bool>, Vec<u8>) {
    let (made, _, out) = run_lane_paths(lane, gpu, files, 0xA5);
    (made, out)
}

/// [`run_lane`] with the output poisoned with `poison`, also saying which files the assisted
/// path decoded.
fn run_lane_paths(
    lane: &mut GpuLane,
    gpu: &Gpu,
    files: &[Vec<u8>],
    poison: u8,
) -> (Vec<bool>, Vec<bool>, Vec<u8>) {
    begin_lane(
        lane,
        gpu,
        files,
        (0..files.len()).collect(),
        ShareSchedule::new(1.0),
    );
    lane.advance(files.len());
    let mut made = vec![false; files.len()];
    let mut assisted = vec![false; files.len()];
    let mut outputs = Vec::new();
    for (p, taken) in made.iter_mut().enumerate() {
        if let LaneResult::Decoded(output) = lane.result(p) {
            assisted[p] = output.assisted;
            outputs.push((output, p));
            *taken = true;
        }
    }
    let out = gather_outputs(lane, gpu, outputs, files.len(), poison);
    (made, assisted, out)
}

/// Begins `lane` on a source of `files` (in memory, named by their index) in `order`, offered
/// the images `share` says.
fn begin_lane(
    lane: &mut GpuLane,
    gpu: &Gpu,
    files: &[Vec<u8>],
    order: Vec<usize>,
    share: ShareSchedule,
) {
    let source = Arc::new(Source::bytes(
        files
            .iter()
            .enumerate()
            .map(|(i, bytes)| (format!("file {i}"), bytes.clone())),
    ));
    lane.begin(
        gpu.stream(),
        LaneWork {
            source,
            order: Arc::new(EpochOrder::new(order)),
            share: Arc::new(share),
            epoch: 0,
            refused: None,
        },
    )
    .expect("begin");
}

/// The lane's `outputs` gathered each into its place of `places` images poisoned with `poison`,
/// released, and downloaded.
fn gather_outputs(
    lane: &mut GpuLane,
    gpu: &Gpu,
    outputs: Vec<(LaneOutput, usize)>,
    places: usize,
    poison: u8,
) -> Vec<u8> {
    let stream = gpu.stream();
    let mut out = stream
        .clone_htod(&vec![poison; lane.image_bytes * places.max(1)])
        .expect("poisoned output");
    lane.gather(stream, &outputs, &mut out).expect("gather");
    lane.release(stream, outputs.into_iter().map(|(o, _)| o))
        .expect("release");
    stream.clone_dtoh(&out).expect("download")
}

/// Whether the lane's coefficient threads take `file`: a progressive JPEG the screen passes,
/// whose coefficients the progressive decoder and libjpeg-turbo's header reader both take.
fn progressive_taken(screen: &screen::LaneScreen, file: &[u8]) -> bool {
    screen.take_progressive(file).is_some()
        && has_layout(file)
        && crate::coefficients::progressive::ProgressiveDecoder::new()
            .decode(file)
            .is_ok()
}

/// Whether libjpeg-turbo reads `file`'s headers into a layout the assisted path's kernels take.
fn has_layout(file: &[u8]) -> bool {
    turbojpeg_region::CoefficientReader::new()
        .ok()
        .and_then(|mut reader| {
            let opened = reader.open(file).ok()?;
            crate::coefficients::Layout::new(opened.header()).ok()
        })
        .is_some()
}

#[test]
fn the_offer_depends_on_the_index_and_the_share_alone() {
    let offered_at = |share| {
        (0..10_000)
            .filter(|&i| offered(i, share))
            .collect::<Vec<_>>()
    };
    assert_eq!(offered_at(0.3), offered_at(0.3));
    assert!(offered_at(0.0).is_empty());
    assert_eq!(offered_at(1.0).len(), 10_000);
    let n = offered_at(0.3).len();
    assert!((2_800..3_200).contains(&n), "{n}");
    // A larger share offers a superset.
    let small = offered_at(0.3);
    let large = offered_at(0.6);
    assert!(small.iter().all(|i| large.contains(i)));
    // Ranges hold about a chunk of offered images, and never more positions than the cap.
    assert_eq!(span(1.0, CHUNK), CHUNK);
    assert_eq!(span(0.5, CHUNK), 2 * CHUNK);
    assert_eq!(span(0.01, CHUNK), MAX_SPAN);
    assert_eq!(span(0.0, CHUNK), MAX_SPAN);
    // The engines' calls of large files: a range of about one call.
    assert_eq!(span(1.0, LARGE_FILES_CALL_IMAGES), LARGE_FILES_CALL_IMAGES);
}

/// Given the same decoded pixels, the GPU resize writes the CPU rendition's bytes exactly:
/// random images of many sizes, every mode and GPU filter, slots out of order, outputs
/// poisoned first so an unwritten byte fails.
#[test]
fn gpu_resize_equals_the_cpu_rendition() {
    let Some(gpu) = test_gpu("gpu_resize_equals_the_cpu_rendition") else {
        return;
    };
    let stream = gpu.stream();
    let module = gpu
        .module(&crate::cuda::resize::kernel_source())
        .expect("compile");
    let resizer = BatchResizer::from_module(&module).expect("kernels");
    let modes = [
        ResizeMode::center_crop(256, 224),
        ResizeMode::center_crop(100, 111),
        ResizeMode::stretch(64, 96),
        ResizeMode::letterbox(80, 80, 114),
        ResizeMode::random_resized_crop(96),
    ];
    let sizes = [
        (500, 375),
        (375, 500),
        (37, 23),
        (1, 1),
        (900, 13),
        (224, 224),
        (1200, 800),
    ];
    let mut compared = 0;
    for (m, mode) in modes.iter().enumerate() {
        for (f, (filter, interpolation)) in [
            (Filter::Bilinear, Interpolation::Bilinear),
            (Filter::Bicubic, Interpolation::Bicubic),
            (Filter::Lanczos, Interpolation::Lanczos),
        ]
        .into_iter()
        .enumerate()
        {
            let geometry = Geometry::new(
                &ResizeOptions::default()
                    .mode(*mode)
                    .interpolation(interpolation)
                    .seed(m as u64),
            );
            // Random crops where the mode draws them; every other image flipped.
            let draw = |i: usize, w: usize, h: usize| {
                let draw = Geometry {
                    horizontal_flip: 0.0,
                    ..geometry
                }
                .draw(w as u32, h as u32, i, 1);
                (draw, i % 2 == 1)
            };
            let (ow, oh) = (geometry.width, geometry.height);
            let image = ow as usize * oh as usize * 3;
            let pad = match mode {
                ResizeMode::Letterbox { pad, .. } => *pad,
                _ => 0,
            };
            // Every image of the batch uploaded to the device.
            let sources: Vec<Vec<u8>> = sizes
                .iter()
                .enumerate()
                .map(|(i, &(w, h))| random_bytes(w * h * 3, (m * 31 + f * 7 + i) as u64))
                .collect();
            let device: Vec<CudaSlice<u8>> = sources
                .iter()
                .map(|s| stream.clone_htod(s).expect("upload"))
                .collect();
            let slots: Vec<u32> = (0..sizes.len() as u32).rev().collect();
            let jobs: Vec<ResizeJob> = sizes
                .iter()
                .zip(&device)
                .zip(&slots)
                .enumerate()
                .map(|(i, ((&(w, h), d), &slot))| {
                    let (crop, flip) = draw(i, w, h);
                    let (x, y) = geometry.axis_plans(w as u32, h as u32, crop.as_ref());
                    ResizeJob {
                        source: SourceImage::whole(
                            SourcePixels::Interleaved {
                                ptr: d.device_ptr(stream).0,
                                pitch: w as u32 * 3,
                            },
                            w as u32,
                            h as u32,
                        ),
                        x,
                        y,
                        filter,
                        order: PassOrder::default(),
                        pad: [pad; 3],
                        flip,
                        slot,
                    }
                })
                .collect();
            let mut out = stream
                .clone_htod(&vec![0xA5u8; image * sizes.len()])
                .expect("poisoned output");
            let plan = plan_batch(&jobs, ow, oh).expect("plan");
            let mut device_plan = resizer.upload(stream, &plan).expect("upload plan");
            // SAFETY: the sources are the live device buffers above, not written again.
            unsafe { resizer.launch(stream, &mut device_plan, &mut out) }.expect("launch");
            let got = stream.clone_dtoh(&out).expect("download");
            for (i, (&(w, h), src)) in sizes.iter().zip(&sources).enumerate() {
                let (crop, flip) = draw(i, w, h);
                let (x, y) = geometry.axis_plans(w as u32, h as u32, crop.as_ref());
                let mut want = vec![0u8; image];
                resample(
                    src, w as u32, h as u32, 3, &x, &y, filter, pad, &mut want, ow, oh,
                )
                .expect("cpu rendition");
                if flip {
                    for row in want.chunks_exact_mut(ow as usize * 3) {
                        let mirrored: Vec<u8> =
                            row.chunks_exact(3).rev().flatten().copied().collect();
                        row.copy_from_slice(&mirrored);
                    }
                }
                let slot = slots[i] as usize;
                let got = &got[slot * image..(slot + 1) * image];
                let differing = got.iter().zip(&want).filter(|(a, b)| a != b).count();
                assert_eq!(differing, 0, "{mode} {filter:?} {w}x{h}: {differing} bytes");
                compared += 1;
            }
        }
    }
    assert_eq!(compared, modes.len() * 3 * sizes.len());
}

/// The batched resize writes each image of a patch sequence at its own size (its preset's plan,
/// timm's crops and flips), from the first byte of its place in the arena, exactly as the CPU
/// lane's resize does (Pillow's passes, or PyTorch's `uint8` ones for the torchvision
/// variant); the rest of each place is left as it was.
#[test]
fn gpu_resize_at_each_images_own_size_equals_the_cpu_rendition() {
    use crate::patches::Patches;
    use crate::resample::{HostImage, ImagePlan, Kernels, Slot};
    let Some(gpu) = test_gpu("gpu_resize_at_each_images_own_size_equals_the_cpu_rendition") else {
        return;
    };
    let stream = gpu.stream();
    let module = gpu
        .module(&crate::cuda::resize::kernel_source())
        .expect("compile");
    let resizer = BatchResizer::from_module(&module).expect("kernels");
    let presets = [
        Patches::qwen2_vl().max_pixels(28 * 28 * 96),
        Patches::qwen2_vl().max_pixels(28 * 28 * 96).torchvision(),
        Patches::siglip2_naflex().max_patches(64),
        Patches::timm_naflex().seq_lens(&[16, 64]),
    ];
    let sizes = [
        (500, 375),
        (37, 23),
        (1, 1),
        (900, 13),
        (240, 240),
        (77, 600),
    ];
    let mut compared = 0;
    for (p, patches) in presets.iter().enumerate() {
        let base = Geometry::new(&ResizeOptions::default().seed(p as u64));
        let geometry = base.with_patches(Some(patches)).for_sequence(64);
        let stride = geometry.image_bytes();
        let sources: Vec<Vec<u8>> = sizes
            .iter()
            .enumerate()
            .map(|(i, &(w, h))| random_bytes(w * h * 3, (p * 13 + i) as u64))
            .collect();
        let device: Vec<CudaSlice<u8>> = sources
            .iter()
            .map(|s| stream.clone_htod(s).expect("upload"))
            .collect();
        let placements: Vec<_> = sizes
            .iter()
            .enumerate()
            .map(|(i, &(w, h))| geometry.placement(w as u32, h as u32, i, 2).expect("plan"))
            .collect();
        let passes: Vec<_> = placements
            .iter()
            .map(|pl| {
                geometry
                    .pass_plan(&pl.x, &pl.y)
                    .expect("a filter")
                    .expect("passes")
            })
            .collect();
        let filter = match geometry.resampling() {
            crate::resample::Resampling::Filter(f) => f,
            crate::resample::Resampling::Nearest => unreachable!("presets filter"),
        };
        let jobs: Vec<ResizeJob> = sizes
            .iter()
            .zip(&device)
            .zip(&placements)
            .enumerate()
            .map(|(i, ((&(w, h), d), pl))| ResizeJob {
                source: SourceImage::whole(
                    SourcePixels::Interleaved {
                        ptr: d.device_ptr(stream).0,
                        pitch: w as u32 * 3,
                    },
                    w as u32,
                    h as u32,
                ),
                x: pl.x,
                y: pl.y,
                filter,
                order: geometry.pass_order,
                pad: [0; 3],
                flip: pl.draw.is_some_and(|d| d.flipped),
                slot: (sizes.len() - 1 - i) as u32,
            })
            .collect();
        let out_sizes: Vec<(u32, u32)> = placements
            .iter()
            .map(|pl| geometry.out_size(&pl.x, &pl.y))
            .collect();
        let pass_refs: Vec<_> = passes.iter().collect();
        let plan = crate::cuda::resize::plan::plan_batch_sized(
            &jobs,
            &pass_refs,
            &out_sizes,
            stride as u64,
        )
        .expect("plan");
        let mut out = stream
            .clone_htod(&vec![0xA5u8; stride * sizes.len()])
            .expect("poisoned output");
        let mut device_plan = resizer.upload(stream, &plan).expect("upload plan");
        // SAFETY: the sources are the live device buffers above, not written again.
        unsafe { resizer.launch(stream, &mut device_plan, &mut out) }.expect("launch");
        let got = stream.clone_dtoh(&out).expect("download");
        for (i, ((&(w, h), src), pl)) in sizes.iter().zip(&sources).zip(&placements).enumerate() {
            let (ow, oh) = out_sizes[i];
            let bytes = ow as usize * oh as usize * 3;
            let mut image_plan = ImagePlan::default();
            geometry
                .plan_axes(&pl.x, &pl.y, 1, w as u32, h as u32, &mut image_plan)
                .expect("cpu plan");
            let mut want = vec![0u8; bytes];
            let source = HostImage {
                pixels: src,
                width: w as u32,
                height: h as u32,
                channels: 3,
            };
            let mut slot = Slot {
                bytes: &mut want,
                width: ow,
                height: oh,
            };
            image_plan
                .resample_into(&source, 0, &mut slot, Kernels::detect(), &mut Vec::new())
                .expect("cpu rendition");
            if pl.draw.is_some_and(|d| d.flipped) {
                for row in want.chunks_exact_mut(ow as usize * 3) {
                    let mirrored: Vec<u8> = row.chunks_exact(3).rev().flatten().copied().collect();
                    row.copy_from_slice(&mirrored);
                }
            }
            let place = &got[jobs[i].slot as usize * stride..][..stride];
            let differing = place[..bytes]
                .iter()
                .zip(&want)
                .filter(|(a, b)| a != b)
                .count();
            assert_eq!(
                differing, 0,
                "{:?} {w}x{h}: {differing} bytes",
                patches.preset
            );
            assert!(
                place[bytes..].iter().all(|&b| b == 0xA5),
                "{:?} {w}x{h}: the place past the image was written",
                patches.preset
            );
            compared += 1;
        }
    }
    assert_eq!(compared, presets.len() * sizes.len());
}

/// The lane decodes real JPEGs (the bundled photos, the JPEG fixtures, random-size
/// synthetic ones) to what the CPU lane makes of them, within the fidelity bars (the two
/// decoders' inverse DCT differs by a level here and there before the resize), gray and
/// colour ones in one range, on the engines and the assisted path (which takes most small
/// files beside them, and makes the CPU lane's bytes exactly); CMYK JPEGs are refused and go to
/// the CPU lane, progressive ones take the assisted path (their coefficients decoded on the
/// lane's coefficient threads).
#[test]
fn the_lane_decodes_like_the_cpu_lane() {
    let Some(gpu) = test_gpu("the_lane_decodes_like_the_cpu_lane") else {
        return;
    };
    let resize = ResizeOptions::default();
    let geometry = Geometry::new(&resize);
    let mut lane = open_lane(&gpu, &geometry, 64, true);
    let mut files: Vec<(String, Vec<u8>)> = Vec::new();
    for dir in ["assets", "tests/fixtures"] {
        for entry in std::fs::read_dir(dir).expect("dir").flatten() {
            let path = entry.path();
            let name = path.display().to_string();
            if name.to_lowercase().ends_with(".jpg") {
                files.push((name, std::fs::read(&path).expect("read")));
            }
        }
    }
    let photo = image::open("assets/astronaut.png")
        .expect("photo")
        .to_rgb8();
    for i in 0..16u32 {
        let (w, h) = (120 + i * 37, 90 + (i * 53) % 400);
        let crop = image::imageops::resize(&photo, w, h, image::imageops::Triangle);
        let mut bytes = Vec::new();
        image::codecs::jpeg::JpegEncoder::new_with_quality(&mut bytes, 80 + i as u8)
            .encode_image(&crop)
            .expect("encode");
        files.push((format!("synthetic {w}x{h}"), bytes));
    }
    // Gray ones among them, up to the corpus's largest sizes.
    let camera = image::open("assets/camera.png").expect("photo").to_luma8();
    for i in 0..8u32 {
        let (w, h) = (250 + i * 79, 64 + (i * 131) % 840);
        let crop = image::imageops::resize(&camera, w, h, image::imageops::Triangle);
        let mut bytes = Vec::new();
        image::codecs::jpeg::JpegEncoder::new_with_quality(&mut bytes, 75 + i as u8)
            .encode_image(&crop)
            .expect("encode");
        if i % 2 == 1 {
            // As Pillow writes gray JPEGs asked for 4:2:0: sampling factors 2x2, which
            // change nothing in how the frame decodes (the CPU lane makes the same pixels).
            let at = crate::gpu::nvjpeg::header::scan(&bytes)
                .expect("header")
                .frame_at
                + 7;
            let mut pillow = bytes.clone();
            pillow[at] = 0x22;
            let mut plain = vec![0u8; geometry.image_bytes()];
            let mut factored = vec![1u8; geometry.image_bytes()];
            prepare_image(&bytes, &DecodeOptions::default(), &resize, &mut plain).expect("cpu");
            prepare_image(&pillow, &DecodeOptions::default(), &resize, &mut factored).expect("cpu");
            assert!(
                plain == factored,
                "2x2 gray factors decode differently on the CPU"
            );
            files.push((format!("synthetic gray 2x2 factors {w}x{h}"), pillow));
        }
        files.push((format!("synthetic gray {w}x{h}"), bytes));
    }
    let screen = lane.runner.screen().clone();
    for (name, bytes) in &files {
        let lower = name.to_lowercase();
        if lower.contains("progressive") || lower.contains("cmyk") {
            assert!(
                screen.take(bytes).is_none(),
                "{name} is not for the engines"
            );
        }
        if lower.contains("progressive") {
            assert!(
                progressive_taken(&screen, bytes),
                "{name}: the coefficient threads"
            );
        }
        if lower.contains("gray") {
            assert!(
                screen.take(bytes).is_some_and(|s| s.gray),
                "{name}: the gray decoder"
            );
        }
    }
    let bytes: Vec<Vec<u8>> = files.iter().map(|(_, b)| b.clone()).collect();
    let (made, assisted, got) = run_lane_paths(&mut lane, &gpu, &bytes, 0x5A);
    let image = geometry.image_bytes();
    for ((name, bytes), &taken) in files.iter().zip(&made) {
        let expected = screen.take(bytes).is_some() || progressive_taken(&screen, bytes);
        assert_eq!(taken, expected, "{name}: taken {taken}");
    }
    let accepted: Vec<(usize, &(String, Vec<u8>))> =
        files.iter().enumerate().filter(|&(i, _)| made[i]).collect();
    assert!(accepted.len() >= 20, "only {} accepted", accepted.len());
    // Both paths took the small files: the assisted path its share, the engines the rest.
    let on_assisted = accepted.iter().filter(|&&(i, _)| assisted[i]).count();
    assert!(
        on_assisted > 0 && on_assisted < accepted.len(),
        "{on_assisted} of {} on the assisted path",
        accepted.len()
    );
    let cpu_lane = accepted.iter().map(|&(i, (name, bytes))| {
        let mut want = vec![0u8; image];
        prepare_image(bytes, &DecodeOptions::default(), &resize, &mut want).expect("cpu");
        // The assisted path decodes as libjpeg-turbo does: the CPU lane's bytes exactly.
        let place = i * image..(i + 1) * image;
        assert!(
            !assisted[i] || got[place] == want[..],
            "{name}: the assisted path differs from the CPU lane"
        );
        (i, name.as_str(), want)
    });
    let (mean, p999) = differences_from_the_cpu_lane(&got, image, cpu_lane, 1.5);
    println!(
        "GPU lane vs CPU lane, {} images: mean {mean:.3}, p99.9 {p999}",
        accepted.len()
    );
    assert!(mean <= 0.5 && p999 <= 3, "mean {mean:.3}, p99.9 {p999}");
}

/// How far the lane's images `got` (`image` bytes each, one place per file) are from the CPU
/// lane's `(place, name, image)`: each image's mean difference under `image_bar` (else a failure
/// naming it), and the mean and 99.9th percentile of all the differences.
fn differences_from_the_cpu_lane<'a>(
    got: &[u8],
    image: usize,
    cpu_lane: impl Iterator<Item = (usize, &'a str, Vec<u8>)>,
    image_bar: f64,
) -> (f64, u8) {
    let mut all = Vec::new();
    for (i, name, want) in cpu_lane {
        let diffs: Vec<u8> = got[i * image..(i + 1) * image]
            .iter()
            .zip(&want)
            .map(|(a, b)| a.abs_diff(*b))
            .collect();
        let mean = diffs.iter().map(|&d| d as f64).sum::<f64>() / diffs.len() as f64;
        assert!(
            mean < image_bar,
            "{name}: mean difference {mean:.3} from the CPU lane"
        );
        all.extend(diffs);
    }
    all.sort_unstable();
    let mean = all.iter().map(|&d| d as f64).sum::<f64>() / all.len().max(1) as f64;
    let p999 = all
        .get((all.len().max(1) - 1) * 999 / 1000)
        .copied()
        .unwrap_or(0);
    (mean, p999)
}

/// Gray JPEGs decoded by the engines in a batch of their own come out as the CPU lane makes
/// them (what decides whether the lane can take them in batches of their own).
#[test]
fn gray_jpegs_decode_on_the_engines_in_a_batch_of_their_own() {
    let Some(gpu) = test_gpu("gray_jpegs_decode_on_the_engines_in_a_batch_of_their_own") else {
        return;
    };
    let resize = ResizeOptions::default();
    let geometry = Geometry::new(&resize);
    // Without the assisted path, which would take most of them.
    let mut lane = open_lane_assisting(&gpu, &geometry, 64, true, 0.0);
    let files = gray_jpegs();
    let screen = lane.runner.screen().clone();
    assert!(files.iter().all(|b| screen.take(b).is_some_and(|s| s.gray)));
    let (made, got) = run_lane(&mut lane, &gpu, &files);
    assert!(made.iter().all(|&m| m), "every gray JPEG decoded: {made:?}");
    assert_gray_as_the_cpu_lane(&files, &got, &resize);
}

/// Twelve gray JPEGs of ImageNet's sizes.
fn gray_jpegs() -> Vec<Vec<u8>> {
    let photo = image::open("assets/camera.png").expect("photo").to_luma8();
    (0..12u32)
        .map(|i| {
            let (w, h) = (250 + i * 41, 200 + (i * 67) % 500);
            let crop = image::imageops::resize(&photo, w, h, image::imageops::Triangle);
            let mut bytes = Vec::new();
            image::codecs::jpeg::JpegEncoder::new_with_quality(&mut bytes, 85)
                .encode_image(&crop)
                .expect("encode");
            bytes
        })
        .collect()
}

/// Each of `files`' images in `got` is within half a level on average of the CPU lane's.
fn assert_gray_as_the_cpu_lane(files: &[Vec<u8>], got: &[u8], resize: &ResizeOptions) {
    let image = Geometry::new(resize).image_bytes();
    for (i, bytes) in files.iter().enumerate() {
        let mut want = vec![0u8; image];
        prepare_image(bytes, &DecodeOptions::default(), resize, &mut want).expect("cpu");
        let mean = got[i * image..(i + 1) * image]
            .iter()
            .zip(&want)
            .map(|(a, b)| a.abs_diff(*b) as f64)
            .sum::<f64>()
            / image as f64;
        println!("gray JPEG {i}: mean difference {mean:.3}");
        assert!(mean <= 0.5, "gray JPEG {i}: mean difference {mean:.3}");
    }
}

/// Runs `lane` on the gray JPEGs `files` (its output poisoned with `poison`): every one
/// decoded as the CPU lane makes it, on `path`: every one on the assisted path, or on the
/// engines their part (the assisted path takes at most [`SMALL_FILES_ASSISTED_SHARE`] of
/// small files beside them).
fn assert_gray_on(lane: &mut GpuLane, gpu: &Gpu, files: &[Vec<u8>], path: Path, poison: u8) {
    let (made, assisted, got) = run_lane_paths(lane, gpu, files, poison);
    assert!(made.iter().all(|&m| m), "every gray JPEG decoded: {made:?}");
    let on_engines = assisted.iter().filter(|&&a| !a).count();
    let engines_part = files.len() as f32 * (1.0 - SMALL_FILES_ASSISTED_SHARE);
    let on_path = match path {
        Path::Assisted => on_engines == 0,
        Path::Engines => on_engines as f32 >= engines_part.floor() && on_engines > 0,
    };
    assert!(on_path, "gray JPEGs on {path:?}: assisted {assisted:?}");
    assert_gray_as_the_cpu_lane(files, &got, &ResizeOptions::default());
}

/// The engines' gray decoders are made after their colour ones, beside the lane: until then
/// its gray JPEGs go elsewhere (the assisted path or the CPU lane), and once the lane is open
/// the engines decode their part, as a lane opened with its engines does.
#[test]
fn gray_jpegs_go_to_the_engines_once_their_decoders_opened_beside_the_lane() {
    let Some(gpu) =
        test_gpu("gray_jpegs_go_to_the_engines_once_their_decoders_opened_beside_the_lane")
    else {
        return;
    };
    let geometry = Geometry::new(&ResizeOptions::default());
    let mut lane = GpuLane::open_for(
        &gpu,
        &lane_config(&geometry, 64, 1.0),
        true,
        EnginesOpen::BesideTheLane,
        &std::sync::atomic::AtomicBool::new(false),
    )
    .expect("the GPU lane");
    lane.wait_until_open();
    assert!(lane.describe().contains("joined"), "{}", lane.describe());
    assert_gray_on(&mut lane, &gpu, &gray_jpegs(), Path::Engines, 0x7E);
}

/// While the engines' gray decoders are being made (beside the lane, after every set's colour
/// one), the assisted path takes the lane's gray JPEGs, and once they are made the engines take
/// their part; the pixels are the CPU lane's either way.
#[test]
fn gray_jpegs_take_the_assisted_path_until_the_engines_gray_decoders_are_made() {
    let Some(gpu) =
        test_gpu("gray_jpegs_take_the_assisted_path_until_the_engines_gray_decoders_are_made")
    else {
        return;
    };
    let geometry = Geometry::new(&ResizeOptions::default());
    let files = gray_jpegs();
    let mut lane = open_lane_assisting(&gpu, &geometry, 64, true, 1.0);
    let grays_made = lane.runner.grays_coming();
    assert_gray_on(&mut lane, &gpu, &files, Path::Assisted, 0x3C);
    grays_made();
    assert_gray_on(&mut lane, &gpu, &files, Path::Engines, 0xC3);
}

/// Camera-size JPEGs of every kind the assisted path takes (4:2:0, 4:2:2, 4:4:0, 4:4:4, gray,
/// RGB, restart intervals, optimized tables), one progressive (the assisted path's, its
/// coefficients decoded on a CPU thread), one progressive cut short (the CPU lane's), and two small
/// ones (the engines', or the assisted path's at the small files' share): fresh pixels from
/// `seed`, a photo scaled up with noise.
fn large_photos(seed: u64) -> Vec<(String, Vec<u8>)> {
    use turbojpeg_region::{encode, EncodeOptions, Format};
    let photo = image::open("assets/astronaut.png")
        .expect("photo")
        .to_rgb8();
    let noise = random_bytes(4 << 20, seed);
    let mut files = Vec::new();
    for (i, (kind, options)) in jpeg_kinds().iter().enumerate() {
        let (w, h) = (
            1100 + 97 * i as u32 + (seed % 13) as u32,
            960 + 61 * i as u32,
        );
        let bytes = encode_photo(&photo, &noise, i, (w, h), options);
        files.push((format!("{kind} {w}x{h}"), bytes));
    }
    let progressive = files
        .iter()
        .find(|(name, _)| name.starts_with("progressive"))
        .map(|(_, bytes)| bytes[..bytes.len() * 2 / 3].to_vec());
    if let Some(cut) = progressive {
        files.push(("progressive cut short".into(), cut));
    }
    for (w, h) in [(640, 480), (500, 375)] {
        let small = image::imageops::resize(&photo, w, h, image::imageops::Triangle).into_raw();
        let bytes = encode(&small, w, h, Format::Rgb, &EncodeOptions::default()).expect("encode");
        files.push((format!("small {w}x{h}"), bytes));
    }
    files
}

/// The JPEG kinds of [`large_photos`], by name: every sampling, gray, RGB, restart intervals,
/// optimized tables, and progressive last.
fn jpeg_kinds() -> [(&'static str, turbojpeg_region::EncodeOptions); 10] {
    use turbojpeg_region::{Colorspace, EncodeOptions, Restart, Sampling};
    [
        ("4:2:0", EncodeOptions::default()),
        (
            "4:2:2 q75",
            EncodeOptions {
                quality: 75,
                sampling: Sampling::S422,
                ..Default::default()
            },
        ),
        (
            "4:4:0",
            EncodeOptions {
                sampling: Sampling::S440,
                ..Default::default()
            },
        ),
        (
            "4:4:4 q95",
            EncodeOptions {
                quality: 95,
                sampling: Sampling::S444,
                ..Default::default()
            },
        ),
        (
            "gray",
            EncodeOptions {
                colorspace: Colorspace::Gray,
                ..Default::default()
            },
        ),
        (
            "rgb",
            EncodeOptions {
                colorspace: Colorspace::Rgb,
                sampling: Sampling::S444,
                ..Default::default()
            },
        ),
        (
            "restarts every 3 MCUs",
            EncodeOptions {
                restart: Restart::Mcus(3),
                ..Default::default()
            },
        ),
        (
            "restarts every row, optimized",
            EncodeOptions {
                restart: Restart::Rows(1),
                optimize: true,
                ..Default::default()
            },
        ),
        (
            "optimized q30",
            EncodeOptions {
                quality: 30,
                optimize: true,
                ..Default::default()
            },
        ),
        (
            "progressive",
            EncodeOptions {
                progressive: true,
                ..Default::default()
            },
        ),
    ]
}

/// `photo` scaled to `w` x `h` with `noise` (offset by `i`) added, encoded with `options`.
fn encode_photo(
    photo: &image::RgbImage,
    noise: &[u8],
    i: usize,
    (w, h): (u32, u32),
    options: &turbojpeg_region::EncodeOptions,
) -> Vec<u8> {
    use turbojpeg_region::{encode, Colorspace, Format};
    let mut rgb = image::imageops::resize(photo, w, h, image::imageops::Triangle).into_raw();
    for (k, p) in rgb.iter_mut().enumerate() {
        let n = noise[(k * 7 + i) % noise.len()] % 9;
        *p = p.saturating_add(n).saturating_sub(4);
    }
    let (pixels, format) = match options.colorspace {
        Colorspace::Gray => (
            rgb.chunks(3).map(|p| p[1]).collect::<Vec<u8>>(),
            Format::Gray,
        ),
        _ => (rgb, Format::Rgb),
    };
    encode(&pixels, w, h, format, options).expect("encode")
}

/// Photos of every kind of [`jpeg_kinds`] (but RGB, which the screen refuses), baseline and
/// progressive, upright and lying, of sizes that leave partial MCUs.
fn photos_both_ways(seed: u64) -> Vec<(String, Vec<u8>)> {
    let photo = image::open("assets/astronaut.png")
        .expect("photo")
        .to_rgb8();
    let noise = random_bytes(4 << 20, seed);
    let mut files = Vec::new();
    for (i, (kind, options)) in jpeg_kinds().iter().enumerate() {
        if kind.starts_with("rgb") {
            continue;
        }
        for progressive in [false, true] {
            let options = turbojpeg_region::EncodeOptions {
                progressive: progressive || options.progressive,
                ..*options
            };
            let (long, short) = (1203 + 89 * i as u32, 877 + 41 * i as u32);
            let upright = (i + usize::from(progressive)) % 2 == 0;
            let (w, h) = if upright {
                (short, long)
            } else {
                (long, short)
            };
            let bytes = encode_photo(&photo, &noise, i, (w, h), &options);
            let name = if options.progressive {
                "progressive"
            } else {
                "baseline"
            };
            files.push((format!("{name} {kind} {w}x{h}"), bytes));
        }
    }
    files
}

/// Large photos on the engines alone, in a lane for small files (calls of 192 MB of planes, two
/// threads, the colour photos made RGB and resized in parts that fit the 64 Mpx RGB buffer) and
/// in one for large files (768 MB of planes, read in place, two threads taking turns, largest
/// first, RGB 128 Mpx at a time). Every photo is taken, and comes out as the CPU lane makes it
/// within the engines' bars (their inverse DCT differs by a level here and there), the same bytes
/// on a second run into an output poisoned otherwise.
#[test]
fn large_photos_on_the_engines_are_made_rgb_a_part_of_a_call_at_a_time() {
    let Some(gpu) = test_gpu("large_photos_on_the_engines_are_made_rgb_a_part_of_a_call_at_a_time")
    else {
        return;
    };
    let resize = ResizeOptions::default();
    let geometry = Geometry::new(&resize);
    let image = geometry.image_bytes();
    let photo = image::open("assets/astronaut.png")
        .expect("photo")
        .to_rgb8();
    let noise = random_bytes(4 << 20, 17);
    let mut files = Vec::new();
    for (i, (kind, options)) in jpeg_kinds().iter().enumerate() {
        if kind.starts_with("rgb") || options.progressive {
            continue;
        }
        // 8.8 to 14 Mpx: the colour ones' RGB is 236 MB, past the buffer's 201 MB (64 Mpx).
        let (w, h) = (3400 + 131 * i as u32, 2600 + 67 * i as u32);
        files.push((
            format!("{kind} {w}x{h}"),
            encode_photo(&photo, &noise, i, (w, h), options),
        ));
    }
    let bytes: Vec<Vec<u8>> = files.iter().map(|(_, b)| b.clone()).collect();
    let mut wants = Vec::new();
    for (_, file) in &files {
        let mut want = vec![0u8; image];
        prepare_image(file, &DecodeOptions::default(), &resize, &mut want).expect("cpu");
        wants.push(want);
    }
    for large_files in [false, true] {
        let config = GpuLaneConfig {
            large_files,
            ..lane_config(&geometry, 16, 0.0)
        };
        let mut lane = GpuLane::open_for(
            &gpu,
            &config,
            true,
            super::EnginesOpen::BeforeTheLane,
            &std::sync::atomic::AtomicBool::new(false),
        )
        .expect("the GPU lane");
        let (made, assisted, got) = run_lane_paths(&mut lane, &gpu, &bytes, 0x5A);
        let (made_again, _, again) = run_lane_paths(&mut lane, &gpu, &bytes, 0xA5);
        assert!(made.iter().all(|&m| m) && made_again.iter().all(|&m| m));
        assert!(assisted.iter().all(|&a| !a), "the assisted path is off");
        assert!(
            got == again,
            "large files {large_files}: a second run, other bytes"
        );
        let cpu_lane = files
            .iter()
            .zip(&wants)
            .enumerate()
            .map(|(i, ((name, _), want))| (i, name.as_str(), want.clone()));
        let (mean, p999) = differences_from_the_cpu_lane(&got, image, cpu_lane, 0.5);
        println!(
            "large photos on the engines (large files {large_files}) vs the CPU lane: \
             mean {mean:.3}, p99.9 {p999}"
        );
        assert!(mean <= 0.1 && p999 <= 2, "mean {mean:.3}, p99.9 {p999}");
    }
}

/// The assisted path renders large photos exactly as the CPU lane does (byte for byte, outputs
/// poisoned twice), takes every kind of baseline ones with the share at 1 and none at 0, takes
/// progressive ones (their coefficients decoded on the coefficient threads) unless its share is
/// 0, leaves small files to the engines, and a progressive file cut short to the CPU lane.
#[test]
fn the_assisted_path_decodes_large_photos_exactly_like_the_cpu_lane() {
    let Some(gpu) = test_gpu("the_assisted_path_decodes_large_photos_exactly_like_the_cpu_lane")
    else {
        return;
    };
    let resize = ResizeOptions::default();
    let geometry = Geometry::new(&resize);
    let image = geometry.image_bytes();
    for seed in [1, 2] {
        let files = large_photos(seed);
        let bytes: Vec<Vec<u8>> = files.iter().map(|(_, b)| b.clone()).collect();
        for share in [1.0, 0.0] {
            let mut lane = open_lane_assisting(&gpu, &geometry, 16, true, share);
            let screen = lane.runner.screen().clone();
            let (made, assisted, got) = run_lane_paths(&mut lane, &gpu, &bytes, 0x5A);
            let (made_again, _, again) = run_lane_paths(&mut lane, &gpu, &bytes, 0xA5);
            assert_eq!(made, made_again);
            for (i, (name, file)) in files.iter().enumerate() {
                // The lane takes what the engines' screen takes (not RGB ones: nvJPEG's
                // hardware backend refuses an Adobe marker without a transform), and with the
                // assisted path the progressive file; of the engines' files, the assisted path
                // takes the large ones.
                let progressive = share > 0.0 && progressive_taken(&screen, file);
                assert_eq!(progressive, share > 0.0 && *name == files[9].0, "{name}");
                let taken = screen.take(file).is_some() || progressive;
                let small = name.starts_with("small");
                assert_eq!(made[i], taken, "{name}: taken {}", made[i]);
                assert!(taken || name.starts_with("progressive") || name.starts_with("rgb"));
                // The small ones take the assisted path at their own share, counted.
                if !small || share == 0.0 {
                    assert_eq!(
                        assisted[i],
                        share == 1.0 && taken,
                        "{name} with the share at {share}: assisted {}",
                        assisted[i]
                    );
                }
                if !made[i] {
                    continue;
                }
                let mut want = vec![0u8; image];
                prepare_image(file, &DecodeOptions::default(), &resize, &mut want).expect("cpu");
                let place = i * image..(i + 1) * image;
                if assisted[i] {
                    assert!(
                        got[place.clone()] == want[..] && again[place] == want[..],
                        "{name}: the assisted path differs from the CPU lane"
                    );
                }
            }
        }
    }
}

/// The assisted path renders only the window of each photo its resize reads, and decodes a
/// progressive photo's coefficients only down to the rows of that window (an upright photo
/// centre-cropped, a narrow crop): it still renders each photo byte for byte as the CPU lane
/// does, baseline or progressive, whatever its sampling, restart intervals or crop, outputs
/// poisoned.
#[test]
fn photos_rendered_for_the_window_the_resize_reads_match_the_cpu_lane() {
    let Some(gpu) = test_gpu("photos_rendered_for_the_window_the_resize_reads_match_the_cpu_lane")
    else {
        return;
    };
    let files = photos_both_ways(6);
    let bytes: Vec<Vec<u8>> = files.iter().map(|(_, b)| b.clone()).collect();
    let modes = [
        ResizeMode::center_crop(256, 224),
        ResizeMode::center_crop(160, 64),
        ResizeMode::stretch(96, 64),
    ];
    for mode in modes {
        let resize = ResizeOptions::default().mode(mode);
        let geometry = Geometry::new(&resize);
        let image = geometry.image_bytes();
        let mut lane = open_lane_assisting(&gpu, &geometry, 16, true, 1.0);
        for poison in [0x5A, 0xA5] {
            let (made, assisted, got) = run_lane_paths(&mut lane, &gpu, &bytes, poison);
            for (i, (name, file)) in files.iter().enumerate() {
                assert!(
                    made[i] && assisted[i],
                    "{name} {mode}: not the assisted path's"
                );
                let mut want = vec![0u8; image];
                prepare_image(file, &DecodeOptions::default(), &resize, &mut want).expect("cpu");
                let got = &got[i * image..(i + 1) * image];
                let differing = got.iter().zip(&want).filter(|(a, b)| a != b).count();
                assert_eq!(differing, 0, "{name} {mode}: {differing} bytes differ");
            }
        }
    }
}

/// A lane opened for a pipeline already making batches starts with its assisted path, which
/// takes every image it can parse, small ones and the engines' ones too, with the CPU lane's
/// bytes, until the engines join; then it takes every image a lane opened with its engines
/// takes, on the same paths, with the same bytes.
#[test]
fn a_lane_whose_engines_open_beside_it_takes_their_images_once_they_join() {
    let Some(gpu) =
        test_gpu("a_lane_whose_engines_open_beside_it_takes_their_images_once_they_join")
    else {
        return;
    };
    let resize = ResizeOptions::default();
    let geometry = Geometry::new(&resize);
    let image = geometry.image_bytes();
    let files = large_photos(3);
    let bytes: Vec<Vec<u8>> = files.iter().map(|(_, b)| b.clone()).collect();
    let mut engines_first = open_lane(&gpu, &geometry, 16, true);
    let (made_first, assisted_first, want) = run_lane_paths(&mut engines_first, &gpu, &bytes, 0x5A);
    drop(engines_first);
    assert!(made_first
        .iter()
        .zip(&assisted_first)
        .any(|(&m, &a)| m && !a));
    let config = lane_config(&geometry, 16, 1.0);
    let mut lane = GpuLane::open_for(
        &gpu,
        &config,
        true,
        EnginesOpen::BesideTheLane,
        &std::sync::atomic::AtomicBool::new(false),
    )
    .expect("the GPU lane");
    let (made, assisted, got) = run_lane_paths(&mut lane, &gpu, &bytes, 0xA5);
    lane.wait_until_open();
    // Joined, no longer opening.
    assert!(lane.describe().contains("joined"), "{}", lane.describe());
    let (made_after, assisted_after, after) = run_lane_paths(&mut lane, &gpu, &bytes, 0x3C);
    assert_eq!(made_after, made_first);
    assert_eq!(assisted_after, assisted_first);
    let mut before_join = 0;
    for (i, (name, file)) in files.iter().enumerate() {
        let place = i * image..(i + 1) * image;
        // Before the engines join, the assisted path takes what it took beside them and what
        // the engines took (unless its parser refuses it), and nothing else.
        assert!(!made[i] || assisted[i], "{name} before the engines");
        assert!(!made[i] || made_first[i], "{name}");
        assert!(!assisted_first[i] || assisted[i], "{name}");
        if made[i] {
            before_join += usize::from(!assisted_first[i]);
            let mut cpu = vec![0u8; image];
            prepare_image(file, &DecodeOptions::default(), &resize, &mut cpu).expect("cpu");
            assert!(got[place.clone()] == cpu[..], "{name} before the engines");
        }
        if made_after[i] {
            assert!(
                after[place.clone()] == want[place],
                "{name} after the engines joined"
            );
        }
    }
    assert!(
        before_join > 0,
        "the assisted path took none of the engines' images"
    );
}

/// A lane for a run shorter than the engines' opening never opens them: its assisted path takes
/// every image it can parse, large and small, with the CPU lane's bytes, and it says why.
#[test]
fn a_lane_without_its_engines_decodes_every_image_on_its_assisted_path() {
    let Some(gpu) = test_gpu("a_lane_without_its_engines_decodes_every_image_on_its_assisted_path")
    else {
        return;
    };
    let resize = ResizeOptions::default();
    let geometry = Geometry::new(&resize);
    let image = geometry.image_bytes();
    let files = large_photos(5);
    let bytes: Vec<Vec<u8>> = files.iter().map(|(_, b)| b.clone()).collect();
    let config = lane_config(&geometry, 16, 1.0);
    // What the schedule's policy decides for a run shorter than the engines' opening.
    let short_run = EnginesOpen::Never("the run ends before they could");
    let mut lane = GpuLane::open(
        &gpu,
        &config,
        short_run,
        &std::sync::atomic::AtomicBool::new(false),
    )
    .expect("the GPU lane");
    assert!(
        lane.describe().contains("not opened"),
        "{}",
        lane.describe()
    );
    // A lane of small files: eight decoders.
    let first = format!("the first of its {SMALL_FILES_ASSISTED_THREADS} decoders");
    assert!(lane.describe().contains(&first), "{}", lane.describe());
    assert!(!lane.poll_opening(), "no engines to take in");
    let (made, assisted, got) = run_lane_paths(&mut lane, &gpu, &bytes, 0x6B);
    // The other sets join; the images are the same, whichever set decodes them.
    lane.wait_until_open();
    let others = format!(
        "other {} decoders at work",
        SMALL_FILES_ASSISTED_THREADS - 1
    );
    assert!(lane.describe().contains(&others), "{}", lane.describe());
    let (made_after, assisted_after, got_after) = run_lane_paths(&mut lane, &gpu, &bytes, 0x2D);
    assert_eq!(made_after, made);
    assert_eq!(assisted_after, assisted);
    let screen = lane.runner.screen().clone();
    for (i, (name, file)) in files.iter().enumerate() {
        // Every file the lane's screen takes is the assisted path's but the few its parser
        // refuses (the CPU lane takes those).
        assert!(!made[i] || assisted[i], "{name}");
        if !made[i] {
            let parsed = crate::coefficients::entropy::parse(file).is_ok() && has_layout(file);
            assert!(screen.take(file).is_none() || !parsed, "{name} was refused");
            continue;
        }
        let mut cpu = vec![0u8; image];
        prepare_image(file, &DecodeOptions::default(), &resize, &mut cpu).expect("cpu");
        let place = i * image..(i + 1) * image;
        assert!(
            got[place.clone()] == cpu[..],
            "{name}: the assisted path differs from the CPU lane"
        );
        assert!(
            got_after[place] == cpu[..],
            "{name}: the assisted path differs from the CPU lane once every decoder is at work"
        );
    }
    assert!(made.iter().any(|&m| m), "the lane made nothing");
}

/// A lane offered images only from a later position (the CPU lane took every one before it,
/// finished while the device opened) works ahead from there before the batches reach it, up to
/// its lookahead past that position, and gives each image as the batches come to it.
#[test]
fn a_lane_offered_images_from_a_later_position_works_ahead_from_there() {
    let Some(gpu) = test_gpu("a_lane_offered_images_from_a_later_position_works_ahead_from_there")
    else {
        return;
    };
    let resize = ResizeOptions::default();
    let geometry = Geometry::new(&resize);
    let batch_size = 16;
    let first = 4 * lookahead(batch_size);
    let offered = 48;
    let files: Vec<Vec<u8>> = large_photos(11)
        .into_iter()
        .filter(|(name, _)| name.starts_with("small"))
        .map(|(_, bytes)| bytes)
        .collect();
    assert_eq!(files.len(), 2);
    let mut lane = open_lane(&gpu, &geometry, batch_size, false);
    let share = ShareSchedule::new(0.0);
    share.set_from(first, 1.0);
    let order = (0..first + offered).map(|p| p % files.len()).collect();
    begin_lane(&mut lane, &gpu, &files, order, share);
    // No batch has taken a position yet (no `advance`): the lane decodes on its own.
    let waited = std::time::Instant::now();
    while lane.activity().decoded < offered as u64 {
        assert!(
            waited.elapsed() < std::time::Duration::from_secs(60),
            "the lane decoded {} of the {offered} images from position {first} on its own",
            lane.activity().decoded
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let image = lane.image_bytes;
    let outputs = (first..first + offered)
        .map(|p| match lane.result(p) {
            LaneResult::Decoded(output) => (output, p - first),
            LaneResult::Refused => panic!("position {p} refused"),
        })
        .collect();
    let got = gather_outputs(&mut lane, &gpu, outputs, offered, 0xA5);
    let names: Vec<String> = (first..first + offered)
        .map(|p| format!("position {p}"))
        .collect();
    let cpu_lane = (0..offered).map(|k| {
        let mut want = vec![0u8; image];
        let file = &files[(first + k) % files.len()];
        prepare_image(file, &DecodeOptions::default(), &resize, &mut want).expect("cpu");
        (k, names[k].as_str(), want)
    });
    // The engines' IDCT, within the bars of `the_lane_decodes_like_the_cpu_lane`.
    let (mean, p999) = differences_from_the_cpu_lane(&got, image, cpu_lane, 1.5);
    assert!(mean <= 0.5 && p999 <= 3, "mean {mean:.3}, p99.9 {p999}");
}

#[test]
fn small_file_lanes_submit_from_more_assisted_threads_within_the_large_files_memory() {
    use super::open::assisted_threads;
    let geometry = Geometry::new(&ResizeOptions::default());
    let small = lane_config(&geometry, 256, 1.0);
    let beside = super::EnginesOpen::BesideTheLane;
    assert_eq!(
        assisted_threads(&small, beside),
        SMALL_FILES_ASSISTED_THREADS
    );
    assert_eq!(
        assisted_threads(&small, super::EnginesOpen::Never("a short run")),
        SMALL_FILES_ASSISTED_THREADS
    );
    let large = GpuLaneConfig {
        large_files: true,
        ..lane_config(&geometry, 256, 1.0)
    };
    assert_eq!(assisted_threads(&large, beside), ASSISTED_THREADS);
    let server = GpuLaneConfig {
        requests: true,
        ..lane_config(&geometry, 32, 1.0)
    };
    assert_eq!(assisted_threads(&server, beside), ASSISTED_THREADS);
    // The engines open first and take the small files: one thread for the few large ones.
    let few = GpuLaneConfig {
        small_files_assisted: false,
        ..lane_config(&geometry, 256, 1.0)
    };
    assert_eq!(assisted_threads(&few, super::EnginesOpen::BeforeTheLane), 1);
    // The small files' threads hold no more device memory than the large files' the lane is
    // sized for.
    let small_call = assisted::budget(assisted::call_pixels(false)).device_bytes();
    let large_call = assisted::budget(assisted::call_pixels(true)).device_bytes();
    assert!(
        SMALL_FILES_ASSISTED_THREADS * small_call <= ASSISTED_THREADS * large_call,
        "{SMALL_FILES_ASSISTED_THREADS} x {small_call} against {ASSISTED_THREADS} x {large_call}"
    );
}
