//! The serving bench: the latency of [`PatchServer::serve`], bytes in memory to packed patches
//! ready on the device (the stream synchronized), for requests of 1, 8 and 32 images and for
//! one JPEG of about a megapixel, as p50 and p99 over many requests, with the lanes that
//! decoded them (on the GPU: the GPU decode lane beside the CPU threads, and the CPU threads
//! alone).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use gpufeed::patches::Patches;
use gpufeed::{DType, Decode, DecodeOptions, Device, PatchServer, RequestImage, Tensor};

use crate::{BenchError, Result};

/// What [`serve`] measures.
#[derive(Debug, Clone, PartialEq)]
pub struct ServeBenchOptions {
    /// Folder of images (searched recursively): the requests cycle through its files.
    pub dir: PathBuf,
    /// The presets served, by name.
    pub presets: Vec<(String, Patches)>,
    /// CUDA device for the GPU rows; `None` leaves them out.
    pub device: Option<usize>,
    /// CPU threads of the GPU rows' servers (0: one per core).
    pub gpu_threads: usize,
    /// The decoding of the GPU rows, a row each: [`Decode::Auto`] (the GPU decode lane beside
    /// the CPU threads), [`Decode::Cpu`] (the CPU threads alone).
    pub gpu_decodes: Vec<Decode>,
    /// Threads of the CPU-device rows (0 leaves them out).
    pub cpu_threads: usize,
    /// Images per request, one row each.
    pub sizes: Vec<usize>,
    /// Requests timed per row (after a few not counted).
    pub requests: usize,
    /// The one-image row's file: a JPEG of about a megapixel (`None`: the folder's JPEG
    /// nearest to 1,000,000 pixels).
    pub large: Option<PathBuf>,
    /// The tokens' element type.
    pub dtype: DType,
}

/// One measured configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct ServeBenchRow {
    /// The preset, by name.
    pub label: String,
    /// `GPU, GPU lane`, `GPU, CPU decode` or `CPU, n threads`.
    pub device: String,
    /// Mean images per request the CPU threads and the GPU decode lane decoded.
    pub decoded_by: (f64, f64),
    /// What a request holds: `8 images`, or the large JPEG's name and size.
    pub request: String,
    /// Mean tokens per request.
    pub tokens: f64,
    /// Median milliseconds from the call to the tokens on the device.
    pub p50_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// Mean.
    pub mean_ms: f64,
}

/// The results of [`serve`].
#[derive(Debug, Clone, PartialEq)]
pub struct ServeBenchReport {
    /// Files in the folder.
    pub files: usize,
    /// Every row.
    pub rows: Vec<ServeBenchRow>,
    /// Where the GPU rows ran, in words.
    pub device: Option<String>,
    /// Which lanes the GPU rows' servers decoded with, and why, in words.
    pub lanes: Vec<String>,
}

impl ServeBenchReport {
    /// The rows as a text table.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "serve latency: bytes in memory to packed patches on the device, {} files{}",
            self.files,
            self.device
                .as_ref()
                .map_or(String::new(), |d| format!(", GPU rows on {d}"))
        );
        for lanes in &self.lanes {
            let _ = writeln!(out, "decode: {lanes}");
        }
        let _ = writeln!(
            out,
            "{:<24} {:<16} {:<38} {:>9} {:>9} {:>9} {:>9} {:>11}",
            "preset", "device", "request", "tokens", "p50 ms", "p99 ms", "mean ms", "cpu+gpu"
        );
        for r in &self.rows {
            let _ = writeln!(
                out,
                "{:<24} {:<16} {:<38} {:>9.0} {:>9.3} {:>9.3} {:>9.3} {:>11}",
                r.label,
                r.device,
                r.request,
                r.tokens,
                r.p50_ms,
                r.p99_ms,
                r.mean_ms,
                format!("{:.1}+{:.1}", r.decoded_by.0, r.decoded_by.1)
            );
        }
        out
    }
}

/// The `q` quantile of `values` (nearest rank); sorts them.
pub fn quantile(values: &mut [f64], q: f64) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    if values.is_empty() {
        return f64::NAN;
    }
    let rank = (q * values.len() as f64).ceil() as usize;
    values[rank.clamp(1, values.len()) - 1]
}

/// Image files under `dir`, sorted.
fn files_of(dir: &Path) -> Result<Vec<PathBuf>> {
    let source = gpufeed::Source::directory(dir)?;
    Ok((0..source.len())
        .filter_map(|i| source.path(i).map(Path::to_path_buf))
        .collect())
}

fn read(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|source| BenchError::Write {
        path: path.to_path_buf(),
        source,
    })
}

/// The folder's JPEG whose size is nearest to a megapixel, with its width and height.
fn nearest_megapixel(files: &[PathBuf], bytes: &[Vec<u8>]) -> Result<Option<(usize, u32, u32)>> {
    let mut probe = PatchServer::builder(Patches::qwen2_vl())
        .device(Device::Cpu)
        .max_images(1)
        .threads(1)
        .build()?;
    let mut best: Option<(u64, usize, u32, u32)> = None;
    for (i, path) in files.iter().enumerate() {
        let jpeg = path
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| e.eq_ignore_ascii_case("jpg") || e.eq_ignore_ascii_case("jpeg"));
        if !jpeg {
            continue;
        }
        let Ok(batch) = probe.serve(&[RequestImage::Bytes(&bytes[i])]) else {
            continue;
        };
        let Some(plan) = batch.patches().and_then(|p| p.plans().first().copied()) else {
            continue;
        };
        let pixels = u64::from(plan.crop_width) * u64::from(plan.crop_height);
        let distance = pixels.abs_diff(1_000_000);
        if best.is_none_or(|(d, ..)| distance < d) {
            best = Some((distance, i, plan.crop_width, plan.crop_height));
        }
    }
    Ok(best.map(|(_, i, w, h)| (i, w, h)))
}

/// What [`time_requests`] measured: each request's milliseconds, the mean tokens per request
/// and the mean images the CPU threads and the GPU lane decoded per request.
type Timed = (Vec<f64>, f64, (f64, f64));

/// Times `requests` requests (after 3 not counted) of `server`, each the images `request(k)`.
fn time_requests<'a>(
    server: &mut PatchServer,
    requests: usize,
    request: impl Fn(usize) -> Vec<RequestImage<'a>>,
) -> Result<Timed> {
    let mut times = Vec::with_capacity(requests);
    let mut tokens = 0usize;
    let mut decoded = (0usize, 0usize);
    for k in 0..requests + 3 {
        let images = request(k);
        let start = Instant::now();
        let batch = server.serve(&images)?;
        if let Some(Tensor::Device(t)) = batch.tokens() {
            t.synchronize()?;
        }
        let seconds = start.elapsed().as_secs_f64();
        if k >= 3 {
            times.push(seconds * 1e3);
            tokens += batch
                .patches()
                .map_or(0, |p| p.tokens_per_image().iter().sum());
            let (cpu, gpu) = batch.decoded_by();
            decoded = (decoded.0 + cpu, decoded.1 + gpu);
        }
        drop(batch);
    }
    let per_request = |n: usize| n as f64 / requests.max(1) as f64;
    Ok((
        times,
        per_request(tokens),
        (per_request(decoded.0), per_request(decoded.1)),
    ))
}

/// Measures every preset on each device: requests of each size cycling through the folder's
/// files (bytes read into memory first, as a server receives them), and the large JPEG alone.
pub fn serve(options: &ServeBenchOptions) -> Result<ServeBenchReport> {
    let files = files_of(&options.dir)?;
    let bytes = files.iter().map(|p| read(p)).collect::<Result<Vec<_>>>()?;
    let large = match &options.large {
        Some(path) => Some((path.clone(), read(path)?, None)),
        None => nearest_megapixel(&files, &bytes)?
            .map(|(i, w, h)| (files[i].clone(), bytes[i].clone(), Some((w, h)))),
    };
    let mut devices = Vec::new();
    if let Some(ordinal) = options.device {
        for &decode in &options.gpu_decodes {
            let label = match decode {
                Decode::Cpu => "GPU, CPU decode",
                _ => "GPU, GPU lane",
            };
            devices.push((
                Device::Cuda(ordinal),
                options.gpu_threads,
                decode,
                label.to_string(),
            ));
        }
    }
    if options.cpu_threads > 0 {
        let label = format!("CPU, {} threads", options.cpu_threads);
        devices.push((Device::Cpu, options.cpu_threads, Decode::Cpu, label));
    }
    if devices.is_empty() || files.is_empty() {
        return Err(BenchError::Nothing("no device or no files".into()));
    }
    let largest = options.sizes.iter().copied().max().unwrap_or(1).max(1);
    let mut rows = Vec::new();
    let mut description = None;
    let mut lanes = Vec::new();
    for (label, patches) in &options.presets {
        for (device, threads, decode, device_label) in &devices {
            let mut server = PatchServer::builder(*patches)
                .device(*device)
                .dtype(options.dtype)
                .threads(*threads)
                .max_images(largest)
                .decode(DecodeOptions::default().lanes(*decode))
                .build()?;
            if matches!(device, Device::Cuda(_)) {
                description = Some(server.device_description());
                let described = format!("{device_label}: {}", server.decode_description());
                if !lanes.contains(&described) {
                    lanes.push(described);
                }
            }
            let mut row = |request: String, (mut times, tokens, decoded_by): Timed| {
                let mean = times.iter().sum::<f64>() / times.len().max(1) as f64;
                rows.push(ServeBenchRow {
                    label: label.clone(),
                    device: device_label.clone(),
                    decoded_by,
                    request,
                    tokens,
                    p50_ms: quantile(&mut times, 0.5),
                    p99_ms: quantile(&mut times, 0.99),
                    mean_ms: mean,
                });
            };
            for &size in &options.sizes {
                let timed = time_requests(&mut server, options.requests, |k| {
                    (0..size)
                        .map(|j| RequestImage::Bytes(&bytes[(k * size + j) % bytes.len()]))
                        .collect()
                })?;
                let noun = if size == 1 { "image" } else { "images" };
                row(format!("{size} {noun}"), timed);
            }
            if let Some((path, data, size)) = &large {
                let timed = time_requests(&mut server, options.requests, |_| {
                    vec![RequestImage::Bytes(data)]
                })?;
                let name = path.file_name().map_or_else(
                    || path.display().to_string(),
                    |n| n.to_string_lossy().into_owned(),
                );
                let size = size.map_or(String::new(), |(w, h)| format!(" {w}x{h}"));
                row(format!("1 JPEG: {name}{size}"), timed);
            }
        }
    }
    Ok(ServeBenchReport {
        files: files.len(),
        rows,
        device: description,
        lanes,
    })
}

#[cfg(test)]
mod tests {
    use super::quantile;

    #[test]
    fn quantiles_are_nearest_rank() {
        let mut values: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        assert_eq!(quantile(&mut values, 0.5), 50.0);
        assert_eq!(quantile(&mut values, 0.99), 99.0);
        assert_eq!(quantile(&mut values, 1.0), 100.0);
        assert_eq!(quantile(&mut [7.0], 0.99), 7.0);
        assert!(quantile(&mut [], 0.5).is_nan());
    }
}
