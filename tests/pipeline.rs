//! The pipeline on the CPU device: fidelity against Pillow goldens, order, labels, shuffling,
//! sharding, last-batch policies, bad input under both error policies, epochs and the no-GPU
//! error. Runs everywhere.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

mod common;

use common::TempDir;
use gpufeed::{
    DType, Device, EpochReport, Error, Gray16, Interpolation, ItemErrorKind, LastBatch, Layout,
    OnError, Pipeline, PipelineBuilder, ResizeMode, ShardBalance, Source,
};

/// mean 0, std 1/255: the f32 output is the u8 pixel value itself.
const IDENTITY_MEAN: [f32; 3] = [0.0; 3];
const IDENTITY_STD: [f32; 3] = [1.0 / 255.0; 3];

fn raw_pixels(builder: PipelineBuilder) -> Vec<(String, Vec<f32>)> {
    let mut pipeline = builder
        .mean_std(IDENTITY_MEAN, IDENTITY_STD)
        .dtype(DType::F32)
        .layout(Layout::Nhwc)
        .device(Device::Cpu)
        .build()
        .expect("build");
    let mut out = Vec::new();
    while let Some(batch) = pipeline.next_batch().expect("next_batch") {
        let values = batch.images().to_host().expect("host").to_f32_vec();
        let per_image = values.len() / batch.len();
        for (id, chunk) in batch.ids().iter().zip(values.chunks(per_image)) {
            out.push((id.clone(), chunk.to_vec()));
        }
    }
    out
}

fn ids(builder: PipelineBuilder) -> Vec<Vec<String>> {
    let mut pipeline = builder.device(Device::Cpu).build().expect("build");
    let mut out = Vec::new();
    while let Some(batch) = pipeline.next_batch().expect("next_batch") {
        out.push(batch.ids().to_vec());
    }
    out
}

struct Golden {
    input: PathBuf,
    golden: PathBuf,
    variant: String,
}

fn goldens() -> Vec<Golden> {
    let manifest = std::fs::read_to_string("tests/golden/MANIFEST.txt").expect("manifest");
    manifest
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            Golden {
                input: PathBuf::from(f[0]),
                golden: Path::new("tests/golden").join(f[1]),
                variant: f.get(3).unwrap_or(&"default").to_string(),
            }
        })
        .collect()
}

fn builder_for(variant: &str) -> PipelineBuilder {
    let b = Pipeline::builder();
    match variant {
        "default" => b,
        "bicubic" => b.interpolation(Interpolation::Bicubic),
        "nearest" => b.interpolation(Interpolation::Nearest),
        "lanczos" => b.interpolation(Interpolation::Lanczos),
        "r160c128" => b.resize(ResizeMode::center_crop(160, 128)),
        "stretch224" => b.resize(ResizeMode::stretch(224, 224)),
        "letterbox224" => b.resize(ResizeMode::letterbox(224, 224, 114)),
        "exif" => b.exif_orientation(true),
        "gray16-scale" => b.gray16(Gray16::Scale),
        other => panic!("unknown golden variant {other}"),
    }
}

/// Absolute differences, in levels, between our output and Pillow's for every golden of
/// `variant`, per file.
fn golden_differences(variant: &str) -> BTreeMap<String, Vec<f32>> {
    let cases: Vec<Golden> = goldens()
        .into_iter()
        .filter(|g| g.variant == variant)
        .collect();
    assert!(!cases.is_empty(), "no goldens for {variant}");
    let source = Source::paths(cases.iter().map(|c| c.input.clone()));
    let ours = raw_pixels(builder_for(variant).source(source).batch_size(7));
    assert_eq!(ours.len(), cases.len(), "every golden input decodes");
    let mut diffs = BTreeMap::new();
    for (case, (id, values)) in cases.iter().zip(ours) {
        assert_eq!(Path::new(&id), case.input);
        let golden = image::open(&case.golden).expect("golden png").into_rgb8();
        assert_eq!(golden.as_raw().len(), values.len(), "{id}: size");
        let d: Vec<f32> = golden
            .as_raw()
            .iter()
            .zip(&values)
            .map(|(&g, &v)| (g as f32 - v).abs())
            .collect();
        diffs.insert(id, d);
    }
    diffs
}

/// Pillow-made goldens of torchvision's Resize(256) + CenterCrop(224) on the bundled photos and
/// every fixture format (JPEG baseline, progressive, gray, CMYK and YCCK, 4:2:0, 4:4:4 and odd
/// sampling, PNG, WebP, BMP, GIF, TIFF, 16-bit): every byte equals Pillow's. The resampler is
/// Pillow's fixed-point arithmetic and libjpeg-turbo is Pillow's decoder, so nothing may differ.
#[test]
fn matches_pillow_torchvision_goldens() {
    assert_goldens_exact("default");
}

/// Other filters (nearest too), sizes, the stretch and letterbox modes and EXIF orientation (on
/// request; off by default like torchvision, whose default golden of the same file ignores the
/// tag): every byte equals Pillow's.
#[test]
fn matches_pillow_goldens_for_other_filters_sizes_and_modes() {
    for variant in [
        "bicubic",
        "nearest",
        "lanczos",
        "r160c128",
        "stretch224",
        "letterbox224",
        "exif",
        "gray16-scale",
    ] {
        assert_goldens_exact(variant);
    }
}

/// Every golden of `variant` equals the pipeline's output byte for byte.
fn assert_goldens_exact(variant: &str) {
    let diffs = golden_differences(variant);
    let mut failures = Vec::new();
    for (id, d) in &diffs {
        let differing = d.iter().filter(|&&v| v != 0.0).count();
        let max = d.iter().cloned().fold(0.0, f32::max);
        println!("{variant} {id}: {differing} bytes differ, max {max:.0}");
        if differing > 0 {
            failures.push(format!(
                "{id}: {differing} bytes differ (max {max:.0} levels)"
            ));
        }
    }
    assert!(!diffs.is_empty(), "{variant}: no goldens");
    assert!(failures.is_empty(), "{variant}: {failures:#?}");
}

#[test]
fn folder_listing_takes_image_extensions_in_any_case_and_descends_into_dirs_named_like_images() {
    let dir = temp_dir("listing");
    std::fs::copy("assets/rocket.jpg", dir.join("A.JPG")).expect("copy");
    std::fs::copy("assets/chelsea.png", dir.join("b.PnG")).expect("copy");
    std::fs::write(dir.join("c.txt"), "notes").expect("write");
    std::fs::create_dir_all(dir.join("d.jpg")).expect("dir");
    std::fs::copy("assets/camera.png", dir.join("d.jpg").join("inner.png")).expect("copy");
    let source = Source::directory(&dir).expect("list");
    let names: Vec<String> = (0..source.len())
        .map(|i| source.id(i).expect("id").to_string())
        .collect();
    assert_eq!(names.len(), 3, "{names:?}");
    assert!(names[0].ends_with("A.JPG") && names[1].ends_with("b.PnG"));
    assert!(names[2].ends_with("d.jpg/inner.png"));
    // A symbolic link back to the top does not make the listing loop.
    #[cfg(unix)]
    {
        std::os::unix::fs::symlink(&dir, dir.join("d.jpg").join("loop")).expect("symlink");
        let again = Source::directory(&dir).expect("list with a loop");
        assert_eq!(again.len(), 3);
    }
}

#[test]
fn letterbox_fits_the_whole_image_and_pads() {
    // chelsea.png is 451x300: at 224 wide it is 149 tall, centred with 37 rows of padding above.
    let out = raw_pixels(
        Pipeline::builder()
            .source(Source::paths(["assets/chelsea.png"]))
            .resize(ResizeMode::letterbox(224, 224, 114)),
    );
    let px = &out[0].1;
    let row = |y: usize| &px[y * 224 * 3..(y + 1) * 224 * 3];
    assert!(row(0).iter().all(|&v| v == 114.0));
    assert!(row(36).iter().all(|&v| v == 114.0));
    assert!(row(37).iter().any(|&v| v != 114.0));
    assert!(row(185).iter().any(|&v| v != 114.0));
    assert!(row(186).iter().all(|&v| v == 114.0));
    assert!(row(223).iter().all(|&v| v == 114.0));
}

fn temp_dir(name: &str) -> TempDir {
    TempDir::new(name)
}

/// An ImageFolder with three classes of copies of the bundled photos.
fn image_folder() -> TempDir {
    let root = temp_dir("folder");
    let photos = ["chelsea.png", "coffee.png", "rocket.jpg", "camera.png"];
    for (class, count) in [("cat", 2), ("b_mug", 3), ("a_rocket", 1)] {
        let dir = root
            .join(class)
            .join(if class == "b_mug" { "nested" } else { "" });
        std::fs::create_dir_all(&dir).expect("class dir");
        for i in 0..count {
            let src = photos[(i + class.len()) % photos.len()];
            std::fs::copy(
                Path::new("assets").join(src),
                dir.join(format!("{i}_{src}")),
            )
            .expect("copy");
        }
        std::fs::write(root.join(class).join("notes.txt"), "not an image").expect("txt");
    }
    root
}

#[test]
fn image_folder_labels_and_order() {
    let root = image_folder();
    let source = Source::image_folder(&root).expect("image folder");
    assert_eq!(
        source.class_names().expect("names"),
        ["a_rocket", "b_mug", "cat"]
    );
    assert_eq!(source.len(), 6, "text files are not images");
    let mut pipeline = Pipeline::builder()
        .source(source)
        .batch_size(4)
        .device(Device::Cpu)
        .build()
        .expect("build");
    let mut labels = Vec::new();
    let mut seen = Vec::new();
    while let Some(batch) = pipeline.next_batch().expect("batch") {
        labels.extend_from_slice(batch.labels().expect("labels"));
        seen.extend_from_slice(batch.ids());
    }
    assert_eq!(labels, [0, 1, 1, 1, 2, 2]);
    let mut sorted = seen.clone();
    sorted.sort();
    assert_eq!(seen, sorted, "deterministic sorted order");
    assert!(seen[1].contains("b_mug/nested/"));
    let _ = std::fs::remove_dir_all(root);
}

fn many_paths(n: usize) -> Vec<PathBuf> {
    let photos = [
        "assets/chelsea.png",
        "assets/rocket.jpg",
        "assets/camera.png",
    ];
    (0..n).map(|i| PathBuf::from(photos[i % 3])).collect()
}

fn indices(builder: PipelineBuilder) -> Vec<Vec<usize>> {
    let mut pipeline = builder
        .device(Device::Cpu)
        .resize(ResizeMode::stretch(8, 8))
        .build()
        .expect("build");
    let mut out = Vec::new();
    while let Some(batch) = pipeline.next_batch().expect("batch") {
        out.push(batch.indices().to_vec());
    }
    out
}

#[test]
fn each_image_exactly_once_in_order_with_partial_or_dropped_last_batch() {
    let kept = indices(
        Pipeline::builder()
            .source(Source::paths(many_paths(11)))
            .batch_size(4),
    );
    assert_eq!(
        kept,
        vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7], vec![8, 9, 10]]
    );
    let dropped = indices(
        Pipeline::builder()
            .source(Source::paths(many_paths(11)))
            .batch_size(4)
            .last_batch(LastBatch::Drop),
    );
    assert_eq!(dropped, vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7]]);
}

#[test]
fn shuffle_is_seeded_per_epoch_and_covers_everything() {
    let build = || {
        Pipeline::builder()
            .source(Source::paths(many_paths(20)))
            .batch_size(6)
            .shuffle(42)
            .resize(ResizeMode::stretch(8, 8))
            .device(Device::Cpu)
            .build()
            .expect("build")
    };
    let epoch = |p: &mut Pipeline| {
        let mut all = Vec::new();
        while let Some(b) = p.next_batch().expect("batch") {
            all.extend_from_slice(b.indices());
        }
        all
    };
    let mut a = build();
    let e0 = epoch(&mut a);
    assert_eq!(a.next_epoch().expect("next epoch"), 1);
    let e1 = epoch(&mut a);
    let mut b = build();
    assert_eq!(epoch(&mut b), e0, "same seed, same order");
    assert_ne!(e0, e1, "each epoch reshuffles");
    assert_ne!(e0, (0..20).collect::<Vec<_>>());
    for e in [&e0, &e1] {
        let mut s = e.clone();
        s.sort();
        assert_eq!(s, (0..20).collect::<Vec<_>>());
    }
}

#[test]
fn uneven_shards_are_disjoint_and_complete() {
    for world in [1, 2, 3, 4] {
        let mut all = Vec::new();
        for rank in 0..world {
            let part: Vec<usize> = indices(
                Pipeline::builder()
                    .source(Source::paths(many_paths(13)))
                    .batch_size(5)
                    .shuffle(3)
                    .shard(rank, world)
                    .shard_balance(ShardBalance::Uneven),
            )
            .concat();
            all.extend(part);
        }
        all.sort();
        assert_eq!(all, (0..13).collect::<Vec<_>>(), "world {world}");
    }
}

/// Tiny encoded images, `bad` of them not images at all, as in-memory bytes.
fn tiny_source(n: usize, bad: &[usize]) -> Source {
    let images = (0..n).map(|i| {
        let bytes = if bad.contains(&i) {
            b"not an image".to_vec()
        } else {
            let mut png = Vec::new();
            image::RgbImage::from_pixel(3, 2, image::Rgb([i as u8, 7, 9]))
                .write_to(&mut std::io::Cursor::new(&mut png), image::ImageFormat::Png)
                .expect("encode");
            png
        };
        (format!("image {i}"), bytes)
    });
    Source::bytes(images)
}

/// One rank's epoch: its batches ((source index, padded) per row), the skipped ids, the report.
type RankEpoch = (Vec<Vec<(usize, bool)>>, Vec<String>, EpochReport);

/// Every batch of one epoch of one rank: (source index, padded) per row, and the skipped ids.
fn rank_epoch(
    source: Source,
    rank: usize,
    world: usize,
    balance: ShardBalance,
    batch_size: usize,
) -> RankEpoch {
    let mut pipeline = Pipeline::builder()
        .source(source)
        .batch_size(batch_size)
        .shuffle(5)
        .shard(rank, world)
        .shard_balance(balance)
        .device(Device::Cpu)
        .resize(ResizeMode::stretch(4, 4))
        .build()
        .expect("build");
    let mut batches = Vec::new();
    let mut skipped = Vec::new();
    while let Some(batch) = pipeline.next_batch().expect("batch") {
        assert_eq!(batch.padded().len(), batch.len());
        batches.push(
            batch
                .indices()
                .iter()
                .copied()
                .zip(batch.padded().iter().copied())
                .collect(),
        );
        skipped.extend(batch.skipped().iter().map(|e| e.id.clone()));
    }
    (batches, skipped, pipeline.epoch_report().clone())
}

/// Equal shards: 3 ranks over 400 images at batch 64 yield the same batches (count and sizes),
/// and the union of their non-padded rows is the corpus, each image once; with bad images too
/// (they are replaced by the next, so the ranks stay equal), and when dropping to equal length.
#[test]
fn equal_shards_give_every_rank_the_same_batches() {
    let bad = [5, 77, 131, 250, 399];
    for (balance, bad) in [
        (ShardBalance::Pad, &[][..]),
        (ShardBalance::Pad, &bad[..]),
        (ShardBalance::Drop, &bad[..]),
    ] {
        let ranks: Vec<_> = (0..3)
            .map(|rank| rank_epoch(tiny_source(400, bad), rank, 3, balance, 64))
            .collect();
        let sizes: Vec<Vec<usize>> = ranks
            .iter()
            .map(|(batches, _, _)| batches.iter().map(Vec::len).collect())
            .collect();
        assert!(sizes.iter().all(|s| *s == sizes[0]), "{balance}: {sizes:?}");
        let expected = match balance {
            ShardBalance::Drop => vec![64, 64, 5],
            _ => vec![64, 64, 6],
        };
        assert_eq!(sizes[0], expected, "{balance}");
        let mut real: Vec<usize> = ranks
            .iter()
            .flat_map(|(batches, _, _)| batches.iter().flatten())
            .filter(|&&(_, padded)| !padded)
            .map(|&(index, _)| index)
            .collect();
        real.sort_unstable();
        let mut skipped: Vec<String> = ranks.iter().flat_map(|(_, s, _)| s.clone()).collect();
        skipped.sort();
        let mut want_skipped: Vec<String> = bad.iter().map(|i| format!("image {i}")).collect();
        want_skipped.sort();
        let want: Vec<usize> = (0..400).filter(|i| !bad.contains(i)).collect();
        match balance {
            ShardBalance::Drop => {
                // One image of the 400 is left out of the epoch (400 = 3 * 133 + 1).
                assert_eq!(real.len() + skipped.len(), 399, "{balance}");
                real.dedup();
                assert_eq!(real.len() + skipped.len(), 399, "each image once");
                want_skipped.retain(|s| skipped.contains(s));
            }
            _ => assert_eq!(real, want, "{balance}: each good image once"),
        }
        assert_eq!(skipped, want_skipped, "{balance}: bad images reported once");
        for (rank, (batches, skipped, report)) in ranks.iter().enumerate() {
            let rows: usize = batches.iter().map(Vec::len).sum();
            let padded = batches.iter().flatten().filter(|&&(_, p)| p).count();
            assert_eq!((report.images, report.padded), (rows, padded));
            // Every image of the rank's shard accounted for: delivered (not padding), skipped
            // or dropped.
            let shard = match balance {
                ShardBalance::Drop => 133,
                _ => [134, 133, 133][rank],
            };
            assert_eq!(
                rows - padded + skipped.len() + report.dropped,
                shard,
                "{balance} rank {rank}"
            );
        }
    }
}

/// A folder with good images and every kind of bad file, in a known order.
fn faulty_folder(test: &str) -> TempDir {
    let dir = temp_dir(test);
    let good = std::fs::read("assets/rocket.jpg").expect("rocket");
    std::fs::write(dir.join("a_good.jpg"), &good).expect("write");
    std::fs::write(dir.join("b_empty.jpg"), b"").expect("write");
    std::fs::write(
        dir.join("c_truncated.png"),
        &std::fs::read("assets/chelsea.png").expect("png")[..100],
    )
    .expect("write");
    std::fs::write(dir.join("d_text.jpg"), b"this is not an image at all").expect("write");
    std::fs::write(
        dir.join("e_good.png"),
        std::fs::read("assets/camera.png").expect("png"),
    )
    .expect("write");
    std::fs::write(dir.join("f_garbage.webp"), [0x52u8; 999]).expect("write");
    std::fs::write(dir.join("g_good.jpg"), &good).expect("write");
    dir
}

#[test]
fn bad_files_are_skipped_with_path_and_reason_and_nothing_is_lost() {
    let dir = faulty_folder("skip");
    let source = Source::directory(&dir).expect("list");
    assert_eq!(source.len(), 7);
    let mut paths: Vec<PathBuf> = (0..7)
        .map(|i| PathBuf::from(source.id(i).expect("id")))
        .collect();
    paths.push(dir.join("h_vanished.jpg"));
    // Unreadable: a path through a file, and a file without read permission (which root can
    // still read, so that one is only checked when the tests do not run as root).
    paths.push(dir.join("a_good.jpg").join("i_inside_a_file.jpg"));
    let locked = dir.join("j_locked.jpg");
    std::fs::write(&locked, std::fs::read("assets/rocket.jpg").expect("rocket")).expect("write");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o000)).expect("chmod");
    }
    let locked_is_readable = std::fs::read(&locked).is_ok();
    paths.push(locked);
    paths.push(dir.to_path_buf());
    let mut pipeline = Pipeline::builder()
        .source(Source::paths(paths))
        .batch_size(2)
        .resize(ResizeMode::stretch(16, 16))
        .device(Device::Cpu)
        .build()
        .expect("build");
    let mut good = Vec::new();
    let mut skipped = Vec::new();
    while let Some(batch) = pipeline.next_batch().expect("skip policy never fails") {
        assert!(!batch.is_empty());
        good.extend(batch.ids().iter().cloned());
        skipped.extend(batch.skipped().iter().cloned());
    }
    let report = pipeline.epoch_report();
    assert_eq!(report.images, 3 + usize::from(locked_is_readable));
    assert_eq!(
        report.images + report.skipped.len() + report.dropped,
        11,
        "nothing lost"
    );
    assert!(good[0].ends_with("a_good.jpg") && good[1].ends_with("e_good.png"));
    assert!(good[2].ends_with("g_good.jpg"));
    let reasons: Vec<String> = report.skipped.iter().map(|e| e.to_string()).collect();
    for (name, reason) in [
        ("b_empty.jpg", "empty"),
        ("c_truncated.png", "truncated"),
        ("d_text.jpg", "not a JPEG"),
        ("f_garbage.webp", "not a JPEG"),
        ("h_vanished.jpg", "no such file"),
        ("i_inside_a_file.jpg", "cannot read"),
    ] {
        assert!(
            reasons
                .iter()
                .any(|r| r.contains(name) && r.contains(reason)),
            "{name}: expected '{reason}' in {reasons:?}"
        );
    }
    assert!(
        report
            .skipped
            .last()
            .expect("dir")
            .to_string()
            .contains("is a directory"),
        "{reasons:?}"
    );
    if !locked_is_readable {
        assert!(
            reasons
                .iter()
                .any(|r| r.contains("j_locked.jpg") && r.contains("permission denied")),
            "{reasons:?}"
        );
    }
    assert!(skipped.len() <= report.skipped.len());
}

#[test]
fn fail_policy_stops_at_the_first_bad_file() {
    let dir = faulty_folder("fail");
    let mut pipeline = Pipeline::builder()
        .source(Source::directory(&dir).expect("list"))
        .batch_size(1)
        .resize(ResizeMode::stretch(16, 16))
        .on_error(OnError::Fail)
        .device(Device::Cpu)
        .build()
        .expect("build");
    let first = pipeline
        .next_batch()
        .expect("first is good")
        .expect("batch");
    assert!(first.ids()[0].ends_with("a_good.jpg"));
    match pipeline.next_batch() {
        Err(Error::Item(e)) => {
            assert!(e.id.ends_with("b_empty.jpg"), "{e}");
            assert_eq!(e.kind, ItemErrorKind::Decode("file is empty".into()));
        }
        other => panic!("expected the empty file's error, got {other:?}"),
    }
    assert!(pipeline.next_batch().expect("epoch over").is_none());
}

#[test]
fn in_memory_bytes_keep_their_ids() {
    let bytes = std::fs::read("assets/rocket.jpg").expect("rocket");
    let source = Source::bytes([
        ("first", bytes.clone()),
        ("broken", b"nope".to_vec()),
        ("second", bytes),
    ]);
    let got = ids(Pipeline::builder()
        .source(source)
        .batch_size(8)
        .resize(ResizeMode::stretch(8, 8)));
    assert_eq!(got, vec![vec!["first".to_string(), "second".to_string()]]);
}

#[test]
fn epochs_restart_without_rebuilding_and_abandon_cleanly() {
    let mut pipeline = Pipeline::builder()
        .source(Source::paths(many_paths(9)))
        .batch_size(2)
        .resize(ResizeMode::stretch(8, 8))
        .device(Device::Cpu)
        .build()
        .expect("build");
    // Abandon epoch 0 after one batch.
    assert!(pipeline.next_batch().expect("batch").is_some());
    assert_eq!(pipeline.next_epoch().expect("epoch 1"), 1);
    let mut n = 0;
    while let Some(b) = pipeline.next_batch().expect("batch") {
        assert_eq!(b.epoch(), 1);
        n += b.len();
    }
    assert_eq!(n, 9);
    assert!(pipeline.epoch_report().complete);
    // Dropping mid-epoch returns promptly.
    pipeline.next_epoch().expect("epoch 2");
    let _ = pipeline.next_batch().expect("batch");
    drop(pipeline);
}

#[test]
fn asking_for_a_gpu_without_one_is_a_clear_error() {
    let result = Pipeline::builder()
        .source(Source::directory("assets").expect("assets"))
        .device(Device::Cuda(0))
        .build();
    match gpufeed::cuda::probe() {
        Err(_) => match result {
            Err(e @ Error::CudaUnavailable(_)) => {
                let message = e.to_string();
                assert!(
                    message.contains("libcuda")
                        || message.contains("NVRTC")
                        || message.contains("device"),
                    "{message}"
                );
            }
            other => panic!("expected CudaUnavailable, got {other:?}"),
        },
        Ok(_) => assert!(result.is_ok()),
    }
}

/// With `cpu_fallback`, a GPU asked for where none can be used gives the CPU device's batches,
/// byte for byte, and says why; where a GPU can be used, it is used.
#[test]
fn a_gpu_asked_for_with_a_cpu_fallback_runs_on_the_cpu_without_one() {
    let images = |device: Device, fall_back: bool| {
        let mut pipeline = Pipeline::builder()
            .source(Source::directory("assets").expect("assets"))
            .batch_size(3)
            .resize(ResizeMode::center_crop(64, 56))
            .dtype(gpufeed::DType::F32)
            .device(device)
            .cpu_fallback(fall_back)
            .build()
            .expect("build");
        let why = pipeline.cpu_fallback().map(str::to_string);
        let on = pipeline.options().runtime.device;
        let mut bytes = Vec::new();
        while let Some(batch) = pipeline.next_batch().expect("batch") {
            bytes.extend(batch.images().to_host().expect("host").to_le_bytes());
        }
        (why, on, bytes)
    };
    let (why, on, bytes) = images(Device::Cuda(0), true);
    match gpufeed::cuda::probe() {
        Err(Error::CudaUnavailable(missing)) => {
            assert_eq!(why, Some(missing.to_string()), "the reason it fell back");
            assert_eq!(on, Device::Cpu);
            let (none, _, cpu) = images(Device::Cpu, false);
            assert_eq!(none, None);
            assert!(bytes == cpu, "the CPU device's bytes");
        }
        Err(other) => panic!("a probe fails with CudaUnavailable, not {other:?}"),
        Ok(_) => assert_eq!((why, on), (None, Device::Cuda(0))),
    }
}

#[test]
fn invalid_options_are_refused() {
    let build = |b: PipelineBuilder| {
        b.source(Source::paths(many_paths(1)))
            .device(Device::Cpu)
            .build()
    };
    let refused = |b: PipelineBuilder, name: &str| match build(b) {
        Err(Error::InvalidOption { option, .. }) => assert_eq!(option, name),
        other => panic!("{name}: expected an invalid option, got {other:?}"),
    };
    refused(Pipeline::builder().batch_size(0), "batch_size");
    refused(Pipeline::builder().prefetch(0), "prefetch");
    refused(Pipeline::builder().shard(2, 2), "shard");
    refused(
        Pipeline::builder().mean_std([0.5; 3], [0.0, 1.0, 1.0]),
        "mean/std",
    );
    refused(
        Pipeline::builder().resize(ResizeMode::stretch(0, 5)),
        "resize",
    );
    assert!(matches!(
        Pipeline::builder().build(),
        Err(Error::InvalidOption {
            option: "source",
            ..
        })
    ));
}

/// DCT-domain reduced decoding (opt-in) stays within the fidelity bar on a photo large enough to
/// use it (retina.jpg, 1411 x 1411: decoded at 1/2), and really takes the reduced path.
#[test]
fn dct_scaling_stays_within_the_fidelity_bar() {
    let golden = image::open("tests/golden/assets__retina.jpg.png")
        .expect("golden")
        .into_rgb8();
    let source = || Source::paths(["assets/retina.jpg"]);
    let reduced = raw_pixels(Pipeline::builder().source(source()).dct_scaling(true));
    let full = raw_pixels(Pipeline::builder().source(source()));
    assert_ne!(reduced[0].1, full[0].1, "the reduced decode was not used");
    let mut d: Vec<f32> = golden
        .as_raw()
        .iter()
        .zip(&reduced[0].1)
        .map(|(&g, &v)| (g as f32 - v).abs())
        .collect();
    let (mean, p999) = common::mean_and_p999(&mut d);
    println!("retina.jpg with DCT scaling: mean {mean:.3}, p99.9 {p999}");
    assert!(mean <= 0.5 && p999 <= 3.0, "mean {mean}, p99.9 {p999}");
}

/// Training transforms: the same seed gives the same bytes on 1 and 16 threads and at any batch
/// size; each batch carries what was drawn for each row, which is what the options draw for
/// that image; a new epoch draws anew.
#[test]
fn random_crops_depend_on_seed_epoch_and_index_alone() {
    let source = || Source::paths(many_paths(24));
    let run = |threads: usize, batch_size: usize, epochs: usize| {
        let mut pipeline = Pipeline::builder()
            .source(source())
            .imagenet_train(64, 11)
            .batch_size(batch_size)
            .threads(threads)
            .device(Device::Cpu)
            .dtype(DType::F32)
            .build()
            .expect("build");
        let mut out = Vec::new();
        for _ in 0..epochs {
            let mut epoch = Vec::new();
            for batch in &mut pipeline {
                let batch = batch.expect("batch");
                let crops = batch.crops().expect("random transforms draw").to_vec();
                assert_eq!(crops.len(), batch.len());
                let data = batch
                    .images()
                    .as_host()
                    .expect("host")
                    .as_slice::<f32>()
                    .expect("f32")
                    .to_vec();
                let per = data.len() / batch.len();
                for (row, (&index, crop)) in batch.indices().iter().zip(&crops).enumerate() {
                    epoch.push((index, *crop, data[row * per..(row + 1) * per].to_vec()));
                }
            }
            epoch.sort_by_key(|(index, _, _)| *index);
            out.push(epoch);
        }
        out
    };
    let one = run(1, 5, 2);
    let many = run(16, 8, 2);
    assert!(one == many, "the same bytes on 1 and 16 threads");
    assert_ne!(
        one[0].iter().map(|(_, c, _)| *c).collect::<Vec<_>>(),
        one[1].iter().map(|(_, c, _)| *c).collect::<Vec<_>>(),
        "a new epoch draws anew"
    );
    let resize = gpufeed::ResizeOptions::imagenet_train(64, 11);
    for (epoch, rows) in one.iter().enumerate() {
        for (index, crop, _) in rows {
            let path = &many_paths(24)[*index];
            let (w, h) = image::image_dimensions(path).expect("size");
            assert_eq!(
                Some(*crop),
                resize.draw(w, h, *index, epoch as u64),
                "{path:?}"
            );
        }
    }
    let flipped = one.iter().flatten().filter(|(_, c, _)| c.flipped).count();
    assert!((8..=40).contains(&flipped), "{flipped} of 48 flipped");
}

/// WebDataset tar shards, made by `tar` itself: every sample decoded, with its label, to the
/// same bytes as the same images read from files; a corrupted shard reports its damaged members
/// (naming the shard and the member) and loses none of its good samples.
#[test]
fn tar_shards_are_read_in_place_with_their_labels() {
    let dir = temp_dir("webdataset");
    let photos = ["rocket.jpg", "chelsea.png", "camera.png", "retina.jpg"];
    let staging = dir.join("members");
    std::fs::create_dir_all(staging.join("sub")).expect("mkdir");
    let mut members = Vec::new();
    for (i, photo) in photos.iter().enumerate() {
        let ext = photo.rsplit_once('.').map(|(_, e)| e).unwrap_or("jpg");
        let key = format!("sub/s{i:03}");
        std::fs::copy(
            format!("assets/{photo}"),
            staging.join(format!("{key}.{ext}")),
        )
        .expect("copy");
        std::fs::write(staging.join(format!("{key}.cls")), format!("{}\n", 10 + i)).expect("cls");
        members.push(format!("{key}.{ext}"));
        members.push(format!("{key}.cls"));
    }
    let shards = dir.join("shards");
    std::fs::create_dir_all(&shards).expect("mkdir");
    let tar = |name: &str, files: &[String]| {
        let status = std::process::Command::new("tar")
            .arg("-cf")
            .arg(shards.join(name))
            .arg("-C")
            .arg(&staging)
            .args(files)
            .status()
            .expect("tar");
        assert!(status.success());
    };
    tar("a-000.tar", &members[..4]);
    tar("a-001.tar", &members[4..]);
    let run = |source: Source| {
        let mut pipeline = Pipeline::builder()
            .source(source)
            .batch_size(3)
            .device(Device::Cpu)
            .build()
            .expect("build");
        let mut rows = Vec::new();
        let mut skipped = Vec::new();
        for batch in &mut pipeline {
            let batch = batch.expect("batch");
            let data = batch.images().as_host().expect("host").to_le_bytes();
            let per = data.len() / batch.len();
            for (i, id) in batch.ids().iter().enumerate() {
                let label = batch.labels().map(|l| l[i]);
                rows.push((id.clone(), label, data[i * per..(i + 1) * per].to_vec()));
            }
            skipped.extend(batch.skipped().iter().map(|e| e.to_string()));
        }
        (rows, skipped)
    };
    let (rows, skipped) = run(Source::webdataset(&shards).expect("shards"));
    assert!(skipped.is_empty(), "{skipped:?}");
    assert_eq!(rows.len(), 4);
    let files = Source::paths(members.iter().step_by(2).map(|m| staging.join(m)));
    let (from_files, _) = run(files);
    for (i, ((id, label, pixels), (_, _, want))) in rows.iter().zip(&from_files).enumerate() {
        assert!(id.ends_with(&format!(":{}", members[2 * i])), "{id}");
        assert!(id.contains("a-00"), "the id names the shard: {id}");
        assert_eq!(*label, Some(10 + i as u32));
        assert!(pixels == want, "{id}: the same pixels as from the file");
    }
    // Damage both shards: the first cut short inside its second image, the second with a bad
    // header for its first member (its label then forms a sample without an image).
    let path = shards.join("a-000.tar");
    let mut bytes = std::fs::read(&path).expect("read");
    let header = bytes
        .windows(12)
        .position(|w| w == b"sub/s001.png")
        .expect("the member's header");
    bytes.truncate(header + 512 + 1000);
    std::fs::write(&path, &bytes).expect("write");
    let path = shards.join("a-001.tar");
    let mut bytes = std::fs::read(&path).expect("read");
    bytes[10] ^= 0xFF;
    std::fs::write(&path, &bytes).expect("write");
    let (rows, skipped) = run(Source::webdataset(&shards).expect("shards"));
    let good: Vec<String> = rows.iter().map(|(id, _, _)| id.clone()).collect();
    assert_eq!(good.len(), 2, "{good:?}; skipped {skipped:?}");
    assert!(
        good[0].ends_with("a-000.tar:sub/s000.jpg") && good[1].ends_with("a-001.tar:sub/s003.jpg")
    );
    let has = |part: &str, reason: &str| {
        skipped
            .iter()
            .any(|s| s.contains(part) && s.contains(reason))
    };
    assert!(has("a-000.tar:sub/s001.png", "truncated"), "{skipped:?}");
    assert!(has("a-001.tar@0", "checksum"), "{skipped:?}");
    assert!(has("a-001.tar:sub/s002", "without an image"), "{skipped:?}");
    assert_eq!(skipped.len(), 3, "{skipped:?}");
}

/// `dct_scaling` on a JPEG its EXIF tag turns a quarter: the DCT reduction is chosen for the
/// image as it stands once turned. The fixture is stored 320x200 and stands 200x320; stretched
/// to 80x40, its 200 columns leave no twofold margin over 80 at half size, so it is decoded
/// whole and the output is the exact decode's. A reduction planned on the stored size (320 over
/// 80, 200 over 40) would halve it.
#[test]
fn dct_scaling_on_a_turned_jpeg_is_planned_for_the_turned_image() {
    let bytes = std::fs::read("tests/fixtures/exif_rotate6.jpg").expect("fixture");
    let resize = gpufeed::ResizeOptions::default().mode(ResizeMode::Stretch {
        height: 40,
        width: 80,
    });
    let prepare = |dct_scaling| {
        let decode = gpufeed::DecodeOptions::default()
            .exif_orientation(true)
            .dct_scaling(dct_scaling);
        let mut pixels = vec![0u8; resize.image_bytes().expect("size")];
        gpufeed::prepare_image(&bytes, &decode, &resize, &mut pixels).expect("prepare");
        pixels
    };
    let (exact, scaled) = (prepare(false), prepare(true));
    let differing = exact.iter().zip(&scaled).filter(|(a, b)| a != b).count();
    assert_eq!(differing, 0, "bytes that differ from the exact decode's");
}

/// An epoch whose last positions are all bad files lists them on its last batch (nothing is
/// only in the epoch's report), whatever the prefetch depth, with a full last batch or a partial
/// one dropped.
#[test]
fn an_epoch_ending_in_bad_files_lists_them_on_its_last_batch() {
    for (n, bad, last_batch) in [
        (10, &[6usize, 7, 8, 9][..], LastBatch::Keep),
        (9, &[7, 8][..], LastBatch::Drop),
    ] {
        for prefetch in 1..=4 {
            let mut pipeline = Pipeline::builder()
                .source(tiny_source(n, bad))
                .batch_size(3)
                .last_batch(last_batch)
                .prefetch(prefetch)
                .resize(ResizeMode::stretch(4, 4))
                .device(Device::Cpu)
                .build()
                .expect("build");
            let mut on_batches = Vec::new();
            let mut batches = 0;
            while let Some(batch) = pipeline.next_batch().expect("batch") {
                batches += 1;
                on_batches.extend(batch.skipped().iter().map(|e| e.index));
            }
            let report = pipeline.epoch_report();
            assert_eq!(batches, 2, "{last_batch:?}, prefetch {prefetch}");
            let in_report: Vec<usize> = report.skipped.iter().map(|e| e.index).collect();
            assert_eq!(in_report, bad, "{last_batch:?}, prefetch {prefetch}");
            assert_eq!(on_batches, bad, "{last_batch:?}, prefetch {prefetch}");
            assert_eq!(report.images + report.skipped.len() + report.dropped, n);
        }
    }
}

/// Every batch of one epoch on the CPU device, as u8 values (mean 0, std 1/255, f32 NHWC):
/// (values, augmentations, mix, soft labels, labels) per batch.
type AugmentedBatch = (
    Vec<f32>,
    Option<Vec<Vec<gpufeed::AugmentOp>>>,
    Option<gpufeed::Mix>,
    Option<Vec<f32>>,
    Option<Vec<u32>>,
);

fn augmented_epoch(builder: PipelineBuilder) -> Vec<AugmentedBatch> {
    let mut pipeline = builder
        .mean_std(IDENTITY_MEAN, IDENTITY_STD)
        .dtype(DType::F32)
        .layout(Layout::Nhwc)
        .device(Device::Cpu)
        .build()
        .expect("build");
    let mut out = Vec::new();
    while let Some(batch) = pipeline.next_batch().expect("next_batch") {
        out.push((
            batch.images().to_host().expect("host").to_f32_vec(),
            batch.augmentations().map(<[_]>::to_vec),
            batch.mix(),
            batch
                .soft_labels()
                .map(|t| t.to_host().expect("host").to_f32_vec()),
            batch.labels().map(<[_]>::to_vec),
        ));
    }
    out
}

#[test]
fn augmented_rows_are_the_plain_rows_with_their_calls_then_their_mixing() {
    let root = image_folder();
    let size = 48usize;
    let builder = |augment: Option<gpufeed::AugmentOptions>| {
        let b = Pipeline::builder()
            .source(Source::image_folder(&root).expect("folder"))
            .batch_size(4)
            .imagenet_train(size as u32, 5);
        match augment {
            Some(a) => b.augment_options(a),
            None => b,
        }
    };
    let per_image = gpufeed::AugmentOptions::default()
        .policy(gpufeed::Augment::RandAugment {
            num_ops: 4,
            magnitude: 20,
        })
        .color_jitter(gpufeed::ColorJitter {
            brightness: 0.4,
            contrast: 0.4,
            saturation: 0.4,
            hue: 0.2,
        })
        .random_erasing(Some(gpufeed::RandomErasing::new(0.5)));
    let plain = augmented_epoch(builder(None));
    assert!(plain.iter().all(|b| b.1.is_none() && b.2.is_none()));
    let image = size * size * 3;
    for mixing in [false, true] {
        let options = if mixing {
            per_image.mixup(Some(0.2)).cutmix(Some(1.0))
        } else {
            per_image
        };
        let augmented = augmented_epoch(builder(Some(options)));
        assert_eq!(augmented.len(), plain.len());
        let mut calls = 0;
        for (p, a) in plain.iter().zip(&augmented) {
            let rows = a.1.as_ref().expect("augmentations");
            let n = rows.len();
            // Each row: the plain row with its calls applied.
            let mut expect: Vec<u8> = p.0.iter().map(|&v| v as u8).collect();
            for (row, ops) in rows.iter().enumerate() {
                calls += ops.len();
                gpufeed::augment::apply_ops(
                    ops,
                    &mut expect[row * image..(row + 1) * image],
                    size,
                    size,
                )
                .expect("apply");
            }
            let own = |row: usize, k: usize| f32::from(expect[row * image + k]);
            for row in 0..n {
                let partner = gpufeed::Mix::partner(row, n);
                for k in 0..image {
                    let got = a.0[row * image + k];
                    let want = match a.2 {
                        None => own(row, k),
                        Some(gpufeed::Mix::MixUp { lam }) => {
                            own(partner, k) * (1.0 - lam) as f32 + own(row, k) * lam as f32
                        }
                        Some(gpufeed::Mix::CutMix { x1, y1, x2, y2, .. }) => {
                            let (x, y) = (((k / 3) % size) as u32, ((k / 3) / size) as u32);
                            if x >= x1 && x < x2 && y >= y1 && y < y2 {
                                own(partner, k)
                            } else {
                                own(row, k)
                            }
                        }
                        Some(other) => panic!("a mix this test does not know: {other:?}"),
                    };
                    assert_eq!(
                        got, want,
                        "mixing {mixing}: row {row} element {k} ({:?})",
                        a.2
                    );
                }
            }
            // Soft labels: each row's one-hot times lam plus its partner's times 1 - lam.
            match (mixing, &a.3, &a.4, a.2) {
                (true, Some(soft), Some(labels), Some(mix)) => {
                    assert_eq!(soft.len(), n * 3, "three classes");
                    for row in 0..n {
                        let s = &soft[row * 3..(row + 1) * 3];
                        assert!((s.iter().sum::<f32>() - 1.0).abs() < 1e-6);
                        let (own, other) = (
                            labels[row] as usize,
                            labels[gpufeed::Mix::partner(row, n)] as usize,
                        );
                        if own != other {
                            assert_eq!(s[own], mix.lam() as f32);
                            assert_eq!(s[other], (1.0 - mix.lam()) as f32);
                        }
                    }
                }
                (false, None, _, None) => {}
                other => panic!(
                    "mixing {mixing}: {:?}",
                    (other.0, other.1.is_some(), other.3)
                ),
            }
        }
        assert!(calls > plain.len() * 4, "{calls} calls drawn");
    }
    let _ = std::fs::remove_dir_all(root);
}

#[test]
fn augmentations_give_the_same_bytes_on_any_thread_count() {
    let root = image_folder();
    let run = |threads: usize, seed: u64| {
        augmented_epoch(
            Pipeline::builder()
                .source(Source::image_folder(&root).expect("folder"))
                .batch_size(3)
                .threads(threads)
                .recipe(gpufeed::Recipe::TorchvisionImagenet, 64, seed)
                .color_jitter(0.4, 0.4, 0.4, 0.1),
        )
        .into_iter()
        .map(|b| (b.0, b.3))
        .collect::<Vec<_>>()
    };
    let one = run(1, 3);
    assert!(one == run(16, 3), "1 and 16 threads differ");
    assert!(one != run(2, 4), "another seed, other bytes");
    let _ = std::fs::remove_dir_all(root);
}

#[test]
fn augmentation_mistakes_are_refused_by_name() {
    let name = |b: PipelineBuilder| match b.device(Device::Cpu).build() {
        Err(Error::InvalidOption { option, .. }) => option,
        other => panic!("expected an invalid option, got {:?}", other.map(|_| ())),
    };
    let assets = || Pipeline::builder().source(Source::directory("assets").expect("assets"));
    assert_eq!(
        name(assets().mixup(0.2)),
        "mixup/cutmix",
        "no labels to mix"
    );
    assert_eq!(
        name(assets().augment(gpufeed::Augment::RandAugment {
            num_ops: 2,
            magnitude: 31
        })),
        "augment"
    );
    assert_eq!(
        name(assets().color_jitter(0.1, 0.1, 0.1, 0.6)),
        "color_jitter"
    );
    assert_eq!(name(assets().random_erasing(1.5)), "random_erasing");
    assert_eq!(name(assets().cutmix(0.0)), "cutmix");
    let paths = Source::paths(vec![PathBuf::from("assets/chelsea.png")]).with_labels(vec![0]);
    assert_eq!(
        name(
            Pipeline::builder()
                .source(paths.expect("labels"))
                .mixup(1.0)
        ),
        "num_classes",
        "labels but no class names"
    );
    assert_eq!(
        "rand-augment:3:7".parse::<gpufeed::Augment>(),
        Ok(gpufeed::Augment::RandAugment {
            num_ops: 3,
            magnitude: 7
        })
    );
}
