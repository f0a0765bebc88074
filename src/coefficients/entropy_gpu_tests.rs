//! The entropy kernels on the GPU, end to end: baseline JPEGs parsed on the host, decoded on the
//! device, transformed by the IDCT and colour kernels; the rendered windows against the CPU
//! rendition and libjpeg-turbo's decode, the dense coefficients against libjpeg-turbo's, bit for
//! bit, on every baseline case, larger photos and random windows, in batches that mix packed and
//! entropy-coded images, with the outputs poisoned twice with different values. Broken files in
//! a batch are flagged without disturbing the others.

use turbojpeg_region::CoefficientReader;

use super::cases::{cases, prepare, Case, Prepared};
use super::entropy::{parse, ParsedJpeg};
use super::entropy_batch::PASSES;
use super::entropy_host_check::larger_cases;
use super::gpu::{Budget, GpuDecoder};
use super::sync_passes::{Settled, SyncPasses};
use super::Layout;
use crate::cuda::test_gpu;
use gpufeed_bench::upload::random_bytes;

/// One image of a test batch: packed, or entropy-coded with its parse and layout.
struct Item {
    prepared: Prepared,
    jpeg: Vec<u8>,
    entropy: Option<(ParsedJpeg, Layout)>,
}

fn add(decoder: &mut GpuDecoder, item: &Item) -> bool {
    let p = &item.prepared;
    match &item.entropy {
        Some((parsed, layout)) => {
            if !decoder.fits_entropy_coded(parsed, layout, &p.image.window) {
                return false;
            }
            decoder
                .add_entropy_coded(parsed, layout, &p.image.window)
                .expect("add_entropy_coded");
        }
        None => {
            if !decoder.fits(&p.image) {
                return false;
            }
            decoder.add(&p.image, &p.bytes).expect("add");
        }
    }
    true
}

/// Runs `batch` with the outputs poisoned with `poison`; returns each image's rendered bytes.
fn run(decoder: &mut GpuDecoder, batch: &[&Item], poison: u8) -> Vec<Vec<u8>> {
    decoder.clear();
    decoder.poison(poison).expect("poison");
    for item in batch {
        assert!(add(decoder, item));
    }
    super::gpu_tests::transform_and_download(decoder)
}

/// The dense planes of the batch's entropy-coded images against libjpeg-turbo's coefficients.
fn check_coefficients(decoder: &GpuDecoder, batch: &[&Item], reader: &mut CoefficientReader) {
    let coded = batch.iter().filter(|i| i.entropy.is_some());
    for (h, item) in coded.enumerate() {
        let planes = decoder.dense_planes(h).expect("dense planes");
        let read = reader.open(&item.jpeg).unwrap().read(None).unwrap();
        for (c, info) in read.header().components().iter().enumerate() {
            let (pitch, values) = &planes[c];
            for row in 0..info.blocks_high {
                let start = row as usize * *pitch as usize * 64;
                let got = &values[start..start + info.blocks_wide as usize * 64];
                let expected = read.block_row(c, row).unwrap();
                assert!(
                    got == expected,
                    "{}: component {c}, block row {row}: the GPU's coefficients differ",
                    item.prepared.name
                );
            }
        }
    }
}

#[test]
fn the_gpu_entropy_decode_equals_libjpeg_turbo() {
    let Some(gpu) = test_gpu("the_gpu_entropy_decode_equals_libjpeg_turbo") else {
        return;
    };
    let mut decoder =
        GpuDecoder::new(gpu.stream(), Budget::for_megapixels(6.0, 48)).expect("decoder");
    let mut reader = CoefficientReader::new().unwrap();
    let mut all = cases(8);
    all.extend(
        larger_cases()
            .into_iter()
            .map(|(name, jpeg)| Case { name, jpeg }),
    );
    let picks = random_bytes(all.len() * 4, 21);
    let mut entropy_images = 0;
    for windows in [false, true] {
        let items: Vec<Item> = all
            .iter()
            .enumerate()
            .map(|(n, case)| {
                let pick = windows.then(|| &picks[n * 4..n * 4 + 4]);
                let prepared = prepare(&mut reader, case, pick);
                // Every third baseline image stays packed: mixed batches.
                let entropy = parse(&case.jpeg).ok().filter(|_| n % 3 != 1).map(|p| {
                    let header = reader.open(&case.jpeg).unwrap().header().clone();
                    (p, Layout::new(&header).unwrap())
                });
                Item {
                    prepared,
                    jpeg: case.jpeg.clone(),
                    entropy,
                }
            })
            .collect();
        let mut start = 0;
        while start < items.len() {
            decoder.clear();
            let mut end = start;
            while end < items.len() && add(&mut decoder, &items[end]) {
                end += 1;
            }
            assert!(end > start, "{} does not fit", items[start].prepared.name);
            let batch: Vec<&Item> = items[start..end].iter().collect();
            let first = run(&mut decoder, &batch, 0xA5);
            assert_eq!(decoder.entropy_failures().unwrap(), vec![]);
            check_coefficients(&decoder, &batch, &mut reader);
            let second = run(&mut decoder, &batch, 0x5A);
            for ((item, a), b) in batch.iter().zip(&first).zip(&second) {
                let p = &item.prepared;
                assert!(
                    a == &p.expected && b == &p.expected,
                    "{} (windows: {windows}, entropy-coded: {}): the GPU differs at byte {:?}",
                    p.name,
                    item.entropy.is_some(),
                    a.iter().zip(&p.expected).position(|(x, y)| x != y)
                );
            }
            entropy_images += batch.iter().filter(|i| i.entropy.is_some()).count();
            start = end;
        }
    }
    assert!(
        entropy_images > 100,
        "{entropy_images} entropy-coded images"
    );
}

#[test]
fn broken_files_are_flagged_on_the_gpu_and_spare_their_batch() {
    let Some((_gpu, mut decoder, mut reader, whole)) =
        larger_setup("broken_files_are_flagged_on_the_gpu_and_spare_their_batch")
    else {
        return;
    };
    let mut items = Vec::new();
    let mut broken = Vec::new();
    for item in whole {
        let Some((_, layout)) = item.entropy.clone() else {
            panic!("{}: the larger items are entropy-coded", item.prepared.name);
        };
        let case = Case {
            name: item.prepared.name.clone(),
            jpeg: item.jpeg.clone(),
        };
        items.push(item);
        // The file cut in the middle of its data: parsed (no EOI) and flagged short, unless
        // its restart markers say it is cut (refused).
        let cut = &case.jpeg[..case.jpeg.len() * 3 / 5];
        if let Ok(parsed_cut) = parse(cut) {
            broken.push(items.len());
            items.push(Item {
                prepared: prepare(&mut reader, &case, None),
                jpeg: cut.to_vec(),
                entropy: Some((parsed_cut, layout)),
            });
        }
    }
    assert!(!broken.is_empty());
    let batch: Vec<&Item> = items.iter().collect();
    let out = run(&mut decoder, &batch, 0x33);
    let failures = decoder.entropy_failures().unwrap();
    let failed: Vec<usize> = failures.iter().map(|f| f.0).collect();
    assert_eq!(failed, broken, "{failures:?}");
    for (i, (item, a)) in batch.iter().zip(&out).enumerate() {
        if !broken.contains(&i) {
            assert!(a == &item.prepared.expected, "{}", item.prepared.name);
        }
    }
}

/// The larger cases as entropy-coded items.
fn larger_items(reader: &mut CoefficientReader) -> Vec<Item> {
    larger_cases()
        .into_iter()
        .map(|(name, jpeg)| {
            let header = reader.open(&jpeg).unwrap().header().clone();
            let entropy = Some((parse(&jpeg).unwrap(), Layout::new(&header).unwrap()));
            let case = Case {
                name,
                jpeg: jpeg.clone(),
            };
            Item {
                prepared: prepare(reader, &case, None),
                jpeg,
                entropy,
            }
        })
        .collect()
}

/// A decoder for the larger cases, with a reader and the cases as items (None without a GPU;
/// the GPU is returned to be kept alive).
fn larger_setup(
    test: &str,
) -> Option<(crate::cuda::Gpu, GpuDecoder, CoefficientReader, Vec<Item>)> {
    let gpu = test_gpu(test)?;
    let decoder = GpuDecoder::new(gpu.stream(), Budget::for_megapixels(16.0, 16)).expect("decoder");
    let mut reader = CoefficientReader::new().unwrap();
    let items = larger_items(&mut reader);
    Some((gpu, decoder, reader, items))
}

/// Every image of the batch decoded to libjpeg-turbo's pixels.
fn assert_exact(batch: &[&Item], out: &[Vec<u8>]) {
    for (item, a) in batch.iter().zip(out) {
        assert!(a == &item.prepared.expected, "{}", item.prepared.name);
    }
}

#[test]
fn later_batches_launch_the_passes_recent_ones_needed_and_stay_exact() {
    let Some((_gpu, mut decoder, mut reader, items)) =
        larger_setup("later_batches_launch_the_passes_recent_ones_needed_and_stay_exact")
    else {
        return;
    };
    let batch: Vec<&Item> = items.iter().collect();
    for round in 0..3u8 {
        let out = run(&mut decoder, &batch, 0x11 * (round + 1));
        let launched = decoder.sync_passes_launched();
        if round == 0 {
            assert_eq!(launched, PASSES, "a new decoder launches every pass");
        } else {
            assert!(launched < PASSES, "round {round}: still {launched} passes");
        }
        assert_eq!(decoder.entropy_failures().unwrap(), vec![], "round {round}");
        check_coefficients(&decoder, &batch, &mut reader);
        assert_exact(&batch, &out);
    }
}

#[test]
fn too_few_passes_flag_images_and_the_next_batch_launches_every_pass() {
    let Some((_gpu, mut decoder, _reader, items)) =
        larger_setup("too_few_passes_flag_images_and_the_next_batch_launches_every_pass")
    else {
        return;
    };
    let batch: Vec<&Item> = items.iter().collect();
    // Recent batches that settled at once, and a floor of 8: the policy launches 8 passes, fewer
    // than these photos need (the 4:2:0 one's chains settle in pass 8, the ninth launch, in the
    // host run of the kernels).
    *decoder.sync_passes() = SyncPasses::with_floor(8);
    decoder.sync_passes().record(u8::MAX, Settled::After(2));
    let out = run(&mut decoder, &batch, 0x77);
    let launched = decoder.sync_passes_launched();
    assert!(launched < PASSES);
    let failures = decoder.entropy_failures().unwrap();
    assert!(
        !failures.is_empty(),
        "{launched} passes settled every photo"
    );
    for (i, (item, a)) in batch.iter().zip(&out).enumerate() {
        match failures.iter().find(|f| f.0 == i) {
            // Unsettled, its write pass may also have run past its data or ended short.
            Some(&(_, bits)) => assert!(
                bits & super::entropy_batch::status::NO_SYNC != 0,
                "{}: {bits:#x}",
                item.prepared.name
            ),
            None => assert!(a == &item.prepared.expected, "{}", item.prepared.name),
        }
    }
    let out = run(&mut decoder, &batch, 0x78);
    assert_eq!(decoder.sync_passes_launched(), PASSES);
    assert_eq!(decoder.entropy_failures().unwrap(), vec![]);
    assert_exact(&batch, &out);
}
