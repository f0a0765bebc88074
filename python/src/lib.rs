//! `gpufeed._native`: the Python face of gpufeed. It uses the library's public API and nothing
//! else: [`options`] turns keywords into builder calls from one table of keywords, [`signature`]
//! shows that table to `help()`, [`pipeline`] wraps the pipeline and its batches, [`serve`] the
//! patch server and its responses, [`tensor`] exports batches through DLPack.

mod options;
mod pipeline;
mod serve;
mod signature;
mod targets;
mod tensor;

use pyo3::create_exception;
use pyo3::exceptions::{
    PyBufferError, PyFileNotFoundError, PyOSError, PyPermissionError, PyRuntimeError, PyValueError,
};
use pyo3::prelude::*;

create_exception!(
    gpufeed,
    GpufeedError,
    PyRuntimeError,
    "Something gpufeed could not do (CUDA, the prefetch thread); the message says what."
);
create_exception!(
    gpufeed,
    ItemError,
    GpufeedError,
    "An image could not be read or decoded under on_error=\"fail\"; the message names the file."
);
create_exception!(
    gpufeed,
    CudaUnavailableError,
    GpufeedError,
    "A CUDA device was asked for but cannot be used; the message says which piece is missing."
);

/// The Python exception for a gpufeed error: option mistakes and a saved state that does not
/// fit are `ValueError`, a folder that cannot be listed `FileNotFoundError` or `OSError`, a
/// failed image `ItemError`, a batch that cannot be exported as asked `BufferError`, the rest
/// `GpufeedError`.
pub(crate) fn to_py_err(error: gpufeed::Error) -> PyErr {
    let message = error.to_string();
    match error {
        gpufeed::Error::InvalidOption { option, reason } => PyValueError::new_err(format!(
            "invalid option {}: {reason}",
            options::keyword_name(option)
        )),
        gpufeed::Error::Resume(_) => PyValueError::new_err(message),
        gpufeed::Error::Item(_) => ItemError::new_err(message),
        gpufeed::Error::CudaUnavailable(_) => CudaUnavailableError::new_err(format!(
            "{message} (Pipeline(..., device=\"cpu\") runs on the CPU)"
        )),
        gpufeed::Error::Source { source, .. } => match source.map(|e| e.kind()) {
            Some(std::io::ErrorKind::NotFound) => PyFileNotFoundError::new_err(message),
            _ => PyOSError::new_err(message),
        },
        gpufeed::Error::Remote { kind, .. } => match kind {
            std::io::ErrorKind::PermissionDenied => PyPermissionError::new_err(message),
            std::io::ErrorKind::NotFound => PyFileNotFoundError::new_err(message),
            std::io::ErrorKind::InvalidInput => PyValueError::new_err(message),
            _ => PyOSError::new_err(message),
        },
        gpufeed::Error::Export(_) => PyBufferError::new_err(message),
        _ => GpufeedError::new_err(message),
    }
}

/// What a pipeline's random transforms draw for the image with source index `index` in `epoch`,
/// `width` x `height` pixels: `(top, left, height, width, flipped)`, the arguments of
/// torchvision's `F.resized_crop` and `F.hflip` (the box of `RandomResizedCrop` with `scale`
/// and `ratio`, a flip with chance `hflip`), exactly as a `Pipeline(..., seed=seed)` draws them.
#[pyfunction]
#[pyo3(signature = (width, height, index, epoch=0, *, seed=0, scale=(0.08, 1.0), ratio=(0.75, 4.0 / 3.0), hflip=0.5))]
#[allow(clippy::too_many_arguments)]
fn draw_crop(
    width: u32,
    height: u32,
    index: usize,
    epoch: u64,
    seed: u64,
    scale: (f64, f64),
    ratio: (f64, f64),
    hflip: f64,
) -> PyResult<(u32, u32, u32, u32, bool)> {
    let resize = gpufeed::ResizeOptions::default()
        .mode(gpufeed::ResizeMode::RandomResizedCrop {
            height: 224,
            width: 224,
            scale: gpufeed::DrawRange::new(scale.0, scale.1),
            ratio: gpufeed::DrawRange::new(ratio.0, ratio.1),
        })
        .horizontal_flip(hflip)
        .seed(seed);
    gpufeed::Options::default()
        .resize(resize)
        .validate()
        .map_err(to_py_err)?;
    if width == 0 || height == 0 {
        return Err(PyValueError::new_err(format!(
            "an image of {width}x{height} has no pixels"
        )));
    }
    let d = resize
        .draw(width, height, index, epoch)
        .ok_or_else(|| PyValueError::new_err("nothing is random"))?;
    Ok((d.top, d.left, d.height, d.width, d.flipped))
}

/// The views of a multi-crop preset (`"dinov2"` or `"simclr"`), or of a spec of view groups as
/// `Pipeline`'s `views=` takes it, of one encoded image (source index `index`, `epoch`), decoded
/// once on the CPU: for each view, `(pixels, size, draw)`, `pixels` its `size * size * 3` bytes
/// (`uint8`, rows first, RGB), `draw` what it drew as a JSON object (its box, flip and the
/// torchvision calls after them), exactly as `gpufeed run --views` saves them. The resize
/// follows `pillow_version` (`(major, minor)`), by default the installed Pillow's, as
/// torchvision's transforms run with it.
#[pyfunction]
#[pyo3(
    signature = (data, preset=options::ViewsSpec(gpufeed::views::Views::dinov2()), index=0, epoch=0, *, seed=0, pillow_version=None),
    text_signature = "(data, preset='dinov2', index=0, epoch=0, *, seed=0, pillow_version=None)"
)]
fn render_views(
    py: Python<'_>,
    data: &[u8],
    preset: options::ViewsSpec,
    index: usize,
    epoch: u64,
    seed: u64,
    pillow_version: Option<(u32, u32)>,
) -> PyResult<Vec<(Py<pyo3::types::PyBytes>, u32, String)>> {
    let mut views = preset.0.seed(seed);
    if let Some((major, minor)) = pillow_version.or_else(|| pipeline::installed_pillow(py)) {
        views = views.pillow_version(major, minor);
    }
    let decode = gpufeed::DecodeOptions::default();
    let made = py
        .detach(|| gpufeed::cpu::render_views(data, &decode, &views, index, epoch))
        .map_err(to_py_err)?;
    Ok(made
        .into_iter()
        .map(|v| {
            (
                pyo3::types::PyBytes::new(py, &v.pixels).unbind(),
                v.draw.size,
                v.draw.json(index, epoch),
            )
        })
        .collect())
}

/// A multi-crop preset's view groups (`"dinov2"` or `"simclr"`), or a spec's, as the list of
/// dicts `Pipeline`'s `views=` takes: every field written, to start a recipe of one's own from.
#[pyfunction]
fn views_spec<'py>(py: Python<'py>, preset: options::ViewsSpec) -> PyResult<Bound<'py, PyAny>> {
    py.import("json")?
        .call_method1("loads", (preset.0.to_json(),))
}

/// Every keyword of `Pipeline()` as `(name, type, default, doc)`, in the signature's order: the
/// table the signature, the docstring and the misspelt-keyword error are made from (the tests
/// compare the `.pyi` stub with it).
#[pyfunction]
fn _keyword_table() -> Vec<(&'static str, &'static str, String, &'static str)> {
    let defaults = options::Defaults::new();
    options::KEYWORDS
        .iter()
        .map(|k| (k.name, k.python_type, (k.default)(&defaults), k.doc))
        .collect()
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(draw_crop, m)?)?;
    m.add_function(wrap_pyfunction!(render_views, m)?)?;
    m.add_function(wrap_pyfunction!(views_spec, m)?)?;
    m.add_function(wrap_pyfunction!(_keyword_table, m)?)?;
    m.add_class::<pipeline::Pipeline>()?;
    m.add_class::<pipeline::Batch>()?;
    m.add_class::<serve::PatchServer>()?;
    m.add_class::<serve::ServedBatch>()?;
    m.add_class::<tensor::Tensor>()?;
    m.add_class::<targets::TargetLoader>()?;
    m.add("GpufeedError", m.py().get_type::<GpufeedError>())?;
    m.add("ItemError", m.py().get_type::<ItemError>())?;
    m.add(
        "CudaUnavailableError",
        m.py().get_type::<CudaUnavailableError>(),
    )?;
    m.add("KEYWORDS", options::keyword_names())?;
    signature::describe_pipeline(m.py())?;
    Ok(())
}
