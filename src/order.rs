//! The order of an epoch: which source indices this process takes and in which order
//! (deterministic, or a seeded shuffle per epoch; then this process's shard, evened out with the
//! other ranks' as [`ShardBalance`] says), and where in it a pipeline stands ([`state`]).
//!
//! Two shuffles. Local sources get a global one: any image may follow any other. Sources whose
//! shards are read whole over the network ([`ShardBlocks`]) get a block shuffle, as MosaicML
//! Streaming and WebDataset do: the shards are shuffled each epoch, each rank takes one run of
//! them (so it reads shards of its own, with at most a shard at each end of its run shared with
//! a neighbour), and the samples are shuffled within windows of a few consecutive shards, so
//! only a window's shards need to be held at once. Both depend on the seed and the epoch alone,
//! so every rank draws the same.
//!
//! The order knows nothing of sources: it takes what it needs of one as plain data (the number
//! of images, the shards' lengths, the listing's summary), and the sources read ahead of it.

mod state;

use std::sync::Arc;

use crate::options::{BatchOptions, Shard, ShardBalance};
use crate::random::Draws;

pub use state::PipelineState;
pub(crate) use state::{EpochStart, Fingerprint, ListingSummary};

/// Draws the order of each epoch for one process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Sampler {
    pub len: usize,
    pub shuffle_seed: Option<u64>,
    pub shard: Shard,
    pub balance: ShardBalance,
    /// The shards of a source read shard by shard, for the block shuffle.
    pub blocks: Option<Arc<ShardBlocks>>,
}

/// How a source's samples sit in shards that are read whole: shard `k` holds the `lens[k]`
/// source indices after those of the shards before it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ShardBlocks {
    /// Samples of each shard, in source order.
    pub lens: Vec<usize>,
    /// Consecutive shards (in the epoch's shard order) whose samples are shuffled together.
    pub window: usize,
}

impl Sampler {
    /// The sampler of a source of `len` images under `batching`.
    pub fn new(len: usize, batching: &BatchOptions) -> Sampler {
        Sampler {
            len,
            shuffle_seed: batching.shuffle_seed,
            shard: batching.shard,
            balance: batching.shard_balance,
            blocks: None,
        }
    }

    /// The same sampler with the block shuffle of these shards (ignored unless they hold the
    /// source's `len` samples).
    pub fn with_blocks(mut self, blocks: Option<ShardBlocks>) -> Sampler {
        self.blocks = blocks
            .filter(|b| b.lens.iter().sum::<usize>() == self.len)
            .map(Arc::new);
        self
    }

    /// The whole source's order for `epoch`: in order, or shuffled with a permutation that
    /// depends only on the seed and the epoch, so every rank agrees.
    fn global_order(&self, epoch: u64) -> Vec<usize> {
        if let Some(blocks) = &self.blocks {
            return self.block_order(blocks, epoch);
        }
        let mut order: Vec<usize> = (0..self.len).collect();
        if let Some(seed) = self.shuffle_seed {
            shuffle(&mut order, &mut epoch_draws(seed, epoch));
        }
        order
    }

    /// The global order of a sharded source, laid out so that every rank's positions (every
    /// `world`-th entry from `rank`) are one run of the shards: the shards in order (shuffled
    /// with a seed), cut into consecutive runs, one a rank, of as many samples as the rank has
    /// positions; with a seed, the samples of each run shuffled within windows of
    /// `blocks.window` consecutive shards.
    fn block_order(&self, blocks: &ShardBlocks, epoch: u64) -> Vec<usize> {
        let mut starts = Vec::with_capacity(blocks.lens.len());
        let mut at = 0;
        for &len in &blocks.lens {
            starts.push(at);
            at += len;
        }
        let mut rng = self.shuffle_seed.map(|seed| epoch_draws(seed, epoch));
        let mut shards: Vec<usize> = (0..blocks.lens.len()).collect();
        if let Some(rng) = &mut rng {
            shuffle(&mut shards, rng);
        }
        // Each sample with its shard's place in the epoch's shard order.
        let sequence: Vec<(usize, usize)> = shards
            .iter()
            .enumerate()
            .flat_map(|(place, &k)| {
                (starts[k]..starts[k] + blocks.lens[k]).map(move |i| (i, place))
            })
            .collect();
        let (n, world) = (self.len, self.shard.world.max(1));
        let mut global = vec![0; n];
        let mut at = 0;
        for rank in 0..world.min(n) {
            let count = (n - rank).div_ceil(world);
            let mut run: Vec<usize> = sequence[at..at + count].iter().map(|s| s.0).collect();
            if let Some(rng) = &mut rng {
                let places: Vec<usize> = sequence[at..at + count].iter().map(|s| s.1).collect();
                let mut begin = 0;
                while begin < run.len() {
                    // A window: the samples of `window` consecutive shards of the run.
                    let last_place = places[begin] + blocks.window.max(1) - 1;
                    let end = begin + places[begin..].partition_point(|&p| p <= last_place);
                    shuffle(&mut run[begin..end], rng);
                    begin = end;
                }
            }
            for (p, index) in run.into_iter().enumerate() {
                global[rank + p * world] = index;
            }
            at += count;
        }
        global
    }

    /// How many of this process's positions hold its own images, every epoch (the same whatever
    /// the shuffle).
    pub fn real_len(&self) -> usize {
        self.real_len_of(self.len)
    }

    /// How many of this process's positions hold its own images when `n` images of the global
    /// order are split over the ranks.
    fn real_len_of(&self, n: usize) -> usize {
        let (rank, world) = (self.shard.rank, self.shard.world.max(1));
        match self.balance {
            ShardBalance::Drop if world > 1 => n / world,
            _ => n.saturating_sub(rank).div_ceil(world),
        }
    }

    /// How many positions this process's epoch has, padding included: the images it yields
    /// when none fails.
    pub fn positions(&self) -> usize {
        let world = self.shard.world.max(1);
        match self.balance {
            ShardBalance::Pad if world > 1 => self.len.div_ceil(world),
            _ => self.real_len(),
        }
    }

    /// This process's positions for `epoch`: every `world`-th entry of the global order,
    /// starting at `rank`. With more than one rank and [`ShardBalance::Pad`] the global order is
    /// first padded by wrapping around it (as PyTorch's `DistributedSampler` does) to a multiple
    /// of the world, so every rank has the same number of positions; with
    /// [`ShardBalance::Drop`] it is cut to one. In both, positions past the end wrap around the
    /// rank's own images (padding too), for batches to stay full when images fail.
    #[cfg(test)]
    pub fn epoch(&self, epoch: u64) -> EpochOrder {
        self.epoch_from(epoch, 0)
    }

    /// This process's positions for what is left of `epoch` once the global order's first
    /// `from` entries are taken: the entries from `from` on, split over the ranks as a whole
    /// epoch is (every `world`-th entry starting at `rank`, padded by wrapping around them or
    /// cut as [`ShardBalance`] says). An epoch resumed on another number of ranks goes on this
    /// way, and `from` 0 is the whole epoch.
    pub fn epoch_from(&self, epoch: u64, from: usize) -> EpochOrder {
        let global = self.global_order(epoch);
        let rest = &global[from.min(global.len())..];
        let (rank, world) = (self.shard.rank, self.shard.world.max(1));
        let take = |order: &[usize]| -> Vec<usize> {
            order.iter().copied().skip(rank).step_by(world).collect()
        };
        if world == 1 || self.balance == ShardBalance::Uneven {
            return EpochOrder::new(take(rest));
        }
        let n = rest.len();
        match self.balance {
            ShardBalance::Drop => {
                let per = n / world;
                let indices = take(&rest[..per * world]);
                EpochOrder {
                    real: indices.len(),
                    indices,
                    refill: true,
                    start: 0,
                    batches: None,
                }
            }
            _ if self.blocks.is_some() && rank < n => {
                // A rank short of the others repeats its own last samples, whose shards it
                // holds, rather than another rank's.
                let per = n.div_ceil(world);
                let mut indices = take(rest);
                let real = indices.len();
                for k in 0..per - real {
                    indices.push(indices[real - 1 - k % real]);
                }
                EpochOrder {
                    indices,
                    real,
                    refill: true,
                    start: 0,
                    batches: None,
                }
            }
            _ if n == 0 => EpochOrder {
                refill: true,
                ..EpochOrder::default()
            },
            _ => {
                let per = n.div_ceil(world);
                // Position p holds global position rank + p * world, wrapped around the order:
                // the rank's real positions are those below n.
                EpochOrder {
                    indices: (0..per).map(|p| rest[(rank + p * world) % n]).collect(),
                    real: self.real_len_of(n),
                    refill: true,
                    start: 0,
                    batches: None,
                }
            }
        }
    }
}

/// The draws of an epoch's shuffle: from the seed and the epoch alone.
fn epoch_draws(seed: u64, epoch: u64) -> Draws {
    Draws::new(seed ^ epoch.wrapping_mul(0x9E37_79B9_7F4A_7C15))
}

/// Fisher-Yates with `rng`.
fn shuffle(items: &mut [usize], rng: &mut Draws) {
    for i in (1..items.len()).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        items.swap(i, j);
    }
}

/// The positions of one epoch, in the order they are taken: the source index each holds. The
/// first `real` positions are this process's own images; the rest pad its shard to the others'
/// length. With `refill`, positions past the end go on around the rank's images (own ones, or
/// its padding if it has none), all of them padding, so that a batch short of failed images
/// can be filled. An order may begin at a later position ([`EpochOrder::starting_at`]): its
/// positions then count from there, and everything else is the whole order's.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct EpochOrder {
    indices: Vec<usize>,
    real: usize,
    refill: bool,
    /// The whole order's position that is this order's position 0.
    start: usize,
    /// The epoch's batches when they are planned ahead (timm's patch sequences), in the whole
    /// order's positions: they cover its planned positions one after another.
    batches: Option<Arc<[PlannedBatch]>>,
}

/// A batch planned ahead of the epoch: its first position (in the whole order), its images and
/// the sequence length they are cut for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PlannedBatch {
    pub first: usize,
    pub size: usize,
    pub seq_len: u32,
}

impl EpochOrder {
    /// Positions holding `indices`, in order, all real, none past the end.
    pub fn new(indices: Vec<usize>) -> EpochOrder {
        EpochOrder {
            real: indices.len(),
            indices,
            refill: false,
            start: 0,
            batches: None,
        }
    }

    /// This order cut into `batches` planned ahead (each its first position in the whole
    /// order, its size and its sequence length, one after another over the planned positions).
    pub fn with_batches(mut self, batches: Vec<PlannedBatch>) -> EpochOrder {
        self.batches = Some(batches.into());
        self
    }

    /// The batches planned ahead, in the whole order's positions.
    pub fn batches(&self) -> Option<&[PlannedBatch]> {
        self.batches.as_deref()
    }

    /// The sequence length of the batch planned for `position` (0 where none is planned; a
    /// position past the planned ones takes the last batch's).
    pub fn seq_len_at(&self, position: usize) -> u32 {
        let Some(batches) = self.batches.as_deref() else {
            return 0;
        };
        let at = self.start.saturating_add(position);
        let k = batches.partition_point(|b| b.first + b.size <= at);
        batches
            .get(k)
            .or(batches.last())
            .map_or(0, |batch| batch.seq_len)
    }

    /// This order from its position `position` on (a resumed epoch): position 0 of the result
    /// holds what `position` holds here, is padding if it is here, and the positions past the
    /// end go round the same images.
    pub fn starting_at(mut self, position: usize) -> EpochOrder {
        self.start = self.start.saturating_add(position);
        self
    }

    /// Positions planned for the epoch (its own images and the padding) from the start on.
    pub fn len(&self) -> usize {
        self.indices.len().saturating_sub(self.start)
    }

    /// Positions planned for the whole epoch, wherever this order starts.
    pub fn planned(&self) -> usize {
        self.indices.len()
    }

    /// The whole order's position that is this order's position 0.
    pub fn start(&self) -> usize {
        self.start
    }

    /// Positions holding this process's own images, from the start on.
    pub fn real(&self) -> usize {
        self.real.saturating_sub(self.start)
    }

    /// Whether positions past the end go on around the rank's images.
    pub fn refills(&self) -> bool {
        self.refill
    }

    /// The source index at `position` (past the end only when refilling).
    pub fn get(&self, position: usize) -> Option<usize> {
        let position = self.start.checked_add(position)?;
        if let Some(&index) = self.indices.get(position) {
            return Some(index);
        }
        if !self.refill || self.indices.is_empty() {
            return None;
        }
        let cycle = if self.real > 0 {
            &self.indices[..self.real]
        } else {
            &self.indices[..]
        };
        Some(cycle[(position - self.indices.len()) % cycle.len()])
    }

    /// Whether `position` pads the shard (a repeated image, flagged on the batch).
    pub fn is_padding(&self, position: usize) -> bool {
        self.start.saturating_add(position) >= self.real
    }

    /// Positions one batch may go through from `position` before giving up: the rest of the
    /// planned ones, and, when refilling, one more round of the rank's images.
    pub fn reach(&self, position: usize) -> usize {
        let planned = self.len().saturating_sub(position);
        if self.refill {
            planned + self.real.max(1).min(self.indices.len().max(1))
        } else {
            planned
        }
    }

    /// The planned positions' source indices, from the start on.
    pub fn indices(&self) -> &[usize] {
        &self.indices[self.start.min(self.indices.len())..]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_are_disjoint_and_complete() {
        for world in 1..5 {
            let mut all = Vec::new();
            for rank in 0..world {
                let s = Sampler {
                    len: 103,
                    shuffle_seed: Some(7),
                    shard: Shard::new(rank, world),
                    balance: ShardBalance::Uneven,
                    blocks: None,
                };
                all.extend(s.epoch(3).indices().iter().copied());
            }
            all.sort();
            assert_eq!(all, (0..103).collect::<Vec<_>>());
        }
    }

    #[test]
    fn shuffle_depends_on_seed_and_epoch() {
        let s = Sampler {
            len: 50,
            shuffle_seed: Some(1),
            shard: Shard::default(),
            balance: ShardBalance::Pad,
            blocks: None,
        };
        assert_eq!(s.epoch(0), s.epoch(0));
        assert_ne!(s.epoch(0), s.epoch(1));
        assert_ne!(s.epoch(0).indices(), (0..50).collect::<Vec<_>>());
        let unshuffled = Sampler {
            shuffle_seed: None,
            ..s
        };
        assert_eq!(unshuffled.epoch(5).indices(), (0..50).collect::<Vec<_>>());
    }

    #[test]
    fn padded_shards_are_equal_and_their_real_parts_complete() {
        for (n, world) in [(400, 3), (103, 4), (2, 3), (9, 3), (1, 5)] {
            let orders: Vec<EpochOrder> = (0..world)
                .map(|rank| {
                    Sampler {
                        len: n,
                        shuffle_seed: Some(11),
                        shard: Shard::new(rank, world),
                        balance: ShardBalance::Pad,
                        blocks: None,
                    }
                    .epoch(2)
                })
                .collect();
            let per = n.div_ceil(world);
            assert!(orders.iter().all(|o| o.len() == per), "{n}/{world}");
            let mut real: Vec<usize> = orders
                .iter()
                .flat_map(|o| o.indices()[..o.real()].iter().copied())
                .collect();
            real.sort_unstable();
            assert_eq!(real, (0..n).collect::<Vec<_>>(), "{n}/{world}");
            let padded: usize = orders.iter().map(|o| o.len() - o.real()).sum();
            assert_eq!(padded, per * world - n);
            // Past the end, a rank keeps going around its images, as padding.
            let o = &orders[0];
            assert!(o.refills() && o.is_padding(o.len()));
            assert_eq!(o.get(o.len()), o.get(0));
        }
    }

    #[test]
    fn the_real_length_is_each_epochs() {
        for balance in [ShardBalance::Pad, ShardBalance::Drop, ShardBalance::Uneven] {
            for (n, world) in [(0, 1), (0, 3), (1, 5), (2, 3), (9, 3), (103, 4), (400, 3)] {
                for rank in 0..world {
                    let s = Sampler {
                        len: n,
                        shuffle_seed: Some(5),
                        shard: Shard::new(rank, world),
                        balance,
                        blocks: None,
                    };
                    for epoch in 0..3 {
                        let order = s.epoch(epoch);
                        assert_eq!(s.real_len(), order.real(), "{balance:?} {n} {rank}/{world}");
                        assert!(order.real() <= order.len());
                    }
                }
            }
        }
    }

    #[test]
    fn dropped_shards_are_equal_and_disjoint() {
        let orders: Vec<EpochOrder> = (0..3)
            .map(|rank| {
                Sampler {
                    len: 400,
                    shuffle_seed: None,
                    shard: Shard::new(rank, 3),
                    balance: ShardBalance::Drop,
                    blocks: None,
                }
                .epoch(0)
            })
            .collect();
        assert!(orders.iter().all(|o| o.len() == 133 && o.real() == 133));
        let mut all: Vec<usize> = orders.iter().flat_map(|o| o.indices().to_vec()).collect();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), 399);
    }

    #[test]
    fn an_order_from_a_later_position_is_the_rest_of_the_whole() {
        for balance in [ShardBalance::Pad, ShardBalance::Drop, ShardBalance::Uneven] {
            for (n, world) in [(1, 1), (10, 1), (103, 4), (9, 3), (2, 3)] {
                for rank in 0..world {
                    let whole = Sampler {
                        len: n,
                        shuffle_seed: Some(4),
                        shard: Shard::new(rank, world),
                        balance,
                        blocks: None,
                    }
                    .epoch(1);
                    // Positions past the planned ones too (a rank refilling its batches).
                    for from in [0, 1, whole.len() / 2, whole.len(), whole.len() + 3] {
                        let rest = whole.clone().starting_at(from);
                        let what = format!("{balance:?} {n} {rank}/{world} from {from}");
                        assert_eq!(rest.len(), whole.len().saturating_sub(from), "{what}");
                        assert_eq!(rest.real(), whole.real().saturating_sub(from), "{what}");
                        assert_eq!(rest.planned(), whole.len(), "{what}");
                        assert_eq!(rest.indices(), &whole.indices()[from.min(whole.len())..]);
                        for p in 0..whole.len() + 2 * n {
                            assert_eq!(rest.get(p), whole.get(from + p), "{what} at {p}");
                            assert_eq!(rest.is_padding(p), whole.is_padding(from + p));
                            assert_eq!(rest.reach(p), whole.reach(from + p), "{what} at {p}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn the_rest_of_an_epoch_is_split_over_another_world() {
        let global = Sampler {
            len: 103,
            shuffle_seed: Some(8),
            shard: Shard::default(),
            balance: ShardBalance::Uneven,
            blocks: None,
        }
        .epoch(2);
        for balance in [ShardBalance::Pad, ShardBalance::Drop, ShardBalance::Uneven] {
            // Two ranks took 20 positions each: the global order's first 40 entries.
            let taken: Vec<usize> = (0..2)
                .flat_map(|rank| {
                    let order = Sampler {
                        len: 103,
                        shuffle_seed: Some(8),
                        shard: Shard::new(rank, 2),
                        balance,
                        blocks: None,
                    }
                    .epoch(2);
                    order.indices()[..20].to_vec()
                })
                .collect();
            let mut sorted = taken.clone();
            sorted.sort_unstable();
            let mut first: Vec<usize> = global.indices()[..40].to_vec();
            first.sort_unstable();
            assert_eq!(sorted, first, "{balance:?}");
            // Three ranks go on from there.
            let rest: Vec<EpochOrder> = (0..3)
                .map(|rank| {
                    Sampler {
                        len: 103,
                        shuffle_seed: Some(8),
                        shard: Shard::new(rank, 3),
                        balance,
                        blocks: None,
                    }
                    .epoch_from(2, 40)
                })
                .collect();
            let mut all: Vec<usize> = rest
                .iter()
                .flat_map(|o| o.indices()[..o.real()].to_vec())
                .chain(taken)
                .collect();
            all.sort_unstable();
            // Each image once: 63 left, split over three ranks evenly.
            assert_eq!(all.len(), 103, "{balance:?}");
            all.dedup();
            assert_eq!(all, (0..103).collect::<Vec<_>>(), "{balance:?}");
            if balance != ShardBalance::Uneven {
                assert!(rest.iter().all(|o| o.len() == 21), "{balance:?}");
            }
        }
        // Nothing left: every rank's order is empty, and refills nothing.
        let done = Sampler {
            len: 5,
            shuffle_seed: None,
            shard: Shard::new(1, 3),
            balance: ShardBalance::Pad,
            blocks: None,
        }
        .epoch_from(0, 5);
        assert_eq!((done.len(), done.real(), done.get(0)), (0, 0, None));
    }

    #[test]
    fn uneven_shards_are_todays_split() {
        let lens: Vec<usize> = (0..3)
            .map(|rank| {
                Sampler {
                    len: 400,
                    shuffle_seed: None,
                    shard: Shard::new(rank, 3),
                    balance: ShardBalance::Uneven,
                    blocks: None,
                }
                .epoch(0)
                .len()
            })
            .collect();
        assert_eq!(lens, vec![134, 133, 133]);
    }

    /// The shards (by source index) that `indices` touch, in the order first touched.
    fn shards_of(indices: &[usize], lens: &[usize]) -> Vec<usize> {
        let mut starts = vec![0];
        for len in lens {
            starts.push(starts.last().unwrap() + len);
        }
        let mut out: Vec<usize> = Vec::new();
        for &i in indices {
            let k = starts.partition_point(|&s| s <= i) - 1;
            if !out.contains(&k) {
                out.push(k);
            }
        }
        out
    }

    fn blocked(
        lens: &[usize],
        window: usize,
        seed: Option<u64>,
        rank: usize,
        world: usize,
    ) -> Sampler {
        let len = lens.iter().sum();
        Sampler {
            len,
            shuffle_seed: seed,
            shard: Shard::new(rank, world),
            balance: ShardBalance::Pad,
            blocks: None,
        }
        .with_blocks(Some(ShardBlocks {
            lens: lens.to_vec(),
            window,
        }))
    }

    #[test]
    fn block_shuffle_keeps_each_rank_on_a_run_of_shards() {
        let lens = [10, 10, 10, 7, 10, 10, 10, 10, 3, 10, 10, 10];
        let n: usize = lens.iter().sum();
        for world in [1, 2, 3, 4] {
            for epoch in 0..3 {
                let orders: Vec<EpochOrder> = (0..world)
                    .map(|rank| blocked(&lens, 2, Some(9), rank, world).epoch(epoch))
                    .collect();
                // Every sample exactly once across the ranks' real positions.
                let mut real: Vec<usize> = orders
                    .iter()
                    .flat_map(|o| o.indices()[..o.real()].to_vec())
                    .collect();
                real.sort_unstable();
                assert_eq!(real, (0..n).collect::<Vec<_>>());
                let per = n.div_ceil(world);
                let mut touched = vec![0; lens.len()];
                for o in &orders {
                    assert_eq!(o.len(), per);
                    // A rank's padding repeats its own samples.
                    let own = &o.indices()[..o.real()];
                    assert!(o.indices()[o.real()..].iter().all(|i| own.contains(i)));
                    for k in shards_of(own, &lens) {
                        touched[k] += 1;
                    }
                }
                // Shards are the ranks' own but for those at the ends of the runs.
                let shared = touched.iter().filter(|&&t| t > 1).count();
                assert!(shared < world, "{world}: {touched:?}");
                assert!(touched.iter().all(|t| (1..=2).contains(t)), "{touched:?}");
            }
        }
    }

    #[test]
    fn block_shuffle_mixes_samples_within_windows_of_shards_only() {
        let lens = [8, 8, 8, 8, 8, 8, 8, 8];
        let order = blocked(&lens, 3, Some(4), 0, 1).epoch(1);
        let indices = order.indices();
        // The first 24 positions are the samples of the epoch's first three shards, mixed.
        let first = shards_of(&indices[..24], &lens);
        assert_eq!(first.len(), 3, "{first:?}");
        let mut window: Vec<usize> = indices[..24].to_vec();
        window.sort_unstable();
        let mut expected: Vec<usize> = first.iter().flat_map(|&k| k * 8..k * 8 + 8).collect();
        expected.sort_unstable();
        assert_eq!(window, expected);
        assert_ne!(
            &indices[..8],
            &expected[..8],
            "samples are mixed within the window"
        );
        // The shard order changes with the epoch and the seed, and is the same for equal ones.
        let again = blocked(&lens, 3, Some(4), 0, 1).epoch(1);
        assert_eq!(order, again);
        assert_ne!(order, blocked(&lens, 3, Some(4), 0, 1).epoch(2));
        assert_ne!(order, blocked(&lens, 3, Some(5), 0, 1).epoch(1));
        // Without a seed, one rank reads in source order.
        let plain = blocked(&lens, 3, None, 0, 1).epoch(3);
        assert_eq!(plain.indices(), (0..64).collect::<Vec<_>>());
    }
}
