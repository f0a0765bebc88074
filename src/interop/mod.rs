//! Handing a batch to other libraries, zero-copy: [`dlpack`] (PyTorch, NumPy, JAX, CuPy and any
//! other DLPack consumer) and, with the `ort` feature, `ort` (ONNX Runtime inputs). Both
//! follow the stream rules of [`DeviceTensor`](crate::DeviceTensor): the consumer's stream
//! waits for the batch, and the batch's memory outlives the consumer's work.

pub mod dlpack;
#[cfg(feature = "ort")]
pub mod ort;
