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
//! server, default 0: one per core), `GPUFEED_BENCH_SERVE_DECODE` (the GPU rows' decoding,
//! comma-separated, default `auto,cpu`: the GPU decode lane beside the CPU threads, then the
//! CPU threads alone; the `cpu+gpu` column says how many images of a request each decoded),
//! `GPUFEED_BENCH_CPU_THREADS` (threads of the CPU-device
//! rows, default 2; 0 leaves them out), `GPUFEED_BENCH_PRESETS` (comma-separated, default
//! `qwen2-vl,siglip2-naflex`: each preset's defaults; `qwen2-vl:50176` sets `max_pixels`,
//! `siglip2-naflex:1024` sets `max_patches`).

use gpufeed::{DType, Decode};
use gpufeed_bench::serve::{serve, ServeBenchOptions};
use gpufeed_bench::{env_or, patches::preset_spec};

fn main() {
    let specs =
        std::env::var("GPUFEED_BENCH_PRESETS").unwrap_or_else(|_| "qwen2-vl,siglip2-naflex".into());
    let presets = match specs.split(',').map(str::trim).map(preset_spec).collect() {
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
    let decodes = std::env::var("GPUFEED_BENCH_SERVE_DECODE").unwrap_or_else(|_| "auto,cpu".into());
    let gpu_decodes: Vec<Decode> = match decodes.split(',').map(|s| s.trim().parse()).collect() {
        Ok(decodes) => decodes,
        Err(e) => {
            eprintln!("bench serve: GPUFEED_BENCH_SERVE_DECODE: {e}");
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
        gpu_threads: env_or("GPUFEED_BENCH_THREADS", 0),
        gpu_decodes,
        cpu_threads: env_or("GPUFEED_BENCH_CPU_THREADS", 2),
        sizes,
        requests: env_or("GPUFEED_BENCH_REQUESTS", 200),
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
