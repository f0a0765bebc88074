//! Decoder sets that join a lane after it opened: the JPEG engines' (a second or two to open)
//! and the assisted path's after its first (most of their opening is page-locking their
//! staging), each made on a thread of their own while the lane runs and taken in once ready.

use std::time::Duration;

use super::decoders::DecoderSet;
use super::error::GpuLaneError;
use crate::background::Background;

/// Decoder sets being made on a thread of their own.
pub(super) type SetsComing = Background<Result<Vec<DecoderSet>, GpuLaneError>>;

/// Where a lane's later decoder sets stand.
pub(super) enum Joining {
    /// Nothing to wait for: opened with the lane.
    Settled,
    /// Opening on a thread of their own.
    Coming(SetsComing),
    /// Taken in (how, in words).
    Joined(String),
    /// Not opened, or could not open or start (why): the lane goes on without them.
    Off(String),
}

impl Joining {
    /// Takes the sets in if they have come (with `wait`, waiting for them): `join` starts their
    /// threads and says how they joined, given how long they took; sets that could not open or
    /// start leave the lane without them. Whether anything was taken in (or found off) now.
    pub fn settle(
        &mut self,
        wait: bool,
        join: impl FnOnce(Vec<DecoderSet>, Duration) -> Result<String, GpuLaneError>,
    ) -> bool {
        let Joining::Coming(coming) = self else {
            return false;
        };
        let opened = match wait {
            true => Some(coming.wait()),
            false => coming.try_take(),
        };
        let Some(opened) = opened else {
            return false;
        };
        let waited = coming.elapsed();
        *self = match opened.and_then(|sets| join(sets, waited)) {
            Ok(note) => Joining::Joined(note),
            Err(reason) => Joining::Off(reason.to_string()),
        };
        true
    }

    /// What the lane's description adds about the sets, if anything: `coming` while they open,
    /// `off` made of the reason when they are off.
    pub fn note(&self, coming: &str, off: impl FnOnce(&str) -> String) -> Option<String> {
        match self {
            Joining::Settled => None,
            Joining::Coming(_) => Some(coming.into()),
            Joining::Joined(note) => Some(note.clone()),
            Joining::Off(reason) => Some(off(reason)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    fn joined(sets: Vec<DecoderSet>, waited: Duration) -> Result<String, GpuLaneError> {
        Ok(format!(
            "{} sets after {} ms",
            sets.len(),
            waited.as_millis()
        ))
    }

    fn stopped() -> Result<Vec<DecoderSet>, GpuLaneError> {
        Err(GpuLaneError::Opening("stopped".into()))
    }

    fn note(joining: &Joining) -> Option<String> {
        joining.note("coming", |reason| format!("off: {reason}"))
    }

    /// Sets still opening are not taken in by a poll, are once they come, and only once.
    #[test]
    fn sets_are_taken_in_once_they_come() {
        let (release, held) = mpsc::channel::<()>();
        let coming = Background::start("joining-test", stopped, move |_| {
            let _ = held.recv();
            Ok(Vec::new())
        })
        .expect("a thread");
        let mut joining = Joining::Coming(coming);
        assert!(!joining.settle(false, joined));
        assert_eq!(note(&joining).as_deref(), Some("coming"));
        release.send(()).expect("the thread waits");
        assert!(joining.settle(true, joined));
        let said = note(&joining).expect("a note");
        assert!(said.starts_with("0 sets after "), "{said}");
        // Settled: nothing more to take in, waiting or not.
        assert!(!joining.settle(true, joined));
        assert!(!joining.settle(false, joined));
        assert_eq!(note(&joining), Some(said));
    }

    /// Sets that could not open, or whose joining fails, leave the lane without them, saying why.
    #[test]
    fn sets_that_fail_are_off_with_the_reason() {
        let failing = Background::start("joining-test", stopped, |_| {
            Err(GpuLaneError::Opening("no memory".into()))
        })
        .expect("a thread");
        let mut joining = Joining::Coming(failing);
        assert!(joining.settle(true, joined));
        let said = note(&joining).expect("a note");
        assert!(
            said.starts_with("off: ") && said.contains("no memory"),
            "{said}"
        );

        let opened =
            Background::start("joining-test", stopped, |_| Ok(Vec::new())).expect("a thread");
        let mut joining = Joining::Coming(opened);
        let refused = |_: Vec<DecoderSet>, _: Duration| -> Result<String, GpuLaneError> {
            Err(GpuLaneError::Opening("no thread".into()))
        };
        assert!(joining.settle(true, refused));
        assert!(matches!(&joining, Joining::Off(reason) if reason.contains("no thread")));

        let mut settled = Joining::Settled;
        assert!(!settled.settle(true, joined));
        assert_eq!(note(&settled), None);
    }
}
