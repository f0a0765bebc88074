//! The clients: one `object_store` client per store a source reads from, configured as the
//! platform's tools are (from the environment: `AWS_*`, `GOOGLE_*`, `AZURE_*`), with the
//! source's timeouts and retries, and each error turned into a sentence that names the object.

use std::sync::Arc;
use std::time::Duration;

use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::azure::{AzureConfigKey, MicrosoftAzureBuilder};
use object_store::gcp::{GoogleCloudStorageBuilder, GoogleConfigKey};
use object_store::http::HttpBuilder;
use object_store::{BackoffConfig, ClientConfigKey, ObjectStore, RetryConfig};

use super::location::{Scheme, StoreUrl};
use super::RemoteOptions;

/// A store's two clients: the patient one retries for [`RemoteOptions::retry_timeout`]; the
/// hasty one tries once more at most, for reads made while the store is failing (so a server
/// that stays down fails each remaining object quickly instead of once per retry timeout).
#[derive(Debug, Clone)]
pub(super) struct Clients {
    pub patient: Arc<dyn ObjectStore>,
    pub hasty: Arc<dyn ObjectStore>,
}

/// The clients of `store`, configured from the environment, then `options.store_options`.
pub(super) fn connect(store: &StoreUrl, options: &RemoteOptions) -> Result<Clients, String> {
    // TLS through ring (see Cargo.toml); installed once per process, whoever installs it first.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let patient = RetryConfig {
        backoff: BackoffConfig {
            init_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(8),
            base: 2.0,
        },
        // The time bounds the retries, not their count (a refused connection fails at once).
        max_retries: 10_000,
        retry_timeout: options.retry_timeout,
    };
    let hasty = RetryConfig {
        backoff: BackoffConfig::default(),
        max_retries: 1,
        retry_timeout: Duration::from_secs(2),
    };
    Ok(Clients {
        patient: build(store, options, patient)?,
        hasty: build(store, options, hasty)?,
    })
}

fn build(
    store: &StoreUrl,
    options: &RemoteOptions,
    retry: RetryConfig,
) -> Result<Arc<dyn ObjectStore>, String> {
    // Every request has a timeout; an `http://` endpoint (a local server) is used as given.
    let timeout = humantime(options.request_timeout);
    let connect_timeout = humantime(options.request_timeout.min(Duration::from_secs(10)));
    let client = [
        (ClientConfigKey::AllowHttp, "true".to_string()),
        (ClientConfigKey::Timeout, timeout),
        (ClientConfigKey::ConnectTimeout, connect_timeout),
    ];
    let unknown = |key: &str| {
        format!(
            "store option {key:?} is not one {} takes (see object_store's config keys)",
            store
        )
    };
    let built: object_store::Result<Arc<dyn ObjectStore>> = match store.scheme {
        Scheme::S3 => {
            let mut builder = AmazonS3Builder::from_env().with_bucket_name(&store.authority);
            for (key, value) in &client {
                builder = builder.with_config(AmazonS3ConfigKey::Client(*key), value);
            }
            for (key, value) in &options.store_options {
                let key: AmazonS3ConfigKey = key.parse().map_err(|_| unknown(key))?;
                builder = builder.with_config(key, value);
            }
            builder.with_retry(retry).build().map(|s| Arc::new(s) as _)
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
            builder.with_retry(retry).build().map(|s| Arc::new(s) as _)
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
            builder.with_retry(retry).build().map(|s| Arc::new(s) as _)
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
            builder.with_retry(retry).build().map(|s| Arc::new(s) as _)
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

/// `error` from reading or listing `what` (a URL) as a sentence that names it.
pub(super) fn failure(what: &str, error: &object_store::Error) -> Failure {
    use object_store::Error as E;
    use std::io::ErrorKind as K;
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
            format!(
                "{what}: the store refused the credentials ({}); check AWS_ACCESS_KEY_ID and \
                 AWS_SECRET_ACCESS_KEY (or the GOOGLE_/AZURE_ variables)",
                innermost(source.as_ref())
            ),
        ),
        other => {
            let text = chain(other);
            if text.contains("SignatureDoesNotMatch")
                || text.contains("InvalidAccessKeyId")
                || text.contains("AccessDenied")
                || text.contains("403 Forbidden")
            {
                (
                    K::PermissionDenied,
                    true,
                    format!(
                        "{what}: the store refused the credentials; check AWS_ACCESS_KEY_ID and \
                         AWS_SECRET_ACCESS_KEY (or the GOOGLE_/AZURE_ variables): {text}"
                    ),
                )
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
