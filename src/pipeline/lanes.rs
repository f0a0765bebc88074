//! The decode lanes of a pipeline as one value: the CPU lane alone, or the CPU lane and the GPU
//! decode lane side by side (hybrid decoding). The decode choice ([`DecodeOptions::lanes`]) is
//! read here, where the lanes are built, and nowhere else; the worker asks the lanes for a batch's
//! images and the output stage never learns who decoded them.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};

use super::hybrid::{Balance, HybridFilled, HybridLanes, Probe};
use super::output::DeviceWrites;
use crate::batch::DecodedBy;
use crate::cpu::{AheadWork, BatchRequest, CpuAhead, CpuLane, Staging};
use crate::cuda::Gpu;
use crate::error::Result;
use crate::geometry::Geometry;
use crate::gpu::{lookahead, offered, GpuLane, GpuLaneConfig, LaneOutput, LaneWork};
use crate::options::{Decode, Options};
use crate::order::EpochOrder;
use crate::source::Source;

/// The lanes a pipeline decodes with.
pub(crate) struct Lanes {
    cpu: CpuLane,
    /// With hybrid decoding, the GPU lane and the CPU lane's threads working ahead beside it.
    hybrid: Option<HybridLanes>,
    /// Why hybrid decoding was asked for and runs without its GPU lane.
    gpu_off: Option<String>,
}

impl Lanes {
    /// The GPU lane's configuration when `options` ask for hybrid decoding on a CUDA device.
    fn gpu_config(options: &Options) -> Option<GpuLaneConfig> {
        let hybrid =
            options.decode.lanes == Decode::Hybrid && options.runtime.device != crate::Device::Cpu;
        hybrid.then(|| GpuLaneConfig {
            geometry: Geometry::new(&options.resize),
            max_pixels: options.decode.max_pixels,
            batch_size: options.batching.batch_size,
            max_file_bytes: options.decode.max_file_bytes,
            exif_orientation: options.decode.exif_orientation,
        })
    }

    /// Device memory the lanes `options` ask for take (the GPU lane's ring and buffers), for
    /// the output stage's check of what fits before anything is allocated.
    pub fn device_bytes(options: &Options) -> u128 {
        Lanes::gpu_config(options).map_or(0, |config| GpuLane::device_bytes(&config))
    }

    /// Opens the lanes `options` ask for; the GPU lane on `gpu` (the pipeline's device) with
    /// hybrid decoding. A GPU lane that cannot run here leaves the CPU lane alone, and
    /// [`Lanes::describe`] says why.
    pub fn open(options: &Options, gpu: Option<&Gpu>) -> Result<Lanes> {
        let opened = match (Lanes::gpu_config(options), gpu) {
            (Some(config), Some(gpu)) => Some(GpuLane::open(gpu, &config).map(|lane| (lane, gpu))),
            _ => None,
        };
        let (gpu_lane, gpu_off) = match opened {
            Some(Ok(lane)) => (Some(lane), None),
            Some(Err(reason)) => (None, Some(reason.to_string())),
            None => (None, None),
        };
        // By default the CPU lane leaves two cores to the GPU lane's submitting threads (which
        // wait on the engines most of the time) and the thread that hands the batches out.
        let threads = match (options.runtime.threads, &gpu_lane) {
            (0, Some(_)) => std::thread::available_parallelism()
                .map_or(1, |n| n.get())
                .saturating_sub(2)
                .max(1),
            (threads, _) => threads,
        };
        let cpu = CpuLane::new(&options.decode, &options.resize, threads)?;
        let hybrid = match gpu_lane {
            Some((gpu_lane, gpu)) => {
                let batch_size = options.batching.batch_size;
                let lookahead = lookahead(batch_size);
                let ahead =
                    CpuAhead::start(cpu.core(), cpu.threads(), lookahead, batch_size + lookahead)?;
                Some(HybridLanes {
                    gpu: gpu_lane,
                    ahead,
                    balance: Balance::new(options.decode.gpu_share),
                    stream: gpu.stream().clone(),
                    image_bytes: cpu.image_bytes(),
                })
            }
            None => None,
        };
        Ok(Lanes {
            cpu,
            hybrid,
            gpu_off,
        })
    }

    /// What the pipeline's device description adds for the lanes: the GPU lane in words, or
    /// why it is off; empty for the CPU lane alone.
    pub fn describe(&self) -> String {
        match (&self.hybrid, &self.gpu_off) {
            (Some(hybrid), _) => format!(", {}", hybrid.gpu.describe()),
            (None, Some(off)) => {
                format!(" (GPU decode lane off: {off}; the CPU decodes every image)")
            }
            (None, None) => String::new(),
        }
    }

    /// The GPU lane's share in force: as given, or once measured; `None` without a GPU lane.
    pub fn gpu_share(&self) -> Option<f32> {
        self.hybrid.as_ref().and_then(|h| h.balance.share())
    }

    /// Whether the GPU lane runs and its share is still to be measured.
    pub fn needs_measuring(&self) -> bool {
        self.hybrid
            .as_ref()
            .is_some_and(|h| h.balance.share().is_none())
    }

    /// Measures the share on the probe's images, with `staging` as the CPU lane's scratch (see
    /// [`HybridLanes::measure`]); nothing without a GPU lane.
    pub fn measure(
        &mut self,
        staging: Staging<'_>,
        probe: &Probe<'_>,
        stop: &AtomicBool,
    ) -> Result<()> {
        let Some(hybrid) = self.hybrid.as_mut() else {
            return Ok(());
        };
        let measured = hybrid.measure(&self.cpu, staging, probe, stop)?;
        if let Some(share) = measured {
            hybrid.balance = Balance::new(Some(share));
        }
        Ok(())
    }

    /// Starts both lanes on `order` (an epoch) under the share in force; returns it, or `None`
    /// when only the CPU lane runs (it needs no start: it works batch by batch).
    pub fn begin(
        &mut self,
        source: &Arc<Source>,
        order: &Arc<EpochOrder>,
        epoch: u64,
    ) -> Result<Option<f32>> {
        let Some(hybrid) = self.hybrid.as_mut() else {
            return Ok(None);
        };
        let Some(share) = hybrid.balance.share() else {
            return Ok(None);
        };
        hybrid.ahead.begin(AheadWork {
            source: source.clone(),
            order: order.clone(),
            epoch,
            on_gpu: Arc::new(move |index| offered(index, share)),
        });
        hybrid.gpu.begin(
            &hybrid.stream,
            LaneWork {
                source: source.clone(),
                order: order.clone(),
                share,
                epoch,
                refused: Some(hybrid.ahead.hand_back_fn()),
            },
        )?;
        Ok(Some(share))
    }

    /// Fills a batch from the request's positions: with both lanes when they were begun on the
    /// epoch with `share`, else with the CPU lane alone, its images written into `staging`.
    /// `Ok(None)` if `stop` was raised meanwhile.
    pub fn fill(
        &mut self,
        staging: &mut Staging<'_>,
        request: &BatchRequest<'_>,
        source: &Source,
        stop: &AtomicBool,
        share: Option<f32>,
    ) -> Result<Option<HybridFilled>> {
        if let (Some(hybrid), Some(share)) = (self.hybrid.as_mut(), share) {
            return hybrid.fill(staging, request, source, stop, share);
        }
        Ok(self
            .cpu
            .fill(staging, request, source, stop)?
            .map(|filled| HybridFilled {
                decoded_by: DecodedBy {
                    cpu: filled.indices.len(),
                    gpu: 0,
                },
                filled,
                from_gpu: Vec::new(),
            }))
    }

    /// Gives back the GPU lane's images of a batch that is not made after all.
    pub fn discard(&mut self, from_gpu: Vec<(LaneOutput, usize)>) -> Result<()> {
        match self.hybrid.as_mut() {
            Some(hybrid) => hybrid.gpu.discard(
                &hybrid.stream,
                from_gpu.into_iter().map(|(output, _)| output).collect(),
            ),
            None => Ok(()),
        }
    }

    /// The GPU lane's images of a batch, to be written into its places of the batch's device
    /// buffer by the output stage (their slots go back to the lane once queued).
    pub fn device_writes(&mut self, from_gpu: Vec<(LaneOutput, usize)>) -> GpuImages<'_> {
        GpuImages {
            lane: self.hybrid.as_mut().map(|h| &mut h.gpu),
            outputs: from_gpu,
        }
    }
}

/// Images the GPU lane made for a batch, with their places in it.
pub(crate) struct GpuImages<'a> {
    lane: Option<&'a mut GpuLane>,
    outputs: Vec<(LaneOutput, usize)>,
}

impl DeviceWrites for GpuImages<'_> {
    fn places(&self) -> Vec<usize> {
        let mut places: Vec<usize> = self.outputs.iter().map(|&(_, place)| place).collect();
        places.sort_unstable();
        places
    }

    fn write(&mut self, stream: &Arc<CudaStream>, input: &mut CudaSlice<u8>) -> Result<()> {
        let Some(lane) = self.lane.as_mut() else {
            return Ok(());
        };
        let outputs = std::mem::take(&mut self.outputs);
        lane.gather(stream, &outputs, input)?;
        lane.release(stream, outputs.into_iter().map(|(output, _)| output))
    }
}
