//! `cargo bench --bench resume`: how long a pipeline takes to hand out its first batch when it
//! begins an epoch, and when it resumes from a saved state halfway through the epoch or at its
//! last full batch (the last batch when the batch size divides the epoch, as it does 1,000,000),
//! for epochs of 10,000 to 1,000,000 images. A resume computes the epoch's order and
//! begins at the position; if it replayed the epoch instead, the last column would grow with the
//! epoch's size.
//!
//! The source is a path list that repeats the bundled photos (every path is a real file, so a
//! replay would decode them all). Timed: the pipeline's build (device, staging, the epoch's
//! order) and its first batch; the listing of the paths is timed apart.
//!
//! Environment: `GPUFEED_BENCH_SIZES` (default 10000,100000,1000000), `GPUFEED_BENCH_RUNS`
//! (default 5; the median is printed), `GPUFEED_BENCH_BATCH` (default 64),
//! `GPUFEED_BENCH_DEVICE` (`cpu`, default, or `cuda`; `hybrid` adds the GPU's JPEG engines with
//! the share 0.5).

use std::path::PathBuf;
use std::time::Instant;

use gpufeed::{Decode, Device, Pipeline, PipelineBuilder, PipelineState, Source};
use gpufeed_bench::median;

fn number_list(name: &str, default: &str) -> Vec<usize> {
    std::env::var(name)
        .unwrap_or_else(|_| default.into())
        .split(',')
        .filter_map(|s| s.trim().replace('_', "").parse().ok())
        .collect()
}

fn source(n: usize) -> Source {
    let photos: Vec<PathBuf> = ["rocket.jpg", "retina.jpg", "coffee.png", "camera.png"]
        .iter()
        .map(|name| PathBuf::from("assets").join(name))
        .collect();
    Source::paths((0..n).map(|i| photos[i % photos.len()].clone()))
}

/// `state` moved to the beginning of batch `batch` of its epoch, as a single rank that skipped
/// nothing would have saved it there.
fn state_at(state: &PipelineState, batch: usize, batch_size: usize) -> PipelineState {
    let mut value: serde_json::Value = match serde_json::from_str(&state.to_json()) {
        Ok(value) => value,
        Err(e) => fail(&format!("the state is not JSON: {e}")),
    };
    let rows = batch * batch_size;
    for field in ["position", "rows", "global_position"] {
        value[field] = rows.into();
    }
    value["batches"] = batch.into();
    PipelineState::from_json(&value.to_string()).unwrap_or_else(|e| fail(&e.to_string()))
}

fn fail(message: &str) -> ! {
    eprintln!("bench resume: {message}");
    std::process::exit(1);
}

/// Seconds from the build to the first batch (its images ready), and the listing's seconds.
fn first_batch(builder: impl Fn(Source) -> PipelineBuilder, n: usize) -> (f64, f64, Pipeline) {
    let listed = Instant::now();
    let source = source(n);
    let listing = listed.elapsed().as_secs_f64();
    let started = Instant::now();
    let mut pipeline = builder(source)
        .build()
        .unwrap_or_else(|e| fail(&e.to_string()));
    let batch = match pipeline.next_batch() {
        Ok(Some(batch)) => batch,
        Ok(None) => fail("no batch"),
        Err(e) => fail(&e.to_string()),
    };
    if let Err(e) = batch.images().synchronize() {
        fail(&e.to_string());
    }
    (started.elapsed().as_secs_f64(), listing, pipeline)
}

fn main() {
    let sizes = number_list("GPUFEED_BENCH_SIZES", "10000,100000,1000000");
    let runs = number_list("GPUFEED_BENCH_RUNS", "5")
        .first()
        .copied()
        .unwrap_or(5)
        .max(1);
    let batch_size = number_list("GPUFEED_BENCH_BATCH", "64")
        .first()
        .copied()
        .unwrap_or(64)
        .max(1);
    let device = std::env::var("GPUFEED_BENCH_DEVICE").unwrap_or_else(|_| "cpu".into());
    let builder = |source: Source| {
        let builder = Pipeline::builder()
            .source(source)
            .imagenet_train(32, 1)
            .batch_size(batch_size);
        match device.as_str() {
            "cuda" => builder.device(Device::Cuda(0)),
            "hybrid" => builder
                .device(Device::Cuda(0))
                .decode(Decode::Hybrid)
                .gpu_share(0.5),
            _ => builder.device(Device::Cpu),
        }
    };
    println!(
        "bench resume: build to first batch, {device} device, batches of {batch_size}, \
         RandomResizedCrop(32) + flip, shuffled; median of {runs} runs"
    );
    println!(
        "{:>10} {:>10} {:>12} {:>12} {:>12} {:>11}",
        "images", "listing s", "start s", "middle s", "last s", "last/start"
    );
    for &n in &sizes {
        let batches = n / batch_size;
        if batches == 0 {
            fail(&format!("{n} images do not make a batch of {batch_size}"));
        }
        let (mut listing, mut start, mut middle, mut last) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for _ in 0..runs {
            let (seconds, listed, pipeline) = first_batch(builder, n);
            let template = pipeline.state();
            drop(pipeline);
            start.push(seconds);
            listing.push(listed);
            for (at, times) in [(batches / 2, &mut middle), (batches - 1, &mut last)] {
                let state = state_at(&template, at, batch_size);
                let (seconds, _, mut pipeline) =
                    first_batch(|source| builder(source).resume(state.clone()), n);
                if at == batches - 1 {
                    // At most a partial batch after the last full one.
                    let rest = std::iter::from_fn(|| pipeline.next_batch().ok().flatten())
                        .map(|batch| batch.len())
                        .collect::<Vec<_>>();
                    if rest.iter().sum::<usize>() != n % batch_size {
                        fail("the resumed batch was not the epoch's last full batch");
                    }
                }
                times.push(seconds);
            }
        }
        let (start, last) = (median(&mut start), median(&mut last));
        println!(
            "{n:>10} {:>10.3} {start:>12.3} {:>12.3} {last:>12.3} {:>11.2}",
            median(&mut listing),
            median(&mut middle),
            last / start
        );
    }
}
