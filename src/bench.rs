//! Measurements users run to see where the time goes: [`pipeline`] (CPU stage and end to end
//! over a folder) and [`upload`] (u8 vs f32 uploads and the kernel; needs a GPU).

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;

pub use crate::gpu::bench as upload;

use crate::gpu::bench::median;

use crate::config::{Config, Device};
use crate::error::{Error, Result};
use crate::pipeline::Pipeline;
use crate::prepare::{fill_slot, PrepareOptions};
use crate::source::Source;

/// What [`pipeline`] measures.
#[derive(Debug, Clone, PartialEq)]
pub struct PipelineBenchOptions {
    /// Folder of images (searched recursively).
    pub dir: PathBuf,
    /// Output options (size, dtype, layout, batch size); `threads` and `device` are set per row.
    pub config: Config,
    /// Thread counts for the CPU-stage rows (0: one per core).
    pub threads: Vec<usize>,
    /// CUDA device for the end-to-end row; `None` leaves the row out.
    pub device: Option<usize>,
    /// Passes over the folder per CPU-stage row (the median pass is reported).
    pub passes: usize,
    /// Epochs of the end-to-end row (the median epoch is reported; host memory is read after
    /// each).
    pub epochs: usize,
    /// Read every file into memory first and measure from there (no file reads in the timings).
    pub in_memory: bool,
    /// At one thread, also measure the CPU stage with every JPEG decoded whole, passes taken in
    /// turn with the usual ones: what the partial decode saves.
    pub whole_decode_row: bool,
}

/// One measured configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct PipelineBenchRow {
    /// What ran.
    pub label: String,
    /// CPU threads.
    pub threads: usize,
    /// Images per pass.
    pub images: usize,
    /// Median seconds per pass.
    pub seconds: f64,
}

impl PipelineBenchRow {
    /// Images per second.
    pub fn images_per_s(&self) -> f64 {
        self.images as f64 / self.seconds
    }

    /// Images per second per thread.
    pub fn per_thread(&self) -> f64 {
        self.images_per_s() / self.threads.max(1) as f64
    }
}

/// The results of [`pipeline`].
#[derive(Debug, Clone, PartialEq)]
pub struct PipelineBenchReport {
    /// Images in the folder.
    pub images: usize,
    /// The rows, in the order measured.
    pub rows: Vec<PipelineBenchRow>,
    /// Peak resident memory of the process, bytes (Linux; 0 elsewhere).
    pub peak_rss_bytes: u64,
    /// Resident memory after each end-to-end epoch, bytes.
    pub rss_after_epochs: Vec<u64>,
}

impl PipelineBenchReport {
    /// The results as an aligned text table.
    pub fn table(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "gpufeed pipeline bench: {} images", self.images);
        let _ = writeln!(
            s,
            "{:<48} {:>7} {:>9} {:>11} {:>11}",
            "what", "threads", "seconds", "images/s", "per thread"
        );
        for r in &self.rows {
            let _ = writeln!(
                s,
                "{:<48} {:>7} {:>9.3} {:>11.0} {:>11.0}",
                r.label,
                r.threads,
                r.seconds,
                r.images_per_s(),
                r.per_thread()
            );
        }
        let rate = |prefix: &str| {
            self.rows
                .iter()
                .find(|r| r.label.starts_with(prefix))
                .map(PipelineBenchRow::images_per_s)
        };
        if let (Some(end_to_end), Some(cpu)) = (rate("end to end"), rate("CPU stage only, in turn"))
        {
            let _ = writeln!(
                s,
                "end to end keeps {:.1}% of the CPU-stage rate measured in turn",
                100.0 * end_to_end / cpu
            );
        }
        let _ = writeln!(s, "peak RSS {:.0} MB", self.peak_rss_bytes as f64 / 1e6);
        if !self.rss_after_epochs.is_empty() {
            let mb: Vec<String> = self
                .rss_after_epochs
                .iter()
                .map(|b| format!("{:.0}", *b as f64 / 1e6))
                .collect();
            let _ = writeln!(s, "RSS after each end-to-end epoch (MB): {}", mb.join(" "));
        }
        s
    }
}

/// Passes of the CPU stage over `source` on `pool`, batch by batch into `slot` as the pipeline
/// does, once per variant in turn (so that drifts of the machine's speed hit every variant
/// alike); returns the images of a pass and the median seconds of the `passes` counted passes of
/// each variant.
fn cpu_stage(
    pool: &rayon::ThreadPool,
    source: &Source,
    variants: &[PrepareOptions],
    slot: &mut [u8],
    passes: usize,
    warm_up: usize,
) -> Result<Vec<(usize, f64)>> {
    let order: Vec<usize> = (0..source.len()).collect();
    let stop = AtomicBool::new(false);
    let mut times = vec![Vec::new(); variants.len()];
    let mut images = vec![0; variants.len()];
    for pass in 0..passes + warm_up {
        for (v, prepare) in variants.iter().enumerate() {
            let batch_size = slot.len() / prepare.image_bytes();
            let start = Instant::now();
            images[v] = 0;
            let mut position = 0;
            while position < order.len() {
                let filled = pool
                    .install(|| {
                        fill_slot(slot, &order[position..], batch_size, source, prepare, &stop)
                    })?
                    .ok_or_else(|| Error::Worker("stopped".into()))?;
                position += filled.consumed;
                images[v] += filled.indices.len();
            }
            if pass >= warm_up {
                times[v].push(start.elapsed().as_secs_f64());
            }
        }
    }
    Ok(images
        .into_iter()
        .zip(times.iter_mut())
        .map(|(n, t)| (n, median(t)))
        .collect())
}

/// Peak resident set size of this process in bytes (`VmHWM`), 0 where unknown.
pub fn peak_rss_bytes() -> u64 {
    resident_field("VmHWM:")
}

/// Current resident set size of this process in bytes (`VmRSS`), 0 where unknown.
pub fn rss_bytes() -> u64 {
    resident_field("VmRSS:")
}

fn resident_field(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

/// Measures the CPU stage alone (read, decode, resize into a staging buffer, batch by batch, as
/// the pipeline does, without the device stage) at each thread count, and the whole pipeline on
/// the GPU. The first pass over the folder warms the page cache and is not counted.
pub fn pipeline(options: &PipelineBenchOptions) -> Result<PipelineBenchReport> {
    let mut source = Source::directory(&options.dir)?;
    if options.in_memory {
        let mut images = Vec::with_capacity(source.len());
        for index in 0..source.len() {
            let item = source.item(index);
            let bytes = item
                .read()
                .map_err(|kind| Error::Config(format!("{}: {kind}", item.id())))?;
            images.push((item.id().to_string(), Arc::<[u8]>::from(&*bytes)));
        }
        source = Source::bytes(images);
    }
    if source.is_empty() {
        return Err(Error::Config(format!(
            "{}: no images to measure",
            options.dir.display()
        )));
    }
    let config = &options.config;
    config.validate()?;
    let prepare = PrepareOptions::from_config(config);
    let mut slot = vec![0u8; config.batch_size * prepare.image_bytes()];
    let passes = options.passes.max(1);
    let mut rows = Vec::new();
    // The first pass over the folder warms the page cache and is not counted.
    let mut warm_up = 1;
    for &threads in &options.threads {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .map_err(|e| Error::Config(format!("thread pool: {e}")))?;
        let used = pool.current_num_threads();
        // At one thread, the same passes with every JPEG decoded whole, in turn with the usual
        // ones: what the partial decode saves.
        let mut variants = vec![prepare];
        if used == 1 && options.whole_decode_row {
            variants.push(PrepareOptions {
                partial_decode: false,
                ..prepare
            });
        }
        let measured = cpu_stage(&pool, &source, &variants, &mut slot, passes, warm_up)?;
        warm_up = 0;
        let labels = [
            "CPU stage only (read, decode, resize, stage)",
            "CPU stage, JPEGs decoded whole",
        ];
        for (label, (images, seconds)) in labels.iter().zip(measured) {
            rows.push(PipelineBenchRow {
                label: label.to_string(),
                threads: used,
                images,
                seconds,
            });
        }
    }
    let mut rss_after_epochs = Vec::new();
    if let Some(ordinal) = options.device {
        let mut pipeline = Pipeline::builder()
            .config(Config {
                device: Device::Cuda(ordinal),
                threads: 0,
                ..config.clone()
            })
            .source(source.clone())
            .build()?;
        let threads = rayon::current_num_threads();
        // A pass of the CPU stage alone before each epoch, on as many threads: the pipeline's
        // rate with the device stage removed, measured in turn so that drifts of the machine's
        // speed hit both alike. (Its pool's scratch is in the RSS from the first epoch on.)
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .map_err(|e| Error::Config(format!("thread pool: {e}")))?;
        let mut times = Vec::new();
        let mut cpu_times = Vec::new();
        let mut images = 0;
        let mut cpu_images = 0;
        let epochs = options.epochs.max(1);
        for epoch in 0..epochs {
            let measured = cpu_stage(&pool, &source, &[prepare], &mut slot, 1, 0)?;
            if let Some(&(n, seconds)) = measured.first() {
                cpu_images = n;
                cpu_times.push(seconds);
            }
            if epoch > 0 {
                pipeline.next_epoch()?;
            }
            let start = Instant::now();
            images = 0;
            let mut last = None;
            while let Some(batch) = pipeline.next_batch()? {
                images += batch.len();
                last = Some(batch);
            }
            if let Some(batch) = last {
                batch.images().synchronize()?;
            }
            times.push(start.elapsed().as_secs_f64());
            rss_after_epochs.push(rss_bytes());
        }
        rows.push(PipelineBenchRow {
            label: "CPU stage only, in turn with the epochs below".into(),
            threads: pool.current_num_threads(),
            images: cpu_images,
            seconds: median(&mut cpu_times),
        });
        rows.push(PipelineBenchRow {
            label: format!(
                "end to end, GPU {} {} batch {}",
                config.dtype.name(),
                config.layout.name(),
                config.batch_size
            ),
            threads,
            images,
            seconds: median(&mut times),
        });
    }
    Ok(PipelineBenchReport {
        images: source.len(),
        rows,
        peak_rss_bytes: peak_rss_bytes(),
        rss_after_epochs,
    })
}
