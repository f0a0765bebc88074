//! Compiled kernels kept on disk between processes, so that a process's first batch does not wait
//! for NVRTC: the PTX of each kernel source, in a file named by a hash of everything it depends
//! on (the source, its definitions, the device's compute capability, NVRTC's and the driver's
//! versions, this crate's version). The driver keeps its own cache of the machine code it makes
//! from PTX, so a kernel found here loads in about a millisecond.
//!
//! The folder is `GPUFEED_KERNEL_CACHE` when set (`off` or empty: no cache on disk), else
//! `$XDG_CACHE_HOME/gpufeed/kernels`, else `$HOME/.cache/gpufeed/kernels`. The cache is an
//! optimisation only: a folder that cannot be made or written, a file cut short or changed, or
//! PTX the driver refuses means the kernel is compiled as if there were no cache (and the file
//! written again).

use std::ffi::OsString;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

/// A kernel source and the macros it is compiled with: what the module cache is keyed by.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct KernelSource {
    /// File name under `kernels/`, for messages.
    pub name: &'static str,
    /// The CUDA C++ source.
    pub code: &'static str,
    /// `-D` definitions.
    pub defines: Vec<String>,
}

/// The environment variable naming the cache's folder (or `off`).
pub(crate) const CACHE_VARIABLE: &str = "GPUFEED_KERNEL_CACHE";

/// What a compiled kernel depends on besides its source: the target and the tools.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Toolchain {
    /// The device's compute capability, `(major, minor)`.
    pub compute: (i32, i32),
    /// NVRTC's version, `(major, minor)`.
    pub nvrtc: (i32, i32),
    /// The driver's version (`cuDriverGetVersion`: 1000 x major + 10 x minor).
    pub driver: i32,
}

/// The identity of one compiled kernel: its file's name and the line that opens the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CacheKey {
    file_name: String,
    header: String,
}

impl CacheKey {
    /// The key of `source` compiled for `toolchain` by this version of the crate.
    pub fn new(source: &KernelSource, toolchain: Toolchain) -> CacheKey {
        let Toolchain {
            compute: (major, minor),
            nvrtc: (nvrtc_major, nvrtc_minor),
            driver,
        } = toolchain;
        let description = format!(
            "{} -D{} compute_{major}{minor} nvrtc {nvrtc_major}.{nvrtc_minor} driver {driver} \
             gpufeed {}",
            source.name,
            source.defines.join(" -D"),
            env!("CARGO_PKG_VERSION"),
        );
        let digest = Digest::of(&[description.as_bytes(), source.code.as_bytes()]);
        let stem = source.name.trim_end_matches(".cu");
        CacheKey {
            file_name: format!("{stem}-{digest}.ptx"),
            header: format!("// gpufeed kernel cache: {description} source {digest}"),
        }
    }
}

/// A folder of compiled kernels (or none: every kernel compiled afresh).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KernelCache {
    folder: Option<PathBuf>,
}

impl KernelCache {
    /// The cache the environment names (see the module's documentation).
    pub fn from_environment() -> KernelCache {
        KernelCache::from_variables(
            std::env::var_os(CACHE_VARIABLE),
            std::env::var_os("XDG_CACHE_HOME"),
            std::env::var_os("HOME"),
        )
    }

    /// The cache named by the values of `GPUFEED_KERNEL_CACHE`, `XDG_CACHE_HOME` and `HOME`.
    fn from_variables(
        cache: Option<OsString>,
        xdg_cache_home: Option<OsString>,
        home: Option<OsString>,
    ) -> KernelCache {
        let folder = match cache {
            Some(value) if value.is_empty() || value == "off" => None,
            Some(value) => Some(PathBuf::from(value)),
            None => xdg_cache_home
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
                .or_else(|| home.map(|home| Path::new(&home).join(".cache")))
                .map(|base| base.join("gpufeed").join("kernels")),
        };
        KernelCache { folder }
    }

    /// A cache in `folder`, or none.
    #[cfg(test)]
    pub fn at(folder: Option<PathBuf>) -> KernelCache {
        KernelCache { folder }
    }

    /// The PTX kept for `key`, when its file is there and whole.
    pub fn load(&self, key: &CacheKey) -> Option<String> {
        let text = fs::read_to_string(self.folder.as_ref()?.join(&key.file_name)).ok()?;
        let (first, rest) = text.split_once('\n')?;
        let (header, checksum) = first.rsplit_once(" ptx ")?;
        (header == key.header && checksum == Digest::of(&[rest.as_bytes()]).to_string())
            .then(|| rest.to_string())
    }

    /// Keeps `ptx` for `key`: written to a file of its own, then renamed into place, so that a
    /// process reading the cache meanwhile never sees half a file.
    pub fn store(&self, key: &CacheKey, ptx: &str) -> std::io::Result<()> {
        let Some(folder) = &self.folder else {
            return Ok(());
        };
        fs::create_dir_all(folder)?;
        let partial = folder.join(format!(
            ".{}.{}.{:?}",
            key.file_name,
            std::process::id(),
            std::thread::current().id()
        ));
        let written = (|| {
            let mut file = fs::File::create(&partial)?;
            let checksum = Digest::of(&[ptx.as_bytes()]);
            write!(file, "{} ptx {checksum}\n{ptx}", key.header)?;
            file.sync_all()?;
            fs::rename(&partial, folder.join(&key.file_name))
        })();
        if written.is_err() {
            let _ = fs::remove_file(&partial);
        }
        written
    }
}

/// 128 bits of two FNV-1a hashes with different starts: stable across builds and platforms (the
/// standard library's hasher is not promised to be).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Digest(u64, u64);

impl Digest {
    fn of(parts: &[&[u8]]) -> Digest {
        const PRIME: u64 = 0x0000_0100_0000_01b3;
        let mut a: u64 = 0xcbf2_9ce4_8422_2325;
        let mut b: u64 = 0x6c62_272e_07bb_0142;
        for part in parts {
            for &byte in part.iter().chain((part.len() as u64).to_le_bytes().iter()) {
                a = (a ^ u64::from(byte)).wrapping_mul(PRIME);
                b = (b ^ u64::from(byte.rotate_left(3))).wrapping_mul(PRIME);
            }
        }
        Digest(a, b)
    }
}

impl std::fmt::Display for Digest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:016x}{:016x}", self.0, self.1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOOLCHAIN: Toolchain = Toolchain {
        compute: (9, 0),
        nvrtc: (13, 0),
        driver: 13000,
    };

    fn source(code: &'static str, defines: &[&str]) -> KernelSource {
        KernelSource {
            name: "normalize.cu",
            code,
            defines: defines.iter().map(|d| d.to_string()).collect(),
        }
    }

    fn folder(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "gpufeed-kernel-cache-{name}-{}",
            std::process::id()
        ));
        let _ = fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn a_key_changes_with_everything_the_kernel_depends_on() {
        let base = CacheKey::new(&source("a", &["X=1"]), TOOLCHAIN);
        assert_eq!(base, CacheKey::new(&source("a", &["X=1"]), TOOLCHAIN));
        let others = [
            CacheKey::new(&source("b", &["X=1"]), TOOLCHAIN),
            CacheKey::new(&source("a", &["X=2"]), TOOLCHAIN),
            CacheKey::new(&source("a", &[]), TOOLCHAIN),
            CacheKey::new(
                &source("a", &["X=1"]),
                Toolchain {
                    compute: (8, 9),
                    ..TOOLCHAIN
                },
            ),
            CacheKey::new(
                &source("a", &["X=1"]),
                Toolchain {
                    nvrtc: (13, 1),
                    ..TOOLCHAIN
                },
            ),
            CacheKey::new(
                &source("a", &["X=1"]),
                Toolchain {
                    driver: 12080,
                    ..TOOLCHAIN
                },
            ),
        ];
        for other in &others {
            assert_ne!(other.file_name, base.file_name);
            assert_ne!(other.header, base.header);
        }
        assert!(base.file_name.starts_with("normalize-"));
    }

    #[test]
    fn what_is_stored_is_loaded_and_nothing_else() {
        let dir = folder("roundtrip");
        let cache = KernelCache::at(Some(dir.clone()));
        let key = CacheKey::new(&source("kernel", &[]), TOOLCHAIN);
        assert_eq!(cache.load(&key), None);
        let ptx = "//\n.version 9.0\n.target sm_90\n.entry f() { ret; }\n";
        cache.store(&key, ptx).unwrap();
        assert_eq!(cache.load(&key).as_deref(), Some(ptx));
        // Another kernel's key finds nothing; no partial file is left behind.
        let other = CacheKey::new(&source("kernel", &["Y"]), TOOLCHAIN);
        assert_eq!(cache.load(&other), None);
        let names: Vec<_> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names, vec![key.file_name.clone()]);
        // A file cut short, or changed, is a miss; storing again mends it.
        let path = dir.join(&key.file_name);
        let whole = fs::read_to_string(&path).unwrap();
        fs::write(&path, &whole[..whole.len() - 5]).unwrap();
        assert_eq!(cache.load(&key), None);
        fs::write(&path, whole.replace("ret;", "exit;")).unwrap();
        assert_eq!(cache.load(&key), None);
        fs::write(&path, "").unwrap();
        assert_eq!(cache.load(&key), None);
        cache.store(&key, ptx).unwrap();
        assert_eq!(cache.load(&key).as_deref(), Some(ptx));
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_folder_follows_the_environment() {
        let os = |s: &str| Some(OsString::from(s));
        let at = |cache, xdg, home| KernelCache::from_variables(cache, xdg, home).folder;
        assert_eq!(at(os("/k"), os("/x"), os("/h")), Some(PathBuf::from("/k")));
        assert_eq!(at(os("off"), os("/x"), os("/h")), None);
        assert_eq!(at(os(""), os("/x"), os("/h")), None);
        assert_eq!(
            at(None, os("/x"), os("/h")),
            Some(PathBuf::from("/x/gpufeed/kernels"))
        );
        assert_eq!(
            at(None, os(""), os("/h")),
            Some(PathBuf::from("/h/.cache/gpufeed/kernels"))
        );
        assert_eq!(at(None, None, None), None);
    }

    /// On the GPU: a kernel compiled through an empty cache is kept there, the next compile of it
    /// loads it from the file, and the loaded kernel runs; a file changed on disk is compiled
    /// afresh.
    #[test]
    fn a_kernel_kept_on_disk_loads_and_runs() {
        use crate::cuda::{compile_through, Compiled};
        use cudarc::driver::{LaunchConfig, PushKernelArg};
        let Some(gpu) = crate::cuda::test_gpu(module_path!()) else {
            return;
        };
        let stream = gpu.stream().clone();
        let ctx = stream.context().clone();
        let dir = folder("gpu");
        let cache = KernelCache::at(Some(dir.clone()));
        let kernel = KernelSource {
            name: "cache-test.cu",
            code: "extern \"C\" __global__ void fill(unsigned *out, unsigned n) {\n\
                   unsigned i = blockIdx.x * blockDim.x + threadIdx.x;\n\
                   if (i < n) out[i] = i * FACTOR + 1u;\n}\n",
            defines: vec!["FACTOR=3u".into()],
        };
        let run = |module: &std::sync::Arc<cudarc::driver::CudaModule>| -> Vec<u32> {
            let fill = module.load_function("fill").expect("the kernel");
            let n = 1000u32;
            let mut out = stream
                .clone_htod(&vec![u32::MAX; n as usize])
                .expect("poison");
            let mut launch = stream.launch_builder(&fill);
            launch.arg(&mut out).arg(&n);
            // SAFETY: `out` holds `n` values and the kernel writes only indices below `n`.
            unsafe { launch.launch(LaunchConfig::for_num_elems(n)) }.expect("launch");
            stream.clone_dtoh(&out).expect("download")
        };
        let want: Vec<u32> = (0..1000).map(|i| i * 3 + 1).collect();
        let (first, how) = compile_through(&ctx, &kernel, &cache).expect("compile");
        assert_eq!(how, Compiled::ByNvrtc);
        assert_eq!(run(&first), want);
        let files: Vec<_> = fs::read_dir(&dir).expect("the folder").collect();
        assert_eq!(files.len(), 1, "one file kept");
        let (second, how) = compile_through(&ctx, &kernel, &cache).expect("load");
        assert_eq!(how, Compiled::FromDisk);
        assert_eq!(run(&second), want);
        // Another definition is another kernel.
        let other = KernelSource {
            defines: vec!["FACTOR=5u".into()],
            ..kernel.clone()
        };
        let (third, how) = compile_through(&ctx, &other, &cache).expect("compile");
        assert_eq!(how, Compiled::ByNvrtc);
        assert_eq!(run(&third)[7], 36);
        // A file changed on disk is not trusted.
        let path = files[0].as_ref().expect("an entry").path();
        let text = fs::read_to_string(&path).expect("the file");
        fs::write(&path, format!("{text}// changed\n")).expect("changing the file");
        let (_, how) = compile_through(&ctx, &kernel, &cache).expect("compile");
        assert_eq!(how, Compiled::ByNvrtc);
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn no_folder_keeps_nothing_and_an_unwritable_one_is_an_error_not_a_panic() {
        let none = KernelCache::at(None);
        let key = CacheKey::new(&source("kernel", &[]), TOOLCHAIN);
        none.store(&key, "ptx").unwrap();
        assert_eq!(none.load(&key), None);
        // A folder under a plain file cannot be made.
        let dir = folder("unwritable");
        fs::create_dir_all(&dir).unwrap();
        let file = dir.join("file");
        fs::write(&file, "x").unwrap();
        let blocked = KernelCache::at(Some(file.join("kernels")));
        assert!(blocked.store(&key, "ptx").is_err());
        assert_eq!(blocked.load(&key), None);
        let _ = fs::remove_dir_all(&dir);
    }
}
