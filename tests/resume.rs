//! Saving a pipeline's state and resuming from it, on the CPU device: a run stopped after any
//! number of batches and resumed gives, row for row, the bytes, ids, labels, padding flags, crop
//! draws and skipped files of the uninterrupted run (folders, ImageFolder, tar shards, equal and
//! uneven shards, bad files); an epoch stopped on two ranks and resumed on three delivers every
//! image once; a state that does not fit is refused, naming what differs; resuming near the end
//! of a million-image epoch does not replay it.

use std::path::PathBuf;
use std::time::{Duration, Instant};

mod common;

use common::{generated_image_folder, repo_path, TempDir};
use gpufeed::{
    Batch, CropDraw, Device, Error, LastBatch, Pipeline, PipelineBuilder, PipelineState,
    ResizeMode, ResumeError, ShardBalance, Source,
};

/// One batch as its consumer saw it.
#[derive(Debug, Clone, PartialEq)]
struct Seen {
    epoch: u64,
    ids: Vec<String>,
    labels: Option<Vec<u32>>,
    padded: Vec<bool>,
    crops: Option<Vec<CropDraw>>,
    skipped: Vec<String>,
    bytes: Vec<u8>,
}

impl Seen {
    fn of(batch: &Batch) -> Seen {
        Seen {
            epoch: batch.epoch(),
            ids: batch.ids().to_vec(),
            labels: batch.labels().map(<[u32]>::to_vec),
            padded: batch.padded().to_vec(),
            crops: batch.crops().map(<[CropDraw]>::to_vec),
            skipped: batch.skipped().iter().map(|e| e.to_string()).collect(),
            bytes: batch.images().to_host().expect("host").to_le_bytes(),
        }
    }
}

/// Runs `pipeline` until epoch `epochs` would begin, or until `stop` batches were handed out, as
/// a training loop does (`for epoch in pipeline.epoch()..epochs`).
fn take(pipeline: &mut Pipeline, epochs: u64, stop: Option<usize>) -> Vec<Seen> {
    let mut seen = Vec::new();
    for _ in pipeline.epoch()..epochs {
        for batch in &mut *pipeline {
            seen.push(Seen::of(&batch.expect("batch")));
            if Some(seen.len()) == stop {
                return seen;
            }
        }
    }
    seen
}

/// Stops a run after each of `stops` batches, saves its state as text, resumes a new pipeline
/// from it (with other threads and prefetch depths), and checks that the two runs together are,
/// batch for batch, the uninterrupted run of `epochs` epochs.
fn resumes_row_for_row(
    what: &str,
    builder: impl Fn() -> PipelineBuilder,
    epochs: u64,
    stops: &[usize],
) {
    let whole = take(&mut builder().build().expect("build"), epochs, None);
    assert!(
        whole.len() > *stops.iter().max().unwrap_or(&0),
        "{what}: {} batches",
        whole.len()
    );
    assert!(
        whole.iter().any(|s| !s.skipped.is_empty()),
        "{what}: the corpus has bad files"
    );
    for &stop in stops {
        let mut first = builder().threads(1).prefetch(3).build().expect("build");
        let mut seen = take(&mut first, epochs, Some(stop));
        let text = first.state().to_json();
        drop(first);
        let state = PipelineState::from_json(&text).expect("the state reads back");
        let mut second = builder()
            .threads(2)
            .prefetch(1)
            .resume(state)
            .build()
            .expect("resume");
        seen.extend(take(&mut second, epochs, None));
        assert_eq!(
            seen.len(),
            whole.len(),
            "{what}: stopped after {stop}: batches"
        );
        for (k, (resumed, uninterrupted)) in seen.iter().zip(&whole).enumerate() {
            assert!(
                resumed == uninterrupted,
                "{what}: stopped after {stop}, batch {k} differs:\n{:?}\n{:?}",
                (
                    &resumed.epoch,
                    &resumed.ids,
                    &resumed.padded,
                    &resumed.skipped,
                    &resumed.crops
                ),
                (
                    &uninterrupted.epoch,
                    &uninterrupted.ids,
                    &uninterrupted.padded,
                    &uninterrupted.skipped,
                    &uninterrupted.crops
                )
            );
        }
    }
}

/// Training transforms on the CPU device with small outputs.
fn training(source: impl Fn() -> Source) -> impl Fn() -> PipelineBuilder {
    move || {
        Pipeline::builder()
            .source(source())
            .imagenet_train(24, 11)
            .batch_size(4)
            .device(Device::Cpu)
    }
}

#[test]
fn an_image_folder_stopped_anywhere_resumes_row_for_row() {
    let dir = TempDir::new("resume-folder");
    generated_image_folder(&dir, 22, 3);
    // 25 files, 3 bad: 6 batches an epoch. Stops: mid-epoch, at the end of the first epoch's
    // last batch, and in the second epoch.
    resumes_row_for_row(
        "ImageFolder",
        training(|| Source::image_folder(dir.path()).expect("list")),
        2,
        &[1, 3, 6, 7, 10],
    );
}

#[test]
fn tar_shards_stopped_anywhere_resume_row_for_row() {
    let dir = TempDir::new("resume-tar");
    let files = dir.join("files");
    generated_image_folder(&files, 18, 2);
    // Members by sample key: `NNNN.jpg` and its `NNNN.cls` label.
    let mut members = Vec::new();
    for class in 0..3 {
        let folder = files.join(format!("class_{class}"));
        for entry in std::fs::read_dir(&folder).expect("list") {
            let name = entry
                .expect("entry")
                .file_name()
                .into_string()
                .expect("name");
            let key = name.split('.').next().unwrap_or_default().to_string();
            std::fs::rename(folder.join(&name), files.join(&name)).expect("move");
            std::fs::write(files.join(format!("{key}.cls")), format!("{class}\n")).expect("cls");
            members.push(key);
        }
    }
    members.sort();
    let shards = dir.join("shards");
    std::fs::create_dir_all(&shards).expect("mkdir");
    for (n, part) in members.chunks(7).enumerate() {
        let names: Vec<String> = part
            .iter()
            .flat_map(|key| [format!("{key}.jpg"), format!("{key}.cls")])
            .collect();
        let status = std::process::Command::new("tar")
            .arg("-cf")
            .arg(shards.join(format!("part-{n:03}.tar")))
            .arg("-C")
            .arg(&files)
            .args(&names)
            .status()
            .expect("tar");
        assert!(status.success());
    }
    resumes_row_for_row(
        "tar shards",
        training(|| Source::webdataset(&shards).expect("shards")),
        2,
        &[2, 5, 8],
    );
}

#[test]
fn equal_shards_resume_row_for_row_on_each_rank() {
    let dir = TempDir::new("resume-ranks");
    generated_image_folder(&dir, 20, 3);
    for (balance, last) in [
        (ShardBalance::Pad, LastBatch::Keep),
        (ShardBalance::Drop, LastBatch::Drop),
        (ShardBalance::Uneven, LastBatch::Keep),
    ] {
        for rank in 0..2 {
            let builder = || {
                training(|| Source::directory(dir.path()).expect("list"))()
                    .batch_size(3)
                    .shard(rank, 2)
                    .shard_balance(balance)
                    .last_batch(last)
            };
            resumes_row_for_row(&format!("{balance} rank {rank}/2"), builder, 2, &[1, 3, 5]);
        }
    }
}

/// `n` tiny in-memory PNGs, 6x4 pixels, image `i` with the id `image i`.
fn tiny_source(n: usize) -> Source {
    Source::bytes((0..n).map(|i| {
        let mut png = Vec::new();
        image::RgbImage::from_pixel(6, 4, image::Rgb([i as u8, (i / 256) as u8, 9]))
            .write_to(&mut std::io::Cursor::new(&mut png), image::ImageFormat::Png)
            .expect("encode");
        (format!("image {i}"), png)
    }))
}

fn shard_of(n: usize, rank: usize, world: usize, balance: ShardBalance) -> PipelineBuilder {
    Pipeline::builder()
        .source(tiny_source(n))
        .batch_size(4)
        .shuffle(5)
        .shard(rank, world)
        .shard_balance(balance)
        .resize(ResizeMode::stretch(4, 4))
        .device(Device::Cpu)
}

/// An epoch stopped on two ranks after the same step and resumed on three: the three ranks share
/// what the two had not delivered, so the epoch holds every image once (with equal shards the
/// new ranks pad their parts to equal length, with flagged rows, as usual), and the next epoch
/// is the three ranks' own.
#[test]
fn two_ranks_stopped_mid_epoch_resume_as_three_with_every_image_once() {
    const N: usize = 61;
    for balance in [ShardBalance::Uneven, ShardBalance::Pad, ShardBalance::Drop] {
        let mut delivered: Vec<String> = Vec::new();
        let mut states = Vec::new();
        for rank in 0..2 {
            let mut pipeline = shard_of(N, rank, 2, balance).build().expect("build");
            for batch in take(&mut pipeline, 1, Some(3)) {
                assert!(batch.padded.iter().all(|p| !p));
                delivered.extend(batch.ids);
            }
            states.push(pipeline.state());
        }
        // Both ranks' states name the same place in the epoch's global order.
        assert_eq!(states[0].global_position(), 24, "{balance}");
        assert_eq!(states[1].global_position(), 24, "{balance}");
        let mut sizes = Vec::new();
        for rank in 0..3 {
            let state = states[rank % 2].clone();
            let mut pipeline = shard_of(N, rank, 3, balance)
                .resume(state)
                .build()
                .expect("resume on three ranks");
            let rest = take(&mut pipeline, 1, None);
            sizes.push(rest.iter().map(|s| s.ids.len()).collect::<Vec<_>>());
            for batch in rest {
                assert_eq!(batch.epoch, 0);
                for (id, padded) in batch.ids.into_iter().zip(batch.padded) {
                    if !padded {
                        delivered.push(id);
                    }
                }
            }
            // The next epoch is the three ranks' own.
            let next: Vec<Vec<String>> = (&mut pipeline)
                .map(|batch| batch.expect("batch").ids().to_vec())
                .collect();
            let mut fresh = shard_of(N, rank, 3, balance).build().expect("build");
            fresh.next_epoch().expect("epoch 1");
            let fresh: Vec<Vec<String>> = take(&mut fresh, 2, None)
                .into_iter()
                .map(|s| s.ids)
                .collect();
            assert_eq!(next, fresh, "{balance} rank {rank}: epoch 1");
        }
        if balance != ShardBalance::Uneven {
            assert!(sizes.iter().all(|s| *s == sizes[0]), "{balance}: {sizes:?}");
        }
        delivered.sort();
        let mut once = delivered.clone();
        once.dedup();
        assert_eq!(
            once.len(),
            delivered.len(),
            "{balance}: an image came twice"
        );
        let expected = match balance {
            // The 37 left are cut to 36 for three ranks.
            ShardBalance::Drop => N - 1,
            _ => N,
        };
        assert_eq!(delivered.len(), expected, "{balance}: images of the epoch");
    }
}

/// An epoch resumed on three ranks is stopped and resumed again: by the same rank, exactly; on
/// four ranks, from the three ranks' global position.
#[test]
fn an_epoch_resumed_on_another_world_resumes_again() {
    let mut two = shard_of(61, 0, 2, ShardBalance::Uneven)
        .build()
        .expect("build");
    take(&mut two, 1, Some(3));
    let state = two.state();
    let on_three = || {
        shard_of(61, 1, 3, ShardBalance::Uneven)
            .resume(state.clone())
            .build()
            .expect("resume")
    };
    let whole = take(&mut on_three(), 2, None);
    let mut stopped = on_three();
    let mut seen = take(&mut stopped, 2, Some(1));
    let again = stopped.state();
    assert_eq!((again.rows(), again.global_position()), (4, 24 + 4 * 3));
    let text = again.to_json();
    let mut resumed = shard_of(61, 1, 3, ShardBalance::Uneven)
        .resume(PipelineState::from_json(&text).expect("state"))
        .build()
        .expect("resume");
    seen.extend(take(&mut resumed, 2, None));
    assert!(seen == whole, "resumed twice");
    // Four ranks go on from 36: 25 images left, 7 for rank 0.
    let mut four = shard_of(61, 0, 4, ShardBalance::Uneven)
        .resume(again)
        .build()
        .expect("resume on four");
    let rows: usize = take(&mut four, 1, None).iter().map(|s| s.ids.len()).sum();
    assert_eq!(rows, 7);
}

/// A rank given another rank's state (a checkpoint saved by rank 0 and loaded everywhere) goes on
/// as many rows into its own part: where it stood, when none of its images failed.
#[test]
fn a_rank_resumes_from_another_ranks_state_at_the_same_step() {
    let whole = take(
        &mut shard_of(50, 1, 2, ShardBalance::Pad)
            .build()
            .expect("build"),
        2,
        None,
    );
    let mut rank0 = shard_of(50, 0, 2, ShardBalance::Pad)
        .build()
        .expect("build");
    take(&mut rank0, 2, Some(4));
    let mut rank1 = shard_of(50, 1, 2, ShardBalance::Pad)
        .resume(rank0.state())
        .build()
        .expect("resume");
    let rest = take(&mut rank1, 2, None);
    assert!(rest == whole[4..], "rank 1 from rank 0's state");
}

fn differing_options(result: gpufeed::Result<Pipeline>) -> Vec<String> {
    match result {
        Err(Error::Resume(ResumeError::Options(differences))) => {
            differences.into_iter().map(|d| d.option).collect()
        }
        Err(other) => panic!("expected options refused, got {other}"),
        Ok(_) => panic!("expected options refused, the pipeline was built"),
    }
}

/// A state resumed with another seed, source or output option is refused, naming what differs;
/// so is a state of an unknown format version; a refused state leaves a running pipeline as it
/// was.
#[test]
fn other_seeds_sources_and_options_are_refused_naming_them() {
    let dir = TempDir::new("resume-refused");
    generated_image_folder(&dir, 9, 0);
    let builder = training(|| Source::directory(dir.path()).expect("list"));
    let mut pipeline = builder().build().expect("build");
    take(&mut pipeline, 1, Some(1));
    let state = pipeline.state();
    assert_eq!(
        differing_options(builder().seed(12).resume(state.clone()).build()),
        ["seed"]
    );
    assert_eq!(
        differing_options(
            builder()
                .imagenet_train(24, 3)
                .resume(state.clone())
                .build()
        ),
        ["seed", "shuffle_seed"]
    );
    assert_eq!(
        differing_options(
            builder()
                .dtype(gpufeed::DType::F32)
                .resize(ResizeMode::stretch(24, 24))
                .resume(state.clone())
                .build()
        ),
        ["dtype", "resize"]
    );
    let message = builder()
        .seed(12)
        .resume(state.clone())
        .build()
        .expect_err("refused")
        .to_string();
    assert!(
        message.contains("seed is 12 here but 11 in the state"),
        "{message}"
    );
    // Another listing: a file renamed.
    std::fs::rename(
        dir.join("class_0/0000.jpg"),
        dir.join("class_0/0000-renamed.jpg"),
    )
    .expect("rename");
    match builder().resume(state.clone()).build() {
        Err(Error::Resume(ResumeError::Source { here, saved })) => {
            assert!(
                here.contains("9 images") && saved.contains("9 images"),
                "{here} / {saved}"
            );
            assert!(
                here.contains("renamed") && !saved.contains("renamed"),
                "{here} / {saved}"
            );
        }
        other => panic!("expected another listing refused, got {other:?}"),
    }
    // An unknown format version.
    let mut value: serde_json::Value = serde_json::from_str(&state.to_json()).expect("JSON");
    value["version"] = 2.into();
    assert!(matches!(
        PipelineState::from_json(&value.to_string()),
        Err(ResumeError::Version { found: 2, .. })
    ));
    // Refused on a running pipeline: nothing abandoned.
    std::fs::rename(
        dir.join("class_0/0000-renamed.jpg"),
        dir.join("class_0/0000.jpg"),
    )
    .expect("rename back");
    let other = || builder().seed(12).build().expect("build");
    let expected = take(&mut other(), 1, Some(2));
    let mut running = other();
    let mut seen = take(&mut running, 1, Some(1));
    let error = running.resume(&state).expect_err("refused");
    assert!(error.to_string().contains("seed"), "{error}");
    seen.extend(take(&mut running, 1, Some(1)));
    assert!(
        seen == expected,
        "a refused state changed the running pipeline"
    );
}

/// A state given to a running pipeline ([`Pipeline::resume`], Python's `load_state_dict`):
/// what is left of its epoch is abandoned and it goes on from the state.
#[test]
fn a_running_pipeline_goes_on_from_a_state_it_is_given() {
    let dir = TempDir::new("resume-running");
    generated_image_folder(&dir, 14, 1);
    let builder = training(|| Source::directory(dir.path()).expect("list"));
    let whole = take(&mut builder().build().expect("build"), 2, None);
    let mut saving = builder().build().expect("build");
    take(&mut saving, 2, Some(5));
    let state = saving.state();
    let mut running = builder().build().expect("build");
    take(&mut running, 2, Some(2));
    running.resume(&state).expect("resume");
    assert!(take(&mut running, 2, None) == whole[5..]);
}

/// What the state says between epochs: after the last batch of an epoch it is still that epoch
/// (its end not yet seen), once the end is seen it is the beginning of the next.
#[test]
fn a_state_at_an_epochs_end_is_the_next_epochs_beginning() {
    let mut pipeline = shard_of(8, 0, 1, ShardBalance::Pad).build().expect("build");
    for _ in 0..2 {
        pipeline.next_batch().expect("batch").expect("a batch");
    }
    let state = pipeline.state();
    assert_eq!(
        (
            state.epoch(),
            state.batches(),
            state.rows(),
            state.position()
        ),
        (0, 2, 8, 8)
    );
    assert!(pipeline.next_batch().expect("end").is_none());
    let state = pipeline.state();
    assert_eq!(
        (state.epoch(), state.batches(), state.position()),
        (1, 0, 0)
    );
    let mut resumed = shard_of(8, 0, 1, ShardBalance::Pad)
        .resume(state)
        .build()
        .expect("resume");
    assert_eq!(resumed.epoch(), 1);
    let mut expected = shard_of(8, 0, 1, ShardBalance::Pad).build().expect("build");
    expected.next_epoch().expect("epoch 1");
    assert!(take(&mut resumed, 2, None) == take(&mut expected, 2, None));
}

/// A million paths over the bundled photos, repeated.
fn million(n: usize) -> Source {
    let photos: Vec<PathBuf> = ["rocket.jpg", "retina.jpg", "coffee.png", "camera.png"]
        .iter()
        .map(|name| repo_path(&format!("assets/{name}")))
        .collect();
    Source::paths((0..n).map(|i| photos[i % photos.len()].clone()))
}

/// Resuming at the last batch of a 1,000,000-image epoch reaches that batch about as fast as a
/// pipeline reaches the epoch's first: the order is computed, nothing before the position is
/// read or decoded (every path is a real photo, so a replay would decode a million images). The
/// factor is generous; `cargo bench --bench resume` measures it.
#[test]
fn resuming_at_the_end_of_a_million_image_epoch_replays_nothing() {
    const N: usize = 1_000_000;
    const BATCH: usize = 64;
    let builder = || {
        Pipeline::builder()
            .source(million(N))
            .imagenet_train(32, 5)
            .batch_size(BATCH)
            .device(Device::Cpu)
    };
    let first_batch = |builder: PipelineBuilder| -> (Duration, Pipeline, Seen) {
        let started = Instant::now();
        let mut pipeline = builder.build().expect("build");
        let batch = pipeline.next_batch().expect("batch").expect("a batch");
        (started.elapsed(), pipeline, Seen::of(&batch))
    };
    let (from_start, pipeline, _) = first_batch(builder());
    // The state after every batch but the last: 15,624 batches of 64.
    let mut state: serde_json::Value =
        serde_json::from_str(&pipeline.state().to_json()).expect("JSON");
    drop(pipeline);
    let taken = N / BATCH * BATCH - BATCH;
    for field in ["position", "rows", "global_position"] {
        state[field] = taken.into();
    }
    state["batches"] = (taken / BATCH).into();
    let state = PipelineState::from_json(&state.to_string()).expect("state");
    let (resumed, mut pipeline, last) = first_batch(builder().resume(state));
    assert_eq!(last.ids.len(), BATCH);
    assert!(
        pipeline.next_batch().expect("end").is_none(),
        "that was the last batch"
    );
    let report = pipeline.epoch_report();
    assert_eq!(
        (report.batches, report.images, report.complete),
        (1, BATCH, true)
    );
    println!("first batch of the epoch {from_start:?}, of its last batch resumed {resumed:?}");
    assert!(
        resumed < from_start * 4 + Duration::from_secs(2),
        "resumed in {resumed:?}, from the start in {from_start:?}"
    );
}

/// A position past the end of its epoch (one no pipeline saves) is refused, naming it, when a
/// pipeline is built from it and when a running one is moved to it; so is a field given twice.
#[test]
fn a_position_past_its_epoch_or_a_field_given_twice_is_refused() {
    let builder = || shard_of(10, 0, 2, ShardBalance::Pad);
    let mut saving = builder().build().expect("build");
    take(&mut saving, 1, Some(1));
    let text = saving.state().to_json();
    let mut value: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    for position in [u64::MAX, 1_000] {
        value["position"] = position.into();
        let edited = PipelineState::from_json(&value.to_string()).expect("reads");
        let refused = builder()
            .resume(edited.clone())
            .build()
            .expect_err("refused");
        let reason = refused.to_string();
        assert!(
            reason.contains(&format!("position {position} is past the end of epoch 0")),
            "{reason}"
        );
        let mut running = builder().build().expect("build");
        let moved = running.resume(&edited).expect_err("refused");
        assert!(moved.to_string().contains("past the end"), "{moved}");
    }
    // The last position a batch may reach (one more round of the rank's images) still resumes.
    value["position"] = 10u64.into();
    let edge = PipelineState::from_json(&value.to_string()).expect("reads");
    builder().resume(edge).build().expect("the order's reach");
    let twice = text.replacen("\"position\":", "\"position\": 0, \"position\":", 1);
    let error = PipelineState::from_json(&twice).expect_err("a field twice");
    assert!(error.to_string().contains("given twice"), "{error}");
}
