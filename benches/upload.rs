//! `cargo bench --bench upload`: u8 vs f32 upload size and time, and the fused kernel against a
//! naive multi-pass conversion. The same code as `gpufeed bench`; see `gpufeed_bench::upload`.
//!
//! Environment: `GPUFEED_BENCH_BATCHES` (default 32,64,128,256), `GPUFEED_BENCH_RUNS` (50),
//! `GPUFEED_BENCH_OUT` (folder for upload.csv and upload.svg; default target/),
//! `GPUFEED_NCHW_GROUPS` (1..8) and `GPUFEED_STREAMING_STORES=1` (kernel variants to compare).

use gpufeed::cuda::NormalizeTuning;
use gpufeed_bench::upload::{self as bench, BenchOptions};

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` passes nothing special. Both run it.
    if let Err(e) = gpufeed::cuda::probe() {
        println!("bench upload: {e}\nbench upload: skipped (no CUDA device)");
        return;
    }
    let mut options = BenchOptions::default();
    if let Ok(list) = std::env::var("GPUFEED_BENCH_BATCHES") {
        options.batch_sizes = list
            .split(',')
            .filter_map(|s| s.trim().parse().ok())
            .collect();
    }
    if let Some(runs) = std::env::var("GPUFEED_BENCH_RUNS")
        .ok()
        .and_then(|r| r.parse().ok())
    {
        options.runs = runs;
    }
    let mut tuning = NormalizeTuning::default();
    if let Some(groups) = std::env::var("GPUFEED_NCHW_GROUPS")
        .ok()
        .and_then(|g| g.parse().ok())
    {
        tuning = tuning.nchw_groups(groups);
    }
    if std::env::var("GPUFEED_STREAMING_STORES").as_deref() == Ok("1") {
        tuning = tuning.streaming_stores(true);
    }
    options.tuning = tuning;
    let report = match bench::run(&options) {
        Ok(report) => report,
        Err(e) => {
            eprintln!("bench upload: {e}");
            std::process::exit(1);
        }
    };
    print!("{}", report.table());
    let out = std::path::PathBuf::from(
        std::env::var("GPUFEED_BENCH_OUT").unwrap_or_else(|_| "target".into()),
    );
    let _ = std::fs::create_dir_all(&out);
    let csv = out.join("upload.csv");
    let svg = out.join("upload.svg");
    match std::fs::write(&csv, report.csv())
        .map_err(|e| e.to_string())
        .and_then(|_| report.write_svg(&svg).map_err(|e| e.to_string()))
    {
        Ok(()) => println!("wrote {} and {}", csv.display(), svg.display()),
        Err(e) => eprintln!("bench upload: {e}"),
    }
}
