//! The CPU rendition of views: one image decoded once, whole, then each view cut from the same
//! pixels with its own box, resized with Pillow's resampling from the planner's integer plan,
//! flipped, and given its colour calls ([`crate::views::apply_view_ops`]). In a pipeline the
//! lane's threads write each view straight into its place of the batch's staging
//! ([`crate::views::ViewLayout`]).

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use rayon::prelude::*;

use super::decode::{decode, DecodeWindow, Decoded};
use super::prepare::{ImageTask, Made};
use super::probe::probe;
use super::resize::resize_into_slot;
use super::stage::{BatchRequest, CpuLane, Filled, LaneCore, Staging};
use crate::error::{panic_message, Error, ItemError, ItemErrorKind, Result};
use crate::memory::BufferPool;
use crate::options::DecodeOptions;
use crate::profile::Stage;
use crate::resample::{ImagePlan, Kernels};
use crate::source::Source;
use crate::views::{
    apply_view_ops, group_geometry, LaneViews, ViewColour, ViewDraw, ViewGroup, Views,
};

/// One view of an image: what it drew and its pixels, `size` x `size` packed RGB8.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct ViewImage {
    /// What the view drew.
    pub draw: ViewDraw,
    /// Its pixels, `draw.size` x `draw.size` x 3, rows first.
    pub pixels: Vec<u8>,
}

/// Scratch reused from view to view: the resize's plan, its 8-bit intermediate and the CPU's
/// resampling passes.
struct ViewScratch {
    plan: ImagePlan,
    intermediate: Vec<u8>,
    kernels: Kernels,
}

impl ViewScratch {
    fn new(kernels: Kernels) -> ViewScratch {
        ViewScratch {
            plan: ImagePlan::default(),
            intermediate: Vec::new(),
            kernels,
        }
    }
}

thread_local! {
    static VIEW_SCRATCH: RefCell<ViewScratch> = RefCell::new(ViewScratch::new(Kernels::detect()));
}

/// The group of `draw`, as the image's error when `views` has none such.
fn group_of<'v>(
    views: &'v Views,
    draw: &ViewDraw,
) -> std::result::Result<&'v ViewGroup, ItemErrorKind> {
    views
        .groups
        .get(draw.group)
        .ok_or_else(|| ItemErrorKind::Resize(format!("no view group {}", draw.group)))
}

/// One view of `views` cut from the decoded `pixels` into `out` (`size * size * 3` bytes), its
/// colour calls applied where `colour` says the CPU applies them.
fn cut_view_into(
    (pixels, decoded): (&[u8], Decoded),
    views: &Views,
    draw: &ViewDraw,
    colour: ViewColour,
    scratch: &mut ViewScratch,
    out: &mut [u8],
) -> std::result::Result<(), ItemErrorKind> {
    let group = group_of(views, draw)?;
    let geometry = group_geometry(group, views.pillow_version);
    let (x, y) = geometry.axis_plans(
        decoded.source_width,
        decoded.source_height,
        Some(&draw.crop),
    );
    geometry
        .plan_axes(&x, &y, 1, decoded.width, decoded.height, &mut scratch.plan)
        .map_err(|e| ItemErrorKind::Resize(e.to_string()))?;
    let size = group.size as usize;
    if out.len() != size * size * 3 {
        return Err(ItemErrorKind::Resize(format!(
            "a view of {size}x{size} does not fit {} bytes",
            out.len()
        )));
    }
    resize_into_slot(
        pixels,
        decoded,
        (group.size, group.size, 0),
        &scratch.plan,
        draw.crop.flipped,
        (scratch.kernels, 1),
        &mut scratch.intermediate,
        out,
    )?;
    if colour == ViewColour::Cpu {
        apply_view_ops(&draw.ops, out, size, size)
            .map_err(|e| ItemErrorKind::Resize(e.to_string()))?;
    }
    Ok(())
}

/// One view of `views` cut from the decoded `pixels`, finished.
fn cut_view(
    pixels: &[u8],
    decoded: Decoded,
    views: &Views,
    draw: ViewDraw,
    kernels: Kernels,
) -> std::result::Result<ViewImage, ItemErrorKind> {
    let size = group_of(views, &draw)?.size as usize;
    let mut out = vec![0u8; size * size * 3];
    let mut scratch = ViewScratch::new(kernels);
    cut_view_into(
        (pixels, decoded),
        views,
        &draw,
        ViewColour::Cpu,
        &mut scratch,
        &mut out,
    )?;
    Ok(ViewImage { draw, pixels: out })
}

/// Decodes `bytes` once, whole, and cuts every view of `views` from it.
fn render_unguarded(
    bytes: &[u8],
    decode_options: &DecodeOptions,
    views: &Views,
    index: usize,
    epoch: u64,
) -> std::result::Result<Vec<ViewImage>, ItemErrorKind> {
    let header = probe(bytes, decode_options)?;
    let pool = BufferPool::new(0);
    let whole = |_: u32, _: u32| DecodeWindow {
        reduction: 1,
        region: None,
    };
    let mut pixels = Vec::new();
    let decoded = decode(
        bytes,
        decode_options,
        &whole,
        &mut pixels,
        &pool,
        header.bytes_in_flight,
    )?;
    let draws = views.draw_all(decoded.source_width, decoded.source_height, index, epoch);
    let kernels = Kernels::detect();
    draws
        .into_par_iter()
        .map(|draw| cut_view(&pixels, decoded, views, draw, kernels))
        .collect()
}

/// Every view of `views` of one encoded image (source index `index`, `epoch`): the image
/// decoded once (whole, as a PIL image is), each view cut from it with its own draws, in view
/// order. Exactly what torchvision's transforms give on the same image loaded with Pillow
/// (see `docs/views.md` for the one exception, the blur's float32 sums). A bad image is
/// [`Error::Item`] with the id `"<memory>"`.
///
/// ```
/// use gpufeed::views::Views;
/// let bytes = std::fs::read("assets/rocket.jpg")?;
/// let views = gpufeed::cpu::render_views(&bytes, &Default::default(), &Views::dinov2(), 0, 0)?;
/// assert_eq!(views.len(), 10);
/// assert_eq!(views[9].pixels.len(), 96 * 96 * 3);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn render_views(
    bytes: &[u8],
    decode_options: &DecodeOptions,
    views: &Views,
    index: usize,
    epoch: u64,
) -> Result<Vec<ViewImage>> {
    views.validate()?;
    let item_error = |kind| {
        Error::Item(ItemError {
            id: "<memory>".into(),
            index,
            kind,
        })
    };
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        render_unguarded(bytes, decode_options, views, index, epoch)
    }))
    .unwrap_or_else(|panic| Err(ItemErrorKind::DecoderPanic(panic_message(panic.as_ref()))))
    .map_err(item_error)
}

/// What became of one image's views: their draws, or why the image failed; `None` if it was not
/// tried because the lane was stopped.
type ViewsOutcome = Option<std::result::Result<Vec<ViewDraw>, ItemErrorKind>>;

/// Reads image `task` of `source`, decodes it once, whole, and cuts its views into `dsts` (one
/// destination per view, in view order), on this thread. A panic inside a decoder becomes the
/// image's error.
fn prepare_views(
    source: &Source,
    task: ImageTask,
    core: &LaneCore,
    lane: &LaneViews,
    dsts: &mut [&mut [u8]],
) -> std::result::Result<Vec<ViewDraw>, ItemErrorKind> {
    let (decode_options, pool) = (&core.options.decode, &core.buffers);
    let reading = Instant::now();
    let item = source
        .item(task.index)
        .open(decode_options.max_file_bytes)?;
    let header = probe(&item, decode_options)?;
    let reservation = core.budget.reserve(header.bytes_in_flight);
    let buffer = pool.take(item.len() as usize);
    let lent = buffer.capacity();
    let read = item.read(buffer);
    core.stopwatch.add(Stage::CpuRead, reading.elapsed());
    let made = match read {
        Ok(bytes) => {
            let size_hint = header.width.saturating_mul(header.height).saturating_mul(3);
            let made = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                let mut pixels = pool.take(size_hint as usize);
                let lent = pixels.capacity();
                let made = cut_all(
                    &bytes,
                    core,
                    lane,
                    task,
                    header.bytes_in_flight,
                    &mut pixels,
                    dsts,
                );
                pool.give(pixels, lent);
                made
            }))
            .unwrap_or_else(|panic| {
                let _ = VIEW_SCRATCH.try_with(|s| {
                    if let Ok(mut s) = s.try_borrow_mut() {
                        *s = ViewScratch::new(Kernels::detect());
                    }
                });
                Err(ItemErrorKind::DecoderPanic(panic_message(panic.as_ref())))
            });
            pool.give(bytes.into_buffer(), lent);
            made
        }
        Err((e, buffer)) => {
            pool.give(buffer, lent);
            Err(e)
        }
    };
    drop(reservation);
    made
}

/// Reads image `task` of `source`, decodes it once, whole, and writes its views into `record`
/// (laid out as `lane.layout`'s records), on this thread: what a lane working ahead of the
/// batches makes of an image in a pipeline of views.
pub(crate) fn prepare_record(
    source: &Source,
    task: ImageTask,
    core: &LaneCore,
    lane: &LaneViews,
    record: &mut [u8],
) -> std::result::Result<Made, ItemErrorKind> {
    let bytes = lane.layout.record_bytes;
    let Some(record) = record.get_mut(..bytes) else {
        return Err(ItemErrorKind::Resize(format!(
            "a record of {bytes} bytes of views in a buffer of {}",
            record.len()
        )));
    };
    let mut dsts = lane.layout.split_record(record);
    let draws = prepare_views(source, task, core, lane, &mut dsts)?;
    Ok(Made {
        draw: None,
        bytes,
        views: Some(draws),
    })
}

/// Decodes `bytes` whole into `pixels` and cuts every view into `dsts`.
fn cut_all(
    bytes: &[u8],
    core: &LaneCore,
    lane: &LaneViews,
    task: ImageTask,
    reserved: u64,
    pixels: &mut Vec<u8>,
    dsts: &mut [&mut [u8]],
) -> std::result::Result<Vec<ViewDraw>, ItemErrorKind> {
    let whole = |_: u32, _: u32| DecodeWindow {
        reduction: 1,
        region: None,
    };
    let decoded = core.stopwatch.time(Stage::CpuDecode, || {
        decode(
            bytes,
            &core.options.decode,
            &whole,
            pixels,
            &core.buffers,
            reserved,
        )
    })?;
    let views = &*lane.views;
    let draws = views.draw_all(
        decoded.source_width,
        decoded.source_height,
        task.index,
        task.epoch,
    );
    if draws.len() != dsts.len() {
        return Err(ItemErrorKind::Resize(format!(
            "{} views drawn for {} places",
            draws.len(),
            dsts.len()
        )));
    }
    core.stopwatch.time(Stage::CpuResize, || {
        VIEW_SCRATCH.with(|scratch| {
            let scratch = &mut *scratch.borrow_mut();
            for (draw, out) in draws.iter().zip(dsts.iter_mut()) {
                cut_view_into((pixels, decoded), views, draw, lane.colour, scratch, out)?;
            }
            Ok(())
        })
    })?;
    Ok(draws)
}

impl CpuLane {
    /// [`CpuLane::fill`] for a pipeline of views: up to `batch_size` good images from the
    /// request's positions, each decoded once and its views written into their places of
    /// `staging` (laid out as `lane` says), failed images' places closed up.
    pub(crate) fn fill_views(
        &self,
        lane: &LaneViews,
        staging: &mut Staging<'_>,
        request: &BatchRequest<'_>,
        source: &Source,
        stop: &AtomicBool,
    ) -> Result<Option<Filled>> {
        let mut filled = Filled::default();
        let BatchRequest {
            order,
            start,
            epoch,
            batch_size,
            positions,
            on_error,
        } = *request;
        if batch_size > lane.layout.batch {
            return Err(Error::Worker(format!(
                "a batch of {batch_size} images in staging for {}",
                lane.layout.batch
            )));
        }
        let reach = order.reach(start).min(positions);
        let mut good = 0;
        while good < batch_size && filled.consumed < reach {
            let take = (batch_size - good).min(reach - filled.consumed);
            let first_position = start + filled.consumed;
            let chunk: Vec<ImageTask> = (first_position..first_position + take)
                .map_while(|p| {
                    order.get(p).map(|index| ImageTask {
                        index,
                        epoch,
                        seq_len: 0,
                    })
                })
                .collect();
            if chunk.is_empty() {
                break;
            }
            let places = lane.layout.split(staging.pixels, good, chunk.len());
            let core = &*self.core;
            let outcomes: Vec<ViewsOutcome> = self.pool.install(|| {
                places
                    .into_par_iter()
                    .zip(chunk.par_iter())
                    .map(|(mut dsts, &task)| {
                        (!stop.load(Ordering::Relaxed))
                            .then(|| prepare_views(source, task, core, lane, &mut dsts))
                    })
                    .collect()
            });
            let first = good;
            for (k, outcome) in outcomes.into_iter().enumerate() {
                let Some(outcome) = outcome else {
                    return Ok(None);
                };
                let padding = order.is_padding(first_position + k);
                let (outcome, draws) = match outcome {
                    Ok(draws) => (Ok(None), Some(draws)),
                    Err(e) => (Err(e), None),
                };
                if filled.record(chunk[k].index, padding, outcome, source, on_error)? {
                    if first + k != good {
                        lane.layout.move_image(staging.pixels, first + k, good);
                    }
                    filled.view_draws.push(draws.unwrap_or_default());
                    good += 1;
                }
            }
            filled.consumed += chunk.len();
        }
        Ok(Some(filled))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::geometry::Geometry;
    use crate::options::{DrawRange, Interpolation, ResizeMode, ResizeOptions};
    use crate::views::ViewOps;
    use std::sync::Arc;

    fn rocket() -> Vec<u8> {
        std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/assets/rocket.jpg")).expect("rocket")
    }

    #[test]
    fn a_bad_image_is_an_item_error_not_a_panic() {
        for bytes in [&b""[..], b"not an image", &rocket()[..300]] {
            match render_views(bytes, &DecodeOptions::default(), &Views::dinov2(), 3, 0) {
                Err(Error::Item(e)) => assert_eq!((e.id.as_str(), e.index), ("<memory>", 3)),
                other => panic!("{:?}", other.map(|v| v.len())),
            }
        }
        let mut bad = Views::dinov2();
        bad.groups[0].count = 0;
        assert!(render_views(&rocket(), &DecodeOptions::default(), &bad, 0, 0).is_err());
    }

    #[test]
    fn a_lane_working_ahead_writes_each_image_s_views_as_one_record() {
        let views = Arc::new(Views::dinov2().seed(4));
        let lane = Arc::new(LaneViews {
            layout: crate::views::ViewLayout::new(&views, 2),
            views: views.clone(),
            colour: ViewColour::Cpu,
        });
        let geometry = Geometry::new(&ResizeOptions::default());
        let core = LaneCore::new(&DecodeOptions::default(), geometry, Arc::default())
            .with_views(Some(lane.clone()));
        assert_eq!(core.output_bytes(), lane.layout.record_bytes);
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/assets/rocket.jpg");
        let source = Source::paths(vec![std::path::PathBuf::from(path)]);
        let task = ImageTask {
            index: 0,
            epoch: 1,
            seq_len: 0,
        };
        let mut record = vec![7u8; core.output_bytes()];
        let made = core.prepare(&source, task, &mut record).expect("record");
        let want = render_views(&rocket(), &DecodeOptions::default(), &views, 0, 1).expect("views");
        assert_eq!(made.bytes, lane.layout.record_bytes);
        let draws: Vec<ViewDraw> = want.iter().map(|v| v.draw.clone()).collect();
        assert_eq!(made.views.as_deref(), Some(&draws[..]));
        for (view, (_, _, offset)) in want.iter().zip(lane.layout.record_views()) {
            let got = &record[offset..offset + view.pixels.len()];
            assert!(got == &view.pixels[..], "view {}", view.draw.view);
        }
        // Too small a buffer is the image's error.
        assert!(core.prepare(&source, task, &mut [0u8; 16]).is_err());
    }

    #[test]
    fn views_left_to_the_device_are_cut_alone_and_the_colour_calls_finish_them() {
        let bytes = rocket();
        let views = Views::dinov2().seed(3);
        let finished =
            render_views(&bytes, &DecodeOptions::default(), &views, 2, 1).expect("views");
        let mut pixels = Vec::new();
        let whole = |_: u32, _: u32| DecodeWindow {
            reduction: 1,
            region: None,
        };
        let decoded = decode(
            &bytes,
            &DecodeOptions::default(),
            &whole,
            &mut pixels,
            &BufferPool::new(0),
            1 << 30,
        )
        .expect("decode");
        let mut scratch = ViewScratch::new(Kernels::detect());
        let mut coloured = 0;
        for view in &finished {
            let size = view.draw.size as usize;
            let mut cut = vec![0u8; size * size * 3];
            let colour = ViewColour::Device;
            cut_view_into(
                (&pixels, decoded),
                &views,
                &view.draw,
                colour,
                &mut scratch,
                &mut cut,
            )
            .expect("cut");
            coloured += usize::from(cut != view.pixels);
            apply_view_ops(&view.draw.ops, &mut cut, size, size).expect("ops");
            assert_eq!(cut, view.pixels, "view {}", view.draw.view);
        }
        assert!(coloured > 0, "some view has colour calls");
    }

    #[test]
    fn a_view_of_the_whole_image_is_the_plain_resize() {
        // Scale 1 and the image's own ratio: the box is the whole image, as a stretch resize.
        let bytes = rocket();
        let group = ViewGroup {
            size: 64,
            scale: DrawRange::new(1.0, 1.0),
            ratio: DrawRange::new(640.0 / 427.0, 640.0 / 427.0),
            interpolation: Interpolation::Bicubic,
            count: 2,
            ops: ViewOps::none(),
        };
        let views = render_views(
            &bytes,
            &DecodeOptions::default(),
            &Views::new(vec![group]),
            0,
            0,
        )
        .expect("views");
        let resize = ResizeOptions::default()
            .mode(ResizeMode::stretch(64, 64))
            .interpolation(Interpolation::Bicubic);
        let mut want = vec![0u8; 64 * 64 * 3];
        crate::cpu::prepare_image(&bytes, &DecodeOptions::default(), &resize, &mut want)
            .expect("resize");
        for v in &views {
            assert_eq!((v.draw.crop.top, v.draw.crop.left), (0, 0), "{:?}", v.draw);
            assert_eq!(v.pixels, want);
        }
    }
}
