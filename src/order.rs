//! The order of an epoch: which source indices this process takes and in which order
//! (deterministic, or a seeded shuffle per epoch; then this process's shard, evened out with the
//! other ranks' as [`ShardBalance`] says), and where in it a pipeline stands ([`state`]).

mod state;

use crate::options::{BatchOptions, Shard, ShardBalance};
use crate::random::Draws;

pub use state::PipelineState;
pub(crate) use state::{EpochStart, Fingerprint};

/// Draws the order of each epoch for one process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Sampler {
    pub len: usize,
    pub shuffle_seed: Option<u64>,
    pub shard: Shard,
    pub balance: ShardBalance,
}

impl Sampler {
    /// The sampler of a source of `len` images under `batching`.
    pub fn new(len: usize, batching: &BatchOptions) -> Sampler {
        Sampler {
            len,
            shuffle_seed: batching.shuffle_seed,
            shard: batching.shard,
            balance: batching.shard_balance,
        }
    }

    /// The whole source's order for `epoch`: in order, or shuffled with a permutation that
    /// depends only on the seed and the epoch, so every rank agrees.
    fn global_order(&self, epoch: u64) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.len).collect();
        if let Some(seed) = self.shuffle_seed {
            let mut rng = Draws::new(seed ^ epoch.wrapping_mul(0x9E37_79B9_7F4A_7C15));
            for i in (1..order.len()).rev() {
                let j = rng.below(i as u64 + 1) as usize;
                order.swap(i, j);
            }
        }
        order
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
    pub fn epoch(&self, epoch: u64) -> EpochOrder {
        self.epoch_from(epoch, 0)
    }

    /// This process's positions for what is left of `epoch` once the global order's first
    /// `from` entries are taken: the entries from `from` on, split over the ranks as
    /// [`Sampler::epoch`] splits the whole order (padded by wrapping around them, or cut). An
    /// epoch resumed on another number of ranks goes on this way, and `from` 0 is the whole
    /// epoch.
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
                }
            }
        }
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
}

impl EpochOrder {
    /// Positions holding `indices`, in order, all real, none past the end.
    pub fn new(indices: Vec<usize>) -> EpochOrder {
        EpochOrder {
            real: indices.len(),
            indices,
            refill: false,
            start: 0,
        }
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
    #[cfg(test)]
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
                }
                .epoch(0)
                .len()
            })
            .collect();
        assert_eq!(lens, vec![134, 133, 133]);
    }
}
