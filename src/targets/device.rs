//! A batch of samples with targets on a CUDA device: the padded `u8` images, instance masks and
//! semantic masks copied into one page-locked staging buffer (reused from batch to batch, grown
//! only when a batch is larger than any before), uploaded asynchronously on the loader's stream,
//! the images normalized there by the normalize kernel (`src/cuda/normalize.rs`) into an NCHW
//! tensor of the chosen dtype, the masks handed out as `u8` device tensors.

use std::sync::Arc;

use cudarc::driver::{CudaEvent, CudaSlice, CudaStream};

use crate::cuda::{Gpu, Normalizer};
use crate::error::{guarded, Error, Result};
use crate::memory::PageLocked;
use crate::options::{DType, Layout, NormalizeSpec, OutputOptions};
use crate::tensor::{DeviceData, DeviceTensor};

use super::TargetBatch;

/// One batch on the device: the normalized images, the masks, and the rest of the batch (its
/// targets, sizes, calls and inverse maps; its host `images`, `masks` and `semantic` empty).
#[derive(Debug)]
pub struct DeviceTargetBatch {
    /// The images, `[N, 3, H, W]` in the output's dtype, normalized (padding included).
    pub images: DeviceTensor,
    /// Instance masks, `[objects, H, W]` `u8` (objects in row order, `targets.offsets`), when
    /// the source has segmentations.
    pub masks: Option<DeviceTensor>,
    /// Semantic masks, `[N, H, W]` `u8` (padding 255), for segmentation pairs.
    pub semantic: Option<DeviceTensor>,
    /// The batch's targets and bookkeeping.
    pub targets: TargetBatch,
}

/// The output of a detection recipe by default: torchvision's detection models take `[0, 1]`
/// floats and normalize inside, so the images are only scaled (mean 0, std 1, over 255), `f32`.
pub fn detection_output() -> OutputOptions {
    OutputOptions::default()
        .mean_std([0.0; 3], [1.0; 3])
        .dtype(DType::F32)
}

/// The output of a segmentation recipe by default: ImageNet's mean and std (what torchvision's
/// segmentation references normalize with), `f32`.
pub fn segmentation_output() -> OutputOptions {
    OutputOptions::default().dtype(DType::F32)
}

/// The loader's device stage: its stream, the normalize kernel, the staging buffer and the
/// device input buffer, both reused.
pub(crate) struct TargetUpload {
    gpu: Gpu,
    normalizer: Normalizer,
    spec: NormalizeSpec,
    staging: Option<PageLocked>,
    input: Option<CudaSlice<u8>>,
    /// Recorded after the last upload out of `staging`.
    uploaded: Option<CudaEvent>,
}

impl std::fmt::Debug for TargetUpload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TargetUpload")
            .field("device", &self.gpu.describe())
            .field("spec", &self.spec)
            .finish()
    }
}

impl TargetUpload {
    /// Opens CUDA device `ordinal` with a stream of its own and compiles the kernel.
    pub(crate) fn open(ordinal: usize, output: &OutputOptions) -> Result<TargetUpload> {
        let mut spec = output.spec();
        spec.layout = Layout::Nchw;
        if !spec.dtype.is_float() {
            return Err(spec.dtype.not_an_output());
        }
        let gpu = Gpu::open(ordinal)?;
        let normalizer = Normalizer::new(gpu.stream())?;
        Ok(TargetUpload {
            gpu,
            normalizer,
            spec,
            staging: None,
            input: None,
            uploaded: None,
        })
    }

    /// The stream every upload and kernel goes to.
    pub(crate) fn stream(&self) -> &Arc<CudaStream> {
        self.gpu.stream()
    }

    /// `batch` on the device (its instance masks as a tensor when `instance`, even of no
    /// plane); its host buffers are taken and come back as the second value, for the loader to
    /// reuse.
    pub(crate) fn upload(
        &mut self,
        mut batch: TargetBatch,
        instance: bool,
    ) -> Result<(DeviceTargetBatch, [Vec<u8>; 3])> {
        let (n, h, w) = (batch.len(), batch.height as usize, batch.width as usize);
        let parts = [&batch.images, &batch.masks, &batch.semantic];
        let total: usize = parts.iter().map(|p| p.len()).sum();
        // The staging buffer is written only once its last upload has finished.
        if let Some(event) = self.uploaded.take() {
            event
                .synchronize()
                .map_err(|e| Error::cuda("waiting for a target upload", e))?;
        }
        let context = self.stream().context().clone();
        let staging = match self.staging.take() {
            Some(s) if s.as_slice().len() >= total.max(1) => s,
            _ => guarded("page-locking the targets' staging memory", || {
                PageLocked::new(&context, total.max(1))
            })?,
        };
        let staging = self.staging.insert(staging);
        let mut at = 0;
        let mut ranges = Vec::with_capacity(3);
        for part in parts {
            staging.as_mut_slice()[at..at + part.len()].copy_from_slice(part);
            ranges.push(at..at + part.len());
            at += part.len();
        }
        let stream = self.gpu.stream().clone();
        let host = staging.as_slice();
        let fail = |e| Error::cuda("uploading a target batch", e);
        let images_len = ranges[0].len();
        let mut input = match self.input.take() {
            Some(d) if d.len() >= images_len.max(1) => d,
            // Allocated (zeroed) only when a batch is larger than any before.
            _ => guarded("allocating the targets' device input", || {
                stream.alloc_zeros::<u8>(images_len.max(1))
            })?,
        };
        if images_len > 0 {
            let mut dst = input.slice_mut(0..images_len);
            // From page-locked memory the copy is asynchronous; the event below guards it.
            stream
                .memcpy_htod(&host[ranges[0].clone()], &mut dst)
                .map_err(fail)?;
        }
        let images = self.normalizer.run(&stream, &input, n, h, w, &self.spec)?;
        self.input = Some(input);
        let plane = |range: std::ops::Range<usize>, planes: usize| -> Result<DeviceTensor> {
            let mut t = DeviceTensor::alloc(&stream, DType::U8, [planes, h, w], Layout::Nchw)?;
            if let (DeviceData::U8(s), false) = (t.data_mut(), range.is_empty()) {
                let mut dst = s.slice_mut(0..range.len());
                stream.memcpy_htod(&host[range], &mut dst).map_err(fail)?;
            }
            Ok(t)
        };
        let masks = match instance {
            true => Some(plane(
                ranges[1].clone(),
                batch.masks.len() / (h * w).max(1),
            )?),
            false => None,
        };
        let semantic = match batch.semantic.is_empty() {
            true => None,
            false => Some(plane(ranges[2].clone(), n)?),
        };
        self.uploaded = Some(
            stream
                .record_event(None)
                .map_err(|e| Error::cuda("recording a target upload", e))?,
        );
        let spent = [
            std::mem::take(&mut batch.images),
            std::mem::take(&mut batch.masks),
            std::mem::take(&mut batch.semantic),
        ];
        Ok((
            DeviceTargetBatch {
                images,
                masks,
                semantic,
                targets: batch,
            },
            spent,
        ))
    }
}

impl Drop for TargetUpload {
    fn drop(&mut self) {
        // The page-locked memory must outlive any copy still reading it.
        if let Some(event) = &self.uploaded {
            let _ = event.synchronize();
        }
    }
}
