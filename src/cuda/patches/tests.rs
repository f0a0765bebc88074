use half::{bf16, f16};

use super::*;
use crate::cpu::{patch_batch, patch_image, PatchDraw, PatchImage};
use crate::patches::{Arithmetic, Packing};
use crate::random::Draws;
use crate::tensor::HostData;
use crate::DecodeOptions;

#[test]
fn the_kernel_compiles_with_nvrtc() {
    // SAFETY: `is_culib_present` only tries to dlopen NVRTC by its usual names and reports
    // whether that worked; it calls nothing inside it.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        use std::io::Write as _;
        let _ = writeln!(
            std::io::stderr(),
            "skipped: the_kernel_compiles_with_nvrtc: NVRTC not found"
        );
        return;
    }
    for (major, minor) in [(9, 0), (8, 0)] {
        let ptx = crate::cuda::compile_ptx(&kernel_source(), major, minor)
            .unwrap_or_else(|e| panic!("compute_{major}{minor}: {e}"));
        let text = ptx.to_src();
        for dtype in ["f32", "f16", "bf16"] {
            let entry = format!("gpufeed_patches_{dtype}");
            assert!(text.contains(&entry), "{entry} for compute_{major}{minor}");
        }
        assert!(
            !text.contains("fma.rn.f32"),
            "no fused multiply-add may round the values"
        );
    }
}

#[test]
fn the_table_refuses_images_that_do_not_hold_their_grid() {
    let layout = BatchLayout::new(&[(2, 3)], Packing::Packed).expect("layout");
    let fits = PlacedImage {
        offset: 5,
        width: 48,
        height: 32,
    };
    let bytes = 5 + 48 * 32 * 3;
    let table = image_table(bytes, &[fits], &layout, 16).expect("fits");
    assert_eq!((table[0].tokens, table[0].rows, table[0].grid_w), (6, 6, 3));
    assert!(
        image_table(bytes - 1, &[fits], &layout, 16).is_err(),
        "past the input"
    );
    let narrow = PlacedImage { width: 47, ..fits };
    assert!(
        image_table(bytes, &[narrow], &layout, 16).is_err(),
        "grid wider than it"
    );
    assert!(
        image_table(bytes, &[fits, fits], &layout, 16).is_err(),
        "one image too many"
    );
}

/// Random pixels for a random image size under `patches`' plan, or timm's random crop of it.
fn random_image(patches: &Patches, seq_len: Option<u32>, seed: u64) -> PatchImage {
    let mut d = Draws::new(seed);
    let (w, h) = (1 + d.below(1500) as u32, 1 + d.below(900) as u32);
    let plan = match seq_len {
        Some(seq) => patches.plan_random(w, h, seq, (seed, 0, seed as usize)),
        None => patches.plan(w, h),
    }
    .expect("plan");
    let n = plan.width as usize * plan.height as usize * 3;
    let pixels = (0..n).map(|_| d.next() as u8).collect();
    PatchImage { pixels, plan }
}

/// The configurations the kernel is compared on: preset, sequence length, packed; patches too
/// large for the places the kernel keeps in shared memory (more than 6,144 values a token);
/// tokens of a length that is not a multiple of four (written two values a thread: 1,350; one
/// value a thread: 675).
fn configurations() -> Vec<(Patches, Option<u32>)> {
    let mut wide_siglip = Patches::siglip2_naflex().max_patches(16);
    wide_siglip.patch_size = 48;
    let mut wide_qwen = Patches::qwen2_vl().max_pixels(200_000);
    wide_qwen.patch_size = 36;
    let mut even_qwen = Patches::qwen2_vl();
    even_qwen.patch_size = 15;
    let mut odd_siglip = Patches::siglip2_naflex().max_patches(64);
    odd_siglip.patch_size = 15;
    vec![
        (wide_siglip, None),
        (wide_qwen, None),
        (even_qwen, None),
        (odd_siglip, None),
        (Patches::qwen2_vl(), None),
        (Patches::qwen2_vl().arithmetic(Arithmetic::TorchFused), None),
        (Patches::qwen2_vl().packed(false), None),
        (Patches::qwen3_vl().max_pixels(32 * 32 * 300), None),
        (Patches::siglip2_naflex(), None),
        (Patches::siglip2_naflex().max_patches(64).packed(true), None),
        (Patches::timm_naflex(), Some(256)),
    ]
}

fn poisoned(stream: &Arc<CudaStream>, dtype: DType, len: usize) -> DeviceData {
    let fail = "poisoning the output";
    match dtype {
        DType::F32 => DeviceData::F32(
            stream
                .clone_htod(&vec![f32::from_bits(u32::MAX); len])
                .expect(fail),
        ),
        DType::F16 => DeviceData::F16(
            stream
                .clone_htod(&vec![f16::from_bits(0xFFFF); len])
                .expect(fail),
        ),
        DType::BF16 => DeviceData::BF16(
            stream
                .clone_htod(&vec![bf16::from_bits(0xFFFF); len])
                .expect(fail),
        ),
        other => panic!("no tokens of {other}"),
    }
}

/// The values' bit patterns, widened to 32 bits.
fn bits_of_device(stream: &Arc<CudaStream>, data: &DeviceData) -> Vec<u32> {
    let fail = "downloading the tokens";
    match data {
        DeviceData::F32(s) => stream
            .clone_dtoh(s)
            .expect(fail)
            .iter()
            .map(|v| v.to_bits())
            .collect(),
        DeviceData::F16(s) => stream
            .clone_dtoh(s)
            .expect(fail)
            .iter()
            .map(|v| u32::from(v.to_bits()))
            .collect(),
        DeviceData::BF16(s) => stream
            .clone_dtoh(s)
            .expect(fail)
            .iter()
            .map(|v| u32::from(v.to_bits()))
            .collect(),
        other => panic!("no tokens of {}", other.dtype()),
    }
}

fn bits_of_host(data: &HostData) -> Vec<u32> {
    match data {
        HostData::F32(v) => v.iter().map(|v| v.to_bits()).collect(),
        HostData::F16(v) => v.iter().map(|v| u32::from(v.to_bits())).collect(),
        HostData::BF16(v) => v.iter().map(|v| u32::from(v.to_bits())).collect(),
        other => panic!("no tokens of {}", other.dtype()),
    }
}

#[test]
fn the_kernel_matches_the_cpu_bit_for_bit() {
    let Some(gpu) = crate::cuda::test_gpu(module_path!()) else {
        return;
    };
    let stream = gpu.stream().clone();
    let mut kernel = PatchKernel::new(&stream).expect("compile");
    let photos = [
        "assets/chelsea.png",
        "assets/rocket.jpg",
        "assets/camera.png",
        "assets/retina.jpg",
    ];
    for (case, (patches, seq_len)) in configurations().into_iter().enumerate() {
        let mut images: Vec<PatchImage> = photos
            .iter()
            .enumerate()
            .map(|(index, path)| {
                let bytes = std::fs::read(path).expect("photo");
                let draw = seq_len.map(|seq_len| PatchDraw {
                    seq_len,
                    seed: 5,
                    epoch: 1,
                    index,
                });
                patch_image(&bytes, path, &DecodeOptions::default(), &patches, draw).expect("photo")
            })
            .collect();
        images.extend((0..12).map(|i| random_image(&patches, seq_len, case as u64 * 100 + i)));
        // One buffer, each image after a gap of 0 to 6 bytes (unaligned on purpose).
        let mut input = Vec::new();
        let mut placed = Vec::new();
        for (i, image) in images.iter().enumerate() {
            input.extend(std::iter::repeat_n(0xAAu8, i % 7));
            placed.push(PlacedImage {
                offset: input.len(),
                width: image.plan.width,
                height: image.plan.height,
            });
            input.extend_from_slice(&image.pixels);
        }
        let device_input = stream.clone_htod(&input).expect("upload");
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let want = patch_batch(&images, &patches, dtype, seq_len).expect("cpu");
            let len = want.layout.rows * want.patch_dim;
            let mut out = poisoned(&stream, dtype, len);
            kernel
                .run_into(
                    &stream,
                    &device_input,
                    &placed,
                    &want.layout,
                    &patches,
                    &mut out,
                )
                .expect("run");
            let (got, want_bits) = (bits_of_device(&stream, &out), bits_of_host(&want.tokens));
            assert_eq!(got.len(), want_bits.len());
            if let Some(i) = got.iter().zip(&want_bits).position(|(a, b)| a != b) {
                let (row, value) = (i / want.patch_dim, i % want.patch_dim);
                panic!(
                    "case {case} ({:?}, {dtype:?}): row {row} value {value} is {:#x} on the GPU, \
                     {:#x} on the CPU",
                    patches.preset, got[i], want_bits[i]
                );
            }
        }
    }
}
