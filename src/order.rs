//! The order of an epoch: which source indices this process takes and in which order
//! (deterministic, or a seeded shuffle per epoch; then this process's shard, evened out with the
//! other ranks' as [`ShardBalance`] says).

use crate::options::{BatchOptions, Shard, ShardBalance};
use crate::random::Draws;

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
        let (rank, world) = (self.shard.rank, self.shard.world.max(1));
        match self.balance {
            ShardBalance::Drop if world > 1 => self.len / world,
            _ => self.len.saturating_sub(rank).div_ceil(world),
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
        let global = self.global_order(epoch);
        let (rank, world) = (self.shard.rank, self.shard.world.max(1));
        let take = |order: &[usize]| -> Vec<usize> {
            order.iter().copied().skip(rank).step_by(world).collect()
        };
        if world == 1 || self.balance == ShardBalance::Uneven {
            return EpochOrder::new(take(&global));
        }
        let n = global.len();
        match self.balance {
            ShardBalance::Drop => {
                let per = n / world;
                let indices = take(&global[..per * world]);
                EpochOrder {
                    real: indices.len(),
                    indices,
                    refill: true,
                }
            }
            _ => {
                let per = n.div_ceil(world);
                // Position p holds global position rank + p * world, wrapped around the order:
                // the rank's real positions are those below n.
                EpochOrder {
                    indices: (0..per).map(|p| global[(rank + p * world) % n]).collect(),
                    real: self.real_len(),
                    refill: true,
                }
            }
        }
    }
}

/// The positions of one epoch, in the order they are taken: the source index each holds. The
/// first `real` positions are this process's own images; the rest pad its shard to the others'
/// length. With `refill`, positions past the end go on around the rank's images (own ones, or
/// its padding if it has none), all of them padding, so that a batch short of failed images
/// can be filled.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct EpochOrder {
    indices: Vec<usize>,
    real: usize,
    refill: bool,
}

impl EpochOrder {
    /// Positions holding `indices`, in order, all real, none past the end.
    pub fn new(indices: Vec<usize>) -> EpochOrder {
        EpochOrder {
            real: indices.len(),
            indices,
            refill: false,
        }
    }

    /// Positions planned for the epoch (its own images and the padding).
    pub fn len(&self) -> usize {
        self.indices.len()
    }

    /// Positions holding this process's own images.
    pub fn real(&self) -> usize {
        self.real
    }

    /// Whether positions past the end go on around the rank's images.
    pub fn refills(&self) -> bool {
        self.refill
    }

    /// The source index at `position` (past the end only when refilling).
    pub fn get(&self, position: usize) -> Option<usize> {
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
        position >= self.real
    }

    /// Positions one batch may go through from `position` before giving up: the rest of the
    /// planned ones, and, when refilling, one more round of the rank's images.
    pub fn reach(&self, position: usize) -> usize {
        let planned = self.len().saturating_sub(position);
        if self.refill {
            planned + self.real.max(1).min(self.len().max(1))
        } else {
            planned
        }
    }

    /// The planned positions' source indices.
    #[cfg(test)]
    pub fn indices(&self) -> &[usize] {
        &self.indices
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
