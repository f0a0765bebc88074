//! `gpufeed run DIR --views PRESET`: every image decoded once and cut into the preset's views
//! by a pipeline of views (on the GPU when there is one, else on the CPU device), the summary
//! counting images and views; with `--save FILE.npy`, each view's pixels (`uint8`, `[images,
//! size, size, 3]`) in `FILE.view<K>.npy`, and what each view drew in `FILE.views.jsonl`. The
//! images go in the order the pipeline's `--shuffle` and `--shard` give; `--resume` and
//! `--state` work as for images.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use gpufeed::views::Views;
use gpufeed::{DType, Device, Layout, Options, Pipeline, PipelineState, Source, Tensor};
use serde_json::json;

use crate::Result;

/// What a views run is given.
pub struct ViewsRun<'a> {
    pub source: Source,
    pub views: Views,
    /// The batching (shuffle, shard and its balance, batch size), the device, dtype, layout,
    /// mean and std, the decode limits and the threads.
    pub options: Options,
    pub resume: Option<PipelineState>,
    /// Where to save the pipeline's state at the end (`--state`).
    pub state: Option<&'a Path>,
    pub epochs: u64,
    pub save: Option<&'a Path>,
    pub overwrite: bool,
    pub json: bool,
    /// Print where the time went, stage by stage (`--profile`).
    pub profile: bool,
    pub stop: &'a AtomicBool,
}

/// `FILE.npy`'s sibling `FILE<suffix>`.
fn sibling(npy: &Path, suffix: &str) -> PathBuf {
    let stem = npy.with_extension("");
    let mut name = stem.into_os_string();
    name.push(suffix);
    PathBuf::from(name)
}

/// The `u8` samples of a group's views from their f32 NHWC values: each inverted through the
/// normalize's affine and checked to normalize back to the same value (exact in f32).
fn unnormalize(tensor: &Tensor, affine: &gpufeed::Affine, out: &mut Vec<u8>) -> Result<()> {
    let values = tensor.to_host()?.to_f32_vec();
    out.reserve(values.len());
    for (k, &y) in values.iter().enumerate() {
        let c = k % 3;
        let x = ((y - affine.bias[c]) / affine.scale[c])
            .round()
            .clamp(0.0, 255.0) as u8;
        if affine.apply(c, x).to_bits() != y.to_bits() {
            return Err(format!("--save: the value {y} of a view is no normalized sample").into());
        }
        out.push(x);
    }
    Ok(())
}

/// What the run saw: images, each epoch's report (its skipped images with their reasons) and
/// time, and with `--save` the views' pixels and lines.
#[derive(Default)]
struct Seen {
    images: usize,
    /// Each epoch's report and its seconds, from its first batch asked for to its last batch's
    /// kernels done.
    epochs: Vec<(gpufeed::EpochReport, f64)>,
    /// The pipeline's build, then the first epoch up to its first batch's views done on their
    /// device.
    first_batch_seconds: Option<f64>,
    pixels: Vec<Vec<u8>>,
    lines: Vec<String>,
    interrupted: bool,
}

/// What the epochs' loop needs of the run.
struct Looping<'a> {
    views: &'a Views,
    epochs: u64,
    save: bool,
    stop: &'a AtomicBool,
}

/// Runs the pipeline's epochs from where it stands up to `run.epochs`; `names` are the images'
/// paths for the jsonl; `setup_seconds` is the pipeline's build's time.
fn run_epochs(
    run: &Looping,
    pipeline: &mut Pipeline,
    names: &[String],
    setup_seconds: f64,
) -> Result<Seen> {
    let count = run.views.count();
    let affine = pipeline.options().output.affine();
    let mut seen = Seen {
        pixels: vec![Vec::new(); count],
        ..Seen::default()
    };
    let first = pipeline.epoch();
    'epochs: for epoch in first..run.epochs {
        let started = Instant::now();
        if epoch > first {
            pipeline.next_epoch()?;
        }
        let mut last = None;
        while let Some(batch) = pipeline.next_batch()? {
            seen.images += batch.len();
            if seen.first_batch_seconds.is_none() {
                synchronize_views(&batch)?;
                seen.first_batch_seconds = Some(setup_seconds + started.elapsed().as_secs_f64());
            }
            if run.save {
                let tensors = batch.views().ok_or("a pipeline of views gave no views")?;
                let mut k = 0;
                for (tensor, group) in tensors.iter().zip(&run.views.groups) {
                    let mut samples = Vec::new();
                    unnormalize(tensor, &affine, &mut samples)?;
                    // [count, n, size, size, 3]: view j of the group for every image in turn.
                    let per_view = samples.len() / group.count.max(1) as usize;
                    for view in samples.chunks(per_view.max(1)) {
                        seen.pixels[k].extend_from_slice(view);
                        k += 1;
                    }
                }
                let draws = batch
                    .view_draws()
                    .ok_or("a pipeline of views drew no views")?;
                for (&index, draws) in batch.indices().iter().zip(draws) {
                    let path = names.get(index).cloned().unwrap_or_default();
                    for draw in draws {
                        let line = draw.json(index, epoch);
                        seen.lines
                            .push(format!("{{\"path\": {}, {}", json!(path), &line[1..]));
                    }
                }
            }
            let interrupted = run.stop.load(Ordering::Relaxed);
            last = Some(batch);
            if interrupted {
                seen.interrupted = true;
                break;
            }
        }
        // The epoch ends once its last batch's views are made.
        if let Some(batch) = &last {
            synchronize_views(batch)?;
        }
        let report = pipeline.epoch_report().clone();
        for e in &report.skipped {
            eprintln!("gpufeed: skipped {e}");
        }
        seen.epochs.push((report, started.elapsed().as_secs_f64()));
        if seen.interrupted {
            break 'epochs;
        }
    }
    Ok(seen)
}

/// Waits for the kernels that make `batch`'s views.
fn synchronize_views(batch: &gpufeed::Batch) -> Result<()> {
    match batch.views() {
        Some(views) => views.iter().try_for_each(|t| t.synchronize())?,
        None => batch.images().synchronize()?,
    }
    Ok(())
}

/// Writes `rows` images of `size` x `size` x 3 `uint8` as one `.npy`.
fn write_npy(path: &Path, pixels: &[u8], rows: usize, size: u32) -> Result<()> {
    let dict = format!(
        "{{'descr': '|u1', 'fortran_order': False, 'shape': ({rows}, {size}, {size}, 3), }}"
    );
    let mut header = dict.into_bytes();
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(b' ');
    }
    header.push(b'\n');
    let write = || -> std::io::Result<()> {
        let mut f = BufWriter::new(File::create(path)?);
        f.write_all(b"\x93NUMPY\x01\x00")?;
        f.write_all(&(header.len() as u16).to_le_bytes())?;
        f.write_all(&header)?;
        f.write_all(pixels)?;
        f.flush()
    };
    write().map_err(|e| format!("cannot write {}: {e}", path.display()).into())
}

/// The files `--save FILE.npy` writes for `views`.
fn save_files(npy: &Path, views: &Views) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = (0..views.count())
        .map(|k| sibling(npy, &format!(".view{k}.npy")))
        .collect();
    files.push(sibling(npy, ".views.jsonl"));
    files
}

/// Runs the epochs through a pipeline of views; prints the summary; returns the device the
/// views were made on.
pub fn run_views(run: ViewsRun) -> Result<Device> {
    let ViewsRun {
        source,
        views,
        mut options,
        resume,
        state,
        epochs,
        save,
        overwrite,
        json,
        profile,
        stop,
    } = run;
    views.validate()?;
    let count = views.count();
    if let Some(npy) = save {
        if !overwrite {
            if let Some(f) = save_files(npy, &views).iter().find(|f| f.exists()) {
                return Err(format!(
                    "--save: {} exists (give --overwrite to replace it)",
                    f.display()
                )
                .into());
            }
        }
        // f32 NHWC RGB: the views' u8 samples come back exactly from their values.
        options.output = options
            .output
            .dtype(DType::F32)
            .layout(Layout::Nhwc)
            .channel_order(gpufeed::ChannelOrder::Rgb);
    }
    // Each image's path (or id) for the jsonl, before the pipeline takes the source.
    let names: Vec<String> = match save {
        Some(_) => (0..source.len())
            .map(|i| match source.path(i) {
                Some(p) => p.display().to_string(),
                None => source.id(i).unwrap_or_default().to_string(),
            })
            .collect(),
        None => Vec::new(),
    };
    let build_started = Instant::now();
    let mut builder = Pipeline::builder()
        .source(source)
        .views(views.clone())
        .all_options(options);
    if let Some(state) = resume {
        builder = builder.resume(state);
    }
    let mut pipeline = builder.build().map_err(crate::run::flag_names)?;
    let setup_seconds = build_started.elapsed().as_secs_f64();
    if let Some(why) = pipeline.cpu_fallback() {
        eprintln!("gpufeed: views on the CPU: {why}");
    }
    let looping = Looping {
        views: &views,
        epochs,
        save: save.is_some(),
        stop,
    };
    let seen = run_epochs(&looping, &mut pipeline, &names, setup_seconds)?;
    let skipped: Vec<&gpufeed::ItemError> =
        seen.epochs.iter().flat_map(|(r, _)| &r.skipped).collect();
    // As `gpufeed run`'s: the epochs' time, the pipeline's build apart.
    let seconds: f64 = seen.epochs.iter().map(|(_, s)| s).sum();
    if let Some(path) = state {
        pipeline.state().save(path)?;
    }
    let mut saved = Vec::new();
    if let (Some(npy), false) = (save, seen.interrupted) {
        for (k, view) in seen.pixels.iter().enumerate() {
            let size = views.group_of(k).map_or(0, |g| g.size);
            let path = sibling(npy, &format!(".view{k}.npy"));
            write_npy(&path, view, seen.images, size)?;
            saved.push(path);
        }
        let path = sibling(npy, ".views.jsonl");
        let mut text = seen.lines.join("\n");
        text.push('\n');
        std::fs::write(&path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        saved.push(path);
    }
    let images = seen.images;
    let rate = images as f64 / seconds.max(1e-9);
    let device = pipeline.device_description().to_string();
    let decode = pipeline.decode_description();
    let stages = pipeline.profile();
    if json {
        out!(
            "{}",
            json!({
                "images": images,
                "views": images * count,
                "views_per_image": count,
                "spec": serde_json::from_str::<serde_json::Value>(&views.to_json()).unwrap_or_default(),
                "seed": views.seed,
                "skipped": skipped.len(),
                "errors": skipped.iter().map(|e| json!({"path": e.id, "reason": e.kind.to_string()})).collect::<Vec<_>>(),
                "epochs": crate::run::epochs_json(seen.epochs.iter().map(|(r, s)| (r, *s))),
                "setup_seconds": setup_seconds,
                "first_batch_seconds": seen.first_batch_seconds,
                "seconds": seconds,
                "images_per_s": rate,
                "views_per_s": rate * count as f64,
                "device": device,
                "decode": decode,
                "decoded_by": crate::run::decoded_by_json(seen.epochs.iter().map(|(r, _)| r)),
                "gpu_share": pipeline.gpu_share(),
                "profile": crate::run::profile_json(&stages),
                "interrupted": seen.interrupted,
                "saved": saved.iter().map(|p| p.display().to_string()).collect::<Vec<_>>(),
            })
        );
    } else {
        out!(
            "{images} images, {} views ({count} each), {} skipped in {seconds:.2} s \
             (the pipeline's build {setup_seconds:.2} s before): {rate:.1} images/s on {device}",
            images * count,
            skipped.len()
        );
        for e in &skipped {
            out!("skipped {}: {}", e.id, e.kind);
        }
        out!("decode: {decode}");
        for p in &saved {
            out!("saved {}", p.display());
        }
        if profile {
            out!("where the time went (seconds summed over threads):");
            for line in stages.to_string().lines() {
                out!("  {line}");
            }
        }
    }
    Ok(pipeline.options().runtime.device)
}
