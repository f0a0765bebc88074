//! Sources in object storage, against a real S3 server (SeaweedFS's `weed mini`, started by the
//! tests on free loopback ports; see `crates/s3-server`): WebDataset shards, one object per
//! image and ImageFolder trees give the bytes, ids and labels of the same data on disk; brace
//! patterns, plain HTTP URLs, ranks and the block shuffle; the cache across epochs and sources;
//! a wrong secret, a truncated shard, a server killed mid-epoch and one restarted mid-epoch;
//! behind a fault-injecting proxy (`s3_server::faults`), listings that loop or never end, keys
//! no client can name, a server that never answers, answers at 1 byte a second, 503 to every
//! GET; and cache entries damaged on the disk.
//! Without `weed` the tests print `skipped: ...`, unless `GPUFEED_REQUIRE_S3=1`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

mod common;

use common::{repo_path, TempDir};
use gpufeed::{
    DType, Device, Error, Layout, OnError, Pipeline, RemoteOptions, ResizeMode, Source, UrlLayout,
};
use s3_server::faults::{Fault, FaultProxy};
use s3_server::S3Server;

/// One row a pipeline gave: id, label, pixels.
type Row = (String, Option<u32>, Vec<f32>);

/// The images of the corpus: the test fixtures and the smaller bundled photos, each with a
/// class (0 to 2).
fn corpus() -> Vec<(PathBuf, u32)> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(repo_path("tests/fixtures"))
        .expect("fixtures")
        .map(|e| e.expect("entry").path())
        .filter(|p| {
            let ext = p
                .extension()
                .map(|e| e.to_string_lossy().to_ascii_lowercase());
            gpufeed::IMAGE_EXTENSIONS.contains(&ext.as_deref().unwrap_or(""))
        })
        .collect();
    files.sort();
    for photo in [
        "camera.png",
        "chelsea.png",
        "coffee.png",
        "retina.jpg",
        "rocket.jpg",
    ] {
        files.push(repo_path("assets").join(photo));
    }
    files
        .into_iter()
        .enumerate()
        .map(|(i, p)| (p, (i % 3) as u32))
        .collect()
}

/// The corpus as WebDataset shards of `per_shard` samples (image and `.cls` label), written by
/// `tar` into `dir/shards`; returns the shard files.
fn write_shards(dir: &Path, per_shard: usize) -> Vec<PathBuf> {
    let staging = dir.join("members");
    let shards = dir.join("shards");
    std::fs::create_dir_all(&staging).expect("mkdir");
    std::fs::create_dir_all(&shards).expect("mkdir");
    let mut out = Vec::new();
    for (k, chunk) in corpus().chunks(per_shard).enumerate() {
        let mut members = Vec::new();
        for (i, (path, label)) in chunk.iter().enumerate() {
            let ext = path
                .extension()
                .expect("ext")
                .to_string_lossy()
                .into_owned();
            let key = format!("s{k:02}{i:02}");
            std::fs::copy(path, staging.join(format!("{key}.{ext}"))).expect("copy");
            std::fs::write(staging.join(format!("{key}.cls")), format!("{label}\n")).expect("cls");
            members.push(format!("{key}.{ext}"));
            members.push(format!("{key}.cls"));
        }
        let shard = shards.join(format!("shard-{k:04}.tar"));
        let status = std::process::Command::new("tar")
            .arg("-cf")
            .arg(&shard)
            .arg("-C")
            .arg(&staging)
            .args(&members)
            .status()
            .expect("tar");
        assert!(status.success());
        out.push(shard);
    }
    out
}

/// Uploads `files` under `prefix`, each by its name.
fn upload(server: &S3Server, prefix: &str, files: &[PathBuf]) {
    let objects = files
        .iter()
        .map(|f| {
            let name = f.file_name().expect("name").to_string_lossy();
            (format!("{prefix}{name}"), std::fs::read(f).expect("read"))
        })
        .collect();
    server.put_all(objects).expect("upload");
}

fn options(server: &S3Server) -> RemoteOptions {
    let mut options = RemoteOptions::default();
    for (key, value) in server.store_options() {
        options = options.store_option(key, value);
    }
    options
}

fn builder(source: Source) -> gpufeed::PipelineBuilder {
    Pipeline::builder()
        .source(source)
        .batch_size(5)
        .resize(ResizeMode::stretch(24, 24))
        .dtype(DType::F32)
        .layout(Layout::Nhwc)
        .threads(2)
        .device(Device::Cpu)
}

/// The rows and the skipped images (`id: reason`) of one epoch.
fn run(pipeline: &mut Pipeline) -> (Vec<Row>, Vec<String>) {
    let mut rows = Vec::new();
    let mut skipped = Vec::new();
    for batch in &mut *pipeline {
        let batch = batch.expect("batch");
        let values = batch.images().to_host().expect("host").to_f32_vec();
        let per = values.len() / batch.len();
        for (i, id) in batch.ids().iter().enumerate() {
            let label = batch.labels().map(|l| l[i]);
            rows.push((id.clone(), label, values[i * per..(i + 1) * per].to_vec()));
        }
        skipped.extend(batch.skipped().iter().map(|e| e.to_string()));
    }
    skipped.extend(
        pipeline.epoch_report().skipped[skipped.len()..]
            .iter()
            .map(|e| e.to_string()),
    );
    (rows, skipped)
}

fn epoch(source: Source) -> (Vec<Row>, Vec<String>) {
    run(&mut builder(source).build().expect("build"))
}

/// `rows` with ids starting `from` renamed to start `to`.
fn renamed(rows: Vec<Row>, from: &str, to: &str) -> Vec<Row> {
    rows.into_iter()
        .map(|(id, label, pixels)| {
            let id = match id.strip_prefix(from) {
                Some(rest) => format!("{to}{rest}"),
                None => id,
            };
            (id, label, pixels)
        })
        .collect()
}

fn same(remote: &[Row], local: &[Row]) {
    assert_eq!(remote.len(), local.len());
    for (r, l) in remote.iter().zip(local) {
        assert_eq!(r.0, l.0);
        assert_eq!(r.1, l.1, "{}", r.0);
        assert!(r.2 == l.2, "{}: the pixels differ from the disk's", r.0);
    }
}

#[test]
fn webdataset_shards_give_the_bytes_ids_and_labels_of_the_disk() {
    let Some(server) =
        S3Server::for_test("webdataset_shards_give_the_bytes_ids_and_labels_of_the_disk")
    else {
        return;
    };
    let dir = TempDir::new("remote-wds");
    let shards = write_shards(&dir, 7);
    upload(&server, "wds/", &shards);
    // Not a shard: left out of the listing.
    server
        .put("wds/README.txt", b"shards".to_vec())
        .expect("put");
    let local_dir = dir.join("shards").display().to_string();
    let (local, local_skipped) = epoch(Source::webdataset(dir.join("shards")).expect("local"));
    let local = renamed(local, &local_dir, &server.url("wds"));
    assert!(local.len() >= 20, "{}", local.len());

    let source = Source::url(
        &server.url("wds/"),
        UrlLayout::WebDataset,
        &options(&server),
    )
    .expect("s3");
    assert_eq!(source.len(), local.len() + local_skipped.len());
    let opening = source.opening_report().expect("remote").clone();
    assert_eq!(opening.fetched, shards.len() as u64, "{opening:?}");
    let mut pipeline = builder(source).build().expect("build");
    let (remote, remote_skipped) = run(&mut pipeline);
    same(&remote, &local);
    let local_skipped: Vec<String> = local_skipped
        .iter()
        .map(|s| s.replace(&local_dir, &server.url("wds")))
        .collect();
    assert_eq!(remote_skipped, local_skipped);
    // Each shard read whole, in one request (they are under 16 MiB).
    let reads = pipeline.epoch_report().reads.clone().expect("reads");
    let bytes: u64 = shards
        .iter()
        .map(|s| s.metadata().expect("size").len())
        .sum();
    assert_eq!(reads.bytes, bytes, "{reads:?}");
    assert_eq!(reads.requests, shards.len() as u64, "{reads:?}");
    assert_eq!(reads.fetched, shards.len() as u64, "{reads:?}");

    // The same shards by a brace pattern, and in ranges of 64 KiB.
    let pattern = server.url(&format!("wds/shard-{{0000..{:04}}}.tar", shards.len() - 1));
    let small = options(&server).request_bytes(64 << 10);
    let mut pipeline =
        builder(Source::url(&pattern, UrlLayout::WebDataset, &small).expect("braces"))
            .build()
            .expect("build");
    let (by_pattern, _) = run(&mut pipeline);
    same(&by_pattern, &local);
    let reads = pipeline.epoch_report().reads.clone().expect("reads");
    assert!(reads.requests > 2 * shards.len() as u64, "{reads:?}");

    // Shuffled over two ranks: each sample once, with the disk's pixels; each rank reads its
    // own shards (at most one shared at the boundary).
    let by_id: BTreeMap<&str, &Row> = local.iter().map(|r| (r.0.as_str(), r)).collect();
    let mut seen = Vec::new();
    let mut orders = Vec::new();
    for rank in 0..2 {
        let source = Source::url(
            &server.url("wds/"),
            UrlLayout::WebDataset,
            &options(&server),
        )
        .expect("s3");
        let mut pipeline = builder(source)
            .shuffle(11)
            .shard(rank, 2)
            .build()
            .expect("build");
        let (rows, _) = run(&mut pipeline);
        for (id, label, pixels) in &rows {
            let want = by_id[id.as_str()];
            assert_eq!(*label, want.1);
            assert!(*pixels == want.2, "{id}");
        }
        let padded = pipeline.epoch_report().padded;
        seen.extend(rows[..rows.len() - padded].iter().map(|r| r.0.clone()));
        let reads = pipeline.epoch_report().reads.clone().expect("reads");
        assert!(reads.fetched <= shards.len() as u64 / 2 + 1, "{reads:?}");
        orders.push(rows.iter().map(|r| r.0.clone()).collect::<Vec<_>>());
    }
    seen.sort();
    let mut all: Vec<String> = local.iter().map(|r| r.0.clone()).collect();
    all.sort();
    assert_eq!(seen, all);
    let in_order: Vec<String> = local.iter().map(|r| r.0.clone()).collect();
    assert_ne!(orders[0], in_order[..orders[0].len()], "shuffled");
}

#[test]
fn images_and_image_folders_give_the_bytes_ids_and_labels_of_the_disk() {
    let Some(server) =
        S3Server::for_test("images_and_image_folders_give_the_bytes_ids_and_labels_of_the_disk")
    else {
        return;
    };
    let dir = TempDir::new("remote-images");
    let root = dir.join("tree");
    let mut objects = Vec::new();
    for (k, (path, label)) in corpus().into_iter().enumerate() {
        let name = path
            .file_name()
            .expect("name")
            .to_string_lossy()
            .into_owned();
        // Class folders, one with a subfolder, and a name that sorts between folders.
        let key = match k % 4 {
            3 => format!("class-{label}/deeper/{k}-{name}"),
            _ => format!("class-{label}/{k}-{name}"),
        };
        let file = root.join(&key);
        std::fs::create_dir_all(file.parent().expect("parent")).expect("mkdir");
        std::fs::copy(&path, &file).expect("copy");
        objects.push((format!("tree/{key}"), std::fs::read(&path).expect("read")));
    }
    objects.push(("tree/class-0/notes.txt".into(), b"not an image".to_vec()));
    std::fs::write(root.join("class-0/notes.txt"), "not an image").expect("write");
    server.put_all(objects).expect("upload");
    let local_root = root.display().to_string();

    let (local, _) = epoch(Source::image_folder(&root).expect("local"));
    let local = renamed(local, &local_root, &server.url("tree"));
    let remote_source = Source::url(
        &server.url("tree/"),
        UrlLayout::ImageFolder,
        &options(&server),
    )
    .expect("s3");
    assert_eq!(
        remote_source.class_names(),
        Source::image_folder(&root).expect("local").class_names()
    );
    let (remote, _) = epoch(remote_source);
    same(&remote, &local);

    let (local, _) = epoch(Source::directory(&root).expect("local"));
    let local = renamed(local, &local_root, &server.url("tree"));
    let (remote, _) =
        epoch(Source::url(&server.url("tree/"), UrlLayout::Images, &options(&server)).expect("s3"));
    same(&remote, &local);

    // Plain HTTP (the filer serves the bucket): ids are the URLs.
    let urls: Vec<String> = ["tree/class-1/1-cmyk.jpg", "tree/class-0/0-UPPER.JPG"]
        .iter()
        .map(|k| server.http_url(k))
        .collect();
    let (over_http, skipped) =
        epoch(Source::urls(&urls, UrlLayout::Images, &RemoteOptions::default()).expect("http"));
    assert!(skipped.is_empty(), "{skipped:?}");
    let files = Source::paths([
        root.join("class-1/1-cmyk.jpg"),
        root.join("class-0/0-UPPER.JPG"),
    ]);
    let (from_files, _) = epoch(files);
    assert_eq!(over_http.len(), 2);
    for ((id, _, pixels), (_, _, want)) in over_http.iter().zip(&from_files) {
        assert!(urls.contains(id), "{id}");
        assert!(pixels == want, "{id}");
    }
}

#[test]
fn a_wrong_secret_fails_at_once_and_says_so() {
    let Some(server) = S3Server::for_test("a_wrong_secret_fails_at_once_and_says_so") else {
        return;
    };
    server
        .put("wrong/shard-0000.tar", vec![0; 1024])
        .expect("put");
    let mut options = RemoteOptions::default();
    for (key, value) in server.store_options_with_secret("not-the-secret") {
        options = options.store_option(key, value);
    }
    for url in [server.url("wrong/"), server.url("wrong/shard-0000.tar")] {
        let start = Instant::now();
        let error = Source::url(&url, UrlLayout::WebDataset, &options).expect_err("refused");
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{:?}",
            start.elapsed()
        );
        let text = error.to_string();
        assert!(text.contains("refused the credentials"), "{text}");
        assert!(
            matches!(
                error,
                Error::Remote {
                    kind: std::io::ErrorKind::PermissionDenied,
                    ..
                }
            ),
            "{error:?}"
        );
    }
}

/// No credentials at all (none given, no metadata service answering): an error at once that
/// says none were found and how to give them, not that the store refused them.
#[test]
fn no_credentials_says_so_at_once() {
    let Some(server) = S3Server::for_test("no_credentials_says_so_at_once") else {
        return;
    };
    if std::env::var_os("AWS_ACCESS_KEY_ID").is_some() {
        eprintln!("skipped: no_credentials_says_so_at_once: AWS_ACCESS_KEY_ID is set here");
        return;
    }
    let options = RemoteOptions::default()
        .store_option("aws_endpoint", server.endpoint())
        .store_option("aws_metadata_endpoint", "http://127.0.0.1:9");
    let start = Instant::now();
    let error = Source::url(&server.url("any/"), UrlLayout::Images, &options).expect_err("none");
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "{:?}",
        start.elapsed()
    );
    let text = error.to_string();
    assert!(text.contains("no credentials: none were given"), "{text}");
    assert!(text.contains("AWS_ACCESS_KEY_ID"), "{text}");
    assert!(!text.contains("refused the credentials"), "{text}");
}

#[test]
fn a_truncated_shard_keeps_its_intact_samples() {
    let Some(server) = S3Server::for_test("a_truncated_shard_keeps_its_intact_samples") else {
        return;
    };
    let dir = TempDir::new("remote-truncated");
    let shards = write_shards(&dir, 10);
    // Cut the first shard inside its fifth image.
    let mut bytes = std::fs::read(&shards[0]).expect("read");
    let fifth = bytes
        .windows(5)
        .position(|w| w == b"s0004")
        .expect("the member's header");
    bytes.truncate(fifth + 512 + 100);
    std::fs::write(&shards[0], &bytes).expect("write");
    upload(&server, "cut/", &shards);
    let local_dir = dir.join("shards").display().to_string();
    let (local, local_skipped) = epoch(Source::webdataset(dir.join("shards")).expect("local"));
    let local = renamed(local, &local_dir, &server.url("cut"));
    let (remote, remote_skipped) = epoch(
        Source::url(
            &server.url("cut/"),
            UrlLayout::WebDataset,
            &options(&server),
        )
        .expect("s3"),
    );
    same(&remote, &local);
    let local_skipped: Vec<String> = local_skipped
        .iter()
        .map(|s| s.replace(&local_dir, &server.url("cut")))
        .collect();
    assert_eq!(remote_skipped, local_skipped);
    assert!(
        remote_skipped
            .iter()
            .any(|s| s.contains("shard-0000.tar:s0004") && s.contains("truncated")),
        "{remote_skipped:?}"
    );
    let intact = remote
        .iter()
        .filter(|r| r.0.contains("shard-0000.tar"))
        .count();
    assert!(intact >= 4, "{intact}");
}

#[test]
fn the_cache_serves_later_epochs_and_other_sources() {
    let Some(server) = S3Server::for_test("the_cache_serves_later_epochs_and_other_sources") else {
        return;
    };
    let dir = TempDir::new("remote-cache");
    let shards = write_shards(&dir, 7);
    upload(&server, "cached/", &shards);
    let cache = dir.join("cache");
    let cached = options(&server).cache_dir(Some(cache.clone()));
    let url = server.url("cached/");
    let source = Source::url(&url, UrlLayout::WebDataset, &cached).expect("s3");
    let mut pipeline = builder(source).build().expect("build");
    let (first, _) = run(&mut pipeline);
    let (second, _) = run(&mut pipeline);
    same(&second, &first);
    let reads = pipeline.epoch_report().reads.clone().expect("reads");
    assert_eq!(reads.cache_hits, shards.len() as u64, "{reads:?}");
    assert_eq!((reads.bytes, reads.requests), (0, 0), "{reads:?}");
    assert_eq!(reads.cache_hit_rate(), 1.0);
    // Two sources opened at once on the same folder: indexes and shards from the cache.
    let twins: Vec<_> = (0..2)
        .map(|_| {
            let (url, cached) = (url.clone(), cached.clone());
            std::thread::spawn(move || {
                let source = Source::url(&url, UrlLayout::WebDataset, &cached).expect("s3");
                let opening = source.opening_report().expect("remote").clone();
                let mut pipeline = builder(source).build().expect("build");
                let (rows, _) = run(&mut pipeline);
                (
                    opening,
                    rows,
                    pipeline.epoch_report().reads.clone().expect("reads"),
                )
            })
        })
        .collect();
    for twin in twins {
        let (opening, rows, reads) = twin.join().expect("twin");
        assert_eq!(opening.cache_hits, shards.len() as u64, "{opening:?}");
        assert_eq!(opening.bytes, 0, "{opening:?}");
        assert_eq!(reads.cache_hits, shards.len() as u64, "{reads:?}");
        same(&rows, &first);
    }
    // A limit too small for any shard: nothing more is kept, and the reads still work.
    let small = options(&server)
        .cache_dir(Some(dir.join("small-cache")))
        .cache_limit(1000);
    let mut pipeline = builder(Source::url(&url, UrlLayout::WebDataset, &small).expect("s3"))
        .build()
        .expect("build");
    run(&mut pipeline);
    let (again, _) = run(&mut pipeline);
    same(&again, &first);
    let reads = pipeline.epoch_report().reads.clone().expect("reads");
    assert_eq!(reads.cache_hits, 0, "{reads:?}");
}

/// Once every shard of an epoch is read or on its way, the reader reads the next epoch's first
/// shards into the budget's spare room: the next epoch finds them held (kept) instead of waiting
/// for them, though the budget (the largest shard and 300 kB, half the corpus) is too small to
/// keep them from the epoch's start. The bytes stay the disk's.
#[test]
fn the_next_epochs_first_shards_are_read_before_it_begins() {
    let Some(server) = S3Server::for_test("the_next_epochs_first_shards_are_read_before_it_begins")
    else {
        return;
    };
    let dir = TempDir::new("remote-upcoming");
    let shards = write_shards(&dir, 3);
    assert!(shards.len() >= 8, "{} shards", shards.len());
    upload(&server, "upcoming/", &shards);
    let largest = shards
        .iter()
        .map(|s| s.metadata().expect("size").len())
        .max()
        .expect("shards");
    let tight = options(&server).read_budget(largest + 300_000);
    let url = server.url("upcoming/");
    let source = Source::url(&url, UrlLayout::WebDataset, &tight).expect("s3");
    let mut pipeline = builder(source).build().expect("build");
    // A slow consumer: the reads ahead are done long before the epoch's last batch is made.
    let mut first = Vec::new();
    for batch in &mut pipeline {
        let batch = batch.expect("batch");
        first.push(batch.ids().to_vec());
        std::thread::sleep(std::time::Duration::from_millis(150));
    }
    let (second, _) = run(&mut pipeline);
    let reads = pipeline.epoch_report().reads.clone().expect("reads");
    assert!(reads.kept >= 1, "the first shard was read ahead: {reads:?}");
    let local = epoch(Source::webdataset(dir.join("shards")).expect("local"));
    let local_dir = dir.join("shards").display().to_string();
    same(
        &second,
        &renamed(local.0, &local_dir, &server.url("upcoming")),
    );
    assert_eq!(
        first.concat(),
        second.iter().map(|r| r.0.clone()).collect::<Vec<_>>()
    );
}

/// A shard a sample, uploaded under `prefix`, for a server to be killed; and options whose
/// read budget is the largest shard, so the reader holds about one shard ahead of the decoders.
fn fault_corpus(server: &S3Server, dir: &Path, prefix: &str) -> (usize, RemoteOptions) {
    let shards = write_shards(dir, 1);
    upload(server, prefix, &shards);
    let largest = shards
        .iter()
        .map(|s| s.metadata().expect("size").len())
        .max()
        .expect("shards");
    let tight = options(server).read_budget(largest).shuffle_window(Some(1));
    (shards.len(), tight)
}

#[test]
fn a_server_killed_mid_epoch_ends_the_run_with_every_sample_accounted_for() {
    let Some(server) = S3Server::for_test(
        "a_server_killed_mid_epoch_ends_the_run_with_every_sample_accounted_for",
    ) else {
        return;
    };
    let dir = TempDir::new("remote-killed");
    let (samples, tight) = fault_corpus(&server, &dir, "killed/");
    let skip_source =
        Source::url(&server.url("killed/"), UrlLayout::WebDataset, &tight).expect("s3");
    let fail_source = Source::url(
        &server.url("killed/"),
        UrlLayout::WebDataset,
        &tight.clone().retry_timeout(Duration::from_secs(10)),
    )
    .expect("s3");
    let mut skipping = builder(skip_source)
        .batch_size(2)
        .threads(1)
        .prefetch(1)
        .build()
        .expect("build");
    let mut failing = builder(fail_source)
        .batch_size(2)
        .threads(1)
        .prefetch(1)
        .on_error(OnError::Fail)
        .build()
        .expect("build");
    let first = skipping.next_batch().expect("batch").expect("a batch");
    failing.next_batch().expect("batch").expect("a batch");
    server.kill();
    let start = Instant::now();
    // Skip (with the default retries): the epoch ends, every sample delivered or reported,
    // the reports naming the shard.
    let mut delivered = first.len();
    let mut skipped = first.skipped().len();
    for batch in &mut skipping {
        let batch = batch.expect("batch");
        delivered += batch.len();
        skipped += batch.skipped().len();
    }
    let report = skipping.epoch_report();
    assert!(report.complete);
    assert_eq!(report.images, delivered);
    assert_eq!(delivered + report.skipped.len(), samples, "{report:?}");
    assert!(skipped <= report.skipped.len());
    let unread: Vec<_> = report
        .skipped
        .iter()
        .filter(|e| e.to_string().contains("cannot read"))
        .collect();
    assert!(
        unread.len() >= samples / 2,
        "{} of {samples}: {report:?}",
        unread.len()
    );
    for e in &unread {
        let shard = e.id.split(".tar:").next().expect("shard");
        assert!(e.to_string().contains(&format!("{shard}.tar:")), "{e}");
    }
    assert!(
        start.elapsed() < Duration::from_secs(120),
        "{:?}",
        start.elapsed()
    );
    let reads = report.reads.clone().expect("reads");
    assert!(reads.failed >= 1, "{reads:?}");
    // Fail: an error naming the object.
    let error = loop {
        match failing.next_batch() {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("the epoch ended without an error"),
            Err(e) => break e,
        }
    };
    let text = error.to_string();
    assert!(matches!(error, Error::Item(_)), "{error:?}");
    assert!(
        text.contains("s3://gpufeed/killed/shard-") && text.contains("cannot read"),
        "{text}"
    );
    assert!(
        start.elapsed() < Duration::from_secs(120),
        "{:?}",
        start.elapsed()
    );
}

#[test]
fn a_server_restarted_mid_epoch_loses_nothing() {
    let Some(server) = S3Server::for_test("a_server_restarted_mid_epoch_loses_nothing") else {
        return;
    };
    let dir = TempDir::new("remote-restarted");
    let (_, tight) = fault_corpus(&server, &dir, "restarted/");
    let local_dir = dir.join("shards").display().to_string();
    let (local, local_skipped) = epoch(Source::webdataset(dir.join("shards")).expect("local"));
    let local = renamed(local, &local_dir, &server.url("restarted"));
    let source = Source::url(&server.url("restarted/"), UrlLayout::WebDataset, &tight).expect("s3");
    let mut pipeline = builder(source)
        .batch_size(2)
        .threads(1)
        .prefetch(1)
        .build()
        .expect("build");
    let mut rows = Vec::new();
    let first = pipeline.next_batch().expect("batch").expect("a batch");
    let values = first.images().to_host().expect("host").to_f32_vec();
    let per = values.len() / first.len();
    for (i, id) in first.ids().iter().enumerate() {
        rows.push((
            id.clone(),
            first.labels().map(|l| l[i]),
            values[i * per..(i + 1) * per].to_vec(),
        ));
    }
    // Down for a few seconds while the prefetch thread goes on reading.
    server.kill();
    std::thread::sleep(Duration::from_secs(3));
    server.restart().expect("restart");
    let (rest, skipped) = run(&mut pipeline);
    rows.extend(rest);
    let local_skipped: Vec<String> = local_skipped
        .iter()
        .map(|s| s.replace(&local_dir, &server.url("restarted")))
        .collect();
    assert_eq!(skipped, local_skipped);
    same(&rows, &local);
}

/// Options that reach `server` through `proxy`.
fn options_via(server: &S3Server, proxy: &FaultProxy) -> RemoteOptions {
    let mut options = RemoteOptions::default();
    for (key, value) in server.store_options_via(proxy) {
        options = options.store_option(key, value);
    }
    options
}

/// Every sample of one epoch delivered or skipped: (delivered, skipped reasons, seconds).
fn drain(pipeline: &mut Pipeline) -> (usize, Vec<String>, f64) {
    let start = Instant::now();
    let mut delivered = 0;
    for batch in &mut *pipeline {
        delivered += batch.expect("batch").len();
    }
    let skipped = pipeline
        .epoch_report()
        .skipped
        .iter()
        .map(|e| e.to_string())
        .collect();
    (delivered, skipped, start.elapsed().as_secs_f64())
}

/// `count` copies of a small JPEG under `prefix` (`prefix/i-00000.jpg`, ...).
fn small_images(server: &S3Server, prefix: &str, count: usize) {
    let bytes = std::fs::read(repo_path("assets/rocket.jpg")).expect("photo");
    let objects = (0..count)
        .map(|i| (format!("{prefix}i-{i:05}.jpg"), bytes.clone()))
        .collect();
    server.put_all(objects).expect("upload");
}

/// A listing that gives the same token (and keys) forever, or new ones forever, or empty pages
/// forever, is an error within moments, not a listing that grows: each names what the server
/// did, after a handful of pages.
#[test]
fn a_listing_that_loops_or_never_ends_is_an_error_in_moments() {
    let Some(server) =
        S3Server::for_test("a_listing_that_loops_or_never_ends_is_an_error_in_moments")
    else {
        return;
    };
    let proxy = server.fault_proxy().expect("proxy");
    let bounded = options_via(&server, &proxy).max_listed_objects(20_000);
    for (fault, says, pages) in [
        // The same page forever.
        (
            Fault::EndlessListing {
                keys_per_page: 1000,
                fresh_keys: false,
                fresh_tokens: false,
            },
            "listing loops",
            2,
        ),
        // New keys, the same token.
        (
            Fault::EndlessListing {
                keys_per_page: 1000,
                fresh_keys: true,
                fresh_tokens: false,
            },
            "token \"token-0\" twice",
            2,
        ),
        // New keys and tokens forever.
        (
            Fault::EndlessListing {
                keys_per_page: 1000,
                fresh_keys: true,
                fresh_tokens: true,
            },
            "more than 20000 objects",
            21,
        ),
        (
            Fault::EndlessListing {
                keys_per_page: 0,
                fresh_keys: true,
                fresh_tokens: true,
            },
            "empty pages",
            16,
        ),
    ] {
        proxy.set(fault);
        let before = proxy.counts().lists.load(Ordering::SeqCst);
        let start = Instant::now();
        let error = Source::url(&server.url("loop/"), UrlLayout::Images, &bounded)
            .expect_err("a listing that does not end");
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{:?}",
            start.elapsed()
        );
        assert!(error.to_string().contains(says), "{error}");
        let asked = proxy.counts().lists.load(Ordering::SeqCst) - before;
        assert!(asked <= pages as u64, "{asked} pages for {says:?}");
    }
    // A listing that never answers: stopped by its interrupt within moments.
    proxy.set(Fault::Silent);
    let interrupt = gpufeed::Interrupt::new();
    let stopping = interrupt.clone();
    let options = options_via(&server, &proxy).interrupt(Some(interrupt));
    let start = Instant::now();
    let setter = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(500));
        stopping.interrupt();
        Instant::now()
    });
    let error =
        Source::url(&server.url("loop/"), UrlLayout::Images, &options).expect_err("stopped");
    let stopped = Instant::now();
    let set = setter.join().expect("setter");
    assert!(
        stopped.duration_since(set) < Duration::from_millis(100),
        "{:?} after the interrupt",
        stopped.duration_since(set)
    );
    assert!(start.elapsed() < Duration::from_secs(5));
    assert!(
        matches!(
            error,
            Error::Remote {
                kind: std::io::ErrorKind::Interrupted,
                ..
            }
        ),
        "{error:?}"
    );
}

/// Keys holding a newline, a tab or another control character cannot be requested: each is
/// skipped with its reason, in its place, and the rest of the prefix is read; files that are not
/// images are counted as a folder's are.
#[test]
fn keys_no_client_can_name_are_skipped_with_a_reason() {
    let Some(server) = S3Server::for_test("keys_no_client_can_name_are_skipped_with_a_reason")
    else {
        return;
    };
    small_images(&server, "odd/", 6);
    server
        .put("odd/notes.txt", b"not an image".to_vec())
        .expect("put");
    let proxy = server.fault_proxy().expect("proxy");
    proxy.set(Fault::ExtraKeys(vec![
        "odd/i-00002\n.jpg".into(),
        "odd/i-00003\t.jpg".into(),
        "odd/i-00004\u{1}.jpg".into(),
        "odd/also\n.txt".into(),
    ]));
    let source = Source::url(
        &server.url("odd/"),
        UrlLayout::Images,
        &options_via(&server, &proxy),
    )
    .expect("the prefix opens");
    assert_eq!(source.len(), 6 + 3);
    assert_eq!(source.left_out(), [("txt".to_string(), 2)]);
    let mut pipeline = builder(source).build().expect("build");
    let (delivered, skipped, _) = drain(&mut pipeline);
    assert_eq!(delivered, 6);
    assert_eq!(skipped.len(), 3, "{skipped:?}");
    for (e, c) in skipped.iter().zip(["\\n", "\\t", "\\u{1}"]) {
        assert!(e.contains("control character") && e.contains(c), "{e}");
    }
    // The ids keep their place: each after the image it follows.
    let ids: Vec<String> = pipeline
        .epoch_report()
        .skipped
        .iter()
        .map(|e| e.id.clone())
        .collect();
    assert_eq!(ids[0], server.url("odd/i-00002\n.jpg"));
}

/// A list of 100,000 URLs opens without a request; against a server that never answers, an
/// epoch of 2,000 of them ends within the retry bounds (each read cut at the request timeout,
/// the rest failing at once once one has given up), every image reported with its reason; and
/// dropping a pipeline that waits on such a server returns at once.
#[test]
fn a_server_that_never_answers_holds_nothing_past_its_bounds() {
    let Some(server) =
        S3Server::for_test("a_server_that_never_answers_holds_nothing_past_its_bounds")
    else {
        return;
    };
    let proxy = server.fault_proxy().expect("proxy");
    proxy.set(Fault::Silent);
    let quick = RemoteOptions::default()
        .request_timeout(Duration::from_millis(500))
        .retry_timeout(Duration::from_secs(2));
    let start = Instant::now();
    let pattern = format!("{}/x{{0..99999}}.jpg", proxy.endpoint());
    let source = Source::url(&pattern, UrlLayout::Images, &quick).expect("opens");
    assert_eq!(source.len(), 100_000);
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
    let counts = proxy.counts();
    assert_eq!(
        counts.heads.load(Ordering::SeqCst) + counts.gets.load(Ordering::SeqCst),
        0,
        "nothing asked up front"
    );
    drop(source);

    let pattern = format!("{}/x{{0..1999}}.jpg", proxy.endpoint());
    let source = Source::url(&pattern, UrlLayout::Images, &quick).expect("opens");
    let mut pipeline = builder(source).batch_size(64).build().expect("build");
    let (delivered, skipped, seconds) = drain(&mut pipeline);
    assert_eq!(delivered, 0);
    assert_eq!(skipped.len(), 2000);
    assert!(seconds < 15.0, "{seconds} s");
    eprintln!("2,000 URLs of a server that never answers: {seconds:.1} s");
    assert!(
        skipped.iter().any(|e| e.contains("gave up after")),
        "{:?}",
        &skipped[..3]
    );
    assert!(
        skipped
            .iter()
            .all(|e| e.contains("gave up after") || e.contains("store is failing")),
        "{skipped:?}"
    );

    // Dropped while its threads wait for the server: at once.
    let pattern = format!("{}/y{{0..99}}.jpg", proxy.endpoint());
    let patient = RemoteOptions::default().request_timeout(Duration::from_secs(60));
    let source = Source::url(&pattern, UrlLayout::Images, &patient).expect("opens");
    let pipeline = builder(source).build().expect("build");
    std::thread::sleep(Duration::from_millis(300));
    let start = Instant::now();
    drop(pipeline);
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "{:?} to drop",
        start.elapsed()
    );
}

/// Answers at 1 byte a second fail every read within its bounds, and the epoch's time does not
/// grow with the objects: 100 and 400 take about the same.
#[test]
fn answers_at_one_byte_a_second_fail_in_a_time_that_does_not_grow_with_the_objects() {
    let Some(server) = S3Server::for_test(
        "answers_at_one_byte_a_second_fail_in_a_time_that_does_not_grow_with_the_objects",
    ) else {
        return;
    };
    small_images(&server, "slow/", 400);
    let proxy = server.fault_proxy().expect("proxy");
    let options = options_via(&server, &proxy)
        .request_timeout(Duration::from_millis(800))
        .retry_timeout(Duration::from_secs(3));
    let mut times = Vec::new();
    for count in [100, 400] {
        let urls: Vec<String> = (0..count)
            .map(|i| server.url(&format!("slow/i-{i:05}.jpg")))
            .collect();
        proxy.set(Fault::None);
        let source = Source::urls(&urls, UrlLayout::Images, &options).expect("opens");
        proxy.set(Fault::Slow {
            bytes_per_second: 1,
        });
        let mut pipeline = builder(source).batch_size(50).build().expect("build");
        let (delivered, skipped, seconds) = drain(&mut pipeline);
        assert_eq!(delivered + skipped.len(), count);
        assert!(skipped.len() >= count - 5, "{delivered} delivered");
        assert!(
            skipped.iter().any(|e| e.contains("gave up after")),
            "{:?}",
            &skipped[..2]
        );
        times.push(seconds);
    }
    eprintln!("100 and 400 objects at 1 byte a second: {times:.1?} s");
    assert!(times[1] < 15.0, "{times:?}");
    assert!(times[1] < times[0] * 2.0 + 3.0, "{times:?}");
}

/// Every GET answered 503: each read tries at most `max_retries` + 1 times within the retry
/// timeout, says how many times it tried, and once one has given up the rest fail at once.
#[test]
fn every_get_refused_with_503_is_tried_a_bounded_number_of_times() {
    let Some(server) =
        S3Server::for_test("every_get_refused_with_503_is_tried_a_bounded_number_of_times")
    else {
        return;
    };
    small_images(&server, "busy/", 200);
    let proxy = server.fault_proxy().expect("proxy");
    let options = options_via(&server, &proxy)
        .max_retries(3)
        .max_requests(16)
        .retry_timeout(Duration::from_secs(20));
    let source = Source::url(&server.url("busy/"), UrlLayout::Images, &options).expect("opens");
    proxy.set(Fault::Status(503));
    let start = Instant::now();
    let mut pipeline = builder(source).batch_size(50).build().expect("build");
    let (delivered, skipped, _) = drain(&mut pipeline);
    assert_eq!((delivered, skipped.len()), (0, 200));
    assert!(
        start.elapsed() < Duration::from_secs(20),
        "{:?}",
        start.elapsed()
    );
    let gets = proxy.counts().gets.load(Ordering::SeqCst);
    eprintln!(
        "200 objects, every GET 503: {gets} GETs in {:.1} s",
        start.elapsed().as_secs_f64()
    );
    assert!(gets <= 16 * 4 + 200, "{gets} GETs");
    assert!(
        skipped.iter().any(|e| e.contains("gave up after 4 tries")),
        "{:?}",
        &skipped[..2]
    );
}

/// The cache folder's shard indexes and copies are checked: an index cut short, holding only
/// its header, or with a line twice, and a copy with flipped bytes, are each found damaged,
/// removed and read again, and the samples and their bytes stay the disk's.
#[test]
fn the_cache_checks_its_indexes_and_copies_and_rebuilds_what_is_damaged() {
    let Some(server) =
        S3Server::for_test("the_cache_checks_its_indexes_and_copies_and_rebuilds_what_is_damaged")
    else {
        return;
    };
    let dir = TempDir::new("remote-cache-damaged");
    let shards = write_shards(&dir, 25);
    upload(&server, "checked/", &shards);
    let local_dir = dir.join("shards").display().to_string();
    let (local, _) = epoch(Source::webdataset(dir.join("shards")).expect("local"));
    let local = renamed(local, &local_dir, &server.url("checked"));
    let cache = dir.join("cache");
    let cached = options(&server).cache_dir(Some(cache.clone()));
    let url = server.url("checked/");
    let (first, _) = epoch(Source::url(&url, UrlLayout::WebDataset, &cached).expect("s3"));
    same(&first, &local);
    let entries = |suffix: &str| -> Vec<PathBuf> {
        let mut found: Vec<PathBuf> = std::fs::read_dir(&cache)
            .expect("cache")
            .map(|e| e.expect("entry").path())
            .filter(|p| {
                let name = p.file_name().map(|n| n.to_string_lossy().into_owned());
                let name = name.unwrap_or_default();
                match suffix {
                    "" => !name.contains('.'),
                    _ => name.ends_with(suffix),
                }
            })
            .collect();
        found.sort();
        found
    };
    // The index of the larger shard (25 samples).
    let index = entries(".index")
        .into_iter()
        .max_by_key(|p| std::fs::metadata(p).map_or(0, |m| m.len()))
        .expect("an index");
    let text = std::fs::read_to_string(&index).expect("index");
    assert!(text.lines().count() > 20, "{text}");
    let lines: Vec<&str> = text.lines().collect();
    let damage: Vec<String> = vec![
        lines[..11].iter().map(|l| format!("{l}\n")).collect(),
        format!("{}\n", lines[0]),
        lines
            .iter()
            .chain(&lines[1..6])
            .map(|l| format!("{l}\n"))
            .collect(),
    ];
    for damaged in damage {
        std::fs::write(&index, damaged).expect("damage the index");
        let source = Source::url(&url, UrlLayout::WebDataset, &cached).expect("s3");
        let opening = source.opening_report().expect("remote").clone();
        assert_eq!(opening.cache_rejected, 1, "{opening:?}");
        let (rows, _) = epoch(source);
        same(&rows, &local);
    }
    // A copy of a shard with flipped bytes.
    let copy = entries("").into_iter().next().expect("a copy");
    let mut bytes = std::fs::read(&copy).expect("copy");
    let middle = bytes.len() / 2;
    for byte in &mut bytes[middle..middle + 64] {
        *byte ^= 0x5a;
    }
    std::fs::write(&copy, &bytes).expect("damage the copy");
    let mut pipeline = builder(Source::url(&url, UrlLayout::WebDataset, &cached).expect("s3"))
        .build()
        .expect("build");
    let (rows, _) = run(&mut pipeline);
    same(&rows, &local);
    let reads = pipeline.epoch_report().reads.clone().expect("reads");
    assert_eq!(reads.cache_rejected, 1, "{reads:?}");
    assert_eq!(reads.fetched, 1, "{reads:?}");
}
