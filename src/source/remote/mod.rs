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
mod location;
mod reader;
mod store;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures_util::{StreamExt, TryStreamExt};
use object_store::{ObjectMeta, ObjectStoreExt};

use super::folders::{has_extension, DECODED_EXTENSIONS, IMAGE_EXTENSIONS};
use super::tar::{self, Entry};
use super::{OpenItem, Payload, SharedBytes, Source, SourceItem};
use crate::error::{Error, ItemErrorKind, Result};
use crate::order::{EpochOrder, ShardBlocks};
use crate::source::ReadReport;
use cache::{Cache, Kind};
use location::{expand_braces, object_url, Location, StoreUrl};
use reader::{CacheWrite, Data, Object, Reader, Shared};
use store::Clients;

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

/// How a source in object storage is read: the byte budget, the requests in flight, the shuffle
/// window of shards, the local cache and the faults' timeouts. Credentials and endpoints come
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
    /// Time one request may take, connection included, before it counts as failed and is
    /// retried (default 30 s).
    pub request_timeout: Duration,
    /// How long a failing read is retried, with exponential backoff, before its samples fail
    /// (default 60 s). Timeouts, 5xx answers, throttling and dropped connections are retried;
    /// refused credentials and missing objects are not.
    pub retry_timeout: Duration,
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

/// Where an item's bytes are: `len` bytes at `offset` of object `unit` (the whole object for
/// an image, a member for a shard's sample).
#[derive(Debug, Clone)]
pub(crate) struct Place {
    reader: Arc<Reader>,
    unit: u32,
    offset: u64,
    len: u64,
}

impl Place {
    /// Encoded size in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// The item's bytes, waiting while its object is read; refused as a local file would be
    /// (over `max_bytes`, empty, not an image format).
    pub fn open(&self, max_bytes: u64) -> std::result::Result<OpenItem, ItemErrorKind> {
        if self.len > max_bytes {
            return Err(ItemErrorKind::FileTooLarge {
                bytes: self.len,
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
        match data {
            Data::Memory(buffer) => {
                let start = usize::try_from(self.offset).unwrap_or(usize::MAX);
                let end = start.saturating_add(usize::try_from(self.len).unwrap_or(usize::MAX));
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
            Data::File(path) => OpenItem::file_part(&path, self.offset, self.len, max_bytes),
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

    /// The objects under a prefix, as `layout` reads them.
    fn prefix(mut self, url: &str, location: &Location, layout: UrlLayout) -> Result<Source> {
        let store = self.clients(&location.store)?;
        let prefix = match location.key.trim_end_matches('/') {
            "" => None,
            _ => Some(location.path().map_err(|reason| invalid_url(url, reason))?),
        };
        let client = self.clients[store].patient.clone();
        let listed: Vec<ObjectMeta> = self
            .runtime
            .block_on(async {
                match layout {
                    UrlLayout::WebDataset => client
                        .list_with_delimiter(prefix.as_ref())
                        .await
                        .map(|listing| listing.objects),
                    _ => client.list(prefix.as_ref()).try_collect().await,
                }
            })
            .map_err(|e| failed(url, store::failure(url, &e)))?;
        self.report.requests += 1;
        let relative = |meta: &ObjectMeta| -> String {
            let key = meta.location.as_ref();
            match &prefix {
                Some(p) => key
                    .strip_prefix(p.as_ref())
                    .map_or(key, |rest| rest.trim_start_matches('/'))
                    .to_string(),
                None => key.to_string(),
            }
        };
        let object = |meta: &ObjectMeta| Object {
            store,
            url: object_url(&location.store, &meta.location),
            path: meta.location.clone(),
            size: meta.size,
            etag: meta.e_tag.clone(),
        };
        match layout {
            UrlLayout::WebDataset => {
                let mut shards: Vec<&ObjectMeta> = listed
                    .iter()
                    .filter(|m| m.location.as_ref().to_ascii_lowercase().ends_with(".tar"))
                    .collect();
                shards.sort_by(|a, b| a.location.as_ref().cmp(b.location.as_ref()));
                if shards.is_empty() {
                    return Err(nothing_found(url, "no .tar shard under it".into()));
                }
                let objects = shards.into_iter().map(object).collect();
                self.webdataset(objects)
            }
            UrlLayout::Images => {
                let mut images: Vec<(String, &ObjectMeta)> = listed
                    .iter()
                    .map(|m| (relative(m), m))
                    .filter(|(key, _)| has_extension(Path::new(key), &DECODED_EXTENSIONS))
                    .collect();
                images.sort_by(|a, b| walk_order(&a.0, &b.0));
                if images.is_empty() {
                    return Err(nothing_found(
                        url,
                        format!(
                            "no image object (looked for .{})",
                            DECODED_EXTENSIONS.join(", .")
                        ),
                    ));
                }
                let objects = images.into_iter().map(|(_, m)| object(m)).collect();
                self.images(objects, None, None)
            }
            UrlLayout::ImageFolder => {
                // Class: the first component of the key under the prefix.
                let mut classes: BTreeMap<String, Vec<(String, &ObjectMeta)>> = BTreeMap::new();
                for meta in &listed {
                    let key = relative(meta);
                    let Some((class, rest)) = key.split_once('/') else {
                        continue;
                    };
                    let files = classes.entry(class.to_string()).or_default();
                    if has_extension(Path::new(rest), &IMAGE_EXTENSIONS) {
                        files.push((key.clone(), meta));
                    }
                }
                if classes.is_empty() {
                    return Err(nothing_found(
                        url,
                        "no class folders (ImageFolder wants prefix/<class>/<image>)".into(),
                    ));
                }
                let empty: Vec<&str> = classes
                    .iter()
                    .filter(|(_, files)| files.is_empty())
                    .map(|(name, _)| name.as_str())
                    .collect();
                if !empty.is_empty() {
                    return Err(nothing_found(
                        url,
                        format!(
                            "found no image object for the classes {}; image objects end in .{}",
                            empty.join(", "),
                            IMAGE_EXTENSIONS.join(", .")
                        ),
                    ));
                }
                let mut objects = Vec::new();
                let mut labels = Vec::new();
                let mut names = Vec::new();
                for (label, (name, mut files)) in classes.into_iter().enumerate() {
                    files.sort_by(|a, b| walk_order(&a.0, &b.0));
                    labels.extend(std::iter::repeat_n(label as u32, files.len()));
                    objects.extend(files.into_iter().map(|(_, m)| object(m)));
                    names.push(name);
                }
                self.images(objects, Some(labels), Some(names))
            }
        }
    }

    /// These objects, each asked for its size and ETag (64 at a time), as `layout` reads them.
    fn objects(mut self, locations: &[Location], layout: UrlLayout) -> Result<Source> {
        let mut asks = Vec::with_capacity(locations.len());
        for location in locations {
            let store = self.clients(&location.store)?;
            let path = location
                .path()
                .map_err(|reason| invalid_url(&location.to_string(), reason))?;
            asks.push((store, path, location.to_string()));
        }
        let clients = &self.clients;
        let metas: Vec<std::result::Result<ObjectMeta, Error>> = self.runtime.block_on(
            futures_util::stream::iter(asks.iter())
                .map(|(store, path, url)| async move {
                    clients[*store]
                        .patient
                        .head(path)
                        .await
                        .map_err(|e| failed(url, store::failure(url, &e)))
                })
                .buffered(64)
                .collect(),
        );
        self.report.requests += asks.len() as u64;
        let mut objects = Vec::with_capacity(asks.len());
        for ((store, path, url), meta) in asks.into_iter().zip(metas) {
            let meta = meta?;
            objects.push(Object {
                store,
                path,
                url,
                size: meta.size,
                etag: meta.e_tag,
            });
        }
        match layout {
            UrlLayout::WebDataset => self.webdataset(objects),
            _ => self.images(objects, None, None),
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
            down: Default::default(),
            options: self.options.clone(),
        }))
    }

    /// One object per image, with these labels and class names.
    fn images(
        self,
        objects: Vec<Object>,
        labels: Option<Vec<u32>>,
        class_names: Option<Vec<String>>,
    ) -> Result<Source> {
        let shared = self.shared(objects)?;
        let reader = Reader::start(shared.clone());
        let items = shared
            .objects
            .iter()
            .enumerate()
            .map(|(unit, object)| SourceItem {
                payload: Payload::Remote(Place {
                    reader: reader.clone(),
                    unit: unit as u32,
                    offset: 0,
                    len: object.size,
                }),
                id: object.url.clone(),
                label: labels.as_ref().map(|l| l[unit]),
            })
            .collect();
        Ok(self.finish(reader, items, None, class_names))
    }

    /// WebDataset shards: each indexed (from the cache, or read whole), its samples in order.
    fn webdataset(mut self, objects: Vec<Object>) -> Result<Source> {
        let largest = objects.iter().map(|o| o.size).max().unwrap_or(0).max(1);
        let budget = self.options.read_budget;
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
        let shared = self.shared(objects)?;
        let at_once = (budget / largest).clamp(1, 16) as usize;
        let indexed: Vec<std::result::Result<(Vec<Entry>, ReadReport), Error>> =
            self.runtime.block_on(
                futures_util::stream::iter(0..shared.objects.len())
                    .map(|unit| index_shard(shared.clone(), unit))
                    .buffered(at_once)
                    .collect(),
            );
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
                } => SourceItem {
                    payload: Payload::Remote(Place {
                        reader: reader.clone(),
                        unit: unit as u32,
                        offset,
                        len,
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
        let blocks = ShardBlocks { lens, window };
        Ok(self.finish(reader, items, Some(blocks), None))
    }

    fn finish(
        self,
        reader: Arc<Reader>,
        items: Vec<SourceItem>,
        blocks: Option<ShardBlocks>,
        class_names: Option<Vec<String>>,
    ) -> Source {
        let mut source = Source::listed(items, class_names, Vec::new(), Vec::new());
        source.remote = Some(Remote {
            reader,
            blocks,
            opening: self.report,
            runtime: Arc::new(Runtime(Some(self.runtime))),
        });
        source
    }
}

fn add(total: &mut ReadReport, part: &ReadReport) {
    total.requests += part.requests;
    total.bytes += part.bytes;
    total.fetched += part.fetched;
    total.cache_hits += part.cache_hits;
    total.cache_bytes += part.cache_bytes;
    total.failed += part.failed;
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

/// The samples of shard `unit`: its index from the cache, or the shard read whole and indexed
/// (the index then kept in the cache).
async fn index_shard(
    shared: Arc<Shared>,
    unit: usize,
) -> std::result::Result<(Vec<Entry>, ReadReport), Error> {
    let object = &shared.objects[unit];
    let mut report = ReadReport::default();
    if let Some(cache) = &shared.cache {
        if let Some(entries) = cache
            .index(&object.url, object.etag.as_deref(), object.size)
            .and_then(|text| decode_index(&text))
        {
            report.cache_hits += 1;
            return Ok((entries, report));
        }
    }
    // Kept in the cache (when it has room) before the first epoch looks for it there.
    let fetched = reader::fetch(&shared, unit, CacheWrite::Before).await;
    fetched.count(&mut report, object.size);
    let entries = match fetched.data {
        Err(failure) => return Err(failed(&object.url, failure)),
        Ok(Data::Memory(bytes)) => tar::index_bytes(&bytes, &object.url),
        Ok(Data::File(path)) => {
            let url = object.url.clone();
            let read = shared
                .handle
                .spawn_blocking(move || tar::index_file(&path, &url))
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
    if let Some(cache) = &shared.cache {
        let _ = cache.store(
            &object.url,
            object.etag.as_deref(),
            object.size,
            Kind::Index,
            &encode_index(&entries),
        );
    }
    Ok((entries, report))
}

/// A shard's index as text: a line a sample (`s`, offset, length, label or `-`, id) or damaged
/// part (`d`, position, id, reason), fields split by tabs, with `\`, tab and newline escaped.
fn encode_index(entries: &[Entry]) -> Vec<u8> {
    let escape = |t: &str| {
        t.replace('\\', "\\\\")
            .replace('\t', "\\t")
            .replace('\n', "\\n")
    };
    let mut text = String::from("gpufeed-index 1\n");
    for entry in entries {
        match entry {
            Entry::Sample {
                id,
                offset,
                len,
                label,
            } => {
                let label = label.map_or("-".to_string(), |l| l.to_string());
                text.push_str(&format!("s\t{offset}\t{len}\t{label}\t{}\n", escape(id)));
            }
            Entry::Damaged { id, reason, at } => {
                text.push_str(&format!("d\t{at}\t{}\t{}\n", escape(id), escape(reason)));
            }
        }
    }
    text.into_bytes()
}

/// [`encode_index`]'s text back; `None` if it is not such a text.
fn decode_index(bytes: &[u8]) -> Option<Vec<Entry>> {
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
    let mut lines = text.lines();
    if lines.next()? != "gpufeed-index 1" {
        return None;
    }
    lines
        .map(|line| {
            let fields: Vec<&str> = line.split('\t').collect();
            match fields.as_slice() {
                ["s", offset, len, label, id] => Some(Entry::Sample {
                    id: unescape(id),
                    offset: offset.parse().ok()?,
                    len: len.parse().ok()?,
                    label: match *label {
                        "-" => None,
                        l => Some(l.parse().ok()?),
                    },
                }),
                ["d", at, id, reason] => Some(Entry::Damaged {
                    id: unescape(id),
                    reason: unescape(reason),
                    at: at.parse().ok()?,
                }),
                _ => None,
            }
        })
        .collect()
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
            },
            Entry::Sample {
                id: "s3://b/a.tar:w.jpg".into(),
                offset: 1024,
                len: 7,
                label: None,
            },
            Entry::Damaged {
                id: "s3://b/a.tar@2048".into(),
                reason: "bad tar header\nat 2048".into(),
                at: 2048,
            },
        ];
        assert_eq!(decode_index(&encode_index(&entries)), Some(entries));
        assert_eq!(decode_index(b"something else\n"), None);
        assert_eq!(decode_index(b"gpufeed-index 1\ns\tx\t1\t-\tid\n"), None);
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
