//! `cargo bench --bench serve`: the patch server's latency, bytes in memory to packed patches on
//! the device (p50 and p99 per request), for requests of 1, 8 and 32 images cycling through a
//! folder and for one JPEG of about a megapixel, on the GPU and on the CPU device (see
//! `gpufeed_bench::serve`; `benches/serve-baseline.py` times transformers' processors on the
//! same requests).
//!
//! Environment: `GPUFEED_BENCH_DIR` (default assets/), `GPUFEED_BENCH_LARGE` (the one-JPEG
//! row's file; default the folder's JPEG nearest to 1,000,000 pixels), `GPUFEED_BENCH_REQUESTS`
//! (requests timed per row, default 200), `GPUFEED_BENCH_SIZES` (images per request,
//! comma-separated, default `1,8,32`), `GPUFEED_BENCH_THREADS` (CPU threads of the GPU rows'
//! server, default 0: one per core), `GPUFEED_BENCH_CPU_THREADS` (threads of the CPU-device
//! rows, default 2; 0 leaves them out), `GPUFEED_BENCH_PRESETS` (comma-separated, default
//! `qwen2-vl,siglip2-naflex`: each preset's defaults; `qwen2-vl:50176` sets `max_pixels`,
//! `siglip2-naflex:1024` sets `max_patches`).

use gpufeed::patches::{Patches, Preset};
use gpufeed::DType;
use gpufeed_bench::serve::{serve, ServeBenchOptions};

fn env<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// `name[:budget]`: a preset, with its `max_pixels` (Qwen2-VL) or `max_patches` (SigLIP2).
fn preset(spec: &str) -> Result<(String, Patches), String> {
    let (name, budget) = match spec.split_once(':') {
        Some((name, budget)) => (name, Some(budget)),
        None => (spec, None),
    };
    let preset: Preset = name.parse().map_err(|e| format!("{e}"))?;
    let budget = budget
        .map(|b| b.parse::<u64>().map_err(|e| format!("{spec}: {e}")))
        .transpose()?;
    let patches = match (preset, budget) {
        (Preset::Qwen2Vl, Some(pixels)) => Patches::qwen2_vl().max_pixels(pixels),
        (Preset::Siglip2Naflex, Some(n)) => Patches::siglip2_naflex().max_patches(n as u32),
        (preset, _) => Patches::preset(preset),
    };
    Ok((spec.to_string(), patches))
}

fn main() {
    let specs =
        std::env::var("GPUFEED_BENCH_PRESETS").unwrap_or_else(|_| "qwen2-vl,siglip2-naflex".into());
    let presets = match specs.split(',').map(str::trim).map(preset).collect() {
        Ok(presets) => presets,
        Err(e) => {
            eprintln!("bench serve: GPUFEED_BENCH_PRESETS: {e}");
            std::process::exit(2);
        }
    };
    let sizes = std::env::var("GPUFEED_BENCH_SIZES").unwrap_or_else(|_| "1,8,32".into());
    let sizes: Vec<usize> = match sizes.split(',').map(|s| s.trim().parse()).collect() {
        Ok(sizes) => sizes,
        Err(e) => {
            eprintln!("bench serve: GPUFEED_BENCH_SIZES: {e}");
            std::process::exit(2);
        }
    };
    let device = match gpufeed::cuda::probe() {
        Ok(_) => Some(0),
        Err(e) => {
            println!("bench serve: {e}; measuring the CPU device only");
            None
        }
    };
    let options = ServeBenchOptions {
        dir: std::env::var("GPUFEED_BENCH_DIR")
            .unwrap_or_else(|_| "assets".into())
            .into(),
        presets,
        device,
        gpu_threads: env("GPUFEED_BENCH_THREADS", 0),
        cpu_threads: env("GPUFEED_BENCH_CPU_THREADS", 2),
        sizes,
        requests: env("GPUFEED_BENCH_REQUESTS", 200),
        large: std::env::var("GPUFEED_BENCH_LARGE").ok().map(Into::into),
        dtype: DType::F16,
    };
    match serve(&options) {
        Ok(report) => print!("{}", report.table()),
        Err(e) => {
            eprintln!("bench serve: {e}");
            std::process::exit(1);
        }
    }
}
