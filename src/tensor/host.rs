//! Tensors in host memory, and the pool that lets a pipeline reuse their memory once the
//! consumer has dropped them.

use std::sync::{Arc, Mutex};

use half::{bf16, f16};

use crate::options::{DType, Layout};

/// Elements of a host tensor.
#[derive(Debug, Clone, PartialEq)]
pub enum HostData {
    /// Half precision.
    F16(Vec<f16>),
    /// bfloat16.
    BF16(Vec<bf16>),
    /// Single precision.
    F32(Vec<f32>),
    /// 32-bit integers (a patch sequence's `cu_seqlens` and masks).
    I32(Vec<i32>),
    /// 64-bit integers (a patch sequence's grids, shapes and coordinates).
    I64(Vec<i64>),
    /// Unsigned bytes (dense targets' masks).
    U8(Vec<u8>),
}

impl HostData {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            HostData::F16(v) => v.len(),
            HostData::BF16(v) => v.len(),
            HostData::F32(v) => v.len(),
            HostData::I32(v) => v.len(),
            HostData::I64(v) => v.len(),
            HostData::U8(v) => v.len(),
        }
    }

    /// Whether there is no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        match self {
            HostData::F16(_) => DType::F16,
            HostData::BF16(_) => DType::BF16,
            HostData::F32(_) => DType::F32,
            HostData::I32(_) => DType::I32,
            HostData::I64(_) => DType::I64,
            HostData::U8(_) => DType::U8,
        }
    }

    /// The first element's address.
    pub(crate) fn as_ptr(&self) -> *const u8 {
        match self {
            HostData::F16(v) => v.as_ptr().cast(),
            HostData::BF16(v) => v.as_ptr().cast(),
            HostData::F32(v) => v.as_ptr().cast(),
            HostData::I32(v) => v.as_ptr().cast(),
            HostData::I64(v) => v.as_ptr().cast(),
            HostData::U8(v) => v.as_ptr().cast(),
        }
    }

    /// `len` elements of `dtype`, reusing `self`'s memory when the type matches. New memory is
    /// zeroed by the system as its pages are first touched (by the threads that write the
    /// images), not by a pass over it here.
    fn resized(self, dtype: DType, len: usize) -> HostData {
        use half::vec::HalfBitsVecExt;
        match (self, dtype) {
            (HostData::F16(mut v), DType::F16) => {
                v.resize(len, f16::ZERO);
                HostData::F16(v)
            }
            (HostData::BF16(mut v), DType::BF16) => {
                v.resize(len, bf16::ZERO);
                HostData::BF16(v)
            }
            (HostData::F32(mut v), DType::F32) => {
                v.resize(len, 0.0);
                HostData::F32(v)
            }
            (_, DType::F16) => HostData::F16(vec![0u16; len].reinterpret_into()),
            (_, DType::BF16) => HostData::BF16(vec![0u16; len].reinterpret_into()),
            (_, DType::F32) => HostData::F32(vec![0.0; len]),
            (_, DType::I32) => HostData::I32(vec![0; len]),
            (_, DType::I64) => HostData::I64(vec![0; len]),
            (_, DType::U8) => HostData::U8(vec![0; len]),
        }
    }

    /// Per-image writable chunks of `image_len` elements (none for integers, which no image
    /// batch holds).
    pub(crate) fn image_slots(&mut self, image_len: usize) -> Vec<NormalizedSlot<'_>> {
        match self {
            HostData::F16(v) => v.chunks_mut(image_len).map(NormalizedSlot::F16).collect(),
            HostData::BF16(v) => v.chunks_mut(image_len).map(NormalizedSlot::BF16).collect(),
            HostData::F32(v) => v.chunks_mut(image_len).map(NormalizedSlot::F32).collect(),
            HostData::I32(_) | HostData::I64(_) | HostData::U8(_) => Vec::new(),
        }
    }

    /// Copies image `from` over image `to` (`image_len` elements each).
    pub(crate) fn move_image(&mut self, from: usize, to: usize, image_len: usize) {
        let src = from * image_len..(from + 1) * image_len;
        let dst = to * image_len;
        match self {
            HostData::F16(v) => v.copy_within(src, dst),
            HostData::BF16(v) => v.copy_within(src, dst),
            HostData::F32(v) => v.copy_within(src, dst),
            HostData::I32(v) => v.copy_within(src, dst),
            HostData::I64(v) => v.copy_within(src, dst),
            HostData::U8(v) => v.copy_within(src, dst),
        }
    }

    fn truncate(&mut self, len: usize) {
        match self {
            HostData::F16(v) => v.truncate(len),
            HostData::BF16(v) => v.truncate(len),
            HostData::F32(v) => v.truncate(len),
            HostData::I32(v) => v.truncate(len),
            HostData::I64(v) => v.truncate(len),
            HostData::U8(v) => v.truncate(len),
        }
    }
}

/// The normalized output of one image, written by the thread that prepared it.
pub(crate) enum NormalizedSlot<'a> {
    F16(&'a mut [f16]),
    BF16(&'a mut [bf16]),
    F32(&'a mut [f32]),
}

/// Host buffers given back by dropped tensors, for the next batches.
#[derive(Debug, Default)]
pub(crate) struct HostPool {
    free: Mutex<Vec<HostData>>,
}

/// Buffers a pool keeps at most; more are freed.
const POOL_KEEPS: usize = 8;

impl HostPool {
    /// Storage for `len` elements of `dtype`, reused when a dropped tensor left one (the
    /// pipeline checked at build time that the memory for its batches is there).
    pub fn take(&self, dtype: DType, len: usize) -> HostData {
        let reused = self
            .free
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .pop();
        reused
            .unwrap_or_else(|| HostData::F32(Vec::new()))
            .resized(dtype, len)
    }

    /// Fills the pool with two buffers of `len` elements of `dtype`, their pages mapped, so the
    /// first batches write into memory as ready as the later ones. Two are what a pipeline
    /// cycles through while its consumer keeps up (the batch in use, the one being filled); a
    /// slower consumer holds more, made as it needs them, while the threads wait on it anyway.
    /// The system zeroes each page as it maps it: one element written a page is all it takes.
    pub fn warm(&self, dtype: DType, len: usize) {
        for _ in 0..2 {
            // Hidden from the optimizer: zeros stored into memory known to be zero are dropped.
            let mut data = std::hint::black_box(HostData::F32(Vec::new()).resized(dtype, len));
            match &mut data {
                HostData::F16(v) => touch_pages(v, f16::ZERO),
                HostData::BF16(v) => touch_pages(v, bf16::ZERO),
                HostData::F32(v) => touch_pages(v, 0.0),
                HostData::I32(v) => touch_pages(v, 0),
                HostData::I64(v) => touch_pages(v, 0),
                HostData::U8(v) => touch_pages(v, 0),
            }
            self.give_back(data);
        }
    }

    fn give_back(&self, data: HostData) {
        let mut free = self
            .free
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if free.len() < POOL_KEEPS {
            free.push(data);
        }
    }
}

/// Writes `zero` into the first element of every 4 KiB page of `v` (zeroed already), so that
/// the system maps the pages now rather than when a batch first writes them.
fn touch_pages<T: Copy>(v: &mut [T], zero: T) {
    const PAGE: usize = 4096;
    let step = (PAGE / std::mem::size_of::<T>().max(1)).max(1);
    for element in v.iter_mut().step_by(step) {
        *element = zero;
    }
}

/// A tensor of a batch in host memory: its images, or a patch sequence's tokens or side
/// tensors.
#[derive(Debug)]
pub struct HostTensor {
    data: HostData,
    shape: Vec<usize>,
    layout: Layout,
    /// Where the memory goes when the tensor is dropped (tensors a pipeline made).
    recycle: Option<Arc<HostPool>>,
}

impl HostTensor {
    /// Wraps `data` with its `shape` (of any rank; an image batch's in `layout` order); `None`
    /// if the element count does not match the shape.
    pub fn new(data: HostData, shape: impl AsRef<[usize]>, layout: Layout) -> Option<HostTensor> {
        let shape = shape.as_ref().to_vec();
        (Some(data.len()) == super::element_count(&shape)).then_some(HostTensor {
            data,
            shape,
            layout,
            recycle: None,
        })
    }

    /// `data` sized for `shape` by the caller.
    pub(crate) fn from_parts(
        data: HostData,
        shape: impl AsRef<[usize]>,
        layout: Layout,
    ) -> HostTensor {
        let shape = shape.as_ref().to_vec();
        debug_assert_eq!(data.len(), shape.iter().product::<usize>());
        HostTensor {
            data,
            shape,
            layout,
            recycle: None,
        }
    }

    /// A tensor of the elements of `data` that `shape` covers, whose memory returns to `pool` when dropped.
    pub(crate) fn pooled(
        mut data: HostData,
        shape: impl AsRef<[usize]>,
        layout: Layout,
        pool: &Arc<HostPool>,
    ) -> HostTensor {
        let shape = shape.as_ref().to_vec();
        data.truncate(shape.iter().product());
        HostTensor {
            data,
            shape,
            layout,
            recycle: Some(pool.clone()),
        }
    }

    dense_accessors!("HostTensor");

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.data.len()
    }

    /// The elements.
    pub fn data(&self) -> &HostData {
        &self.data
    }

    /// Takes the elements out (the pipeline then allocates anew for a later batch).
    pub fn into_data(mut self) -> HostData {
        self.recycle = None;
        std::mem::replace(&mut self.data, HostData::F32(Vec::new()))
    }

    /// Every element widened to f32 (exact for the three float types; integers from 2^24 on
    /// are rounded).
    pub fn to_f32_vec(&self) -> Vec<f32> {
        match &self.data {
            HostData::F16(v) => v.iter().map(|x| x.to_f32()).collect(),
            HostData::BF16(v) => v.iter().map(|x| x.to_f32()).collect(),
            HostData::F32(v) => v.clone(),
            HostData::I32(v) => v.iter().map(|&x| x as f32).collect(),
            HostData::I64(v) => v.iter().map(|&x| x as f32).collect(),
            HostData::U8(v) => v.iter().map(|&x| f32::from(x)).collect(),
        }
    }

    /// The elements as little-endian bytes, in memory order (what a `.npy` file holds).
    pub fn to_le_bytes(&self) -> Vec<u8> {
        match &self.data {
            HostData::F16(v) => v.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect(),
            HostData::BF16(v) => v.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect(),
            HostData::F32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            HostData::I32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            HostData::I64(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            HostData::U8(v) => v.iter().flat_map(|x| [*x]).collect(),
        }
    }
}

impl Clone for HostTensor {
    /// A copy of the elements that belongs to no pool.
    fn clone(&self) -> Self {
        HostTensor {
            data: self.data.clone(),
            shape: self.shape.clone(),
            layout: self.layout,
            recycle: None,
        }
    }
}

impl PartialEq for HostTensor {
    fn eq(&self, other: &Self) -> bool {
        self.shape == other.shape && self.layout == other.layout && self.data == other.data
    }
}

impl Drop for HostTensor {
    fn drop(&mut self) {
        if let Some(pool) = self.recycle.take() {
            pool.give_back(std::mem::replace(&mut self.data, HostData::F32(Vec::new())));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warm_pool_hands_out_zeroed_buffers_of_the_asked_length() {
        for dtype in [DType::F16, DType::BF16, DType::F32, DType::U8, DType::I64] {
            let pool = HostPool::default();
            // 3 pages and a bit, so that the touched elements and the others both show.
            let len = 3 * 4096 + 17;
            pool.warm(dtype, len);
            assert_eq!(pool.free.lock().map(|f| f.len()).unwrap_or(0), 2);
            for _ in 0..2 {
                let data = pool.take(dtype, len);
                assert_eq!(data.len(), len);
                assert_eq!(data.dtype(), dtype);
                let widened = HostTensor::from_parts(data, [len], Layout::Nchw).to_f32_vec();
                assert!(widened.iter().all(|&x| x == 0.0), "{dtype:?}");
            }
        }
    }

    #[test]
    fn touch_pages_writes_one_element_a_page() {
        let mut v = vec![7u32; 3 * 1024 + 5];
        touch_pages(&mut v, 0);
        let touched: Vec<usize> = (0..v.len()).filter(|&i| v[i] == 0).collect();
        assert_eq!(touched, [0, 1024, 2048, 3072]);
    }
}
