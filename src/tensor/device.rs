//! Tensors in GPU memory: the batches the normalize kernel writes, owned by the
//! [`crate::Batch`] that carries them, and the rules that let other streams read them.
//!
//! # Streams
//!
//! A device tensor is allocated and written on its *producer* stream
//! ([`DeviceTensor::stream`]): the pipeline's own non-blocking stream. Its memory is freed on
//! that stream too, stream-ordered, when the tensor is dropped, and the pipeline's next batches
//! may be allocated in the same memory right after. Work on the producer stream is ordered with
//! all of this by the stream itself. Work on any other stream (a framework's, ONNX Runtime's, the
//! legacy default stream) is not: declare such a *consumer* with [`DeviceTensor::use_on`] (or
//! take the pointer with [`DeviceTensor::device_ptr_on`]), and then
//! - the consumer stream waits, on the GPU, until the kernel that wrote the tensor has finished
//!   (an event; the host does not wait);
//! - when the tensor is dropped, an event is recorded on every consumer stream and the producer
//!   stream waits for it before the memory is freed: everything queued on a consumer until the
//!   drop reads the batch, never the next one written in its place.
//!
//! Reading through cudarc's own API (`stream.memcpy_dtod(tensor.as_slice::<f16>()?, ..)`, a
//! kernel argument, `slice.device_ptr(&stream)` with its guard kept until the work is queued) is
//! ordered by cudarc's per-slice read and write events, which the drop honours as well.

use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DriverError};
use half::{bf16, f16};

use super::host::{HostData, HostTensor};
use crate::error::{Error, Result};
use crate::options::{DType, Layout};

/// Elements of a device tensor, as cudarc slices (`gpufeed::cudarc` is the cudarc this crate
/// was built with).
#[derive(Debug)]
pub enum DeviceData {
    /// Half precision.
    F16(CudaSlice<f16>),
    /// bfloat16.
    BF16(CudaSlice<bf16>),
    /// Single precision.
    F32(CudaSlice<f32>),
    /// 32-bit integers (a patch sequence's `cu_seqlens` and masks).
    I32(CudaSlice<i32>),
    /// 64-bit integers (a patch sequence's grids, shapes and coordinates).
    I64(CudaSlice<i64>),
    /// Unsigned bytes (dense targets' masks).
    U8(CudaSlice<u8>),
}

impl DeviceData {
    /// The stream the memory was allocated and written on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        match self {
            DeviceData::F16(s) => s.stream(),
            DeviceData::BF16(s) => s.stream(),
            DeviceData::F32(s) => s.stream(),
            DeviceData::I32(s) => s.stream(),
            DeviceData::I64(s) => s.stream(),
            DeviceData::U8(s) => s.stream(),
        }
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        match self {
            DeviceData::F16(_) => DType::F16,
            DeviceData::BF16(_) => DType::BF16,
            DeviceData::F32(_) => DType::F32,
            DeviceData::I32(_) => DType::I32,
            DeviceData::I64(_) => DType::I64,
            DeviceData::U8(_) => DType::U8,
        }
    }

    /// Number of elements allocated.
    pub fn len(&self) -> usize {
        match self {
            DeviceData::F16(s) => s.len(),
            DeviceData::BF16(s) => s.len(),
            DeviceData::F32(s) => s.len(),
            DeviceData::I32(s) => s.len(),
            DeviceData::I64(s) => s.len(),
            DeviceData::U8(s) => s.len(),
        }
    }

    /// Whether no element is allocated.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The device address of the first element, after making `stream` wait for the slice's last
    /// write (cudarc's write event) and recording a read on it (cudarc's read event).
    fn ordered_address(&self, stream: &CudaStream) -> u64 {
        match self {
            DeviceData::F16(s) => s.device_ptr(stream).0,
            DeviceData::BF16(s) => s.device_ptr(stream).0,
            DeviceData::F32(s) => s.device_ptr(stream).0,
            DeviceData::I32(s) => s.device_ptr(stream).0,
            DeviceData::I64(s) => s.device_ptr(stream).0,
            DeviceData::U8(s) => s.device_ptr(stream).0,
        }
    }
}

/// The streams other than the producer that read a tensor. Dropped before the tensor's memory
/// (it is the first field of [`DeviceTensor`]): the producer stream then waits for each of them.
#[derive(Debug)]
pub(super) struct Consumers {
    producer: Arc<CudaStream>,
    streams: Mutex<Vec<Arc<CudaStream>>>,
}

impl Consumers {
    pub(super) fn new(producer: &Arc<CudaStream>) -> Consumers {
        Consumers {
            producer: producer.clone(),
            streams: Mutex::new(Vec::new()),
        }
    }

    /// Adds `consumer` once (streams compare by handle and context).
    fn add(&self, consumer: &Arc<CudaStream>) {
        let mut streams = self
            .streams
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if !streams.iter().any(|s| **s == **consumer) {
            streams.push(consumer.clone());
        }
    }

    fn remove(&self, consumer: &Arc<CudaStream>) {
        self.streams
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .retain(|s| **s != **consumer);
    }

    /// Makes the producer stream wait for the work queued on every consumer so far.
    pub(super) fn release(&self) -> std::result::Result<(), DriverError> {
        let streams = std::mem::take(
            &mut *self
                .streams
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner()),
        );
        for consumer in streams {
            let done = consumer.record_event(None)?;
            self.producer.wait(&done)?;
        }
        Ok(())
    }
}

impl Drop for Consumers {
    fn drop(&mut self) {
        // A failure is kept by the context, as cudarc keeps those of its own drops
        // (`CudaContext::check_err`): it means a broken context, where later calls fail too.
        let released = self.release();
        self.producer.context().record_err(released);
    }
}

/// A tensor of a batch in GPU memory: its normalized images, or a patch sequence's tokens or
/// side tensors.
///
/// It was written on the pipeline's stream ([`DeviceTensor::stream`]); the module
/// documentation says how another stream reads it safely ([`DeviceTensor::use_on`]).
#[derive(Debug)]
pub struct DeviceTensor {
    /// Declared first, so it is dropped before `data`: the memory is freed after the consumers.
    /// Boxed: most batches never meet another stream, and they move through channels.
    pub(super) consumers: Box<Consumers>,
    pub(super) data: DeviceData,
    pub(super) shape: Vec<usize>,
    pub(super) layout: Layout,
}

impl DeviceTensor {
    /// Allocates a tensor of `shape` (any rank; an image batch's in `layout` order) on
    /// `stream`, uninitialized: whoever allocates it writes every element before reading any.
    pub fn alloc(
        stream: &Arc<CudaStream>,
        dtype: DType,
        shape: impl AsRef<[usize]>,
        layout: Layout,
    ) -> Result<DeviceTensor> {
        let shape = shape.as_ref().to_vec();
        let len = super::element_count(&shape)
            .ok_or_else(|| Error::Mismatch(format!("a tensor of shape {shape:?} is too large")))?
            .max(1);
        let fail = |e| Error::cuda("allocating a device tensor", e);
        // SAFETY: the memory is left uninitialized, which the caller is told above; f16, bf16,
        // f32, i32, i64 and u8 have no invalid bit patterns, so reading unwritten elements is wrong
        // but not undefined behaviour.
        let data = unsafe {
            match dtype {
                DType::F16 => DeviceData::F16(stream.alloc::<f16>(len).map_err(fail)?),
                DType::BF16 => DeviceData::BF16(stream.alloc::<bf16>(len).map_err(fail)?),
                DType::F32 => DeviceData::F32(stream.alloc::<f32>(len).map_err(fail)?),
                DType::I32 => DeviceData::I32(stream.alloc::<i32>(len).map_err(fail)?),
                DType::I64 => DeviceData::I64(stream.alloc::<i64>(len).map_err(fail)?),
                DType::U8 => DeviceData::U8(stream.alloc::<u8>(len).map_err(fail)?),
            }
        };
        Ok(DeviceTensor {
            consumers: Box::new(Consumers::new(stream)),
            data,
            shape,
            layout,
        })
    }

    dense_accessors!("DeviceTensor");

    /// The same elements with another `shape` of as many elements (a batch of views' `[count *
    /// n, ...]` as `[count, n, ...]`).
    pub(crate) fn reshaped(mut self, shape: Vec<usize>) -> Result<DeviceTensor> {
        if shape.iter().product::<usize>() != self.len() {
            return Err(Error::Mismatch(format!(
                "a tensor of shape {:?} seen as {shape:?}",
                self.shape
            )));
        }
        self.shape = shape;
        Ok(self)
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    /// A tensor of `shape` holding a copy of `data`, uploaded on `stream` (a patch sequence's
    /// side tensors; `data` is pageable memory, so the copy is done when this returns).
    pub fn upload(
        stream: &Arc<CudaStream>,
        data: &HostData,
        shape: impl AsRef<[usize]>,
        layout: Layout,
    ) -> Result<DeviceTensor> {
        let shape = shape.as_ref().to_vec();
        if super::element_count(&shape) != Some(data.len()) {
            return Err(Error::Mismatch(format!(
                "{} elements for a tensor of shape {shape:?}",
                data.len()
            )));
        }
        let fail = |e| Error::cuda("uploading a tensor", e);
        let upload = |_| -> Result<DeviceData> {
            Ok(match data {
                HostData::F16(v) => DeviceData::F16(stream.clone_htod(v).map_err(fail)?),
                HostData::BF16(v) => DeviceData::BF16(stream.clone_htod(v).map_err(fail)?),
                HostData::F32(v) => DeviceData::F32(stream.clone_htod(v).map_err(fail)?),
                HostData::I32(v) => DeviceData::I32(stream.clone_htod(v).map_err(fail)?),
                HostData::I64(v) => DeviceData::I64(stream.clone_htod(v).map_err(fail)?),
                HostData::U8(v) => DeviceData::U8(stream.clone_htod(v).map_err(fail)?),
            })
        };
        // An empty tensor keeps one element allocated, as `alloc` does.
        let data = match data.is_empty() {
            true => return DeviceTensor::alloc(stream, data.dtype(), shape, layout),
            false => upload(())?,
        };
        Ok(DeviceTensor {
            consumers: Box::new(Consumers::new(stream)),
            data,
            shape,
            layout,
        })
    }

    /// Ordinal of the CUDA device the memory is on.
    pub fn ordinal(&self) -> usize {
        self.stream().context().ordinal()
    }

    /// The cudarc slices holding the elements (at least [`DeviceTensor::len`] of them). Work that
    /// cudarc queues on them is ordered by cudarc's read and write events.
    pub fn data(&self) -> &DeviceData {
        &self.data
    }

    /// The cudarc slices holding the elements, writable (the normalize kernel writes through it).
    pub fn data_mut(&mut self) -> &mut DeviceData {
        &mut self.data
    }

    /// Takes the memory out of the tensor: the slice is then yours, and cudarc's rules apply
    /// to it alone (it is freed on [`DeviceTensor::stream`] when dropped, after cudarc's read
    /// and write events). The producer stream first waits for what the consumers declared with
    /// [`DeviceTensor::use_on`] have queued so far.
    pub fn into_data(self) -> Result<DeviceData> {
        let DeviceTensor {
            consumers, data, ..
        } = self;
        consumers
            .release()
            .map_err(|e| Error::cuda("ordering a batch's release after its consumers", e))?;
        Ok(data)
    }

    /// The stream the tensor was written on, and whose work is ordered with it by the stream
    /// itself: the pipeline's stream.
    pub fn stream(&self) -> &Arc<CudaStream> {
        self.data.stream()
    }

    /// Declares that `consumer` reads this tensor: `consumer` waits (on the GPU, no host sync)
    /// until the tensor is written, and the memory is not freed, when the tensor is dropped,
    /// before everything queued on `consumer` until then has finished. Call it before queuing
    /// the reads; calling it again for the same stream adds nothing. `consumer` must belong to
    /// the tensor's device and outlive the tensor.
    pub fn use_on(&self, consumer: &Arc<CudaStream>) -> Result<()> {
        if **consumer == **self.stream() {
            return Ok(());
        }
        if consumer.context().ordinal() != self.ordinal() {
            return Err(Error::Mismatch(format!(
                "a stream of CUDA device {} cannot read a batch on device {}",
                consumer.context().ordinal(),
                self.ordinal()
            )));
        }
        if self.stream().context().is_managing_stream_synchronization() {
            // Waits for cudarc's write event: the end of the kernel that wrote the tensor.
            self.data.ordered_address(consumer);
        } else {
            // Without cudarc's events: wait for everything queued on the producer so far.
            consumer
                .join(self.stream())
                .map_err(|e| Error::cuda("making a stream wait for a batch", e))?;
        }
        self.consumers.add(consumer);
        Ok(())
    }

    /// The raw device address of the first element (a `CUdeviceptr`), for code that takes
    /// pointers, to be read by work queued on `consumer`: calls [`DeviceTensor::use_on`]
    /// first. The address is valid while this tensor lives; work queued on `consumer` before the
    /// tensor is dropped may use it, on the GPU, until it finishes.
    pub fn device_ptr_on(&self, consumer: &Arc<CudaStream>) -> Result<u64> {
        self.use_on(consumer)?;
        Ok(self.data.ordered_address(self.stream()))
    }

    /// Like [`DeviceTensor::use_on`], with the release ordered after `release_on` instead of
    /// `consumer` (for a consumer whose stream cannot be named from another thread).
    pub(crate) fn use_on_then_release_on(
        &self,
        consumer: &Arc<CudaStream>,
        release_on: &Arc<CudaStream>,
    ) -> Result<()> {
        self.use_on(consumer)?;
        self.consumers.remove(consumer);
        self.consumers.add(release_on);
        Ok(())
    }

    /// The raw device address of the first element, with no ordering.
    pub(crate) fn address(&self) -> u64 {
        self.data.ordered_address(self.stream())
    }

    /// Waits until the kernel that writes this tensor (and everything queued before it on its
    /// stream) has finished.
    pub fn synchronize(&self) -> Result<()> {
        self.stream()
            .synchronize()
            .map_err(|e| Error::cuda("waiting for a batch", e))
    }

    /// Copies the tensor to host memory (waits for the stream).
    pub fn to_host(&self) -> Result<HostTensor> {
        let len = self.len();
        let stream = self.stream().clone();
        let fail = |e| Error::cuda("copying a batch to the host", e);
        let data = match &self.data {
            DeviceData::F16(s) => HostData::F16(stream.clone_dtoh(&s.slice(..len)).map_err(fail)?),
            DeviceData::BF16(s) => {
                HostData::BF16(stream.clone_dtoh(&s.slice(..len)).map_err(fail)?)
            }
            DeviceData::F32(s) => HostData::F32(stream.clone_dtoh(&s.slice(..len)).map_err(fail)?),
            DeviceData::I32(s) => HostData::I32(stream.clone_dtoh(&s.slice(..len)).map_err(fail)?),
            DeviceData::I64(s) => HostData::I64(stream.clone_dtoh(&s.slice(..len)).map_err(fail)?),
            DeviceData::U8(s) => HostData::U8(stream.clone_dtoh(&s.slice(..len)).map_err(fail)?),
        };
        stream.synchronize().map_err(fail)?;
        HostTensor::new(data, &self.shape, self.layout)
            .ok_or_else(|| Error::Mismatch("a downloaded batch does not match its shape".into()))
    }
}
