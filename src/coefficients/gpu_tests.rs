//! The kernels on the GPU against the CPU rendition and libjpeg-turbo's decode, bit for bit, on
//! every case (whole images, then random windows read with an early stop), with the outputs
//! poisoned twice with different values before the runs; and a batch over its budget refused.

use turbojpeg_region::CoefficientReader;

use super::cases::{cases, prepare, Prepared};
use super::gpu::{Budget, GpuDecoder};
use crate::cuda::test_gpu;
use gpufeed_bench::upload::random_bytes;

/// Runs `batch` through the decoder with the outputs poisoned with `poison`; returns each
/// image's rendered bytes.
fn run(decoder: &mut GpuDecoder, batch: &[&Prepared], poison: u8) -> Vec<Vec<u8>> {
    decoder.clear();
    decoder.poison(poison).expect("poison");
    for prepared in batch {
        decoder.add(&prepared.image, &prepared.bytes).expect("add");
    }
    transform_and_download(decoder)
}

/// Uploads and transforms the batch added to `decoder`; returns each image's rendered bytes.
pub(super) fn transform_and_download(decoder: &mut GpuDecoder) -> Vec<Vec<u8>> {
    decoder.upload().expect("upload");
    decoder.transform().expect("transform");
    let output = decoder
        .stream()
        .clone_dtoh(decoder.output())
        .expect("download");
    decoder
        .rendered()
        .iter()
        .map(|r| {
            let len = (r.height * r.pitch) as usize;
            output[r.offset as usize..r.offset as usize + len].to_vec()
        })
        .collect()
}

#[test]
fn the_gpu_equals_the_cpu_rendition_and_libjpeg_turbo() {
    let Some(gpu) = test_gpu("the_gpu_equals_the_cpu_rendition_and_libjpeg_turbo") else {
        return;
    };
    let mut decoder =
        GpuDecoder::new(gpu.stream(), Budget::for_megapixels(4.0, 64)).expect("decoder");
    let mut reader = CoefficientReader::new().unwrap();
    let all = cases(6);
    let picks = random_bytes(all.len() * 4, 13);
    for windows in [false, true] {
        let prepared: Vec<Prepared> = all
            .iter()
            .enumerate()
            .map(|(n, case)| prepare(&mut reader, case, windows.then(|| &picks[n * 4..n * 4 + 4])))
            .collect();
        // Batches as the budget cuts them.
        let mut start = 0;
        let mut batches = 0;
        while start < prepared.len() {
            decoder.clear();
            let mut end = start;
            while end < prepared.len() && decoder.fits(&prepared[end].image) {
                decoder
                    .add(&prepared[end].image, &prepared[end].bytes)
                    .expect("add");
                end += 1;
            }
            assert!(
                end > start,
                "{} does not fit an empty batch",
                prepared[start].name
            );
            let batch: Vec<&Prepared> = prepared[start..end].iter().collect();
            let first = run(&mut decoder, &batch, 0xA5);
            let second = run(&mut decoder, &batch, 0x5A);
            for ((p, a), b) in batch.iter().zip(&first).zip(&second) {
                assert!(
                    a == &p.expected && b == &p.expected,
                    "{} (windows: {windows}): the GPU differs at byte {:?}",
                    p.name,
                    a.iter().zip(&p.expected).position(|(x, y)| x != y)
                );
            }
            start = end;
            batches += 1;
        }
        assert!(batches >= 2, "the budget should cut the cases into batches");
    }
    // Over the budget: refused, the batch as it was.
    let large = all
        .iter()
        .find(|c| c.name == "1001x667")
        .expect("the large case");
    let big = prepare(&mut reader, large, None);
    let mut small = GpuDecoder::new(gpu.stream(), Budget::for_megapixels(0.01, 2)).unwrap();
    assert!(!small.fits(&big.image));
    assert!(small.add(&big.image, &big.bytes).is_err());
    assert!(small.is_empty());
    assert!(small.add(&big.image, &big.bytes[..8]).is_err());
}

/// kernels/idct.cu and kernels/entropy.cu compile with NVRTC for Hopper and Ampere wherever NVRTC loads (no device
/// needed), so a syntax error NVRTC alone would catch shows before a GPU run.
#[test]
fn the_kernels_compile_with_nvrtc() {
    // SAFETY: `is_culib_present` only tries to dlopen NVRTC by its usual names and reports
    // whether that worked; it calls nothing inside it.
    #[allow(unsafe_code)]
    let present = unsafe { cudarc::nvrtc::sys::is_culib_present() };
    if !present {
        use std::io::Write as _;
        let _ = writeln!(
            std::io::stderr(),
            "skipped: the_kernels_compile_with_nvrtc: NVRTC not found"
        );
        return;
    }
    let sources = [
        (
            "idct.cu",
            super::gpu::SOURCE,
            ["gpufeed_idct_islow", "gpufeed_upsample_color"].as_slice(),
        ),
        (
            "entropy.cu",
            super::gpu::ENTROPY_SOURCE,
            [
                "gpufeed_huff_zero",
                "gpufeed_huff_sync",
                "gpufeed_huff_scan",
                "gpufeed_huff_write",
            ]
            .as_slice(),
        ),
    ];
    for (name, code, kernels) in sources {
        let source = crate::cuda::KernelSource {
            name,
            code,
            defines: Vec::new(),
        };
        for (major, minor) in [(9, 0), (8, 0)] {
            let ptx = crate::cuda::compile_ptx(&source, major, minor)
                .unwrap_or_else(|e| panic!("{name}, compute_{major}{minor}: {e}"));
            let text = ptx.to_src();
            for kernel in kernels {
                assert!(
                    text.contains(kernel),
                    "{name}: {kernel}, compute_{major}{minor}"
                );
            }
        }
    }
}
