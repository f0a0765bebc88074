//! The lane's preparing threads: a range's files read and screened, each image's random draws
//! and resize coefficients computed, and the images cut into calls for the submitting threads,
//! which then only decode, convert and resize. Everything here is host work that does not need
//! the decoders, so it runs beside the calls of the submitting threads instead of between them.

use std::sync::Arc;
use std::time::Instant;

use super::assisted;
use super::call::{
    AssistedInput, Call, CallImage, EngineCalls, ImageOutput, ImageResize, Path, ViewJob,
    MAX_CALL_BYTES,
};
use super::coefficient_threads::{CoefficientThreads, RangeHold};
use super::screen::MAX_COMPRESSED;
use super::shared::{Job, Shared};
use super::work::{Work, CHUNK};
use crate::coefficients::Layout;
use crate::coefficients::{entropy, entropy_batch};
use crate::geometry::{Geometry, Placement};
use crate::profile::{Stage, Stopwatch};
use crate::resample::Resampling;
#[cfg(test)]
use crate::resample::{plan_passes, Filter};
use crate::views::{group_geometry, LaneViews, ViewDraw, RECORD_UNIT};
use turbojpeg_region::CoefficientReader;

/// A preparing thread's state: the geometry the images are planned for (its filter and passes
/// too), and read buffers kept for reuse.
pub(super) struct Preparer {
    geometry: Geometry,
    stopwatch: Arc<Stopwatch>,
    buffers: Vec<Vec<u8>>,
    /// libjpeg-turbo's header reader, for the assisted path's files (made at the first one).
    headers: Option<CoefficientReader>,
    /// The lane's coefficient threads, for progressive files (none without the assisted path).
    coefficients: Option<Arc<CoefficientThreads>>,
    /// A pipeline of views: each image's views planned instead of one output image.
    views: Option<Arc<LaneViews>>,
}

impl Preparer {
    pub fn new(
        geometry: Geometry,
        stopwatch: Arc<Stopwatch>,
        coefficients: Option<Arc<CoefficientThreads>>,
        views: Option<Arc<LaneViews>>,
    ) -> Preparer {
        Preparer {
            geometry,
            stopwatch,
            buffers: Vec::new(),
            headers: None,
            coefficients,
            views,
        }
    }

    /// Reads and plans the range of `job`, handing its calls to the submitting threads as they
    /// fill (colour and gray images in calls of their own: the engines decode a call of one kind
    /// at a time) and publishing the positions the engines will not take (the CPU lane takes
    /// those). A progressive file goes to the coefficient threads as it is read, which queue the
    /// range's call of them once they are all decoded ([`RangeHold`]). Which baseline images
    /// share a call depends on the range's files alone. `handed[k]` is set once the range's
    /// `k`-th position is queued, published or given to the coefficient threads (a panic leaves
    /// the rest to the caller).
    pub fn prepare(&mut self, job: Job, shared: &Arc<Shared>, handed: &mut [bool]) {
        let work = &job.work;
        let mut refused: Vec<(usize, u32)> = Vec::new();
        let mut refused_at: Vec<usize> = Vec::new();
        // The calls being filled: the engines' for colour images and for gray ones, and the
        // assisted path's (both kinds).
        let engines = shared.limits.engine_calls;
        let mut pending = [
            Pending::new(CallCap::Engines(engines)),
            Pending::new(CallCap::Engines(engines.gray())),
            Pending::new(CallCap::Assisted {
                pixels: shared.limits.assisted_call_pixels,
            }),
        ];
        // The coefficient threads take progressive files while the assisted path is open.
        let threads = self.coefficients.clone();
        let pool = match shared.is_open(Path::Assisted) {
            true => threads.as_deref().and_then(CoefficientThreads::pool),
            false => None,
        };
        let progressive = pool.zip(threads.as_deref()).map(|(pool, threads)| {
            let range = RangeHold::new(shared.clone(), work.clone());
            (pool, threads.decode_memory(), range)
        });
        // While the engines are not open (opening beside the lane, or not at all), the assisted
        // path takes every file it can parse, whatever its size; and the gray ones while the
        // engines' gray decoders are being made.
        let engines_open = shared.is_open(Path::Engines);
        let grays_on_engines = shared.grays_on_engines();
        let mut split = AssistedSplit::new(
            shared.limits.assisted_share,
            shared.limits.small_files_assisted_share,
            shared.limits.assisted_call_pixels,
        );
        for (k, (&(position, index), &slot)) in job.positions.iter().zip(&job.slots).enumerate() {
            let reading = Instant::now();
            let image = self.read(work, shared, position, index, slot, progressive.is_some());
            self.stopwatch.add(Stage::GpuPrepare, reading.elapsed());
            let Some(mut image) = image else {
                refused.push((position, slot));
                refused_at.push(k);
                continue;
            };
            if let (false, Some((pool, memory, range))) = (image.screened.engines, &progressive) {
                let buffer = self.buffers.pop().unwrap_or_default();
                range.spawn(pool, memory, image, buffer, &self.stopwatch);
                handed[k] = true;
                continue;
            }
            let engines_take = engines_open && (grays_on_engines || !image.screened.gray);
            if split.path_for(image.pixels(), engines_take) == Path::Assisted {
                let parsing = Instant::now();
                image.assisted = self.parse(&image.bytes);
                self.stopwatch.add(Stage::GpuPrepare, parsing.elapsed());
            }
            // A file the assisted path's parser refuses goes to the engines.
            let kind = match image.assisted {
                Some(_) => &mut pending[2],
                None => &mut pending[usize::from(image.screened.gray)],
            };
            if kind.is_full_for(&image) {
                kind.queue(work, shared, std::mem::take(&mut refused), handed);
                refused_at.drain(..).for_each(|k| handed[k] = true);
            }
            kind.add(k, image);
        }
        for kind in &mut pending {
            if !kind.images.is_empty() {
                kind.queue(work, shared, std::mem::take(&mut refused), handed);
                refused_at.drain(..).for_each(|k| handed[k] = true);
            }
        }
        shared.refuse(work, refused);
        refused_at.drain(..).for_each(|k| handed[k] = true);
    }

    /// `jpeg` parsed for the assisted path, with its layout from libjpeg-turbo's own reading of
    /// its headers (which also settles its colour space); `None` if the path does not take it.
    fn parse(&mut self, jpeg: &[u8]) -> Option<AssistedInput> {
        let parsed = entropy::parse(jpeg).ok()?;
        let reader = match &mut self.headers {
            Some(reader) => reader,
            None => self.headers.insert(CoefficientReader::new().ok()?),
        };
        let layout = Layout::new(reader.open(jpeg).ok()?.header()).ok()?;
        Some(AssistedInput::EntropyCoded(parsed, layout))
    }

    /// The file at source `index` as the lane takes it, read, screened and planned; `None` if
    /// it is unreadable, oversized, for neither the engines nor (with `progressive`, a
    /// progressive file no larger than an assisted call) the coefficient threads, or not
    /// plannable (the CPU lane takes it and reports any problem with it).
    fn read(
        &mut self,
        work: &Work,
        shared: &Shared,
        position: usize,
        index: usize,
        slot: u32,
        progressive: bool,
    ) -> Option<CallImage> {
        let max_bytes = shared.limits.max_file_bytes.min(MAX_COMPRESSED as u64);
        let item = work.lane.source.item(index).open(max_bytes).ok()?;
        if !item.head().starts_with(&[0xFF, 0xD8, 0xFF]) {
            return None;
        }
        if self.buffers.is_empty() {
            shared.take_buffers(&mut self.buffers);
        }
        let buffer = self.buffers.pop().unwrap_or_default();
        let bytes = match item.read(buffer) {
            Ok(bytes) => bytes,
            Err((_, buffer)) => {
                self.buffers.push(buffer);
                return None;
            }
        };
        let screened = shared.screen.take(&bytes).or_else(|| {
            let screened = shared.screen.take_progressive(&bytes)?;
            let pixels = u64::from(screened.info.width) * u64::from(screened.info.height);
            (progressive && pixels <= shared.limits.assisted_call_pixels).then_some(screened)
        });
        let Some(screened) = screened else {
            self.buffers.push(bytes.into_buffer());
            return None;
        };
        let (width, height) = (screened.info.width, screened.info.height);
        if let Some(views) = &self.views {
            // Each view's resize, or the CPU lane's image (which reports any problem with it).
            let Some((jobs, draws)) = plan_views(views, width, height, index, work.lane.epoch)
            else {
                self.buffers.push(bytes.into_buffer());
                return None;
            };
            return Some(CallImage {
                position,
                slot,
                bytes,
                screened,
                output: ImageOutput::Views { jobs, draws },
                assisted: None,
            });
        }
        let geometry = self
            .geometry
            .for_sequence(work.lane.order.seq_len_at(position));
        // An image the output's rule refuses, or the passes cannot take: the CPU lane's, which
        // reports it.
        let planned = geometry
            .placement(width, height, index, work.lane.epoch)
            .ok()
            .and_then(|p| Some((p, geometry.pass_plan(&p.x, &p.y)?.ok()?)));
        let Some((Placement { draw, x, y }, passes)) = planned else {
            self.buffers.push(bytes.into_buffer());
            return None;
        };
        Some(CallImage {
            position,
            slot,
            bytes,
            screened,
            output: ImageOutput::Image(Box::new(ImageResize { draw, x, y, passes })),
            assisted: None,
        })
    }
}

/// The views `lane` draws for source image `index` (`width` x `height`) in `epoch`, each
/// planned as the CPU lane cuts it (its group's `RandomResizedCrop` of the drawn box, then the
/// flip), placed at its offset in the image's record; `None` where a view cannot be planned
/// (a group the GPU's resize cannot take, an offset past the kernels' range).
fn plan_views(
    lane: &LaneViews,
    width: u32,
    height: u32,
    index: usize,
    epoch: u64,
) -> Option<(Vec<ViewJob>, Vec<ViewDraw>)> {
    let views = &*lane.views;
    let draws = views.draw_all(width, height, index, epoch);
    let mut jobs = Vec::with_capacity(draws.len());
    for (draw, (_, _, offset)) in draws.iter().zip(lane.layout.record_views()) {
        let group = views.groups.get(draw.group)?;
        let geometry = group_geometry(group, views.pillow_version);
        let Resampling::Filter(filter) = geometry.resampling() else {
            return None;
        };
        let (x, y) = geometry.axis_plans(width, height, Some(&draw.crop));
        let passes = geometry.pass_plan(&x, &y)?.ok()?;
        jobs.push(ViewJob {
            x,
            y,
            passes,
            filter,
            order: geometry.pass_order,
            flip: draw.crop.flipped,
            size: group.size,
            offset_units: u32::try_from(offset / RECORD_UNIT).ok()?,
        });
    }
    (!jobs.is_empty() && jobs.len() == draws.len()).then_some((jobs, draws))
}

/// Images of at least this many pixels take the assisted path at its share; of smaller ones it
/// takes [`SMALL_FILES_ASSISTED_SHARE`] (unless a share below 1 is given between the lanes).
pub(super) const ASSISTED_MIN_PIXELS: u64 = 1 << 20;

/// Of the images under [`ASSISTED_MIN_PIXELS`] the engines would take, the share the assisted
/// path takes beside them (at most its share of large ones). Measured on the H200 machine, the
/// GPU lane alone (`--gpu-share 1`) on 8,192 ImageNet-sized files, in turn on one start (the
/// lanes' lookahead at 1,024 positions, which changed nothing for the GPU lane alone): the
/// engines alone 28,200-29,100 images/s; the assisted path beside them with a share of 0.4
/// 32,800-33,000, 0.5 34,800-35,100, 0.6 36,100-36,400, 0.75 36,000-36,900, 0.9 36,100-36,900,
/// all of them 35,800-36,800. From 0.75 on it is the same; the engines keep the rest.
pub(super) const SMALL_FILES_ASSISTED_SHARE: f32 = 0.75;

/// Of the images under [`ASSISTED_MIN_PIXELS`], the share the assisted path takes where it
/// takes `share` of the larger ones.
pub(super) fn small_files_assisted_share(share: f32) -> f32 {
    share.min(SMALL_FILES_ASSISTED_SHARE)
}

/// Which path each image of a range takes: of the images the assisted path may take (no
/// larger than its call), a share, counted from the range's start for large and small images
/// apart, so the split depends on the range's files alone (an image its parser then refuses
/// goes to the engines). While the engines do not take an image (they are not open, or a gray
/// image's decoders are not made), the assisted path takes it (with a share above 0). An image
/// larger than an assisted call holds is the engines'.
struct AssistedSplit {
    max_pixels: u64,
    large: Counted,
    small: Counted,
}

/// One in every `1 / share` of the images counted.
struct Counted {
    share: f32,
    seen: u32,
}

impl Counted {
    /// Whether the next image counted is one of the share.
    fn next(&mut self) -> bool {
        let before = (self.seen as f32 * self.share).floor();
        self.seen += 1;
        (self.seen as f32 * self.share).floor() > before
    }
}

impl AssistedSplit {
    /// A split giving the assisted path `share` of the images of [`ASSISTED_MIN_PIXELS`] or
    /// more and `small_share` of the smaller ones, none larger than `max_pixels`.
    fn new(share: f32, small_share: f32, max_pixels: u64) -> AssistedSplit {
        AssistedSplit {
            max_pixels,
            large: Counted { share, seen: 0 },
            small: Counted {
                share: small_share,
                seen: 0,
            },
        }
    }

    /// The path of the range's next image of `pixels` pixels, `engines_take` saying whether
    /// the engines take its calls.
    fn path_for(&mut self, pixels: u64, engines_take: bool) -> Path {
        if self.large.share <= 0.0 || pixels > self.max_pixels {
            return Path::Engines;
        }
        if !engines_take {
            return Path::Assisted;
        }
        let counted = match pixels < ASSISTED_MIN_PIXELS {
            true => &mut self.small,
            false => &mut self.large,
        };
        match counted.next() {
            true => Path::Assisted,
            false => Path::Engines,
        }
    }
}

/// What closes a path's call.
#[derive(Debug, Clone, Copy)]
enum CallCap {
    /// The engines': images, decoded planes and compressed bytes ([`EngineCalls`]).
    Engines(EngineCalls),
    /// The assisted path's: [`CHUNK`] images, the pixels its decoders' buffers hold,
    /// [`MAX_CALL_BYTES`] compressed bytes and the bytes it stages ([`assisted::staging_bytes`]).
    Assisted { pixels: u64 },
}

impl CallCap {
    /// The most images a call takes.
    fn images(self) -> usize {
        match self {
            CallCap::Engines(calls) => calls.images,
            CallCap::Assisted { .. } => CHUNK,
        }
    }
}

/// A call being filled: its images (with their places in the range), pixels, decoded planes,
/// compressed bytes and the bytes an assisted call stages (compressed or packed), and what
/// closes it.
struct Pending {
    cap: CallCap,
    images: Vec<CallImage>,
    places: Vec<usize>,
    pixels: u64,
    planes: u64,
    bytes: u64,
    staged: u64,
}

impl Pending {
    fn new(cap: CallCap) -> Pending {
        Pending {
            cap,
            images: Vec::new(),
            places: Vec::new(),
            pixels: 0,
            planes: 0,
            bytes: 0,
            staged: 0,
        }
    }

    fn path(&self) -> Path {
        match self.cap {
            CallCap::Engines(_) => Path::Engines,
            CallCap::Assisted { .. } => Path::Assisted,
        }
    }

    /// Whether `image` would take the call past its path's cap (an empty call takes any image).
    fn is_full_for(&self, image: &CallImage) -> bool {
        let bytes = self.bytes + image.bytes.len() as u64;
        !self.images.is_empty()
            && (self.images.len() == self.cap.images()
                || match self.cap {
                    CallCap::Engines(calls) => {
                        self.planes + image.plane_bytes() > calls.plane_bytes
                            || bytes > calls.compressed_bytes
                    }
                    CallCap::Assisted { pixels } => {
                        self.pixels + image.pixels() > pixels
                            || bytes > MAX_CALL_BYTES as u64
                            || self.staged + staged_bytes(image) > assisted::staging_bytes(pixels)
                    }
                })
    }

    fn add(&mut self, place: usize, image: CallImage) {
        self.pixels += image.pixels();
        self.planes += image.plane_bytes();
        self.bytes += image.bytes.len() as u64;
        self.staged += staged_bytes(&image);
        self.places.push(place);
        self.images.push(image);
    }

    /// Queues the call (with `refused`, positions to publish) and starts a new one. An engines'
    /// call has its largest images first: the engines take a call's images in turn, and one
    /// begun last would decode alone.
    fn queue(
        &mut self,
        work: &Arc<Work>,
        shared: &Shared,
        refused: Vec<(usize, u32)>,
        handed: &mut [bool],
    ) {
        let mut images = std::mem::take(&mut self.images);
        if self.path() == Path::Engines {
            largest_first(&mut images);
        }
        let call = Call {
            work: work.clone(),
            images,
            path: self.path(),
        };
        shared.queue_call(call, refused);
        self.places.drain(..).for_each(|k| handed[k] = true);
        (self.pixels, self.planes, self.bytes, self.staged) = (0, 0, 0, 0);
    }
}

/// An engines' call's images, the largest first (the order of equal ones kept).
fn largest_first(images: &mut [CallImage]) {
    images.sort_by_key(|image| std::cmp::Reverse(image.pixels()));
}

/// Queues `images` (assisted, in any order) in calls of the assisted path as [`Pending`] cuts
/// them, the first with `refused` (positions to publish).
pub(super) fn queue_assisted(
    shared: &Shared,
    work: &Arc<Work>,
    images: Vec<CallImage>,
    mut refused: Vec<(usize, u32)>,
) {
    let mut handed = vec![false; images.len()];
    let mut call = Pending::new(CallCap::Assisted {
        pixels: shared.limits.assisted_call_pixels,
    });
    for (k, image) in images.into_iter().enumerate() {
        if call.is_full_for(&image) {
            call.queue(work, shared, std::mem::take(&mut refused), &mut handed);
        }
        call.add(k, image);
    }
    match call.images.is_empty() {
        true => shared.refuse(work, refused),
        false => call.queue(work, shared, refused, &mut handed),
    }
}

/// Bytes `image` stages in an assisted call: its packed coefficients, or its tables and
/// entropy-coded data (its file's size where it was not parsed).
fn staged_bytes(image: &CallImage) -> u64 {
    match &image.assisted {
        Some(AssistedInput::Packed(_, bytes)) => bytes.len() as u64,
        Some(AssistedInput::EntropyCoded(parsed, _)) => entropy_batch::staged_len(parsed) as u64,
        None => image.bytes.len() as u64,
    }
}

#[cfg(test)]
mod tests {
    use super::super::call::{LARGE_FILES_CALL_IMAGES, MAX_CALL_PIXELS};
    use super::super::nvjpeg::{JpegInfo, Subsampling};
    use super::super::screen::Screened;
    use super::*;
    use crate::options::ResizeOptions;
    use crate::source::ItemBytes;

    /// The split of `share` of large images, and of small ones as far as their own share goes.
    fn assisted_split(share: f32) -> AssistedSplit {
        AssistedSplit::new(share, small_files_assisted_share(share), MAX_CALL_PIXELS)
    }

    /// The images of a range, large and small, through a split of `share`: which take the
    /// assisted path.
    fn split(share: f32, pixels: &[u64]) -> Vec<bool> {
        let mut split = assisted_split(share);
        pixels
            .iter()
            .map(|&p| split.path_for(p, true) == Path::Assisted)
            .collect()
    }

    /// A baseline file of `width` x `height` pixels and `bytes` bytes as a preparing thread
    /// hands it on.
    fn image(width: u32, height: u32, subsampling: Subsampling, bytes: usize) -> CallImage {
        let geometry = Geometry::new(&ResizeOptions::default());
        let (x, y) = geometry.axis_plans(width, height, None);
        let passes = plan_passes(&x, &y, Filter::Bilinear, geometry.pass_order).expect("plan");
        let gray = subsampling == Subsampling::Gray;
        let info = JpegInfo {
            width,
            height,
            components: if gray { 1 } else { 3 },
            subsampling,
            compressed_bytes: bytes,
            gray_factors_at: None,
            exif: false,
        };
        CallImage {
            position: 0,
            slot: 0,
            bytes: ItemBytes::Owned(vec![0; bytes]),
            screened: Screened {
                info,
                gray,
                engines: true,
            },
            output: ImageOutput::Image(Box::new(ImageResize {
                draw: None,
                x,
                y,
                passes,
            })),
            assisted: None,
        }
    }

    /// How many of `images` one call takes under `cap`.
    fn first_call(cap: CallCap, images: impl IntoIterator<Item = CallImage>) -> usize {
        let mut call = Pending::new(cap);
        for (k, image) in images.into_iter().enumerate() {
            if call.is_full_for(&image) {
                return k;
            }
            call.add(k, image);
        }
        call.images.len()
    }

    #[test]
    fn the_engines_calls_of_large_photos_hold_their_planes_budget_largest_first() {
        let large = CallCap::Engines(EngineCalls::for_files(true));
        let small = CallCap::Engines(EngineCalls::for_files(false));
        let gray = CallCap::Engines(EngineCalls::for_files(true).gray());
        // 12 Mpx of 4:2:0 is 18 MiB of planes: 42 in 768 MiB, 10 in 192 MiB; 4:4:4 twice
        // that; gray calls 64 Mpx of one plane; 128 MiB of 3 MiB files; 64 small photos at
        // most, 32 of small files.
        let cases = [
            (large, (4096, 3072), Subsampling::S420, 1 << 20, 42),
            (large, (4096, 3072), Subsampling::S444, 1 << 20, 21),
            (small, (4096, 3072), Subsampling::S420, 1 << 20, 10),
            (gray, (4096, 3072), Subsampling::Gray, 1 << 20, 5),
            (large, (2048, 1536), Subsampling::S420, 3 << 20, 42),
            (
                large,
                (500, 375),
                Subsampling::S420,
                100 << 10,
                LARGE_FILES_CALL_IMAGES,
            ),
            (small, (500, 375), Subsampling::S420, 100 << 10, CHUNK),
        ];
        for (cap, (w, h), sampling, bytes, taken) in cases {
            let photos = (0..256).map(|_| image(w, h, sampling, bytes));
            assert_eq!(first_call(cap, photos), taken, "{w}x{h} {sampling:?}");
        }
        // The largest images first, equal ones in the order they came.
        let mut call: Vec<CallImage> = [(1000, 800), (4000, 3000), (1000, 800), (3000, 2000)]
            .into_iter()
            .enumerate()
            .map(|(k, (w, h))| CallImage {
                position: k,
                ..image(w, h, Subsampling::S420, 1000)
            })
            .collect();
        largest_first(&mut call);
        let order: Vec<usize> = call.iter().map(|image| image.position).collect();
        assert_eq!(order, [1, 3, 0, 2]);
    }

    #[test]
    fn the_assisted_share_counts_large_and_small_images_apart_and_is_the_same_every_time() {
        let large = ASSISTED_MIN_PIXELS;
        let pixels: Vec<u64> = (0..100u64)
            .flat_map(|i| [large + i * 1000, large - 1 - i])
            .collect();
        for share in [0.0, 0.25, 0.35, 0.5, 0.75, 1.0] {
            let taken = split(share, &pixels);
            assert_eq!(taken, split(share, &pixels), "share {share}");
            // Of the 100 large ones, the share; of the 100 small ones, the share up to the
            // small files' own.
            let count = |from: usize| taken.iter().skip(from).step_by(2).filter(|&&t| t).count();
            assert_eq!(count(0), (100.0 * share) as usize, "share {share}");
            let small = small_files_assisted_share(share);
            assert_eq!(count(1), (100.0 * small) as usize, "share {share}");
        }
        // Spread through the range, not bunched at one end.
        let taken = split(0.5, &pixels);
        let first_half = taken[..100].iter().filter(|&&t| t).count();
        assert_eq!(first_half, 50);
        // The small images the assisted path does not take are the engines'; all of them
        // without a share for small ones.
        let small_only = vec![640 * 480; 8];
        let paths = split(1.0, &small_only);
        assert_eq!(paths, [false, true, true, true, false, true, true, true]);
        let mut engines_only = AssistedSplit::new(1.0, 0.0, MAX_CALL_PIXELS);
        for &pixels in &small_only {
            assert_eq!(engines_only.path_for(pixels, true), Path::Engines);
        }
        assert_eq!(engines_only.path_for(large, true), Path::Assisted);
    }

    #[test]
    fn without_the_engines_the_assisted_path_takes_every_image_unless_its_share_is_0() {
        for share in [0.25, 0.5, 1.0] {
            let mut split = assisted_split(share);
            for pixels in [1, 640 * 480, ASSISTED_MIN_PIXELS, 12 << 20] {
                assert_eq!(split.path_for(pixels, false), Path::Assisted, "{share}");
            }
            // The engines' opening does not move the split that follows.
            let mut fresh = assisted_split(share);
            let after: Vec<Path> = (0..8).map(|_| split.path_for(4 << 20, true)).collect();
            let from_start: Vec<Path> = (0..8).map(|_| fresh.path_for(4 << 20, true)).collect();
            assert_eq!(after, from_start, "{share}");
        }
        let mut off = AssistedSplit::new(0.0, 0.0, MAX_CALL_PIXELS);
        assert_eq!(off.path_for(4 << 20, false), Path::Engines);
        // An image larger than an assisted call is the engines', open or not.
        let mut small_calls = AssistedSplit::new(1.0, 0.75, 16 << 20);
        assert_eq!(small_calls.path_for(20 << 20, true), Path::Engines);
        assert_eq!(small_calls.path_for(20 << 20, false), Path::Engines);
        assert_eq!(small_calls.path_for(16 << 20, false), Path::Assisted);
    }
}
