//! Listing a prefix page by page, within bounds: at most [`RemoteOptions::max_listed_objects`]
//! objects and [`RemoteOptions::max_listed_bytes`] of key names, a continuation token never
//! twice, keys only forward, a few empty pages in a row at most. A server that loops (the same
//! token, or the same keys, forever) is an error on its second page, not a listing that grows
//! until memory runs out.
//!
//! A key `object_store` cannot name (one holding a control character such as a newline or a
//! tab) fails the page it is on; the page is asked again in smaller pages up to that key, which
//! is then left out with a reason and the listing goes on after it.

use std::collections::HashSet;
use std::sync::Arc;

use object_store::list::{PaginatedListOptions, PaginatedListResult, PaginatedListStore};
use object_store::ObjectMeta;

use super::store::{retrying, Clients, Failure, Retries};
use super::RemoteOptions;

/// Consecutive empty pages that still promise more (a truncated listing with nothing in it)
/// after which the listing is taken to loop.
const MAX_EMPTY_PAGES: u32 = 16;

/// What a listing found.
#[derive(Debug, Default)]
pub(super) struct Listed {
    /// The objects, in key order.
    pub objects: Vec<ObjectMeta>,
    /// Keys left out because they cannot be requested, with the reason.
    pub unnamable: Vec<(String, String)>,
    /// Requests made.
    pub requests: u64,
}

/// One answer to a page request: the page, or the key that made the page unreadable.
enum Page {
    Listed(PaginatedListResult),
    Unnamable(String),
}

/// The bounds of one listing.
#[derive(Debug, Clone, Copy)]
pub(super) struct Bounds {
    pub objects: u64,
    pub bytes: u64,
}

impl Bounds {
    pub fn of(options: &RemoteOptions) -> Bounds {
        Bounds {
            objects: options.max_listed_objects,
            bytes: options.max_listed_bytes,
        }
    }
}

/// Lists the objects under `prefix` (a key ending in `/`, or the whole store), with `delimiter`
/// only those directly under it; `url` names the listing in errors.
pub(super) async fn list(
    clients: &Clients,
    retries: Retries,
    bounds: Bounds,
    url: &str,
    prefix: Option<&str>,
    delimiter: bool,
) -> Result<Listed, Failure> {
    let Some(lister) = clients.lister.clone() else {
        return Err(wrong(url, "this store cannot be listed".into()));
    };
    let mut listed = Listed::default();
    let mut tokens = HashSet::new();
    let mut token: Option<String> = None;
    // Listing from after this key (when there is no token): past a key left out.
    let mut after: Option<String> = None;
    // Keys asked for at once while narrowing in on a key that cannot be named.
    let mut narrow: Option<usize> = None;
    let mut last_key: Option<String> = None;
    let mut key_bytes = 0u64;
    let mut empty_pages = 0;
    loop {
        let options = PaginatedListOptions {
            offset: token.is_none().then(|| after.clone()).flatten(),
            delimiter: delimiter.then_some(std::borrow::Cow::Borrowed("/")),
            max_keys: narrow,
            page_token: token.clone(),
            ..PaginatedListOptions::default()
        };
        let page = retrying(retries, None, url, listed.requests, |_| {
            page(&lister, clients, url, prefix, options.clone())
        })
        .await;
        listed.requests += 1;
        let result = match page? {
            Page::Unnamable(key) => {
                if narrow == Some(1) {
                    // The next key is the one: left out, and the listing goes on after it.
                    if after.as_deref() == Some(key.as_str()) {
                        return Err(wrong(
                            url,
                            format!("the listing does not move past the key {key:?}"),
                        ));
                    }
                    listed.unnamable.push((key.clone(), unnamable_reason(&key)));
                    after = Some(match key.ends_with('/') {
                        // A folder (a common prefix): past everything under it.
                        true => format!("{key}\u{10FFFF}"),
                        false => key,
                    });
                    token = None;
                    narrow = None;
                } else {
                    narrow = Some(narrow.map_or(500, |n| (n / 2).max(1)));
                }
                continue;
            }
            Page::Listed(result) => result,
        };
        narrow = None;
        let objects = result.result.objects;
        if objects.is_empty() && result.result.common_prefixes.is_empty() {
            empty_pages += 1;
        } else {
            empty_pages = 0;
        }
        for meta in objects {
            let key = meta.location.as_ref();
            if let Some(last) = &last_key {
                if key.as_bytes() <= last.as_bytes() {
                    return Err(wrong(
                        url,
                        format!(
                            "the listing went back (key {key:?} after {last:?}): the server's \
                             listing loops"
                        ),
                    ));
                }
            }
            key_bytes += key.len() as u64;
            last_key = Some(key.to_string());
            listed.objects.push(meta);
        }
        if listed.objects.len() as u64 > bounds.objects {
            return Err(wrong(
                url,
                format!(
                    "more than {} objects under it (max_listed_objects): list a narrower \
                     prefix, or raise the bound",
                    bounds.objects
                ),
            ));
        }
        if key_bytes > bounds.bytes {
            return Err(wrong(
                url,
                format!(
                    "its keys take more than {} bytes (max_listed_bytes): list a narrower \
                     prefix, or raise the bound",
                    bounds.bytes
                ),
            ));
        }
        match result.page_token.filter(|t| !t.is_empty()) {
            None => return Ok(listed),
            Some(next) => {
                if !tokens.insert(next.clone()) {
                    return Err(wrong(
                        url,
                        format!(
                            "the server gave the continuation token {next:?} twice, after {} \
                             pages: its listing loops",
                            listed.requests
                        ),
                    ));
                }
                if empty_pages >= MAX_EMPTY_PAGES {
                    return Err(wrong(
                        url,
                        format!(
                            "{empty_pages} empty pages in a row, each promising more: the \
                             listing does not move"
                        ),
                    ));
                }
                token = Some(next);
            }
        }
    }
}

/// One page request.
async fn page(
    lister: &Arc<dyn PaginatedListStore>,
    clients: &Clients,
    url: &str,
    prefix: Option<&str>,
    options: PaginatedListOptions,
) -> Result<Page, Failure> {
    match lister.list_paginated(prefix, options).await {
        Ok(result) => Ok(Page::Listed(result)),
        Err(object_store::Error::InvalidPath {
            source: object_store::path::Error::BadSegment { path, .. },
        }) => Ok(Page::Unnamable(path)),
        Err(e) => Err(clients.failure(url, &e)),
    }
}

/// Why a key is left out: the character `object_store` cannot send.
pub(super) fn unnamable_reason(key: &str) -> String {
    let bad = key
        .chars()
        .find(|c| c.is_ascii_control())
        .map_or_else(String::new, |c| format!(" ({c:?})"));
    format!(
        "its key holds a control character{bad}, which the object-storage client cannot \
         request: left out of the listing"
    )
}

fn wrong(url: &str, reason: String) -> Failure {
    Failure {
        kind: std::io::ErrorKind::InvalidData,
        reason: format!("{url}: {reason}"),
        refused: true,
    }
}
