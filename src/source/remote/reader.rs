//! The reader: fetches a source's objects (shards, or images) ahead of the decoders, in the
//! order the epoch needs them, within a byte budget, and hands the decoders their bytes.
//!
//! When an epoch begins, its positions are turned into a plan: each object in the order of the
//! first position that needs it, with the last position that needs it. A driver task starts
//! fetches down the plan while the bytes held (read and not yet released, plus those in flight)
//! stay within [`RemoteOptions::read_budget`], and at most [`RemoteOptions::max_requests`]
//! objects are in flight; a shard is read in ranges of [`RemoteOptions::request_bytes`], all at
//! once, under the same request limit. A decoder asking for an object that is not read yet
//! waits for it; one the plan has not reached is fetched at once, whatever the budget (so a
//! lane working ahead never waits on the budget). Once every position that needs an object is
//! in a batch, the object is released: kept, idle, until its room is needed, so an image the
//! GPU lane hands back to the CPU lane is not fetched twice. An object read whole is also
//! written to the cache folder, if any, and read from there by later epochs.
//!
//! Objects that cannot be read after the retries fail their samples with a reason naming the
//! object. When one has failed so, the store is taken to be down and the next reads try once
//! more at most, so a dead server fails the rest of an epoch in seconds, not once per retry
//! timeout; the first read that succeeds ends that.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap, HashSet, VecDeque};
use std::ops::Range;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, Weak};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{GetOptions, GetRange, ObjectStoreExt};
use tokio::sync::{Notify, Semaphore};

use super::cache::{Cache, Kind};
use super::store::{retrying, Clients, Failure, Health, Retries, Tries};
use super::RemoteOptions;
use crate::source::ReadReport;

/// What an object's reads check it against: its size and ETag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Meta {
    pub size: u64,
    pub etag: Option<String>,
}

/// What the budget counts for an object of unknown size until it is read.
const UNSIZED_ESTIMATE: u64 = 1 << 20;

/// One object a source reads: a shard, or an image.
#[derive(Debug, Clone)]
pub(super) struct Object {
    /// Index of its store's clients.
    pub store: usize,
    pub path: ObjectPath,
    pub url: String,
    /// The size and ETag the listing gave; `None` for an object given by its URL, which is not
    /// asked for them up front.
    pub listed: Option<Meta>,
    /// The size and ETag its first read found, for an object not listed.
    pub learned: OnceLock<Meta>,
}

impl Object {
    /// An object the listing gave.
    pub fn listed(store: usize, path: ObjectPath, url: String, meta: Meta) -> Object {
        Object {
            store,
            path,
            url,
            listed: Some(meta),
            learned: OnceLock::new(),
        }
    }

    /// An object given by its URL: its size and ETag are learned when it is first read.
    pub fn unlisted(store: usize, path: ObjectPath, url: String) -> Object {
        Object {
            store,
            path,
            url,
            listed: None,
            learned: OnceLock::new(),
        }
    }

    /// Its size and ETag, once known.
    pub fn meta(&self) -> Option<&Meta> {
        self.listed.as_ref().or_else(|| self.learned.get())
    }

    /// Its size, or what the budget counts for it before it is known.
    pub fn size_or_estimate(&self) -> u64 {
        self.meta().map_or(UNSIZED_ESTIMATE, |m| m.size)
    }

    fn learn(&self, meta: &object_store::ObjectMeta) -> Meta {
        if let Some(known) = self.meta() {
            return known.clone();
        }
        let meta = Meta {
            size: meta.size,
            etag: meta.e_tag.clone(),
        };
        let _ = self.learned.set(meta.clone());
        meta
    }
}

/// What every reader of a source shares: the clients, the objects, the cache and the limits.
/// Holds no runtime, so the tasks that hold it cannot be the ones to drop the runtime.
#[derive(Debug)]
pub(super) struct Shared {
    pub handle: tokio::runtime::Handle,
    pub stores: Vec<Clients>,
    pub objects: Vec<Object>,
    pub cache: Option<Cache>,
    pub options: RemoteOptions,
    /// One permit a GET in flight.
    pub requests: Semaphore,
    /// Whether each store answers (see [`Health`]), by the index of its clients.
    pub health: Vec<Health>,
}

/// An object's bytes, read.
#[derive(Debug, Clone)]
pub(super) enum Data {
    Memory(Arc<Vec<u8>>),
    /// A whole copy in the cache folder.
    File(PathBuf),
}

/// What one fetch did.
pub(super) struct Fetched {
    pub data: Result<Data, Failure>,
    pub requests: u64,
    pub bytes: u64,
    pub from_cache: bool,
    /// Copies in the cache folder found damaged (and removed) on the way.
    pub cache_rejected: u64,
}

impl Fetched {
    /// Adds this fetch to `report`.
    pub fn count(&self, report: &mut ReadReport, size: u64) {
        report.requests += self.requests;
        report.bytes += self.bytes;
        report.cache_rejected += self.cache_rejected;
        match (&self.data, self.from_cache) {
            (Err(_), _) => report.failed += 1,
            (Ok(_), true) => {
                report.cache_hits += 1;
                report.cache_bytes += size;
            }
            (Ok(_), false) => report.fetched += 1,
        }
    }
}

/// When a fetched object is written into the cache folder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum CacheWrite {
    /// Behind the decoders, who have the bytes already.
    Behind,
    /// Before the fetch counts as done (a shard read to index it, for the first epoch to find).
    Before,
}

/// Reads object `unit` whole: from the cache when it holds a sound copy, else from the store in
/// ranges of `request_bytes` fetched together (and then into the cache, when it has room). An
/// object given by its URL is asked for its size and ETag first when there is a cache to look
/// in, else read whole in one request that tells them.
pub(super) async fn fetch(shared: &Arc<Shared>, unit: usize, write: CacheWrite) -> Fetched {
    let object = &shared.objects[unit];
    let mut fetched = Fetched {
        data: Err(Failure::local(std::io::ErrorKind::Other, String::new())),
        requests: 0,
        bytes: 0,
        from_cache: false,
        cache_rejected: 0,
    };
    if shared.cache.is_some() && object.meta().is_none() {
        let clients = &shared.stores[object.store];
        let retries = Retries::of(&shared.options);
        let head = retrying(
            retries,
            Some(&shared.health[object.store]),
            &object.url,
            unit as u64,
            |_| {
                fetched.requests += 1;
                async {
                    clients
                        .store
                        .head(&object.path)
                        .await
                        .map_err(|e| clients.failure(&object.url, &e))
                }
            },
        )
        .await;
        match head {
            Ok(meta) => {
                object.learn(&meta);
            }
            Err(failure) => {
                fetched.data = Err(failure);
                return fetched;
            }
        }
    }
    if let (true, Some(meta)) = (shared.cache.is_some(), object.meta()) {
        let (shared, url, meta) = (shared.clone(), object.url.clone(), meta.clone());
        let found = tokio::task::spawn_blocking(move || {
            let cache = shared.cache.as_ref()?;
            cache.object(&url, meta.etag.as_deref(), meta.size)
        })
        .await
        .ok()
        .flatten();
        match found {
            Some(Ok(path)) => {
                fetched.data = Ok(Data::File(path));
                fetched.from_cache = true;
                return fetched;
            }
            // Removed: read from the store again.
            Some(Err(_damaged)) => fetched.cache_rejected += 1,
            None => {}
        }
    }
    let read = match object.meta().cloned() {
        Some(meta) => read_sized(shared, unit, &meta, &mut fetched).await,
        None => read_unsized(shared, unit, &mut fetched).await,
    };
    if let (Ok(bytes), Some(_)) = (&read, &shared.cache) {
        let (shared, bytes, unit) = (shared.clone(), bytes.clone(), unit);
        // Off the runtime's threads.
        let written = shared.handle.clone().spawn_blocking(move || {
            let object = &shared.objects[unit];
            if let (Some(cache), Some(meta)) = (&shared.cache, object.meta()) {
                let _ = cache.store(
                    &object.url,
                    meta.etag.as_deref(),
                    meta.size,
                    Kind::Object,
                    &bytes,
                );
            }
        });
        if write == CacheWrite::Before {
            let _ = written.await;
        }
    }
    fetched.data = read.map(Data::Memory);
    fetched
}

/// A buffer of `size` bytes, or the failure to get one.
fn buffer_of(object: &Object, size: u64) -> Result<Vec<u8>, Failure> {
    let size = usize::try_from(size).unwrap_or(usize::MAX);
    let mut buffer = Vec::new();
    if buffer.try_reserve_exact(size).is_err() {
        return Err(Failure::local(
            std::io::ErrorKind::OutOfMemory,
            format!("{}: no memory for its {size} bytes", object.url),
        ));
    }
    buffer.resize(size, 0);
    Ok(buffer)
}

/// Reads an object of known size, in ranges of `request_bytes` all in flight at once.
async fn read_sized(
    shared: &Arc<Shared>,
    unit: usize,
    meta: &Meta,
    fetched: &mut Fetched,
) -> Result<Arc<Vec<u8>>, Failure> {
    let object = &shared.objects[unit];
    let mut buffer = buffer_of(object, meta.size)?;
    let chunk = usize::try_from(shared.options.request_bytes)
        .unwrap_or(usize::MAX)
        .max(1);
    let results = if buffer.len() <= chunk {
        let whole = 0..meta.size;
        vec![read_range(shared, unit, meta, whole, true, &mut buffer).await]
    } else {
        let parts = buffer.chunks_mut(chunk).enumerate().map(|(k, part)| {
            let start = (k * chunk) as u64;
            let range = start..start + part.len() as u64;
            read_range(shared, unit, meta, range, false, part)
        });
        futures_util::future::join_all(parts).await
    };
    for (requests, bytes, _) in &results {
        fetched.requests += requests;
        fetched.bytes += bytes;
    }
    match results.into_iter().find_map(|(_, _, r)| r.err()) {
        Some(failed) => Err(failed),
        None => Ok(Arc::new(buffer)),
    }
}

/// Reads `range` of an object into `out` (the object whole, with no range asked, when `whole`),
/// retrying as the options say; a try that breaks off mid-body is resumed from where it stopped
/// with the ETag checked. The read must be the object's ETag and fill `out` exactly. Returns
/// the requests made, the bytes received, and the outcome.
async fn read_range(
    shared: &Shared,
    unit: usize,
    meta: &Meta,
    range: Range<u64>,
    whole: bool,
    out: &mut [u8],
) -> (u64, u64, Result<(), Failure>) {
    let object = &shared.objects[unit];
    let Ok(_permit) = shared.requests.acquire().await else {
        return (0, 0, Err(shut_down(object)));
    };
    let clients = &shared.stores[object.store];
    let salt = (unit as u64) << 20 ^ range.start >> 16;
    let mut tries = match Tries::begin(
        Retries::of(&shared.options),
        Some(&shared.health[object.store]),
        &object.url,
        salt,
    ) {
        Ok(tries) => tries,
        Err(failure) => return (0, 0, Err(failure)),
    };
    let mut filled = 0usize;
    let mut requests = 0;
    loop {
        let limit = tries.next_try();
        requests += 1;
        let attempt = async {
            let from = range.start + filled as u64;
            let options = GetOptions {
                if_match: meta.etag.clone(),
                range: (!(whole && filled == 0)).then_some(GetRange::Bounded(from..range.end)),
                ..GetOptions::default()
            };
            let result = clients
                .store
                .get_opts(&object.path, options)
                .await
                .map_err(|e| clients.failure(&object.url, &e))?;
            let mut stream = result.into_stream();
            while let Some(chunk) = stream.next().await {
                let chunk = chunk.map_err(|e| clients.failure(&object.url, &e))?;
                let end = filled + chunk.len();
                if end > out.len() {
                    return Err(short(object, meta, &range, end as u64));
                }
                out[filled..end].copy_from_slice(&chunk);
                filled = end;
            }
            if filled != out.len() {
                return Err(short(object, meta, &range, filled as u64));
            }
            Ok(())
        };
        let outcome = tokio::time::timeout(limit, attempt).await;
        let failure = match outcome {
            Ok(Ok(())) => {
                tries.succeeded();
                return (requests, filled as u64, Ok(()));
            }
            Ok(Err(failure)) if failure.refused => return (requests, filled as u64, Err(failure)),
            Ok(Err(failure)) => failure,
            Err(_) => tries.timed_out(limit),
        };
        if let Err(failure) = tries.failed(failure).await {
            return (requests, filled as u64, Err(failure));
        }
    }
}

/// Reads an object whose size is not known yet (given by its URL) whole, learning its size and
/// ETag from the answer; a try that breaks off mid-body is resumed as a sized read's is.
async fn read_unsized(
    shared: &Arc<Shared>,
    unit: usize,
    fetched: &mut Fetched,
) -> Result<Arc<Vec<u8>>, Failure> {
    let object = &shared.objects[unit];
    let clients = &shared.stores[object.store];
    let answer = {
        let Ok(_permit) = shared.requests.acquire().await else {
            return Err(shut_down(object));
        };
        let mut tries = Tries::begin(
            Retries::of(&shared.options),
            Some(&shared.health[object.store]),
            &object.url,
            unit as u64,
        )?;
        loop {
            let limit = tries.next_try();
            fetched.requests += 1;
            let attempt = async {
                let result = clients
                    .store
                    .get_opts(&object.path, GetOptions::default())
                    .await
                    .map_err(|e| clients.failure(&object.url, &e))?;
                let meta = object.learn(&result.meta);
                let mut buffer = buffer_of(object, meta.size)?;
                let mut filled = 0usize;
                let mut stream = result.into_stream();
                while let Some(chunk) = stream.next().await {
                    let Ok(chunk) = chunk else { break };
                    let end = filled + chunk.len();
                    if end > buffer.len() {
                        return Err(short(object, &meta, &(0..meta.size), end as u64));
                    }
                    buffer[filled..end].copy_from_slice(&chunk);
                    filled = end;
                }
                Ok((buffer, filled, meta))
            };
            let failure = match tokio::time::timeout(limit, attempt).await {
                Ok(Ok(answer)) => {
                    tries.succeeded();
                    break answer;
                }
                Ok(Err(failure)) if failure.refused => return Err(failure),
                Ok(Err(failure)) => failure,
                Err(_) => tries.timed_out(limit),
            };
            tries.failed(failure).await?;
        }
    };
    let (mut buffer, filled, meta) = answer;
    fetched.bytes += filled as u64;
    if filled < buffer.len() {
        // Broken off mid-body: the rest as a range of the object now known.
        let rest = filled as u64..meta.size;
        let (requests, bytes, outcome) =
            read_range(shared, unit, &meta, rest, false, &mut buffer[filled..]).await;
        fetched.requests += requests;
        fetched.bytes += bytes;
        outcome?;
    }
    Ok(Arc::new(buffer))
}

fn shut_down(object: &Object) -> Failure {
    Failure::local(
        std::io::ErrorKind::Interrupted,
        format!("{}: the reader was shut down", object.url),
    )
}

fn short(object: &Object, meta: &Meta, range: &Range<u64>, got: u64) -> Failure {
    Failure {
        kind: std::io::ErrorKind::UnexpectedEof,
        reason: format!(
            "{}: bytes {}..{} of its {} came back as {got} bytes (the object changed since it \
             was listed?)",
            object.url, range.start, range.end, meta.size
        ),
        refused: true,
    }
}

/// Positions are kept as `u32`; this one means "not needed this epoch".
const UNNEEDED: u32 = u32::MAX;

/// The most of the read budget the next epoch's first objects may take ahead of it (a divisor).
const UPCOMING_SHARE: u64 = 4;

/// A fetched or fetching object.
#[derive(Debug)]
enum Slot {
    InFlight {
        reserved: u64,
    },
    /// Read; `held` is the memory it counts against the budget (0 for a cached file).
    Ready {
        data: Data,
        held: u64,
    },
    Failed(Failure),
}

/// The reader's plan and what it holds.
#[derive(Debug, Default)]
struct State {
    epoch: u64,
    /// Objects in the order the epoch first needs them.
    plan: Vec<u32>,
    /// The next object of the plan to consider.
    next: usize,
    /// The first and the last position of the epoch that need each object ([`UNNEEDED`] if
    /// none).
    first: Vec<u32>,
    last: Vec<u32>,
    /// Objects held when the epoch began that it needs again: used without a request if still
    /// held when the plan reaches them, dropped first when a sooner one needs the room.
    carried: HashSet<u32>,
    /// Objects fetched for the plan, by the last position that needs them.
    release: BinaryHeap<Reverse<(u32, u32)>>,
    /// Every position before this one is in a batch.
    frontier: usize,
    slots: HashMap<u32, Slot>,
    /// Decoders waiting for each object.
    waiters: HashMap<u32, usize>,
    /// Memory held: objects read and kept, and fetches in flight.
    held: u64,
    in_flight: usize,
    /// Objects a decoder waits for that the plan has not reached.
    demand: Vec<u32>,
    /// Objects no position needs any more (and carried ones), oldest first: dropped when their
    /// room is needed.
    idle: VecDeque<u32>,
    /// The next epoch's first objects, read once every object of this epoch's plan is read or
    /// on its way, within [`UPCOMING_SHARE`] of the budget: the next epoch finds them held.
    upcoming: Vec<u32>,
    /// Those of them read or being read: no room is made by dropping them before their epoch.
    read_ahead: HashSet<u32>,
    reports: BTreeMap<u64, ReadReport>,
}

impl State {
    fn needed(&self, unit: u32) -> bool {
        let last = self.last.get(unit as usize).copied().unwrap_or(UNNEEDED);
        last != UNNEEDED && last as usize >= self.frontier
    }

    fn report(&mut self) -> &mut ReadReport {
        self.reports.entry(self.epoch).or_default()
    }

    /// `unit` is no longer needed by the epoch and nobody waits for it: kept idle if in memory,
    /// forgotten if in the cache folder (failures stay until the next epoch).
    fn retire(&mut self, unit: u32) {
        if self.needed(unit) || self.waiters.get(&unit).is_some_and(|&n| n > 0) {
            return;
        }
        match self.slots.get(&unit) {
            Some(Slot::Ready {
                data: Data::File(_),
                ..
            }) => {
                self.slots.remove(&unit);
            }
            // A unit may be listed twice; eviction skips what is gone or needed again.
            Some(Slot::Ready { .. }) => self.idle.push_back(unit),
            _ => {}
        }
    }

    /// Drops the oldest idle object still idle, or carried object not needed before position
    /// `before`, to make room for one first needed there; false when none is left.
    fn evict_one(&mut self, before: u32) -> bool {
        while let Some(unit) = self.idle.pop_front() {
            let later = self.first.get(unit as usize).is_some_and(|&f| f > before);
            let idle = (!self.needed(unit) || (later && self.carried.contains(&unit)))
                && !self.read_ahead.contains(&unit)
                && self.waiters.get(&unit).is_none_or(|&n| n == 0);
            if !idle {
                continue;
            }
            self.carried.remove(&unit);
            if let Some(Slot::Ready { held, .. }) = self.slots.get(&unit) {
                self.held -= *held;
                self.slots.remove(&unit);
                return true;
            }
        }
        false
    }
}

/// A source's reader: its plan and buffers, over the shared clients.
pub(super) struct Reader {
    shared: Arc<Shared>,
    state: Mutex<State>,
    ready: Condvar,
    wake: Arc<Notify>,
    /// Set when the reads are stopped ([`Reader::stop`]): waits end at once.
    stopped: AtomicBool,
}

impl std::fmt::Debug for Reader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reader")
            .field("objects", &self.shared.objects.len())
            .finish_non_exhaustive()
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        // The driver finds the reader gone and ends.
        self.wake.notify_one();
    }
}

impl Reader {
    /// A reader with an empty plan, and its driver task.
    pub fn start(shared: Arc<Shared>) -> Arc<Reader> {
        let wake = Arc::new(Notify::new());
        let reader = Arc::new(Reader {
            state: Mutex::new(State {
                first: vec![UNNEEDED; shared.objects.len()],
                last: vec![UNNEEDED; shared.objects.len()],
                ..State::default()
            }),
            shared: shared.clone(),
            ready: Condvar::new(),
            wake: wake.clone(),
            stopped: AtomicBool::new(false),
        });
        let weak = Arc::downgrade(&reader);
        shared.handle.spawn(async move {
            loop {
                wake.notified().await;
                let Some(reader) = weak.upgrade() else { break };
                reader.schedule(&weak);
            }
        });
        reader
    }

    /// Stops the reads: every wait for an object, now or later, ends at once with a failure
    /// (the pipeline is going away; nothing waits for a server that does not answer).
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::SeqCst);
        // Under the lock, so no waiter misses it between its look and its wait.
        let state = self.lock();
        self.ready.notify_all();
        drop(state);
    }

    /// The shared clients, objects and cache.
    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A new epoch: `units` gives the object each of its positions reads (`None` for positions
    /// that read none, such as damaged parts of a shard).
    ///
    /// `upcoming` gives the objects of the next epoch's positions in turn: the first of them,
    /// up to a [`UPCOMING_SHARE`] of the read budget and [`RemoteOptions::max_requests`]
    /// objects, are read once this epoch's plan has started every object it needs.
    pub fn begin_epoch(
        &self,
        epoch: u64,
        units: impl Iterator<Item = Option<u32>>,
        upcoming: impl Iterator<Item = u32>,
    ) {
        let options = &self.shared.options;
        let mut ahead = Vec::new();
        let mut bytes = 0;
        for unit in upcoming {
            if ahead.len() >= options.max_requests.max(1) {
                break;
            }
            if ahead.contains(&unit) {
                continue;
            }
            let size = self
                .shared
                .objects
                .get(unit as usize)
                .map_or(0, Object::size_or_estimate);
            if bytes + size > options.read_budget / UPCOMING_SHARE {
                break;
            }
            bytes += size;
            ahead.push(unit);
        }
        let mut state = self.lock();
        let state = &mut *state;
        state.upcoming = ahead;
        state.read_ahead.clear();
        state.epoch = epoch;
        state.first.fill(UNNEEDED);
        state.last.fill(UNNEEDED);
        state.plan.clear();
        for (position, unit) in units.enumerate() {
            let Some(unit) = unit else { continue };
            let position = u32::try_from(position).unwrap_or(UNNEEDED - 1);
            if state.first[unit as usize] == UNNEEDED {
                state.first[unit as usize] = position;
                state.plan.push(unit);
            }
            state.last[unit as usize] = position;
        }
        state.next = 0;
        state.frontier = 0;
        state.demand.clear();
        state.release.clear();
        // Failures are tried again; what the new epoch needs is kept, the rest goes idle.
        state
            .slots
            .retain(|_, slot| !matches!(slot, Slot::Failed(_)));
        let held: Vec<u32> = state.slots.keys().copied().collect();
        state.idle.clear();
        state.carried.clear();
        for unit in held {
            if state.needed(unit) {
                state
                    .release
                    .push(Reverse((state.last[unit as usize], unit)));
                if matches!(state.slots.get(&unit), Some(Slot::Ready { .. })) {
                    // Kept if the plan reaches it before a sooner object needs its room.
                    state.carried.insert(unit);
                    state.idle.push_back(unit);
                }
            } else {
                state.retire(unit);
            }
        }
        state.reports.entry(epoch).or_default();
        while state.reports.len() > 8 {
            state.reports.pop_first();
        }
        self.wake.notify_one();
    }

    /// Every position before `position` is in a batch.
    pub fn advance(&self, position: usize) {
        let mut state = self.lock();
        state.frontier = state.frontier.max(position);
        while let Some(&Reverse((last, unit))) = state.release.peek() {
            if last as usize >= state.frontier {
                break;
            }
            state.release.pop();
            state.retire(unit);
        }
        drop(state);
        self.wake.notify_one();
    }

    /// What reading `epoch` took so far.
    pub fn report(&self, epoch: u64) -> ReadReport {
        self.lock().reports.get(&epoch).cloned().unwrap_or_default()
    }

    /// The bytes of object `unit`, waiting while they are read; a failure names the object.
    pub fn data(&self, unit: u32) -> Result<Data, Failure> {
        let mut state = self.lock();
        let mut waited: Option<Instant> = None;
        let data = loop {
            if self.stopped.load(Ordering::SeqCst) {
                return Err(Failure::local(
                    std::io::ErrorKind::Interrupted,
                    format!(
                        "{}: not read, the reads were stopped",
                        self.shared.objects[unit as usize].url
                    ),
                ));
            }
            match state.slots.get(&unit) {
                Some(Slot::Ready { data, .. }) => break data.clone(),
                Some(Slot::Failed(failure)) => {
                    let failure = failure.clone();
                    if let Some(since) = waited {
                        let report = state.report();
                        report.waits += 1;
                        report.waited += since.elapsed();
                    }
                    return Err(failure);
                }
                Some(Slot::InFlight { .. }) => {}
                None => {
                    if !state.demand.contains(&unit) {
                        state.demand.push(unit);
                    }
                    self.wake.notify_one();
                }
            }
            waited.get_or_insert_with(Instant::now);
            *state.waiters.entry(unit).or_default() += 1;
            // Every fetch ends (requests time out, retries are bounded), and a stop wakes every
            // waiter; the timeout only makes the wait look again.
            state = self
                .ready
                .wait_timeout(state, Duration::from_secs(1))
                .unwrap_or_else(|p| p.into_inner())
                .0;
            if let Some(n) = state.waiters.get_mut(&unit) {
                *n -= 1;
                if *n == 0 {
                    state.waiters.remove(&unit);
                }
            }
        };
        if let Some(since) = waited {
            let report = state.report();
            report.waits += 1;
            report.waited += since.elapsed();
        }
        state.retire(unit);
        Ok(data)
    }

    /// Starts what the demand and the plan call for, as the limits allow.
    fn schedule(&self, weak: &Weak<Reader>) {
        let options = &self.shared.options;
        let mut state = self.lock();
        let state = &mut *state;
        let mut start = Vec::new();
        for unit in std::mem::take(&mut state.demand) {
            if !state.slots.contains_key(&unit) {
                start.push(unit);
                self.reserve(state, unit);
                if state.needed(unit) {
                    // Ahead of the plan: released as the plan's own would be.
                    state
                        .release
                        .push(Reverse((state.last[unit as usize], unit)));
                }
            }
        }
        while state.next < state.plan.len() {
            let unit = state.plan[state.next];
            if state.slots.contains_key(&unit) || !state.needed(unit) {
                if state.carried.remove(&unit) {
                    state.report().kept += 1;
                }
                state.next += 1;
                continue;
            }
            if state.in_flight >= options.max_requests.max(1) {
                break;
            }
            let size = self.shared.objects[unit as usize].size_or_estimate();
            let first = state.first[unit as usize];
            while state.held + size > options.read_budget && state.evict_one(first) {}
            if state.held > 0 && state.held + size > options.read_budget {
                break;
            }
            start.push(unit);
            self.reserve(state, unit);
            state
                .release
                .push(Reverse((state.last[unit as usize], unit)));
            state.next += 1;
        }
        if state.next >= state.plan.len() {
            // Every object this epoch needs is read or on its way: the next epoch's first ones,
            // into room no object this epoch needs (idle when read, carried when it begins).
            while let Some(&unit) = state.upcoming.first() {
                if state.slots.contains_key(&unit) {
                    state.upcoming.remove(0);
                    continue;
                }
                if state.in_flight >= options.max_requests.max(1) {
                    break;
                }
                let size = self.shared.objects[unit as usize].size_or_estimate();
                while state.held + size > options.read_budget && state.evict_one(UNNEEDED) {}
                if state.held + size > options.read_budget {
                    // Room comes as this epoch's last objects are released.
                    break;
                }
                state.upcoming.remove(0);
                state.read_ahead.insert(unit);
                start.push(unit);
                self.reserve(state, unit);
            }
        }
        let epoch = state.epoch;
        for unit in start {
            let (shared, weak) = (self.shared.clone(), weak.clone());
            self.shared.handle.spawn(async move {
                let fetched = fetch(&shared, unit as usize, CacheWrite::Behind).await;
                if let Some(reader) = weak.upgrade() {
                    reader.finish(unit, epoch, fetched);
                }
            });
        }
    }

    fn reserve(&self, state: &mut State, unit: u32) {
        let size = self.shared.objects[unit as usize].size_or_estimate();
        state.slots.insert(unit, Slot::InFlight { reserved: size });
        state.held += size;
        state.in_flight += 1;
    }

    /// A fetch of `unit`, started for `epoch`, is over.
    fn finish(&self, unit: u32, epoch: u64, fetched: Fetched) {
        let mut state = self.lock();
        let size = self.shared.objects[unit as usize].size_or_estimate();
        fetched.count(state.reports.entry(epoch).or_default(), size);
        state.in_flight -= 1;
        let reserved = match state.slots.remove(&unit) {
            Some(Slot::InFlight { reserved }) => reserved,
            _ => 0,
        };
        let slot = match fetched.data {
            Ok(Data::Memory(bytes)) => {
                // An object of unknown size counted an estimate until read.
                let actual = bytes.len() as u64;
                state.held = state.held - reserved + actual;
                Slot::Ready {
                    data: Data::Memory(bytes),
                    held: actual,
                }
            }
            Ok(file) => {
                state.held -= reserved;
                Slot::Ready {
                    data: file,
                    held: 0,
                }
            }
            Err(failure) => {
                state.held -= reserved;
                Slot::Failed(failure)
            }
        };
        state.slots.insert(unit, slot);
        state.retire(unit);
        drop(state);
        self.ready.notify_all();
        self.wake.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_objects_go_oldest_first_and_needed_ones_stay() {
        let mut state = State {
            first: vec![UNNEEDED, 2, UNNEEDED],
            last: vec![UNNEEDED, 5, UNNEEDED],
            ..State::default()
        };
        for (unit, held) in [(0u32, 10u64), (1, 20), (2, 30)] {
            state.slots.insert(
                unit,
                Slot::Ready {
                    data: Data::Memory(Arc::new(Vec::new())),
                    held,
                },
            );
            state.held += held;
            state.retire(unit);
        }
        // Object 1 is needed at position 5: not idle.
        assert_eq!(state.idle, [0, 2]);
        assert!(state.evict_one(0));
        assert_eq!(state.held, 50);
        assert!(!state.slots.contains_key(&0));
        // Once the frontier passes 5, object 1 can go too.
        state.frontier = 6;
        state.retire(1);
        assert!(state.evict_one(0) && state.evict_one(0));
        assert!(!state.evict_one(0));
        assert_eq!(state.held, 0);
    }

    #[test]
    fn carried_objects_make_room_only_for_sooner_ones() {
        // Held from the last epoch, needed again at positions 8 and 9.
        let mut state = State {
            first: vec![8],
            last: vec![9],
            held: 10,
            ..State::default()
        };
        state.slots.insert(
            0,
            Slot::Ready {
                data: Data::Memory(Arc::new(Vec::new())),
                held: 10,
            },
        );
        state.carried.insert(0);
        state.idle.push_back(0);
        assert!(!state.evict_one(9), "needed before position 9");
        state.idle.push_back(0);
        assert!(state.evict_one(3), "an object needed at 3 comes first");
        assert_eq!(state.held, 0);
        assert!(state.carried.is_empty());
    }
}
