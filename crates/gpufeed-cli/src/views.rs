//! `gpufeed run DIR --views PRESET`: every image decoded once and cut into the preset's views on
//! the CPU, the summary counting images and views; with `--save FILE.npy`, each view's pixels
//! (`uint8`, `[images, size, size, 3]`) in `FILE.view<K>.npy`, and what each view drew in
//! `FILE.views.jsonl`. The images go in the order a pipeline with the same `--shuffle` and
//! `--shard` goes through.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use gpufeed::views::Views;
use gpufeed::{BatchOptions, DecodeOptions, Source};
use serde_json::json;

use crate::Result;

/// What a views run is given.
pub struct ViewsRun<'a> {
    pub source: &'a Source,
    pub views: Views,
    pub decode: DecodeOptions,
    /// The shuffle, the shard and its balance.
    pub batching: BatchOptions,
    pub epochs: u64,
    pub save: Option<&'a Path>,
    pub overwrite: bool,
    pub json: bool,
    pub stop: &'a AtomicBool,
}

/// `FILE.npy`'s sibling `FILE<suffix>`.
fn sibling(npy: &Path, suffix: &str) -> PathBuf {
    let stem = npy.with_extension("");
    let mut name = stem.into_os_string();
    name.push(suffix);
    PathBuf::from(name)
}

/// One image's views: their pixels and their lines of the jsonl.
type Rendered = (Vec<Vec<u8>>, Vec<String>);

/// Renders images `indices` of `source` on `threads` threads, in order; a bad image is `Err`
/// with its message.
fn render_chunk(
    run: &ViewsRun,
    indices: &[usize],
    epoch: u64,
) -> Vec<std::result::Result<Rendered, String>> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let per = indices.len().div_ceil(threads).max(1);
    std::thread::scope(|scope| {
        let handles: Vec<_> = indices
            .chunks(per)
            .map(|part| {
                scope.spawn(move || {
                    part.iter()
                        .map(|&index| {
                            let bytes = run.source.read(index).map_err(|e| e.to_string())?;
                            let views = gpufeed::cpu::render_views(
                                &bytes,
                                &run.decode,
                                &run.views,
                                index,
                                epoch,
                            )
                            .map_err(|e| {
                                let id = run.source.id(index).unwrap_or_default();
                                format!("{id}: {e}")
                            })?;
                            let path = match run.source.path(index) {
                                Some(p) => p.display().to_string(),
                                None => run.source.id(index).unwrap_or_default().to_string(),
                            };
                            let lines = views
                                .iter()
                                .map(|v| {
                                    let line = v.draw.json(index, epoch);
                                    format!("{{\"path\": {}, {}", json!(path), &line[1..])
                                })
                                .collect();
                            Ok((views.into_iter().map(|v| v.pixels).collect(), lines))
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| {
                h.join()
                    .unwrap_or_else(|_| vec![Err("a render thread panicked".to_string())])
            })
            .collect()
    })
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

/// Runs every epoch over every image; prints the summary.
pub fn run_views(run: &ViewsRun) -> Result<()> {
    run.views.validate()?;
    let count = run.views.count();
    if let Some(npy) = run.save {
        if !run.overwrite {
            if let Some(f) = save_files(npy, &run.views).iter().find(|f| f.exists()) {
                return Err(format!(
                    "--save: {} exists (give --overwrite to replace it)",
                    f.display()
                )
                .into());
            }
        }
    }
    let started = Instant::now();
    let mut pixels: Vec<Vec<u8>> = vec![Vec::new(); count];
    let mut lines = Vec::new();
    let (mut images, mut errors) = (0usize, 0usize);
    'epochs: for epoch in 0..run.epochs {
        let order = gpufeed::epoch_order(run.source, &run.batching, epoch);
        for chunk in order.chunks(256) {
            if run.stop.load(Ordering::Relaxed) {
                break 'epochs;
            }
            for rendered in render_chunk(run, chunk, epoch) {
                match rendered {
                    Ok((views, image_lines)) => {
                        images += 1;
                        if run.save.is_some() {
                            for (k, v) in views.into_iter().enumerate() {
                                pixels[k].extend_from_slice(&v);
                            }
                            lines.extend(image_lines);
                        }
                    }
                    Err(e) => {
                        errors += 1;
                        eprintln!("gpufeed: skipped {e}");
                    }
                }
            }
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let mut saved = Vec::new();
    if let Some(npy) = run.save {
        for (k, view) in pixels.iter().enumerate() {
            let size = run.views.group_of(k).map_or(0, |g| g.size);
            let path = sibling(npy, &format!(".view{k}.npy"));
            write_npy(&path, view, images, size)?;
            saved.push(path);
        }
        let path = sibling(npy, ".views.jsonl");
        let mut text = lines.join("\n");
        text.push('\n');
        std::fs::write(&path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        saved.push(path);
    }
    let rate = images as f64 / seconds.max(1e-9);
    if run.json {
        out!(
            "{}",
            json!({
                "images": images,
                "views": images * count,
                "views_per_image": count,
                "seed": run.views.seed,
                "errors": errors,
                "epochs": run.epochs,
                "seconds": seconds,
                "images_per_s": rate,
                "views_per_s": rate * count as f64,
                "saved": saved.iter().map(|p| p.display().to_string()).collect::<Vec<_>>(),
            })
        );
    } else {
        out!(
            "{images} images, {} views ({count} each), {errors} errors in {seconds:.2} s: \
             {rate:.1} images/s on the CPU",
            images * count
        );
        for p in &saved {
            out!("saved {}", p.display());
        }
    }
    Ok(())
}
