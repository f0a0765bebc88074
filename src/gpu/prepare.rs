//! The lane's preparing threads: a range's files read and screened, each image's random draws
//! and resize coefficients computed, and the images cut into calls for the submitting threads,
//! which then only decode, convert and resize. Everything here is host work that does not need
//! the decoders, so it runs beside the calls of the submitting threads instead of between them.

use std::sync::Arc;
use std::time::Instant;

use super::call::{Call, CallImage, MAX_CALL_BYTES, MAX_CALL_PIXELS};
use super::screen::MAX_COMPRESSED;
use super::shared::{Job, Shared};
use super::work::{Work, CHUNK};
use crate::geometry::Geometry;
use crate::profile::{Stage, Stopwatch};
use crate::resample::{plan_passes, Filter};

/// A preparing thread's state: the geometry and filter the images are planned for, and read
/// buffers kept for reuse.
pub(super) struct Preparer {
    geometry: Geometry,
    filter: Filter,
    stopwatch: Arc<Stopwatch>,
    buffers: Vec<Vec<u8>>,
}

impl Preparer {
    pub fn new(geometry: Geometry, filter: Filter, stopwatch: Arc<Stopwatch>) -> Preparer {
        Preparer {
            geometry,
            filter,
            stopwatch,
            buffers: Vec::new(),
        }
    }

    /// Reads and plans the range of `job`, handing its calls to the submitting threads as they
    /// fill (colour and gray images in calls of their own: the engines decode a call of one kind
    /// at a time) and publishing the positions the engines will not take (the CPU lane takes
    /// those). Which images share a call depends on the range's files alone. `handed[k]` is set
    /// once the range's `k`-th position is queued or published (a panic leaves the rest to the
    /// caller).
    pub fn prepare(&mut self, job: Job, shared: &Shared, handed: &mut [bool]) {
        let work = job.work;
        let mut refused: Vec<(usize, u32)> = Vec::new();
        let mut refused_at: Vec<usize> = Vec::new();
        // The call being filled for colour images, and for gray ones.
        let mut pending = [Pending::default(), Pending::default()];
        for (k, (&(position, index), &slot)) in job.positions.iter().zip(&job.slots).enumerate() {
            let reading = Instant::now();
            let image = self.read(&work, shared, position, index, slot);
            self.stopwatch.add(Stage::GpuPrepare, reading.elapsed());
            let Some(image) = image else {
                refused.push((position, slot));
                refused_at.push(k);
                continue;
            };
            let kind = &mut pending[usize::from(image.screened.gray)];
            if kind.is_full_for(&image) {
                kind.queue(&work, shared, std::mem::take(&mut refused), handed);
                refused_at.drain(..).for_each(|k| handed[k] = true);
            }
            kind.add(k, image);
        }
        for kind in &mut pending {
            if !kind.images.is_empty() {
                kind.queue(&work, shared, std::mem::take(&mut refused), handed);
                refused_at.drain(..).for_each(|k| handed[k] = true);
            }
        }
        shared.refuse(&work, refused);
        refused_at.drain(..).for_each(|k| handed[k] = true);
    }

    /// The file at source `index` as the engines take it, read, screened and planned; `None` if
    /// it is unreadable, oversized, not for the engines or not plannable (the CPU lane takes it
    /// and reports any problem with it).
    fn read(
        &mut self,
        work: &Work,
        shared: &Shared,
        position: usize,
        index: usize,
        slot: u32,
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
        let Some(screened) = shared.screen.take(&bytes) else {
            self.buffers.push(bytes.into_buffer());
            return None;
        };
        let (width, height) = (screened.info.width, screened.info.height);
        let draw = self.geometry.draw(width, height, index, work.lane.epoch);
        let (x, y) = self.geometry.axis_plans(width, height, draw.as_ref());
        let Ok(passes) = plan_passes(&x, &y, self.filter, self.geometry.pass_order) else {
            self.buffers.push(bytes.into_buffer());
            return None;
        };
        Some(CallImage {
            position,
            slot,
            bytes,
            screened,
            draw,
            x,
            y,
            passes,
        })
    }
}

/// A call being filled: its images (with their places in the range), pixels and bytes.
#[derive(Default)]
struct Pending {
    images: Vec<CallImage>,
    places: Vec<usize>,
    pixels: u64,
    bytes: u64,
}

impl Pending {
    /// Whether `image` would take the call past [`CHUNK`] images, [`MAX_CALL_PIXELS`]
    /// pixels or [`MAX_CALL_BYTES`] compressed bytes (an empty call takes any image).
    fn is_full_for(&self, image: &CallImage) -> bool {
        !self.images.is_empty()
            && (self.images.len() == CHUNK
                || self.pixels + image.pixels() > MAX_CALL_PIXELS
                || self.bytes + image.bytes.len() as u64 > MAX_CALL_BYTES as u64)
    }

    fn add(&mut self, place: usize, image: CallImage) {
        self.pixels += image.pixels();
        self.bytes += image.bytes.len() as u64;
        self.places.push(place);
        self.images.push(image);
    }

    /// Queues the call (with `refused`, positions to publish) and starts a new one.
    fn queue(
        &mut self,
        work: &Arc<Work>,
        shared: &Shared,
        refused: Vec<(usize, u32)>,
        handed: &mut [bool],
    ) {
        let call = Call {
            work: work.clone(),
            images: std::mem::take(&mut self.images),
        };
        shared.queue_call(call, refused);
        self.places.drain(..).for_each(|k| handed[k] = true);
        (self.pixels, self.bytes) = (0, 0);
    }
}
