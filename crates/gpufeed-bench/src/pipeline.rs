//! The pipeline bench: the CPU stage alone (read, decode, resize into a staging buffer, batch by
//! batch) at several thread counts, and the whole pipeline on the GPU, over a folder.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use gpufeed::{CpuStage, Device, Options, Pipeline, Source};

use crate::{median, peak_rss_bytes, rss_bytes, BenchError, Result};

/// What [`pipeline`] measures.
#[derive(Debug, Clone, PartialEq)]
pub struct PipelineBenchOptions {
    /// Folder of images (searched recursively).
    pub dir: PathBuf,
    /// Output options (size, dtype, layout, batch size); threads and device are set per row.
    pub options: Options,
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

/// Passes of the CPU stage over `source`, batch by batch of `batch_size` into `slot`, once per
/// stage in turn (so that drifts of the machine's speed hit every variant alike); returns the
/// images of a pass and the median seconds of the `passes` counted passes of each stage.
fn cpu_stage(
    stages: &[&CpuStage],
    source: &Source,
    batch_size: usize,
    slot: &mut [u8],
    passes: usize,
    warm_up: usize,
) -> Result<Vec<(usize, f64)>> {
    let order: Vec<usize> = (0..source.len()).collect();
    let mut times = vec![Vec::new(); stages.len()];
    let mut images = vec![0; stages.len()];
    for pass in 0..passes + warm_up {
        for (v, stage) in stages.iter().enumerate() {
            let start = Instant::now();
            images[v] = 0;
            for batch in order.chunks(batch_size.max(1)) {
                images[v] += stage.prepare_batch(source, batch, slot)?.indices.len();
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

/// Measures the CPU stage alone (read, decode, resize into a staging buffer, batch by batch, as
/// the pipeline does, without the device stage) at each thread count, and the whole pipeline on
/// the GPU. The first pass over the folder warms the page cache and is not counted.
pub fn pipeline(options: &PipelineBenchOptions) -> Result<PipelineBenchReport> {
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
    let config = &options.options;
    config.validate()?;
    let batch_size = config.batching.batch_size;
    let image_bytes = config.resize.image_bytes()?;
    let mut slot = vec![0u8; batch_size * image_bytes];
    let passes = options.passes.max(1);
    let mut rows = Vec::new();
    // The first pass over the folder warms the page cache and is not counted.
    let mut warm_up = 1;
    for &threads in &options.threads {
        let stage = CpuStage::new(&config.decode, &config.resize, threads)?;
        let used = stage.threads();
        // At one thread, the same passes with every JPEG decoded whole, in turn with the usual
        // ones: what the partial decode saves.
        let whole = CpuStage::new(
            &config.decode.partial_decode(false),
            &config.resize,
            threads,
        )?;
        let mut variants = vec![&stage];
        if used == 1 && options.whole_decode_row {
            variants.push(&whole);
        }
        let measured = cpu_stage(&variants, &source, batch_size, &mut slot, passes, warm_up)?;
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
        let mut pipeline_options =
            config.runtime(config.runtime.device(Device::Cuda(ordinal)).threads(0));
        let mut pipeline_source = source.clone();
        if config.augment.mixes() && !source.has_labels() {
            // MixUp and CutMix mix labels: made up here, a thousand classes.
            let labels = (0..source.len()).map(|i| (i % 1000) as u32);
            pipeline_source = pipeline_source.with_labels(labels)?;
            let classes = config.augment.num_classes.or(Some(1000));
            pipeline_options = pipeline_options.augment(config.augment.num_classes(classes));
        }
        let mut pipeline = Pipeline::with_options(pipeline_source, pipeline_options)?;
        // A pass of the CPU stage alone before each epoch, on as many threads: the pipeline's
        // rate with the device stage removed, measured in turn so that drifts of the machine's
        // speed hit both alike. (Its threads' scratch is in the RSS from the first epoch on.)
        let stage = CpuStage::new(&config.decode, &config.resize, 0)?;
        let threads = stage.threads();
        let mut times = Vec::new();
        let mut cpu_times = Vec::new();
        let mut images = 0;
        let mut cpu_images = 0;
        let epochs = options.epochs.max(1);
        for epoch in 0..epochs {
            let measured = cpu_stage(&[&stage], &source, batch_size, &mut slot, 1, 0)?;
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
            threads,
            images: cpu_images,
            seconds: median(&mut cpu_times),
        });
        rows.push(PipelineBenchRow {
            label: format!(
                "end to end, GPU {} {} batch {}{}{}",
                config.output.dtype,
                config.output.layout,
                batch_size,
                if config.decode.lanes == gpufeed::Decode::Hybrid {
                    ", hybrid"
                } else {
                    ""
                },
                if config.augment.is_on() {
                    ", augmented"
                } else {
                    ""
                }
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
