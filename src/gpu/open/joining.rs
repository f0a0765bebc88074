//! Decoder sets that join a lane after it opened: the JPEG engines' (a second or two to open)
//! and the assisted path's after its first (most of their opening is page-locking their
//! staging), each made on a thread of their own while the lane runs and taken in as soon as it
//! is ready, one set at a time: a lane's first set goes to work before its last is made (the
//! engines' first set 0.1-0.9 s before the last on the 4-H200 machine, where four processes
//! opening theirs at once took 3-4 s to make each set's decoder states, against 0.7-1 s alone).

use std::sync::atomic::AtomicBool;
use std::sync::mpsc::{self, Receiver, Sender, TryRecvError};
use std::time::Duration;

use crate::background::Background;
use crate::gpu::error::GpuLaneError;

/// Where each set being made is sent: the set, or why it could not open.
pub(in crate::gpu) type SetSender<S> = Sender<Result<S, GpuLaneError>>;

/// Decoder sets being made on a thread of their own, each sent as soon as it is ready, and what
/// has been taken in of them.
pub(in crate::gpu) struct SetsComing<S> {
    arriving: Receiver<Result<S, GpuLaneError>>,
    arrivals: Arrivals,
    /// The thread making them: told to give up and waited for when dropped (sets it makes after
    /// that are dropped on it).
    opening: Background<()>,
}

impl<S: Send + 'static> SetsComing<S> {
    /// Makes `expected` sets on a thread named `name`: `make` sends each to the sender as it is
    /// ready (or why it could not open), and may give up once its flag is raised.
    pub fn start(
        name: &str,
        expected: usize,
        make: impl FnOnce(&SetSender<S>, &AtomicBool) + Send + 'static,
    ) -> Result<SetsComing<S>, GpuLaneError> {
        let (sender, arriving) = mpsc::channel();
        let opening = Background::start(name, || (), move |cancel| make(&sender, cancel))
            .map_err(GpuLaneError::Threads)?;
        Ok(SetsComing {
            arriving,
            arrivals: Arrivals {
                joined: 0,
                expected,
                first: None,
                said: None,
            },
            opening,
        })
    }

    /// The sets (or failures) that have arrived, waiting for at least one with `wait`; a thread
    /// that ended before sending all of them counts as a failure.
    fn arrived(&mut self, wait: bool) -> Vec<Result<S, GpuLaneError>> {
        let mut arrived = Vec::new();
        if wait {
            arrived.push(self.arriving.recv().unwrap_or_else(|_| Err(stopped())));
        }
        loop {
            match self.arriving.try_recv() {
                Ok(set) => arrived.push(set),
                Err(TryRecvError::Empty) => return arrived,
                Err(TryRecvError::Disconnected) => {
                    if arrived.is_empty() {
                        arrived.push(Err(stopped()));
                    }
                    return arrived;
                }
            }
        }
    }
}

/// Why a set never came from a thread that stopped before sending it.
fn stopped() -> GpuLaneError {
    GpuLaneError::Opening("the thread opening the decoders stopped".into())
}

/// What a lane has taken in of sets still coming.
pub(in crate::gpu) struct Arrivals {
    /// Sets taken in so far.
    pub joined: usize,
    /// Sets being made in all.
    pub expected: usize,
    /// How long after the opening began the first set was taken in.
    pub first: Option<Duration>,
    /// How the sets taken in so far joined, in words.
    said: Option<String>,
}

/// Where a lane's later decoder sets stand.
pub(in crate::gpu) enum Joining<S> {
    /// Nothing to wait for: opened with the lane.
    Settled,
    /// Opening on a thread of their own, those taken in so far at work.
    Coming(SetsComing<S>),
    /// Every set taken in (how, in words).
    Joined(String),
    /// Not opened, or none could open or start (why): the lane goes on without them.
    Off(String),
}

impl<S: Send + 'static> Joining<S> {
    /// Takes in the sets that have come (with `wait`, waiting for all of them): `join` starts
    /// their threads and says, in words, how the sets taken in so far joined (given how many,
    /// of how many, and when the first did). A set that could not open or start leaves the lane
    /// without it and without those still coming (with those already at work, if any). Whether
    /// anything was taken in (or found off) now.
    pub fn settle(
        &mut self,
        wait: bool,
        mut join: impl FnMut(Vec<S>, &Arrivals, Duration) -> Result<String, GpuLaneError>,
    ) -> bool {
        let mut changed = false;
        loop {
            let Joining::Coming(coming) = self else {
                return changed;
            };
            let pending = wait && coming.arrivals.joined < coming.arrivals.expected;
            let arrived = coming.arrived(pending);
            if arrived.is_empty() {
                return changed;
            }
            changed = true;
            let waited = coming.opening.elapsed();
            let arrivals = &mut coming.arrivals;
            let (sets, failed): (Vec<_>, Vec<_>) = arrived.into_iter().partition(|set| set.is_ok());
            let sets: Vec<S> = sets.into_iter().flatten().collect();
            let mut failure = failed.into_iter().find_map(Result::err);
            if !sets.is_empty() {
                let count = sets.len();
                arrivals.first.get_or_insert(waited);
                arrivals.joined += count;
                match join(sets, arrivals, waited) {
                    Ok(said) => arrivals.said = Some(said),
                    Err(reason) => {
                        arrivals.joined -= count;
                        failure = failure.or(Some(reason));
                    }
                }
            }
            *self = match (failure, arrivals.said.take()) {
                (Some(reason), None) => Joining::Off(reason.to_string()),
                (Some(reason), Some(said)) => Joining::Joined(format!(
                    "{said}; the other decoders could not open ({reason})"
                )),
                (None, Some(said)) if arrivals.joined >= arrivals.expected => Joining::Joined(said),
                (None, said) => {
                    arrivals.said = said;
                    continue;
                }
            };
            return true;
        }
    }

    /// What the lane's description adds about the sets, if anything: `coming` while they open
    /// (with how many are at work once some are), `off` made of the reason when they are off.
    pub fn note(&self, coming: &str, off: impl FnOnce(&str) -> String) -> Option<String> {
        match self {
            Joining::Settled => None,
            Joining::Coming(sets) if sets.arrivals.joined == 0 => Some(coming.into()),
            Joining::Coming(sets) => Some(format!(
                "{coming} ({} of {} at work)",
                sets.arrivals.joined, sets.arrivals.expected
            )),
            Joining::Joined(note) => Some(note.clone()),
            Joining::Off(reason) => Some(off(reason)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Joins sets standing for decoder sets (numbers), saying how many of how many.
    fn joined(sets: Vec<u32>, arrivals: &Arrivals, _: Duration) -> Result<String, GpuLaneError> {
        Ok(format!(
            "{sets:?}: {} of {} joined",
            arrivals.joined, arrivals.expected
        ))
    }

    fn note(joining: &Joining<u32>) -> Option<String> {
        joining.note("coming", |reason| format!("off: {reason}"))
    }

    /// Sets are taken in one at a time as they come, the first at work while the second is
    /// still being made, and each only once.
    #[test]
    fn sets_are_taken_in_one_at_a_time_as_they_come() {
        let (release, held) = mpsc::channel::<()>();
        let (sent, first_sent) = mpsc::channel::<()>();
        let coming = SetsComing::start("joining-test", 2, move |sets, _| {
            let _ = sets.send(Ok(1));
            let _ = sent.send(());
            let _ = held.recv();
            let _ = sets.send(Ok(2));
        })
        .expect("a thread");
        let mut joining = Joining::Coming(coming);
        first_sent.recv().expect("the first set is sent");
        assert!(joining.settle(false, joined));
        assert_eq!(note(&joining).as_deref(), Some("coming (1 of 2 at work)"));
        assert!(!joining.settle(false, joined), "nothing more has come");
        release.send(()).expect("the thread waits");
        assert!(joining.settle(true, joined));
        assert_eq!(note(&joining).as_deref(), Some("[2]: 2 of 2 joined"));
        // Settled: nothing more to take in, waiting or not.
        assert!(!joining.settle(true, joined));
        assert!(!joining.settle(false, joined));
    }

    /// Waiting takes in every set, however many come before the wait.
    #[test]
    fn waiting_takes_in_every_set() {
        let said = note_once_settled(3, |sets, _| {
            for set in 1..=3 {
                let _ = sets.send(Ok(set));
            }
        });
        assert!(said.ends_with(": 3 of 3 joined"), "{said}");
    }

    /// The note of sets that `make` sends, once every one of them was waited for.
    fn note_once_settled(
        expected: usize,
        make: impl FnOnce(&SetSender<u32>, &AtomicBool) + Send + 'static,
    ) -> String {
        let coming = SetsComing::start("joining-test", expected, make).expect("a thread");
        let mut joining = Joining::Coming(coming);
        assert!(joining.settle(true, joined));
        note(&joining).expect("a note")
    }

    /// Sets that could not open, or whose joining fails, leave the lane without them, saying why;
    /// those already at work stay.
    #[test]
    fn sets_that_fail_are_off_with_the_reason() {
        let said = note_once_settled(2, |sets, _| {
            let _ = sets.send(Err(GpuLaneError::Opening("no memory".into())));
        });
        assert!(
            said.starts_with("off: ") && said.contains("no memory"),
            "{said}"
        );
        let said = note_once_settled(2, |sets, _| {
            let _ = sets.send(Ok(1));
            let _ = sets.send(Err(GpuLaneError::Opening("no state".into())));
        });
        assert!(
            said.starts_with("[1]: 1 of 2 joined; the other decoders could not open")
                && said.contains("no state"),
            "{said}"
        );
        // A thread that ends without sending every set.
        let said = note_once_settled(2, |sets, _| {
            let _ = sets.send(Ok(1));
        });
        assert!(
            said.contains("could not open") && said.contains("stopped"),
            "{said}"
        );

        let opened = SetsComing::start("joining-test", 1, |sets, _| {
            let _ = sets.send(Ok(1));
        })
        .expect("a thread");
        let mut joining = Joining::Coming(opened);
        let refused = |_: Vec<u32>, _: &Arrivals, _: Duration| -> Result<String, GpuLaneError> {
            Err(GpuLaneError::Opening("no thread".into()))
        };
        assert!(joining.settle(true, refused));
        assert!(matches!(&joining, Joining::Off(reason) if reason.contains("no thread")));

        let mut settled = Joining::<u32>::Settled;
        assert!(!settled.settle(true, joined));
        assert_eq!(note(&settled), None);
    }
}
