//! `gpufeed.Pipeline` and `gpufeed.Batch`.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use gpufeed::Source;
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
    #[pyo3(signature = (source=None, *, paths=None, image_folder=false, webdataset=false, **options))]
    fn new(
        py: Python<'_>,
        source: Option<PathBuf>,
        paths: Option<Vec<PathBuf>>,
        image_folder: bool,
        webdataset: bool,
        options: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Pipeline> {
        let builder = builder_from(options)?;
        if image_folder && webdataset {
            return Err(PyTypeError::new_err(
                "image_folder=True and webdataset=True: a folder is one or the other",
            ));
        }
        let source = match (source, paths) {
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
    /// What each row's augmentations drew: a list per row of `(function, kwargs)`, the
    /// `torchvision.transforms.v2.functional` calls in the order applied; `None` without
    /// augmentations.
    #[pyo3(get)]
    augmentations: Option<Py<PyAny>>,
    /// How the rows were mixed: `{"fn": "mixup", "lam": L}` or `{"fn": "cutmix", "lam": L,
    /// "box": [x1, y1, x2, y2]}` (row `i` with row `i - 1`, row 0 with the last); `None`
    /// without MixUp or CutMix.
    #[pyo3(get)]
    mix: Option<Py<PyAny>>,
    /// The soft labels of a mixed batch, `[N, num_classes, 1, 1]` float32 on the batch's
    /// device (`torch.from_dlpack(batch.soft_labels).flatten(1)`); `None` without mixing.
    #[pyo3(get)]
    soft_labels: Option<Py<Tensor>>,
}

/// `(top, left, height, width, flipped)`.
type Crop = (u32, u32, u32, u32, bool);

impl Batch {
    fn new(py: Python<'_>, mut batch: gpufeed::Batch) -> PyResult<Batch> {
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
        let json = py.import("json")?;
        let loads = |text: String| -> PyResult<Py<PyAny>> {
            Ok(json.call_method1("loads", (text,))?.unbind())
        };
        let augmentations = match batch.augmentations() {
            Some(rows) => {
                let text = format!(
                    "[{}]",
                    rows.iter()
                        .map(|ops| format!(
                            "[{}]",
                            ops.iter()
                                .map(|op| format!(
                                    "[\"{}\", {}]",
                                    op.function(),
                                    op.json_arguments()
                                ))
                                .collect::<Vec<_>>()
                                .join(", ")
                        ))
                        .collect::<Vec<_>>()
                        .join(", ")
                );
                Some(loads(text)?)
            }
            None => None,
        };
        let mix = match batch.mix() {
            Some(gpufeed::Mix::CutMix {
                x1,
                y1,
                x2,
                y2,
                lam,
            }) => Some(loads(format!(
                "{{\"fn\": \"cutmix\", \"lam\": {lam:?}, \"box\": [{x1}, {y1}, {x2}, {y2}]}}"
            ))?),
            Some(m) => Some(loads(format!(
                "{{\"fn\": \"mixup\", \"lam\": {:?}}}",
                m.lam()
            ))?),
            None => None,
        };
        let soft_labels = match batch.take_soft_labels() {
            Some(t) => Some(Py::new(py, Tensor::new(Arc::new(t)))?),
            None => None,
        };
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
            augmentations,
            mix,
            soft_labels,
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
