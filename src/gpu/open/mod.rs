//! How the lane opens: nvJPEG loaded, the decoders' configurations, the resize kernel compiled,
//! the assisted path's and the JPEG engines' decoder sets made (before the lane starts, or
//! joining it beside the running batches: [`joining`]), and the lane's threads started.

mod assisted;
mod engines;
mod joining;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

pub(super) use assisted::later_sets_note;
pub(super) use engines::{engine_count, note as engines_note, opening_note, GrayDecoders};
pub(super) use joining::Joining;

use super::*;
use crate::schedule::EnginesOpen;
use assisted::AssistedRecipe;
use engines::EngineRecipe;

impl GpuLane {
    /// Opens the lane on `gpu` (its decoders initialized and warmed up, its threads started),
    /// its JPEG engines opening as `engines` says; `Err` says why it cannot run here. Gives up,
    /// between its steps, once `cancel` is raised (the pipeline that wanted it is gone). With
    /// the engines opening beside it and the assisted path open, the lane comes without its
    /// engines, which open beside it (most of the lane's setup, a second or two): until they
    /// join, the assisted path takes every file it can, the CPU lane the rest
    /// ([`GpuLane::poll_opening`]).
    pub fn open(
        gpu: &Gpu,
        config: &GpuLaneConfig,
        engines: EnginesOpen,
        cancel: &AtomicBool,
    ) -> Result<GpuLane, GpuLaneError> {
        GpuLane::open_for(gpu, config, GRAY_ON_THE_GPU, engines, cancel)
    }

    /// [`GpuLane::open`], saying whether gray JPEGs go to the hardware.
    pub(super) fn open_for(
        gpu: &Gpu,
        config: &GpuLaneConfig,
        gray: bool,
        engines_open: EnginesOpen,
        cancel: &AtomicBool,
    ) -> Result<GpuLane, GpuLaneError> {
        let given_up = || {
            cancel
                .load(Ordering::Relaxed)
                .then(|| GpuLaneError::Opening("the pipeline was dropped".into()))
        };
        let geometry = config.geometry;
        let filter = match geometry.resampling() {
            Resampling::Filter(filter) => filter,
            Resampling::Nearest => return Err(GpuLaneError::Filter(geometry.interpolation)),
        };
        let opening = Instant::now();
        let nvjpeg = NvJpeg::load()?;
        let loaded = opening.elapsed();
        let engine_calls = EngineCalls::for_files(config.large_files);
        let colour = DecoderConfig {
            max_batch: engine_calls.images,
            output: OutputFormat::Yuv,
            gray: false,
            max_image_pixels: config.max_pixels,
            preallocate: Some((PREALLOCATE_SIDE, PREALLOCATE_SIDE)),
            // A full call's Y, Cb and Cr planes at most, with the planes' alignment, and its
            // files (unless read in place), so the arena and staging are sized once. Calls read
            // in place take turns at the engines; copied ones go side by side.
            initial_output_bytes: engine_calls.plane_bytes as usize + ARENA_SLACK,
            initial_staging_bytes: engine_calls.compressed_bytes as usize,
            staging: engine_calls.staging,
            take_turns: engine_calls.staging == Staging::InPlace,
            ..DecoderConfig::default()
        };
        let gray_config = gray.then(|| DecoderConfig {
            output: OutputFormat::Y,
            gray: true,
            colour: false,
            initial_output_bytes: engine_calls.gray().plane_bytes as usize + ARENA_SLACK,
            // Gray files are staged: their frame's sampling factors are rewritten in the copy.
            staging: Staging::Pinned,
            initial_staging_bytes: engine_calls.gray().compressed_bytes as usize,
            ..colour.clone()
        });
        let screen =
            LaneScreen::for_decoders(&colour, gray_config.as_ref(), config.exif_orientation);
        let compiling = Instant::now();
        let module = gpu
            .module(&resize::kernel_source())
            .map_err(GpuLaneError::kernel("resize.cu"))?;
        let gather = module
            .load_function("gpufeed_gather")
            .map_err(GpuLaneError::cuda("finding the gather kernel"))?;
        let compiled = compiling.elapsed();
        if let Some(cancelled) = given_up() {
            return Err(cancelled);
        }
        let engines = EngineRecipe {
            gpu: gpu.clone(),
            nvjpeg: nvjpeg.clone(),
            module: module.clone(),
            decoders: EngineDecoders {
                colour,
                gray: gray_config,
                calls: engine_calls,
            },
            geometry,
            filter,
        };
        // The assisted path is an addition: without it the engines take every image they can.
        // Beside running batches its first set opens before the lane starts, the others after.
        let assisting = Instant::now();
        let assisted_recipe = AssistedRecipe {
            gpu: gpu.clone(),
            module: module.clone(),
            geometry,
            filter,
            call_pixels: crate::gpu::assisted::call_pixels(config.large_files),
        };
        let assisted_sets = assisted_threads(config, engines_open);
        let small_files_share = match config.small_files_assisted {
            true => small_files_assisted_share(config.assisted_share),
            false => 0.0,
        };
        let sets_first = match engines_open {
            EnginesOpen::BeforeTheLane => assisted_sets,
            _ => 1,
        };
        let assisted = match config.assisted_share > 0.0 {
            true => assisted_recipe.open(sets_first, cancel),
            false => Err(GpuLaneError::Opening("its share is 0".into())),
        };
        let assisted_opened = assisting.elapsed();
        let (mut sets, assisted_share, assisted_note) = match assisted {
            Ok(assisted) => (
                assisted,
                config.assisted_share,
                format!(
                    "; the assisted path takes {:.0}% of the baseline files of 1 Mpx or more \
                     and {:.0}% of the smaller ones{}, and the progressive files, their \
                     coefficients decoded on {} CPU threads ({} opened in {:.0} ms)",
                    config.assisted_share * 100.0,
                    small_files_share * 100.0,
                    match engines_open {
                        EnginesOpen::BeforeTheLane => "",
                        _ => {
                            ", and every one while the engines are not open (the gray ones \
                             until their gray decoders are made)"
                        }
                    },
                    config.coefficient_threads.max(1),
                    match sets_first == assisted_sets {
                        true => format!("its {assisted_sets} decoders"),
                        false => format!("the first of its {assisted_sets} decoders"),
                    },
                    ms(assisted_opened)
                ),
            ),
            Err(reason) => (
                Vec::new(),
                0.0,
                format!("; the assisted path is off: {reason}"),
            ),
        };
        // Without the assisted path the lane has nothing to do before its engines are open.
        let engines_later = engines_open != EnginesOpen::BeforeTheLane && !sets.is_empty();
        let creating = Instant::now();
        let engine_count = if engines_later {
            String::new()
        } else {
            let opened = engines.open()?;
            let count = engine_count(&opened).map_or(String::new(), |count| format!(", {count}"))
                + &opening_note(&opened);
            sets.extend(opened);
            count
        };
        let created = creating.elapsed();
        let image_bytes = geometry.image_bytes();
        let lookahead = lookahead(config.batch_size);
        let slots = ring_slots(config.batch_size);
        if let Some(cancelled) = given_up() {
            return Err(cancelled);
        }
        // Progressive files take the assisted path too, their coefficients decoded on threads
        // of the lane's own, started at the first such file.
        let coefficients = (assisted_share > 0.0).then(|| {
            Arc::new(CoefficientThreads::new(
                config.coefficient_threads,
                config.decode_memory.clone(),
            ))
        });
        let preparers = (0..PREPARING_THREADS)
            .map(|_| {
                Preparer::new(
                    geometry,
                    filter,
                    config.stopwatch.clone(),
                    coefficients.clone(),
                )
            })
            .collect();
        let starting = Instant::now();
        let runner = Runner::start(
            gpu,
            sets,
            preparers,
            screen,
            shared::Limits {
                stopwatch: config.stopwatch.clone(),
                slots,
                image_bytes,
                lookahead,
                max_file_bytes: config.max_file_bytes,
                queued_calls: [engine_calls.threads, assisted_sets],
                engine_calls,
                assisted_share,
                small_files_assisted_share: small_files_share,
                assisted_call_pixels: assisted_recipe.call_pixels,
            },
        )?;
        let started = starting.elapsed();
        let later_sets = match assisted_share == 0.0 || sets_first == assisted_sets {
            true => Joining::Settled,
            false => Joining::Coming(assisted_recipe.open_beside(assisted_sets - sets_first)?),
        };
        let (engines, gray_decoders) = match (engines_later, engines_open) {
            (false, _) => (Joining::Settled, GrayDecoders::none()),
            (true, EnginesOpen::Never(reason)) => (
                Joining::Off(format!("not opened: {reason}")),
                GrayDecoders::none(),
            ),
            (true, _) => {
                let (sets, grays) = engines.open_beside(runner.grays_coming())?;
                (Joining::Coming(sets), grays)
            }
        };
        let (major, minor, patch) = nvjpeg.version();
        let decoders = match engines_later {
            true => String::new(),
            false => format!(", decoders {:.0}", ms(created)),
        };
        Ok(GpuLane {
            runner,
            gather,
            gather_descriptors: None,
            image_bytes,
            engines,
            gray_decoders,
            later_sets,
            description: format!(
                "nvJPEG {major}.{minor}.{patch} hardware decoder{engine_count}; opened in {:.0} \
                 ms: library {:.0}, kernels {:.0}{decoders}, ring and threads {:.0}\
                 {assisted_note}",
                ms(opening.elapsed()),
                ms(loaded),
                ms(compiled),
                ms(started)
            ),
        })
    }
}

/// The assisted path's submitting threads for `config`'s files, the engines opening as
/// `engines`: all of them, unless the engines open first and the assisted path takes only the
/// few files of 1 Mpx or more among small ones (one then, which holds less memory).
fn assisted_threads(config: &GpuLaneConfig, engines: EnginesOpen) -> usize {
    let few_files = !config.large_files && !config.small_files_assisted;
    match (few_files, engines) {
        (true, EnginesOpen::BeforeTheLane) => 1,
        _ => ASSISTED_THREADS,
    }
}
