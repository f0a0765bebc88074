//! A fault-injecting proxy in front of an S3 server (or any HTTP server): requests pass through
//! unchanged (signatures stay valid: the client signs for the proxy's address, which is the
//! `Host` the server sees), and the answers are what [`Fault`] says: a listing that loops, keys
//! no client can name, a server that never answers, answers at 1 byte a second, or every GET
//! refused with 503. It counts the requests it sees by kind.
//!
//! One request a connection: the proxy asks the server to close after its answer, and closes
//! the client's connection after relaying it.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::TryStreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectMeta, ObjectStore};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What the proxy does to the requests it relays.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Fault {
    /// Nothing: every request is relayed as it is.
    #[default]
    None,
    /// Every listing page (`GET ?list-type=2`) is answered by the proxy: `keys_per_page` keys
    /// and `IsTruncated` true, with the same continuation token every time or a new one, and
    /// the same keys every time or new ones (a listing that never ends).
    EndlessListing {
        /// Keys on each page (0: empty pages).
        keys_per_page: usize,
        /// New keys on each page, after the last page's.
        fresh_keys: bool,
        /// A new continuation token on each page.
        fresh_tokens: bool,
    },
    /// The listing holds these keys beside the server's (as `<Contents>` entries, their text
    /// escaped with character references, so `\n` is `&#xA;`): the proxy lists the server
    /// itself and answers each page request, in key order, `max-keys`, `start-after` and
    /// continuation tokens as S3 does.
    ExtraKeys(Vec<String>),
    /// Connections are accepted and requests read, but nothing is ever answered.
    Silent,
    /// GET answers come at this many bytes a second (their headers at once); listings and
    /// HEADs pass as they are.
    Slow {
        /// Bytes a second of each answer's body.
        bytes_per_second: u32,
    },
    /// Every GET of an object (not a listing) is answered with this status (503: `SlowDown`).
    Status(u16),
}

/// Requests the proxy saw, by kind.
#[derive(Debug, Default)]
pub struct Counts {
    /// GETs of objects.
    pub gets: AtomicU64,
    /// HEADs.
    pub heads: AtomicU64,
    /// Listing pages.
    pub lists: AtomicU64,
    /// Connections open now.
    pub open: AtomicUsize,
}

/// A proxy on a free loopback port in front of `upstream` (`host:port`).
pub struct FaultProxy {
    port: u16,
    fault: Arc<Mutex<Fault>>,
    counts: Arc<Counts>,
    runtime: tokio::runtime::Runtime,
}

impl FaultProxy {
    /// Starts a proxy to `upstream` (`127.0.0.1:PORT`), relaying unchanged until
    /// [`FaultProxy::set`]; `lister` lists the bucket for [`Fault::ExtraKeys`].
    pub fn start(upstream: &str, lister: Arc<dyn ObjectStore>) -> std::io::Result<FaultProxy> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?;
        let listener = runtime.block_on(TcpListener::bind("127.0.0.1:0"))?;
        let port = listener.local_addr()?.port();
        let fault = Arc::new(Mutex::new(Fault::None));
        let counts = Arc::new(Counts::default());
        let (upstream, shared_fault, shared_counts) =
            (upstream.to_string(), fault.clone(), counts.clone());
        runtime.spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (upstream, fault, counts, lister) = (
                    upstream.clone(),
                    shared_fault.clone(),
                    shared_counts.clone(),
                    lister.clone(),
                );
                tokio::spawn(async move {
                    counts.open.fetch_add(1, Ordering::SeqCst);
                    let _ = serve(client, &upstream, &fault, &counts, &lister).await;
                    counts.open.fetch_sub(1, Ordering::SeqCst);
                });
            }
        });
        Ok(FaultProxy {
            port,
            fault,
            counts,
            runtime,
        })
    }

    /// The proxy's endpoint, `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// From now on, this fault.
    pub fn set(&self, fault: Fault) {
        *self.fault.lock().unwrap_or_else(|p| p.into_inner()) = fault;
    }

    /// The requests seen so far.
    pub fn counts(&self) -> &Counts {
        &self.counts
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        // Silent connections are cut: their clients see the connection close.
        let runtime = std::mem::replace(
            &mut self.runtime,
            match tokio::runtime::Builder::new_current_thread().build() {
                Ok(r) => r,
                Err(_) => return,
            },
        );
        runtime.shutdown_background();
    }
}

/// A request as it came: its head (request line and headers) and body.
struct Request {
    head: String,
    body: Vec<u8>,
}

impl Request {
    fn method(&self) -> &str {
        self.head.split(' ').next().unwrap_or("")
    }

    fn target(&self) -> &str {
        self.head.split(' ').nth(1).unwrap_or("")
    }

    fn is_listing(&self) -> bool {
        self.method() == "GET" && self.target().contains("list-type=2")
    }

    /// The head with `Connection: close` in place of any `Connection` header.
    fn closing_head(&self) -> String {
        let mut lines: Vec<&str> = self
            .head
            .split("\r\n")
            .filter(|l| !l.is_empty() && !l.to_ascii_lowercase().starts_with("connection:"))
            .collect();
        lines.push("Connection: close");
        format!("{}\r\n\r\n", lines.join("\r\n"))
    }
}

/// Reads one request from `stream`; `None` when the client closed first.
async fn read_request(stream: &mut TcpStream) -> std::io::Result<Option<Request>> {
    let mut bytes = Vec::new();
    let mut buffer = [0u8; 8192];
    let end = loop {
        if let Some(end) = find(&bytes, b"\r\n\r\n") {
            break end;
        }
        let n = stream.read(&mut buffer).await?;
        if n == 0 {
            return Ok(None);
        }
        bytes.extend_from_slice(&buffer[..n]);
    };
    let head = String::from_utf8_lossy(&bytes[..end]).into_owned();
    let length = header(&head, "content-length")
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(0);
    let mut body = bytes[end + 4..].to_vec();
    while body.len() < length {
        let n = stream.read(&mut buffer).await?;
        if n == 0 {
            break;
        }
        body.extend_from_slice(&buffer[..n]);
    }
    Ok(Some(Request { head, body }))
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// The value of header `name` (lower case) in `head`.
fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.split("\r\n").skip(1).find_map(|line| {
        let (key, value) = line.split_once(':')?;
        (key.trim().eq_ignore_ascii_case(name)).then(|| value.trim())
    })
}

/// An answer: its status line and headers (without the framing ones), and its body.
struct Answer {
    head: Vec<String>,
    body: Vec<u8>,
}

impl Answer {
    fn new(status: &str, content_type: &str, body: Vec<u8>) -> Answer {
        Answer {
            head: vec![
                format!("HTTP/1.1 {status}"),
                format!("Content-Type: {content_type}"),
            ],
            body,
        }
    }

    /// The head as sent: with `Content-Length` and `Connection: close`.
    fn head_bytes(&self) -> Vec<u8> {
        let mut text = self.head.join("\r\n");
        text.push_str(&format!(
            "\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            self.body.len()
        ));
        text.into_bytes()
    }
}

/// Relays `request` to `upstream` and reads the whole answer (a chunked body put back
/// together).
async fn relay(request: &Request, upstream: &str) -> std::io::Result<Answer> {
    let mut server = TcpStream::connect(upstream).await?;
    server.write_all(request.closing_head().as_bytes()).await?;
    server.write_all(&request.body).await?;
    let mut bytes = Vec::new();
    server.read_to_end(&mut bytes).await?;
    let end = find(&bytes, b"\r\n\r\n")
        .ok_or_else(|| std::io::Error::other("the server's answer has no head"))?;
    let head_text = String::from_utf8_lossy(&bytes[..end]).into_owned();
    let raw = &bytes[end + 4..];
    let chunked =
        header(&head_text, "transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked"));
    let body = if chunked {
        dechunk(raw)
    } else {
        match header(&head_text, "content-length").and_then(|v| v.parse::<usize>().ok()) {
            Some(length) => raw[..length.min(raw.len())].to_vec(),
            None => raw.to_vec(),
        }
    };
    let head = head_text
        .split("\r\n")
        .filter(|l| {
            let l = l.to_ascii_lowercase();
            !l.starts_with("content-length:")
                && !l.starts_with("transfer-encoding:")
                && !l.starts_with("connection:")
        })
        .map(str::to_string)
        .collect();
    Ok(Answer { head, body })
}

fn dechunk(mut raw: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    while let Some(line) = find(raw, b"\r\n") {
        let size = std::str::from_utf8(&raw[..line])
            .ok()
            .and_then(|t| usize::from_str_radix(t.split(';').next().unwrap_or("").trim(), 16).ok())
            .unwrap_or(0);
        if size == 0 {
            break;
        }
        let start = line + 2;
        let end = (start + size).min(raw.len());
        body.extend_from_slice(&raw[start..end]);
        raw = &raw[(end + 2).min(raw.len())..];
    }
    body
}

/// Handles one connection's request as the fault says.
async fn serve(
    mut client: TcpStream,
    upstream: &str,
    fault: &Mutex<Fault>,
    counts: &Counts,
    lister: &Arc<dyn ObjectStore>,
) -> std::io::Result<()> {
    let Some(request) = read_request(&mut client).await? else {
        return Ok(());
    };
    match (request.method(), request.is_listing()) {
        ("HEAD", _) => counts.heads.fetch_add(1, Ordering::SeqCst),
        (_, true) => counts.lists.fetch_add(1, Ordering::SeqCst),
        ("GET", false) => counts.gets.fetch_add(1, Ordering::SeqCst),
        _ => 0,
    };
    let fault = fault.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let answer = match &fault {
        Fault::Silent => {
            // Hold the connection, answering nothing, until the client goes.
            let mut sink = [0u8; 1024];
            while client.read(&mut sink).await? > 0 {}
            return Ok(());
        }
        Fault::EndlessListing {
            keys_per_page,
            fresh_keys,
            fresh_tokens,
        } if request.is_listing() => {
            let page = counts.lists.load(Ordering::SeqCst);
            let keys_tag = if *fresh_keys { page } else { 0 };
            let token_tag = if *fresh_tokens { page } else { 0 };
            let keys: Vec<String> = (0..*keys_per_page)
                .map(|k| format!("loop/{keys_tag:08}-{k:04}.jpg"))
                .collect();
            Answer::new(
                "200 OK",
                "application/xml",
                listing_page(&keys, Some(&format!("token-{token_tag}"))).into_bytes(),
            )
        }
        Fault::Status(status) if request.method() == "GET" && !request.is_listing() => Answer::new(
            &format!("{status} Refused"),
            "application/xml",
            b"<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>SlowDown</Code>\
              <Message>Please reduce your request rate.</Message></Error>"
                .to_vec(),
        ),
        Fault::ExtraKeys(keys) if request.is_listing() => {
            let page = page_with(lister, &request, keys).await?;
            Answer::new("200 OK", "application/xml", page.into_bytes())
        }
        _ => relay(&request, upstream).await?,
    };
    client.write_all(&answer.head_bytes()).await?;
    match fault {
        Fault::Slow { bytes_per_second } if request.method() == "GET" && !request.is_listing() => {
            let pause = Duration::from_secs(1) / bytes_per_second.max(1);
            for byte in &answer.body {
                client.write_all(&[*byte]).await?;
                tokio::time::sleep(pause).await;
            }
        }
        _ => client.write_all(&answer.body).await?,
    }
    client.shutdown().await
}

/// A ListObjectsV2 answer with these keys (1 kB each), truncated with `token` when given.
fn listing_page(keys: &[String], token: Option<&str>) -> String {
    let metas: Vec<(String, u64, String)> = keys
        .iter()
        .map(|k| {
            (
                k.clone(),
                1024,
                "\"00000000000000000000000000000000\"".to_string(),
            )
        })
        .collect();
    page_xml(&metas, token)
}

/// A ListObjectsV2 answer of `(key, size, etag)` entries, truncated with `token` when given.
fn page_xml(entries: &[(String, u64, String)], token: Option<&str>) -> String {
    let mut xml = String::from(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<ListBucketResult \
         xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"><Name>gpufeed</Name>",
    );
    xml.push_str(&format!(
        "<KeyCount>{}</KeyCount><MaxKeys>1000</MaxKeys><IsTruncated>{}</IsTruncated>",
        entries.len(),
        token.is_some()
    ));
    if let Some(token) = token {
        xml.push_str(&format!(
            "<NextContinuationToken>{token}</NextContinuationToken>"
        ));
    }
    for (key, size, etag) in entries {
        let escaped: String = key
            .chars()
            .map(|c| match c {
                c if c.is_ascii_alphanumeric() || "/.-_".contains(c) => c.to_string(),
                c => format!("&#x{:X};", c as u32),
            })
            .collect();
        let etag = etag.replace('"', "&quot;");
        xml.push_str(&format!(
            "<Contents><Key>{escaped}</Key><LastModified>2026-01-01T00:00:00.000Z</LastModified>\
             <ETag>{etag}</ETag><Size>{size}</Size><StorageClass>STANDARD</StorageClass>\
             </Contents>"
        ));
    }
    xml.push_str("</ListBucketResult>");
    xml
}

/// The value of query parameter `name` in a request target, percent-decoded.
fn query(target: &str, name: &str) -> Option<String> {
    let (_, query) = target.split_once('?')?;
    query.split('&').find_map(|pair| {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        (key == name).then(|| percent_decode(value))
    })
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (b'+', _) => {
                out.push(b' ');
                i += 1;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The page `request` asks for of the bucket's listing with `extra` keys: the server's objects
/// under the prefix (directly under it with a delimiter) and the extra keys, in key order,
/// after `start-after` or the continuation token (the last key given, in hex), at most
/// `max-keys`.
async fn page_with(
    lister: &Arc<dyn ObjectStore>,
    request: &Request,
    extra: &[String],
) -> std::io::Result<String> {
    let target = request.target();
    let prefix = query(target, "prefix").unwrap_or_default();
    let delimiter = query(target, "delimiter").is_some();
    let listed: Vec<ObjectMeta> = lister
        .list(Some(&ObjectPath::from(prefix.trim_end_matches('/'))))
        .try_collect()
        .await
        .map_err(std::io::Error::other)?;
    let mut entries: Vec<(String, u64, String)> = listed
        .into_iter()
        .map(|m| {
            let etag = m.e_tag.unwrap_or_default();
            (m.location.to_string(), m.size, etag)
        })
        .collect();
    entries.extend(extra.iter().map(|k| (k.clone(), 1024, "\"0\"".to_string())));
    entries.retain(|(k, _, _)| {
        k.starts_with(&prefix) && !(delimiter && k[prefix.len()..].contains('/'))
    });
    entries.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    let from = match query(target, "continuation-token") {
        Some(token) => Some(String::from_utf8_lossy(&unhex(&token)).into_owned()),
        None => query(target, "start-after"),
    };
    if let Some(from) = &from {
        entries.retain(|(k, _, _)| k.as_bytes() > from.as_bytes());
    }
    let most = query(target, "max-keys")
        .and_then(|m| m.parse::<usize>().ok())
        .unwrap_or(1000);
    let token = (entries.len() > most).then(|| hex(entries[most - 1].0.as_bytes()));
    entries.truncate(most);
    Ok(page_xml(&entries, token.as_deref()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Vec<u8> {
    (0..text.len() / 2)
        .filter_map(|i| u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_escape_keys_and_requests_parse() {
        let page = listing_page(&["a/c\n.jpg".into()], Some("t"));
        assert!(page.contains("a/c&#xA;.jpg"), "{page}");
        assert!(page.contains("<IsTruncated>true</IsTruncated>"), "{page}");
        assert_eq!(dechunk(b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"), b"abcde");
        let target = "/gpufeed?list-type=2&prefix=odd%2F&start-after=a%0Ab";
        assert_eq!(query(target, "prefix").as_deref(), Some("odd/"));
        assert_eq!(query(target, "start-after").as_deref(), Some("a\nb"));
        assert_eq!(unhex(&hex(b"x\ty")), b"x\ty");
    }
}
