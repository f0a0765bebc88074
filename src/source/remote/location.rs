//! Object URLs: the store an object lives in (`s3://bucket`, `gs://bucket`, `az://container`,
//! `https://host:port`), its key there, and WebDataset's brace patterns
//! (`https://host/train-{0000..0127}.tar`).

use object_store::path::Path as ObjectPath;

/// Where an object (or a prefix) lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Location {
    pub store: StoreUrl,
    /// The key within the store, without a leading `/` (empty: the whole bucket).
    pub key: String,
}

/// A store, by the part of a URL before the key.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) struct StoreUrl {
    pub scheme: Scheme,
    /// The bucket or container (S3, GCS, Azure), or `host[:port]` (HTTP).
    pub authority: String,
}

/// The kinds of store a URL can name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) enum Scheme {
    S3,
    Gcs,
    Azure,
    Http,
    Https,
}

impl Scheme {
    fn name(self) -> &'static str {
        match self {
            Scheme::S3 => "s3",
            Scheme::Gcs => "gs",
            Scheme::Azure => "az",
            Scheme::Http => "http",
            Scheme::Https => "https",
        }
    }

    /// Whether the store can list the objects under a prefix (HTTP servers cannot).
    pub fn lists(self) -> bool {
        !matches!(self, Scheme::Http | Scheme::Https)
    }
}

impl std::fmt::Display for StoreUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}://{}", self.scheme.name(), self.authority)
    }
}

impl Location {
    /// Parses `s3://bucket/key`, `gs://bucket/key`, `az://container/key` (also `azure://`) or
    /// `http(s)://host[:port]/path`.
    pub fn parse(url: &str) -> Result<Location, String> {
        let (scheme, rest) = url.split_once("://").ok_or_else(|| {
            format!("{url:?} is not a URL (s3://, gs://, az://, http:// or https://)")
        })?;
        let scheme = match scheme.to_ascii_lowercase().as_str() {
            "s3" | "s3a" => Scheme::S3,
            "gs" | "gcs" => Scheme::Gcs,
            "az" | "azure" | "abfs" | "abfss" => Scheme::Azure,
            "http" => Scheme::Http,
            "https" => Scheme::Https,
            other => {
                return Err(format!(
                    "{url:?}: unknown scheme {other:?} (s3, gs, az, http or https)"
                ))
            }
        };
        let (authority, key) = rest.split_once('/').unwrap_or((rest, ""));
        if authority.is_empty() {
            return Err(format!("{url:?} names no bucket or host"));
        }
        Ok(Location {
            store: StoreUrl {
                scheme,
                authority: authority.to_string(),
            },
            key: key.to_string(),
        })
    }

    /// The key as the store's path: for HTTP the URL path with its `%` escapes decoded, for the
    /// others the key as written (as the AWS command line takes it).
    pub fn path(&self) -> Result<ObjectPath, String> {
        let key = self.key.trim_end_matches('/');
        match self.store.scheme {
            Scheme::Http | Scheme::Https => ObjectPath::from_url_path(key),
            _ => ObjectPath::parse(key),
        }
        .map_err(|e| format!("{self}: not an object key: {e}"))
    }

    /// Whether the URL names a prefix to list rather than one object: it ends in `/` or names
    /// a whole bucket.
    pub fn is_prefix(&self) -> bool {
        self.key.is_empty() || self.key.ends_with('/')
    }
}

impl std::fmt::Display for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.store, self.key)
    }
}

/// The URL of the object at `path` in `store`, as ids name it.
pub(super) fn object_url(store: &StoreUrl, path: &ObjectPath) -> String {
    format!("{store}/{path}")
}

/// WebDataset's brace patterns (Python's `braceexpand`): `{a,b}` is each choice, `{0..12}` each
/// number, `{000..012}` each number padded to three digits; several groups give every
/// combination, in order. Text without braces is itself.
pub(super) fn expand_braces(pattern: &str) -> Result<Vec<String>, String> {
    let Some(open) = pattern.find('{') else {
        if pattern.contains('}') {
            return Err(format!("{pattern:?}: a '}}' without its '{{'"));
        }
        return Ok(vec![pattern.to_string()]);
    };
    let close = pattern[open..]
        .find('}')
        .map(|i| open + i)
        .ok_or_else(|| format!("{pattern:?}: a '{{' without its '}}'"))?;
    let (head, body, tail) = (
        &pattern[..open],
        &pattern[open + 1..close],
        &pattern[close + 1..],
    );
    if body.contains('{') {
        return Err(format!("{pattern:?}: nested braces are not supported"));
    }
    let choices = match body.split_once("..") {
        Some((a, b)) if is_number(a) && is_number(b) => numeric_range(pattern, a, b)?,
        _ if body.contains(',') => body.split(',').map(str::to_string).collect(),
        _ => {
            return Err(format!(
                "{pattern:?}: {{{body}}} is neither a list {{a,b}} nor a range {{0000..0127}}"
            ))
        }
    };
    let tails = expand_braces(tail)?;
    let mut out = Vec::with_capacity(choices.len() * tails.len());
    for choice in &choices {
        for rest in &tails {
            out.push(format!("{head}{choice}{rest}"));
        }
    }
    Ok(out)
}

fn is_number(text: &str) -> bool {
    !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit())
}

/// `{a..b}`: the numbers from `a` to `b` (down if `b < a`), padded with zeros to the width of
/// the wider bound when either is written with a leading zero.
fn numeric_range(pattern: &str, a: &str, b: &str) -> Result<Vec<String>, String> {
    let parse = |t: &str| {
        t.parse::<u64>()
            .map_err(|_| format!("{pattern:?}: {t} is too large"))
    };
    let (from, to) = (parse(a)?, parse(b)?);
    let padded = (a.len() > 1 && a.starts_with('0')) || (b.len() > 1 && b.starts_with('0'));
    let width = if padded { a.len().max(b.len()) } else { 0 };
    const MAX: u64 = 10_000_000;
    if from.abs_diff(to) >= MAX {
        return Err(format!("{pattern:?}: more than {MAX} names"));
    }
    let numbers: Vec<u64> = if from <= to {
        (from..=to).collect()
    } else {
        (to..=from).rev().collect()
    };
    Ok(numbers
        .into_iter()
        .map(|n| format!("{n:0width$}"))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn braces_expand_as_webdataset_expands_them() {
        assert_eq!(
            expand_braces("s3://b/train-{0000..0002}.tar").unwrap(),
            vec![
                "s3://b/train-0000.tar",
                "s3://b/train-0001.tar",
                "s3://b/train-0002.tar"
            ]
        );
        assert_eq!(
            expand_braces("https://h/{a,b}/{8..10}.tar").unwrap(),
            vec![
                "https://h/a/8.tar",
                "https://h/a/9.tar",
                "https://h/a/10.tar",
                "https://h/b/8.tar",
                "https://h/b/9.tar",
                "https://h/b/10.tar"
            ]
        );
        assert_eq!(expand_braces("{2..0}").unwrap(), vec!["2", "1", "0"]);
        assert_eq!(expand_braces("plain").unwrap(), vec!["plain"]);
        for bad in ["a{1..2", "a}b", "{x}", "{{1,2}}"] {
            assert!(expand_braces(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn urls_name_their_store_and_key() {
        let l = Location::parse("s3://bucket/pre/fix/").unwrap();
        assert_eq!(l.store.to_string(), "s3://bucket");
        assert_eq!(l.key, "pre/fix/");
        assert!(l.is_prefix());
        assert_eq!(l.path().unwrap().as_ref(), "pre/fix");
        let l = Location::parse("https://127.0.0.1:8080/a%20b/c.tar").unwrap();
        assert_eq!(l.store.to_string(), "https://127.0.0.1:8080");
        assert!(!l.is_prefix());
        assert_eq!(l.path().unwrap().as_ref(), "a b/c.tar");
        assert!(Location::parse("s3://bucket").unwrap().is_prefix());
        assert!(Location::parse("ftp://x/y").is_err());
        assert!(Location::parse("/local/path").is_err());
        assert!(Location::parse("s3:///key").is_err());
    }
}
