//! `cargo bench --bench patches`: patch-sequence outputs beside fixed 224 x 224 crops of the
//! same images, whole epochs on the GPU and on the CPU device (see `gpufeed_bench::patches`).
//!
//! Environment: `GPUFEED_BENCH_DIR` (default assets/; use a corpus of 2,000+ images, e.g. from
//! make-corpus), `GPUFEED_BENCH_EPOCHS` (default 5, after one not counted),
//! `GPUFEED_BENCH_BATCH` (images per batch, default 256), `GPUFEED_BENCH_DECODE` (`cpu`,
//! `hybrid` or `auto`, the default: the GPU rows' decode lanes), `GPUFEED_BENCH_CPU_THREADS`
//! (threads of the CPU-device rows, default 1; 0 leaves them out), `GPUFEED_BENCH_IN_MEMORY` (1
//! reads the files into memory first), `GPUFEED_BENCH_PRESETS` (comma-separated, default
//! `qwen2-vl:50176,siglip2-naflex:256,timm-naflex`: Qwen2-VL with `max_pixels` 50,176, about a
//! 224 x 224 crop's pixels; SigLIP2 with `max_patches`; timm's defaults; `qwen2-vl` alone is its
//! default of 1,003,520 pixels).

use gpufeed::{BatchOptions, DType, Decode, DecodeOptions, Options, OutputOptions};
use gpufeed_bench::patches::{patches, PatchBenchOptions};
use gpufeed_bench::{env_or, patches::preset_spec};

fn main() {
    let specs = std::env::var("GPUFEED_BENCH_PRESETS")
        .unwrap_or_else(|_| "qwen2-vl:50176,siglip2-naflex:256,timm-naflex".into());
    let presets = match specs.split(',').map(str::trim).map(preset_spec).collect() {
        Ok(presets) => presets,
        Err(e) => {
            eprintln!("bench patches: GPUFEED_BENCH_PRESETS: {e}");
            std::process::exit(2);
        }
    };
    let decode: Decode = env_or("GPUFEED_BENCH_DECODE", Decode::Auto);
    let device = match gpufeed::cuda::probe() {
        Ok(_) => Some(0),
        Err(e) => {
            println!("bench patches: {e}; measuring the CPU device only");
            None
        }
    };
    let options = PatchBenchOptions {
        dir: std::env::var("GPUFEED_BENCH_DIR")
            .unwrap_or_else(|_| "assets".into())
            .into(),
        options: Options::default()
            .batching(BatchOptions::default().batch_size(env_or("GPUFEED_BENCH_BATCH", 256)))
            .decode(DecodeOptions::default().lanes(decode))
            .output(OutputOptions::default().dtype(DType::F16)),
        presets,
        device,
        cpu_threads: env_or("GPUFEED_BENCH_CPU_THREADS", 1),
        epochs: env_or("GPUFEED_BENCH_EPOCHS", 5),
        in_memory: env_or("GPUFEED_BENCH_IN_MEMORY", 0) == 1,
    };
    match patches(&options) {
        Ok(report) => print!("{}", report.table()),
        Err(e) => {
            eprintln!("bench patches: {e}");
            std::process::exit(1);
        }
    }
}
