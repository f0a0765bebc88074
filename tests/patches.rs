//! Patch sequences through the pipeline on the CPU device: every preset's batches equal the CPU
//! rendition of the references (`gpufeed::cpu::patch_image` + `patch_batch`, which
//! `tests/patches_reference.py` compares with transformers and timm) bit for bit, with their
//! grids, masks, coordinates and plans; timm's batches follow their schedule (sizes, sequence
//! lengths, `len()`), resume exactly and split over ranks with every image once; tar shards
//! and bytes sources; odd images and conflicting options give clear errors.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

mod common;

use common::{generated_image_folder, repo_path, TempDir};
use gpufeed::cpu::{patch_batch, patch_image, PatchDraw};
use gpufeed::patches::{Packing, Patches};
use gpufeed::{
    Batch, DType, DecodeOptions, Device, Error, Pipeline, PipelineBuilder, PipelineState,
    ShardBalance, Source, Tensor,
};

/// The photos and odd fixtures the presets are compared on: colour and gray JPEGs, progressive,
/// CMYK, PNGs with transparency, a palette, 16 bits, a 1-pixel image, a 10 x 600 column and a
/// 4000 x 10 row.
fn odd_images() -> Vec<PathBuf> {
    let mut paths: Vec<PathBuf> = [
        "assets/rocket.jpg",
        "assets/chelsea.png",
        "assets/coffee.png",
        "assets/camera.png",
        "tests/fixtures/gray.jpg",
        "tests/fixtures/progressive.jpg",
        "tests/fixtures/cmyk.jpg",
        "tests/fixtures/rgba.png",
        "tests/fixtures/gray_alpha.png",
        "tests/fixtures/palette.png",
        "tests/fixtures/rgb16.png",
        "tests/fixtures/one_pixel.png",
        "tests/fixtures/tall_10x600.png",
        "tests/fixtures/wide_4000x10.png",
        "tests/fixtures/lossy.webp",
        "tests/fixtures/rgb444.jpg",
    ]
    .iter()
    .map(|p| repo_path(p))
    .collect();
    paths.sort();
    paths
}

/// The values of a tensor as bit patterns widened to 64 bits, for exact comparisons.
fn bits(tensor: &Tensor) -> Vec<u64> {
    let host = tensor.to_host().expect("host");
    match host.data() {
        gpufeed::HostData::F32(v) => v.iter().map(|x| u64::from(x.to_bits())).collect(),
        gpufeed::HostData::F16(v) => v.iter().map(|x| u64::from(x.to_bits())).collect(),
        gpufeed::HostData::BF16(v) => v.iter().map(|x| u64::from(x.to_bits())).collect(),
        gpufeed::HostData::I32(v) => v.iter().map(|&x| x as u64).collect(),
        gpufeed::HostData::I64(v) => v.iter().map(|&x| x as u64).collect(),
        gpufeed::HostData::U8(v) => v.iter().map(|&x| u64::from(x)).collect(),
    }
}

fn host_bits(data: &gpufeed::HostData) -> Vec<u64> {
    let tensor =
        gpufeed::HostTensor::new(data.clone(), [data.len()], gpufeed::Layout::Nchw).expect("shape");
    bits(&Tensor::Host(tensor))
}

/// Checks one batch against the CPU rendition of its images (drawn for `seq_len` under `seed`
/// with timm), bit for bit, with every side tensor.
fn check_against_rendition(
    batch: &Batch,
    patches: &Patches,
    dtype: DType,
    timm: Option<(u64, u32)>,
) {
    let info = batch.patches().expect("a patch batch");
    let images: Vec<_> = batch
        .ids()
        .iter()
        .zip(batch.indices())
        .map(|(id, &index)| {
            let bytes = std::fs::read(id).expect("read");
            let draw = timm.map(|(seed, seq_len)| PatchDraw {
                seq_len,
                seed,
                epoch: batch.epoch(),
                index,
            });
            patch_image(&bytes, id, &DecodeOptions::default(), patches, draw).expect("image")
        })
        .collect();
    let want = patch_batch(&images, patches, dtype, timm.map(|t| t.1)).expect("batch");
    let tokens = batch.tokens().expect("tokens");
    assert_eq!(tokens.dtype(), dtype);
    assert_eq!(bits(tokens), host_bits(&want.tokens), "{:?}", batch.ids());
    match want.layout.packing {
        Packing::Packed => assert_eq!(tokens.shape(), [want.layout.rows, want.patch_dim]),
        Packing::Padded { len } => {
            assert_eq!(tokens.shape(), [batch.len(), len as usize, want.patch_dim])
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(info.plans(), want.plans.as_slice());
    assert_eq!(info.layout(), &want.layout);
    assert_eq!(info.cu_seqlens(), want.cu_seqlens());
    let grids: Vec<[i64; 3]> = want.grids().iter().map(|g| g.map(i64::from)).collect();
    assert_eq!(info.grids(), grids);
    let mask: Vec<i32> = want.layout.mask().into_iter().map(i32::from).collect();
    assert_eq!(info.mask(), mask);
    // The tensors hold the vectors.
    let cu = info.cu_seqlens_tensor().expect("cu_seqlens");
    assert_eq!(cu.dtype(), DType::I32);
    assert_eq!(cu.shape(), [batch.len() + 1]);
    let grid = info.grids_tensor().expect("grids");
    assert_eq!(
        (grid.dtype(), grid.shape()),
        (DType::I64, &[batch.len(), 3][..])
    );
    let flat: Vec<u64> = grids.iter().flatten().map(|&v| v as u64).collect();
    assert_eq!(bits(&grid), flat);
    let coords = info.coordinates_tensor().expect("coordinates");
    assert_eq!(coords.shape().last(), Some(&2));
    let crops = batch.crops().expect("each image's box");
    for (crop, plan) in crops.iter().zip(info.plans()) {
        assert_eq!(
            (crop.left, crop.top, crop.width, crop.height, crop.flipped),
            (
                plan.left,
                plan.top,
                plan.crop_width,
                plan.crop_height,
                plan.flipped
            )
        );
    }
}

fn cpu(builder: PipelineBuilder) -> Pipeline {
    builder.device(Device::Cpu).build().expect("build")
}

#[test]
fn every_preset_equals_the_cpu_rendition_of_its_reference() {
    let presets = [
        (Patches::qwen2_vl().max_pixels(28 * 28 * 300), DType::F32),
        (
            Patches::qwen2_vl().max_pixels(28 * 28 * 200).torchvision(),
            DType::BF16,
        ),
        (Patches::qwen3_vl().max_pixels(32 * 32 * 300), DType::F16),
        (Patches::siglip2_naflex(), DType::F16),
        (
            Patches::siglip2_naflex().max_patches(64).packed(true),
            DType::F32,
        ),
    ];
    for (patches, dtype) in presets {
        let mut pipeline = cpu(Pipeline::builder()
            .source(Source::paths(odd_images()))
            .patches(patches)
            .batch_size(5)
            .dtype(dtype));
        let mut delivered = 0;
        let mut skipped = Vec::new();
        while let Some(batch) = pipeline.next_batch().expect("batch") {
            check_against_rendition(&batch, &patches, dtype, None);
            delivered += batch.len();
            skipped.extend(batch.skipped().iter().cloned());
        }
        // Qwen2-VL refuses the 4000 x 10 row (aspect ratio 400), naming it; the others take
        // every image.
        let names: Vec<String> = skipped.iter().map(|e| e.to_string()).collect();
        match patches.preset {
            gpufeed::patches::Preset::Qwen2Vl => {
                assert_eq!(names.len(), 1, "{names:?}");
                assert!(names[0].contains("wide_4000x10.png"), "{names:?}");
                assert!(names[0].contains("aspect ratio 400.0"), "{names:?}");
            }
            _ => assert!(names.is_empty(), "{names:?}"),
        }
        assert_eq!(delivered + skipped.len(), odd_images().len());
        let report = pipeline.epoch_report();
        assert!(report.complete);
        assert_eq!(report.images + report.skipped.len(), pipeline.len());
    }
}

/// A folder of small generated JPEGs of many sizes (and a few broken files).
fn generated(name: &str, images: usize, bad: usize) -> (TempDir, usize) {
    let dir = TempDir::new(name);
    let total = generated_image_folder(&dir, images, bad);
    (dir, total)
}

/// timm's batches with a small budget: sequence lengths 16 to 64 patches of 16.
fn small_timm() -> Patches {
    Patches::timm_naflex()
        .seq_lens(&[16, 32, 64])
        .tokens_per_batch(8 * 64)
}

/// Every batch of one epoch: (index, token bits of its rows) per image, with the batch's sizes.
type Epoch = Vec<(Vec<usize>, Vec<u64>, Option<u32>)>;

fn take_epoch(pipeline: &mut Pipeline) -> Epoch {
    let mut batches = Vec::new();
    for batch in &mut *pipeline {
        let batch = batch.expect("batch");
        let info = batch.patches().expect("patches");
        batches.push((
            batch.indices().to_vec(),
            bits(batch.tokens().expect("tokens")),
            info.seq_len(),
        ));
    }
    batches
}

#[test]
fn timm_batches_follow_their_schedule_and_equal_the_rendition() {
    let (dir, total) = generated("timm", 60, 0);
    let patches = small_timm();
    let seed = 5;
    let mut pipeline = cpu(Pipeline::builder()
        .source(Source::directory(&dir).expect("folder"))
        .patches(patches)
        .seed(seed)
        .shuffle(seed)
        .dtype(DType::F32));
    let schedule = patches.schedule(seed, total).expect("schedule");
    assert_eq!(pipeline.batches_per_epoch(), schedule.len());
    for epoch in 0..2u64 {
        let planned = schedule.epoch(epoch);
        let mut seen = Vec::new();
        let mut k = 0;
        for batch in &mut pipeline {
            let batch = batch.expect("batch");
            let info = batch.patches().expect("patches");
            let seq_len = info.seq_len().expect("a sequence length");
            assert_eq!(
                (batch.len(), seq_len),
                (planned[k].size, planned[k].seq_len)
            );
            assert_eq!(info.packing(), Packing::Padded { len: seq_len });
            check_against_rendition(&batch, &patches, DType::F32, Some((seed, seq_len)));
            seen.extend_from_slice(batch.indices());
            k += 1;
        }
        assert_eq!(k, schedule.len(), "epoch {epoch}");
        seen.sort_unstable();
        assert_eq!(seen, (0..total).collect::<Vec<_>>(), "every image once");
        assert_eq!(pipeline.epoch_report().batches, schedule.len());
    }
}

#[test]
fn timm_resumes_row_for_row_and_every_rank_takes_its_own_images_once() {
    let (dir, _) = generated("timm-resume", 50, 3);
    let source = || Source::directory(&dir).expect("folder");
    let builder = || {
        Pipeline::builder()
            .source(source())
            .patches(small_timm())
            .seed(2)
            .shuffle(2)
            .dtype(DType::F16)
    };
    let mut whole = cpu(builder());
    let first = take_epoch(&mut whole);
    let second = take_epoch(&mut whole);
    for stop in [1, 3] {
        let mut stopped = cpu(builder());
        let mut taken = Vec::new();
        for batch in &mut stopped {
            let batch = batch.expect("batch");
            taken.push(batch.indices().to_vec());
            if taken.len() == stop {
                break;
            }
        }
        let state = PipelineState::from_json(&stopped.state().to_json()).expect("json");
        drop(stopped);
        let mut resumed = cpu(builder().resume(state));
        let rest = take_epoch(&mut resumed);
        assert_eq!(rest.as_slice(), &first[stop..], "resumed after {stop}");
        assert_eq!(take_epoch(&mut resumed), second, "the next epoch too");
    }
    // Three ranks: the same number of batches each, every image once.
    let mut all = Vec::new();
    let mut counts = Vec::new();
    for rank in 0..3 {
        let mut pipeline = cpu(builder().shard(rank, 3).shard_balance(ShardBalance::Pad));
        counts.push(pipeline.batches_per_epoch());
        let mut batches = 0;
        for batch in &mut pipeline {
            let batch = batch.expect("batch");
            batches += 1;
            for (&index, &padded) in batch.indices().iter().zip(batch.padded()) {
                if !padded {
                    all.push(index);
                }
            }
        }
        assert_eq!(batches, counts[0], "rank {rank}");
        // A state of three ranks resumes with three, not two.
        let state = pipeline.state();
        let refused = Pipeline::builder()
            .source(source())
            .patches(small_timm())
            .seed(2)
            .shuffle(2)
            .shard(0, 2)
            .device(Device::Cpu)
            .resume(state)
            .build()
            .expect_err("another world");
        assert!(refused.to_string().contains("timm-naflex"), "{refused}");
    }
    assert!(counts.iter().all(|&c| c == counts[0]));
    all.sort_unstable();
    let broken: usize = 3;
    assert_eq!(all.len() + broken, 53);
    all.dedup();
    assert_eq!(all.len() + broken, 53, "every good image once");
}

#[test]
fn qwen_shards_take_every_image_once_and_resume_row_for_row() {
    let (dir, total) = generated("qwen-shards", 30, 0);
    let builder = |rank: usize| {
        Pipeline::builder()
            .source(Source::directory(&dir).expect("folder"))
            .patches(Patches::qwen2_vl().max_pixels(28 * 28 * 16))
            .batch_size(4)
            .shuffle(9)
            .shard(rank, 2)
            .dtype(DType::F32)
    };
    let mut seen = BTreeMap::new();
    for rank in 0..2 {
        let mut pipeline = cpu(builder(rank));
        let batches = take_epoch(&mut pipeline);
        for (indices, _, _) in &batches {
            for &i in indices {
                *seen.entry(i).or_insert(0) += 1;
            }
        }
        // Stopped after two batches and resumed: the same rows.
        let mut stopped = cpu(builder(rank));
        for _ in 0..2 {
            stopped.next_batch().expect("batch").expect("a batch");
        }
        let mut resumed = cpu(builder(rank).resume(stopped.state()));
        assert_eq!(take_epoch(&mut resumed).as_slice(), &batches[2..]);
    }
    assert_eq!(seen.len(), total);
}

#[test]
fn tar_shards_and_bytes_give_the_folder_s_tokens() {
    let dir = TempDir::new("patch-shards");
    let photos = ["rocket.jpg", "chelsea.png", "camera.png", "retina.jpg"];
    let members = dir.join("members");
    std::fs::create_dir_all(&members).expect("mkdir");
    let mut names = Vec::new();
    for (i, photo) in photos.iter().enumerate() {
        let ext = photo.rsplit_once('.').map_or("jpg", |(_, e)| e);
        let name = format!("s{i:03}.{ext}");
        std::fs::copy(repo_path(&format!("assets/{photo}")), members.join(&name)).expect("copy");
        names.push(name);
    }
    let shards = dir.join("shards");
    std::fs::create_dir_all(&shards).expect("mkdir");
    let status = std::process::Command::new("tar")
        .arg("-cf")
        .arg(shards.join("a-000.tar"))
        .arg("-C")
        .arg(&members)
        .args(&names)
        .status()
        .expect("tar");
    assert!(status.success());
    let tokens = |source: Source| -> Vec<Vec<u64>> {
        let mut pipeline = cpu(Pipeline::builder()
            .source(source)
            .patches(Patches::siglip2_naflex().max_patches(100))
            .batch_size(3)
            .dtype(DType::F32));
        take_epoch(&mut pipeline)
            .into_iter()
            .map(|(_, bits, _)| bits)
            .collect()
    };
    let paths: Vec<PathBuf> = names.iter().map(|n| members.join(n)).collect();
    let from_files = tokens(Source::paths(paths.clone()));
    assert_eq!(
        tokens(Source::webdataset(&shards).expect("shards")),
        from_files
    );
    let bytes: Vec<(String, Vec<u8>)> = paths
        .iter()
        .map(|p| (p.display().to_string(), std::fs::read(p).expect("read")))
        .collect();
    assert_eq!(tokens(Source::bytes(bytes)), from_files);
}

fn refused(builder: PipelineBuilder) -> Error {
    builder.device(Device::Cpu).build().expect_err("refused")
}

#[test]
fn conflicting_options_and_budgets_under_one_patch_are_refused_by_name() {
    let qwen = || Pipeline::builder().patches(Patches::qwen2_vl());
    // Qwen2-VL's default budget in batches of 256 takes more memory than the machine has: the
    // error names the option to lower. (An epoch of one image would cut the batch to one row,
    // so the epoch holds a full batch.)
    let rockets = vec![repo_path("assets/rocket.jpg"); 256];
    let e = refused(qwen().prefetch(64).source(Source::paths(rockets.clone())));
    assert!(
        matches!(&e, Error::InvalidOption { option, .. } if *option == "prefetch" || *option == "batch_size"),
        "{e}"
    );
    // Qwen3-VL's own budget lets an image reach 16.7 Mpx: batches of 256 (64.42 GB each) are
    // refused naming the batch size, or the prefetch depth where two such batches fit, and the
    // message the budget that sizes the images; an image too large for the machine on its own
    // names the budget.
    let e = refused(
        Pipeline::builder()
            .patches(Patches::qwen3_vl())
            .source(Source::paths(rockets.clone())),
    );
    assert!(
        matches!(&e, Error::InvalidOption { option, .. } if *option == "batch_size" || *option == "prefetch"),
        "{e}"
    );
    assert!(e.to_string().contains("a batch of 256 images"), "{e}");
    assert!(
        e.to_string()
            .contains("up to 16777216 pixels (or lower max_pixels)"),
        "{e}"
    );
    let e = refused(
        Pipeline::builder()
            .patches(Patches::qwen3_vl().max_pixels(4_000_000_000))
            .batch_size(2)
            .source(Source::paths(rockets)),
    );
    assert!(
        matches!(&e, Error::InvalidOption { option, .. } if *option == "max_pixels"),
        "{e}"
    );
    let cases: Vec<(PipelineBuilder, &str)> = vec![
        (
            qwen().resize(gpufeed::ResizeMode::center_crop(256, 200)),
            "resize",
        ),
        (qwen().horizontal_flip(0.5), "horizontal_flip"),
        (
            qwen().interpolation(gpufeed::Interpolation::Lanczos),
            "interpolation",
        ),
        (qwen().mean_std([0.5; 3], [0.5; 3]), "mean/std"),
        (qwen().layout(gpufeed::Layout::Nhwc), "layout"),
        (qwen().color_jitter(0.4, 0.4, 0.4, 0.0), "augment"),
        (qwen().dct_scaling(true), "dct_scaling"),
        (qwen().dtype(DType::I32), "dtype"),
        (
            Pipeline::builder().patches(Patches::qwen2_vl().max_pixels(700)),
            "max_pixels",
        ),
        (
            Pipeline::builder().patches(Patches::siglip2_naflex().max_patches(0)),
            "max_patches",
        ),
        (
            Pipeline::builder().patches(Patches::timm_naflex().tokens_per_batch(100)),
            "tokens_per_batch",
        ),
    ];
    for (builder, option) in cases {
        let e = refused(builder.source(Source::paths([repo_path("assets/rocket.jpg")])));
        assert!(
            matches!(&e, Error::InvalidOption { option: o, .. } if *o == option),
            "{option}: {e}"
        );
    }
}

#[test]
fn odd_images_give_their_documented_results() {
    let run = |patches: Patches, path: &Path| {
        let mut pipeline = cpu(Pipeline::builder()
            .source(Source::paths([path.to_path_buf()]))
            .patches(patches)
            .batch_size(1)
            .dtype(DType::F32));
        let batch = pipeline.next_batch().expect("batch");
        (batch, pipeline.epoch_report().clone())
    };
    // One pixel: Qwen2-VL's smallest grid, 56 x 56.
    let (batch, _) = run(
        Patches::qwen2_vl(),
        &repo_path("tests/fixtures/one_pixel.png"),
    );
    let plan = batch.expect("a batch").patches().expect("patches").plans()[0];
    assert_eq!((plan.width, plan.height), (56, 56));
    // A 4000 x 10 row: SigLIP2 gives it one row of patches, Qwen2-VL refuses it by name.
    let wide = repo_path("tests/fixtures/wide_4000x10.png");
    let (batch, _) = run(Patches::siglip2_naflex(), &wide);
    let plan = batch.expect("a batch").patches().expect("patches").plans()[0];
    assert_eq!(plan.grid_h, 1);
    let (batch, report) = run(Patches::qwen2_vl(), &wide);
    assert!(batch.is_none());
    assert_eq!(report.skipped.len(), 1);
    assert!(report.skipped[0].to_string().contains("wide_4000x10.png"));
}

#[test]
fn eval_presets_are_fixed_size_outputs() {
    let mut pipeline = cpu(Pipeline::builder()
        .source(Source::paths([repo_path("assets/rocket.jpg")]))
        .eval_preset(gpufeed::patches::EvalPreset::Siglip384));
    let batch = pipeline.next_batch().expect("batch").expect("a batch");
    assert_eq!(batch.images().shape(), [1, 3, 384, 384]);
    assert!(batch.patches().is_none() && batch.tokens().is_none());
    assert_eq!(pipeline.options().output.mean, [0.5; 3]);
}
