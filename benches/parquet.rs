//! `cargo bench --bench parquet --features parquet`: the same images as WebDataset tar shards
//! and as Parquet files (a binary `image` column and an int64 `label`, written here with the
//! `parquet` crate, snappy-compressed), read from disk in turn, round after round. Prints
//! images/s, Parquet's against the shards' in the same round and epoch.
//!
//! Environment: `GPUFEED_BENCH_DIR` (the images, default assets/; use a corpus of 8,000+ images,
//! e.g. from make-corpus), `GPUFEED_BENCH_PER_SHARD` (samples a shard and rows a row group,
//! default 256), `GPUFEED_BENCH_GROUPS` (row groups a Parquet file, default 8),
//! `GPUFEED_BENCH_ROUNDS` (default 3), `GPUFEED_BENCH_EPOCHS` (default 2),
//! `GPUFEED_BENCH_DECODE` (cpu or hybrid, default cpu), `GPUFEED_BENCH_BATCH` (default 256),
//! `GPUFEED_BENCH_THREADS` (default 0: one per core), `GPUFEED_BENCH_SHUFFLE` (a seed: shuffled
//! epochs; the block shuffle for both, shards and row groups).
//!
//! With the `object-store` feature and `GPUFEED_BENCH_S3=1`, both are also put in a local S3
//! server (SeaweedFS's `weed mini`, found as `crates/s3-server` says) and read from it in the
//! same rounds: the tar shards as a URL source, the Parquet files by range requests, each
//! against the shards from the same server.
//!
//! Both were just written, so both read the page cache.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use gpufeed::{Decode, Device, ParquetOptions, Pipeline, Source};
use gpufeed_bench::{env_or, images_under, tar_member as member};
use parquet::basic::Compression;
use parquet::data_type::{ByteArray, ByteArrayType, Int64Type};
use parquet::file::properties::WriterProperties;
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::parser::parse_message_type;

/// The bench's errors.
type Result<T, E = Box<dyn std::error::Error>> = std::result::Result<T, E>;

fn main() {
    if let Err(e) = bench() {
        eprintln!("bench parquet: {e}");
        std::process::exit(1);
    }
}

fn bench() -> Result<()> {
    let dir: PathBuf = env_or("GPUFEED_BENCH_DIR", PathBuf::from("assets"));
    let per_shard: usize = env_or("GPUFEED_BENCH_PER_SHARD", 256).max(1);
    let groups: usize = env_or("GPUFEED_BENCH_GROUPS", 8).max(1);
    let rounds: usize = env_or("GPUFEED_BENCH_ROUNDS", 3);
    let epochs: u64 = env_or("GPUFEED_BENCH_EPOCHS", 2);
    let decode: Decode = env_or("GPUFEED_BENCH_DECODE", Decode::Cpu);
    let batch_size: usize = env_or("GPUFEED_BENCH_BATCH", 256);
    let threads: usize = env_or("GPUFEED_BENCH_THREADS", 0);
    let shuffle: Option<u64> = std::env::var("GPUFEED_BENCH_SHUFFLE")
        .ok()
        .and_then(|v| v.parse().ok());
    let device = match gpufeed::cuda::probe() {
        Ok(_) => Device::Cuda(0),
        Err(e) if decode == Decode::Hybrid => return Err(format!("hybrid decode: {e}").into()),
        Err(_) => Device::Cpu,
    };
    let images = images_under(&dir)?;
    let work = std::env::temp_dir().join(format!("gpufeed-bench-parquet-{}", std::process::id()));
    let (shards, files) = (work.join("shards"), work.join("parquet"));
    std::fs::create_dir_all(&shards)?;
    std::fs::create_dir_all(&files)?;
    let mut bytes = 0;
    for (k, chunk) in images.chunks(per_shard).enumerate() {
        bytes += write_shard(
            &shards.join(format!("shard-{k:05}.tar")),
            k * per_shard,
            chunk,
        )?;
    }
    for (k, chunk) in images.chunks(per_shard * groups).enumerate() {
        write_parquet(
            &files.join(format!("train-{k:05}.parquet")),
            k * per_shard * groups,
            chunk,
            per_shard,
        )?;
    }
    println!(
        "bench parquet: {} images from {} ({:.1} MB), shards and row groups of {per_shard}, \
         {groups} groups a file, {decode} decode on {device:?}, batch {batch_size}, {} cores",
        images.len(),
        dir.display(),
        bytes as f64 / 1e6,
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    let run = |source: Source, name: &'static str, round: usize, out: &mut Vec<Row>| {
        let mut builder = Pipeline::builder()
            .source(source)
            .batch_size(batch_size)
            .threads(threads)
            .decode(decode)
            .device(device);
        if let Some(seed) = shuffle {
            builder = builder.shuffle(seed);
        }
        let mut pipeline = builder.build()?;
        for epoch in 0..epochs {
            let start = Instant::now();
            let mut count = 0;
            let mut last = None;
            for batch in &mut pipeline {
                let batch = batch?;
                count += batch.len();
                last = Some(batch);
            }
            if let Some(batch) = &last {
                batch.images().synchronize()?;
            }
            out.push(Row {
                round,
                source: name,
                epoch,
                images: count,
                seconds: start.elapsed().as_secs_f64(),
            });
        }
        Ok::<(), Box<dyn std::error::Error>>(())
    };
    let remote = remote::Remote::start(&shards, &files)?;
    let mut rows = Vec::new();
    for round in 0..rounds {
        run(Source::webdataset(&shards)?, "tar", round, &mut rows)?;
        let opening = Instant::now();
        let source = Source::parquet([&files], &ParquetOptions::default())?;
        println!(
            "round {round}: the Parquet source opened in {:.3} s",
            opening.elapsed().as_secs_f64()
        );
        run(source, "parquet", round, &mut rows)?;
        if let Some(remote) = &remote {
            run(remote.shards()?, "s3 tar", round, &mut rows)?;
            let opening = Instant::now();
            let source = remote.parquet()?;
            println!(
                "round {round}: the Parquet source in S3 opened in {:.3} s",
                opening.elapsed().as_secs_f64()
            );
            run(source, "s3 parquet", round, &mut rows)?;
        }
    }
    println!(
        "{:>5} {:<10} {:>5} {:>7} {:>9} {:>6}",
        "round", "source", "epoch", "images", "images/s", "x tar"
    );
    for row in &rows {
        let rate = row.images as f64 / row.seconds;
        // Each source against the shards read from the same place.
        let tar_source = if row.source.starts_with("s3") {
            "s3 tar"
        } else {
            "tar"
        };
        let tar = rows
            .iter()
            .find(|r| r.source == tar_source && r.round == row.round && r.epoch == row.epoch)
            .map_or(f64::NAN, |r| r.images as f64 / r.seconds);
        println!(
            "{:>5} {:<10} {:>5} {:>7} {:>9.0} {:>6.2}",
            row.round,
            row.source,
            row.epoch,
            row.images,
            rate,
            rate / tar
        );
    }
    let _ = std::fs::remove_dir_all(&work);
    Ok(())
}

/// One timed epoch.
struct Row {
    round: usize,
    source: &'static str,
    epoch: u64,
    images: usize,
    seconds: f64,
}

/// A WebDataset shard of `images` (numbered from `first`, each with a `.cls` label); returns its
/// size.
fn write_shard(path: &Path, first: usize, images: &[PathBuf]) -> Result<u64> {
    let mut tar = Vec::new();
    for (i, image) in images.iter().enumerate() {
        let index = first + i;
        let ext = image
            .extension()
            .map_or("jpg".into(), |e| e.to_string_lossy().to_ascii_lowercase());
        member(
            &mut tar,
            &format!("s{index:07}.{ext}"),
            &std::fs::read(image)?,
        );
        member(
            &mut tar,
            &format!("s{index:07}.cls"),
            format!("{}\n", index % 1000).as_bytes(),
        );
    }
    tar.extend([0u8; 1024]);
    std::fs::write(path, &tar)?;
    Ok(tar.len() as u64)
}

/// A Parquet file of `images` (numbered from `first`, labels as the shards'), in row groups
/// of `per_group` rows.
fn write_parquet(path: &Path, first: usize, images: &[PathBuf], per_group: usize) -> Result<()> {
    let schema = Arc::new(parse_message_type(
        "message schema { required binary image; required int64 label; }",
    )?);
    let props = Arc::new(
        WriterProperties::builder()
            .set_compression(Compression::SNAPPY)
            .set_dictionary_enabled(false)
            .build(),
    );
    let mut writer = SerializedFileWriter::new(std::fs::File::create(path)?, schema, props)?;
    for (g, chunk) in images.chunks(per_group).enumerate() {
        let mut group = writer.next_row_group()?;
        let blobs: Vec<ByteArray> = chunk
            .iter()
            .map(|p| std::fs::read(p).map(ByteArray::from))
            .collect::<std::io::Result<_>>()?;
        let labels: Vec<i64> = (0..chunk.len())
            .map(|i| ((first + g * per_group + i) % 1000) as i64)
            .collect();
        if let Some(mut column) = group.next_column()? {
            column
                .typed::<ByteArrayType>()
                .write_batch(&blobs, None, None)?;
            column.close()?;
        }
        if let Some(mut column) = group.next_column()? {
            column
                .typed::<Int64Type>()
                .write_batch(&labels, None, None)?;
            column.close()?;
        }
        group.close()?;
    }
    writer.close()?;
    Ok(())
}

/// The shards and Parquet files in a local S3 server, with `object-store` and
/// `GPUFEED_BENCH_S3=1`.
#[cfg(feature = "object-store")]
mod remote {
    use std::path::Path;

    use gpufeed::{ParquetOptions, RemoteOptions, Source, UrlLayout};
    use s3_server::S3Server;

    use super::Result;

    /// The server and how to reach it.
    pub struct Remote {
        server: S3Server,
        options: RemoteOptions,
    }

    impl Remote {
        /// Starts the server and puts every file of `shards` under `bench/shards/` and of
        /// `files` under `bench/parquet/`; `None` unless `GPUFEED_BENCH_S3=1`.
        pub fn start(shards: &Path, files: &Path) -> Result<Option<Remote>> {
            if std::env::var("GPUFEED_BENCH_S3").as_deref() != Ok("1") {
                return Ok(None);
            }
            let server = S3Server::start(&S3Server::find_weed()?)?;
            let mut objects = Vec::new();
            for (dir, prefix) in [(shards, "bench/shards"), (files, "bench/parquet")] {
                for entry in std::fs::read_dir(dir)? {
                    let path = entry?.path();
                    let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
                    if let Some(name) = name {
                        objects.push((format!("{prefix}/{name}"), std::fs::read(&path)?));
                    }
                }
            }
            server.put_all(objects)?;
            let mut options = RemoteOptions::default();
            for (key, value) in server.store_options() {
                options = options.store_option(key, value);
            }
            Ok(Some(Remote { server, options }))
        }

        /// The shards as a URL source.
        pub fn shards(&self) -> Result<Source> {
            let url = self.server.url("bench/shards/");
            Ok(Source::url(&url, UrlLayout::WebDataset, &self.options)?)
        }

        /// The Parquet files, read by range requests.
        pub fn parquet(&self) -> Result<Source> {
            let url = self.server.url("bench/parquet/");
            Ok(Source::parquet_url(
                &url,
                &ParquetOptions::default(),
                &self.options,
            )?)
        }
    }
}

/// Without `object-store`, no S3 rounds.
#[cfg(not(feature = "object-store"))]
mod remote {
    use std::path::Path;

    use gpufeed::Source;

    use super::Result;

    /// Never built: the S3 rounds need the `object-store` feature.
    pub enum Remote {}

    impl Remote {
        /// `None`, saying why when `GPUFEED_BENCH_S3=1` asked for S3.
        pub fn start(_shards: &Path, _files: &Path) -> Result<Option<Remote>> {
            if std::env::var("GPUFEED_BENCH_S3").as_deref() == Ok("1") {
                return Err("GPUFEED_BENCH_S3=1 needs --features object-store".into());
            }
            Ok(None)
        }

        /// Unreachable: no value exists.
        pub fn shards(&self) -> Result<Source> {
            match *self {}
        }

        /// Unreachable: no value exists.
        pub fn parquet(&self) -> Result<Source> {
            match *self {}
        }
    }
}
