//! gpufeed's measurements, on its public API only: [`upload`] (bytes and time of u8 vs f32
//! uploads, the fused normalize kernel against a naive multi-pass conversion; needs a GPU),
//! [`pipeline`] (the CPU stage at several thread counts, and the whole pipeline on the GPU),
//! [`patches`] (patch-sequence outputs beside fixed 224 crops of the same images) and [`serve`]
//! (the patch server's latency per request). `gpufeed bench` and `cargo bench --bench upload`,
//! `--bench pipeline`, `--bench patches` and `--bench serve` run them.

mod chart;
pub mod patches;
pub mod pipeline;
pub mod serve;
pub mod upload;

use gpufeed::cudarc::driver::DriverError;

pub use patches::{PatchBenchOptions, PatchBenchReport, PatchBenchRow};
pub use pipeline::{PipelineBenchOptions, PipelineBenchReport, PipelineBenchRow};
pub use serve::{ServeBenchOptions, ServeBenchReport, ServeBenchRow};
pub use upload::{BenchOptions, BenchReport, BenchRow};

/// Why a measurement could not be made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BenchError {
    /// gpufeed refused or failed.
    #[error(transparent)]
    Gpufeed(#[from] gpufeed::Error),
    /// A CUDA call of the bench itself failed.
    #[error("CUDA driver error while {context}: {source}")]
    Cuda {
        /// What the bench was doing.
        context: &'static str,
        /// The driver's error.
        #[source]
        source: DriverError,
    },
    /// The baseline kernel did not compile.
    #[error("NVRTC could not compile kernels/baseline.cu: {0}")]
    Compile(String),
    /// The options leave nothing to measure.
    #[error("nothing to measure: {0}")]
    Nothing(String),
    /// An output file could not be written.
    #[error("cannot write {path}: {source}")]
    Write {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// The bench's result type.
pub type Result<T, E = BenchError> = std::result::Result<T, E>;

/// A failed driver call of the bench, with what it was doing.
pub(crate) fn cuda(context: &'static str) -> impl Fn(DriverError) -> BenchError + Copy {
    move |source| BenchError::Cuda { context, source }
}

/// The image files under `dir` (by gpufeed's extensions), recursively, sorted; an error when
/// there are none.
pub fn images_under(
    dir: &std::path::Path,
) -> std::result::Result<Vec<std::path::PathBuf>, Box<dyn std::error::Error>> {
    let mut images = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(folder) = pending.pop() {
        for entry in std::fs::read_dir(&folder)? {
            let path = entry?.path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|e| {
                gpufeed::IMAGE_EXTENSIONS
                    .contains(&e.to_string_lossy().to_ascii_lowercase().as_str())
            }) {
                images.push(path);
            }
        }
    }
    images.sort();
    if images.is_empty() {
        return Err(format!("no image under {}", dir.display()).into());
    }
    Ok(images)
}

/// The environment variable `name` parsed, or `default` when it is unset or does not parse.
pub fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Median of `values` (the mean of the middle two for an even count); sorts them.
pub fn median(values: &mut [f64]) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    let n = values.len();
    match n {
        0 => f64::NAN,
        _ if n % 2 == 1 => values[n / 2],
        _ => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
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

/// Appends a ustar member (a name under 100 bytes) to `tar`.
pub fn tar_member(tar: &mut Vec<u8>, name: &str, data: &[u8]) {
    let mut header = [0u8; 512];
    header[..name.len()].copy_from_slice(name.as_bytes());
    header[100..108].copy_from_slice(b"0000644\0");
    header[108..116].copy_from_slice(b"0000000\0");
    header[116..124].copy_from_slice(b"0000000\0");
    header[124..136].copy_from_slice(format!("{:011o}\0", data.len()).as_bytes());
    header[136..148].copy_from_slice(b"00000000000\0");
    header[156] = b'0';
    header[257..263].copy_from_slice(b"ustar\0");
    header[263..265].copy_from_slice(b"00");
    header[148..156].copy_from_slice(b"        ");
    let sum: u32 = header.iter().map(|&b| u32::from(b)).sum();
    header[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
    tar.extend_from_slice(&header);
    tar.extend_from_slice(data);
    tar.resize(tar.len().div_ceil(512) * 512, 0);
}
