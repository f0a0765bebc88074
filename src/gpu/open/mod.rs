//! How the lane opens: nvJPEG loaded, the decoders' configurations, the resize kernel compiled,
//! the assisted path's and the JPEG engines' decoder sets made (before the lane starts, or
//! joining it beside the running batches: [`joining`]), and the lane's threads started.

mod assisted;
mod engines;
mod joining;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::CudaModule;

pub(super) use assisted::later_sets_note;
pub(super) use engines::{engine_count, note as engines_note, opening_note, GrayDecoders};
pub(super) use joining::Joining;

use super::*;
use crate::resample::Filter;
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

    /// [`GpuLane::open`], saying whether gray JPEGs go to the hardware: nvJPEG loaded, the
    /// decoders' configurations made, the kernels compiled, the assisted path's first decoder
    /// sets and (before the lane) the engines' opened, the lane's threads started, and what
    /// opens beside the lane started on threads of its own.
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
            // Views resize with their groups' interpolations, checked below.
            Resampling::Nearest if config.views.is_some() => Filter::Bilinear,
            Resampling::Nearest => return Err(GpuLaneError::Filter(geometry.interpolation)),
        };
        if let Some(views) = &config.views {
            if let Some(g) = views
                .views
                .groups
                .iter()
                .find(|g| g.interpolation == crate::options::Interpolation::Nearest)
            {
                return Err(GpuLaneError::Filter(g.interpolation));
            }
        }
        let opening = Instant::now();
        let nvjpeg = NvJpeg::load()?;
        let loaded = opening.elapsed();
        let decoders = engine_decoders(config, gray);
        let engine_calls = decoders.calls;
        let screen = LaneScreen::for_decoders(
            &decoders.colour,
            decoders.gray.as_ref(),
            config.exif_orientation,
        );
        let compiling = Instant::now();
        let (module, gather) = compile_kernels(gpu)?;
        let compiled = compiling.elapsed();
        if let Some(cancelled) = given_up() {
            return Err(cancelled);
        }
        let engines = EngineRecipe {
            gpu: gpu.clone(),
            nvjpeg: nvjpeg.clone(),
            module: module.clone(),
            decoders,
            geometry,
            filter,
        };
        let recipe = AssistedRecipe {
            gpu: gpu.clone(),
            module,
            geometry,
            filter,
            call_pixels: crate::gpu::assisted::call_pixels(config.large_files),
        };
        let mut assisted = AssistedStart::open(recipe, config, engines_open, cancel);
        // Without the assisted path the lane has nothing to do before its engines are open.
        let engines_later = engines_open != EnginesOpen::BeforeTheLane && !assisted.sets.is_empty();
        let creating = Instant::now();
        let engine_count = match engines_later {
            true => String::new(),
            false => {
                let opened = engines.open()?;
                let count = engine_count(&opened)
                    .map_or(String::new(), |count| format!(", {count}"))
                    + &opening_note(&opened);
                assisted.sets.extend(opened);
                count
            }
        };
        let created = creating.elapsed();
        if let Some(cancelled) = given_up() {
            return Err(cancelled);
        }
        let (runner, started) = start_runner(gpu, config, screen, engine_calls, &mut assisted)?;
        let later_sets = match assisted.share == 0.0 || assisted.first == assisted.threads {
            true => Joining::Settled,
            false => Joining::Coming(
                assisted
                    .recipe
                    .open_beside(assisted.threads - assisted.first)?,
            ),
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
            image_bytes: config.image_bytes(),
            engines,
            gray_decoders,
            later_sets,
            description: format!(
                "nvJPEG {major}.{minor}.{patch} hardware decoder{engine_count}; opened in {:.0} \
                 ms: library {:.0}, kernels {:.0}{decoders}, ring and threads {:.0}{}",
                ms(opening.elapsed()),
                ms(loaded),
                ms(compiled),
                ms(started),
                assisted.note
            ),
        })
    }
}

/// What each engines' decoder set opens for `config`'s files, its gray decoder with it when
/// `gray`, and how the engines' calls are cut.
fn engine_decoders(config: &GpuLaneConfig, gray: bool) -> EngineDecoders {
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
    EngineDecoders {
        colour,
        gray: gray_config,
        calls: engine_calls,
    }
}

/// The lane's kernels compiled for `gpu` (`kernels/resize.cu`), and its gather.
fn compile_kernels(gpu: &Gpu) -> Result<(Arc<CudaModule>, CudaFunction), GpuLaneError> {
    let module = gpu
        .module(&crate::cuda::resize::kernel_source())
        .map_err(GpuLaneError::kernel("resize.cu"))?;
    let gather = module
        .load_function("gpufeed_gather")
        .map_err(GpuLaneError::cuda("finding the gather kernel"))?;
    Ok((module, gather))
}

/// The assisted path as the lane starts: the decoder sets opened before it (none where the
/// path is off), and what the lane needs to know of it.
struct AssistedStart {
    /// What opens its later sets.
    recipe: AssistedRecipe,
    /// Its sets opened before the lane starts (the engines' join them there when they open
    /// first).
    sets: Vec<DecoderSet>,
    /// Its submitting threads in all, and those opened before the lane starts.
    threads: usize,
    first: usize,
    /// The share of the large baseline files it takes (0 where it is off), and of the small.
    share: f32,
    small_files_share: f32,
    /// What the lane's description says of it.
    note: String,
}

impl AssistedStart {
    /// Opens the assisted path's first sets for `config`'s files, the engines opening as
    /// `engines_open` (all its sets before the lane when the engines open first, else one: the
    /// others open beside the running lane), given up once `cancel` is raised. The assisted path
    /// is an addition: without it the engines take every image they can.
    fn open(
        recipe: AssistedRecipe,
        config: &GpuLaneConfig,
        engines_open: EnginesOpen,
        cancel: &AtomicBool,
    ) -> AssistedStart {
        let assisting = Instant::now();
        let threads = assisted_threads(config, engines_open);
        let small_files_share = match config.small_files_assisted {
            true => small_files_assisted_share(config.assisted_share),
            false => 0.0,
        };
        let first = match engines_open {
            EnginesOpen::BeforeTheLane => threads,
            _ => 1,
        };
        let opened = match config.assisted_share > 0.0 {
            true => recipe.open(first, cancel),
            false => Err(GpuLaneError::Opening("its share is 0".into())),
        };
        let assisted_opened = assisting.elapsed();
        let (sets, share, note) = match opened {
            Ok(sets) => (
                sets,
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
                    match first == threads {
                        true => format!("its {threads} decoders"),
                        false => format!("the first of its {threads} decoders"),
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
        AssistedStart {
            recipe,
            sets,
            threads,
            first,
            share,
            small_files_share,
            note,
        }
    }
}

/// Starts the lane's threads on `gpu` with the decoder sets opened so far (taken from
/// `assisted`): the preparing threads (and, where the assisted path is on, the coefficient
/// threads its progressive files take, started at the first such file), the submitting
/// threads, and the ring; with the time the start took.
fn start_runner(
    gpu: &Gpu,
    config: &GpuLaneConfig,
    screen: LaneScreen,
    engine_calls: EngineCalls,
    assisted: &mut AssistedStart,
) -> Result<(Runner, Duration), GpuLaneError> {
    let coefficients = (assisted.share > 0.0).then(|| {
        Arc::new(CoefficientThreads::new(
            config.coefficient_threads,
            config.decode_memory.clone(),
        ))
    });
    let preparers = (0..PREPARING_THREADS + config.extra_preparing_threads)
        .map(|_| {
            Preparer::new(
                config.geometry,
                config.stopwatch.clone(),
                coefficients.clone(),
                config.views.clone(),
            )
        })
        .collect();
    let starting = Instant::now();
    let runner = Runner::start(
        gpu,
        std::mem::take(&mut assisted.sets),
        preparers,
        screen,
        shared::Limits {
            stopwatch: config.stopwatch.clone(),
            slots: ring_slots(
                config.batch_size,
                config.requests,
                config.extra_preparing_threads,
            ),
            image_bytes: config.image_bytes(),
            lookahead: lane_lookahead(config.batch_size, config.requests),
            max_file_bytes: config.max_file_bytes,
            queued_calls: [engine_calls.threads, assisted.threads],
            engine_calls,
            assisted_share: assisted.share,
            small_files_assisted_share: assisted.small_files_share,
            assisted_call_pixels: assisted.recipe.call_pixels,
            requests: config.requests,
        },
    )?;
    Ok((runner, starting.elapsed()))
}

/// The assisted path's submitting threads for `config`'s files, the engines opening as
/// `engines`: [`ASSISTED_THREADS`] for large files and a server's requests,
/// [`SMALL_FILES_ASSISTED_THREADS`] for small files, unless the engines open first and the
/// assisted path takes only the few files of 1 Mpx or more among small ones (one then, which
/// holds less memory).
pub(super) fn assisted_threads(config: &GpuLaneConfig, engines: EnginesOpen) -> usize {
    let few_files = !config.large_files && !config.small_files_assisted;
    match (few_files, engines) {
        (true, EnginesOpen::BeforeTheLane) => 1,
        _ if config.large_files || config.requests => ASSISTED_THREADS,
        _ => SMALL_FILES_ASSISTED_THREADS,
    }
}
