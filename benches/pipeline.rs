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
//! RandomHorizontalFlip, instead of Resize(256) + CenterCrop(224)), `GPUFEED_BENCH_AUGMENT` (a
//! recipe, `torchvision-imagenet`, or a policy, `trivial-augment-wide`, `rand-augment:2:9`...:
//! the augmentations on top of the training transform, which it implies; the end-to-end row
//! then measures them, with labels made up for MixUp and CutMix), `GPUFEED_BENCH_DECODE`
//! (`hybrid`: the end-to-end row with the GPU's JPEG engines beside the CPU threads).

use gpufeed::{
    AugmentOptions, BatchOptions, Decode, DecodeOptions, Options, Recipe, ResizeOptions,
};
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
    let augment = match std::env::var("GPUFEED_BENCH_AUGMENT") {
        Ok(name) if !name.is_empty() => match (name.parse::<Recipe>(), name.parse()) {
            (Ok(recipe), _) => recipe.augment_options(),
            (_, Ok(policy)) => AugmentOptions::default().policy(policy),
            (Err(e), Err(_)) => {
                eprintln!("bench pipeline: GPUFEED_BENCH_AUGMENT: {e}, or a policy");
                std::process::exit(2);
            }
        },
        _ => AugmentOptions::default(),
    };
    let hybrid = std::env::var("GPUFEED_BENCH_DECODE").is_ok_and(|v| v == "hybrid");
    let train = std::env::var("GPUFEED_BENCH_TRAIN").is_ok_and(|v| v == "1") || augment.is_on();
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
            .augment(augment)
            .decode(DecodeOptions::default().lanes(if hybrid {
                Decode::Hybrid
            } else {
                Decode::Cpu
            }))
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
