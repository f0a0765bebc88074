//! The decode memory budget: how many bytes the lane's threads together may hold for images in
//! flight (their encoded bytes and decoded pixels), whatever the number of threads. An image
//! reserves what it will need before its bytes are read; a thread waits while the others hold
//! too much, and an image larger than the whole budget runs alone.

use std::sync::{Condvar, Mutex};

/// Bytes in flight, shared by the lane's threads.
#[derive(Debug)]
pub(crate) struct MemoryBudget {
    limit: u64,
    used: Mutex<u64>,
    released: Condvar,
}

/// Bytes held by one image until it is done.
#[derive(Debug)]
pub(crate) struct Reservation<'a> {
    budget: &'a MemoryBudget,
    bytes: u64,
}

impl MemoryBudget {
    /// A budget of `limit` bytes.
    pub fn new(limit: u64) -> MemoryBudget {
        MemoryBudget {
            limit,
            used: Mutex::new(0),
            released: Condvar::new(),
        }
    }

    /// Reserves `bytes`, waiting while other images hold so much that they would not fit; an
    /// image larger than the whole budget waits until it is alone.
    pub fn reserve(&self, bytes: u64) -> Reservation<'_> {
        // Nothing panics while the lock is held, so a poisoned lock still counts right.
        let mut used = self.used.lock().unwrap_or_else(|e| e.into_inner());
        while *used > 0 && used.saturating_add(bytes) > self.limit {
            used = self.released.wait(used).unwrap_or_else(|e| e.into_inner());
        }
        *used = used.saturating_add(bytes);
        Reservation {
            budget: self,
            bytes,
        }
    }

    /// Bytes reserved right now.
    #[cfg(test)]
    fn used(&self) -> u64 {
        *self.used.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        let mut used = self.budget.used.lock().unwrap_or_else(|e| e.into_inner());
        *used = used.saturating_sub(self.bytes);
        self.budget.released.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    #[test]
    fn threads_never_hold_more_than_the_budget() {
        let budget = Arc::new(MemoryBudget::new(100));
        let peak = Arc::new(AtomicU64::new(0));
        let handles: Vec<_> = (0..8)
            .map(|t| {
                let (budget, peak) = (budget.clone(), peak.clone());
                std::thread::spawn(move || {
                    for i in 0..50 {
                        let bytes = 10 + (t * 7 + i * 13) % 60;
                        let _held = budget.reserve(bytes);
                        peak.fetch_max(budget.used(), Ordering::SeqCst);
                        std::thread::yield_now();
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().expect("thread");
        }
        assert!(peak.load(Ordering::SeqCst) <= 100);
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn an_image_larger_than_the_budget_runs_alone() {
        let budget = MemoryBudget::new(10);
        let big = budget.reserve(50);
        assert_eq!(budget.used(), 50);
        drop(big);
        let _small = budget.reserve(4);
        assert_eq!(budget.used(), 4);
    }
}
