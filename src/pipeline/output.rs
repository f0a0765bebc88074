//! The seam between the decode lanes and the batch: an [`OutputStage`] lends the staging the
//! lanes write each image into, and turns a filled staging into the batch's tensor. Two
//! siblings: [`CudaOutput`] (pinned staging, u8 upload and the normalize kernel on the
//! pipeline's stream) and [`HostOutput`] (the CPU device: each image normalized by the thread
//! that prepared it, into memory reused across batches).

use std::sync::Arc;

use cudarc::driver::CudaStream;

use crate::cpu::{NormalizeTable, Staging};
use crate::cuda::{Gpu, Normalizer, StagingRing};
use crate::error::{Error, Result};
use crate::options::{NormalizeSpec, Options};
use crate::tensor::{HostData, HostPool, HostTensor, Tensor};

/// Staging slots of a CUDA pipeline: the CPU fills one while the previous one uploads.
const STAGING_SLOTS: usize = 2;

/// What becomes of a batch once its images are staged.
pub(crate) trait OutputStage: Send {
    /// The device the batches land on, in words.
    fn describe(&self) -> String;

    /// Page-locked host memory held.
    fn pinned_bytes(&self) -> usize;

    /// The CUDA stream the batches are written on (none on the CPU device).
    fn cuda_stream(&self) -> Option<Arc<CudaStream>>;

    /// Staging slots in rotation.
    fn slots(&self) -> usize;

    /// Slot `slot` for the lanes to fill, once nothing reads it any more.
    fn staging(&mut self, slot: usize) -> Result<Staging<'_>>;

    /// The first `n` images of slot `slot` as the batch's tensor, and the bytes uploaded.
    fn finish(&mut self, slot: usize, n: usize) -> Result<(Tensor, usize)>;
}

/// Opens the output stage `options` ask for, refusing up front a batch the device cannot hold.
pub(crate) fn open(options: &Options, image_bytes: usize) -> Result<Box<dyn OutputStage>> {
    let batch_size = options.batching.batch_size;
    let slot_bytes = batch_size.checked_mul(image_bytes).ok_or_else(|| {
        Error::invalid(
            "batch_size",
            format!("{batch_size} images of {image_bytes} bytes do not fit in memory"),
        )
    })?;
    let (height, width) = options.resize.output_size();
    let dims = (height as usize, width as usize);
    let spec = options.output.spec();
    Ok(match options.runtime.device {
        crate::Device::Cpu => Box::new(HostOutput::new(slot_bytes, dims, spec)),
        crate::Device::Cuda(ordinal) => {
            Box::new(CudaOutput::open(ordinal, slot_bytes, dims, spec)?)
        }
    })
}

/// Batches on a CUDA device.
struct CudaOutput {
    gpu: Gpu,
    ring: StagingRing,
    normalizer: Normalizer,
    spec: NormalizeSpec,
    dims: (usize, usize),
}

impl CudaOutput {
    fn open(
        ordinal: usize,
        slot_bytes: usize,
        dims: (usize, usize),
        spec: NormalizeSpec,
    ) -> Result<CudaOutput> {
        let gpu = Gpu::open(ordinal)?;
        // The device holds the u8 input and at least one output batch at a time.
        let needed = slot_bytes as u128 * (1 + spec.dtype.size_of() as u128);
        let (free, _) = gpu.memory()?;
        if needed > free as u128 {
            return Err(Error::OutOfDeviceMemory {
                context: "sizing the batch",
                needed: Some((needed.min(u64::MAX as u128) as u64, free as u64)),
            });
        }
        let normalizer = Normalizer::new(gpu.stream())?;
        let ring = StagingRing::new(gpu.stream(), STAGING_SLOTS, slot_bytes)?;
        Ok(CudaOutput {
            gpu,
            ring,
            normalizer,
            spec,
            dims,
        })
    }
}

impl OutputStage for CudaOutput {
    fn describe(&self) -> String {
        self.gpu.describe()
    }

    fn pinned_bytes(&self) -> usize {
        self.ring.pinned_bytes()
    }

    fn cuda_stream(&self) -> Option<Arc<CudaStream>> {
        Some(self.gpu.stream().clone())
    }

    fn slots(&self) -> usize {
        self.ring.len()
    }

    fn staging(&mut self, slot: usize) -> Result<Staging<'_>> {
        Ok(Staging {
            pixels: self.ring.slot_mut(slot)?,
            normalized: None,
        })
    }

    fn finish(&mut self, slot: usize, n: usize) -> Result<(Tensor, usize)> {
        let (height, width) = self.dims;
        let bytes = n * height * width * 3;
        let input = self.ring.upload(slot, bytes)?;
        let tensor = self
            .normalizer
            .run(self.gpu.stream(), input, n, height, width, &self.spec)?;
        Ok((Tensor::Device(tensor), bytes))
    }
}

/// Batches in host memory.
struct HostOutput {
    pixels: Vec<u8>,
    table: NormalizeTable,
    pool: Arc<HostPool>,
    /// The output being filled, between `staging` and `finish`.
    current: Option<HostData>,
    spec: NormalizeSpec,
    dims: (usize, usize),
}

impl HostOutput {
    fn new(slot_bytes: usize, dims: (usize, usize), spec: NormalizeSpec) -> HostOutput {
        HostOutput {
            pixels: vec![0; slot_bytes],
            table: NormalizeTable::new(&spec),
            pool: Arc::new(HostPool::default()),
            current: None,
            spec,
            dims,
        }
    }
}

impl OutputStage for HostOutput {
    fn describe(&self) -> String {
        "CPU".into()
    }

    fn pinned_bytes(&self) -> usize {
        0
    }

    fn cuda_stream(&self) -> Option<Arc<CudaStream>> {
        None
    }

    fn slots(&self) -> usize {
        1
    }

    fn staging(&mut self, _slot: usize) -> Result<Staging<'_>> {
        let current = match self.current.take() {
            // A batch that yielded nothing (only bad images) left its output unused.
            Some(unused) => self.current.insert(unused),
            None => self
                .current
                .insert(self.pool.take(self.spec.dtype, self.pixels.len())),
        };
        Ok(Staging {
            pixels: &mut self.pixels,
            normalized: Some((current, &self.table)),
        })
    }

    fn finish(&mut self, _slot: usize, n: usize) -> Result<(Tensor, usize)> {
        let (height, width) = self.dims;
        let data = self
            .current
            .take()
            .ok_or_else(|| Error::Worker("a batch finished before it was staged".into()))?;
        let shape = self.spec.layout.shape(n, height, width);
        let tensor = HostTensor::pooled(data, shape, self.spec.layout, &self.pool);
        Ok((Tensor::Host(tensor), 0))
    }
}
