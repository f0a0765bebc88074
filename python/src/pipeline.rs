//! `gpufeed.Pipeline` and `gpufeed.Batch`.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use gpufeed::{ReadReport, RemoteOptions, Source, UrlLayout};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::options::builder_from;
use crate::tensor::Tensor;
use crate::to_py_err;

/// Batches of images, prepared in the background. Iterating runs one epoch; iterating again
/// runs the next one.
#[pyclass(module = "gpufeed", frozen)]
pub struct Pipeline {
    inner: Mutex<gpufeed::Pipeline>,
    /// Whether a batch of the current epoch was taken (or the epoch ran out): a new iteration
    /// then starts the next epoch.
    epoch_begun: AtomicBool,
}

impl Pipeline {
    fn lock(&self) -> MutexGuard<'_, gpufeed::Pipeline> {
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn take_batch(&self, py: Python<'_>) -> PyResult<Option<Batch>> {
        self.epoch_begun.store(true, Ordering::SeqCst);
        // The GIL is released while the batch is waited for: the prefetch thread and other
        // Python threads go on.
        let batch = py.detach(|| self.lock().next_batch()).map_err(to_py_err)?;
        batch.map(|b| Batch::new(py, b)).transpose()
    }
}

#[pymethods]
impl Pipeline {
    #[new]
    #[pyo3(signature = (source=None, *, paths=None, image_folder=false, webdataset=false, cache_dir=None, cache_limit=None, read_budget=None, max_requests=None, shuffle_window=None, **options))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        source: Option<PathBuf>,
        paths: Option<Vec<PathBuf>>,
        image_folder: bool,
        webdataset: bool,
        cache_dir: Option<PathBuf>,
        cache_limit: Option<u64>,
        read_budget: Option<u64>,
        max_requests: Option<usize>,
        shuffle_window: Option<usize>,
        options: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Pipeline> {
        let builder = builder_from(options)?;
        if image_folder && webdataset {
            return Err(PyTypeError::new_err(
                "image_folder=True and webdataset=True: a folder is one or the other",
            ));
        }
        let url = source
            .as_ref()
            .and_then(|s| s.to_str())
            .filter(|s| s.contains("://"))
            .map(str::to_string);
        let remote_given = cache_dir.is_some()
            || cache_limit.is_some()
            || read_budget.is_some()
            || max_requests.is_some()
            || shuffle_window.is_some();
        let source = match (source, paths) {
            (Some(_), None) if url.is_some() => {
                let defaults = RemoteOptions::default();
                let remote = RemoteOptions::default()
                    .cache_dir(cache_dir)
                    .cache_limit(cache_limit.unwrap_or(defaults.cache_limit))
                    .read_budget(read_budget.unwrap_or(defaults.read_budget))
                    .max_requests(max_requests.unwrap_or(defaults.max_requests))
                    .shuffle_window(shuffle_window);
                let layout = if image_folder {
                    UrlLayout::ImageFolder
                } else if webdataset {
                    UrlLayout::WebDataset
                } else {
                    UrlLayout::Images
                };
                let url = url.unwrap_or_default();
                // Listing (and indexing shards) waits on the network: without the GIL.
                py.detach(|| Source::url(&url, layout, &remote))
            }
            _ if remote_given => {
                return Err(PyTypeError::new_err(
                    "cache_dir, cache_limit, read_budget, max_requests and shuffle_window are \
                     for a URL source (s3://, gs://, az://, https://)",
                ))
            }
            (Some(root), None) if image_folder => Source::image_folder(root),
            (Some(root), None) if webdataset => Source::webdataset(root),
            (Some(root), None) => Source::directory(root),
            (None, Some(paths)) if !image_folder && !webdataset => Ok(Source::paths(paths)),
            (None, Some(_)) => {
                return Err(PyTypeError::new_err(
                    "image_folder=True and webdataset=True need a folder, not paths=[...]",
                ))
            }
            (Some(_), Some(_)) => {
                return Err(PyTypeError::new_err(
                    "give either a folder or paths=[...], not both",
                ))
            }
            (None, None) => {
                return Err(PyTypeError::new_err(
                    "Pipeline() needs a folder (Pipeline(\"val/\")) or paths=[...]",
                ))
            }
        }
        .map_err(to_py_err)?;
        // Opening CUDA and compiling the kernel take a while: without the GIL.
        let pipeline = py
            .detach(|| builder.source(source).build())
            .map_err(to_py_err)?;
        Ok(Pipeline {
            inner: Mutex::new(pipeline),
            epoch_begun: AtomicBool::new(false),
        })
    }

    fn __iter__(slf: PyRef<'_, Self>) -> PyResult<PyRef<'_, Self>> {
        if slf.epoch_begun.swap(false, Ordering::SeqCst) {
            let this: &Pipeline = &slf;
            slf.py()
                .detach(|| this.lock().next_epoch())
                .map_err(to_py_err)?;
        }
        Ok(slf)
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<Option<Batch>> {
        self.take_batch(py)
    }

    /// The next batch of the current epoch, or `None` once it is over.
    fn next_batch(&self, py: Python<'_>) -> PyResult<Option<Batch>> {
        self.take_batch(py)
    }

    /// Starts the next epoch (abandoning what is left of this one) and returns its number.
    fn next_epoch(&self, py: Python<'_>) -> PyResult<u64> {
        self.epoch_begun.store(false, Ordering::SeqCst);
        py.detach(|| self.lock().next_epoch()).map_err(to_py_err)
    }

    /// Images per epoch for this process (its shard), before any is skipped.
    fn __len__(&self) -> usize {
        self.lock().len()
    }

    /// The current epoch (the first is 0).
    #[getter]
    fn epoch(&self) -> u64 {
        self.lock().epoch()
    }

    /// Images in the whole source (all shards).
    #[getter]
    fn source_len(&self) -> usize {
        self.lock().source_len()
    }

    /// Class names by label (`image_folder=True`), else `None`.
    #[getter]
    fn class_names(&self) -> Option<Vec<String>> {
        self.lock().class_names().map(|c| c.to_vec())
    }

    /// The device the batches land on, in words.
    #[getter]
    fn device_description(&self) -> String {
        self.lock().device_description().to_string()
    }

    /// The `CUstream` handle the batches are written on (`None` on the CPU device), e.g. for
    /// `torch.cuda.ExternalStream`.
    #[getter]
    fn cuda_stream(&self) -> Option<usize> {
        self.lock().cuda_stream().map(|s| s.cu_stream() as usize)
    }

    /// What happened to every image of the current epoch so far: a dict with `epoch`, `images`,
    /// `padded`, `batches`, `skipped` (a list of `(id, reason)`), `dropped` and `complete`.
    fn epoch_report<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let report = self.lock().epoch_report().clone();
        let dict = PyDict::new(py);
        dict.set_item("epoch", report.epoch)?;
        dict.set_item("images", report.images)?;
        dict.set_item("padded", report.padded)?;
        dict.set_item("batches", report.batches)?;
        dict.set_item("skipped", skipped_list(&report.skipped))?;
        dict.set_item("dropped", report.dropped)?;
        dict.set_item("complete", report.complete)?;
        let reads = report
            .reads
            .as_ref()
            .map(|r| reads_dict(py, r))
            .transpose()?;
        dict.set_item("reads", reads)?;
        Ok(dict)
    }

    fn __repr__(&self) -> String {
        let pipeline = self.lock();
        format!(
            "gpufeed.Pipeline({} images, epoch {}, {})",
            pipeline.len(),
            pipeline.epoch(),
            pipeline.device_description()
        )
    }
}

/// What reading an epoch took from object storage, as a dict.
fn reads_dict<'py>(py: Python<'py>, reads: &ReadReport) -> PyResult<Bound<'py, PyDict>> {
    let dict = PyDict::new(py);
    dict.set_item("requests", reads.requests)?;
    dict.set_item("bytes", reads.bytes)?;
    dict.set_item("objects_fetched", reads.fetched)?;
    dict.set_item("cache_hits", reads.cache_hits)?;
    dict.set_item("cache_bytes", reads.cache_bytes)?;
    dict.set_item("kept_in_memory", reads.kept)?;
    dict.set_item("cache_hit_rate", reads.cache_hit_rate())?;
    dict.set_item("failed", reads.failed)?;
    dict.set_item("waits", reads.waits)?;
    dict.set_item("waited_seconds", reads.waited.as_secs_f64())?;
    Ok(dict)
}

fn skipped_list(skipped: &[gpufeed::ItemError]) -> Vec<(String, String)> {
    skipped
        .iter()
        .map(|e| (e.id.clone(), e.kind.to_string()))
        .collect()
}

/// One batch: the images as a DLPack tensor, and which images they are.
#[pyclass(module = "gpufeed", frozen)]
pub struct Batch {
    /// The images, `[N, 3, H, W]` (nchw) or `[N, H, W, 3]` (nhwc): `torch.from_dlpack(...)`,
    /// `numpy.from_dlpack(...)`.
    #[pyo3(get)]
    images: Py<Tensor>,
    /// Class label of each image (`image_folder=True`), else `None`.
    #[pyo3(get)]
    labels: Option<Vec<u32>>,
    /// Id (path) of each image, in batch order.
    #[pyo3(get)]
    ids: Vec<String>,
    /// Index of each image in the source's listing.
    #[pyo3(get)]
    indices: Vec<usize>,
    /// Images skipped while this batch was filled: `(id, reason)`.
    #[pyo3(get)]
    skipped: Vec<(String, String)>,
    /// The epoch the batch belongs to.
    #[pyo3(get)]
    epoch: u64,
    /// Whether each row pads this rank's shard (a repeat, so that every rank yields the same
    /// number of batches): mask these rows when evaluating.
    #[pyo3(get)]
    padded: Vec<bool>,
    /// What the random transforms drew for each row, `(top, left, height, width, flipped)` in
    /// source pixels (torchvision's `F.resized_crop` then `F.hflip`), or `None` without them.
    #[pyo3(get)]
    crops: Option<Vec<Crop>>,
}

/// `(top, left, height, width, flipped)`.
type Crop = (u32, u32, u32, u32, bool);

impl Batch {
    fn new(py: Python<'_>, batch: gpufeed::Batch) -> PyResult<Batch> {
        let labels = batch.labels().map(|l| l.to_vec());
        let ids = batch.ids().to_vec();
        let indices = batch.indices().to_vec();
        let skipped = skipped_list(batch.skipped());
        let epoch = batch.epoch();
        let padded = batch.padded().to_vec();
        let crops = batch.crops().map(|crops| {
            crops
                .iter()
                .map(|c| (c.top, c.left, c.height, c.width, c.flipped))
                .collect()
        });
        let images = Py::new(py, Tensor::new(Arc::new(batch.into_images())))?;
        Ok(Batch {
            images,
            labels,
            ids,
            indices,
            skipped,
            epoch,
            padded,
            crops,
        })
    }
}

#[pymethods]
impl Batch {
    fn __len__(&self) -> usize {
        self.ids.len()
    }

    fn __repr__(&self) -> String {
        format!(
            "gpufeed.Batch({} images, epoch {}, {} skipped)",
            self.ids.len(),
            self.epoch,
            self.skipped.len()
        )
    }
}
