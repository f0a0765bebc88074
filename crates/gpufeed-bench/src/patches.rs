//! The patch-sequence bench: whole epochs of patch-sequence pipelines (Qwen2-VL packed, SigLIP2
//! and timm's NaFlex padded) beside the fixed 224 x 224 crops of the same images, on the GPU
//! and on the CPU device.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use gpufeed::patches::{Patches, Preset};
use gpufeed::{Device, Options, Pipeline, Source};

use crate::{median, BenchError, Result};

/// What [`patches`] measures.
#[derive(Debug, Clone, PartialEq)]
pub struct PatchBenchOptions {
    /// Folder of images (searched recursively).
    pub dir: PathBuf,
    /// The fixed-crop pipeline's options (batch size, dtype, decode lanes); the patch-sequence
    /// pipelines take the same batch size, dtype and decode lanes.
    pub options: Options,
    /// The patch-sequence outputs measured beside the fixed crops, by name.
    pub presets: Vec<(String, Patches)>,
    /// CUDA device for the GPU rows; `None` leaves them out.
    pub device: Option<usize>,
    /// Threads of the CPU-device rows (0 leaves them out).
    pub cpu_threads: usize,
    /// Epochs per configuration (the median is reported; the first is not counted).
    pub epochs: usize,
    /// Read every file into memory first (no file reads in the timings).
    pub in_memory: bool,
}

/// One measured configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct PatchBenchRow {
    /// What ran.
    pub label: String,
    /// `GPU` or `CPU, n threads`.
    pub device: String,
    /// Images per epoch.
    pub images: usize,
    /// Tokens (or output pixels) per epoch.
    pub tokens: usize,
    /// Median seconds per epoch.
    pub seconds: f64,
    /// Images per second of the fixed crops on the same device.
    pub fixed_images_per_s: f64,
}

impl PatchBenchRow {
    /// Images per second.
    pub fn images_per_s(&self) -> f64 {
        self.images as f64 / self.seconds
    }
}

/// The results of [`patches`].
#[derive(Debug, Clone, PartialEq)]
pub struct PatchBenchReport {
    /// Images in the folder.
    pub images: usize,
    /// The rows.
    pub rows: Vec<PatchBenchRow>,
}

impl PatchBenchReport {
    /// The results as an aligned text table.
    pub fn table(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "gpufeed patch-sequence bench: {} images", self.images);
        let _ = writeln!(
            s,
            "{:<44} {:<14} {:>10} {:>12} {:>14}",
            "output", "device", "images/s", "tokens/img", "vs 224 crops"
        );
        for row in &self.rows {
            let _ = writeln!(
                s,
                "{:<44} {:<14} {:>10.0} {:>12.0} {:>13.3}x",
                row.label,
                row.device,
                row.images_per_s(),
                row.tokens as f64 / row.images.max(1) as f64,
                row.images_per_s() / row.fixed_images_per_s,
            );
        }
        s
    }
}

/// One epoch of `pipeline`: images, tokens (output pixels for images) and seconds, the last
/// batch waited for.
fn epoch(pipeline: &mut Pipeline, first: bool) -> Result<(usize, usize, f64)> {
    if !first {
        pipeline.next_epoch()?;
    }
    let start = Instant::now();
    let (mut images, mut tokens) = (0, 0);
    let mut last = None;
    while let Some(batch) = pipeline.next_batch()? {
        images += batch.len();
        tokens += match batch.patches() {
            Some(info) => info.tokens_per_image().iter().sum(),
            None => batch.images().len() / 3,
        };
        last = Some(batch);
    }
    if let Some(batch) = last {
        batch.images().synchronize()?;
    }
    Ok((images, tokens, start.elapsed().as_secs_f64()))
}

/// Measures the fixed crops and every preset of `options` on one device, one after another (a
/// pipeline's lanes work ahead into its next epoch, so two open at once would share the cores).
fn measure(
    source: &Source,
    options: &PatchBenchOptions,
    device: Device,
    label: &str,
) -> Result<Vec<PatchBenchRow>> {
    let epochs = options.epochs.max(1);
    let base = options.options;
    let base = base
        .runtime(base.runtime.device(device))
        .decode(base.decode.planned_epochs(Some(epochs as u64 + 1)));
    let mut configs: Vec<(String, Options)> =
        vec![("fixed: Resize(256) + CenterCrop(224)".into(), base)];
    for (name, patches) in &options.presets {
        configs.push((format!("patches: {name}"), base.patches(Some(*patches))));
    }
    let mut rows = Vec::new();
    for (name, config) in configs {
        let mut pipeline = Pipeline::with_options(source.clone(), config)?;
        let mut times = Vec::new();
        let (mut images, mut tokens) = (0, 0);
        // The first epoch opens the lanes and warms the page cache: not counted.
        for e in 0..=epochs {
            let (n, t, seconds) = epoch(&mut pipeline, e == 0)?;
            (images, tokens) = (n, t);
            if e > 0 {
                times.push(seconds);
            }
        }
        rows.push(PatchBenchRow {
            label: name,
            device: label.to_string(),
            images,
            tokens,
            seconds: median(&mut times),
            fixed_images_per_s: 0.0,
        });
    }
    let fixed = rows.first().map_or(0.0, PatchBenchRow::images_per_s);
    for row in &mut rows {
        row.fixed_images_per_s = fixed;
    }
    Ok(rows)
}

/// Measures whole epochs of the fixed crops and of each patch-sequence output over the folder:
/// on the GPU (with the decode lanes of `options.options`) and on the CPU device with
/// `cpu_threads` threads.
pub fn patches(options: &PatchBenchOptions) -> Result<PatchBenchReport> {
    let mut source = Source::directory(&options.dir)?;
    if options.in_memory {
        let mut images = Vec::with_capacity(source.len());
        for index in 0..source.len() {
            let bytes = source.read(index).map_err(gpufeed::Error::Item)?;
            let id = source.id(index).unwrap_or_default().to_string();
            images.push((id, Arc::<[u8]>::from(bytes)));
        }
        source = Source::bytes(images);
    }
    if source.is_empty() {
        return Err(BenchError::Nothing(format!(
            "{}: no images",
            options.dir.display()
        )));
    }
    let mut rows = Vec::new();
    if let Some(ordinal) = options.device {
        rows.extend(measure(&source, options, Device::Cuda(ordinal), "GPU")?);
    }
    if options.cpu_threads > 0 {
        let mut cpu = options.clone();
        cpu.options = cpu
            .options
            .runtime(cpu.options.runtime.threads(options.cpu_threads))
            .decode(cpu.options.decode.lanes(gpufeed::Decode::Cpu));
        let label = format!("CPU, {} threads", options.cpu_threads);
        rows.extend(measure(&source, &cpu, Device::Cpu, &label)?);
    }
    Ok(PatchBenchReport {
        images: source.len(),
        rows,
    })
}

/// A bench's preset spec, `name[:budget]`: the preset, with its `max_pixels` (Qwen2-VL) or
/// `max_patches` (SigLIP2); the spec is kept as the row's name.
pub fn preset_spec(spec: &str) -> std::result::Result<(String, Patches), String> {
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
