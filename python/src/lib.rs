//! `gpufeed._native`: the Python face of gpufeed. It uses the library's public API and nothing
//! else: [`options`] turns keywords into builder calls, [`pipeline`] wraps the pipeline and its
//! batches, [`tensor`] exports batches through DLPack.

mod options;
mod pipeline;
mod tensor;

use pyo3::create_exception;
use pyo3::exceptions::{
    PyBufferError, PyFileNotFoundError, PyOSError, PyRuntimeError, PyValueError,
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

/// The Python exception for a gpufeed error: option mistakes are `ValueError`, a folder that
/// cannot be listed `FileNotFoundError` or `OSError`, a failed image `ItemError`, a batch that
/// cannot be exported as asked `BufferError`, the rest `GpufeedError`.
pub(crate) fn to_py_err(error: gpufeed::Error) -> PyErr {
    let message = error.to_string();
    match error {
        gpufeed::Error::InvalidOption { .. } => PyValueError::new_err(message),
        gpufeed::Error::Item(_) => ItemError::new_err(message),
        gpufeed::Error::CudaUnavailable(_) => CudaUnavailableError::new_err(message),
        gpufeed::Error::Source { source, .. } => match source.map(|e| e.kind()) {
            Some(std::io::ErrorKind::NotFound) => PyFileNotFoundError::new_err(message),
            _ => PyOSError::new_err(message),
        },
        gpufeed::Error::Export(_) => PyBufferError::new_err(message),
        _ => GpufeedError::new_err(message),
    }
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<pipeline::Pipeline>()?;
    m.add_class::<pipeline::Batch>()?;
    m.add_class::<tensor::Tensor>()?;
    m.add("GpufeedError", m.py().get_type::<GpufeedError>())?;
    m.add("ItemError", m.py().get_type::<ItemError>())?;
    m.add(
        "CudaUnavailableError",
        m.py().get_type::<CudaUnavailableError>(),
    )?;
    m.add("KEYWORDS", options::keyword_names())?;
    Ok(())
}
