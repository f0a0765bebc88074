//! How many synchronisation passes the GPU entropy decoder launches for a batch.
//!
//! A batch's passes end at the first that changes nothing; the launches after it return at once,
//! but each still costs a launch (a few microseconds of the stream and of the submitting thread,
//! and the call waits for them). Batches of ImageNet-sized files settle within about a dozen
//! passes and large photos within about thirty, so launching [`PASSES`] every time spends more
//! on empty launches than on some of the decode's kernels.
//!
//! [`SyncPasses`] launches what recent batches needed, with a margin. A batch's chains grow
//! with its longest restart interval (a chain is a run of subsequences of one interval), so each
//! batch is put in a size class, the bit length of its longest interval counted in subsequences
//! ([`size_class`]), and a batch looks only at the recent batches of its class or larger: the
//! most passes any of the last [`WINDOW`] of them needed, plus half of that (at least
//! [`MARGIN`]), within [`MIN_PASSES`]..=[`PASSES`]. The floor is there because a batch needing
//! more than the recent ones is the costly miss (its unsettled images go to the CPU), and a
//! launch past the last change costs only a few microseconds. A batch larger than every recent
//! one launches all [`PASSES`]. A batch that has not settled by its last pass has its unsettled
//! images flagged (the kernels check it; they are decoded on the CPU, to the same bytes), and is
//! remembered as having needed all [`PASSES`].
//!
//! The count only decides how soon an unsettled image is handed to the CPU; no output byte
//! depends on it.

use super::entropy_batch::PASSES;

/// Batches remembered.
pub const WINDOW: usize = 32;
/// Fewest passes launched. Batches of ImageNet-sized files need 2-13, with a tail: with a floor
/// of 8, a few batches a run needed more than the recent ones and a half, and their unsettled
/// images, decoded on the CPU, cost DINOv2's views 4-8% on an H100; with 24, no more images
/// went to the CPU than with all [`PASSES`].
pub const MIN_PASSES: u32 = 24;
/// Fewest passes launched beyond the most a recent batch needed.
pub const MARGIN: u32 = 4;

/// A batch's size class: the bit length of its longest restart interval's subsequence count.
pub fn size_class(longest_interval_subs: u32) -> u8 {
    (u32::BITS - longest_interval_subs.leading_zeros()) as u8
}

/// What a batch's passes did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Settled {
    /// Pass `n - 1` changed nothing: the batch needed `n` passes (the last to confirm it).
    After(u32),
    /// Every pass launched changed something: some images were flagged.
    Not,
}

impl Settled {
    /// The outcome of a batch from its per-pass flags (`changed[p]` nonzero when pass `p`
    /// changed an exit), `changed.len()` being the passes launched.
    pub fn from_flags(changed: &[u32]) -> Settled {
        match changed.iter().skip(1).position(|&c| c == 0) {
            Some(p) => Settled::After(p as u32 + 2),
            None => Settled::Not,
        }
    }
}

/// The passes to launch for the next batch, from the last [`WINDOW`] batches' size classes and
/// outcomes.
#[derive(Clone, Debug)]
pub struct SyncPasses {
    /// (size class, passes needed) of each recent batch ([`PASSES`] for one that did not
    /// settle); the first `seen` are filled.
    recent: [(u8, u32); WINDOW],
    next: usize,
    seen: usize,
    /// Fewest passes launched.
    floor: u32,
}

impl Default for SyncPasses {
    fn default() -> SyncPasses {
        SyncPasses::new()
    }
}

impl SyncPasses {
    /// No batch seen: the first launches all [`PASSES`]; never fewer than [`MIN_PASSES`].
    pub fn new() -> SyncPasses {
        SyncPasses::with_floor(MIN_PASSES)
    }

    /// As [`SyncPasses::new`], launching never fewer than `floor` passes (at most [`PASSES`]).
    pub fn with_floor(floor: u32) -> SyncPasses {
        SyncPasses {
            recent: [(0, 0); WINDOW],
            next: 0,
            seen: 0,
            floor: floor.min(PASSES),
        }
    }

    /// Passes to launch for a batch of size class `class`.
    pub fn launch(&self, class: u8) -> u32 {
        let most = self.recent[..self.seen]
            .iter()
            .filter(|(c, _)| *c >= class)
            .map(|&(_, needed)| needed)
            .max();
        match most {
            Some(m) => (m + (m / 2).max(MARGIN)).clamp(self.floor, PASSES),
            None => PASSES,
        }
    }

    /// Records the outcome of a batch of size class `class`.
    pub fn record(&mut self, class: u8, outcome: Settled) {
        let needed = match outcome {
            Settled::After(n) => n.min(PASSES),
            Settled::Not => PASSES,
        };
        self.recent[self.next] = (class, needed);
        self.next = (self.next + 1) % WINDOW;
        self.seen = (self.seen + 1).min(WINDOW);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_outcome_is_the_first_pass_that_changed_nothing() {
        assert_eq!(Settled::from_flags(&[1, 1, 1, 0, 0]), Settled::After(4));
        assert_eq!(Settled::from_flags(&[1, 0, 0]), Settled::After(2));
        // Pass 0 always "changes"; a zero there says nothing.
        assert_eq!(Settled::from_flags(&[0, 1, 0]), Settled::After(3));
        assert_eq!(Settled::from_flags(&[1, 1, 1]), Settled::Not);
        assert_eq!(Settled::from_flags(&[1]), Settled::Not);
        assert_eq!(Settled::from_flags(&[]), Settled::Not);
    }

    #[test]
    fn size_classes_are_bit_lengths() {
        assert_eq!(size_class(0), 0);
        assert_eq!(size_class(1), 1);
        assert_eq!(size_class(900), 10);
        assert_eq!(size_class(1023), 10);
        assert_eq!(size_class(1024), 11);
        assert_eq!(size_class(u32::MAX), 32);
    }

    #[test]
    fn the_first_batch_launches_every_pass() {
        assert_eq!(SyncPasses::new().launch(0), PASSES);
        assert_eq!(SyncPasses::new().launch(10), PASSES);
    }

    #[test]
    fn never_fewer_than_the_floor() {
        let mut p = SyncPasses::new();
        p.record(10, Settled::After(10));
        assert_eq!(p.launch(10), MIN_PASSES);
        p.record(10, Settled::After(20));
        assert_eq!(p.launch(10), 30);
        let mut low = SyncPasses::with_floor(8);
        low.record(10, Settled::After(2));
        assert_eq!(low.launch(10), 8);
        assert_eq!(SyncPasses::with_floor(100).launch(0), PASSES);
        let mut high = SyncPasses::with_floor(100);
        high.record(10, Settled::After(2));
        assert_eq!(high.launch(10), PASSES);
    }

    // The tests below take a floor of 8, under the margins they check.
    #[test]
    fn launches_the_most_recent_need_and_half_again() {
        let mut p = SyncPasses::with_floor(8);
        p.record(10, Settled::After(10));
        assert_eq!(p.launch(10), 15);
        p.record(10, Settled::After(6));
        assert_eq!(p.launch(10), 15, "the most of the window counts");
        p.record(10, Settled::After(26));
        assert_eq!(p.launch(10), 39);
        let mut small = SyncPasses::with_floor(8);
        small.record(4, Settled::After(2));
        assert_eq!(small.launch(4), 8);
        small.record(4, Settled::After(5));
        assert_eq!(small.launch(4), 5 + MARGIN);
        small.record(4, Settled::After(60));
        assert_eq!(small.launch(4), PASSES);
    }

    #[test]
    fn a_batch_larger_than_every_recent_one_launches_every_pass() {
        let mut p = SyncPasses::with_floor(8);
        p.record(10, Settled::After(10));
        assert_eq!(p.launch(11), PASSES);
        // Smaller batches go by the larger ones' needs.
        assert_eq!(p.launch(9), 15);
        p.record(13, Settled::After(26));
        assert_eq!(p.launch(11), 39);
        assert_eq!(p.launch(13), 39);
        assert_eq!(p.launch(10), 39);
        assert_eq!(p.launch(14), PASSES);
    }

    #[test]
    fn a_batch_that_did_not_settle_launches_every_pass_until_forgotten() {
        let mut p = SyncPasses::with_floor(8);
        p.record(10, Settled::After(8));
        p.record(10, Settled::Not);
        for _ in 0..WINDOW - 1 {
            p.record(10, Settled::After(8));
            assert_eq!(p.launch(10), PASSES);
        }
        p.record(10, Settled::After(8));
        assert_eq!(p.launch(10), 12);
    }

    #[test]
    fn the_window_forgets_old_batches() {
        let mut p = SyncPasses::with_floor(8);
        p.record(10, Settled::After(30));
        for _ in 0..WINDOW - 1 {
            p.record(10, Settled::After(10));
        }
        assert_eq!(p.launch(10), 45);
        p.record(10, Settled::After(10));
        assert_eq!(p.launch(10), 15);
    }
}
