//! The prefetch thread: runs epochs, batch after batch, wiring the stages together. It owns no
//! pixel math: the decode lanes fill a staging slot, the output stage turns it into a tensor.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, SyncSender};
use std::sync::{Arc, Mutex};

use super::hybrid::{self, Balance, HybridFilled};
use super::output::OutputStage;
use crate::batch::{Batch, DecodedBy, ReadReport};
use crate::cpu::{AheadWork, BatchRequest, CpuAhead, CpuLane};
use crate::cuda::{offered, LaneWork};
use crate::error::{Error, ItemError, Result};
use crate::options::{BatchOptions, LastBatch};
use crate::order::{EpochOrder, Sampler};
use crate::source::Source;

/// What the worker sends the consumer.
pub(super) enum Message {
    Batch(Box<Result<Batch>>),
    /// The epoch is over; carries what no batch carried: skipped images after the last batch and
    /// images dropped with a partial last batch.
    EndOfEpoch {
        trailing_skipped: Vec<ItemError>,
        dropped: usize,
        complete: bool,
        reads: Option<ReadReport>,
    },
}

/// Everything the prefetch thread owns.
pub(super) struct Worker {
    pub source: Arc<Source>,
    /// Whether every image of the source has a label.
    pub labelled: bool,
    pub sampler: Sampler,
    pub batching: BatchOptions,
    pub lane: CpuLane,
    /// The CPU lane working ahead, beside the GPU lane (hybrid decoding).
    pub ahead: Option<CpuAhead>,
    /// The GPU decode lane's share, with hybrid decoding.
    pub balance: Balance,
    /// Where the consumer reads the share in force.
    pub share_report: Arc<Mutex<Option<f32>>>,
    pub output: Box<dyn OutputStage>,
    pub abandon: Arc<AtomicBool>,
    pub stop: Arc<AtomicBool>,
}

enum Produced {
    Batch(Box<Batch>, usize),
    /// Nothing more to yield this epoch: these were skipped after the last batch, and `dropped`
    /// good images were left out with a partial last batch.
    Tail {
        skipped: Vec<ItemError>,
        dropped: usize,
    },
    Stopped,
}

impl Worker {
    /// Runs each epoch asked for on `commands`, sending its batches, then its end, on `batches`.
    pub fn run(mut self, commands: Receiver<u64>, batches: SyncSender<Message>) {
        let mut slot = 0;
        // The next epoch, its order and share, when the lanes were started on it ahead of its
        // command.
        let mut begun: Option<(u64, Arc<EpochOrder>, Option<f32>)> = None;
        while let Ok(epoch) = commands.recv() {
            let ahead = begun.take().filter(|(e, _, _)| *e == epoch);
            let order = match &ahead {
                Some((_, order, _)) => order.clone(),
                None => self.plan_epoch(epoch),
            };
            let batch_size = self.batching.batch_size;
            // With equal shards, every rank yields exactly this many images, in batches of the
            // same sizes; otherwise the order's end ends the epoch.
            let target = order.refills().then(|| match self.batching.last_batch {
                LastBatch::Drop => order.len() / batch_size * batch_size,
                _ => order.len(),
            });
            let mut position = 0;
            let mut delivered = 0;
            let mut trailing_skipped = Vec::new();
            let mut dropped = 0;
            let mut complete = true;
            let begin = match ahead {
                Some((_, _, share)) => Ok(share),
                None => self.begin_lane(epoch, &order),
            };
            let share = match begin {
                Ok(share) => share,
                Err(error) => {
                    let _ = batches.send(Message::Batch(Box::new(Err(error))));
                    complete = false;
                    position = order.len();
                    delivered = target.unwrap_or(0);
                    None
                }
            };
            loop {
                let want = match target {
                    Some(target) if delivered < target => (target - delivered).min(batch_size),
                    Some(_) => break,
                    None if position < order.len() => batch_size,
                    None => break,
                };
                if self.abandon.load(Ordering::SeqCst) {
                    complete = false;
                    break;
                }
                match self.next_batch(epoch, &order, position, slot, share, want) {
                    Ok(Produced::Batch(batch, consumed)) => {
                        position += consumed;
                        self.source.advance(position);
                        delivered += batch.len();
                        slot = (slot + 1) % self.output.slots();
                        if batches.send(Message::Batch(Box::new(Ok(*batch)))).is_err() {
                            return;
                        }
                    }
                    Ok(Produced::Tail {
                        skipped,
                        dropped: d,
                    }) => {
                        trailing_skipped = skipped;
                        dropped = d;
                        break;
                    }
                    Ok(Produced::Stopped) => {
                        complete = false;
                        break;
                    }
                    Err(error) => {
                        complete = false;
                        if batches.send(Message::Batch(Box::new(Err(error)))).is_err() {
                            return;
                        }
                        break;
                    }
                }
            }
            if target.is_some() && complete {
                // The rank's own images a partial last batch left out.
                dropped = order.real().saturating_sub(position);
            }
            if complete && share.is_some() && !self.stop.load(Ordering::SeqCst) {
                // Every position of this epoch is in a batch: the lanes start on the next epoch
                // now, while the consumer takes this one's last batches, rather than once it
                // asks for the next (which it almost always does).
                let next = epoch + 1;
                let order = self.plan_epoch(next);
                if let Ok(share) = self.begin_lane(next, &order) {
                    begun = Some((next, order, share));
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

    /// The order of `epoch`, which the source starts reading ahead of.
    fn plan_epoch(&self, epoch: u64) -> Arc<EpochOrder> {
        let order = Arc::new(self.sampler.epoch(epoch));
        self.source.begin_epoch(epoch, &order);
        order
    }

    /// With hybrid decoding, starts the GPU lane on the epoch, measuring the share first if it
    /// is not known yet; returns the share (`None` without a GPU lane).
    fn begin_lane(&mut self, epoch: u64, order: &Arc<EpochOrder>) -> Result<Option<f32>> {
        if self.balance.share().is_none() && !order.indices().is_empty() {
            if let Some(parts) = self.output.hybrid(0)? {
                let measured = hybrid::measure(
                    &self.lane,
                    parts,
                    &self.source,
                    order,
                    epoch,
                    self.batching.batch_size,
                    &self.abandon,
                )?;
                if let Some(share) = measured {
                    self.balance = Balance::new(Some(share));
                }
            }
        }
        let (Some(share), Some(ahead)) = (self.balance.share(), &self.ahead) else {
            return Ok(None);
        };
        ahead.begin(AheadWork {
            source: self.source.clone(),
            order: order.clone(),
            epoch,
            on_gpu: Arc::new(move |index| offered(index, share)),
        });
        let work = LaneWork {
            source: self.source.clone(),
            order: order.clone(),
            share,
            epoch,
            refused: Some(ahead.hand_back_fn()),
        };
        if !self.output.begin_lane(work)? {
            return Ok(None);
        }
        *self
            .share_report
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(share);
        Ok(Some(share))
    }

    /// Prepares a batch of `want` images that starts at `position` of `order`; `share` is the GPU
    /// lane's, when it runs.
    fn next_batch(
        &mut self,
        epoch: u64,
        order: &EpochOrder,
        position: usize,
        slot: usize,
        share: Option<f32>,
        want: usize,
    ) -> Result<Produced> {
        let request = BatchRequest {
            order,
            start: position,
            epoch,
            batch_size: want,
            on_error: self.batching.on_error,
        };
        let parts = match share {
            Some(_) => self.output.hybrid(slot)?,
            None => None,
        };
        let filled = match (parts, share, &self.ahead) {
            (Some(parts), Some(share), Some(ahead)) => hybrid::fill(
                ahead,
                parts,
                &request,
                &self.source,
                &self.abandon,
                share,
                self.lane.image_bytes(),
            )?,
            _ => {
                let mut staging = self.output.staging(slot)?;
                self.lane
                    .fill(&mut staging, &request, &self.source, &self.abandon)?
                    .map(|filled| HybridFilled {
                        decoded_by: DecodedBy {
                            cpu: filled.indices.len(),
                            gpu: 0,
                        },
                        filled,
                        from_gpu: Vec::new(),
                    })
            }
        };
        let Some(HybridFilled {
            filled,
            from_gpu,
            decoded_by,
        }) = filled
        else {
            return Ok(Produced::Stopped);
        };
        let n = filled.indices.len();
        if order.refills() && n < want {
            // Every image of the shard failed, even going round it again: the ranks' batches
            // cannot stay equal.
            self.output.discard(from_gpu)?;
            let shard = self.sampler.shard;
            return Err(Error::ShardExhausted {
                rank: shard.rank,
                world: shard.world,
                missing: want - n,
            });
        }
        let at_end = position + filled.consumed >= order.len();
        if n == 0
            || (!order.refills()
                && at_end
                && n < want
                && self.batching.last_batch == LastBatch::Drop)
        {
            self.output.discard(from_gpu)?;
            return Ok(Produced::Tail {
                skipped: filled.skipped,
                dropped: n,
            });
        }
        let (images, uploaded_bytes) = self.output.finish(slot, n, from_gpu)?;
        let ids = filled
            .indices
            .iter()
            .map(|&i| self.source.item(i).id().to_string())
            .collect();
        let labels = self.labelled.then(|| {
            filled
                .indices
                .iter()
                .map(|&i| self.source.item(i).label().unwrap_or_default())
                .collect()
        });
        let crops = filled.draws.iter().copied().collect();
        let batch = Batch {
            images,
            indices: filled.indices,
            ids,
            labels,
            padded: filled.padded,
            crops,
            skipped: filled.skipped,
            epoch,
            uploaded_bytes,
            decoded_by,
        };
        Ok(Produced::Batch(Box::new(batch), filled.consumed))
    }
}
