//! `cargo bench --bench remote --features object-store`: the same WebDataset shards read from
//! disk and from a local S3 server (SeaweedFS's `weed mini`, see `crates/s3-server`), in turn,
//! round after round; then from the S3 server with a cache folder, whose second epoch reads the
//! cache. Prints images/s, each against the disk's in the same round and epoch, the bytes and
//! requests read, the cache's hit rate, the time decoders waited on the network, and the CPU
//! seconds the server used (it runs on the same machine and takes cores of its own).
//!
//! Environment: `GPUFEED_WEED` (the `weed` binary, else on PATH), `GPUFEED_BENCH_DIR` (the
//! images made into shards, default assets/; use a corpus of 8,000+ images, e.g. from
//! make-corpus), `GPUFEED_BENCH_PER_SHARD` (samples a shard, default 256),
//! `GPUFEED_BENCH_ROUNDS` (default 3), `GPUFEED_BENCH_EPOCHS` (epochs a run, default 2),
//! `GPUFEED_BENCH_DECODE` (cpu or hybrid, default cpu), `GPUFEED_BENCH_SHARE` (hybrid decode's
//! GPU share, given and kept; default: the share follows the lanes, and the GPU lane joins once
//! it has opened), `GPUFEED_BENCH_BATCH` (default 256),
//! `GPUFEED_BENCH_THREADS` (default 0: one per core), `GPUFEED_BENCH_SHUFFLE` (a seed: shuffled
//! epochs, the block shuffle for the S3 source), `GPUFEED_BENCH_BUDGET` (the read budget in
//! bytes; default a quarter of the shards' bytes, at most 1 GiB, so that a second epoch cannot
//! find them all still in memory).
//!
//! The disk's shards were just written, so the disk runs read the page cache: the S3 source is
//! compared with the fastest local read there is.

use std::path::{Path, PathBuf};
use std::time::Instant;

use gpufeed::{Decode, Device, Pipeline, ReadReport, RemoteOptions, Source, UrlLayout};
use gpufeed_bench::{env_or, images_under, tar_member as member};
use s3_server::S3Server;

/// The bench's errors.
type Result<T, E = Box<dyn std::error::Error>> = std::result::Result<T, E>;

/// One timed epoch.
struct Row {
    round: usize,
    source: &'static str,
    epoch: u64,
    images: usize,
    seconds: f64,
    reads: Option<ReadReport>,
    server_cpu: Option<f64>,
}

fn main() {
    if let Err(e) = bench() {
        eprintln!("bench remote: {e}");
        std::process::exit(1);
    }
}

fn bench() -> Result<()> {
    let dir: PathBuf = env_or("GPUFEED_BENCH_DIR", PathBuf::from("assets"));
    let per_shard: usize = env_or("GPUFEED_BENCH_PER_SHARD", 256);
    let rounds: usize = env_or("GPUFEED_BENCH_ROUNDS", 3);
    let epochs: u64 = env_or("GPUFEED_BENCH_EPOCHS", 2);
    let decode: Decode = env_or("GPUFEED_BENCH_DECODE", Decode::Cpu);
    let share: Option<f32> = std::env::var("GPUFEED_BENCH_SHARE")
        .ok()
        .and_then(|v| v.parse().ok());
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
    let work = std::env::temp_dir().join(format!("gpufeed-bench-remote-{}", std::process::id()));
    let shards_dir = work.join("shards");
    std::fs::create_dir_all(&shards_dir)?;
    let shards = write_shards(&dir, &shards_dir, per_shard)?;
    let bytes: u64 = shards.iter().map(|(_, b)| b.len() as u64).sum();
    println!(
        "bench remote: {} shards of up to {per_shard} samples from {} ({:.1} MB), {decode} decode{} \
         on {device:?}, batch {batch_size}, {} threads, {} cores",
        shards.len(),
        dir.display(),
        bytes as f64 / 1e6,
        share.map_or(String::new(), |s| format!(" (GPU share {s}, given)")),
        if threads == 0 {
            "all".into()
        } else {
            threads.to_string()
        },
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    let weed = S3Server::find_weed()?;
    let server = S3Server::start(&weed)?;
    server.put_all(
        shards
            .into_iter()
            .map(|(name, data)| (format!("bench/{name}"), data))
            .collect(),
    )?;
    let budget: u64 = env_or("GPUFEED_BENCH_BUDGET", (bytes / 4).clamp(1 << 20, 1 << 30));
    println!("bench remote: read budget {:.1} MB", budget as f64 / 1e6);
    let mut remote = RemoteOptions::default().read_budget(budget);
    for (key, value) in server.store_options() {
        remote = remote.store_option(key, value);
    }
    let run =
        |source: Source, round: usize, name: &'static str, rows: &mut Vec<Row>| -> Result<()> {
            let mut builder = Pipeline::builder()
                .source(source)
                .batch_size(batch_size)
                .threads(threads)
                .decode(decode)
                .device(device);
            if let Some(seed) = shuffle {
                builder = builder.shuffle(seed);
            }
            if let Some(share) = share {
                builder = builder.gpu_share(share);
            }
            let mut pipeline = builder.build()?;
            for _ in 0..epochs {
                let cpu = server.cpu_seconds();
                let start = Instant::now();
                let mut images = 0;
                let mut last = None;
                for batch in &mut pipeline {
                    let batch = batch?;
                    images += batch.len();
                    last = Some(batch);
                }
                if let Some(batch) = &last {
                    batch.images().synchronize()?;
                }
                let seconds = start.elapsed().as_secs_f64();
                let report = pipeline.epoch_report();
                rows.push(Row {
                    round,
                    source: name,
                    epoch: report.epoch,
                    images,
                    seconds,
                    reads: report.reads.clone(),
                    server_cpu: report.reads.as_ref().map(|_| server.cpu_seconds() - cpu),
                });
            }
            Ok(())
        };
    let mut rows = Vec::new();
    let url = server.url("bench/");
    for round in 0..rounds {
        run(Source::webdataset(&shards_dir)?, round, "disk", &mut rows)?;
        let opening = Instant::now();
        let source = Source::url(&url, UrlLayout::WebDataset, &remote)?;
        println!(
            "round {round}: the S3 source opened (every shard indexed) in {:.2} s",
            opening.elapsed().as_secs_f64()
        );
        run(source, round, "s3", &mut rows)?;
        let cache = work.join(format!("cache-{round}"));
        let cached = remote.clone().cache_dir(Some(cache.clone()));
        run(
            Source::url(&url, UrlLayout::WebDataset, &cached)?,
            round,
            "s3+cache",
            &mut rows,
        )?;
        let _ = std::fs::remove_dir_all(&cache);
    }
    print!("{}", table(&rows));
    let _ = std::fs::remove_dir_all(&work);
    Ok(())
}

fn table(rows: &[Row]) -> String {
    let mut out = format!(
        "{:>5} {:<9} {:>5} {:>7} {:>9} {:>7} {:>8} {:>8} {:>6} {:>7} {:>8}\n",
        "round",
        "source",
        "epoch",
        "images",
        "images/s",
        "x disk",
        "MB/s",
        "requests",
        "cache",
        "waited",
        "srv cpu"
    );
    for row in rows {
        let rate = row.images as f64 / row.seconds;
        let disk = rows
            .iter()
            .find(|r| r.source == "disk" && r.round == row.round && r.epoch == row.epoch)
            .map(|r| r.images as f64 / r.seconds);
        let (mbs, requests, cache, waited) = match &row.reads {
            Some(r) => (
                format!("{:.1}", r.bytes as f64 / 1e6 / row.seconds),
                r.requests.to_string(),
                format!("{:.0}%", r.cache_hit_rate() * 100.0),
                format!("{:.2}s", r.waited.as_secs_f64()),
            ),
            None => ("-".into(), "-".into(), "-".into(), "-".into()),
        };
        out.push_str(&format!(
            "{:>5} {:<9} {:>5} {:>7} {:>9.0} {:>7} {:>8} {:>8} {:>6} {:>7} {:>8}\n",
            row.round,
            row.source,
            row.epoch,
            row.images,
            rate,
            disk.map_or("-".into(), |d| format!("{:.2}", rate / d)),
            mbs,
            requests,
            cache,
            waited,
            row.server_cpu.map_or("-".into(), |c| format!("{c:.2}s")),
        ));
    }
    out
}

/// The images under `dir` (sorted, by extension) as WebDataset shards of `per_shard` samples
/// (the image and a `.cls` label), written to `out` and returned as (name, bytes).
fn write_shards(dir: &Path, out: &Path, per_shard: usize) -> Result<Vec<(String, Vec<u8>)>> {
    let images = images_under(dir)?;
    let mut shards = Vec::new();
    for (k, chunk) in images.chunks(per_shard.max(1)).enumerate() {
        let mut tar = Vec::new();
        for (i, path) in chunk.iter().enumerate() {
            let index = k * per_shard + i;
            let ext = path
                .extension()
                .map_or("jpg".into(), |e| e.to_string_lossy().to_ascii_lowercase());
            member(
                &mut tar,
                &format!("s{index:07}.{ext}"),
                &std::fs::read(path)?,
            );
            member(
                &mut tar,
                &format!("s{index:07}.cls"),
                format!("{}\n", index % 1000).as_bytes(),
            );
        }
        tar.extend([0u8; 1024]);
        let name = format!("shard-{k:05}.tar");
        std::fs::write(out.join(&name), &tar)?;
        shards.push((name, tar));
    }
    Ok(shards)
}
