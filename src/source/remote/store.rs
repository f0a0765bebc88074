//! The clients: one `object_store` client per store a source reads from, configured as the
//! platform's tools are (from the environment: `AWS_*`, `GOOGLE_*`, `AZURE_*`), with the
//! source's timeouts; the retries, counted and bounded in time, and the store's health; and each
//! error turned into a sentence that names the object.
//!
//! `object_store` retries nothing here: every request is tried by [`retrying`], at most
//! [`RemoteOptions::max_retries`] times more and for at most [`RemoteOptions::retry_timeout`]
//! in all, each try cut at [`RemoteOptions::request_timeout`], so the reason a read gives up
//! says how many tries it made. Once one read has given up, the store is taken to be down
//! ([`Health`]): one read at a time tries it once (a probe), the others fail at once, naming the
//! read that gave up, until a read succeeds.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::azure::{AzureConfigKey, MicrosoftAzureBuilder};
use object_store::gcp::{GoogleCloudStorageBuilder, GoogleConfigKey};
use object_store::http::HttpBuilder;
use object_store::list::PaginatedListStore;
use object_store::{BackoffConfig, ClientConfigKey, ObjectStore, RetryConfig};

use super::location::{Scheme, StoreUrl};
use super::RemoteOptions;

/// A store's client, and its lister for stores that list.
#[derive(Clone)]
pub(super) struct Clients {
    pub store: Arc<dyn ObjectStore>,
    /// The same client, listing page by page (`None` for HTTP servers, which cannot list).
    pub lister: Option<Arc<dyn PaginatedListStore>>,
    /// Whether credentials were given (keys in the environment or the store options, or a web
    /// identity): a refusal without them says that none were found.
    pub credentials: bool,
}

impl std::fmt::Debug for Clients {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Clients")
            .field("store", &self.store)
            .field("lists", &self.lister.is_some())
            .field("credentials", &self.credentials)
            .finish()
    }
}

impl Clients {
    /// `error` from reading or listing `what` (a URL), as a sentence that names it.
    pub fn failure(&self, what: &str, error: &object_store::Error) -> Failure {
        failure(what, error, self.credentials)
    }
}

/// The clients of `store`, configured from the environment, then `options.store_options`.
pub(super) fn connect(store: &StoreUrl, options: &RemoteOptions) -> Result<Clients, String> {
    // TLS through ring (see Cargo.toml); installed once per process, whoever installs it first.
    let _ = rustls::crypto::ring::default_provider().install_default();
    // Retries are [`retrying`]'s: counted, and bounded in time, per object.
    let retry = RetryConfig {
        backoff: BackoffConfig::default(),
        max_retries: 0,
        retry_timeout: options.request_timeout,
    };
    // Every request has a timeout; an `http://` endpoint (a local server) is used as given.
    let timeout = humantime(options.request_timeout);
    let connect_timeout = humantime(options.request_timeout.min(Duration::from_secs(10)));
    let client = [
        (ClientConfigKey::AllowHttp, "true".to_string()),
        (ClientConfigKey::Timeout, timeout),
        (ClientConfigKey::ConnectTimeout, connect_timeout),
    ];
    let unknown = |key: &str| {
        format!("store option {key:?} is not one {store} takes (see object_store's config keys)")
    };
    let given = |env: &[&str], keys: &[&str]| {
        env.iter()
            .any(|v| std::env::var_os(v).is_some_and(|v| !v.is_empty()))
            || options
                .store_options
                .iter()
                .any(|(k, _)| keys.contains(&k.to_ascii_lowercase().as_str()))
    };
    let built: object_store::Result<Clients> = match store.scheme {
        Scheme::S3 => {
            let mut builder = AmazonS3Builder::from_env().with_bucket_name(&store.authority);
            for (key, value) in &client {
                builder = builder.with_config(AmazonS3ConfigKey::Client(*key), value);
            }
            for (key, value) in &options.store_options {
                let key: AmazonS3ConfigKey = key.parse().map_err(|_| unknown(key))?;
                builder = builder.with_config(key, value);
            }
            let credentials = given(
                &[
                    "AWS_ACCESS_KEY_ID",
                    "AWS_WEB_IDENTITY_TOKEN_FILE",
                    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                    "AWS_SKIP_SIGNATURE",
                ],
                &["aws_access_key_id", "access_key_id", "aws_skip_signature"],
            );
            builder.with_retry(retry).build().map(|s| {
                let s = Arc::new(s);
                Clients {
                    store: s.clone(),
                    lister: Some(s),
                    credentials,
                }
            })
        }
        Scheme::Gcs => {
            let mut builder =
                GoogleCloudStorageBuilder::from_env().with_bucket_name(&store.authority);
            for (key, value) in &client {
                builder = builder.with_config(GoogleConfigKey::Client(*key), value);
            }
            for (key, value) in &options.store_options {
                let key: GoogleConfigKey = key.parse().map_err(|_| unknown(key))?;
                builder = builder.with_config(key, value);
            }
            let credentials = given(
                &["GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_SERVICE_ACCOUNT"],
                &["google_service_account", "google_application_credentials"],
            );
            builder.with_retry(retry).build().map(|s| {
                let s = Arc::new(s);
                Clients {
                    store: s.clone(),
                    lister: Some(s),
                    credentials,
                }
            })
        }
        Scheme::Azure => {
            let mut builder =
                MicrosoftAzureBuilder::from_env().with_container_name(&store.authority);
            for (key, value) in &client {
                builder = builder.with_config(AzureConfigKey::Client(*key), value);
            }
            for (key, value) in &options.store_options {
                let key: AzureConfigKey = key.parse().map_err(|_| unknown(key))?;
                builder = builder.with_config(key, value);
            }
            let credentials = given(
                &[
                    "AZURE_STORAGE_ACCOUNT_KEY",
                    "AZURE_STORAGE_SAS_KEY",
                    "AZURE_CLIENT_SECRET",
                ],
                &["azure_storage_account_key", "azure_storage_sas_key"],
            );
            builder.with_retry(retry).build().map(|s| {
                let s = Arc::new(s);
                Clients {
                    store: s.clone(),
                    lister: Some(s),
                    credentials,
                }
            })
        }
        Scheme::Http | Scheme::Https => {
            let mut builder = HttpBuilder::new().with_url(store.to_string());
            for (key, value) in &client {
                builder = builder.with_config(*key, value);
            }
            for (key, value) in &options.store_options {
                let key: ClientConfigKey = key.parse().map_err(|_| unknown(key))?;
                builder = builder.with_config(key, value);
            }
            builder.with_retry(retry).build().map(|s| Clients {
                store: Arc::new(s),
                lister: None,
                credentials: true,
            })
        }
    };
    built.map_err(|e| format!("cannot set up a client for {store}: {e}"))
}

fn humantime(duration: Duration) -> String {
    format!("{}ms", duration.as_millis().max(1))
}

/// How a failed request is reported and what it says of the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Failure {
    pub kind: std::io::ErrorKind,
    pub reason: String,
    /// The store answered and refused (missing object, wrong credentials, a changed object):
    /// retrying or failing faster would not help, and the store is not down.
    pub refused: bool,
}

impl Failure {
    /// A failure of this process's own (no memory, shut down): not the store's.
    pub fn local(kind: std::io::ErrorKind, reason: String) -> Failure {
        Failure {
            kind,
            reason,
            refused: true,
        }
    }
}

/// `error` from reading or listing `what` (a URL) as a sentence that names it; `credentials`:
/// whether any were given.
fn failure(what: &str, error: &object_store::Error, credentials: bool) -> Failure {
    use object_store::Error as E;
    use std::io::ErrorKind as K;
    let refused_credentials = |detail: String| {
        if credentials {
            format!(
                "{what}: the store refused the credentials ({detail}); check AWS_ACCESS_KEY_ID \
                 and AWS_SECRET_ACCESS_KEY (or the GOOGLE_/AZURE_ variables)"
            )
        } else {
            format!(
                "{what}: no credentials: none were given, and none came from the machine's \
                 metadata service ({detail}); set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY \
                 (for a public bucket AWS_SKIP_SIGNATURE=true; GOOGLE_APPLICATION_CREDENTIALS \
                 or AZURE_STORAGE_ACCOUNT_KEY for the others)"
            )
        }
    };
    let (kind, refused, reason) = match error {
        E::NotFound { .. } => (K::NotFound, true, format!("{what}: no such object")),
        E::Precondition { .. } | E::NotModified { .. } => (
            K::InvalidData,
            true,
            format!("{what}: the object changed since it was listed (its ETag differs)"),
        ),
        E::PermissionDenied { source, .. } | E::Unauthenticated { source, .. } => (
            K::PermissionDenied,
            true,
            refused_credentials(innermost(source.as_ref())),
        ),
        other => {
            let text = chain(other);
            let status = http_status(&text);
            // Refused, or (with none given) no credentials to be found.
            if text.contains("SignatureDoesNotMatch")
                || text.contains("InvalidAccessKeyId")
                || text.contains("AccessDenied")
                || matches!(status, Some(401 | 403))
                || (!credentials && looks_for_credentials(&text))
            {
                (K::PermissionDenied, true, refused_credentials(text))
            } else if status.is_some_and(|s| (400..500).contains(&s) && s != 408 && s != 429) {
                // The store answered the request as wrong: asking again would not help.
                (K::InvalidData, true, format!("{what}: {text}"))
            } else {
                let kind = if text.contains("timed out") || text.contains("Timeout") {
                    K::TimedOut
                } else {
                    K::ConnectionAborted
                };
                (kind, false, format!("{what}: {text}"))
            }
        }
    };
    Failure {
        kind,
        reason,
        refused,
    }
}

/// Whether an error's text is the client looking for credentials where none were given: the
/// instance metadata service (the EC2 one, or a container's) not answering.
fn looks_for_credentials(text: &str) -> bool {
    [
        "credential",
        "/latest/api/token",
        "/latest/meta-data",
        "169.254.1",
    ]
    .iter()
    .any(|t| text.contains(t))
}

/// The HTTP status an error's text names (`object_store` says "status code: 503"), if any.
fn http_status(text: &str) -> Option<u16> {
    let (_, rest) = text.split_once("status code: ")?;
    rest.get(..3)?.parse().ok()
}

/// An error and its causes, in one line.
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(e) = cause {
        let more = e.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        cause = e.source();
    }
    text
}

fn innermost(error: &(dyn std::error::Error + Send + Sync + 'static)) -> String {
    let mut last: &dyn std::error::Error = error;
    while let Some(next) = last.source() {
        last = next;
    }
    last.to_string()
}

/// Whether a store is answering: down once a read has given up after its retries, up again once
/// a read succeeds.
#[derive(Debug, Default)]
pub(super) struct Health {
    /// The failure that took the store down, while it is down.
    down: Mutex<Option<Failure>>,
    /// A read is trying the store while it is down.
    probing: AtomicBool,
}

/// What [`Health::admit`] lets a read do.
enum Admission<'a> {
    /// Try, and retry as the options allow.
    Normal,
    /// The store is down and this read tries it once; the probe ends when this is dropped.
    Probe(ProbeGuard<'a>),
    /// The store is down and another read is trying it: fail at once, with this reason.
    Refuse(Failure),
}

struct ProbeGuard<'a>(&'a Health);

impl Drop for ProbeGuard<'_> {
    fn drop(&mut self) {
        self.0.probing.store(false, Ordering::SeqCst);
    }
}

impl Health {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Failure>> {
        self.down.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether the store is taken to be down.
    pub fn is_down(&self) -> bool {
        self.lock().is_some()
    }

    fn admit(&self, what: &str) -> Admission<'_> {
        let down = self.lock().clone();
        match down {
            None => Admission::Normal,
            Some(cause) => {
                if self
                    .probing
                    .compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst)
                    .is_ok()
                {
                    Admission::Probe(ProbeGuard(self))
                } else {
                    Admission::Refuse(Failure {
                        kind: cause.kind,
                        reason: format!(
                            "{what}: not read, the store is failing (another read is trying it \
                             again); the read that gave up: {}",
                            cause.reason
                        ),
                        refused: false,
                    })
                }
            }
        }
    }

    fn succeeded(&self) {
        *self.lock() = None;
    }

    fn gave_up(&self, failure: &Failure) {
        if !failure.refused {
            let mut down = self.lock();
            if down.is_none() {
                *down = Some(failure.clone());
            }
        }
    }
}

/// How a request is retried: at most `max_retries` times more, within `timeout` of the first
/// try, each try cut at `request_timeout`; from [`RemoteOptions`].
#[derive(Debug, Clone, Copy)]
pub(super) struct Retries {
    pub max_retries: u32,
    pub timeout: Duration,
    pub request_timeout: Duration,
}

impl Retries {
    pub fn of(options: &RemoteOptions) -> Retries {
        Retries {
            max_retries: options.max_retries,
            timeout: options.retry_timeout,
            request_timeout: options.request_timeout,
        }
    }
}

/// The wait before try `attempt + 1` (the first retry is `attempt` 1): 100 ms doubling to 8 s,
/// spread by `salt` between half and all of it so that reads failing together do not retry
/// together.
fn backoff(attempt: u32, salt: u64) -> Duration {
    let full = Duration::from_millis(100)
        .saturating_mul(1 << attempt.saturating_sub(1).min(16))
        .min(Duration::from_secs(8));
    let spread = (salt ^ u64::from(attempt))
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .rotate_left(17)
        % 1000;
    full / 2 + full / 2 * spread as u32 / 1000
}

/// The tries of one request: [`Tries::begin`], then [`Tries::next_try`] before each try and
/// [`Tries::failed`] after each failed one (which waits before the next, or gives up), and
/// [`Tries::succeeded`]. With a [`Health`], a store that is down is tried by one read at a time,
/// once, and a read that gives up after its retries takes the store down.
pub(super) struct Tries<'a> {
    retries: Retries,
    health: Option<&'a Health>,
    what: String,
    salt: u64,
    started: Instant,
    count: u32,
    most: u32,
    probe: Option<ProbeGuard<'a>>,
}

impl<'a> Tries<'a> {
    /// The tries of a request for `what` (a URL); refused at once while the store is down and
    /// another read is trying it.
    pub fn begin(
        retries: Retries,
        health: Option<&'a Health>,
        what: &str,
        salt: u64,
    ) -> Result<Tries<'a>, Failure> {
        let probe = match health.map(|h| h.admit(what)) {
            Some(Admission::Refuse(failure)) => return Err(failure),
            Some(Admission::Probe(guard)) => Some(guard),
            Some(Admission::Normal) | None => None,
        };
        Ok(Tries {
            retries,
            health,
            what: what.to_string(),
            salt,
            started: Instant::now(),
            count: 0,
            most: match probe {
                Some(_) => 1,
                None => retries.max_retries.saturating_add(1),
            },
            probe,
        })
    }

    /// Counts a try; returns the time it may take (the request timeout, or what is left of the
    /// retry timeout).
    pub fn next_try(&mut self) -> Duration {
        self.count += 1;
        let left = self.retries.timeout.saturating_sub(self.started.elapsed());
        self.retries
            .request_timeout
            .min(left.max(Duration::from_millis(1)))
    }

    /// The failure of a try cut at `limit`.
    pub fn timed_out(&self, limit: Duration) -> Failure {
        Failure {
            kind: std::io::ErrorKind::TimedOut,
            reason: format!(
                "{}: no answer within {:.1} s",
                self.what,
                limit.as_secs_f64()
            ),
            refused: false,
        }
    }

    /// The request succeeded: the store is up.
    pub fn succeeded(self) {
        if let Some(health) = self.health {
            health.succeeded();
        }
    }

    /// A try failed with `failure` (not a refusal): waits before the next try, or gives up with
    /// the failure and how many tries were made, taking the store down.
    pub async fn failed(&mut self, failure: Failure) -> Result<(), Failure> {
        let wait = backoff(self.count, self.salt);
        let spent =
            self.count >= self.most || self.started.elapsed() + wait >= self.retries.timeout;
        // Another read found the store down meanwhile: this one stops too.
        let down = self.probe.is_none() && self.health.is_some_and(Health::is_down);
        if !(spent || down) {
            tokio::time::sleep(wait).await;
            return Ok(());
        }
        self.probe.take();
        let failure = Failure {
            reason: format!(
                "{} (gave up after {} {} in {:.1} s)",
                failure.reason,
                self.count,
                if self.count == 1 { "try" } else { "tries" },
                self.started.elapsed().as_secs_f64()
            ),
            ..failure
        };
        if let Some(health) = self.health {
            health.gave_up(&failure);
        }
        Err(failure)
    }
}

/// Runs `attempt` (given the try's number, from 1) with [`Tries`]: until it succeeds, it is
/// refused, or the retries are spent, each try within the time left.
pub(super) async fn retrying<T, F, Fut>(
    retries: Retries,
    health: Option<&Health>,
    what: &str,
    salt: u64,
    mut attempt: F,
) -> Result<T, Failure>
where
    F: FnMut(u32) -> Fut,
    Fut: Future<Output = Result<T, Failure>>,
{
    let mut tries = Tries::begin(retries, health, what, salt)?;
    loop {
        let limit = tries.next_try();
        let failure = match tokio::time::timeout(limit, attempt(tries.count)).await {
            Ok(Ok(value)) => {
                tries.succeeded();
                return Ok(value);
            }
            Ok(Err(failure)) if failure.refused => return Err(failure),
            Ok(Err(failure)) => failure,
            Err(_) => tries.timed_out(limit),
        };
        tries.failed(failure).await?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quick(max_retries: u32) -> Retries {
        Retries {
            max_retries,
            timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(1),
        }
    }

    fn flaky(what: &str) -> Failure {
        Failure {
            kind: std::io::ErrorKind::ConnectionAborted,
            reason: format!("{what}: 503 Service Unavailable"),
            refused: false,
        }
    }

    fn run<T>(future: impl Future<Output = T>) -> T {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
            .block_on(future)
    }

    #[test]
    fn retries_are_counted_and_bounded_and_the_reason_says_how_many() {
        let health = Health::default();
        let mut tries = 0;
        let failed = run(retrying(quick(3), Some(&health), "s3://b/k", 1, |_| {
            tries += 1;
            async { Err::<(), _>(flaky("s3://b/k")) }
        }))
        .expect_err("fails");
        assert_eq!(tries, 4);
        assert!(
            failed.reason.contains("gave up after 4 tries"),
            "{failed:?}"
        );
        assert!(health.is_down());
        // Down: one read tries once; another meanwhile fails at once naming the first.
        let refused = run(async {
            let probing = retrying(quick(3), Some(&health), "s3://b/a", 2, |_| async {
                tokio::time::sleep(Duration::from_millis(200)).await;
                Ok::<_, Failure>(7)
            });
            let other = async {
                tokio::time::sleep(Duration::from_millis(50)).await;
                retrying(quick(3), Some(&health), "s3://b/c", 3, |_| async {
                    Ok::<_, Failure>(8)
                })
                .await
            };
            let (probed, other) = futures_util::join!(probing, other);
            assert_eq!(probed, Ok(7));
            other
        })
        .expect_err("refused while down");
        assert!(
            refused.reason.contains("s3://b/c") && refused.reason.contains("s3://b/k"),
            "{refused:?}"
        );
        assert!(!health.is_down(), "the probe succeeded");
    }

    #[test]
    fn a_try_that_never_ends_is_cut_and_the_total_time_is_bounded() {
        let retries = Retries {
            max_retries: 100,
            timeout: Duration::from_millis(600),
            request_timeout: Duration::from_millis(200),
        };
        let started = Instant::now();
        let failed = run(retrying(retries, None, "s3://b/k", 1, |_| {
            futures_util::future::pending::<Result<(), Failure>>()
        }))
        .expect_err("times out");
        assert!(
            started.elapsed() < Duration::from_millis(1500),
            "{:?}",
            started.elapsed()
        );
        assert_eq!(failed.kind, std::io::ErrorKind::TimedOut);
        assert!(failed.reason.contains("no answer within"), "{failed:?}");
        // Refusals are not retried.
        let mut tries = 0;
        run(retrying(quick(5), None, "s3://b/k", 1, |_| {
            tries += 1;
            async { Err::<(), _>(Failure::local(std::io::ErrorKind::NotFound, "gone".into())) }
        }))
        .expect_err("refused");
        assert_eq!(tries, 1);
    }

    #[test]
    fn statuses_say_whether_to_retry() {
        assert_eq!(
            http_status("Server returned non-2xx status code: 503 Service"),
            Some(503)
        );
        assert_eq!(http_status("no status here"), None);
        for attempt in 1..12 {
            let wait = backoff(attempt, 42);
            assert!(wait <= Duration::from_secs(8) && wait >= Duration::from_millis(50));
        }
    }
}
