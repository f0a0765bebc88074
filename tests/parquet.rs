//! Parquet sources against files written by `datasets` and by pyarrow
//! (tests/parquet_fixtures.py): the same rows, bytes, labels, pixels and order as the same images
//! in a folder; every row exactly once over 3 ranks; an interrupted run resumed row for row; bad
//! data skipped with its file and row, or refused before the run. The fixtures need Python with
//! pyarrow, datasets, Pillow and NumPy (`GPUFEED_PYTHON`, default `python3`); without them the
//! tests say why and pass, unless `GPUFEED_REQUIRE_PYARROW=1`.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

mod common;

use gpufeed::{
    Batch, DType, Device, ExtraValue, Layout, ParquetOptions, Pipeline, PipelineBuilder,
    PipelineState, ResizeMode, ShardBalance, Source,
};

/// The fixtures' folder, written once per run; `None` (said on the terminal) without Python's
/// packages.
fn fixtures(test: &str) -> Option<&'static Path> {
    static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
    let dir = DIR.get_or_init(|| {
        let python = std::env::var("GPUFEED_PYTHON").unwrap_or_else(|_| "python3".into());
        let dir = std::env::temp_dir().join(format!("gpufeed-parquet-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let script = common::repo_path("tests/parquet_fixtures.py");
        let out = std::process::Command::new(&python)
            .arg(&script)
            .arg(&dir)
            .output();
        match out {
            Ok(out) if out.status.success() => Some(dir),
            Ok(out) => {
                let why = String::from_utf8_lossy(&out.stderr).into_owned();
                let why = why.lines().last().unwrap_or("").to_string();
                assert!(
                    std::env::var("GPUFEED_REQUIRE_PYARROW").as_deref() != Ok("1"),
                    "the fixtures could not be written: {why}"
                );
                eprintln!("skipped: {python} could not write the fixtures: {why}");
                None
            }
            Err(e) => {
                assert!(
                    std::env::var("GPUFEED_REQUIRE_PYARROW").as_deref() != Ok("1"),
                    "{python}: {e}"
                );
                eprintln!("skipped: no {python}: {e}");
                None
            }
        }
    });
    if dir.is_none() {
        common::say_skipped(test, "no Python with pyarrow and datasets (GPUFEED_PYTHON)");
    }
    dir.as_deref()
}

/// The reference: the same images as files, in sorted order, with their labels.
fn folder(dir: &Path) -> (Vec<PathBuf>, Vec<u32>) {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir.join("folder"))
        .expect("folder")
        .map(|e| e.expect("entry").path())
        .collect();
    files.sort();
    let labels = std::fs::read_to_string(dir.join("labels.txt"))
        .expect("labels")
        .lines()
        .map(|l| l.parse().expect("label"))
        .collect();
    (files, labels)
}

fn hf_options() -> ParquetOptions {
    ParquetOptions::default().extra_columns(["caption"])
}

fn plain_options() -> ParquetOptions {
    ParquetOptions::default()
        .image_column("jpeg")
        .label_column(Some("cls".into()))
        .extra_columns(["id"])
}

/// Every row's pixels (u8 values as f32, NHWC), label and id, batch by batch.
fn rows(builder: PipelineBuilder) -> Vec<(Vec<f32>, Option<u32>, usize)> {
    let mut pipeline = builder
        .mean_std([0.0; 3], [1.0 / 255.0; 3])
        .dtype(DType::F32)
        .layout(Layout::Nhwc)
        .device(Device::Cpu)
        .resize(ResizeMode::stretch(16, 16))
        .batch_size(5)
        .build()
        .expect("build");
    let mut out = Vec::new();
    while let Some(batch) = pipeline.next_batch().expect("batch") {
        let values = batch.images().to_host().expect("host").to_f32_vec();
        let per = values.len() / batch.len();
        for (k, chunk) in values.chunks(per).enumerate() {
            let label = batch.labels().map(|l| l[k]);
            out.push((chunk.to_vec(), label, batch.indices()[k]));
        }
    }
    out
}

#[test]
fn datasets_files_read_as_the_same_images_in_a_folder() {
    let Some(dir) = fixtures("datasets_files_read_as_the_same_images_in_a_folder") else {
        return;
    };
    let (files, labels) = folder(dir);
    let source = Source::parquet([dir.join("hf")], &hf_options()).expect("hf");
    assert_eq!(source.len(), files.len());
    assert_eq!(
        source.class_names(),
        Some(&["cat".to_string(), "dog".into(), "bird".into()][..]),
        "the ClassLabel names datasets wrote"
    );
    let extras = source.extras().expect("extras").clone();
    assert_eq!(extras.names, ["caption"]);
    for (i, path) in files.iter().enumerate() {
        let bytes = source.read(i).expect("read");
        assert_eq!(bytes, std::fs::read(path).expect("file"), "row {i}");
        let names = ["cat", "dog", "bird"];
        assert_eq!(
            extras.rows[i],
            [ExtraValue::Text(format!(
                "caption {i}: a {}",
                names[labels[i] as usize]
            ))]
        );
    }
    let id = source.id(13).expect("id");
    assert!(id.ends_with("train-00001-of-00002.parquet:1"), "{id}");
    let reference = Source::paths(files.clone())
        .with_labels(labels.clone())
        .expect("labels");
    let from_parquet = rows(Pipeline::builder().source(source));
    let from_folder = rows(Pipeline::builder().source(reference));
    assert_eq!(from_parquet.len(), files.len());
    assert!(from_parquet == from_folder, "pixels, labels and order");
    // The test split: its own file.
    let test = Source::parquet([dir.join("hf")], &hf_options().split("test")).expect("test");
    assert_eq!(test.len(), 5);
    let err = Source::parquet([dir.join("hf")], &hf_options().split("valid"))
        .expect_err("no such split")
        .to_string();
    assert!(err.contains("splits found: test, train"), "{err}");
}

#[test]
fn pyarrow_binary_with_text_labels_reads_as_the_folder() {
    let Some(dir) = fixtures("pyarrow_binary_with_text_labels_reads_as_the_folder") else {
        return;
    };
    let (files, labels) = folder(dir);
    let glob = dir.join("plain").join("part-*.parquet");
    let source = Source::parquet([glob], &plain_options()).expect("plain");
    // Text labels are numbered in sorted order: bird, cat, dog.
    let names = ["bird".to_string(), "cat".into(), "dog".into()];
    assert_eq!(source.class_names(), Some(&names[..]));
    let remap = [1u32, 2, 0]; // cat, dog, bird -> sorted
    let expected: Vec<u32> = labels.iter().map(|&l| remap[l as usize]).collect();
    let extras = source.extras().expect("extras").clone();
    for (i, path) in files.iter().enumerate() {
        assert_eq!(
            source.read(i).expect("read"),
            std::fs::read(path).expect("file")
        );
        assert_eq!(extras.rows[i], [ExtraValue::Int(1000 + i as i64)]);
    }
    let reference = Source::paths(files).with_labels(expected).expect("labels");
    assert!(
        rows(Pipeline::builder().source(source)) == rows(Pipeline::builder().source(reference))
    );
    // A folder of .parquet files reads as its sorted files.
    let same = Source::parquet([dir.join("plain")], &plain_options()).expect("folder");
    assert_eq!(same.len(), 23);
    assert_eq!(
        same.id(22),
        Source::parquet([dir.join("plain/part-1.parquet")], &plain_options())
            .expect("file")
            .id(10)
    );
}

/// Source indices of one rank's epoch, padding left out.
fn rank_indices(source: Source, rank: usize, world: usize, epoch: u64) -> Vec<usize> {
    let mut pipeline = Pipeline::builder()
        .source(source)
        .batch_size(4)
        .shuffle(11)
        .shard(rank, world)
        .shard_balance(ShardBalance::Pad)
        .device(Device::Cpu)
        .resize(ResizeMode::stretch(8, 8))
        .build()
        .expect("build");
    for _ in 0..epoch {
        while pipeline.next_batch().expect("batch").is_some() {}
        pipeline.next_epoch().expect("next epoch");
    }
    let mut out = Vec::new();
    while let Some(batch) = pipeline.next_batch().expect("batch") {
        for (k, &index) in batch.indices().iter().enumerate() {
            if !batch.padded()[k] {
                out.push(index);
            }
        }
    }
    out
}

#[test]
fn three_ranks_read_every_row_once_in_row_group_runs() {
    let Some(dir) = fixtures("three_ranks_read_every_row_once_in_row_group_runs") else {
        return;
    };
    let source = Source::parquet([dir.join("hf")], &hf_options()).expect("hf");
    for epoch in [0, 1] {
        let mut all = Vec::new();
        let mut orders = Vec::new();
        for rank in 0..3 {
            let part = rank_indices(source.clone(), rank, 3, epoch);
            all.extend(part.iter().copied());
            orders.push(part);
        }
        all.sort();
        assert_eq!(all, (0..23).collect::<Vec<_>>(), "epoch {epoch}");
        // Shuffled, and each rank's rows come from a few row groups (of 4 rows), not all.
        assert_ne!(orders.concat(), (0..23).collect::<Vec<_>>());
    }
    let a = rank_indices(source.clone(), 0, 3, 0);
    let b = rank_indices(source.clone(), 0, 3, 1);
    assert_ne!(a, b, "each epoch its own order");
}

/// One batch's rows as the tests compare them.
#[derive(Debug, PartialEq)]
struct Seen {
    epoch: u64,
    ids: Vec<String>,
    labels: Option<Vec<u32>>,
    skipped: Vec<String>,
    bytes: Vec<u8>,
}

fn seen(batch: &Batch) -> Seen {
    Seen {
        epoch: batch.epoch(),
        ids: batch.ids().to_vec(),
        labels: batch.labels().map(<[u32]>::to_vec),
        skipped: batch.skipped().iter().map(|e| e.to_string()).collect(),
        bytes: batch.images().to_host().expect("host").to_le_bytes(),
    }
}

fn take(pipeline: &mut Pipeline, epochs: u64, stop: Option<usize>) -> Vec<Seen> {
    let mut out = Vec::new();
    for _ in pipeline.epoch()..epochs {
        for batch in &mut *pipeline {
            out.push(seen(&batch.expect("batch")));
            if Some(out.len()) == stop {
                return out;
            }
        }
    }
    out
}

#[test]
fn a_stopped_run_resumes_row_for_row() {
    let Some(dir) = fixtures("a_stopped_run_resumes_row_for_row") else {
        return;
    };
    let builder = || {
        let source = Source::parquet([dir.join("hf")], &hf_options()).expect("hf");
        Pipeline::builder()
            .source(source)
            .imagenet_train(16, 3)
            .batch_size(4)
            .device(Device::Cpu)
    };
    let whole = take(&mut builder().build().expect("build"), 2, None);
    for stop in [1, 4, 7] {
        let mut first = builder().build().expect("build");
        let mut got = take(&mut first, 2, Some(stop));
        let state = PipelineState::from_json(&first.state().to_json()).expect("state");
        drop(first);
        let mut second = builder().threads(2).resume(state).build().expect("resume");
        got.extend(take(&mut second, 2, None));
        assert!(got == whole, "stopped after {stop} batches");
    }
}

#[test]
fn bad_rows_are_skipped_with_their_file_and_row() {
    let Some(dir) = fixtures("bad_rows_are_skipped_with_their_file_and_row") else {
        return;
    };
    let bad = dir.join("bad");
    let source = Source::parquet(
        [bad.join("nulls.parquet"), bad.join("checksum.parquet")],
        &ParquetOptions::default(),
    )
    .expect("bad");
    assert_eq!(source.len(), 16);
    let mut pipeline = Pipeline::builder()
        .source(source)
        .batch_size(4)
        .device(Device::Cpu)
        .resize(ResizeMode::stretch(8, 8))
        .build()
        .expect("build");
    let mut delivered = 0;
    while let Some(batch) = pipeline.next_batch().expect("batch") {
        delivered += batch.len();
    }
    let report = pipeline.epoch_report();
    let skipped: Vec<String> = report.skipped.iter().map(|e| e.to_string()).collect();
    assert_eq!(skipped.len(), 6, "{skipped:#?}");
    assert_eq!(delivered, 10);
    let nulls = bad.join("nulls.parquet").display().to_string();
    let checksum = bad.join("checksum.parquet").display().to_string();
    assert!(skipped[0].contains(&format!("{nulls}:1")) && skipped[0].contains("null"));
    assert!(skipped[1].contains(&format!("{nulls}:2")));
    for (k, row) in (4..8).enumerate() {
        let s = &skipped[2 + k];
        assert!(s.contains(&format!("{checksum}:{row}")), "{s}");
        assert!(s.contains("row group 1 (rows 4..8)"), "{s}");
    }
}

#[test]
fn missing_or_differing_columns_are_refused_before_the_run() {
    let Some(dir) = fixtures("missing_or_differing_columns_are_refused_before_the_run") else {
        return;
    };
    let bad = dir.join("bad");
    let labelled = ParquetOptions::default().label_column(Some("label".into()));
    let err = Source::parquet(
        [bad.join("nulls.parquet"), bad.join("no-label.parquet")],
        &labelled,
    )
    .expect_err("no label")
    .to_string();
    assert!(
        err.contains("no-label.parquet") && err.contains("no column \"label\""),
        "{err}"
    );
    let err = Source::parquet(
        [bad.join("nulls.parquet"), bad.join("text-label.parquet")],
        &ParquetOptions::default(),
    )
    .expect_err("differing")
    .to_string();
    assert!(
        err.contains("text-label.parquet") && err.contains("differ"),
        "{err}"
    );
    let err = Source::parquet([dir.join("folder").join("img_000.jpg")], &labelled)
        .expect_err("not parquet")
        .to_string();
    assert!(
        err.contains("img_000.jpg") && err.contains("Parquet"),
        "{err}"
    );
}

/// The same files in a real S3 server (SeaweedFS's, see `crates/s3-server`), read by ranges:
/// the same rows, bytes, labels, class names, extras and pixels as on disk, only the split's
/// files, and only footers and needed column chunks read.
#[cfg(feature = "object-store")]
#[test]
fn files_in_object_storage_read_as_on_disk() {
    use gpufeed::RemoteOptions;
    let test = "files_in_object_storage_read_as_on_disk";
    let Some(dir) = fixtures(test) else {
        return;
    };
    let Some(server) = s3_server::S3Server::for_test(test) else {
        return;
    };
    let mut objects = Vec::new();
    for entry in std::fs::read_dir(dir.join("hf/data")).expect("hf") {
        let path = entry.expect("entry").path();
        let name = path
            .file_name()
            .expect("name")
            .to_string_lossy()
            .to_string();
        objects.push((
            format!("pq/hf/data/{name}"),
            std::fs::read(&path).expect("read"),
        ));
    }
    server.put_all(objects).expect("upload");
    let mut remote = RemoteOptions::default();
    for (key, value) in server.store_options() {
        remote = remote.store_option(key, value);
    }
    let local = Source::parquet([dir.join("hf")], &hf_options()).expect("local");
    let url = server.url("pq/hf/");
    let source = Source::parquet_url(&url, &hf_options(), &remote).expect("remote");
    assert_eq!(source.len(), local.len(), "the train split's files only");
    assert_eq!(source.class_names(), local.class_names());
    assert_eq!(source.extras(), local.extras());
    for i in 0..source.len() {
        assert_eq!(
            source.read(i).expect("remote row"),
            local.read(i).expect("local row")
        );
    }
    assert!(
        source.id(13).expect("id").starts_with(&url),
        "{:?}",
        source.id(13)
    );
    assert!(
        rows(Pipeline::builder().source(source)) == rows(Pipeline::builder().source(local)),
        "pixels, labels and order"
    );
    let test_split = Source::parquet_url(&url, &hf_options().split("test"), &remote).expect("test");
    assert_eq!(test_split.len(), 5);
    let one = server.url("pq/hf/data/train-00001-of-00002.parquet");
    assert_eq!(
        Source::parquet_url(&one, &hf_options(), &remote)
            .expect("one object")
            .len(),
        11
    );
}
