//! `cargo bench --bench pipeline`: the CPU stage at 1 thread and at every core, and the whole
//! pipeline on the GPU, over a folder (see `gpufeed_bench::pipeline`).
//!
//! Environment: `GPUFEED_BENCH_DIR` (default assets/; use a corpus of 2,000+ images, e.g. from
//! make-corpus), `GPUFEED_BENCH_THREADS` (default 1,0; 0 is one per core),
//! `GPUFEED_BENCH_PASSES` (CPU-stage passes, default 3), `GPUFEED_BENCH_EPOCHS` (end-to-end
//! epochs, default 10), `GPUFEED_BENCH_BATCH` (images per batch, default 256),
//! `GPUFEED_BENCH_WHOLE` (0 leaves out the one-thread row with JPEGs decoded whole),
//! `GPUFEED_BENCH_IN_MEMORY` (1 reads the files into memory first: no file reads timed),
//! `GPUFEED_BENCH_TRAIN` (1: torchvision's ImageNet training transform, RandomResizedCrop(224) +
//! RandomHorizontalFlip, instead of Resize(256) + CenterCrop(224)).

use gpufeed::{BatchOptions, Options, ResizeOptions};
use gpufeed_bench::pipeline::{pipeline, PipelineBenchOptions};

fn main() {
    let dir = std::env::var("GPUFEED_BENCH_DIR").unwrap_or_else(|_| "assets".into());
    let threads = std::env::var("GPUFEED_BENCH_THREADS")
        .unwrap_or_else(|_| "1,0".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let passes = std::env::var("GPUFEED_BENCH_PASSES")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(3);
    let epochs = std::env::var("GPUFEED_BENCH_EPOCHS")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(10);
    let batch_size = std::env::var("GPUFEED_BENCH_BATCH")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(256);
    let in_memory = std::env::var("GPUFEED_BENCH_IN_MEMORY").is_ok_and(|v| v == "1");
    let train = std::env::var("GPUFEED_BENCH_TRAIN").is_ok_and(|v| v == "1");
    let whole_decode_row = std::env::var("GPUFEED_BENCH_WHOLE").map_or(true, |v| v != "0");
    let device = match gpufeed::cuda::probe() {
        Ok(_) => Some(0),
        Err(e) => {
            println!("bench pipeline: {e}; measuring the CPU stage only");
            None
        }
    };
    let options = PipelineBenchOptions {
        dir: dir.into(),
        options: Options::default()
            .batching(BatchOptions::default().batch_size(batch_size))
            .resize(if train {
                ResizeOptions::imagenet_train(224, 0)
            } else {
                ResizeOptions::default()
            }),
        threads,
        device,
        passes,
        epochs,
        in_memory,
        whole_decode_row,
    };
    match pipeline(&options) {
        Ok(report) => print!("{}", report.table()),
        Err(e) => {
            eprintln!("bench pipeline: {e}");
            std::process::exit(1);
        }
    }
}
