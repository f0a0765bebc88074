//! `gpufeed.Pipeline` and `gpufeed.Batch`.

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use gpufeed::{
    ExtraValue, Extras, ParquetOptions, PipelineState, ReadReport, RemoteOptions, Source,
    UrlLayout, WaitedBatch,
};
use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};

use crate::options::{builder_from, is_constructor_keyword, with_pillow_version};
use crate::tensor::Tensor;
use crate::to_py_err;

/// How long a wait for a batch lasts before Python's signal handlers (Ctrl-C) get to run.
const SIGNAL_CHECK: Duration = Duration::from_millis(20);

/// Batches of images, prepared in the background. Iterating runs one epoch; iterating again
/// runs the next one. The defaults are torchvision's evaluation transform, Resize(256) +
/// CenterCrop(224) with ImageNet's mean and std, as float16 NCHW batches of 256 on cuda:0.
#[pyclass(module = "gpufeed", frozen)]
pub struct Pipeline {
    inner: Mutex<gpufeed::Pipeline>,
    /// Whether a batch of the current epoch was taken (or the epoch ran out): a new iteration
    /// then starts the next epoch.
    epoch_begun: AtomicBool,
    /// The process that built the pipeline: in a fork of it, the lock may be held by a thread
    /// that does not exist there, so nothing is locked.
    process: u32,
    /// Files the folder listing left out, by extension.
    left_out: Vec<(String, usize)>,
    /// The names of files whose path is not valid UTF-8, by source index: their ids are these
    /// (Python's `os.fsdecode` form, which opens), not the library's `\xNN` text.
    raw_names: HashMap<usize, OsString>,
    /// A Parquet source's extra columns, a row per source index.
    extras: Option<Arc<Extras>>,
}

impl Pipeline {
    fn lock(&self) -> PyResult<MutexGuard<'_, gpufeed::Pipeline>> {
        let current = std::process::id();
        if current != self.process {
            return Err(to_py_err(gpufeed::Error::Forked {
                built: self.process,
                current,
            }));
        }
        Ok(self
            .inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()))
    }

    fn take_batch(&self, py: Python<'_>) -> PyResult<Option<Batch>> {
        self.epoch_begun.store(true, Ordering::SeqCst);
        // The GIL is released while the batch is waited for, in slices: the prefetch thread and
        // other Python threads go on, and Ctrl-C raises KeyboardInterrupt within a slice.
        loop {
            let waited = py.detach(|| self.lock()?.wait_batch(SIGNAL_CHECK).map_err(to_py_err))?;
            match waited {
                WaitedBatch::Ready(batch) => {
                    return Batch::new(py, *batch, &self.raw_names).map(Some)
                }
                WaitedBatch::EpochEnd => return Ok(None),
                WaitedBatch::NotYet => py.check_signals()?,
            }
        }
    }
}

/// Runs `open` on a thread of its own while Python's signal handlers run every
/// [`SIGNAL_CHECK`]: Ctrl-C (a `KeyboardInterrupt`, or whatever a handler raises) sets the
/// interrupt `open` was given, waits the moments its opening takes to stop, and raises.
fn open_interruptibly<F>(py: Python<'_>, open: F) -> PyResult<gpufeed::Result<Source>>
where
    F: FnOnce(gpufeed::Interrupt) -> gpufeed::Result<Source> + Send + 'static,
{
    let interrupt = gpufeed::Interrupt::new();
    let given = interrupt.clone();
    let (sender, receiver) = std::sync::mpsc::channel();
    // Waited on without the GIL, from this thread only.
    let receiver = Mutex::new(receiver);
    let thread = std::thread::Builder::new()
        .name("gpufeed-open".into())
        .spawn(move || {
            let _ = sender.send(open(given));
        })
        .map_err(|e| PyValueError::new_err(format!("cannot start a thread to open: {e}")))?;
    loop {
        let waited = py.detach(|| {
            let receiver = receiver.lock().unwrap_or_else(|p| p.into_inner());
            receiver.recv_timeout(SIGNAL_CHECK)
        });
        match waited {
            Ok(opened) => {
                let _ = thread.join();
                return Ok(opened);
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                if let Err(raised) = py.check_signals() {
                    interrupt.interrupt();
                    let _ = py.detach(|| thread.join());
                    return Err(raised);
                }
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                let _ = thread.join();
                return Err(PyValueError::new_err(
                    "opening the source stopped unexpectedly",
                ));
            }
        }
    }
}

/// `paths=`: a list of paths, or one path.
struct PathList(Vec<PathBuf>);

impl<'py> FromPyObject<'_, 'py> for PathList {
    type Error = PyErr;

    fn extract(value: Borrowed<'_, 'py, PyAny>) -> PyResult<Self> {
        if value.is_instance_of::<PyString>() || value.hasattr("__fspath__")? {
            return Ok(PathList(vec![value.extract::<PathBuf>()?]));
        }
        value.extract::<Vec<PathBuf>>().map(PathList).map_err(|_| {
            PyTypeError::new_err(format!(
                "paths: expected a path or a list of paths, got {}",
                value
                    .get_type()
                    .name()
                    .map_or_else(|_| "?".to_string(), |n| n.to_string())
            ))
        })
    }
}

/// Keyword `name` of the constructor's `**options`, taken out of them (`None` when not given).
/// It must be one of the table's constructor keywords, so that help() and the stub show it.
fn take_keyword<'py, T>(options: Option<&Bound<'py, PyDict>>, name: &str) -> PyResult<Option<T>>
where
    T: FromPyObjectOwned<'py>,
    for<'a> <T as FromPyObject<'a, 'py>>::Error: Into<PyErr>,
{
    if !is_constructor_keyword(name) {
        return Err(PyRuntimeError::new_err(format!(
            "the keyword {name:?} is missing from gpufeed's keyword table"
        )));
    }
    let Some(options) = options else {
        return Ok(None);
    };
    let Some(value) = options.get_item(name)? else {
        return Ok(None);
    };
    options.del_item(name)?;
    if value.is_none() {
        return Ok(None);
    }
    value.extract::<T>().map(Some).map_err(|e| {
        let e: PyErr = e.into();
        PyTypeError::new_err(format!("{name}: {e}"))
    })
}

/// The version `major.minor` of the Pillow this interpreter imports, if it has one.
pub(crate) fn installed_pillow(py: Python<'_>) -> Option<(u32, u32)> {
    let version: String = py
        .import("PIL")
        .ok()?
        .getattr("__version__")
        .ok()?
        .extract()
        .ok()?;
    let mut parts = version.split('.');
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

/// A state given as `state_dict()` made it (a dict), or as its JSON text.
fn state_from(value: &Bound<'_, PyAny>) -> PyResult<PipelineState> {
    let text: String = if value.is_instance_of::<PyString>() {
        value.extract()?
    } else if value.is_instance_of::<PyDict>() {
        value
            .py()
            .import("json")?
            .call_method1("dumps", (value,))?
            .extract()?
    } else {
        return Err(PyTypeError::new_err(format!(
            "state: expected the dict state_dict() returns (or its JSON text), got {}",
            value.get_type().name()?
        )));
    };
    PipelineState::from_json(&text).map_err(|e| PyValueError::new_err(format!("state: {e}")))
}

/// The Parquet keywords given (`None` when none is).
fn parquet_options(options: Option<&Bound<'_, PyDict>>) -> PyResult<Option<ParquetOptions>> {
    let image = take_keyword::<String>(options, "image_column")?;
    let label = take_keyword::<String>(options, "label_column")?;
    let extras = take_keyword::<Vec<String>>(options, "extra_columns")?;
    let split = take_keyword::<String>(options, "split")?;
    if image.is_none() && label.is_none() && extras.is_none() && split.is_none() {
        return Ok(None);
    }
    let mut parquet = ParquetOptions::default().label_column(label);
    if let Some(image) = image {
        parquet = parquet.image_column(image);
    }
    if let Some(extras) = extras {
        parquet = parquet.extra_columns(extras);
    }
    if let Some(split) = split {
        parquet = parquet.split(split);
    }
    Ok(Some(parquet))
}

#[pymethods]
impl Pipeline {
    #[new]
    #[pyo3(signature = (source=None, *, paths=None, labels=None, image_folder=false, webdataset=false, **options))]
    fn new(
        py: Python<'_>,
        source: Option<PathBuf>,
        paths: Option<PathList>,
        labels: Option<Vec<u32>>,
        image_folder: bool,
        webdataset: bool,
        options: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Pipeline> {
        let paths = paths.map(|p| p.0);
        let from_paths = paths.is_some();
        // `state=` (a state_dict() to resume from) and the object-storage keywords are the
        // constructor's, not options of the pipeline.
        let state = take_keyword::<Bound<'_, PyAny>>(options, "state")?;
        let cache_dir = take_keyword::<PathBuf>(options, "cache_dir")?;
        let cache_limit = take_keyword::<u64>(options, "cache_limit")?;
        let read_budget = take_keyword::<u64>(options, "read_budget")?;
        let max_requests = take_keyword::<usize>(options, "max_requests")?;
        let shuffle_window = take_keyword::<usize>(options, "shuffle_window")?;
        let parquet = take_keyword::<bool>(options, "parquet")?.unwrap_or(false);
        let parquet_options = parquet_options(options)?;
        let mut builder = builder_from(options)?;
        let given = match options {
            Some(options) => options
                .get_item("pillow_version")?
                .is_some_and(|version| !version.is_none()),
            None => false,
        };
        if !given {
            // The Pillow torchvision runs on here decides its bytes: its pass order is taken.
            if let Some((major, minor)) = installed_pillow(py) {
                builder = with_pillow_version(builder, major, minor);
            }
        }
        if let Some(state) = state {
            builder = builder.resume(state_from(&state)?);
        }
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
        if parquet && (image_folder || webdataset) {
            return Err(PyTypeError::new_err(
                "parquet=True: the source is Parquet, not an ImageFolder or tar shards",
            ));
        }
        if !parquet && parquet_options.is_some() {
            return Err(PyTypeError::new_err(
                "image_column, label_column, extra_columns and split are for parquet=True",
            ));
        }
        let source = match (source, paths) {
            (Some(root), None) if parquet && url.is_none() && !remote_given => {
                let options = parquet_options.unwrap_or_default();
                py.detach(|| Source::parquet([root], &options))
            }
            (Some(_), None) if parquet && url.is_some() => {
                let options = parquet_options.unwrap_or_default();
                let defaults = RemoteOptions::default();
                let remote = RemoteOptions::default()
                    .cache_dir(cache_dir)
                    .cache_limit(cache_limit.unwrap_or(defaults.cache_limit))
                    .read_budget(read_budget.unwrap_or(defaults.read_budget))
                    .max_requests(max_requests.unwrap_or(defaults.max_requests))
                    .shuffle_window(shuffle_window);
                let url = url.unwrap_or_default();
                open_interruptibly(py, move |interrupt| {
                    Source::parquet_url(&url, &options, &remote.interrupt(Some(interrupt)))
                })?
            }
            _ if parquet => {
                return Err(PyTypeError::new_err(
                    "parquet=True reads a file, a glob, a folder or a URL given as source",
                ))
            }
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
                // Listing (and indexing shards) waits on the network: without the GIL, and
                // stopped by Ctrl-C.
                open_interruptibly(py, move |interrupt| {
                    Source::url(&url, layout, &remote.interrupt(Some(interrupt)))
                })?
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
        let source = match labels {
            None => source,
            Some(_) if !from_paths => {
                return Err(PyTypeError::new_err(
                    "labels=[...] go with paths=[...] (a folder's labels come from \
                     image_folder=True or its .cls members)",
                ))
            }
            Some(labels) => source.with_labels(labels).map_err(|e| match e {
                gpufeed::Error::InvalidOption { reason, .. } => {
                    PyValueError::new_err(format!("labels: {reason}"))
                }
                other => to_py_err(other),
            })?,
        };
        let left_out = source.left_out().to_vec();
        let extras = source.extras().cloned();
        let raw_names = (0..source.len())
            .filter_map(|i| {
                let path = source.path(i)?;
                path.to_str()
                    .is_none()
                    .then(|| (i, path.as_os_str().to_os_string()))
            })
            .collect();
        // Opening CUDA and compiling the kernel take a while: without the GIL.
        let pipeline = py
            .detach(|| builder.source(source).build())
            .map_err(to_py_err)?;
        Ok(Pipeline {
            inner: Mutex::new(pipeline),
            epoch_begun: AtomicBool::new(false),
            process: std::process::id(),
            left_out,
            raw_names,
            extras,
        })
    }

    fn __iter__(slf: PyRef<'_, Self>) -> PyResult<PyRef<'_, Self>> {
        if slf.epoch_begun.swap(false, Ordering::SeqCst) {
            let this: &Pipeline = &slf;
            slf.py()
                .detach(|| this.lock()?.next_epoch().map_err(to_py_err))?;
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
        py.detach(|| self.lock()?.next_epoch().map_err(to_py_err))
    }

    /// Batches in an epoch of this process (its shard) when no image fails, as DataLoader's
    /// `len` counts them (for tqdm and schedulers); `num_images` counts the images.
    fn __len__(&self) -> PyResult<usize> {
        Ok(self.lock()?.batches_per_epoch())
    }

    /// Where the pipeline stands, as a dict to save with the model's checkpoint (`torch.save`
    /// takes it as it is): the epoch, the position after the last batch taken, and what a
    /// resumed pipeline must match. The name torchdata's `StatefulDataLoader` and Lightning use.
    fn state_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let text = self.lock()?.state().to_json();
        py.import("json")?.call_method1("loads", (text,))
    }

    /// Goes on from a `state_dict()`: what is left of the current epoch is abandoned, and the
    /// next batch (or the next `for batch in pipe`) is the one that followed where it was taken.
    /// A state of another source, seed or output option raises `ValueError` naming it.
    fn load_state_dict(&self, py: Python<'_>, state_dict: &Bound<'_, PyAny>) -> PyResult<()> {
        let state = state_from(state_dict)?;
        py.detach(|| self.lock()?.resume(&state).map_err(to_py_err))?;
        self.epoch_begun.store(false, Ordering::SeqCst);
        Ok(())
    }

    /// Images per epoch for this process (its shard), before any is skipped.
    #[getter]
    fn num_images(&self) -> PyResult<usize> {
        Ok(self.lock()?.len())
    }

    /// The current epoch (the first is 0).
    #[getter]
    fn epoch(&self) -> PyResult<u64> {
        Ok(self.lock()?.epoch())
    }

    /// Images in the whole source (all shards).
    #[getter]
    fn source_len(&self) -> PyResult<usize> {
        Ok(self.lock()?.source_len())
    }

    /// Class names by label (`image_folder=True`), else `None`.
    #[getter]
    fn class_names(&self) -> PyResult<Option<Vec<String>>> {
        Ok(self.lock()?.class_names().map(|c| c.to_vec()))
    }

    /// The extra columns of a Parquet source (`extra_columns=[...]`) for source index `index`
    /// (`batch.indices`): `{column: value}`, values as int, float, bool, str or None; `None`
    /// for other sources.
    fn extras(&self, py: Python<'_>, index: usize) -> PyResult<Option<Py<PyDict>>> {
        let Some(extras) = &self.extras else {
            return Ok(None);
        };
        let row = extras.rows.get(index).ok_or_else(|| {
            PyValueError::new_err(format!(
                "extras: no row {index} in a source of {}",
                extras.rows.len()
            ))
        })?;
        let dict = PyDict::new(py);
        for (name, value) in extras.names.iter().zip(row) {
            match value {
                ExtraValue::Bool(b) => dict.set_item(name, *b)?,
                ExtraValue::Int(i) => dict.set_item(name, *i)?,
                ExtraValue::Float(x) => dict.set_item(name, *x)?,
                ExtraValue::Text(t) => dict.set_item(name, t)?,
                _ => dict.set_item(name, py.None())?,
            }
        }
        Ok(Some(dict.unbind()))
    }

    /// Files the folder listing left out because of their extension: `{extension: count}`
    /// (`""` for files without one).
    #[getter]
    fn left_out(&self) -> std::collections::BTreeMap<String, usize> {
        self.left_out.iter().cloned().collect()
    }

    /// The device the batches land on, in words.
    #[getter]
    fn device_description(&self) -> PyResult<String> {
        Ok(self.lock()?.device_description().to_string())
    }

    /// Which lanes decode the images, and why, in words (with `decode="auto"`, the default, the
    /// GPU's JPEG engines join once their lane has opened).
    #[getter]
    fn decode_description(&self) -> PyResult<String> {
        Ok(self.lock()?.decode_description())
    }

    /// Where the time went since the pipeline was built: for each stage that ran, a dict of its
    /// `seconds` (summed over the threads that ran it) and `count`.
    fn profile<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let profile = self.lock()?.profile();
        let out = PyDict::new(py);
        for stage in profile.stages.iter().filter(|s| s.count > 0) {
            let entry = PyDict::new(py);
            entry.set_item("seconds", stage.seconds)?;
            entry.set_item("count", stage.count)?;
            out.set_item(stage.stage.name(), entry)?;
        }
        Ok(out)
    }

    /// The `CUstream` handle the batches are written on (`None` on the CPU device), e.g. for
    /// `torch.cuda.ExternalStream`.
    #[getter]
    fn cuda_stream(&self) -> PyResult<Option<usize>> {
        Ok(self.lock()?.cuda_stream().map(|s| s.cu_stream() as usize))
    }

    /// What happened to every image of the current epoch so far: a dict with `epoch`, `images`,
    /// `padded`, `batches`, `skipped` (a list of `(id, reason)`), `dropped` and `complete`.
    fn epoch_report<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let report = self.lock()?.epoch_report().clone();
        let dict = PyDict::new(py);
        dict.set_item("epoch", report.epoch)?;
        dict.set_item("images", report.images)?;
        dict.set_item("padded", report.padded)?;
        dict.set_item("batches", report.batches)?;
        dict.set_item("skipped", skipped_list(&report.skipped))?;
        dict.set_item("dropped", report.dropped)?;
        dict.set_item("complete", report.complete)?;
        let decoded_by = PyDict::new(py);
        decoded_by.set_item("cpu", report.decoded_by_cpu)?;
        decoded_by.set_item("gpu", report.decoded_by_gpu)?;
        decoded_by.set_item("gpu_assisted", report.decoded_by_assisted)?;
        dict.set_item("decoded_by", decoded_by)?;
        let reads = report
            .reads
            .as_ref()
            .map(|r| reads_dict(py, r))
            .transpose()?;
        dict.set_item("reads", reads)?;
        Ok(dict)
    }

    fn __repr__(&self) -> PyResult<String> {
        let pipeline = self.lock()?;
        Ok(format!(
            "gpufeed.Pipeline({} images in {} batches, epoch {}, {})",
            pipeline.len(),
            pipeline.batches_per_epoch(),
            pipeline.epoch(),
            pipeline.device_description()
        ))
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
    dict.set_item("cache_rejected", reads.cache_rejected)?;
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
    /// Id (path) of each image, in batch order; a path that is not valid UTF-8 as
    /// `os.fsdecode` gives it, so `open(id)` opens it.
    #[pyo3(get)]
    ids: Vec<OsString>,
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
    /// With `patches=`: the tokens (the same tensor as `images`), `[rows, patch_dim]` packed
    /// (Qwen2-VL's `pixel_values`) or `[N, length, patch_dim]` padded (SigLIP2's
    /// `pixel_values`, timm's `patches`); `None` for images.
    #[pyo3(get)]
    tokens: Option<Py<Tensor>>,
    /// With `patches=`: each image's grid `(t, h, w)` in patches, `[N, 3]` int64 (Qwen2-VL's
    /// `image_grid_thw`).
    #[pyo3(get)]
    grids: Option<Py<Tensor>>,
    /// With `patches=`: each image's first row, then the rows, `[N + 1]` int32 (flash
    /// attention's `cu_seqlens`; padded, the padded starts).
    #[pyo3(get)]
    cu_seqlens: Option<Py<Tensor>>,
    /// With `patches=`: 1 for an image's token, 0 for padding, `[N, length]` int32 padded
    /// (SigLIP2's `pixel_attention_mask`, timm's `patch_valid`), `[rows]` packed.
    #[pyo3(get)]
    mask: Option<Py<Tensor>>,
    /// With `patches=`: each image's `(h, w)` in patches, `[N, 2]` int64 (SigLIP2's
    /// `spatial_shapes`).
    #[pyo3(get)]
    spatial_shapes: Option<Py<Tensor>>,
    /// With `patches=`: each token's patch `(row, column)` in its image, `(0, 0)` for padding,
    /// `[N, length, 2]` int64 padded (timm's `patch_coord`), `[rows, 2]` packed.
    #[pyo3(get)]
    coordinates: Option<Py<Tensor>>,
    /// With `patches=`: each image's tokens, padding aside.
    #[pyo3(get)]
    tokens_per_image: Option<Vec<usize>>,
    /// With `views=`: one tensor per view group, `[count, N, 3, size, size]` (nchw) or
    /// `[count, N, size, size, 3]` (nhwc), normalized, on the batch's device; `None` for
    /// images.
    #[pyo3(get)]
    views: Option<Vec<Py<Tensor>>>,
    /// With `views=`: for each image, what each of its views drew, a dict each (`view`,
    /// `group`, `size`, the box `top`, `left`, `height`, `width`, `flip`, and `ops`, the colour
    /// calls in order), as `gpufeed run --views --save` writes them.
    #[pyo3(get)]
    view_draws: Option<Py<PyAny>>,
}

/// A patch-sequence batch's side tensors, on the batch's device.
struct SideTensors {
    grids: Py<Tensor>,
    cu_seqlens: Py<Tensor>,
    mask: Py<Tensor>,
    spatial_shapes: Py<Tensor>,
    coordinates: Py<Tensor>,
    tokens_per_image: Vec<usize>,
}

impl SideTensors {
    fn new(py: Python<'_>, patches: &gpufeed::BatchPatches) -> PyResult<SideTensors> {
        let wrap = |tensor: gpufeed::Result<gpufeed::Tensor>| -> PyResult<Py<Tensor>> {
            Py::new(py, Tensor::new(Arc::new(tensor.map_err(to_py_err)?)))
        };
        Ok(SideTensors {
            grids: wrap(patches.grids_tensor())?,
            cu_seqlens: wrap(patches.cu_seqlens_tensor())?,
            mask: wrap(patches.mask_tensor())?,
            spatial_shapes: wrap(patches.spatial_shapes_tensor())?,
            coordinates: wrap(patches.coordinates_tensor())?,
            tokens_per_image: patches.tokens_per_image(),
        })
    }
}

/// `(top, left, height, width, flipped)`.
type Crop = (u32, u32, u32, u32, bool);

impl Batch {
    fn new(
        py: Python<'_>,
        mut batch: gpufeed::Batch,
        raw_names: &HashMap<usize, OsString>,
    ) -> PyResult<Batch> {
        let labels = batch.labels().map(|l| l.to_vec());
        let ids = batch
            .ids()
            .iter()
            .zip(batch.indices())
            .map(|(id, index)| {
                raw_names
                    .get(index)
                    .cloned()
                    .unwrap_or_else(|| OsString::from(id))
            })
            .collect();
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
        let side = batch
            .patches()
            .map(|patches| SideTensors::new(py, patches))
            .transpose()?;
        let view_draws = match batch.view_draws() {
            Some(images) => {
                let rows: Vec<String> = images
                    .iter()
                    .zip(batch.indices())
                    .map(|(draws, &index)| {
                        let draws: Vec<String> =
                            draws.iter().map(|d| d.json(index, epoch)).collect();
                        format!("[{}]", draws.join(", "))
                    })
                    .collect();
                Some(loads(format!("[{}]", rows.join(", ")))?)
            }
            None => None,
        };
        let views = match batch.take_views() {
            Some(tensors) => Some(
                tensors
                    .into_iter()
                    .map(|t| Py::new(py, Tensor::new(Arc::new(t))))
                    .collect::<PyResult<Vec<_>>>()?,
            ),
            None => None,
        };
        let images = Py::new(py, Tensor::new(Arc::new(batch.into_images())))?;
        let tokens = side.as_ref().map(|_| images.clone_ref(py));
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
            tokens,
            grids: side.as_ref().map(|s| s.grids.clone_ref(py)),
            cu_seqlens: side.as_ref().map(|s| s.cu_seqlens.clone_ref(py)),
            mask: side.as_ref().map(|s| s.mask.clone_ref(py)),
            spatial_shapes: side.as_ref().map(|s| s.spatial_shapes.clone_ref(py)),
            coordinates: side.as_ref().map(|s| s.coordinates.clone_ref(py)),
            tokens_per_image: side.map(|s| s.tokens_per_image),
            views,
            view_draws,
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
