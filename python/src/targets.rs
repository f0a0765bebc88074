//! `gpufeed.TargetLoader`: detection and segmentation batches with their targets, as the
//! images (a padded NumPy array and each row's valid size) and a list of dicts like the ones
//! torchvision's detection models take (`boxes`, `labels`, `masks`, ...).

use std::sync::{Arc, Mutex};

use gpufeed::targets::{TargetBatch, TargetRecipe, TargetSource};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};

use crate::tensor::Tensor;
use crate::to_py_err;

/// Batches of samples with targets: a COCO instances file (``coco=``) beside the image folder,
/// semantic segmentation pairs (``masks=``, the PNG of each image's relative path and stem), or
/// WebDataset shards (``webdataset="detection"``, ``"instances"`` or ``"semantic"``: ``images``
/// a folder of ``.tar`` shards, one shard, or a URL such as ``s3://bucket/train/``; each
/// sample's ``KEY.json`` or ``KEY.seg.png`` beside its image),
/// transformed by one of torchvision's reference recipes (``recipe="lsj"``, ``"hflip"``,
/// ``"multiscale"``, ``"ssdlite"``, ``"segmentation-train"``, ``"segmentation-eval"``,
/// ``"letterbox:W:H"``, ``"none"``). Iterating runs one epoch and yields
/// ``(images, targets)``: ``images`` a uint8 array ``[N, H, W, 3]`` padded to a multiple of
/// ``size_divisible``, ``targets`` a list of one dict a row: ``boxes`` (float32 ``[n, 4]``,
/// XYXY), ``labels`` (int64), ``iscrowd``, ``masks`` (uint8 ``[n, h, w]``, COCO with
/// segmentations), ``semantic`` (uint8 ``[h, w]``, segmentation), ``keypoints``, ``size``
/// (the valid ``(h, w)``), ``index``, ``id``, ``ops`` (the calls drawn) and ``inverse``
/// (``(ax, bx, ay, by)``: output ``x = ax * x0 + bx`` of original ``x0``).
///
/// With ``device="cuda:0"`` the batches are made on that GPU: ``images`` a ``gpufeed.Tensor``
/// ``[N, 3, H, W]`` (DLPack, ``torch.from_dlpack``) normalized there in ``dtype`` (default
/// ``float32``) with ``mean`` and ``std`` (default: ``[0, 1]`` scaling for COCO, ImageNet's
/// for segmentation pairs), and the targets' dicts without ``masks`` and ``semantic``; the
/// masks come third: ``(images, targets, masks)``, ``masks`` a dict of ``instance`` (uint8
/// ``[objects, H, W]``, row ``i``'s objects from ``targets[i]["mask_offset"]``) and
/// ``semantic`` (uint8 ``[N, H, W]``, padding 255), each a ``gpufeed.Tensor`` or ``None``.
///
/// ``prefetch`` batches (by default six rows for each of gpufeed's threads, at least 3
/// batches) are made ahead on gpufeed's threads while one is used
/// (``0``: each made when asked for); the batches are the same whatever it is.
///
/// ``decode`` says who decodes the JPEGs of the batches on a device: ``"auto"`` (the GPU's
/// cores, once their decoders are open a few tenths of a second in; gpufeed's CPU threads
/// before), ``"hybrid"`` (the same, the first batch waiting for the decoders) or ``"cpu"``.
/// The bytes are the same either way; ``report()["decoded_on_device"]`` counts the GPU's.
#[pyclass(module = "gpufeed", frozen)]
pub struct TargetLoader {
    inner: Mutex<gpufeed::targets::TargetLoader>,
    on_device: bool,
}

fn lock(
    m: &Mutex<gpufeed::targets::TargetLoader>,
) -> std::sync::MutexGuard<'_, gpufeed::targets::TargetLoader> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The WebDataset shards (a folder, one shard, or a URL) with targets of `kind`.
fn webdataset_source(
    shards: &std::path::Path,
    kind: &str,
) -> PyResult<gpufeed::Result<TargetSource>> {
    use gpufeed::targets::TargetKind;
    let kind = match kind {
        "detection" => TargetKind::Detection,
        "instances" => TargetKind::Instances,
        "semantic" => TargetKind::Semantic,
        other => {
            return Err(PyValueError::new_err(format!(
                "webdataset={other:?}: one of \"detection\", \"instances\", \"semantic\""
            )))
        }
    };
    let text = shards.to_string_lossy();
    Ok(if text.contains("://") {
        TargetSource::url(&text, kind, &gpufeed::RemoteOptions::default())
    } else {
        TargetSource::webdataset(shards, kind)
    })
}

#[pymethods]
impl TargetLoader {
    #[new]
    #[pyo3(signature = (images, *, coco=None, masks=None, webdataset=None, recipe="none", seed=0, batch_size=8,
                        shuffle=false, size_divisible=32, rank=0, world=1, device=None,
                        dtype=None, mean=None, std=None,
                        prefetch=None, decode="auto"))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        images: std::path::PathBuf,
        coco: Option<std::path::PathBuf>,
        masks: Option<std::path::PathBuf>,
        webdataset: Option<String>,
        recipe: &str,
        seed: u64,
        batch_size: usize,
        shuffle: bool,
        size_divisible: u32,
        rank: usize,
        world: usize,
        device: Option<String>,
        dtype: Option<String>,
        mean: Option<[f32; 3]>,
        std: Option<[f32; 3]>,
        prefetch: Option<usize>,
        decode: &str,
    ) -> PyResult<TargetLoader> {
        let lanes: gpufeed::Decode = decode
            .parse()
            .map_err(|e: gpufeed::ParseOptionError| PyValueError::new_err(e.to_string()))?;
        let recipe = TargetRecipe::parse(recipe).ok_or_else(|| {
            PyValueError::new_err(format!(
                "recipe {recipe:?}: one of {}",
                TargetRecipe::NAMES.join(", ")
            ))
        })?;
        if world == 0 || rank >= world {
            return Err(PyValueError::new_err("rank must be below world"));
        }
        let source = match (coco, masks, webdataset.as_deref()) {
            (Some(coco), None, None) => TargetSource::coco(coco, &images),
            (None, Some(masks), None) => TargetSource::segmentation(&images, masks),
            (None, None, Some(kind)) => webdataset_source(&images, kind)?,
            _ => {
                return Err(PyValueError::new_err(
                    "give coco=, masks= or webdataset=, one of them",
                ))
            }
        }
        .map_err(to_py_err)?;
        let mut loader = gpufeed::targets::TargetLoader::new(source)
            .recipe(recipe)
            .seed(seed)
            .shuffle(shuffle)
            .batch_size(batch_size)
            .size_divisible(size_divisible)
            .shard(rank, world);
        if let Some(n) = prefetch {
            loader = loader.prefetch(n);
        }
        let device: gpufeed::Device = match device.as_deref() {
            None => gpufeed::Device::Cpu,
            Some(name) => name
                .parse()
                .map_err(|e: gpufeed::ParseOptionError| PyValueError::new_err(e.to_string()))?,
        };
        let on_device = matches!(device, gpufeed::Device::Cuda(_));
        let mut output = loader.default_output();
        if let Some(name) = dtype {
            let dtype: gpufeed::DType = name
                .parse()
                .map_err(|e: gpufeed::ParseOptionError| PyValueError::new_err(e.to_string()))?;
            output = output.dtype(dtype);
        }
        if mean.is_some() || std.is_some() {
            output = output.mean_std(mean.unwrap_or(output.mean), std.unwrap_or(output.std));
        }
        let loader = loader.device(device).output(output).decode_lanes(lanes);
        Ok(TargetLoader {
            inner: Mutex::new(loader),
            on_device,
        })
    }

    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        if self.on_device {
            return self.next_on_device(py);
        }
        let batch = py.detach(|| lock(&self.inner).next_batch());
        let Some(batch) = batch else {
            lock(&self.inner).next_epoch();
            return Ok(None);
        };
        batch_to_python(py, &batch).map(Some)
    }

    /// The samples skipped so far, as ``(id, reason)``, and the objects
    /// ``SanitizeBoundingBoxes`` dropped.
    fn report<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let loader = lock(&self.inner);
        let r = loader.report();
        let d = PyDict::new(py);
        d.set_item("samples", r.samples)?;
        d.set_item("objects", r.objects)?;
        d.set_item("dropped_objects", r.dropped_objects)?;
        d.set_item("decoded_on_device", r.decoded_on_device)?;
        let skipped: Vec<(String, String)> = r
            .skipped
            .iter()
            .map(|e| (e.id.clone(), e.kind.to_string()))
            .collect();
        d.set_item("skipped", skipped)?;
        Ok(d)
    }
}

impl TargetLoader {
    /// The next batch on the device: `(images, targets, masks)`.
    fn next_on_device<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        let batch = py.detach(|| lock(&self.inner).next_device_batch());
        let Some(batch) = batch else {
            lock(&self.inner).next_epoch();
            return Ok(None);
        };
        let batch = batch.map_err(to_py_err)?;
        let tensor = |t: gpufeed::DeviceTensor| {
            Py::new(py, Tensor::new(Arc::new(gpufeed::Tensor::Device(t))))
        };
        let images = tensor(batch.images)?;
        let masks = PyDict::new(py);
        masks.set_item("instance", batch.masks.map(tensor).transpose()?)?;
        masks.set_item("semantic", batch.semantic.map(tensor).transpose()?)?;
        let (_, targets) = batch_parts(py, &batch.targets, false)?;
        Ok(Some((images, targets, masks).into_pyobject(py)?.into_any()))
    }
}

/// A NumPy array of `dtype` and `shape` over `bytes` (copied into a Python bytes object).
fn array<'py>(
    py: Python<'py>,
    bytes: &[u8],
    dtype: &str,
    shape: Vec<usize>,
) -> PyResult<Bound<'py, PyAny>> {
    let np = py.import("numpy")?;
    let kwargs = PyDict::new(py);
    kwargs.set_item("dtype", dtype)?;
    np.call_method("frombuffer", (PyBytes::new(py, bytes),), Some(&kwargs))?
        .call_method1("reshape", (shape,))?
        .call_method0("copy")
}

fn batch_to_python<'py>(py: Python<'py>, b: &TargetBatch) -> PyResult<Bound<'py, PyAny>> {
    let (images, targets) = batch_parts(py, b, true)?;
    Ok((images, targets).into_pyobject(py)?.into_any())
}

/// The images as a NumPy array (when `host`, else `None`) and the list of one dict a row (with
/// the masks' host arrays when `host`, with each row's first instance plane `mask_offset`
/// always).
fn batch_parts<'py>(
    py: Python<'py>,
    b: &TargetBatch,
    host: bool,
) -> PyResult<(Option<Bound<'py, PyAny>>, Bound<'py, PyList>)> {
    let (h, w) = (b.height as usize, b.width as usize);
    let images = match host {
        true => Some(array(py, &b.images, "uint8", vec![b.len(), h, w, 3])?),
        false => None,
    };
    let targets = PyList::empty(py);
    for row in 0..b.len() {
        let (o0, o1) = (b.offsets[row], b.offsets[row + 1]);
        let (vh, vw) = (b.sizes[row].0 as usize, b.sizes[row].1 as usize);
        let d = PyDict::new(py);
        let boxes: Vec<u8> = b.boxes[o0..o1]
            .iter()
            .flatten()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        d.set_item("boxes", array(py, &boxes, "<f4", vec![o1 - o0, 4])?)?;
        let labels: Vec<u8> = b.labels[o0..o1]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        d.set_item("labels", array(py, &labels, "<i8", vec![o1 - o0])?)?;
        d.set_item(
            "iscrowd",
            array(py, &b.crowd[o0..o1], "uint8", vec![o1 - o0])?,
        )?;
        d.set_item("mask_offset", o0)?;
        if host && b.masks.len() == b.boxes.len() * h * w {
            let mut planes = Vec::with_capacity((o1 - o0) * vh * vw);
            for p in o0..o1 {
                let plane = &b.masks[p * h * w..(p + 1) * h * w];
                for y in 0..vh {
                    planes.extend_from_slice(&plane[y * w..y * w + vw]);
                }
            }
            d.set_item("masks", array(py, &planes, "uint8", vec![o1 - o0, vh, vw])?)?;
        }
        if host && !b.semantic.is_empty() {
            let plane = &b.semantic[row * h * w..(row + 1) * h * w];
            let mut valid = Vec::with_capacity(vh * vw);
            for y in 0..vh {
                valid.extend_from_slice(&plane[y * w..y * w + vw]);
            }
            d.set_item("semantic", array(py, &valid, "uint8", vec![vh, vw])?)?;
        }
        if let Some(k) = b.keypoints.get(o0..o1) {
            d.set_item("keypoints", k.to_vec())?;
        }
        d.set_item("size", (vh, vw))?;
        d.set_item("index", b.indices[row])?;
        d.set_item("id", &b.ids[row])?;
        let ops: Vec<String> = b.ops[row].iter().map(|op| op.json().to_string()).collect();
        let json = py.import("json")?;
        let ops: PyResult<Vec<Bound<'py, PyAny>>> = ops
            .iter()
            .map(|t| json.call_method1("loads", (t,)))
            .collect();
        d.set_item("ops", ops?)?;
        let m = b
            .inverse
            .get(row)
            .ok_or_else(|| PyRuntimeError::new_err("row without its inverse"))?;
        d.set_item("inverse", (m.ax, m.bx, m.ay, m.by))?;
        targets.append(d)?;
    }
    Ok((images, targets))
}
