//! `cargo bench --bench views_colour`: the views' colour calls of a batch (DINOv2's by default:
//! 256 images, 2 views of 224 and 8 of 96 each, their drawn jitter, grayscale, blur and
//! solarize) on the GPU (`gpufeed::cuda::ViewColourKernel`, one launch per view size, 2 for
//! DINOv2) beside `gpufeed::views::apply_view_ops` on every CPU core (rayon, one view a
//! task). The same bytes come out of both (checked); the table gives the median time of a
//! batch, then the GPU's time for each kind of call alone (the batch's views keeping only their
//! calls of that kind) and the kernel's registers and blocks per multiprocessor.
//!
//! Environment: `GPUFEED_BENCH_VIEWS` (`dinov2` or `simclr`, default `dinov2`),
//! `GPUFEED_BENCH_IMAGES` (default 256), `GPUFEED_BENCH_REPEATS` (default 10, after one not
//! counted).

use std::time::Instant;

use gpufeed::views::{apply_view_ops, ViewOp, Views, ViewsPreset};
use gpufeed_bench::upload::random_bytes;
use gpufeed_bench::{env_or, median};
use rayon::prelude::*;

/// The views of one size in a batch: their side, their pixels one after the other, their calls.
struct Group {
    size: usize,
    pixels: Vec<u8>,
    calls: Vec<Vec<ViewOp>>,
}

fn main() {
    let preset: ViewsPreset = env_or("GPUFEED_BENCH_VIEWS", ViewsPreset::Dinov2);
    let images: usize = env_or("GPUFEED_BENCH_IMAGES", 256);
    let repeats: usize = env_or("GPUFEED_BENCH_REPEATS", 10).max(1);
    let views = Views::preset(preset).seed(1);
    let groups = batch(&views, images);
    let count: usize = groups.iter().map(|g| g.calls.len()).sum();
    println!(
        "views_colour: {preset}, {images} images, {count} views ({}), median of {repeats}",
        groups
            .iter()
            .map(|g| format!("{} x {}", g.calls.len(), g.size))
            .collect::<Vec<_>>()
            .join(" + ")
    );
    println!("{:<44} {:>12} {:>12}", "", "ms / batch", "images / s");
    let row = |name: &str, ms: f64| {
        println!(
            "{name:<44} {ms:>12.2} {:>12.0}",
            images as f64 / (ms / 1000.0)
        );
    };
    let cpu = cpu_times(&groups, repeats);
    row(
        &format!(
            "apply_view_ops, {} CPU threads",
            rayon::current_num_threads()
        ),
        cpu,
    );
    match gpu_times(&groups, repeats) {
        Ok(gpu) => {
            row("ViewColourKernel, GPU", gpu);
            println!("GPU speed-up over the CPU threads: {:.1}x", cpu / gpu);
        }
        Err(e) => {
            println!("ViewColourKernel, GPU: not measured: {e}");
            return;
        }
    }
    for (name, keep) in KINDS {
        let alone: Vec<Group> = groups
            .iter()
            .map(|g| Group {
                size: g.size,
                pixels: g.pixels.clone(),
                calls: g
                    .calls
                    .iter()
                    .map(|ops| ops.iter().copied().filter(keep).collect())
                    .collect(),
            })
            .collect();
        let calls: usize = alone.iter().flat_map(|g| &g.calls).map(Vec::len).sum();
        match gpu_times(&alone, repeats) {
            Ok(ms) => row(&format!("  GPU, {name} alone ({calls} calls)"), ms),
            Err(e) => println!("  GPU, {name} alone: not measured: {e}"),
        }
    }
    if let Err(e) = footprints(&groups) {
        println!("the kernel's footprint: not read: {e}");
    }
}

/// The kinds of call timed alone.
type Keep = fn(&ViewOp) -> bool;
const KINDS: [(&str, Keep); 7] = [
    ("brightness", |op| matches!(op, ViewOp::Brightness(_))),
    ("contrast", |op| matches!(op, ViewOp::Contrast(_))),
    ("saturation", |op| matches!(op, ViewOp::Saturation(_))),
    ("hue", |op| matches!(op, ViewOp::Hue(_))),
    ("grayscale", |op| matches!(op, ViewOp::Grayscale)),
    ("blur", |op| matches!(op, ViewOp::Blur { .. })),
    ("solarize", |op| matches!(op, ViewOp::Solarize(_))),
];

/// The kernel's registers, local memory and blocks per multiprocessor for each view size.
fn footprints(groups: &[Group]) -> Result<(), Box<dyn std::error::Error>> {
    let stream = gpufeed::cuda::new_stream(0)?;
    let colour = gpufeed::cuda::ViewColourKernel::new(&stream)?;
    for group in groups {
        let f = colour.footprint(group.size, group.size)?;
        println!(
            "the kernel for {0} x {0} views: {1} registers and {2} bytes of local memory a \
             thread, {3} bytes of shared memory, blocks of {4} threads, {5} a multiprocessor",
            group.size,
            f.registers,
            f.local_bytes,
            f.shared_bytes,
            f.threads,
            f.blocks_per_multiprocessor
        );
    }
    Ok(())
}

/// The batch's views by size: noise pixels and each view's drawn calls.
fn batch(views: &Views, images: usize) -> Vec<Group> {
    let mut first = 0;
    let mut groups = Vec::new();
    for (g, group) in views.groups.iter().enumerate() {
        let size = group.size as usize;
        let count = group.count as usize;
        let calls: Vec<Vec<ViewOp>> = (0..images)
            .flat_map(|index| (first..first + count).map(move |view| (index, view)))
            .filter_map(|(index, view)| views.draw(640, 480, index, 0, view).map(|d| d.ops))
            .collect();
        let pixels = random_bytes(calls.len() * size * size * 3, g as u64 + 1);
        first += count;
        // Views of one size are coloured in one launch, whatever their group.
        match groups
            .iter_mut()
            .find(|have: &&mut Group| have.size == size)
        {
            Some(have) => {
                have.pixels.extend_from_slice(&pixels);
                have.calls.extend(calls);
            }
            None => groups.push(Group {
                size,
                pixels,
                calls,
            }),
        }
    }
    groups
}

/// The median time, in milliseconds, of the batch's calls on every CPU core.
fn cpu_times(groups: &[Group], repeats: usize) -> f64 {
    let mut times = Vec::new();
    for repeat in 0..=repeats {
        let mut work: Vec<Vec<u8>> = groups.iter().map(|g| g.pixels.clone()).collect();
        let start = Instant::now();
        for (group, pixels) in groups.iter().zip(&mut work) {
            let (size, bytes) = (group.size, group.size * group.size * 3);
            pixels
                .par_chunks_mut(bytes)
                .zip(&group.calls)
                .for_each(|(view, ops)| {
                    if let Err(e) = apply_view_ops(ops, view, size, size) {
                        panic!("apply_view_ops: {e}");
                    }
                });
        }
        if repeat > 0 {
            times.push(start.elapsed().as_secs_f64() * 1000.0);
        }
    }
    median(&mut times)
}

/// The median time, in milliseconds, of the batch's calls on GPU 0 (the pixels already there,
/// the calls' plan uploaded by each call, as a pipeline would).
fn gpu_times(groups: &[Group], repeats: usize) -> Result<f64, Box<dyn std::error::Error>> {
    gpufeed::cuda::probe()?;
    let stream = gpufeed::cuda::new_stream(0)?;
    let mut colour = gpufeed::cuda::ViewColourKernel::new(&stream)?;
    let pristine = groups
        .iter()
        .map(|g| stream.clone_htod(&g.pixels))
        .collect::<Result<Vec<_>, _>>()?;
    let mut work = groups
        .iter()
        .map(|g| stream.clone_htod(&g.pixels))
        .collect::<Result<Vec<_>, _>>()?;
    let calls: Vec<Vec<&[ViewOp]>> = groups
        .iter()
        .map(|g| g.calls.iter().map(Vec::as_slice).collect())
        .collect();
    let mut times = Vec::new();
    for repeat in 0..=repeats {
        for (from, to) in pristine.iter().zip(&mut work) {
            stream.memcpy_dtod(from, to)?;
        }
        stream.synchronize()?;
        let start = Instant::now();
        for ((group, pixels), calls) in groups.iter().zip(&mut work).zip(&calls) {
            colour.apply(&mut pixels.slice_mut(..), group.size, group.size, calls)?;
        }
        stream.synchronize()?;
        if repeat > 0 {
            times.push(start.elapsed().as_secs_f64() * 1000.0);
        }
    }
    // The bytes are the CPU's: the last repeat's views against apply_view_ops.
    for ((group, pixels), calls) in groups.iter().zip(&work).zip(&calls) {
        let got = stream.clone_dtoh(pixels)?;
        let bytes = group.size * group.size * 3;
        let mut want = group.pixels.clone();
        want.par_chunks_mut(bytes)
            .zip(calls)
            .for_each(|(view, ops)| {
                if let Err(e) = apply_view_ops(ops, view, group.size, group.size) {
                    panic!("apply_view_ops: {e}");
                }
            });
        assert!(
            got == want,
            "the GPU's views of {} differ from apply_view_ops's",
            group.size
        );
    }
    Ok(median(&mut times))
}
