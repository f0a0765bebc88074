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

/// Pixel buffers lent to the lane's threads and taken back after each image, so the memory of
/// large images is reused instead of freed and allocated again: glibc keeps what one thread
/// frees in that thread's arena, where no other thread can use it, and resident memory would
/// grow by a large image per thread. What the pool keeps, with what it has lent, stays within
/// its limit ([`BufferPool::new`]), or what it keeps free does ([`BufferPool::free_within`]).
#[derive(Debug)]
pub(crate) struct BufferPool {
    keep: u64,
    /// Whether lent buffers count against `keep`.
    counts_lent: bool,
    state: Mutex<PoolState>,
}

#[derive(Debug, Default)]
struct PoolState {
    free: Vec<Vec<u8>>,
    free_bytes: u64,
    lent_bytes: u64,
}

impl BufferPool {
    /// A pool keeping at most `keep` bytes, free and lent together.
    pub fn new(keep: u64) -> BufferPool {
        BufferPool {
            keep,
            counts_lent: true,
            state: Mutex::new(PoolState::default()),
        }
    }

    /// A pool keeping at most `keep` bytes free, for buffers that may grow, change hands or
    /// be dropped while lent (what is lent is not counted; `give`'s `lent_capacity` is
    /// ignored).
    pub fn free_within(keep: u64) -> BufferPool {
        BufferPool {
            counts_lent: false,
            ..BufferPool::new(keep)
        }
    }

    /// A buffer of at least `capacity` bytes when the pool has one (the smallest that fits),
    /// else a new one; its contents are stale.
    pub fn take(&self, capacity: usize) -> Vec<u8> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let fit = state
            .free
            .iter()
            .enumerate()
            .filter(|(_, b)| b.capacity() >= capacity)
            .min_by_key(|(_, b)| b.capacity())
            .map(|(i, _)| i);
        let buffer = match fit {
            Some(i) => {
                let buffer = state.free.swap_remove(i);
                state.free_bytes -= buffer.capacity() as u64;
                buffer
            }
            None => Vec::new(),
        };
        if self.counts_lent {
            state.lent_bytes += buffer.capacity() as u64;
        }
        buffer
    }

    /// Takes a buffer back, keeping it for reuse while the pool is under its limit.
    pub fn give(&self, buffer: Vec<u8>, lent_capacity: usize) {
        let capacity = buffer.capacity() as u64;
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.lent_bytes = state.lent_bytes.saturating_sub(lent_capacity as u64);
        if capacity > 0 && state.free_bytes + state.lent_bytes + capacity <= self.keep {
            state.free_bytes += capacity;
            state.free.push(buffer);
        }
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
    fn the_pool_reuses_buffers_within_its_limit() {
        let pool = BufferPool::new(1000);
        let mut a = pool.take(100);
        a.resize(100, 1);
        let cap = a.capacity();
        pool.give(a, 0);
        let b = pool.take(50);
        assert_eq!(b.capacity(), cap, "the free buffer is reused");
        pool.give(b, cap);
        let mut big = pool.take(2000);
        big.resize(2000, 0);
        pool.give(big, 0);
        let c = pool.take(1500);
        assert_eq!(c.capacity(), 0, "a buffer over the limit is not kept");
    }

    #[test]
    fn a_pool_free_within_its_limit_counts_only_what_it_keeps() {
        let pool = BufferPool::free_within(1000);
        // Lent and never given back: nothing is counted against the limit.
        let mut lost = pool.take(600);
        lost.resize(600, 0);
        let mut a = pool.take(700);
        a.resize(700, 1);
        let cap = a.capacity();
        pool.give(a, 0);
        assert_eq!(
            pool.take(10).capacity(),
            cap,
            "kept although 600 bytes were never given back"
        );
        let mut b = Vec::with_capacity(400);
        b.push(0u8);
        let mut c = Vec::with_capacity(700);
        c.push(0u8);
        pool.give(b, 0);
        pool.give(c, 0);
        assert_eq!(
            pool.take(1).capacity(),
            400,
            "the second one was over the limit"
        );
        assert_eq!(pool.take(1).capacity(), 0, "and not kept");
        drop(lost);
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
