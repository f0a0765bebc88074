//! The prefetch thread: runs epochs, batch after batch, wiring the stages together. It owns no
//! pixel math: the decode lanes fill a staging slot, the output stage turns it into a tensor.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, SyncSender};
use std::sync::{Arc, Mutex};

use super::hybrid::{self, Balance, DecodedBy, HybridFilled};
use super::output::OutputStage;
use crate::batch::Batch;
use crate::cpu::{BatchRequest, CpuLane};
use crate::cuda::PlannedImages;
use crate::error::{ItemError, Result};
use crate::options::{BatchOptions, LastBatch};
use crate::order::Sampler;
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
    },
}

/// Everything the prefetch thread owns.
pub(super) struct Worker {
    pub source: Source,
    /// Whether every image of the source has a label.
    pub labelled: bool,
    pub sampler: Sampler,
    pub batching: BatchOptions,
    pub lane: CpuLane,
    /// The GPU decode lane's share, with hybrid decoding.
    pub balance: Balance,
    /// Where the consumer reads the share in force.
    pub share_report: Arc<Mutex<Option<f32>>>,
    /// The decode options' file size limit (the GPU lane reads files too).
    pub max_file_bytes: u64,
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
        while let Ok(epoch) = commands.recv() {
            let order = self.sampler.epoch_order(epoch);
            let mut position = 0;
            let mut trailing_skipped = Vec::new();
            let mut dropped = 0;
            let mut complete = true;
            while position < order.len() {
                if self.abandon.load(Ordering::SeqCst) {
                    complete = false;
                    break;
                }
                match self.next_batch(epoch, &order[position..], slot) {
                    Ok(Produced::Batch(batch, consumed)) => {
                        position += consumed;
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
            let end = Message::EndOfEpoch {
                trailing_skipped,
                dropped,
                complete,
            };
            if self.stop.load(Ordering::SeqCst) || batches.send(end).is_err() {
                return;
            }
        }
    }

    /// Prepares the batch that starts at `order[0]`.
    fn next_batch(&mut self, epoch: u64, order: &[usize], slot: usize) -> Result<Produced> {
        let batch_size = self.batching.batch_size;
        let request = BatchRequest {
            order,
            epoch,
            batch_size,
            on_error: self.batching.on_error,
        };
        let filled = match self.output.hybrid(slot)? {
            Some(parts) => {
                let filled = hybrid::fill(
                    &self.lane,
                    parts,
                    &request,
                    &self.source,
                    &self.abandon,
                    &mut self.balance,
                    self.max_file_bytes,
                )?;
                *self
                    .share_report
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner()) = self.balance.share();
                filled
            }
            None => {
                let mut staging = self.output.staging(slot)?;
                self.lane
                    .fill(&mut staging, &request, &self.source, &self.abandon)?
                    .map(|filled| HybridFilled {
                        decoded_by: DecodedBy {
                            cpu: filled.indices.len(),
                            gpu: 0,
                        },
                        filled,
                        from_gpu: PlannedImages::default(),
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
        let at_end = filled.consumed == order.len();
        if n == 0 || (at_end && n < batch_size && self.batching.last_batch == LastBatch::Drop) {
            return Ok(Produced::Tail {
                skipped: filled.skipped,
                dropped: n,
            });
        }
        let (images, uploaded_bytes) = self.output.finish(slot, n, &from_gpu)?;
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
        let batch = Batch {
            images,
            indices: filled.indices,
            ids,
            labels,
            skipped: filled.skipped,
            epoch,
            uploaded_bytes,
            decoded_by,
        };
        Ok(Produced::Batch(Box::new(batch), filled.consumed))
    }
}
