//! The order of an epoch: which source indices this process takes and in which order
//! (deterministic, or a seeded shuffle per epoch; then this process's shard).

use crate::options::{BatchOptions, Shard};

/// Draws the order of each epoch for one process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Sampler {
    pub len: usize,
    pub shuffle_seed: Option<u64>,
    pub shard: Shard,
}

impl Sampler {
    /// The sampler of a source of `len` images under `batching`.
    pub fn new(len: usize, batching: &BatchOptions) -> Sampler {
        Sampler {
            len,
            shuffle_seed: batching.shuffle_seed,
            shard: batching.shard,
        }
    }

    /// Source indices for `epoch`: the whole source in order (or shuffled with a permutation that
    /// depends only on the seed and the epoch, so every rank agrees), then every `world`-th index
    /// starting at `rank`. The shards of all ranks are disjoint and together cover the source.
    pub fn epoch_order(&self, epoch: u64) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.len).collect();
        if let Some(seed) = self.shuffle_seed {
            let mut rng = SplitMix64::new(seed ^ epoch.wrapping_mul(0x9E37_79B9_7F4A_7C15));
            for i in (1..order.len()).rev() {
                let j = rng.below(i as u64 + 1) as usize;
                order.swap(i, j);
            }
        }
        order
            .into_iter()
            .skip(self.shard.rank)
            .step_by(self.shard.world.max(1))
            .collect()
    }
}

/// The positions of one epoch, in the order they are taken: the source index each holds.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct EpochOrder {
    indices: Vec<usize>,
}

impl EpochOrder {
    /// Positions holding `indices`, in order.
    pub fn new(indices: Vec<usize>) -> EpochOrder {
        EpochOrder { indices }
    }

    /// Positions in the epoch.
    pub fn len(&self) -> usize {
        self.indices.len()
    }

    /// The source index at `position`.
    pub fn get(&self, position: usize) -> Option<usize> {
        self.indices.get(position).copied()
    }

    /// Every position's source index.
    pub fn indices(&self) -> &[usize] {
        &self.indices
    }
}

/// A small, fast, well-mixed generator; enough for shuffling and stable across platforms.
struct SplitMix64(u64);

impl SplitMix64 {
    fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (Lemire's multiply-shift with rejection).
    fn below(&mut self, n: u64) -> u64 {
        loop {
            let m = (self.next() as u128) * (n as u128);
            let low = m as u64;
            if low >= n.wrapping_neg() % n {
                return (m >> 64) as u64;
            }
        }
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
                };
                all.extend(s.epoch_order(3));
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
        };
        assert_eq!(s.epoch_order(0), s.epoch_order(0));
        assert_ne!(s.epoch_order(0), s.epoch_order(1));
        assert_ne!(s.epoch_order(0), (0..50).collect::<Vec<_>>());
        let unshuffled = Sampler {
            shuffle_seed: None,
            ..s
        };
        assert_eq!(unshuffled.epoch_order(5), (0..50).collect::<Vec<_>>());
    }
}
