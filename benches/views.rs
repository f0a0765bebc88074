//! `cargo bench --bench views`: a pipeline of DINOv2's views (2 global of 224, 8 local of 96,
//! each image decoded once) beside the one-crop training pipeline (`RandomResizedCrop(224)` and
//! a flip) over the same images on the same device, whole epochs each: images/s and views/s.
//! The bar: the views at least half the one-crop rate in images/s, and ten times
//! `benches/views-baseline.py`'s DataLoader with 16 workers.
//!
//! Environment: `GPUFEED_BENCH_DIR` (default assets/; use a corpus of 2,000+ images, e.g. from
//! make-corpus), `GPUFEED_BENCH_EPOCHS` (default 3, after one not counted),
//! `GPUFEED_BENCH_BATCH` (images per batch, default 128), `GPUFEED_BENCH_PRESET` (`dinov2`, the
//! default, or `simclr`), `GPUFEED_BENCH_DECODE` (the decode lanes of the views and of the
//! one-crop run: `cpu`, `hybrid` or `auto`, the default). The views are measured a second time
//! with the CPU lane alone (`--decode cpu`), for what the GPU decode lane adds.

use std::time::Instant;

use gpufeed::views::{Views, ViewsPreset};
use gpufeed::{DType, Decode, Device, Pipeline, PipelineBuilder, Source};
use gpufeed_bench::{env_or, images_under};

/// Runs one epoch not counted, then `epochs`; the images a second.
fn rate(builder: PipelineBuilder, epochs: u64) -> Result<(f64, String), gpufeed::Error> {
    let mut pipeline = builder.build()?;
    let mut images = 0usize;
    let mut started = Instant::now();
    for epoch in 0..=epochs {
        if epoch == 1 {
            images = 0;
            started = Instant::now();
        }
        for batch in &mut pipeline {
            let batch = batch?;
            images += batch.len();
            // The batch's kernels done before it counts.
            match batch.views() {
                Some(views) => views.iter().try_for_each(|t| t.synchronize())?,
                None => batch.images().synchronize()?,
            }
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    Ok((
        images as f64 / seconds.max(1e-9),
        pipeline.decode_description(),
    ))
}

fn main() {
    let dir: std::path::PathBuf = std::env::var("GPUFEED_BENCH_DIR")
        .unwrap_or_else(|_| "assets".into())
        .into();
    let paths = match images_under(&dir) {
        Ok(paths) => paths,
        Err(e) => {
            eprintln!("bench views: {e}");
            std::process::exit(2);
        }
    };
    let epochs: u64 = env_or("GPUFEED_BENCH_EPOCHS", 3);
    let batch: usize = env_or("GPUFEED_BENCH_BATCH", 128);
    let preset: ViewsPreset = env_or("GPUFEED_BENCH_PRESET", ViewsPreset::Dinov2);
    let decode: Decode = env_or("GPUFEED_BENCH_DECODE", Decode::Auto);
    let device = match gpufeed::cuda::probe() {
        Ok(_) => Device::Cuda(0),
        Err(e) => {
            println!("bench views: {e}; measuring the CPU device");
            Device::Cpu
        }
    };
    let views = Views::preset(preset).seed(1);
    let count = views.count();
    let base = || {
        Pipeline::builder()
            .source(Source::paths(paths.clone()))
            .batch_size(batch)
            .dtype(DType::F16)
            .device(device)
    };
    let runs = [
        (
            "views",
            base().views(views.clone()).shuffle(1).decode(decode),
        ),
        (
            "views --decode cpu",
            base().views(views).shuffle(1).decode(Decode::Cpu),
        ),
        (
            "one-crop --train",
            base().imagenet_train(224, 1).decode(decode),
        ),
    ];
    println!(
        "bench views: {} images of {}, batch {batch}, {epochs} epochs after one not counted",
        paths.len(),
        dir.display()
    );
    let mut rates = Vec::new();
    for (name, builder) in runs {
        match rate(builder, epochs) {
            Ok((images_per_s, decode)) => {
                let views_per_s = match name.starts_with("views") {
                    true => format!(
                        "{:>10.0} views/s ({count} each)",
                        images_per_s * count as f64
                    ),
                    false => String::new(),
                };
                println!("{name:<18} {images_per_s:>10.1} images/s {views_per_s}  [{decode}]");
                rates.push(images_per_s);
            }
            Err(e) => {
                eprintln!("bench views: {name}: {e}");
                std::process::exit(1);
            }
        }
    }
    println!(
        "{preset} views at {:.2} of the one-crop train rate (the bar: 0.5 or more)",
        rates[0] / rates[2].max(1e-9)
    );
}
