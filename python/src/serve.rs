//! `gpufeed.PatchServer` and `gpufeed.ServedBatch`: a request's images (bytes or paths) to one
//! packed patch batch, its tokens and side tensors as DLPack tensors.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use gpufeed::patches::Patches;
use gpufeed::{DType, Decode, DecodeOptions, Device, OnError, RequestImage};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyString};

use crate::options::{parse, Name};
use crate::pipeline::installed_pillow;
use crate::tensor::Tensor;
use crate::to_py_err;

/// Serves patch sequences for a vision tower: built once (the preset, the device, the dtype,
/// the most images and tokens of a request), each `serve([...])` decodes and resizes a
/// request's images (bytes or paths) and lays their tokens out on the device, as a `Pipeline`
/// with the same preset would (bit for bit), without starting one per request. On a CUDA device
/// the GPU decode lane decodes the JPEGs its exact path takes and the CPU threads the others
/// (``decode="cpu"``: the CPU threads decode every image); the bytes are the same either way.
///
/// ``preset`` is ``"qwen2-vl"`` (transformers' ``Qwen2VLImageProcessor``: packed tokens,
/// ``image_grid_thw``, ``cu_seqlens``), ``"qwen3-vl"`` (the same processor with Qwen3-VL's
/// settings: patches of 16, mean and std 0.5, 256 x 256 to 4096 x 4096 pixels) or
/// ``"siglip2-naflex"`` (``Siglip2ImageProcessor``: padded to ``max_patches`` with
/// ``pixel_attention_mask`` and ``spatial_shapes``).
#[pyclass(module = "gpufeed", frozen)]
pub struct PatchServer {
    inner: Mutex<gpufeed::PatchServer>,
    /// The preset's name ([`Patches::preset_name`]).
    preset: &'static str,
    /// The process that built the server (its threads do not exist in a fork).
    process: u32,
}

/// One image of a request as Python gave it.
enum Given<'py> {
    Bytes(Bound<'py, PyBytes>),
    Copied(Vec<u8>),
    Path(PathBuf),
}

impl<'py> Given<'py> {
    fn extract(value: &Bound<'py, PyAny>, position: usize) -> PyResult<Given<'py>> {
        if let Ok(bytes) = value.cast::<PyBytes>() {
            return Ok(Given::Bytes(bytes.clone()));
        }
        if let Ok(array) = value.cast::<PyByteArray>() {
            return Ok(Given::Copied(array.to_vec()));
        }
        if value.is_instance_of::<PyString>() || value.hasattr("__fspath__")? {
            return Ok(Given::Path(value.extract::<PathBuf>()?));
        }
        if let Ok(view) = value.call_method0("tobytes") {
            if let Ok(bytes) = view.cast::<PyBytes>() {
                return Ok(Given::Copied(bytes.as_bytes().to_vec()));
            }
        }
        Err(PyTypeError::new_err(format!(
            "image {position} of the request is a {}: give encoded bytes or a path",
            value.get_type().name()?
        )))
    }

    fn request(&self) -> RequestImage<'_> {
        match self {
            Given::Bytes(bytes) => RequestImage::Bytes(bytes.as_bytes()),
            Given::Copied(bytes) => RequestImage::Bytes(bytes),
            Given::Path(path) => RequestImage::Path(path),
        }
    }
}

/// The preset of `name` with the settings given.
#[allow(clippy::too_many_arguments)]
fn patches_of(
    py: Python<'_>,
    name: &str,
    min_pixels: Option<u64>,
    max_pixels: Option<u64>,
    max_patches: Option<u32>,
    packed: Option<bool>,
    torchvision: bool,
    mean_std: (Option<[f64; 3]>, Option<[f64; 3]>),
    pillow_version: Option<(u32, u32)>,
) -> PyResult<Patches> {
    let mut patches = Patches::from_name(name)
        .map_err(|e: gpufeed::ParseOptionError| PyValueError::new_err(e.to_string()))?;
    if let Some(pixels) = min_pixels {
        patches = patches.min_pixels(pixels);
    }
    if let Some(pixels) = max_pixels {
        patches = patches.max_pixels(pixels);
    }
    if let Some(n) = max_patches {
        patches = patches.max_patches(n);
    }
    if let Some(packed) = packed {
        patches = patches.packed(packed);
    }
    if torchvision {
        patches = patches.torchvision();
    }
    let (mean, std) = mean_std;
    patches = patches.mean_std(mean.unwrap_or(patches.mean), std.unwrap_or(patches.std));
    // The Pillow transformers' PIL processors run on here decides their bytes.
    if let Some(version) = pillow_version.or_else(|| installed_pillow(py)) {
        patches.pillow_version = version;
    }
    Ok(patches)
}

#[pymethods]
impl PatchServer {
    #[new]
    #[pyo3(signature = (preset="qwen2-vl", *, device=None, dtype=None, max_images=32, max_tokens=None, threads=0, on_error="fail", decode="auto", min_pixels=None, max_pixels=None, max_patches=None, packed=None, torchvision=false, mean=None, std=None, pillow_version=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        preset: &str,
        device: Option<Name>,
        dtype: Option<Name>,
        max_images: usize,
        max_tokens: Option<usize>,
        threads: usize,
        on_error: &str,
        decode: &str,
        min_pixels: Option<u64>,
        max_pixels: Option<u64>,
        max_patches: Option<u32>,
        packed: Option<bool>,
        torchvision: bool,
        mean: Option<[f64; 3]>,
        std: Option<[f64; 3]>,
        pillow_version: Option<(u32, u32)>,
    ) -> PyResult<PatchServer> {
        let patches = patches_of(
            py,
            preset,
            min_pixels,
            max_pixels,
            max_patches,
            packed,
            torchvision,
            (mean, std),
            pillow_version,
        )?;
        let device = match device {
            Some(name) => parse::<Device>(&name)?,
            None => Device::Cuda(0),
        };
        let dtype = match dtype {
            Some(name) => parse::<DType>(&name)?,
            None => DType::F16,
        };
        let on_error = match on_error {
            "fail" => OnError::Fail,
            "skip" => OnError::Skip,
            other => {
                return Err(PyValueError::new_err(format!(
                    "on_error={other:?}: \"fail\" or \"skip\""
                )))
            }
        };
        let lanes = decode
            .parse::<Decode>()
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        let mut builder = gpufeed::PatchServer::builder(patches)
            .device(device)
            .dtype(dtype)
            .max_images(max_images)
            .threads(threads)
            .on_error(on_error)
            .decode(DecodeOptions::default().lanes(lanes));
        if let Some(tokens) = max_tokens {
            builder = builder.max_tokens(tokens);
        }
        // Opening CUDA and compiling the kernel take a while: without the GIL.
        let server = py.detach(|| builder.build()).map_err(to_py_err)?;
        Ok(PatchServer {
            inner: Mutex::new(server),
            preset: patches.preset_name(),
            process: std::process::id(),
        })
    }

    /// Serves one request: `images` is a list of encoded images (`bytes`, `bytearray`,
    /// `memoryview`) or paths (`str`, `os.PathLike`), in any mix. Returns a `ServedBatch`. A bad
    /// image raises `gpufeed.ItemError` naming it (``image 2 of the request: ...`` or its path)
    /// unless the server skips them (``on_error="skip"``); the server goes on serving either way.
    fn serve(&self, py: Python<'_>, images: Vec<Bound<'_, PyAny>>) -> PyResult<ServedBatch> {
        let current = std::process::id();
        if current != self.process {
            return Err(to_py_err(gpufeed::Error::Forked {
                built: self.process,
                current,
            }));
        }
        let given = images
            .iter()
            .enumerate()
            .map(|(i, image)| Given::extract(image, i))
            .collect::<PyResult<Vec<Given<'_>>>>()?;
        let request: Vec<RequestImage<'_>> = given.iter().map(Given::request).collect();
        // Python's bytes are immutable and held above: read without the GIL.
        let batch = py
            .detach(|| {
                self.inner
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
                    .serve(&request)
            })
            .map_err(to_py_err)?;
        ServedBatch::new(py, batch, self.preset)
    }

    /// The most images a request may bring.
    #[getter]
    fn max_images(&self) -> usize {
        self.lock().max_images()
    }

    /// The most tokens (padding aside) a request may bring.
    #[getter]
    fn max_tokens(&self) -> usize {
        self.lock().max_tokens()
    }

    /// The preset's name.
    #[getter]
    fn preset(&self) -> &'static str {
        self.preset
    }

    /// The device the tokens land on, in words.
    #[getter]
    fn device_description(&self) -> String {
        self.lock().device_description()
    }

    /// Which lanes decode the requests' images, and why, in words.
    #[getter]
    fn decode_description(&self) -> String {
        self.lock().decode_description()
    }

    fn __repr__(&self) -> String {
        let server = self.lock();
        format!(
            "gpufeed.PatchServer({:?}, up to {} images and {} tokens a request, on {})",
            self.preset,
            server.max_images(),
            server.max_tokens(),
            server.device_description()
        )
    }
}

impl PatchServer {
    fn lock(&self) -> std::sync::MutexGuard<'_, gpufeed::PatchServer> {
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// One served request: its tokens and the side tensors the model takes with them, as DLPack
/// tensors on the server's device (`torch.from_dlpack(...)`, `numpy.from_dlpack(...)` on the
/// CPU). Each side tensor is made on the device the first time it is read, then kept.
#[pyclass(module = "gpufeed", frozen)]
pub struct ServedBatch {
    /// The tokens: `[rows, patch_dim]` packed (Qwen2-VL's `pixel_values`), or `[images,
    /// max_patches, patch_dim]` padded (SigLIP2's).
    #[pyo3(get)]
    tokens: Py<Tensor>,
    /// Each row's image id: its path, or ``image N of the request`` for bytes.
    #[pyo3(get)]
    ids: Vec<String>,
    /// Which image of the request each row is (all of them, in order, unless some were
    /// skipped).
    #[pyo3(get)]
    indices: Vec<usize>,
    /// Images left out (``on_error="skip"``): ``(id, reason)``.
    #[pyo3(get)]
    skipped: Vec<(String, String)>,
    /// The preset's name.
    #[pyo3(get)]
    preset: &'static str,
    /// How many of the images the CPU threads decoded and how many the GPU decode lane, as
    /// ``(cpu, gpu)``.
    #[pyo3(get)]
    decoded_by: (usize, usize),
    info: gpufeed::BatchPatches,
    /// The side tensors once made: grids, cu_seqlens, mask, spatial shapes, coordinates.
    made: [OnceLock<Py<Tensor>>; 5],
}

/// Which side tensor, by its place in [`ServedBatch::made`].
#[derive(Clone, Copy)]
enum Side {
    Grids,
    CuSeqlens,
    Mask,
    SpatialShapes,
    Coordinates,
}

impl ServedBatch {
    fn new(py: Python<'_>, batch: gpufeed::Batch, preset: &'static str) -> PyResult<ServedBatch> {
        let info = batch
            .patches()
            .cloned()
            .ok_or_else(|| PyValueError::new_err("a served batch without its patches"))?;
        let ids = batch.ids().to_vec();
        let indices = batch.indices().to_vec();
        let decoded_by = batch.decoded_by();
        let skipped = batch
            .skipped()
            .iter()
            .map(|e| (e.id.clone(), e.kind.to_string()))
            .collect();
        let tokens = Py::new(py, Tensor::new(Arc::new(batch.into_images())))?;
        Ok(ServedBatch {
            tokens,
            ids,
            indices,
            skipped,
            preset,
            decoded_by,
            info,
            made: Default::default(),
        })
    }

    /// The side tensor `side`, made on the batch's device the first time it is asked for.
    fn side(&self, py: Python<'_>, side: Side) -> PyResult<Py<Tensor>> {
        let cell = &self.made[side as usize];
        if let Some(tensor) = cell.get() {
            return Ok(tensor.clone_ref(py));
        }
        let made = match side {
            Side::Grids => self.info.grids_tensor(),
            Side::CuSeqlens => self.info.cu_seqlens_tensor(),
            Side::Mask => self.info.mask_tensor(),
            Side::SpatialShapes => self.info.spatial_shapes_tensor(),
            Side::Coordinates => self.info.coordinates_tensor(),
        };
        let tensor = Py::new(py, Tensor::new(Arc::new(made.map_err(to_py_err)?)))?;
        Ok(cell.get_or_init(|| tensor).clone_ref(py))
    }
}

#[pymethods]
impl ServedBatch {
    /// Qwen2-VL's ``image_grid_thw``: ``[images, 3]`` int64 (t, h, w patches).
    #[getter]
    fn grids(&self, py: Python<'_>) -> PyResult<Py<Tensor>> {
        self.side(py, Side::Grids)
    }

    /// Each image's first row, then the rows: ``[images + 1]`` int32 (flash attention's
    /// ``cu_seqlens``; padded, the padded starts).
    #[getter]
    fn cu_seqlens(&self, py: Python<'_>) -> PyResult<Py<Tensor>> {
        self.side(py, Side::CuSeqlens)
    }

    /// 1 for an image's token, 0 for padding: ``[images, length]`` int32 padded (SigLIP2's
    /// ``pixel_attention_mask``), ``[rows]`` packed.
    #[getter]
    fn mask(&self, py: Python<'_>) -> PyResult<Py<Tensor>> {
        self.side(py, Side::Mask)
    }

    /// SigLIP2's ``spatial_shapes``: ``[images, 2]`` int64 (h, w patches).
    #[getter]
    fn spatial_shapes(&self, py: Python<'_>) -> PyResult<Py<Tensor>> {
        self.side(py, Side::SpatialShapes)
    }

    /// Each token's patch (row, column) in its image: ``[images, length, 2]`` int64 padded,
    /// ``[rows, 2]`` packed.
    #[getter]
    fn coordinates(&self, py: Python<'_>) -> PyResult<Py<Tensor>> {
        self.side(py, Side::Coordinates)
    }

    /// Each image's patch grid as ``(t, h, w)`` Python ints.
    #[getter]
    fn grid_list(&self) -> Vec<(i64, i64, i64)> {
        self.info
            .grids()
            .into_iter()
            .map(|[t, h, w]| (t, h, w))
            .collect()
    }

    /// Each image's resized size as ``(height, width)`` pixels.
    #[getter]
    fn sizes(&self) -> Vec<(u32, u32)> {
        self.info
            .plans()
            .iter()
            .map(|p| (p.height, p.width))
            .collect()
    }

    fn __len__(&self) -> usize {
        self.ids.len()
    }

    fn __repr__(&self) -> String {
        format!(
            "gpufeed.ServedBatch({:?}, {} images, {} rows, {} skipped)",
            self.preset,
            self.ids.len(),
            self.info.layout().rows,
            self.skipped.len()
        )
    }
}
