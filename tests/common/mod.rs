//! Helpers shared by the integration tests (and, through `#[path]`, the command line's tests):
//! files of the repository found from wherever the tests run, temporary folders that clean up
//! after themselves, and GPU presence.
#![allow(dead_code)]

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

/// The repository's root: the nearest folder, from the current one up, that holds `assets/`
/// and `tests/fixtures/`. Tests run from their package's folder under cargo, and from the
/// repository root when carried to another machine; both find the same files.
pub fn repo_root() -> PathBuf {
    let cwd = std::env::current_dir().expect("current directory");
    cwd.ancestors()
        .find(|dir| dir.join("assets").is_dir() && dir.join("tests/fixtures").is_dir())
        .map(Path::to_path_buf)
        .unwrap_or(cwd)
}

/// A file or folder of the repository, by its path from the root (`"assets/rocket.jpg"`).
pub fn repo_path(relative: &str) -> PathBuf {
    repo_root().join(relative)
}

/// A fresh, empty folder under the system's temporary folder, removed when dropped.
pub struct TempDir(PathBuf);

impl TempDir {
    /// A new folder whose name contains `name`, the process id and a counter.
    pub fn new(name: &str) -> TempDir {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "gpufeed-test-{name}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        TempDir(dir)
    }

    /// The folder.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl std::ops::Deref for TempDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for TempDir {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Says on the terminal, past the test harness's output capture, that a test did not run its
/// checks and why: a skipped GPU test stays visible in `cargo test`'s output.
pub fn say_skipped(test: &str, why: &str) {
    let _ = writeln!(std::io::stderr(), "skipped: {test}: {why}");
}

/// Whether a CUDA device is usable. Without one the test is skipped (and says so, see
/// [`say_skipped`]), unless `GPUFEED_REQUIRE_GPU=1`, which turns a missing GPU into a failure.
pub fn gpu_present(test: &str) -> bool {
    match gpufeed::cuda::probe() {
        Ok(_) => true,
        Err(e) => {
            assert!(
                std::env::var("GPUFEED_REQUIRE_GPU").as_deref() != Ok("1"),
                "GPUFEED_REQUIRE_GPU=1 but {e}"
            );
            say_skipped(test, &format!("no CUDA device ({e})"));
            false
        }
    }
}

/// Current resident set size of this process in bytes (`VmRSS`), 0 where unknown.
pub fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

/// The mean and the 99.9th percentile of `diffs` (sorted in place), as the fidelity bars count
/// them.
pub fn mean_and_p999(diffs: &mut [f32]) -> (f32, f32) {
    diffs.sort_by(|a, b| a.total_cmp(b));
    let mean = diffs.iter().sum::<f32>() / diffs.len().max(1) as f32;
    let p999 = diffs
        .get(((diffs.len().max(1) - 1) as f64 * 0.999).round() as usize)
        .copied()
        .unwrap_or(0.0);
    (mean, p999)
}

/// Writes an ImageFolder under `root`: `images` small generated JPEGs (baseline, colour, 40 to
/// 150 pixels a side, detail everywhere so that every crop of them differs) spread over three
/// class folders, and `bad` files named like JPEGs that are not images, among them. Returns the
/// number of files written.
pub fn generated_image_folder(root: &Path, images: usize, bad: usize) -> usize {
    for i in 0..images + bad {
        let class = root.join(format!("class_{}", i % 3));
        std::fs::create_dir_all(&class).expect("class folder");
        if i % (images / bad.max(1) + 1) == 1 && i / (images / bad.max(1) + 1) < bad {
            std::fs::write(class.join(format!("{i:04}_broken.jpg")), b"not an image")
                .expect("write");
            continue;
        }
        let (width, height) = (40 + (i * 37) % 111, 40 + (i * 53) % 111);
        let mut state = (i as u32).wrapping_mul(2_654_435_761).wrapping_add(1);
        let image = image::RgbImage::from_fn(width as u32, height as u32, |x, y| {
            state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            let noise = (state >> 26) as u8;
            image::Rgb([
                (x * 5 + i as u32) as u8 ^ noise,
                (y * 3) as u8 ^ noise,
                ((x + y) * 2) as u8,
            ])
        });
        let mut jpeg = Vec::new();
        image::codecs::jpeg::JpegEncoder::new_with_quality(&mut jpeg, 90)
            .encode_image(&image)
            .expect("encode");
        std::fs::write(class.join(format!("{i:04}.jpg")), jpeg).expect("write");
    }
    images + bad
}
