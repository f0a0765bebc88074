//! The prefetch thread: runs epochs, batch after batch, wiring the stages together. It owns no
//! pixel math: the decode lanes fill a staging slot (and make images on the device), the output
//! stage turns them into a tensor.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use super::hybrid::HybridFilled;
use super::lanes::Lanes;
use super::output::{BatchAugment, BatchImages, Finished, OutputStage};
use crate::augment::Augmenter;
use crate::batch::Batch;
use crate::cpu::BatchRequest;
use crate::error::{Error, ItemError, Result};
use crate::options::{BatchOptions, LastBatch};
use crate::order::{EpochOrder, EpochStart, PlannedBatch, Sampler};
use crate::patches::NaflexSchedule;
use crate::profile::{Stage, Stopwatch};
use crate::source::{ReadReport, Source};

/// Which lanes decode, as the worker last saw them.
#[derive(Debug, Clone, Default)]
pub(super) struct LanesReport {
    /// The GPU lane's share in force, while it runs.
    pub share: Option<f32>,
    /// Which lanes decode, and why, in words.
    pub description: String,
}

/// What the worker sends the consumer.
pub(super) enum Message {
    Batch(Box<Result<Batch>>),
    /// The epoch is over; carries what no batch carried: images dropped with a partial last
    /// batch, and skipped images after the last batch when the epoch yielded no batch at all.
    EndOfEpoch {
        trailing_skipped: Vec<ItemError>,
        dropped: usize,
        complete: bool,
        reads: Option<ReadReport>,
    },
}

/// An epoch to run: where its batches begin, and the GPU lane's share to pin, if any.
pub(super) struct EpochCommand {
    pub start: EpochStart,
    pub share: Option<f32>,
}

/// Everything the prefetch thread owns.
pub(super) struct Worker {
    pub source: Arc<Source>,
    /// Whether every image of the source has a label.
    pub labelled: bool,
    pub sampler: Sampler,
    pub batching: BatchOptions,
    pub lanes: Lanes,
    /// Where the stages' times go.
    pub stopwatch: Arc<Stopwatch>,
    /// Where the consumer reads which lanes decode and the share in force.
    pub lanes_report: Arc<Mutex<LanesReport>>,
    pub output: Box<dyn OutputStage>,
    /// The augmentations' draws, when the pipeline augments.
    pub augmenter: Option<Augmenter>,
    /// Classes of the soft labels, when batches are mixed.
    pub num_classes: usize,
    pub abandon: Arc<AtomicBool>,
    pub stop: Arc<AtomicBool>,
    /// The first epoch's start and order, when the lanes began it before the worker started
    /// (while the device opened).
    pub begun: Option<(EpochStart, Arc<EpochOrder>)>,
    /// The next epoch's order, when a source reading ahead of the first epoch asked for it.
    pub upcoming: Option<(u64, Arc<EpochOrder>)>,
    /// The run ends before this epoch, when known ([`crate::DecodeOptions::planned_epochs`]).
    pub planned_epochs: Option<u64>,
    /// Batches planned ahead of each epoch (timm's patch sequences: a sequence length and a
    /// size each), instead of batches of the batch size.
    pub schedule: Option<NaflexSchedule>,
}

/// The prefetch thread as its consumer holds it.
pub(super) struct Prefetch {
    /// Where the epochs are asked for.
    pub commands: Sender<EpochCommand>,
    /// Where the batches come back.
    pub batches: Receiver<Message>,
    pub thread: JoinHandle<()>,
}

/// The batch a worker makes next: how many images, its number in the epoch, the most
/// positions it takes, and the sequence length it is planned for (0 for none).
#[derive(Debug, Clone, Copy)]
struct Wanted {
    images: usize,
    number: u64,
    positions: usize,
    seq_len: u32,
}

enum Produced {
    Batch(Box<Batch>, usize),
    /// Nothing more to yield this epoch: these were skipped after the last batch, and `dropped`
    /// good images were left out with a partial last batch.
    Tail {
        skipped: Vec<ItemError>,
        dropped: usize,
    },
    /// A batch planned ahead whose images all failed: these were skipped, over `consumed`
    /// positions; the epoch goes on with the next planned batch.
    Empty {
        skipped: Vec<ItemError>,
        consumed: usize,
    },
    Stopped,
}

impl Worker {
    /// Starts the prefetch thread, which runs the worker, with the channel the epochs are asked
    /// for on and the one the batches come back on (holding the rest of the prefetch depth,
    /// `prefetch`).
    pub fn spawn(self, prefetch: usize) -> Result<Prefetch> {
        let (command_tx, command_rx) = mpsc::channel::<EpochCommand>();
        // The prefetch thread holds one finished batch until the next is made, another waits to
        // be sent: the channel takes the rest of the depth.
        let (batch_tx, batch_rx) = mpsc::sync_channel::<Message>(prefetch.saturating_sub(2));
        let thread = std::thread::Builder::new()
            .name("gpufeed-prefetch".into())
            .spawn(move || self.run(command_rx, batch_tx))
            .map_err(|e| Error::Worker(format!("cannot start the prefetch thread: {e}")))?;
        Ok(Prefetch {
            commands: command_tx,
            batches: batch_rx,
            thread,
        })
    }

    /// Runs each epoch asked for on `commands`, from where it says, sending its batches, then its
    /// end, on `batches`.
    pub fn run(mut self, commands: Receiver<EpochCommand>, batches: SyncSender<Message>) {
        let mut slot = 0;
        // The next epoch's start and order, when the lanes were started on it ahead of its
        // command.
        let mut begun = self.begun.take();
        // The next epoch's order, when a source reading ahead of it has asked for it already.
        let mut upcoming = self.upcoming.take();
        while let Ok(EpochCommand { start, share: pin }) = commands.recv() {
            let epoch = start.epoch;
            if let Some(share) = pin {
                if self.lanes.pin_share(share) {
                    begun = None;
                }
            }
            let ahead = begun.take().filter(|(begun_at, _)| start == *begun_at);
            let order = match &ahead {
                Some((_, order)) => order.clone(),
                None => plan_epoch(&self.plan_of(), &self.source, start, &mut upcoming),
            };
            let target = self.target(&order, start);
            let mut position = 0;
            let mut delivered = 0;
            let mut trailing_skipped = Vec::new();
            let mut dropped = 0;
            let mut complete = true;
            let begin = match ahead {
                Some(_) => Ok(()),
                None => self.lanes.begin(&self.source, &order, epoch),
            };
            if let Err(error) = begin {
                let _ = batches.send(Message::Batch(Box::new(Err(error))));
                complete = false;
                position = order.len();
                delivered = target.unwrap_or(0);
            }
            // A batch is sent once the next one is made or the epoch's end is known, so that
            // images skipped after it (the epoch's last positions all bad) ride on the last
            // batch of the epoch instead of on no batch at all.
            let mut held: Option<Box<Batch>> = None;
            let send = |batch: Option<Box<Batch>>| match batch {
                Some(batch) => batches.send(Message::Batch(Box::new(Ok(*batch)))).is_ok(),
                None => true,
            };
            // Images skipped by a planned batch that yielded none, for the next batch sent.
            let mut carried: Vec<ItemError> = Vec::new();
            loop {
                let wanted = match self.wanted(&order, start, target, position, delivered) {
                    Ok(Some(wanted)) => wanted,
                    Ok(None) => break,
                    Err(error) => {
                        complete = false;
                        if !send(held.take())
                            || batches.send(Message::Batch(Box::new(Err(error)))).is_err()
                        {
                            return;
                        }
                        break;
                    }
                };
                if self.abandon.load(Ordering::SeqCst) {
                    complete = false;
                    break;
                }
                let made = self.next_batch(epoch, &order, position, slot, wanted);
                self.report_lanes();
                match made {
                    Ok(Produced::Batch(mut batch, consumed)) => {
                        position += consumed;
                        if !carried.is_empty() {
                            batch.skipped.splice(0..0, carried.drain(..));
                        }
                        self.source.advance(position);
                        delivered += batch.len();
                        slot = (slot + 1) % self.output.slots();
                        let sending = Instant::now();
                        let last = position >= order.len() || target == Some(delivered);
                        if !send(held.replace(batch)) || (last && !send(held.take())) {
                            return;
                        }
                        self.stopwatch.add(Stage::WaitConsumer, sending.elapsed());
                    }
                    Ok(Produced::Tail {
                        skipped,
                        dropped: d,
                    }) => {
                        carried.extend(skipped);
                        match held.as_mut() {
                            Some(batch) => batch.skipped.append(&mut carried),
                            None => trailing_skipped = std::mem::take(&mut carried),
                        }
                        dropped = d;
                        break;
                    }
                    Ok(Produced::Empty { skipped, consumed }) => {
                        position += consumed;
                        self.source.advance(position);
                        match held.as_mut() {
                            Some(batch) => batch.skipped.extend(skipped),
                            None => carried.extend(skipped),
                        }
                    }
                    Ok(Produced::Stopped) => {
                        complete = false;
                        break;
                    }
                    Err(error) => {
                        complete = false;
                        if !send(held.take())
                            || batches.send(Message::Batch(Box::new(Err(error)))).is_err()
                        {
                            return;
                        }
                        break;
                    }
                }
            }
            if !send(held.take()) {
                return;
            }
            if target.is_some() && complete {
                // The rank's own images a partial last batch left out.
                dropped = order.real().saturating_sub(position);
            }
            if complete {
                if let Some(next) = self.begin_next(epoch, &mut upcoming) {
                    begun = Some(next);
                }
            }
            let end = Message::EndOfEpoch {
                trailing_skipped,
                dropped,
                complete,
                reads: self.source.read_report(epoch),
            };
            if self.stop.load(Ordering::SeqCst) || batches.send(end).is_err() {
                return;
            }
        }
    }

    /// How the epoch is planned: its order, and the batches planned ahead of it, if any.
    fn plan_of(&self) -> EpochPlanning<'_> {
        EpochPlanning {
            sampler: &self.sampler,
            schedule: self.schedule.as_ref(),
        }
    }

    /// The batch to make next, at `position` of `order` (begun at `start`) with `delivered`
    /// images delivered and `target` to reach: a batch of the batch size (less at the end), or
    /// the next one planned ahead; `None` once the epoch is over.
    fn wanted(
        &self,
        order: &EpochOrder,
        start: EpochStart,
        target: Option<usize>,
        position: usize,
        delivered: usize,
    ) -> Result<Option<Wanted>> {
        let batch_size = self.batching.batch_size;
        if let Some(batches) = order.batches() {
            // Planned batches begin where the one before ended, whatever its images did.
            let at = order.start() + position;
            let Some(k) = batches.iter().position(|b| b.first >= at) else {
                return Ok(None);
            };
            let batch = batches[k];
            if batch.first != at {
                return Err(Error::Worker(format!(
                    "position {at} is not where a planned batch begins (the next begins at {})",
                    batch.first
                )));
            }
            return Ok(Some(Wanted {
                images: batch.size,
                number: k as u64,
                positions: batch.size,
                seq_len: batch.seq_len,
            }));
        }
        let images = match target {
            Some(target) if delivered < target => (target - delivered).min(batch_size),
            Some(_) => return Ok(None),
            None if position < order.len() => batch_size,
            None => return Ok(None),
        };
        Ok(Some(Wanted {
            images,
            // Batches are full but the last: this one's number in the epoch (counting those
            // handed out before a resumed start).
            number: ((start.rows + delivered) / batch_size) as u64,
            positions: usize::MAX,
            seq_len: 0,
        }))
    }

    /// With equal shards, the images every rank yields of the epoch of `order` from `start`, in
    /// batches of the same sizes (less those handed out before a resumed start); `None`
    /// otherwise: the order's end ends the epoch (and batches planned ahead end it at their
    /// last, every rank's schedule of the same length).
    fn target(&self, order: &EpochOrder, start: EpochStart) -> Option<usize> {
        let batch_size = self.batching.batch_size;
        (order.refills() && order.batches().is_none()).then(|| {
            let planned = match self.batching.last_batch {
                LastBatch::Drop => order.planned() / batch_size * batch_size,
                _ => order.planned(),
            };
            planned.saturating_sub(start.rows)
        })
    }

    /// Once every position of `epoch` is in a batch: where the lanes work ahead, they start on
    /// the next epoch now, while the consumer takes this one's last batches, rather than once it
    /// asks for the next (which it almost always does, unless the run's planned epochs end
    /// here). The next epoch's start and order, if the lanes began it.
    fn begin_next(
        &mut self,
        epoch: u64,
        upcoming: &mut Option<(u64, Arc<EpochOrder>)>,
    ) -> Option<(EpochStart, Arc<EpochOrder>)> {
        let planned_next = self.planned_epochs.is_none_or(|epochs| epoch + 1 < epochs);
        if !planned_next || !self.lanes.work_ahead() || self.stop.load(Ordering::SeqCst) {
            return None;
        }
        let next = epoch + 1;
        let order = plan_epoch(
            &self.plan_of(),
            &self.source,
            EpochStart::beginning(next),
            upcoming,
        );
        self.lanes
            .begin(&self.source, &order, next)
            .is_ok()
            .then(|| (EpochStart::beginning(next), order))
    }

    /// Publishes which lanes decode and the GPU lane's share, for the consumer.
    fn report_lanes(&self) {
        let mut report = self
            .lanes_report
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        report.share = self.lanes.gpu_share();
        report.description = self.lanes.describe();
    }

    /// Prepares a batch of `want` images that starts at `position` of `order`, batch `number` of
    /// the epoch.
    fn next_batch(
        &mut self,
        epoch: u64,
        order: &EpochOrder,
        position: usize,
        slot: usize,
        wanted: Wanted,
    ) -> Result<Produced> {
        let Wanted {
            images: want,
            number,
            positions,
            seq_len,
        } = wanted;
        let planned = order.batches().is_some();
        let request = BatchRequest {
            order,
            start: position,
            epoch,
            batch_size: want,
            positions,
            on_error: self.batching.on_error,
        };
        let mut staging = self.output.staging(slot)?;
        let filled = self
            .lanes
            .fill(&mut staging, &request, &self.source, &self.abandon)?;
        let Some(HybridFilled {
            filled,
            unstaged,
            decoded_by,
            waits,
        }) = filled
        else {
            return Ok(Produced::Stopped);
        };
        self.stopwatch.add(Stage::WaitCpu, waits.cpu);
        self.stopwatch.add(Stage::WaitGpu, waits.gpu);
        self.stopwatch
            .add_many(Stage::StagingCopy, waits.copy, waits.copied);
        let n = filled.indices.len();
        let at_end = position + filled.consumed >= order.len();
        if planned && n == 0 && !at_end {
            // A planned batch whose images all failed: the next planned batch follows.
            self.lanes.discard(unstaged)?;
            return Ok(Produced::Empty {
                skipped: filled.skipped,
                consumed: filled.consumed,
            });
        }
        if order.refills() && n < want && !planned {
            // Every image of the shard failed, even going round it again: the ranks' batches
            // cannot stay equal.
            self.lanes.discard(unstaged)?;
            let shard = self.sampler.shard;
            return Err(Error::ShardExhausted {
                rank: shard.rank,
                world: shard.world,
                missing: want - n,
            });
        }
        if n == 0
            || (!order.refills()
                && !planned
                && at_end
                && n < want
                && self.batching.last_batch == LastBatch::Drop)
        {
            self.lanes.discard(unstaged)?;
            return Ok(Produced::Tail {
                skipped: filled.skipped,
                dropped: n,
            });
        }
        let (ids, labels) = self.ids_and_labels(&filled.indices);
        let plan = self
            .augmenter
            .as_ref()
            .map(|a| a.plan(&filled.indices, epoch, number));
        let mixed_labels = match (&plan, &labels) {
            (Some(plan), Some(labels)) if plan.mix.is_some() => {
                let classes = self.num_classes;
                if let Some(k) = labels.iter().position(|&l| l as usize >= classes) {
                    self.lanes.discard(unstaged)?;
                    return Err(Error::Mismatch(format!(
                        "{}: label {} is not below num_classes ({classes}), so it has no soft \
                         label",
                        ids[k], labels[k]
                    )));
                }
                Some((labels.as_slice(), classes))
            }
            _ => None,
        };
        let augment = plan.as_ref().map(|plan| BatchAugment {
            plan,
            labels: mixed_labels,
        });
        let finishing = Instant::now();
        let mut on_device = self.lanes.device_writes(unstaged);
        let images = BatchImages {
            draws: &filled.draws,
            seq_len,
            view_draws: &filled.view_draws,
        };
        let Finished {
            images,
            uploaded: uploaded_bytes,
            soft_labels,
            patches,
            views,
        } = self
            .output
            .finish(slot, n, &mut on_device, augment, &images)?;
        self.stopwatch.add(Stage::Finish, finishing.elapsed());
        let (augmentations, mix) = match plan {
            Some(plan) => (
                self.augmenter
                    .as_ref()
                    .is_some_and(|a| a.options.per_image())
                    .then_some(plan.rows),
                plan.mix,
            ),
            None => (None, None),
        };
        let crops = filled.draws.iter().copied().collect();
        let view_draws = views.is_some().then_some(filled.view_draws);
        let batch = Batch {
            next_position: order.start().saturating_add(position + filled.consumed),
            images,
            indices: filled.indices,
            ids,
            labels,
            padded: filled.padded,
            crops,
            augmentations,
            mix,
            soft_labels,
            skipped: filled.skipped,
            epoch,
            uploaded_bytes,
            decoded_by,
            patches,
            views,
            view_draws,
        };
        Ok(Produced::Batch(Box::new(batch), filled.consumed))
    }
}

impl Worker {
    /// The ids of the source images `indices`, and their labels where the source has them.
    fn ids_and_labels(&self, indices: &[usize]) -> (Vec<String>, Option<Vec<u32>>) {
        let ids = indices
            .iter()
            .map(|&i| self.source.item(i).id().to_string())
            .collect();
        let labels = self.labelled.then(|| {
            indices
                .iter()
                .map(|&i| self.source.item(i).label().unwrap_or_default())
                .collect()
        });
        (ids, labels)
    }
}

/// How each epoch is planned: the order of its images, and the batches planned ahead of it
/// (timm's patch sequences) if any.
pub(super) struct EpochPlanning<'a> {
    pub sampler: &'a Sampler,
    pub schedule: Option<&'a NaflexSchedule>,
}

impl EpochPlanning<'_> {
    /// The order of `epoch` from entry `from` of its global order, with its planned batches.
    fn order(&self, epoch: u64, from: usize) -> EpochOrder {
        let order = self.sampler.epoch_from(epoch, from);
        match self.schedule {
            Some(schedule) => order.with_batches(
                schedule
                    .epoch(epoch)
                    .into_iter()
                    .map(|b| PlannedBatch {
                        first: b.first,
                        size: b.size,
                        seq_len: b.seq_len,
                    })
                    .collect(),
            ),
            None => order,
        }
    }
}

/// The order of the epoch `start` begins (from where it says), which `source` starts reading
/// ahead of. `upcoming` keeps the next epoch's order when the source asks for it (to read ahead
/// of that epoch too), and gives it back when that epoch begins at its start.
pub(super) fn plan_epoch(
    planning: &EpochPlanning<'_>,
    source: &Source,
    start: EpochStart,
    upcoming: &mut Option<(u64, Arc<EpochOrder>)>,
) -> Arc<EpochOrder> {
    let order = match upcoming.take() {
        Some((epoch, order)) if start == EpochStart::beginning(epoch) => order,
        _ => Arc::new(
            planning
                .order(start.epoch, start.from)
                .starting_at(start.position),
        ),
    };
    source.begin_epoch(start.epoch, &order, || {
        let next = Arc::new(planning.order(start.epoch + 1, 0));
        *upcoming = Some((start.epoch + 1, next.clone()));
        next
    });
    order
}
