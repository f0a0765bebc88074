//! DLPack export of a batch, device or host, in the versioned ABI (DLPack 1.x,
//! `DLManagedTensorVersioned`) and the legacy one (`DLManagedTensor`, for consumers older than
//! DLPack 1.0), zero-copy.
//!
//! An export holds a reference to the tensor; the tensor's memory lives until every export and
//! the batch itself are gone. The deleter may run on any thread and takes no lock a caller could
//! hold.
//!
//! # Streams (CUDA batches)
//! The consumer names the stream it will read on ([`ConsumerStream`], the array API's `stream`
//! argument of `__dlpack__`). Exporting makes that stream wait, on the GPU, for the kernel that
//! wrote the batch (an event: no host sync), and registers it with the tensor
//! ([`DeviceTensor::use_on`](crate::DeviceTensor::use_on)): when the last reference to the tensor
//! goes (the last deleter, or the batch), the pipeline's stream waits for everything queued on
//! that stream until then before the memory is freed and reused. [`ConsumerStream::unordered`]
//! (the array API's `-1`) does neither: the consumer then orders its reads and the memory's
//! release itself.
//!
//! ```
//! # use std::sync::Arc;
//! use gpufeed::dlpack::{self, ConsumerStream};
//! use gpufeed::{Device, Pipeline, Source};
//!
//! let mut pipeline = Pipeline::builder()
//!     .source(Source::directory("assets")?)
//!     .batch_size(2)
//!     .device(Device::Cpu)
//!     .build()?;
//! let batch = pipeline.next_batch()?.expect("a batch");
//! let images = Arc::new(batch.into_images());
//! let export = dlpack::export_versioned(&images, &ConsumerStream::unordered())?;
//! // SAFETY: `export` is alive, so the pointer is valid.
//! let tensor = unsafe { &(*export.as_ptr()).dl_tensor };
//! assert_eq!(tensor.ndim, 4);
//! let managed = export.into_raw(); // hand it to a consumer, which calls its deleter once
//! # unsafe { ((*managed).deleter.unwrap())(managed) };
//! # Ok::<(), gpufeed::Error>(())
//! ```

use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaStream};

use crate::error::{Error, Result};
use crate::options::DType;
use crate::tensor::{DeviceTensor, Tensor};

/// `DLPackVersion`: the ABI version of a versioned tensor.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DLPackVersion {
    /// Changes when the ABI breaks.
    pub major: u32,
    /// Changes when the ABI grows.
    pub minor: u32,
}

/// The DLPack version this module implements.
pub const DLPACK_VERSION: DLPackVersion = DLPackVersion { major: 1, minor: 0 };

/// `kDLCPU`: host memory.
pub const DEVICE_CPU: i32 = 1;
/// `kDLCUDA`: CUDA device memory.
pub const DEVICE_CUDA: i32 = 2;

/// `kDLInt`.
pub const CODE_INT: u8 = 0;
/// `kDLUInt`.
pub const CODE_UINT: u8 = 1;
/// `kDLFloat`.
pub const CODE_FLOAT: u8 = 2;
/// `kDLBfloat`.
pub const CODE_BFLOAT: u8 = 4;

/// `DLPACK_FLAG_BITMASK_READ_ONLY`.
pub const FLAG_READ_ONLY: u64 = 1 << 0;
/// `DLPACK_FLAG_BITMASK_IS_COPIED`: the data is a copy made for this export.
pub const FLAG_IS_COPIED: u64 = 1 << 1;

/// `DLDevice`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DLDevice {
    /// `DLDeviceType`: [`DEVICE_CPU`] or [`DEVICE_CUDA`] here.
    pub device_type: i32,
    /// Device ordinal (0 for the CPU).
    pub device_id: i32,
}

/// `DLDataType`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DLDataType {
    /// `DLDataTypeCode`: [`CODE_FLOAT`], [`CODE_BFLOAT`], [`CODE_INT`] or [`CODE_UINT`] here.
    pub code: u8,
    /// Bits per element.
    pub bits: u8,
    /// Vector lanes (1).
    pub lanes: u16,
}

/// `DLTensor`: the view a consumer reads.
#[repr(C)]
#[derive(Debug)]
pub struct DLTensor {
    /// First element (device address for CUDA memory).
    pub data: *mut c_void,
    /// Where the memory is.
    pub device: DLDevice,
    /// Number of dimensions (4 for images; 2 or 3 for tokens, 1 to 3 for their side tensors).
    pub ndim: i32,
    /// Element type.
    pub dtype: DLDataType,
    /// `ndim` sizes.
    pub shape: *mut i64,
    /// `ndim` strides in elements.
    pub strides: *mut i64,
    /// Bytes from `data` to the first element (0).
    pub byte_offset: u64,
}

/// `DLManagedTensor`: the legacy ABI (DLPack 0.x; capsule name `"dltensor"`).
#[repr(C)]
#[derive(Debug)]
pub struct DLManagedTensor {
    /// The tensor.
    pub dl_tensor: DLTensor,
    /// The producer's state.
    pub manager_ctx: *mut c_void,
    /// Called once by the consumer when it is done with the tensor.
    pub deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

/// `DLManagedTensorVersioned`: the versioned ABI (DLPack 1.x; capsule name
/// `"dltensor_versioned"`).
#[repr(C)]
#[derive(Debug)]
pub struct DLManagedTensorVersioned {
    /// ABI version ([`DLPACK_VERSION`]).
    pub version: DLPackVersion,
    /// The producer's state.
    pub manager_ctx: *mut c_void,
    /// Called once by the consumer when it is done with the tensor.
    pub deleter: Option<unsafe extern "C" fn(*mut DLManagedTensorVersioned)>,
    /// [`FLAG_READ_ONLY`], [`FLAG_IS_COPIED`].
    pub flags: u64,
    /// The tensor.
    pub dl_tensor: DLTensor,
}

#[derive(Debug, Clone)]
enum StreamKind {
    Unordered,
    LegacyDefault,
    PerThreadDefault,
    Stream(Arc<CudaStream>),
    Handle(usize),
}

/// The stream a DLPack consumer reads a CUDA batch on.
#[derive(Debug, Clone)]
pub struct ConsumerStream(StreamKind);

impl ConsumerStream {
    /// The consumer orders its reads and the memory's release itself (the array API's `-1`):
    /// nothing waits and nothing is registered. Also the only choice for host batches.
    pub fn unordered() -> ConsumerStream {
        ConsumerStream(StreamKind::Unordered)
    }

    /// The legacy default stream (the array API's `None` and `1`; PyTorch's default stream).
    pub fn legacy_default() -> ConsumerStream {
        ConsumerStream(StreamKind::LegacyDefault)
    }

    /// The per-thread default stream of the exporting thread (the array API's `2`). The
    /// memory's release is ordered on the legacy default stream, which every per-thread default
    /// stream synchronizes with, since a deleter may run on another thread.
    pub fn per_thread_default() -> ConsumerStream {
        ConsumerStream(StreamKind::PerThreadDefault)
    }

    /// A cudarc stream of the batch's device.
    pub fn stream(stream: &Arc<CudaStream>) -> ConsumerStream {
        ConsumerStream(StreamKind::Stream(stream.clone()))
    }

    /// A stream by its `CUstream` handle, owned by the consumer.
    ///
    /// # Safety
    /// `handle` must be a live CUDA stream of the batch's device's primary context (the one
    /// the CUDA runtime, PyTorch included, uses), and it must stay alive until the tensor's
    /// memory is released: until the last export and the batch are dropped.
    pub unsafe fn from_handle(handle: usize) -> ConsumerStream {
        ConsumerStream(StreamKind::Handle(handle))
    }

    /// The array API's `stream` argument of `__dlpack__` for a CUDA batch: `None` or `1` the
    /// legacy default stream, `2` the per-thread default stream, `-1` no synchronization, any
    /// other positive value a stream handle. `0` and values below `-1` are refused.
    ///
    /// # Safety
    /// A value above 2 is a stream handle: see [`ConsumerStream::from_handle`].
    pub unsafe fn from_array_api(stream: Option<i64>) -> Result<ConsumerStream> {
        Ok(match stream {
            None | Some(1) => ConsumerStream::legacy_default(),
            Some(2) => ConsumerStream::per_thread_default(),
            Some(-1) => ConsumerStream::unordered(),
            Some(0) => {
                return Err(Error::Export(
                    "stream 0 is ambiguous for CUDA: pass 1 for the legacy default stream, 2 for \
                     the per-thread default stream, or a stream handle"
                        .into(),
                ))
            }
            Some(handle) if handle > 2 => {
                // SAFETY: forwarded to the caller of this function.
                unsafe { ConsumerStream::from_handle(handle as usize) }
            }
            Some(other) => {
                return Err(Error::Export(format!(
                    "stream {other} is not a CUDA stream (expected None, -1, 1, 2 or a handle)"
                )))
            }
        })
    }

    /// Whether the consumer asked for no synchronization.
    pub fn is_unordered(&self) -> bool {
        matches!(self.0, StreamKind::Unordered)
    }

    /// Makes the consumer wait for `tensor` and registers the stream its release waits for.
    fn order(&self, tensor: &DeviceTensor) -> Result<()> {
        let context: &Arc<CudaContext> = tensor.stream().context();
        match &self.0 {
            StreamKind::Unordered => Ok(()),
            StreamKind::LegacyDefault => tensor.use_on(&context.default_stream()),
            StreamKind::PerThreadDefault => tensor
                .use_on_then_release_on(&context.per_thread_stream(), &context.default_stream()),
            StreamKind::Stream(stream) => tensor.use_on(stream),
            StreamKind::Handle(handle) => {
                // SAFETY: `from_handle`'s caller promised a live stream of this context that
                // outlives the tensor's memory; the wrapper never destroys it.
                let stream = unsafe { context.wrap_borrowed_stream(*handle as _) };
                tensor.use_on(&stream)
            }
        }
    }
}

/// The DLPack device of a tensor: `(kDLCUDA, ordinal)` or `(kDLCPU, 0)`.
pub fn device(tensor: &Tensor) -> DLDevice {
    match tensor {
        Tensor::Device(t) => DLDevice {
            device_type: DEVICE_CUDA,
            device_id: t.ordinal() as i32,
        },
        Tensor::Host(_) => DLDevice {
            device_type: DEVICE_CPU,
            device_id: 0,
        },
    }
}

fn data_type(dtype: DType) -> DLDataType {
    let (code, bits) = match dtype {
        DType::F16 => (CODE_FLOAT, 16),
        DType::BF16 => (CODE_BFLOAT, 16),
        DType::F32 => (CODE_FLOAT, 32),
        DType::I32 => (CODE_INT, 32),
        DType::I64 => (CODE_INT, 64),
        DType::U8 => (CODE_UINT, 8),
    };
    DLDataType {
        code,
        bits,
        lanes: 1,
    }
}

/// What a consumer's `manager_ctx` points to: the managed tensor (first, so both have the same
/// address), the shape and strides it points into, and the reference that keeps the batch.
#[repr(C)]
struct Holder<M> {
    managed: M,
    shape: Vec<i64>,
    strides: Vec<i64>,
    tensor: Arc<Tensor>,
}

/// Orders `tensor` for `consumer` and describes it; the shape and strides pointers are left
/// null for the holder to fill.
fn describe(tensor: &Arc<Tensor>, consumer: &ConsumerStream) -> Result<DLTensor> {
    let data = match &**tensor {
        Tensor::Device(t) => {
            consumer.order(t)?;
            t.address() as *mut c_void
        }
        Tensor::Host(t) => {
            if !consumer.is_unordered() {
                return Err(Error::Export(
                    "a host batch takes no stream (pass None or -1)".into(),
                ));
            }
            t.data().as_ptr() as *mut c_void
        }
    };
    Ok(DLTensor {
        data,
        device: device(tensor),
        ndim: i32::try_from(tensor.rank())
            .map_err(|_| Error::Export("a tensor of too many axes".into()))?,
        dtype: data_type(tensor.dtype()),
        shape: std::ptr::null_mut(),
        strides: std::ptr::null_mut(),
        byte_offset: 0,
    })
}

/// Boxes `managed` with the tensor's shape and strides and points its `DLTensor` at them.
fn hold<M>(
    managed: M,
    tensor: &Arc<Tensor>,
    dl_tensor: impl Fn(&mut M) -> &mut DLTensor,
    manager_ctx: impl Fn(&mut M) -> &mut *mut c_void,
) -> NonNull<M> {
    let to_i64 = |v: &[usize]| v.iter().map(|&x| x as i64).collect::<Vec<i64>>();
    let holder = Box::into_raw(Box::new(Holder {
        managed,
        shape: to_i64(tensor.shape()),
        strides: to_i64(&tensor.strides()),
        tensor: tensor.clone(),
    }));
    // SAFETY: `holder` comes from `Box::into_raw`, so it is valid and unaliased here; the
    // pointers stored point into the holder's shape and strides, whose buffers live (unmoved:
    // never resized) until the deleter frees the holder.
    unsafe {
        let h = &mut *holder;
        let t = dl_tensor(&mut h.managed);
        t.shape = h.shape.as_mut_ptr();
        t.strides = h.strides.as_mut_ptr();
        *manager_ctx(&mut h.managed) = holder as *mut c_void;
        // `managed` is the first field of a `repr(C)` struct: same address as the holder.
        NonNull::new_unchecked(holder as *mut M)
    }
}

/// Frees the holder behind `manager_ctx`; never unwinds into the consumer.
///
/// # Safety
/// `manager_ctx` must come from [`hold`] with the same `M`, and be freed only once.
unsafe fn release<M>(manager_ctx: *mut c_void) {
    if manager_ctx.is_null() {
        return;
    }
    // SAFETY: per this function's contract, the pointer is a live `Box<Holder<M>>`.
    let holder = unsafe { Box::from_raw(manager_ctx as *mut Holder<M>) };
    // Dropping the tensor may call CUDA (events, a stream-ordered free); those calls report
    // failures to the context rather than panicking, but a deleter must never unwind.
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(holder)));
}

unsafe extern "C" fn delete_versioned(managed: *mut DLManagedTensorVersioned) {
    if managed.is_null() {
        return;
    }
    // SAFETY: the consumer calls the deleter once, on the tensor `export_versioned` made,
    // whose `manager_ctx` is its holder.
    unsafe { release::<DLManagedTensorVersioned>((*managed).manager_ctx) }
}

unsafe extern "C" fn delete_legacy(managed: *mut DLManagedTensor) {
    if managed.is_null() {
        return;
    }
    // SAFETY: as in `delete_versioned`, for `export_legacy`.
    unsafe { release::<DLManagedTensor>((*managed).manager_ctx) }
}

/// A DLPack tensor in the versioned ABI, owning one reference to a batch. Dropping it calls its
/// deleter; [`VersionedExport::into_raw`] hands it to a consumer, which then calls the deleter.
#[derive(Debug)]
pub struct VersionedExport(NonNull<DLManagedTensorVersioned>);

// SAFETY: the export owns its holder, whose tensor is `Send + Sync`; nothing in it is tied to
// a thread, and the deleter may run on any thread.
unsafe impl Send for VersionedExport {}

impl VersionedExport {
    /// The managed tensor, valid while `self` lives.
    pub fn as_ptr(&self) -> *const DLManagedTensorVersioned {
        self.0.as_ptr()
    }

    /// Sets the flags ([`FLAG_READ_ONLY`], [`FLAG_IS_COPIED`]).
    pub fn set_flags(&mut self, flags: u64) {
        // SAFETY: `self` owns the managed tensor and no consumer has it yet.
        unsafe { (*self.0.as_ptr()).flags = flags }
    }

    /// Gives up ownership: whoever takes the pointer calls its deleter exactly once.
    pub fn into_raw(self) -> *mut DLManagedTensorVersioned {
        let ptr = self.0.as_ptr();
        std::mem::forget(self);
        ptr
    }
}

impl Drop for VersionedExport {
    fn drop(&mut self) {
        // SAFETY: `self` still owns the managed tensor, made by `export_versioned`.
        unsafe { delete_versioned(self.0.as_ptr()) }
    }
}

/// A DLPack tensor in the legacy ABI, owning one reference to a batch; as
/// [`VersionedExport`].
#[derive(Debug)]
pub struct LegacyExport(NonNull<DLManagedTensor>);

// SAFETY: as for `VersionedExport`.
unsafe impl Send for LegacyExport {}

impl LegacyExport {
    /// The managed tensor, valid while `self` lives.
    pub fn as_ptr(&self) -> *const DLManagedTensor {
        self.0.as_ptr()
    }

    /// Gives up ownership: whoever takes the pointer calls its deleter exactly once.
    pub fn into_raw(self) -> *mut DLManagedTensor {
        let ptr = self.0.as_ptr();
        std::mem::forget(self);
        ptr
    }
}

impl Drop for LegacyExport {
    fn drop(&mut self) {
        // SAFETY: `self` still owns the managed tensor, made by `export_legacy`.
        unsafe { delete_legacy(self.0.as_ptr()) }
    }
}

/// Exports `tensor` in the versioned ABI (DLPack 1.0) for a consumer reading on `consumer`.
/// The data is writable (no flag set): the memory belongs to the batch, which nothing else
/// reads.
pub fn export_versioned(
    tensor: &Arc<Tensor>,
    consumer: &ConsumerStream,
) -> Result<VersionedExport> {
    let dl_tensor = describe(tensor, consumer)?;
    let managed = DLManagedTensorVersioned {
        version: DLPACK_VERSION,
        manager_ctx: std::ptr::null_mut(),
        deleter: Some(delete_versioned),
        flags: 0,
        dl_tensor,
    };
    Ok(VersionedExport(hold(
        managed,
        tensor,
        |m| &mut m.dl_tensor,
        |m| &mut m.manager_ctx,
    )))
}

/// Exports `tensor` in the legacy ABI (before DLPack 1.0) for a consumer reading on `consumer`.
pub fn export_legacy(tensor: &Arc<Tensor>, consumer: &ConsumerStream) -> Result<LegacyExport> {
    let dl_tensor = describe(tensor, consumer)?;
    let managed = DLManagedTensor {
        dl_tensor,
        manager_ctx: std::ptr::null_mut(),
        deleter: Some(delete_legacy),
    };
    Ok(LegacyExport(hold(
        managed,
        tensor,
        |m| &mut m.dl_tensor,
        |m| &mut m.manager_ctx,
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::options::Layout;
    use crate::tensor::{HostData, HostTensor};

    fn host(dtype: DType) -> Arc<Tensor> {
        let n: usize = 2 * 3 * 4 * 5;
        let data = match dtype {
            DType::F16 => HostData::F16((0..n).map(|i| half::f16::from_f32(i as f32)).collect()),
            DType::BF16 => HostData::BF16((0..n).map(|i| half::bf16::from_f32(i as f32)).collect()),
            DType::F32 => HostData::F32((0..n).map(|i| i as f32).collect()),
            DType::I32 => HostData::I32((0..n).map(|i| i as i32).collect()),
            DType::I64 => HostData::I64((0..n).map(|i| i as i64).collect()),
            DType::U8 => HostData::U8((0..n).map(|i| i as u8).collect()),
        };
        let tensor = HostTensor::new(data, [2, 3, 4, 5], Layout::Nchw).expect("shape");
        Arc::new(Tensor::Host(tensor))
    }

    #[test]
    fn host_export_describes_the_tensor_and_keeps_it_alive() {
        let all = [
            DType::F16,
            DType::BF16,
            DType::F32,
            DType::I32,
            DType::I64,
            DType::U8,
        ];
        for dtype in all {
            let tensor = host(dtype);
            let export = export_versioned(&tensor, &ConsumerStream::unordered()).expect("export");
            assert_eq!(Arc::strong_count(&tensor), 2);
            // SAFETY: `export` is alive.
            let managed = unsafe { &*export.as_ptr() };
            assert_eq!(managed.version, DLPACK_VERSION);
            assert_eq!(managed.flags, 0);
            let t = &managed.dl_tensor;
            assert_eq!(
                t.device,
                DLDevice {
                    device_type: DEVICE_CPU,
                    device_id: 0
                }
            );
            assert_eq!(t.ndim, 4);
            assert_eq!(t.dtype, data_type(dtype));
            // SAFETY: shape and strides point at 4 values inside the live holder.
            let (shape, strides) = unsafe {
                (
                    std::slice::from_raw_parts(t.shape, 4),
                    std::slice::from_raw_parts(t.strides, 4),
                )
            };
            assert_eq!(shape, [2, 3, 4, 5]);
            assert_eq!(strides, [60, 20, 5, 1]);
            let bytes = dtype.size_of();
            // SAFETY: the data holds 120 elements of `bytes` bytes, alive through `tensor`.
            let last = unsafe {
                std::slice::from_raw_parts((t.data as *const u8).add(119 * bytes), bytes)
            };
            let want = match dtype {
                DType::F16 => half::f16::from_f32(119.0).to_le_bytes().to_vec(),
                DType::BF16 => half::bf16::from_f32(119.0).to_le_bytes().to_vec(),
                DType::F32 => 119f32.to_le_bytes().to_vec(),
                DType::I32 => 119i32.to_le_bytes().to_vec(),
                DType::I64 => 119i64.to_le_bytes().to_vec(),
                DType::U8 => vec![119u8],
            };
            assert_eq!(last, want.as_slice());
            drop(export);
            assert_eq!(
                Arc::strong_count(&tensor),
                1,
                "the deleter gave the reference back"
            );
        }
    }

    #[test]
    fn tensors_of_other_ranks_export_their_own_axes() {
        // A packed patch sequence's tokens [rows, dim] and a padded one's [n, len, dim].
        for shape in [vec![6usize, 20], vec![2, 3, 20], vec![120]] {
            let data = HostData::F32((0..120).map(|i| i as f32).collect());
            let tensor = Arc::new(Tensor::Host(
                HostTensor::new(data, &shape, Layout::Nchw).expect("shape"),
            ));
            let export = export_legacy(&tensor, &ConsumerStream::unordered()).expect("export");
            // SAFETY: `export` is alive.
            let t = unsafe { &(*export.as_ptr()).dl_tensor };
            assert_eq!(t.ndim as usize, shape.len());
            // SAFETY: shape and strides point at `ndim` values inside the live holder.
            let (got, strides) = unsafe {
                (
                    std::slice::from_raw_parts(t.shape, shape.len()),
                    std::slice::from_raw_parts(t.strides, shape.len()),
                )
            };
            let want: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
            assert_eq!(got, want.as_slice());
            assert_eq!(strides.last(), Some(&1));
            assert_eq!(strides[0], 120 / shape[0] as i64);
        }
    }

    #[test]
    fn legacy_export_and_raw_deleter_on_another_thread() {
        let tensor = host(DType::F32);
        let raw = export_legacy(&tensor, &ConsumerStream::unordered())
            .expect("export")
            .into_raw() as usize;
        assert_eq!(Arc::strong_count(&tensor), 2);
        std::thread::spawn(move || {
            let managed = raw as *mut DLManagedTensor;
            // SAFETY: the export was given up with `into_raw`; its deleter runs once, here.
            unsafe {
                let deleter = (*managed).deleter.expect("a deleter");
                deleter(managed);
            }
        })
        .join()
        .expect("deleter thread");
        assert_eq!(Arc::strong_count(&tensor), 1);
    }

    #[test]
    fn host_export_refuses_a_stream_and_array_api_values_are_checked() {
        let tensor = host(DType::F32);
        let err = export_versioned(&tensor, &ConsumerStream::legacy_default())
            .expect_err("a host batch takes no stream");
        assert!(err.to_string().contains("no stream"), "{err}");
        // SAFETY: no handle is passed.
        unsafe {
            assert!(ConsumerStream::from_array_api(Some(0)).is_err());
            assert!(ConsumerStream::from_array_api(Some(-2)).is_err());
            assert!(ConsumerStream::from_array_api(Some(-1))
                .expect("-1")
                .is_unordered());
            assert!(!ConsumerStream::from_array_api(None)
                .expect("None")
                .is_unordered());
        }
    }
}
