//! Sources in object storage (feature `object-store`): WebDataset shards or one object per
//! image, in S3, Google Cloud Storage, Azure Blob Storage or behind plain HTTP(S) URLs, read with
//! the Arrow project's `object_store` clients.
//!
//! Opening a source lists its objects (or asks for each URL given); a WebDataset source also
//! reads each shard once to index its samples (or takes the index from the cache folder). The
//! pipeline then reads through [`reader`]: whole shards in a few large requests, or many images
//! at once, ahead of the decoders and within a byte budget, each item handed to the lanes as
//! bytes in memory (or a part of a file in the cache folder) through the same
//! [`super::SourceItem::open`] as local files.

mod cache;
mod listing;
mod location;
#[cfg(feature = "parquet")]
pub(crate) mod ranges;
mod reader;
mod store;

use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use object_store::ObjectMeta;

use super::folders::{has_extension, DECODED_EXTENSIONS, IMAGE_EXTENSIONS};
use super::tar::{self, Entry};
use super::{OpenItem, Payload, SharedBytes, Source, SourceItem};
use crate::error::{Error, ItemErrorKind, Result};
use crate::order::{EpochOrder, ShardBlocks};
use crate::source::ReadReport;
use cache::{Cache, Kind};
use listing::Bounds;
use location::{expand_braces, object_url, Location, StoreUrl};
use reader::{CacheWrite, Data, Meta, Object, Reader, Shared};
use store::{Clients, Health, Retries};

/// Default [`RemoteOptions::read_budget`]: 1 GiB.
pub const DEFAULT_READ_BUDGET: u64 = 1 << 30;

/// How the objects under a URL make a source: the object-storage twins of
/// [`Source::directory`], [`Source::image_folder`] and [`Source::webdataset`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum UrlLayout {
    /// One object per image: every object under the prefix with an image extension
    /// ([`IMAGE_EXTENSIONS`]), in the order of a sorted folder walk; no labels.
    Images,
    /// torchvision's `ImageFolder` over keys: the first path component under the prefix is the
    /// class, labelled by its place among the sorted class names.
    ImageFolder,
    /// WebDataset tar shards: the `.tar` objects directly under the prefix, in key order.
    WebDataset,
}

/// A flag that stops a source's opening: set it (from a signal handler, say) and a listing or
/// indexing under way ends within 20 ms with an error of kind `Interrupted`. Copies share the
/// flag; two are equal when they share it.
#[derive(Debug, Clone, Default)]
pub struct Interrupt(Arc<AtomicBool>);

impl Interrupt {
    /// A flag of its own, not set.
    pub fn new() -> Interrupt {
        Interrupt::default()
    }

    /// Sets the flag.
    pub fn interrupt(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    /// Whether the flag is set.
    pub fn is_set(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// The flag a signal handler sets (`signal_hook::flag::register`, say).
impl From<Arc<AtomicBool>> for Interrupt {
    fn from(flag: Arc<AtomicBool>) -> Interrupt {
        Interrupt(flag)
    }
}

impl PartialEq for Interrupt {
    fn eq(&self, other: &Interrupt) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for Interrupt {}

/// How a source in object storage is read: the byte budget, the requests in flight, the shuffle
/// window of shards, the local cache, the faults' timeouts and retries, and the bounds of a
/// listing. Credentials and endpoints come
/// from the environment, as the platforms' own tools take them (`AWS_ACCESS_KEY_ID`,
/// `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_REGION`, `AWS_ENDPOINT_URL`, instance
/// credentials; `GOOGLE_APPLICATION_CREDENTIALS`; `AZURE_STORAGE_ACCOUNT_NAME`,
/// `AZURE_STORAGE_ACCOUNT_KEY`, ...), or from [`RemoteOptions::store_option`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RemoteOptions {
    /// The most bytes read ahead of the decoders and held: shards and images read and not yet
    /// decoded, and reads in flight (default [`DEFAULT_READ_BUDGET`]). An object a decoder
    /// waits for is read even past it; one larger than the whole budget is read alone.
    pub read_budget: u64,
    /// The most GET requests in flight at once, and objects read at once (default 64).
    pub max_requests: usize,
    /// A shard larger than this is read in ranges of this many bytes, all at once (default
    /// 16 MiB).
    pub request_bytes: u64,
    /// WebDataset sources: consecutive shards whose samples are shuffled together (see
    /// [`crate::BatchOptions::shuffle_seed`]); their bytes are held at once, so the window of
    /// the largest shards must fit the budget. Default `None`: as many as half the budget holds
    /// of the largest shard, 1 to 8.
    pub shuffle_window: Option<usize>,
    /// A folder keeping whole objects read (and shard indexes) for later epochs, later runs and
    /// other processes on the machine (default none).
    pub cache_dir: Option<PathBuf>,
    /// The most bytes the cache folder holds (default no limit); objects that do not fit are
    /// read from the store each time.
    pub cache_limit: u64,
    /// Time one request may take, connection and body included, before it counts as failed and
    /// is retried (default 30 s).
    pub request_timeout: Duration,
    /// How long a failing request is retried, with exponential backoff (100 ms doubling to 8 s),
    /// before it gives up: its first try and every retry end within this time of the first
    /// (default 60 s). Timeouts, 5xx answers, throttling and dropped connections are retried;
    /// refused credentials, missing objects and other refusals are not.
    pub retry_timeout: Duration,
    /// The most times a failing request is tried again (default 10); the reason a read gives
    /// up says how many tries it made.
    pub max_retries: u32,
    /// The most objects a listing may hold (default 20,000,000): a listing past it is an error
    /// that says so, not one that grows until memory runs out.
    pub max_listed_objects: u64,
    /// The most bytes of key names a listing may hold (default 4 GiB).
    pub max_listed_bytes: u64,
    /// Stops the source's opening when set (see [`Interrupt`]; default none).
    pub interrupt: Option<Interrupt>,
    /// Settings for the store's client, by `object_store`'s names (`aws_endpoint`,
    /// `aws_access_key_id`, `aws_secret_access_key`, `aws_region`, `google_service_account`,
    /// `azure_storage_account_key`, ...); they override the environment.
    pub store_options: Vec<(String, String)>,
}

impl Default for RemoteOptions {
    fn default() -> Self {
        RemoteOptions {
            read_budget: DEFAULT_READ_BUDGET,
            max_requests: 64,
            request_bytes: 16 << 20,
            shuffle_window: None,
            cache_dir: None,
            cache_limit: u64::MAX,
            request_timeout: Duration::from_secs(30),
            retry_timeout: Duration::from_secs(60),
            max_retries: 10,
            max_listed_objects: 20_000_000,
            max_listed_bytes: 4 << 30,
            interrupt: None,
            store_options: Vec::new(),
        }
    }
}

impl RemoteOptions {
    /// Sets [`RemoteOptions::read_budget`].
    pub fn read_budget(mut self, bytes: u64) -> Self {
        self.read_budget = bytes;
        self
    }

    /// Sets [`RemoteOptions::max_requests`].
    pub fn max_requests(mut self, requests: usize) -> Self {
        self.max_requests = requests;
        self
    }

    /// Sets [`RemoteOptions::request_bytes`].
    pub fn request_bytes(mut self, bytes: u64) -> Self {
        self.request_bytes = bytes;
        self
    }

    /// Sets [`RemoteOptions::shuffle_window`].
    pub fn shuffle_window(mut self, shards: Option<usize>) -> Self {
        self.shuffle_window = shards;
        self
    }

    /// Sets [`RemoteOptions::cache_dir`].
    pub fn cache_dir(mut self, dir: Option<PathBuf>) -> Self {
        self.cache_dir = dir;
        self
    }

    /// Sets [`RemoteOptions::cache_limit`].
    pub fn cache_limit(mut self, bytes: u64) -> Self {
        self.cache_limit = bytes;
        self
    }

    /// Sets [`RemoteOptions::request_timeout`].
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// Sets [`RemoteOptions::retry_timeout`].
    pub fn retry_timeout(mut self, timeout: Duration) -> Self {
        self.retry_timeout = timeout;
        self
    }

    /// Sets [`RemoteOptions::max_retries`].
    pub fn max_retries(mut self, retries: u32) -> Self {
        self.max_retries = retries;
        self
    }

    /// Sets [`RemoteOptions::max_listed_objects`].
    pub fn max_listed_objects(mut self, objects: u64) -> Self {
        self.max_listed_objects = objects;
        self
    }

    /// Sets [`RemoteOptions::max_listed_bytes`].
    pub fn max_listed_bytes(mut self, bytes: u64) -> Self {
        self.max_listed_bytes = bytes;
        self
    }

    /// Sets [`RemoteOptions::interrupt`].
    pub fn interrupt(mut self, interrupt: Option<Interrupt>) -> Self {
        self.interrupt = interrupt;
        self
    }

    /// Adds one of [`RemoteOptions::store_options`].
    pub fn store_option(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.store_options.push((key.into(), value.into()));
        self
    }

    fn validate(&self) -> Result<()> {
        if self.read_budget == 0 {
            return Err(Error::invalid("read_budget", "must be at least 1 byte"));
        }
        if self.max_requests == 0 {
            return Err(Error::invalid("max_requests", "must be at least 1"));
        }
        if self.request_bytes < 64 << 10 {
            return Err(Error::invalid(
                "request_bytes",
                format!("{} bytes is under the least, 64 KiB", self.request_bytes),
            ));
        }
        if self.shuffle_window == Some(0) {
            return Err(Error::invalid("shuffle_window", "must be at least 1 shard"));
        }
        if self.request_timeout.is_zero() {
            return Err(Error::invalid("request_timeout", "must be more than 0"));
        }
        Ok(())
    }
}

/// The tokio runtime a source's reads run on (two to four threads): shut down, without waiting
/// for reads in flight, when the source goes.
struct Runtime(Option<tokio::runtime::Runtime>);

impl Drop for Runtime {
    fn drop(&mut self) {
        if let Some(runtime) = self.0.take() {
            // Cache writes under way get a moment to finish (an unfinished one leaves only its
            // temporary file); network reads are cancelled.
            runtime.shutdown_timeout(Duration::from_secs(2));
        }
    }
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Runtime")
    }
}

/// What a [`Source`] in object storage holds beside its items.
#[derive(Debug)]
pub(crate) struct Remote {
    reader: Arc<Reader>,
    blocks: Option<ShardBlocks>,
    opening: ReadReport,
    /// Dropped last, after the reader.
    runtime: Arc<Runtime>,
}

/// Where an item's bytes are: `len` bytes at `offset` of object `unit` (a member, for a shard's
/// sample), or the whole object (an image; `len` is `None` while its size is not known).
#[derive(Debug, Clone)]
pub(crate) struct Place {
    reader: Arc<Reader>,
    unit: u32,
    offset: u64,
    len: Option<u64>,
    /// A shard sample's other members.
    parts: Arc<[tar::Part]>,
}

impl Place {
    /// Encoded size in bytes, 0 while not known (an image given by its URL, not read yet).
    pub fn len(&self) -> u64 {
        self.len.unwrap_or_else(|| self.object_size().unwrap_or(0))
    }

    fn object_size(&self) -> Option<u64> {
        let object = &self.reader.shared().objects[self.unit as usize];
        object.meta().map(|m| m.size)
    }

    /// The item's bytes, waiting while its object is read; refused as a local file would be
    /// (over `max_bytes`, empty, not an image format).
    pub fn open(&self, max_bytes: u64) -> std::result::Result<OpenItem, ItemErrorKind> {
        let known = self.len.or_else(|| self.object_size());
        if let Some(len) = known.filter(|&len| len > max_bytes) {
            return Err(ItemErrorKind::FileTooLarge {
                bytes: len,
                limit: max_bytes,
            });
        }
        let data = self
            .reader
            .data(self.unit)
            .map_err(|f| ItemErrorKind::Read {
                kind: f.kind,
                reason: f.reason,
            })?;
        // Known once read.
        let len = self.len.or_else(|| self.object_size()).unwrap_or(0);
        match data {
            Data::Memory(buffer) => {
                let start = usize::try_from(self.offset).unwrap_or(usize::MAX);
                let end = start.saturating_add(usize::try_from(len).unwrap_or(usize::MAX));
                if end > buffer.len() {
                    return Err(ItemErrorKind::Truncated(format!(
                        "the object ends at byte {}, before the member's end",
                        buffer.len()
                    )));
                }
                OpenItem::checked_memory(
                    SharedBytes::Span {
                        buffer,
                        range: start..end,
                    },
                    max_bytes,
                )
            }
            Data::File(path) => OpenItem::file_part(&path, self.offset, len, max_bytes),
        }
    }
}

impl Place {
    /// The sample's other members.
    pub fn parts(&self) -> &[tar::Part] {
        &self.parts
    }

    /// `len` bytes at `offset` of the item's object (a member of its shard), waiting while the
    /// object is read.
    pub fn read_span(&self, offset: u64, len: u64) -> std::result::Result<Vec<u8>, ItemErrorKind> {
        let data = self
            .reader
            .data(self.unit)
            .map_err(|f| ItemErrorKind::Read {
                kind: f.kind,
                reason: f.reason,
            })?;
        match data {
            Data::Memory(buffer) => {
                let start = usize::try_from(offset).unwrap_or(usize::MAX);
                let end = start.saturating_add(usize::try_from(len).unwrap_or(usize::MAX));
                buffer.get(start..end).map(<[u8]>::to_vec).ok_or_else(|| {
                    ItemErrorKind::Truncated(format!(
                        "the object ends at byte {}, before the member's end",
                        buffer.len()
                    ))
                })
            }
            Data::File(path) => super::read_file_span(&path, offset, len),
        }
    }
}

impl Remote {
    /// A copy of the source's reading with a reader of its own (same clients, objects and
    /// cache), and `items` pointed at it.
    pub fn fork(&self, items: &[SourceItem]) -> (Remote, Vec<SourceItem>) {
        let reader = Reader::start(self.reader.shared().clone());
        let items = items
            .iter()
            .map(|item| match &item.payload {
                Payload::Remote(place) => SourceItem {
                    payload: Payload::Remote(Place {
                        reader: reader.clone(),
                        ..place.clone()
                    }),
                    ..item.clone()
                },
                _ => item.clone(),
            })
            .collect();
        let remote = Remote {
            reader,
            blocks: self.blocks.clone(),
            opening: self.opening.clone(),
            runtime: self.runtime.clone(),
        };
        (remote, items)
    }

    /// The shards, for the block shuffle (WebDataset sources).
    pub fn shuffle_blocks(&self) -> Option<ShardBlocks> {
        self.blocks.clone()
    }

    /// Plans the reads of an epoch in `order`, and of the first objects of the next epoch's
    /// order `next`.
    pub fn begin_epoch(
        &self,
        epoch: u64,
        order: &EpochOrder,
        next: &EpochOrder,
        items: &[SourceItem],
    ) {
        let unit = |&i: &usize| match &items[i].payload {
            Payload::Remote(place) => Some(place.unit),
            _ => None,
        };
        let units = order.indices().iter().map(unit);
        let upcoming = next.indices().iter().filter_map(unit);
        self.reader.begin_epoch(epoch, units, upcoming);
    }

    /// Every position before `position` is in a batch.
    pub fn advance(&self, position: usize) {
        self.reader.advance(position);
    }

    /// What reading `epoch` took.
    pub fn report(&self, epoch: u64) -> ReadReport {
        self.reader.report(epoch)
    }

    /// What opening the source read (listings, shard indexes).
    pub fn opening(&self) -> &ReadReport {
        &self.opening
    }

    /// Stops the reads: waits for objects end at once, now and later (see [`Reader::stop`]).
    pub fn stop(&self) {
        self.reader.stop();
    }
}

impl Source {
    /// The images or WebDataset shards at `url`, in object storage or behind HTTP(S):
    ///
    /// - a prefix to list (`s3://bucket/train/`, `gs://bucket/train/`, `az://container/train/`;
    ///   a URL ending in `/`, or one that names no object of the layout's kind), read as
    ///   `layout` says;
    /// - one object (`s3://bucket/train-0000.tar`, `https://host/img.jpg`);
    /// - WebDataset's brace pattern (`https://host/train-{0000..0127}.tar`): the objects it
    ///   expands to, in order (see [`Source::urls`]).
    ///
    /// Ids are the objects' URLs (`s3://bucket/train/n01/x.jpg`), for shards the shard's URL
    /// and the member (`s3://bucket/train-0000.tar:n01/x.jpg`); labels, damaged parts of
    /// shards and the listing's order are those of the local twins ([`Source::directory`],
    /// [`Source::image_folder`], [`Source::webdataset`]). HTTP servers cannot be listed: give
    /// them object URLs or a brace pattern. Opening a WebDataset source reads every shard once
    /// to index it (several at a time, within the read budget), unless the cache folder holds
    /// its index.
    ///
    /// Call it from a thread that is not running an async runtime: it waits for the listing.
    ///
    /// ```no_run
    /// use gpufeed::{RemoteOptions, Source, UrlLayout};
    /// let options = RemoteOptions::default()
    ///     .cache_dir(Some("/tmp/gpufeed-cache".into()))
    ///     .cache_limit(100 << 30);
    /// let source = Source::url("s3://bucket/imagenet/train/", UrlLayout::WebDataset, &options)?;
    /// # Ok::<(), gpufeed::Error>(())
    /// ```
    pub fn url(url: &str, layout: UrlLayout, options: &RemoteOptions) -> Result<Source> {
        if url.contains('{') || url.contains('}') {
            let urls = expand_braces(url).map_err(|reason| invalid_url(url, reason))?;
            return Source::urls(urls, layout, options);
        }
        let location = Location::parse(url).map_err(|reason| invalid_url(url, reason))?;
        let names_object = !location.is_prefix()
            && match layout {
                UrlLayout::WebDataset => location.key.to_ascii_lowercase().ends_with(".tar"),
                UrlLayout::Images => has_extension(Path::new(&location.key), &DECODED_EXTENSIONS),
                UrlLayout::ImageFolder => false,
            };
        if names_object || !location.store.scheme.lists() {
            return Source::urls([url], layout, options);
        }
        Opening::new(options)?.prefix(url, &location, layout)
    }

    /// These objects, in this order: WebDataset shards ([`UrlLayout::WebDataset`]) or images
    /// ([`UrlLayout::Images`]); each must exist. See [`Source::url`].
    pub fn urls<I, S>(urls: I, layout: UrlLayout, options: &RemoteOptions) -> Result<Source>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let urls: Vec<String> = urls.into_iter().map(|u| u.as_ref().to_string()).collect();
        let first = urls.first().cloned().unwrap_or_default();
        if layout == UrlLayout::ImageFolder {
            return Err(invalid_url(
                &first,
                "an ImageFolder source is a prefix to list (s3://bucket/train/), not a list of \
                 objects"
                    .into(),
            ));
        }
        if urls.is_empty() {
            return Err(Error::invalid("urls", "no URL given"));
        }
        let mut locations = Vec::with_capacity(urls.len());
        for url in &urls {
            let location = Location::parse(url).map_err(|reason| invalid_url(url, reason))?;
            if location.is_prefix() {
                return Err(invalid_url(
                    url,
                    if location.store.scheme.lists() {
                        "a prefix in a list of objects (give it alone to list it)".into()
                    } else {
                        "an HTTP server cannot be listed: give the URLs of the objects, or a \
                         brace pattern (https://host/train-{0000..0127}.tar)"
                            .into()
                    },
                ));
            }
            locations.push(location);
        }
        Opening::new(options)?.objects(&locations, layout)
    }

    /// For a source in object storage, what opening it read (listings, shard indexes).
    pub fn opening_report(&self) -> Option<&ReadReport> {
        self.remote.as_ref().map(Remote::opening)
    }
}

fn invalid_url(url: &str, reason: String) -> Error {
    Error::Remote {
        url: url.to_string(),
        reason,
        kind: std::io::ErrorKind::InvalidInput,
    }
}

fn failed(url: &str, failure: store::Failure) -> Error {
    Error::Remote {
        url: url.to_string(),
        reason: failure.reason,
        kind: failure.kind,
    }
}

fn nothing_found(url: &str, reason: String) -> Error {
    Error::Remote {
        url: url.to_string(),
        reason,
        kind: std::io::ErrorKind::NotFound,
    }
}

/// A source being opened: its runtime, its clients by store, and its options.
struct Opening {
    runtime: tokio::runtime::Runtime,
    options: RemoteOptions,
    stores: BTreeMap<StoreUrl, usize>,
    clients: Vec<Clients>,
    report: ReadReport,
}

impl Opening {
    fn new(options: &RemoteOptions) -> Result<Opening> {
        options.validate()?;
        if tokio::runtime::Handle::try_current().is_ok() {
            return Err(Error::Worker(
                "a source in object storage is opened by waiting for the network: open it outside \
                 an async runtime (in tokio, within spawn_blocking)"
                    .into(),
            ));
        }
        // Two threads, four from 16 cores: enough for GB/s of responses, few beside the decoders.
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads((cores / 4).clamp(2, 4))
            .thread_name("gpufeed-fetch")
            .enable_all()
            .build()
            .map_err(|e| Error::Worker(format!("cannot start the object-storage runtime: {e}")))?;
        Ok(Opening {
            runtime,
            options: options.clone(),
            stores: BTreeMap::new(),
            clients: Vec::new(),
            report: ReadReport::default(),
        })
    }

    /// The index of `store`'s clients, set up on first use.
    fn clients(&mut self, store: &StoreUrl) -> Result<usize> {
        if let Some(&index) = self.stores.get(store) {
            return Ok(index);
        }
        let clients = store::connect(store, &self.options).map_err(|reason| Error::Remote {
            url: store.to_string(),
            reason,
            kind: std::io::ErrorKind::InvalidInput,
        })?;
        self.clients.push(clients);
        self.stores.insert(store.clone(), self.clients.len() - 1);
        Ok(self.clients.len() - 1)
    }

    /// Waits for `future` on the runtime, or until the options' [`Interrupt`] is set (looked
    /// at every 20 ms): then an error of kind `Interrupted` naming `url`.
    fn wait<T>(&self, url: &str, future: impl Future<Output = T>) -> Result<T> {
        let interrupt = self.options.interrupt.clone();
        self.runtime.block_on(async move {
            let watch = async {
                loop {
                    if interrupt.as_ref().is_some_and(Interrupt::is_set) {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            };
            futures_util::pin_mut!(future, watch);
            match futures_util::future::select(future, watch).await {
                futures_util::future::Either::Left((value, _)) => Ok(value),
                futures_util::future::Either::Right(_) => Err(Error::Remote {
                    url: url.to_string(),
                    reason: "interrupted while opening it".into(),
                    kind: std::io::ErrorKind::Interrupted,
                }),
            }
        })
    }

    /// The objects under a prefix, as `layout` reads them.
    fn prefix(mut self, url: &str, location: &Location, layout: UrlLayout) -> Result<Source> {
        let store = self.clients(&location.store)?;
        let prefix = match location.key.trim_end_matches('/') {
            "" => None,
            key => {
                location.path().map_err(|reason| invalid_url(url, reason))?;
                Some(format!("{key}/"))
            }
        };
        let clients = self.clients[store].clone();
        let retries = Retries::of(&self.options);
        let bounds = Bounds::of(&self.options);
        let delimiter = layout == UrlLayout::WebDataset;
        let listed = self
            .wait(
                url,
                listing::list(&clients, retries, bounds, url, prefix.as_deref(), delimiter),
            )?
            .map_err(|f| failed(url, f))?;
        self.report.requests += listed.requests;
        let under = Under {
            url,
            location,
            store,
            prefix,
        };
        match layout {
            UrlLayout::WebDataset => {
                let is_shard = |key: &str| key.to_ascii_lowercase().ends_with(".tar");
                let objects: Vec<Object> = listed
                    .objects
                    .iter()
                    .filter(|m| is_shard(m.location.as_ref()))
                    .map(|m| under.object(m))
                    .collect();
                // Shards whose key cannot be requested: each a damaged part.
                let damaged = listed
                    .unnamable
                    .iter()
                    .filter(|(key, _)| is_shard(key))
                    .map(|(key, reason)| SourceItem {
                        payload: Payload::Damaged(reason.clone()),
                        id: under.key_url(key),
                        label: None,
                    })
                    .collect();
                if objects.is_empty() {
                    return Err(nothing_found(url, "no .tar shard under it".into()));
                }
                self.webdataset(objects, damaged)
            }
            UrlLayout::Images => {
                let (entries, left_out) = under.images(&listed)?;
                self.images(entries, None, left_out)
            }
            UrlLayout::ImageFolder => {
                let (entries, names, left_out) = under.classes(&listed)?;
                self.images(entries, Some(names), left_out)
            }
        }
    }

    /// These objects, as `layout` reads them. None is asked anything up front: an image's size
    /// and ETag come with its first read, a missing one is an item error then; a shard is read
    /// whole to index it (or its index found in the cache, after a HEAD for its ETag).
    fn objects(mut self, locations: &[Location], layout: UrlLayout) -> Result<Source> {
        let mut objects = Vec::with_capacity(locations.len());
        for location in locations {
            let store = self.clients(&location.store)?;
            let path = location
                .path()
                .map_err(|reason| invalid_url(&location.to_string(), reason))?;
            objects.push(Object::unlisted(store, path, location.to_string()));
        }
        match layout {
            UrlLayout::WebDataset => self.webdataset(objects, Vec::new()),
            _ => {
                let entries = objects
                    .into_iter()
                    .map(|o| ImageEntry::Object(o, None))
                    .collect();
                self.images(entries, None, Vec::new())
            }
        }
    }

    /// The shared part of a source reading `objects`.
    fn shared(&self, objects: Vec<Object>) -> Result<Arc<Shared>> {
        let cache = match &self.options.cache_dir {
            Some(dir) => {
                Some(
                    Cache::open(dir, self.options.cache_limit).map_err(|e| Error::Source {
                        path: dir.clone(),
                        reason: format!("cannot open the cache folder: {e}"),
                        source: Some(e),
                    })?,
                )
            }
            None => None,
        };
        Ok(Arc::new(Shared {
            handle: self.runtime.handle().clone(),
            stores: self.clients.clone(),
            objects,
            cache,
            requests: tokio::sync::Semaphore::new(self.options.max_requests),
            health: self.clients.iter().map(|_| Health::default()).collect(),
            options: self.options.clone(),
        }))
    }

    /// One object per image (with its label), or a key left out in its place, with these class
    /// names and the listing's left-out files.
    fn images(
        self,
        entries: Vec<ImageEntry>,
        class_names: Option<Vec<String>>,
        left_out: Vec<(String, usize)>,
    ) -> Result<Source> {
        let mut objects = Vec::with_capacity(entries.len());
        let mut items = Vec::with_capacity(entries.len());
        let mut places = Vec::with_capacity(entries.len());
        for entry in entries {
            match entry {
                ImageEntry::Object(object, label) => {
                    places.push(Some(objects.len() as u32));
                    items.push((object.url.clone(), label, None));
                    objects.push(object);
                }
                ImageEntry::Unnamable { id, reason, label } => {
                    places.push(None);
                    items.push((id, label, Some(reason)));
                }
            }
        }
        let shared = self.shared(objects)?;
        let reader = Reader::start(shared.clone());
        let items = items
            .into_iter()
            .zip(places)
            .map(|((id, label, reason), unit)| SourceItem {
                payload: match (unit, reason) {
                    (Some(unit), _) => Payload::Remote(Place {
                        reader: reader.clone(),
                        unit,
                        offset: 0,
                        len: shared.objects[unit as usize].meta().map(|m| m.size),
                        parts: Arc::from([]),
                    }),
                    (None, reason) => Payload::Damaged(reason.unwrap_or_default()),
                },
                id,
                label,
            })
            .collect();
        Ok(self.finish(reader, items, None, class_names, left_out))
    }

    /// WebDataset shards: each indexed (from the cache, or read whole), its samples in order;
    /// `damaged`: shards the listing left out, reported as damaged parts.
    fn webdataset(mut self, objects: Vec<Object>, damaged: Vec<SourceItem>) -> Result<Source> {
        let shared = self.shared(objects)?;
        let url = shared.objects.first().map_or("", |o| o.url.as_str());
        // Shards given by their URL learn their size as they are indexed: the first one alone,
        // then as many at once as the budget holds of the largest known.
        let budget = self.options.read_budget;
        let index = |units: std::ops::Range<usize>, at_once: usize| {
            futures_util::stream::iter(units)
                .map(|unit| index_shard(shared.clone(), unit))
                .buffered(at_once)
                .collect::<Vec<_>>()
        };
        let count = shared.objects.len();
        let first_known = shared.objects.iter().all(|o| o.meta().is_some());
        let mut indexed = Vec::with_capacity(count);
        let first = if first_known { 0 } else { 1.min(count) };
        indexed.extend(self.wait(url, index(0..first, 1))?);
        let largest = |shared: &Shared| {
            shared
                .objects
                .iter()
                .filter_map(|o| o.meta().map(|m| m.size))
                .max()
                .unwrap_or(1)
                .max(1)
        };
        let at_once = (budget / largest(&shared)).clamp(1, 16) as usize;
        indexed.extend(self.wait(url, index(first..count, at_once))?);
        let largest = largest(&shared);
        let window = match self.options.shuffle_window {
            Some(window) if (window as u64).saturating_mul(largest) > budget => {
                return Err(Error::invalid(
                    "shuffle_window",
                    format!(
                        "{window} shards of up to {largest} bytes are held at once, over the read \
                         budget of {budget} bytes: raise read_budget or lower shuffle_window"
                    ),
                ))
            }
            Some(window) => window,
            None => (budget / largest.saturating_mul(2)).clamp(1, 8) as usize,
        };
        let reader = Reader::start(shared.clone());
        let mut items = Vec::new();
        let mut lens = Vec::with_capacity(indexed.len());
        for (unit, result) in indexed.into_iter().enumerate() {
            let (entries, report) = result?;
            add(&mut self.report, &report);
            lens.push(entries.len());
            items.extend(entries.into_iter().map(|entry| match entry {
                Entry::Sample {
                    id,
                    offset,
                    len,
                    label,
                    parts,
                } => SourceItem {
                    payload: Payload::Remote(Place {
                        reader: reader.clone(),
                        unit: unit as u32,
                        offset,
                        len: Some(len),
                        parts: parts.into(),
                    }),
                    id,
                    label,
                },
                Entry::Damaged { id, reason, .. } => SourceItem {
                    payload: Payload::Damaged(reason),
                    id,
                    label: None,
                },
            }));
        }
        if items.is_empty() {
            return Err(nothing_found(
                &shared.objects[0].url,
                "the shards hold no sample".into(),
            ));
        }
        // Shards left out of the listing: each a damaged part of its own, after the others.
        for item in damaged {
            lens.push(1);
            items.push(item);
        }
        let blocks = ShardBlocks { lens, window };
        Ok(self.finish(reader, items, Some(blocks), None, Vec::new()))
    }

    fn finish(
        self,
        reader: Arc<Reader>,
        items: Vec<SourceItem>,
        blocks: Option<ShardBlocks>,
        class_names: Option<Vec<String>>,
        left_out: Vec<(String, usize)>,
    ) -> Source {
        let mut source = Source::listed(items, class_names, Vec::new(), left_out);
        source.remote = Some(Remote {
            reader,
            blocks,
            opening: self.report,
            runtime: Arc::new(Runtime(Some(self.runtime))),
        });
        source
    }
}

/// One entry of a listing of images: an object with its label, or a key that cannot be
/// requested (left out with its reason, in its place).
enum ImageEntry {
    Object(Object, Option<u32>),
    Unnamable {
        id: String,
        reason: String,
        label: Option<u32>,
    },
}

/// A listing under a prefix, turned into a source's entries.
struct Under<'a> {
    url: &'a str,
    location: &'a Location,
    store: usize,
    /// The prefix listed (a key ending in `/`), or the whole store.
    prefix: Option<String>,
}

/// Every key of a listing: the full key, its object (`None` for a key left out) and why not.
type Keys<'a> = Vec<(String, Option<&'a ObjectMeta>, Option<&'a str>)>;

/// Files left out of a listing, counted by extension.
type LeftOut = Vec<(String, usize)>;

/// An ImageFolder's entries, class names and left-out files.
type Classes = (Vec<ImageEntry>, Vec<String>, LeftOut);

impl Under<'_> {
    /// A key as the part under the prefix.
    fn relative(&self, key: &str) -> String {
        match &self.prefix {
            Some(p) => key.strip_prefix(p.as_str()).unwrap_or(key).to_string(),
            None => key.to_string(),
        }
    }

    fn object(&self, meta: &ObjectMeta) -> Object {
        Object::listed(
            self.store,
            meta.location.clone(),
            object_url(&self.location.store, &meta.location),
            Meta {
                size: meta.size,
                etag: meta.e_tag.clone(),
            },
        )
    }

    /// The URL of a key that cannot be requested (its id).
    fn key_url(&self, key: &str) -> String {
        format!("{}/{key}", self.location.store)
    }

    fn keys<'l>(&self, listed: &'l listing::Listed) -> Keys<'l> {
        let objects = listed
            .objects
            .iter()
            .map(|m| (m.location.as_ref().to_string(), Some(m), None));
        let left = listed
            .unnamable
            .iter()
            .map(|(k, r)| (k.clone(), None, Some(r.as_str())));
        objects.chain(left).collect()
    }

    /// An entry for `key`: its object with `label`, or the key left out with its reason.
    fn entry(
        &self,
        key: &str,
        meta: Option<&ObjectMeta>,
        reason: Option<&str>,
        label: Option<u32>,
    ) -> ImageEntry {
        match meta {
            Some(meta) => ImageEntry::Object(self.object(meta), label),
            None => ImageEntry::Unnamable {
                id: self.key_url(key),
                reason: reason.unwrap_or_default().to_string(),
                label,
            },
        }
    }

    /// One object per image under the prefix, in the order of a sorted folder walk, and the
    /// other objects counted by extension.
    fn images(&self, listed: &listing::Listed) -> Result<(Vec<ImageEntry>, LeftOut)> {
        let mut left_out: BTreeMap<String, usize> = BTreeMap::new();
        let mut images = Vec::new();
        for (key, meta, reason) in self.keys(listed) {
            let relative = self.relative(&key);
            if has_extension(Path::new(&relative), &DECODED_EXTENSIONS) {
                images.push((key, meta, reason));
            } else {
                *left_out.entry(extension_of(&relative)).or_default() += 1;
            }
        }
        images.sort_by(|a, b| walk_order(&self.relative(&a.0), &self.relative(&b.0)));
        if images.iter().all(|(_, meta, _)| meta.is_none()) {
            return Err(nothing_found(
                self.url,
                format!(
                    "no image object (looked for .{})",
                    DECODED_EXTENSIONS.join(", .")
                ),
            ));
        }
        let entries = images
            .into_iter()
            .map(|(key, meta, reason)| self.entry(&key, meta, reason, None))
            .collect();
        Ok((entries, left_out.into_iter().collect()))
    }

    /// torchvision's `ImageFolder` over keys: the first component under the prefix is the
    /// class; the class names, and the other objects counted by extension.
    fn classes(&self, listed: &listing::Listed) -> Result<Classes> {
        let mut left_out: BTreeMap<String, usize> = BTreeMap::new();
        let mut classes: BTreeMap<String, Keys> = BTreeMap::new();
        for (key, meta, reason) in self.keys(listed) {
            let relative = self.relative(&key);
            let Some((class, rest)) = relative.split_once('/') else {
                continue;
            };
            let files = classes.entry(class.to_string()).or_default();
            if has_extension(Path::new(rest), &IMAGE_EXTENSIONS) {
                files.push((key, meta, reason));
            } else {
                *left_out.entry(extension_of(rest)).or_default() += 1;
            }
        }
        if classes.is_empty() {
            return Err(nothing_found(
                self.url,
                "no class folders (ImageFolder wants prefix/<class>/<image>)".into(),
            ));
        }
        let empty: Vec<&str> = classes
            .iter()
            .filter(|(_, files)| files.iter().all(|(_, meta, _)| meta.is_none()))
            .map(|(name, _)| name.as_str())
            .collect();
        if !empty.is_empty() {
            return Err(nothing_found(
                self.url,
                format!(
                    "found no image object for the classes {}; image objects end in .{}",
                    empty.join(", "),
                    IMAGE_EXTENSIONS.join(", .")
                ),
            ));
        }
        let mut entries = Vec::new();
        let mut names = Vec::new();
        for (label, (name, mut files)) in classes.into_iter().enumerate() {
            files.sort_by(|a, b| walk_order(&self.relative(&a.0), &self.relative(&b.0)));
            for (key, meta, reason) in files {
                entries.push(self.entry(&key, meta, reason, Some(label as u32)));
            }
            names.push(name);
        }
        Ok((entries, names, left_out.into_iter().collect()))
    }
}

/// A key's extension as a folder listing counts it.
fn extension_of(key: &str) -> String {
    super::folders::extension_of(Path::new(key))
}

fn add(total: &mut ReadReport, part: &ReadReport) {
    total.requests += part.requests;
    total.bytes += part.bytes;
    total.fetched += part.fetched;
    total.cache_hits += part.cache_hits;
    total.cache_bytes += part.cache_bytes;
    total.failed += part.failed;
    total.cache_rejected += part.cache_rejected;
}

/// Keys in the order of a sorted folder walk (as [`Source::directory`] lists files): by the
/// folder's path, then by the name within it.
fn walk_order(a: &str, b: &str) -> std::cmp::Ordering {
    let split = |k: &str| -> (String, String) {
        match k.rsplit_once('/') {
            Some((dir, name)) => (dir.to_string(), name.to_string()),
            None => (String::new(), k.to_string()),
        }
    };
    let ((da, na), (db, nb)) = (split(a), split(b));
    da.as_bytes()
        .cmp(db.as_bytes())
        .then_with(|| na.as_bytes().cmp(nb.as_bytes()))
}

/// The samples of shard `unit`: its index from the cache (checked whole, and against the
/// shard's size), or the shard read whole and indexed (the index then kept in the cache).
async fn index_shard(
    shared: Arc<Shared>,
    unit: usize,
) -> std::result::Result<(Vec<Entry>, ReadReport), Error> {
    let object = &shared.objects[unit];
    let mut report = ReadReport::default();
    if let (Some(cache), Some(meta)) = (&shared.cache, object.meta()) {
        if let Some(text) = cache.index(&object.url, meta.etag.as_deref(), meta.size) {
            match decode_index(&text, meta.size) {
                Some(entries) => {
                    report.cache_hits += 1;
                    return Ok((entries, report));
                }
                // Damaged, cut, or of an older build: indexed again and written over.
                None => report.cache_rejected += 1,
            }
        }
    }
    // Kept in the cache (when it has room) before the first epoch looks for it there. A shard
    // given by its URL learns its size and ETag here.
    let fetched = reader::fetch(&shared, unit, CacheWrite::Before).await;
    fetched.count(&mut report, object.size_or_estimate());
    let entries = match fetched.data {
        Err(failure) => return Err(failed(&object.url, failure)),
        Ok(Data::Memory(bytes)) => tar::index_bytes(&bytes, &object.url),
        Ok(Data::File(path)) => {
            let (url, size) = (object.url.clone(), object.size_or_estimate());
            let read = shared
                .handle
                .spawn_blocking(move || index_cached(&path, size, &url))
                .await;
            match read {
                Ok(Ok(entries)) => entries,
                Ok(Err(e)) => {
                    return Err(Error::Remote {
                        url: object.url.clone(),
                        reason: format!("cannot read its copy in the cache folder: {e}"),
                        kind: e.kind(),
                    })
                }
                Err(e) => return Err(Error::Worker(format!("indexing {}: {e}", object.url))),
            }
        }
    };
    if let (Some(cache), Some(meta)) = (&shared.cache, object.meta()) {
        let _ = cache.store(
            &object.url,
            meta.etag.as_deref(),
            meta.size,
            Kind::Index,
            &encode_index(&entries),
        );
    }
    Ok((entries, report))
}

/// The index of a shard's copy in the cache folder: its first `size` bytes (the checksum's
/// trailer after them is not the shard's).
fn index_cached(path: &Path, size: u64, url: &str) -> std::io::Result<Vec<Entry>> {
    use std::io::Read;
    let mut bytes = Vec::new();
    std::fs::File::open(path)?
        .take(size)
        .read_to_end(&mut bytes)?;
    Ok(tar::index_bytes(&bytes, url))
}

/// The first line of a shard index's text.
const INDEX_HEADER: &str = "gpufeed-index 3";

/// A shard's index as text: a line a sample (`s`, offset, length, label or `-`, id, then its
/// other members as extension, offset, length) or damaged
/// part (`d`, position, id, reason), fields split by tabs, with `\`, tab and newline escaped;
/// then `end`, the count of those lines and the CRC-32 of the text before this line.
fn encode_index(entries: &[Entry]) -> Vec<u8> {
    let escape = |t: &str| {
        t.replace('\\', "\\\\")
            .replace('\t', "\\t")
            .replace('\n', "\\n")
    };
    let mut text = format!("{INDEX_HEADER}\n");
    for entry in entries {
        match entry {
            Entry::Sample {
                id,
                offset,
                len,
                label,
                parts,
            } => {
                let label = label.map_or("-".to_string(), |l| l.to_string());
                text.push_str(&format!("s\t{offset}\t{len}\t{label}\t{}", escape(id)));
                for p in parts {
                    text.push_str(&format!("\t{}\t{}\t{}", escape(&p.ext), p.offset, p.len));
                }
                text.push('\n');
            }
            Entry::Damaged { id, reason, at } => {
                text.push_str(&format!("d\t{at}\t{}\t{}\n", escape(id), escape(reason)));
            }
        }
    }
    let checksum = crc32fast::hash(text.as_bytes());
    text.push_str(&format!("end\t{}\t{checksum:08x}\n", entries.len()));
    text.into_bytes()
}

/// [`encode_index`]'s text back, for a shard of `size` bytes; `None` unless it is such a text
/// whole: its count and checksum right, its samples in order within the shard.
fn decode_index(bytes: &[u8], size: u64) -> Option<Vec<Entry>> {
    fn unescape(t: &str) -> String {
        let mut out = String::with_capacity(t.len());
        let mut chars = t.chars();
        while let Some(c) = chars.next() {
            match (c, c == '\\') {
                (_, true) => match chars.next() {
                    Some('t') => out.push('\t'),
                    Some('n') => out.push('\n'),
                    Some(other) => out.push(other),
                    None => {}
                },
                (c, false) => out.push(c),
            }
        }
        out
    }
    let text = std::str::from_utf8(bytes).ok()?;
    let body = text.strip_suffix('\n')?;
    let (body, end) = body.rsplit_once('\n')?;
    let body = format!("{body}\n");
    let mut end = end.split('\t');
    let (Some("end"), Some(count), Some(checksum), None) =
        (end.next(), end.next(), end.next(), end.next())
    else {
        return None;
    };
    if u32::from_str_radix(checksum, 16).ok()? != crc32fast::hash(body.as_bytes()) {
        return None;
    }
    let mut lines = body.lines();
    if lines.next()? != INDEX_HEADER {
        return None;
    }
    let entries = lines
        .map(|line| {
            let fields: Vec<&str> = line.split('\t').collect();
            match fields.as_slice() {
                ["s", offset, len, label, id, parts @ ..] if parts.len() % 3 == 0 => {
                    let parts = parts
                        .chunks_exact(3)
                        .map(|p| {
                            let (offset, len) = (p[1].parse().ok()?, p[2].parse().ok()?);
                            let end = u64::checked_add(offset, len)?;
                            (end <= size).then(|| tar::Part {
                                ext: unescape(p[0]),
                                offset,
                                len,
                            })
                        })
                        .collect::<Option<Vec<_>>>()?;
                    Some(Entry::Sample {
                        id: unescape(id),
                        offset: offset.parse().ok()?,
                        len: len.parse().ok()?,
                        label: match *label {
                            "-" => None,
                            l => Some(l.parse().ok()?),
                        },
                        parts,
                    })
                }
                ["d", at, id, reason] => Some(Entry::Damaged {
                    id: unescape(id),
                    reason: unescape(reason),
                    at: at.parse().ok()?,
                }),
                _ => None,
            }
        })
        .collect::<Option<Vec<Entry>>>()?;
    if entries.len() != count.parse::<usize>().ok()? {
        return None;
    }
    // Samples one after another, each within the shard.
    let mut next = 0u64;
    for entry in &entries {
        if let Entry::Sample { offset, len, .. } = entry {
            let end = offset.checked_add(*len)?;
            if *offset < next || end > size {
                return None;
            }
            next = end;
        }
    }
    Some(entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn indexes_come_back_from_their_text() {
        let entries = vec![
            Entry::Sample {
                id: "s3://b/a.tar:x\ty\\z.jpg".into(),
                offset: 512,
                len: 100,
                label: Some(3),
                parts: vec![
                    tar::Part {
                        ext: "json".into(),
                        offset: 1024 - 100,
                        len: 10,
                    },
                    tar::Part {
                        ext: "se\tg.png".into(),
                        offset: 3000,
                        len: 5,
                    },
                ],
            },
            Entry::Sample {
                id: "s3://b/a.tar:w.jpg".into(),
                offset: 1024,
                len: 7,
                label: None,
                parts: vec![],
            },
            Entry::Damaged {
                id: "s3://b/a.tar@2048".into(),
                reason: "bad tar header\nat 2048".into(),
                at: 2048,
            },
        ];
        assert_eq!(decode_index(&encode_index(&entries), 4096), Some(entries));
        assert_eq!(decode_index(b"something else\n", 4096), None);
        assert_eq!(
            decode_index(b"gpufeed-index 1\ns\tx\t1\t-\tid\n", 4096),
            None
        );
    }

    #[test]
    fn a_cut_repeated_or_changed_index_is_refused() {
        let entries: Vec<Entry> = (0..25u64)
            .map(|k| Entry::Sample {
                id: format!("s3://b/a.tar:{k}.jpg"),
                offset: 512 + k * 1024,
                len: 100,
                label: Some(k as u32 % 3),
                parts: vec![],
            })
            .collect();
        let text = String::from_utf8(encode_index(&entries)).expect("text");
        assert_eq!(decode_index(text.as_bytes(), 30_000), Some(entries.clone()));
        let lines: Vec<&str> = text.lines().collect();
        let rejoin = |lines: &[&str]| lines.iter().map(|l| format!("{l}\n")).collect::<String>();
        // Cut to 10 of 25 samples, with or without its last line.
        let cut = rejoin(&[&lines[..11], &lines[lines.len() - 1..]].concat());
        assert_eq!(decode_index(cut.as_bytes(), 30_000), None);
        assert_eq!(decode_index(rejoin(&lines[..11]).as_bytes(), 30_000), None);
        // Only the header; a line twice; one digit changed.
        assert_eq!(decode_index(rejoin(&lines[..1]).as_bytes(), 30_000), None);
        let twice = rejoin(&[&lines[..3], &lines[2..]].concat());
        assert_eq!(decode_index(twice.as_bytes(), 30_000), None);
        let changed = text.replacen("\t100\t", "\t101\t", 1);
        assert_eq!(decode_index(changed.as_bytes(), 30_000), None);
        // Whole, but for a smaller shard than its samples reach.
        assert_eq!(decode_index(text.as_bytes(), 20_000), None);
    }

    #[test]
    fn opening_inside_an_async_runtime_is_an_error_not_a_panic() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        let opened = runtime.block_on(async {
            Source::url(
                "s3://bucket/x/",
                UrlLayout::Images,
                &RemoteOptions::default(),
            )
        });
        assert!(
            matches!(&opened, Err(Error::Worker(m)) if m.contains("spawn_blocking")),
            "{opened:?}"
        );
    }

    #[test]
    fn keys_sort_as_a_folder_walk() {
        let mut keys = vec!["a-b.jpg", "a/x.jpg", "a/b/y.jpg", "b.jpg", "a/a.jpg"];
        keys.sort_by(|a, b| walk_order(a, b));
        assert_eq!(
            keys,
            vec!["a-b.jpg", "b.jpg", "a/a.jpg", "a/x.jpg", "a/b/y.jpg"]
        );
    }
}
