//! A value made on a thread of its own while the pipeline goes on: the GPU lane, and its JPEG
//! engines, whose opening takes a second or two. The value is taken once it is ready; dropped
//! before that, the thread is told to give up (it checks its flag between its steps) and waited
//! for, so that nothing it holds outlives its owner and no nvJPEG or CUDA call is under way on it
//! when the process exits (the CUDA runtime's teardown at exit deadlocks with a call in flight on
//! another thread).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, TryRecvError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A value being made on a thread of its own.
pub(crate) struct Background<T> {
    receiver: Receiver<T>,
    thread: Option<JoinHandle<()>>,
    /// Raised when dropped: the thread gives up at its next check.
    cancel: Arc<AtomicBool>,
    started: Instant,
    /// The value for a thread that ended without sending one (it panicked).
    stopped: fn() -> T,
}

impl<T: Send + 'static> Background<T> {
    /// Makes the value `make` makes on a thread named `name`; `make` may give up once its flag
    /// is raised. `stopped` stands for a value the thread never sent.
    pub fn start(
        name: &str,
        stopped: fn() -> T,
        make: impl FnOnce(&AtomicBool) -> T + Send + 'static,
    ) -> std::io::Result<Background<T>> {
        let (sender, receiver) = mpsc::channel();
        let cancel = Arc::new(AtomicBool::new(false));
        let flag = cancel.clone();
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                // A value made after its owner is gone is dropped here, on this thread.
                let _ = sender.send(make(&flag));
            })?;
        Ok(Background {
            receiver,
            thread: Some(thread),
            cancel,
            started: Instant::now(),
            stopped,
        })
    }

    /// The value, if it is ready.
    pub fn try_take(&mut self) -> Option<T> {
        match self.receiver.try_recv() {
            Ok(value) => Some(value),
            Err(TryRecvError::Empty) => None,
            Err(TryRecvError::Disconnected) => Some((self.stopped)()),
        }
    }

    /// The value, waiting for it.
    pub fn wait(&mut self) -> T {
        self.receiver.recv().unwrap_or_else(|_| (self.stopped)())
    }

    /// How long ago the making began.
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }
}

impl<T> Drop for Background<T> {
    fn drop(&mut self) {
        self.cancel.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stopped() -> Result<u32, String> {
        Err("stopped".into())
    }

    #[test]
    fn the_value_is_taken_once_ready_and_waited_for() {
        let (go, gate) = mpsc::channel::<()>();
        let mut made = Background::start("test-make", stopped, move |_| {
            let _ = gate.recv();
            Ok(7)
        })
        .expect("a thread");
        assert_eq!(made.try_take(), None);
        go.send(()).expect("the thread waits");
        assert_eq!(made.wait(), Ok(7));
        let mut quick = Background::start("test-make", stopped, |_| Ok(3)).expect("a thread");
        std::thread::sleep(Duration::from_millis(50));
        // Polled until the thread has sent it (on a loaded machine it may not have run yet).
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let value = loop {
            if let Some(value) = quick.try_take() {
                break value;
            }
            assert!(std::time::Instant::now() < deadline, "the value never came");
            std::thread::sleep(Duration::from_millis(1));
        };
        assert_eq!(value, Ok(3));
        assert!(quick.elapsed() >= Duration::from_millis(50));
    }

    #[test]
    fn a_thread_that_panics_gives_the_stopped_value() {
        let mut waited = Background::start("test-panic", stopped, |_| -> Result<u32, String> {
            panic!("deliberately")
        })
        .expect("a thread");
        assert_eq!(waited.wait(), stopped());
        let mut polled = Background::start("test-panic", stopped, |_| -> Result<u32, String> {
            panic!("deliberately")
        })
        .expect("a thread");
        let polled_value = loop {
            if let Some(value) = polled.try_take() {
                break value;
            }
            std::thread::sleep(Duration::from_millis(1));
        };
        assert_eq!(polled_value, stopped());
    }

    #[test]
    fn dropping_it_raises_the_flag_and_waits_for_the_thread() {
        let gave_up = Arc::new(AtomicBool::new(false));
        let seen = gave_up.clone();
        let (started, running) = mpsc::channel::<()>();
        let making = Background::start("test-cancel", stopped, move |cancel| {
            let _ = started.send(());
            while !cancel.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(1));
            }
            seen.store(true, Ordering::Relaxed);
            Err("given up".into())
        })
        .expect("a thread");
        running.recv().expect("the thread started");
        drop(making);
        // The drop returned only once the thread had seen the flag and ended.
        assert!(gave_up.load(Ordering::Relaxed));
    }
}
