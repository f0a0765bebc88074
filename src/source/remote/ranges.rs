//! Objects read by byte ranges, each read waited for (features `object-store` and `parquet`):
//! what a Parquet source in object storage reads, its files' footers and the column chunks its
//! row groups need, without reading the rest of the files.

use std::ops::Range;
use std::sync::Arc;

use object_store::path::Path as ObjectPath;
use object_store::ObjectStoreExt;

use super::listing::{self, Bounds};
use super::location::{object_url, Location};
use super::store::{Clients, Retries, Tries};
use super::{failed, invalid_url, nothing_found, Opening, RemoteOptions, Runtime};
use crate::error::Result;

/// One object to read by ranges: its URL (its id) and size.
#[derive(Debug, Clone)]
pub(crate) struct RangeObject {
    pub url: String,
    path: ObjectPath,
    pub size: u64,
}

/// Reads ranges of objects of one store, on a runtime of its own.
pub(crate) struct RangeReader {
    runtime: Arc<Runtime>,
    clients: Clients,
    options: RemoteOptions,
}

impl std::fmt::Debug for RangeReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RangeReader")
            .field("clients", &self.clients)
            .finish()
    }
}

impl RangeReader {
    /// Bytes `range` of `object`, retried as the options say (a timeout, a 5xx answer, a
    /// dropped connection); the reason names the object and the range.
    pub(crate) fn read(
        &self,
        object: &RangeObject,
        range: Range<u64>,
    ) -> std::result::Result<bytes::Bytes, String> {
        let Some(runtime) = self.runtime.0.as_ref() else {
            return Err(format!("{}: the source is closed", object.url));
        };
        let what = format!("{} (bytes {}..{})", object.url, range.start, range.end);
        runtime.block_on(async {
            let salt = range.start >> 16;
            let mut tries = Tries::begin(Retries::of(&self.options), None, &what, salt)
                .map_err(|f| f.reason)?;
            loop {
                let limit = tries.next_try();
                let got = tokio::time::timeout(
                    limit,
                    self.clients.store.get_range(&object.path, range.clone()),
                )
                .await;
                let failure = match got {
                    Ok(Ok(bytes)) if bytes.len() as u64 == range.end - range.start => {
                        tries.succeeded();
                        return Ok(bytes);
                    }
                    Ok(Ok(bytes)) => {
                        return Err(format!("{what}: {} bytes came back", bytes.len()));
                    }
                    Ok(Err(e)) => self.clients.failure(&what, &e),
                    Err(_) => tries.timed_out(limit),
                };
                if failure.refused {
                    return Err(failure.reason);
                }
                tries.failed(failure).await.map_err(|f| f.reason)?;
            }
        })
    }
}

/// The objects at `url` whose keys end with `extension` (a prefix is listed, sorted by key; one
/// object is asked for its size), and their reader.
pub(crate) fn objects(
    url: &str,
    extension: &str,
    options: &RemoteOptions,
) -> Result<(Arc<RangeReader>, Vec<RangeObject>)> {
    let location = Location::parse(url).map_err(|reason| invalid_url(url, reason))?;
    let mut opening = Opening::new(options)?;
    let index = opening.clients(&location.store)?;
    let clients = opening.clients[index].clone();
    let retries = Retries::of(options);
    let names_object = !location.is_prefix()
        && location.key.to_ascii_lowercase().ends_with(extension)
        || !location.store.scheme.lists();
    let mut objects = Vec::new();
    if names_object {
        let path = location.path().map_err(|reason| invalid_url(url, reason))?;
        let head = opening.wait(url, clients.store.head(&path))?;
        let meta = head.map_err(|e| failed(url, clients.failure(url, &e)))?;
        objects.push(RangeObject {
            url: url.to_string(),
            path,
            size: meta.size,
        });
    } else {
        let prefix = match location.key.trim_end_matches('/') {
            "" => None,
            key => Some(format!("{key}/")),
        };
        let listed = opening
            .wait(
                url,
                listing::list(
                    &clients,
                    retries,
                    Bounds::of(options),
                    url,
                    prefix.as_deref(),
                    false,
                ),
            )?
            .map_err(|f| failed(url, f))?;
        for meta in listed.objects {
            if meta
                .location
                .as_ref()
                .to_ascii_lowercase()
                .ends_with(extension)
            {
                objects.push(RangeObject {
                    url: object_url(&location.store, &meta.location),
                    path: meta.location,
                    size: meta.size,
                });
            }
        }
        objects.sort_by(|a, b| a.url.cmp(&b.url));
        if objects.is_empty() {
            return Err(nothing_found(
                url,
                format!("no {extension} object under it"),
            ));
        }
    }
    let runtime = Arc::new(Runtime(Some(opening.runtime)));
    let reader = RangeReader {
        runtime,
        clients,
        options: options.clone(),
    };
    Ok((Arc::new(reader), objects))
}

/// The part of an object's URL after `data/`, for a Hugging Face dataset's split (`None` when
/// the key has no `data/` folder).
pub(crate) fn under_data(url: &str) -> Option<&str> {
    url.split_once("/data/").map(|(_, rest)| rest)
}
