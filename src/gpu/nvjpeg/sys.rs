//! Raw nvJPEG: the C types of `nvjpeg.h` (CUDA 12 and 13 share them) and a table of the functions
//! this crate calls, loaded at run time with `libloading` (the crate cudarc uses for libcuda and
//! libnvrtc). Nothing here panics: a missing library or symbol is an [`NvjpegUnavailable`] that names it
//! and lists every place that was tried.
//!
//! Checked against `nvjpeg.h` 13.0.1.86 (the `nvidia-nvjpeg` 13.0.1.86 wheel) and the exports of
//! its `libnvjpeg.so.13`. All enums are C `int`s. `libnvjpeg.so.13` links the CUDA runtime
//! statically (its `NEEDED` entries are libc, libm, libdl, librt, libpthread and libgcc_s only) and
//! opens `libcuda.so.1` and, for the hardware backend, the driver's `libnvcuvid.so.1` itself.
#![allow(non_camel_case_types)]

use std::ffi::{c_int, c_uchar, c_uint, c_void};
use std::fmt;
use std::path::{Path, PathBuf};

use libloading::Library;

/// `nvjpegStatus_t`.
pub type nvjpegStatus_t = c_int;
/// `NVJPEG_STATUS_SUCCESS`.
pub const NVJPEG_STATUS_SUCCESS: nvjpegStatus_t = 0;
/// `NVJPEG_STATUS_NOT_INITIALIZED`.
pub const NVJPEG_STATUS_NOT_INITIALIZED: nvjpegStatus_t = 1;
/// `NVJPEG_STATUS_INVALID_PARAMETER`.
pub const NVJPEG_STATUS_INVALID_PARAMETER: nvjpegStatus_t = 2;
/// `NVJPEG_STATUS_BAD_JPEG`.
pub const NVJPEG_STATUS_BAD_JPEG: nvjpegStatus_t = 3;
/// `NVJPEG_STATUS_JPEG_NOT_SUPPORTED`.
pub const NVJPEG_STATUS_JPEG_NOT_SUPPORTED: nvjpegStatus_t = 4;
/// `NVJPEG_STATUS_ALLOCATOR_FAILURE`.
pub const NVJPEG_STATUS_ALLOCATOR_FAILURE: nvjpegStatus_t = 5;
/// `NVJPEG_STATUS_EXECUTION_FAILED`.
pub const NVJPEG_STATUS_EXECUTION_FAILED: nvjpegStatus_t = 6;
/// `NVJPEG_STATUS_ARCH_MISMATCH`: what `nvjpegCreateEx` returns for the hardware backend on a GPU
/// without JPEG engines.
pub const NVJPEG_STATUS_ARCH_MISMATCH: nvjpegStatus_t = 7;
/// `NVJPEG_STATUS_INTERNAL_ERROR`.
pub const NVJPEG_STATUS_INTERNAL_ERROR: nvjpegStatus_t = 8;
/// `NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED`.
pub const NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED: nvjpegStatus_t = 9;
/// `NVJPEG_STATUS_INCOMPLETE_BITSTREAM`.
pub const NVJPEG_STATUS_INCOMPLETE_BITSTREAM: nvjpegStatus_t = 10;

/// `nvjpegBackend_t`.
pub type nvjpegBackend_t = c_int;
/// `NVJPEG_BACKEND_HARDWARE`: the GPU's JPEG engines (A100, A30, H100, ...); baseline JPEGs with
/// one scan, 1 or 3 components; not 4:1:1 or 4:1:0.
pub const NVJPEG_BACKEND_HARDWARE: nvjpegBackend_t = 3;

/// `nvjpegOutputFormat_t`.
pub type nvjpegOutputFormat_t = c_int;
/// `NVJPEG_OUTPUT_YUV`.
pub const NVJPEG_OUTPUT_YUV: nvjpegOutputFormat_t = 1;
/// `NVJPEG_OUTPUT_Y`.
pub const NVJPEG_OUTPUT_Y: nvjpegOutputFormat_t = 2;
/// `NVJPEG_OUTPUT_RGBI`: interleaved RGB in `channel[0]`, `pitch[0]` bytes a row.
pub const NVJPEG_OUTPUT_RGBI: nvjpegOutputFormat_t = 5;

/// `nvjpegChromaSubsampling_t`.
pub type nvjpegChromaSubsampling_t = c_int;
/// `NVJPEG_CSS_444`.
pub const NVJPEG_CSS_444: nvjpegChromaSubsampling_t = 0;
/// `NVJPEG_CSS_GRAY`.
pub const NVJPEG_CSS_GRAY: nvjpegChromaSubsampling_t = 6;

/// `libraryPropertyType` (`library_types.h`).
pub type libraryPropertyType = c_int;
/// `MAJOR_VERSION`.
pub const MAJOR_VERSION: libraryPropertyType = 0;
/// `MINOR_VERSION`.
pub const MINOR_VERSION: libraryPropertyType = 1;
/// `PATCH_LEVEL`.
pub const PATCH_LEVEL: libraryPropertyType = 2;

/// `NVJPEG_FLAGS_DEFAULT`.
pub const NVJPEG_FLAGS_DEFAULT: c_uint = 0;
/// `NVJPEG_FLAGS_UPSAMPLING_WITH_INTERPOLATION` (nvJPEG 12.1 and later).
pub const NVJPEG_FLAGS_UPSAMPLING_WITH_INTERPOLATION: c_uint = 1 << 5;

/// `NVJPEG_MAX_COMPONENT`.
pub const NVJPEG_MAX_COMPONENT: usize = 4;

/// `nvjpegImage_t`: `unsigned char* channel[4]; size_t pitch[4];` (64 bytes on 64-bit targets).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct nvjpegImage_t {
    /// Device pointers of the output planes (only `channel[0]` for interleaved formats).
    pub channel: [*mut c_uchar; NVJPEG_MAX_COMPONENT],
    /// Bytes from one row to the next, per plane.
    pub pitch: [usize; NVJPEG_MAX_COMPONENT],
}

impl nvjpegImage_t {
    /// All pointers null, all pitches 0.
    pub const EMPTY: nvjpegImage_t = nvjpegImage_t {
        channel: [std::ptr::null_mut(); NVJPEG_MAX_COMPONENT],
        pitch: [0; NVJPEG_MAX_COMPONENT],
    };
}

// nvjpeg.h's layout, checked at compile time.
const _: () = assert!(std::mem::size_of::<nvjpegImage_t>() == 8 * NVJPEG_MAX_COMPONENT * 2);
const _: () = assert!(std::mem::size_of::<usize>() == 8);

/// Opaque `struct nvjpegHandle`.
#[repr(C)]
pub struct nvjpegHandle {
    _opaque: [u8; 0],
}
/// `nvjpegHandle_t`.
pub type nvjpegHandle_t = *mut nvjpegHandle;

/// Opaque `struct nvjpegJpegState`.
#[repr(C)]
pub struct nvjpegJpegState {
    _opaque: [u8; 0],
}
/// `nvjpegJpegState_t`.
pub type nvjpegJpegState_t = *mut nvjpegJpegState;

/// `cudaStream_t`: the runtime's `struct CUstream_st*`, the same object as the driver's `CUstream`
/// (pass `cudarc::driver::CudaStream::cu_stream()` cast to this).
pub type cudaStream_t = *mut c_void;

/// `nvjpegGetProperty` / `nvjpegGetCudartProperty`.
pub type GetPropertyFn =
    unsafe extern "C" fn(kind: libraryPropertyType, value: *mut c_int) -> nvjpegStatus_t;
/// `nvjpegCreateEx`. The allocators are `nvjpegDevAllocator_t*` and `nvjpegPinnedAllocator_t*`;
/// this crate passes null for both (nvJPEG then uses its runtime's cudaMalloc and cudaHostAlloc).
pub type CreateExFn = unsafe extern "C" fn(
    backend: nvjpegBackend_t,
    dev_allocator: *mut c_void,
    pinned_allocator: *mut c_void,
    flags: c_uint,
    handle: *mut nvjpegHandle_t,
) -> nvjpegStatus_t;
/// `nvjpegDestroy`.
pub type DestroyFn = unsafe extern "C" fn(handle: nvjpegHandle_t) -> nvjpegStatus_t;
/// `nvjpegGetHardwareDecoderInfo`.
pub type GetHardwareDecoderInfoFn = unsafe extern "C" fn(
    handle: nvjpegHandle_t,
    num_engines: *mut c_uint,
    num_cores_per_engine: *mut c_uint,
) -> nvjpegStatus_t;
/// `nvjpegJpegStateCreate`.
pub type JpegStateCreateFn =
    unsafe extern "C" fn(handle: nvjpegHandle_t, state: *mut nvjpegJpegState_t) -> nvjpegStatus_t;
/// `nvjpegJpegStateDestroy`.
pub type JpegStateDestroyFn = unsafe extern "C" fn(state: nvjpegJpegState_t) -> nvjpegStatus_t;
/// `nvjpegDecodeBatchedInitialize`.
pub type DecodeBatchedInitializeFn = unsafe extern "C" fn(
    handle: nvjpegHandle_t,
    state: nvjpegJpegState_t,
    batch_size: c_int,
    max_cpu_threads: c_int,
    output_format: nvjpegOutputFormat_t,
) -> nvjpegStatus_t;
/// `nvjpegDecodeBatched`.
pub type DecodeBatchedFn = unsafe extern "C" fn(
    handle: nvjpegHandle_t,
    state: nvjpegJpegState_t,
    data: *const *const c_uchar,
    lengths: *const usize,
    destinations: *mut nvjpegImage_t,
    stream: cudaStream_t,
) -> nvjpegStatus_t;
/// `nvjpegDecodeBatchedPreAllocate`.
pub type DecodeBatchedPreAllocateFn = unsafe extern "C" fn(
    handle: nvjpegHandle_t,
    state: nvjpegJpegState_t,
    batch_size: c_int,
    width: c_int,
    height: c_int,
    chroma_subsampling: nvjpegChromaSubsampling_t,
    output_format: nvjpegOutputFormat_t,
) -> nvjpegStatus_t;

/// The nvJPEG functions this crate calls, resolved from one loaded library.
///
/// The function pointers stay valid while `_library` lives, which is as long as this table: keep
/// the table (it is shared behind an `Arc`) alive while any nvJPEG object exists.
pub struct Functions {
    /// `nvjpegGetProperty`.
    pub get_property: GetPropertyFn,
    /// `nvjpegCreateEx`.
    pub create_ex: CreateExFn,
    /// `nvjpegDestroy`.
    pub destroy: DestroyFn,
    /// `nvjpegGetHardwareDecoderInfo` (nvJPEG 11.9 and later).
    pub get_hardware_decoder_info: Option<GetHardwareDecoderInfoFn>,
    /// `nvjpegJpegStateCreate`.
    pub jpeg_state_create: JpegStateCreateFn,
    /// `nvjpegJpegStateDestroy`.
    pub jpeg_state_destroy: JpegStateDestroyFn,
    /// `nvjpegDecodeBatchedInitialize`.
    pub decode_batched_initialize: DecodeBatchedInitializeFn,
    /// `nvjpegDecodeBatched`.
    pub decode_batched: DecodeBatchedFn,
    /// `nvjpegDecodeBatchedPreAllocate` (nvJPEG 11.6 and later).
    pub decode_batched_pre_allocate: Option<DecodeBatchedPreAllocateFn>,
    /// The file the functions came from.
    pub path: PathBuf,
    _library: Library,
}

impl fmt::Debug for Functions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Functions")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

/// nvJPEG cannot be used: the library or one of its symbols is missing.
#[derive(Debug, Clone)]
pub struct NvjpegUnavailable {
    /// What is missing, in words.
    pub reason: String,
    /// Every library name or path that was tried, with what happened.
    pub tried: Vec<(String, String)>,
    /// The folders that were looked in for the library files (only existing files are tried).
    pub searched: Vec<PathBuf>,
}

impl fmt::Display for NvjpegUnavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.reason)?;
        if !self.tried.is_empty() {
            write!(f, "; tried {} place(s): ", self.tried.len())?;
            for (i, (what, outcome)) in self.tried.iter().enumerate() {
                if i > 0 {
                    write!(f, "; ")?;
                }
                write!(f, "{what} ({outcome})")?;
            }
        }
        if !self.searched.is_empty() {
            write!(f, "; looked in:")?;
            for dir in &self.searched {
                write!(f, " {}", dir.display())?;
            }
        }
        Ok(())
    }
}

impl std::error::Error for NvjpegUnavailable {}

/// File names of the library, newest first: CUDA 13's, then CUDA 12's, then the development link.
pub const LIBRARY_NAMES: [&str; 3] = ["libnvjpeg.so.13", "libnvjpeg.so.12", "libnvjpeg.so"];

/// The environment variable that names the library file (or its folder) to use before any other.
pub const PATH_OVERRIDE_VAR: &str = "GPUFEED_NVJPEG";

/// Places to look for the library, in order, each as the string handed to `dlopen`:
/// `$GPUFEED_NVJPEG`; the bare names (the loader's own search: `LD_LIBRARY_PATH`, the linker
/// cache, the default folders); the CUDA toolkit's usual folders and those named by `CUDA_HOME`,
/// `CUDA_PATH`, `CUDA_ROOT`, `CUDA_TOOLKIT_ROOT_DIR`; the folder of every NVIDIA library already
/// mapped into this process (libnvrtc once cudarc has loaded it, libcudart, ...); and the pip
/// wheels' folders (`nvidia/cu13/lib`, `nvidia/nvjpeg/lib`, `nvidia/cu12/lib`) under Python's
/// site-packages and dist-packages, conda's `lib`, and virtualenvs.
pub fn candidates() -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    if let Some(value) = std::env::var_os(PATH_OVERRIDE_VAR) {
        let path = PathBuf::from(value);
        if path.is_dir() {
            for name in LIBRARY_NAMES {
                out.push(path.join(name).to_string_lossy().into_owned());
            }
        } else {
            out.push(path.to_string_lossy().into_owned());
        }
    }
    for name in LIBRARY_NAMES {
        out.push(name.to_string());
    }
    for dir in search_dirs() {
        for name in LIBRARY_NAMES {
            let file = dir.join(name);
            // Only files that exist: a missing one says nothing worth listing.
            if file.is_file() {
                let file = file.to_string_lossy().into_owned();
                if !out.contains(&file) {
                    out.push(file);
                }
            }
        }
    }
    out
}

/// Folders that may hold the library, without duplicates, in search order.
pub fn search_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    let mut add = |dir: PathBuf| {
        if !dirs.contains(&dir) {
            dirs.push(dir);
        }
    };
    for var in [
        "CUDA_HOME",
        "CUDA_PATH",
        "CUDA_ROOT",
        "CUDA_TOOLKIT_ROOT_DIR",
    ] {
        if let Some(root) = std::env::var_os(var) {
            let root = PathBuf::from(root);
            add(root.join("lib64"));
            add(root.join("targets/x86_64-linux/lib"));
            add(root.join("lib"));
        }
    }
    add(PathBuf::from("/usr/local/cuda/lib64"));
    add(PathBuf::from("/usr/local/cuda/targets/x86_64-linux/lib"));
    // /usr/local/cuda-13.0, /usr/local/cuda-13, /usr/local/cuda-12.8, ...: newest name first.
    let mut versioned = subdirs_starting_with(Path::new("/usr/local"), "cuda-");
    versioned.sort();
    versioned.reverse();
    for root in versioned {
        add(root.join("lib64"));
        add(root.join("targets/x86_64-linux/lib"));
    }
    for dir in mapped_nvidia_library_dirs() {
        add(dir);
    }
    for site in python_package_dirs() {
        for sub in ["nvidia/cu13/lib", "nvidia/nvjpeg/lib", "nvidia/cu12/lib"] {
            add(site.join(sub));
        }
    }
    if let Some(prefix) = std::env::var_os("CONDA_PREFIX") {
        add(PathBuf::from(prefix).join("lib"));
    }
    add(PathBuf::from("/usr/lib/x86_64-linux-gnu"));
    dirs
}

fn subdirs_starting_with(dir: &Path, prefix: &str) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| entry.ok())
        .filter(|entry| entry.file_name().to_string_lossy().starts_with(prefix))
        .map(|entry| entry.path())
        .filter(|path| path.is_dir())
        .collect()
}

/// Python's package folders: every `python3*` under the usual prefixes, with `site-packages` and
/// `dist-packages`, plus Debian's `/usr/lib/python3/dist-packages`.
fn python_package_dirs() -> Vec<PathBuf> {
    let mut prefixes: Vec<PathBuf> = Vec::new();
    for var in ["VIRTUAL_ENV", "CONDA_PREFIX"] {
        if let Some(root) = std::env::var_os(var) {
            prefixes.push(PathBuf::from(root).join("lib"));
        }
    }
    if let Some(home) = std::env::var_os("HOME") {
        prefixes.push(PathBuf::from(home).join(".local/lib"));
    }
    for fixed in ["/usr/local/lib", "/usr/lib", "/opt/conda/lib"] {
        prefixes.push(PathBuf::from(fixed));
    }
    let mut out = Vec::new();
    for prefix in prefixes {
        for python in subdirs_starting_with(&prefix, "python3") {
            out.push(python.join("site-packages"));
            out.push(python.join("dist-packages"));
        }
    }
    out.push(PathBuf::from("/usr/lib/python3/dist-packages"));
    out
}

/// Folders of the NVIDIA libraries this process has mapped (read from `/proc/self/maps`), after
/// opening libnvrtc under the names cudarc uses, so that its folder is found even when cudarc has
/// not loaded it yet. libnvjpeg ships in the same folder as libnvrtc, in the toolkit and in the
/// `nvidia-*-cu13` wheels alike.
pub fn mapped_nvidia_library_dirs() -> Vec<PathBuf> {
    // Held only while /proc/self/maps is read.
    let mut held = Vec::new();
    for name in ["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"] {
        // SAFETY: loading libnvrtc runs only its initialisers, which have no preconditions; no
        // symbol is called, and the handle is closed again below.
        if let Ok(library) = unsafe { Library::new(name) } {
            held.push(library);
            break;
        }
    }
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    drop(held);
    let mut dirs: Vec<PathBuf> = Vec::new();
    for line in maps.lines() {
        // The path is the sixth field; it may contain spaces, so take everything from the first '/'.
        let Some(start) = line.find('/') else {
            continue;
        };
        let path = Path::new(&line[start..]);
        let Some(file) = path.file_name().map(|f| f.to_string_lossy()) else {
            continue;
        };
        let nvidia = ["libnvrtc", "libcudart", "libnvjpeg", "libcublas", "libnpp"]
            .iter()
            .any(|prefix| file.starts_with(prefix));
        if let (true, Some(dir)) = (nvidia, path.parent()) {
            if !dirs.iter().any(|d| d == dir) {
                dirs.push(dir.to_path_buf());
            }
        }
    }
    dirs
}

/// Loads the first library in [`candidates`] that opens and has every required function.
pub fn load() -> Result<Functions, NvjpegUnavailable> {
    let mut tried = Vec::new();
    let mut opened = false;
    for candidate in candidates() {
        // SAFETY: libnvjpeg's initialisers have no preconditions (they set up the statically
        // linked CUDA runtime); no symbol is called here.
        let library = match unsafe { Library::new(&candidate) } {
            Ok(library) => library,
            Err(e) => {
                // libloading's message is "dlopen failed"; dlerror's text is its source.
                let text = match std::error::Error::source(&e) {
                    Some(source) => source.to_string(),
                    None => e.to_string(),
                };
                tried.push((candidate, text));
                continue;
            }
        };
        opened = true;
        match resolve(library, PathBuf::from(&candidate)) {
            Ok(functions) => return Ok(functions),
            Err(missing) => tried.push((candidate, format!("opened, but it lacks {missing}"))),
        }
    }
    let reason = if opened {
        "no libnvjpeg found has every function this crate calls (a CUDA 12 or 13 nvJPEG is needed)"
    } else {
        "libnvjpeg (CUDA's JPEG library: libnvjpeg.so.13 from the CUDA 13 toolkit or the \
         nvidia-nvjpeg wheel) was not found; set GPUFEED_NVJPEG to its path"
    };
    Err(NvjpegUnavailable {
        reason: reason.into(),
        tried,
        searched: search_dirs(),
    })
}

/// Resolves every symbol; the error is the name of the first required one that is missing.
fn resolve(library: Library, path: PathBuf) -> Result<Functions, &'static str> {
    /// A required symbol, as the function pointer type `T`.
    ///
    /// # Safety
    /// `T` must be the symbol's true C signature.
    unsafe fn required<T: Copy>(library: &Library, name: &'static str) -> Result<T, &'static str> {
        // SAFETY: per this function's contract, `T` matches the symbol's type.
        unsafe {
            library
                .get::<T>(name)
                .map(|symbol| *symbol)
                .map_err(|_| name)
        }
    }
    /// An optional symbol: `None` when the library is older than it.
    ///
    /// # Safety
    /// As [`required`].
    unsafe fn optional<T: Copy>(library: &Library, name: &'static str) -> Option<T> {
        // SAFETY: per this function's contract, `T` matches the symbol's type.
        unsafe { library.get::<T>(name).map(|symbol| *symbol).ok() }
    }
    // SAFETY: each type alias above transcribes the prototype of the same name in nvjpeg.h
    // (13.0.1), and the pointers are used only while `library` lives (it moves into the table).
    unsafe {
        Ok(Functions {
            get_property: required(&library, "nvjpegGetProperty")?,
            create_ex: required(&library, "nvjpegCreateEx")?,
            destroy: required(&library, "nvjpegDestroy")?,
            get_hardware_decoder_info: optional(&library, "nvjpegGetHardwareDecoderInfo"),
            jpeg_state_create: required(&library, "nvjpegJpegStateCreate")?,
            jpeg_state_destroy: required(&library, "nvjpegJpegStateDestroy")?,
            decode_batched_initialize: required(&library, "nvjpegDecodeBatchedInitialize")?,
            decode_batched: required(&library, "nvjpegDecodeBatched")?,
            decode_batched_pre_allocate: optional(&library, "nvjpegDecodeBatchedPreAllocate"),
            path,
            _library: library,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_descriptor_has_the_c_layout() {
        assert_eq!(std::mem::size_of::<nvjpegImage_t>(), 64);
        assert_eq!(std::mem::offset_of!(nvjpegImage_t, pitch), 32);
    }

    #[test]
    fn candidates_start_with_the_bare_names() {
        let list = candidates();
        let first_bare = list.iter().position(|c| c == "libnvjpeg.so.13");
        assert!(first_bare.is_some());
    }

    #[test]
    fn a_library_named_by_the_override_loads_with_every_symbol() {
        // Run with GPUFEED_NVJPEG=/path/to/libnvjpeg.so.13 (no GPU needed) to check the symbol
        // names against a real library.
        if std::env::var_os(PATH_OVERRIDE_VAR).is_none() {
            return;
        }
        let f = load().unwrap_or_else(|e| panic!("{e}"));
        assert!(f.get_hardware_decoder_info.is_some());
        assert!(f.decode_batched_pre_allocate.is_some());
        let mut major = 0;
        // SAFETY: nvjpegGetProperty writes one int.
        let status = unsafe { (f.get_property)(MAJOR_VERSION, &mut major) };
        assert_eq!(status, NVJPEG_STATUS_SUCCESS);
        assert!(major >= 12, "nvJPEG {major}");
    }

    #[test]
    fn a_missing_library_is_an_error_that_lists_what_was_tried() {
        match load() {
            // A machine with nvJPEG installed: nothing to check here.
            Ok(functions) => assert!(functions.path.to_string_lossy().contains("nvjpeg")),
            Err(e) => {
                let text = e.to_string();
                assert!(text.contains("libnvjpeg"), "{text}");
                assert!(text.contains("libnvjpeg.so.13 ("), "{text}");
            }
        }
    }
}
