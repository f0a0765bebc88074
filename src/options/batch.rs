//! Batches and their order: the batch size, the last batch, bad images, the shuffle and the
//! shards of many processes.

use std::fmt;
use std::str::FromStr;

use super::ParseOptionError;
use crate::error::{Error, Result};

/// What happens when one image cannot be read or decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum OnError {
    /// Fill the batch with the next good images and list the bad one in [`crate::Batch::skipped`].
    #[default]
    Skip,
    /// Stop: `next_batch` returns [`Error::Item`] naming the image.
    Fail,
}

named_choices!(
    OnError,
    "error policy",
    [(OnError::Skip, ["skip"]), (OnError::Fail, ["fail"]),]
);

/// What happens to a last batch smaller than the batch size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum LastBatch {
    /// Yield it (PyTorch's `drop_last=False`).
    #[default]
    Keep,
    /// Leave it out (PyTorch's `drop_last=True`).
    Drop,
}

named_choices!(
    LastBatch,
    "last-batch policy",
    [(LastBatch::Keep, ["keep"]), (LastBatch::Drop, ["drop"]),]
);

/// How the shards of the ranks are evened out when a source is shared by several processes
/// (data-parallel training needs every rank to yield the same number of batches, or a collective
/// waits forever).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum ShardBalance {
    /// Every rank gets the same number of images: the epoch's order is padded by wrapping around
    /// it, as PyTorch's `DistributedSampler` does, and padded rows are flagged on the batch
    /// ([`crate::Batch::padded`]) so evaluation code can mask them. Images that fail are
    /// replaced by the next ones (padding past the end), so batches stay equal too.
    #[default]
    Pad,
    /// Every rank gets the same number of images: the order is cut to a multiple of the world
    /// (`DistributedSampler(drop_last=True)`); failed images are replaced as with `Pad`.
    Drop,
    /// Every `world`-th image, no more: shards differ in length by up to one image and nothing
    /// is padded or replaced past the end.
    Uneven,
}

named_choices!(
    ShardBalance,
    "shard balance",
    [
        (ShardBalance::Pad, ["pad"]),
        (ShardBalance::Drop, ["drop"]),
        (ShardBalance::Uneven, ["uneven"]),
    ]
);

/// This process's part of a source shared by `world` processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Shard {
    /// This process's index, `0..world`.
    pub rank: usize,
    /// Number of processes.
    pub world: usize,
}

impl Shard {
    /// Process `rank` of `world`.
    pub const fn new(rank: usize, world: usize) -> Shard {
        Shard { rank, world }
    }
}

impl Default for Shard {
    /// The whole source: rank 0 of 1.
    fn default() -> Self {
        Shard::new(0, 1)
    }
}

impl fmt::Display for Shard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.rank, self.world)
    }
}

impl FromStr for Shard {
    type Err = ParseOptionError;

    /// `RANK/WORLD`, as [`Shard`] prints (e.g. `0/4`); the rank is checked against the world
    /// when the options are validated.
    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        let fail = || ParseOptionError {
            what: "shard",
            given: s.to_string(),
            expected: "RANK/WORLD (e.g. 0/4)".to_string(),
        };
        let (rank, world) = s.trim().split_once('/').ok_or_else(fail)?;
        let number = |n: &str| n.trim().parse::<usize>().map_err(|_| fail());
        Ok(Shard::new(number(rank)?, number(world)?))
    }
}

/// Batches and their order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct BatchOptions {
    /// Images per batch (default 256).
    pub batch_size: usize,
    /// Keep or drop a last partial batch (default keep).
    pub last_batch: LastBatch,
    /// What a bad image does (default: skip it and list it on the batch).
    pub on_error: OnError,
    /// Seed of the per-epoch shuffle; `None` (default) keeps the source's order.
    pub shuffle_seed: Option<u64>,
    /// This process's part: every `world`-th image of the (shuffled) order starting at `rank`.
    pub shard: Shard,
    /// How the ranks' shards are evened out (default: padded to equal length).
    pub shard_balance: ShardBalance,
}

impl Default for BatchOptions {
    fn default() -> Self {
        BatchOptions {
            batch_size: 256,
            last_batch: LastBatch::Keep,
            on_error: OnError::Skip,
            shuffle_seed: None,
            shard: Shard::default(),
            shard_balance: ShardBalance::Pad,
        }
    }
}

impl BatchOptions {
    /// Sets [`BatchOptions::batch_size`].
    pub fn batch_size(mut self, n: usize) -> Self {
        self.batch_size = n;
        self
    }

    /// Sets [`BatchOptions::last_batch`].
    pub fn last_batch(mut self, policy: LastBatch) -> Self {
        self.last_batch = policy;
        self
    }

    /// Sets [`BatchOptions::on_error`].
    pub fn on_error(mut self, policy: OnError) -> Self {
        self.on_error = policy;
        self
    }

    /// Sets [`BatchOptions::shuffle_seed`].
    pub fn shuffle_seed(mut self, seed: Option<u64>) -> Self {
        self.shuffle_seed = seed;
        self
    }

    /// Sets [`BatchOptions::shard`].
    pub fn shard(mut self, shard: Shard) -> Self {
        self.shard = shard;
        self
    }

    /// Sets [`BatchOptions::shard_balance`].
    pub fn shard_balance(mut self, balance: ShardBalance) -> Self {
        self.shard_balance = balance;
        self
    }

    pub(super) fn validate(&self) -> Result<()> {
        if self.batch_size == 0 {
            return Err(Error::invalid("batch_size", "must be at least 1"));
        }
        let Shard { rank, world } = self.shard;
        if world == 0 || rank >= world {
            return Err(Error::invalid(
                "shard",
                format!("rank {rank} of world {world}: need rank < world"),
            ));
        }
        Ok(())
    }
}
