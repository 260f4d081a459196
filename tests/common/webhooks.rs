//! A webhook endpoint of the test's own: tests/webhook_receiver.py, a real
//! HTTP server on 127.0.0.1, killed on drop.
//!
//! Each URL path answers as [`Receiver::configure`] says (status, failures
//! first, a sleep) and every request is logged with its Standard Webhooks
//! headers, its raw body and whether the reference verifier (the PyPI package
//! `standardwebhooks`) accepts its signature; [`Receiver::requests`] reads
//! that log. The log and the configuration outlive a [`Receiver::stop`], so
//! [`Receiver::start_again`] continues on the same port, and `fail_first`
//! counts across the restart.
//!
//! The Python comes from `target/webhook-venv`, created on first use (one
//! process at a time, under an flock) from tests/requirements.txt.
//!
//! Set a behaviour for a path before creating the webhook that posts to it:
//! an unknown path answers 404 (a failure the webhook retries), and a
//! request that arrives before the secret is known is not verified. Create
//! the webhook with `secret => SECRET` to know it in advance.
//!
//! Below the receiver: the helpers of the webhook tests (tests/webhooks.rs,
//! tests/webhook_delivery.rs). [`local_endpoints`] allows the receiver on the
//! shared test cluster, server-wide, while a test of the binary holds it;
//! tests/probes.rs needs the default policy, so it must not run at the same
//! time as either of them (cargo runs test binaries one at a time).

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use postgres::Client;

use super::{admin, env, publish, wait_for_horizon, wait_until, ScratchCluster, TestDb, COUNTER};

/// A secret to create webhooks with (`secret => SECRET`), so the receiver can
/// verify from the first request (the Standard Webhooks specification's
/// example secret: 24 bytes).
pub const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// How a path answers.
#[derive(Clone, Debug)]
pub struct Behaviour {
    /// Verify signatures with this secret (`whsec_...`); None: not verified.
    pub secret: Option<String>,
    /// Answer `fail_status` to this many requests first, counted over every
    /// request to the path this receiver logged (also before a restart).
    pub fail_first: u32,
    pub fail_status: u16,
    /// The answer after those.
    pub status: u16,
    /// Seconds to wait before answering (the request is logged at once).
    pub sleep: f64,
    /// A `Location` header for every answer (with a 3xx status: a redirect).
    pub location: Option<String>,
}

impl Default for Behaviour {
    /// Answer 200 at once, verify nothing.
    fn default() -> Behaviour {
        Behaviour { secret: None, fail_first: 0, fail_status: 500, status: 200, sleep: 0.0, location: None }
    }
}

impl Behaviour {
    /// Answer 200 at once and verify signatures with `secret`.
    pub fn signed(secret: &str) -> Behaviour {
        Behaviour { secret: Some(secret.to_owned()), ..Behaviour::default() }
    }
}

/// One logged request, in arrival order.
#[derive(Clone, Debug)]
pub struct Request {
    pub path: String,
    pub webhook_id: Option<String>,
    /// `webhook-timestamp` (Unix seconds), None when missing or not a number.
    pub timestamp: Option<i64>,
    pub signature: Option<String>,
    /// The reference verifier accepted the signature; None when the path had
    /// no secret (or no behaviour) when the request arrived.
    pub verified: Option<bool>,
    /// Why verification failed.
    pub verify_error: Option<String>,
    pub content_type: Option<String>,
    /// The body as sent; None when it was refused as too large (413).
    pub raw_body: Option<String>,
    /// The body parsed as JSON (Null when it is not JSON).
    pub body: serde_json::Value,
    /// Arrival, Unix seconds (the receiver's `time.time()`).
    pub received_at: f64,
    /// The status the receiver answered (or would have, had the sender waited).
    pub status: u16,
}

impl Request {
    /// The positions the body carries: one for a single event (an object),
    /// each element's for a batch (an array).
    pub fn positions(&self) -> Vec<i64> {
        let position = |event: &serde_json::Value| {
            event["position"].as_i64().unwrap_or_else(|| panic!("an event without a position: {event}"))
        };
        match &self.body {
            serde_json::Value::Array(events) => events.iter().map(position).collect(),
            serde_json::Value::Object(_) => vec![position(&self.body)],
            other => panic!("a body that is neither an event nor a batch: {other}"),
        }
    }

    pub fn succeeded(&self) -> bool {
        (200..300).contains(&self.status)
    }

    fn parse(line: &str) -> Option<Request> {
        let v: serde_json::Value = serde_json::from_str(line).ok()?;
        let text = |key: &str| v[key].as_str().map(str::to_owned);
        let raw_body = text("body");
        Some(Request {
            path: text("path")?,
            webhook_id: text("webhook_id"),
            timestamp: v["webhook_timestamp"].as_str().and_then(|t| t.parse().ok()),
            signature: text("webhook_signature"),
            verified: v["verified"].as_bool(),
            verify_error: text("verify_error"),
            content_type: text("content_type"),
            body: raw_body.as_deref().and_then(|b| serde_json::from_str(b).ok()).unwrap_or_default(),
            raw_body,
            received_at: v["received_at"].as_f64()?,
            status: v["status"].as_u64()? as u16,
        })
    }
}

/// tests/webhook_receiver.py on 127.0.0.1, with its configuration and log in
/// a directory of its own in the scratch directory (kept when the test
/// panics, for the post-mortem; removed otherwise).
pub struct Receiver {
    dir: PathBuf,
    pub port: u16,
    child: Mutex<Option<Child>>,
    config: Mutex<BTreeMap<String, Behaviour>>,
}

impl Receiver {
    /// Start one on a free port and wait until it accepts connections.
    pub fn start() -> Receiver {
        let dir = PathBuf::from(env("LITEBASE_STREAMS_SCRATCH_DIR")).join(format!(
            "webhook-receiver-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
        std::fs::write(dir.join("config.json"), "{}").unwrap();
        let mut receiver = Receiver { dir, port: 0, child: Mutex::new(None), config: Mutex::new(BTreeMap::new()) };
        receiver.port = receiver.spawn(0);
        receiver
    }

    /// Start one with each of `paths` answering as given.
    pub fn answering(paths: &[(&str, Behaviour)]) -> Receiver {
        let receiver = Receiver::start();
        for (path, behaviour) in paths {
            receiver.configure(path, behaviour.clone());
        }
        receiver
    }

    /// `http://127.0.0.1:<port><path>`; `path` starts with `/`.
    pub fn url(&self, path: &str) -> String {
        assert!(path.starts_with('/'), "a URL path starts with /: {path:?}");
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// Set how `path` answers from the next request on.
    pub fn configure(&self, path: &str, behaviour: Behaviour) {
        let mut config = self.config.lock().unwrap_or_else(|p| p.into_inner());
        config.insert(path.to_owned(), behaviour);
        let json: serde_json::Map<String, serde_json::Value> = config
            .iter()
            .map(|(path, b)| {
                let value = serde_json::json!({
                    "secret": b.secret, "fail_first": b.fail_first, "fail_status": b.fail_status,
                    "status": b.status, "sleep": b.sleep, "location": b.location,
                });
                (path.clone(), value)
            })
            .collect();
        // The receiver reads the file on every request: replace it whole.
        let tmp = self.dir.join("config.json.tmp");
        std::fs::write(&tmp, serde_json::Value::Object(json).to_string()).unwrap();
        std::fs::rename(&tmp, self.dir.join("config.json")).unwrap();
    }

    /// Every request to `path` so far, in arrival order.
    pub fn requests(&self, path: &str) -> Vec<Request> {
        let log = match File::open(self.dir.join("requests.jsonl")) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Vec::new(),
            Err(e) => panic!("the receiver's log: {e}"),
        };
        // A line being written right now may be incomplete: parse() skips it.
        BufReader::new(log)
            .lines()
            .map_while(Result::ok)
            .filter_map(|line| Request::parse(&line))
            .filter(|r| r.path == path)
            .collect()
    }

    /// The positions of the requests to `path` answered 2xx, in arrival order
    /// (a sleep past the sender's timeout still counts here).
    pub fn delivered(&self, path: &str) -> Vec<i64> {
        self.requests(path).iter().filter(|r| r.succeeded()).flat_map(Request::positions).collect()
    }

    /// Wait until at least `count` positions were answered 2xx on `path`; those.
    pub fn wait_for_delivered(&self, path: &str, count: usize, timeout: Duration) -> Vec<i64> {
        let mut got = Vec::new();
        wait_until(&format!("{count} events are delivered to {path}"), timeout, || {
            got = self.delivered(path);
            got.len() >= count
        });
        got
    }

    /// Kill it (SIGKILL: every logged line is already flushed); connections
    /// to its port are refused until [`Receiver::start_again`].
    pub fn stop(&self) {
        if let Some(mut child) = self.child.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Start it again on the same port, with the same configuration and log.
    pub fn start_again(&self) {
        assert!(self.child.lock().unwrap_or_else(|p| p.into_inner()).is_none(), "the receiver still runs");
        self.spawn(self.port);
    }

    /// Its stderr so far (a Python traceback, if it died).
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(self.dir.join("stderr.txt")).unwrap_or_default()
    }

    /// Run the receiver on `port` (0: a free one) and wait for its
    /// `listening on <port>` line; the port.
    fn spawn(&self, port: u16) -> u16 {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/webhook_receiver.py");
        let stderr = File::options().create(true).append(true).open(self.dir.join("stderr.txt")).unwrap();
        let mut child = Command::new(python())
            .arg(script)
            .arg("--port")
            .arg(port.to_string())
            .arg("--config")
            .arg(self.dir.join("config.json"))
            .arg("--log")
            .arg(self.dir.join("requests.jsonl"))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("tests/webhook_receiver.py starts");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = rx.recv_timeout(Duration::from_secs(30)).unwrap_or_default();
        let bound = line.strip_prefix("listening on ").and_then(|p| p.trim().parse::<u16>().ok());
        let Some(bound) = bound else {
            let _ = child.kill();
            let _ = child.wait();
            panic!("tests/webhook_receiver.py did not start on port {port}:\n{}", self.stderr());
        };
        *self.child.lock().unwrap_or_else(|p| p.into_inner()) = Some(child);
        bound
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.stop();
        if std::thread::panicking() {
            eprintln!("webhook receiver's configuration and log kept in {}", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// The Python of `target/webhook-venv`, with tests/requirements.txt
/// installed. Made once per test binary (OnceLock: threads wait for the first)
/// and by one binary at a time (an flock on `target/webhook-venv.lock`); a
/// venv whose recorded requirements differ from the file's is made anew.
pub fn python() -> &'static Path {
    static PYTHON: OnceLock<PathBuf> = OnceLock::new();
    PYTHON.get_or_init(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let venv = root.join("target/webhook-venv");
        let python = venv.join("bin/python");
        let requirements = root.join("tests/requirements.txt");
        let wanted = std::fs::read_to_string(&requirements).expect("tests/requirements.txt");
        // What was installed, written last: a venv without it is unfinished.
        let marker = venv.join("installed-requirements.txt");

        std::fs::create_dir_all(root.join("target")).unwrap();
        let lock = File::create(root.join("target/webhook-venv.lock")).unwrap();
        lock.lock().expect("flock target/webhook-venv.lock");
        if std::fs::read_to_string(&marker).ok().as_deref() != Some(wanted.as_str()) {
            let _ = std::fs::remove_dir_all(&venv);
            let out = Command::new("python3").arg("-m").arg("venv").arg(&venv).output().expect("python3 runs");
            assert!(
                out.status.success(),
                "python3 -m venv {} failed (Debian: install python3-venv, `make setup` does):\n{}",
                venv.display(),
                String::from_utf8_lossy(&out.stderr)
            );
            let out = Command::new(&python)
                .args(["-m", "pip", "install", "-q", "--disable-pip-version-check", "-r"])
                .arg(&requirements)
                .output()
                .expect("the venv's python runs");
            assert!(
                out.status.success(),
                "pip install -r tests/requirements.txt into {} failed (the webhook tests need PyPI):\n{}{}",
                venv.display(),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            std::fs::write(&marker, &wanted).unwrap();
        }
        drop(lock); // closing the file releases the flock
        python
    })
}

// --- the webhook tests' helpers -------------------------------------------------

/// Server-wide webhook settings for these tests: 127.0.0.1 allowed (the
/// receiver), short backoffs (so five failures take about a second) and a
/// 5 s request timeout. Shared by the tests that run at the same time, reset
/// when the last one ends.
pub struct LocalEndpoints;

const SETTINGS: [(&str, &str); 4] = [
    ("litebase_streams.webhook_allowed_hosts", "127.0.0.1"),
    ("litebase_streams.webhook_retry_min", "50"),
    ("litebase_streams.webhook_retry_max", "400"),
    ("litebase_streams.webhook_timeout", "5000"),
];

/// The settings' current holder; its lock orders setting against resetting.
static SHARED: Mutex<Weak<LocalEndpoints>> = Mutex::new(Weak::new());

pub fn local_endpoints() -> Arc<LocalEndpoints> {
    let mut shared = SHARED.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(live) = shared.upgrade() {
        return live;
    }
    let mut admin = admin();
    for (name, value) in SETTINGS {
        admin.batch_execute(&format!("ALTER SYSTEM SET {name} = '{value}'")).unwrap();
    }
    admin.batch_execute("SELECT pg_reload_conf()").unwrap();
    // A session started after the postmaster reloaded sees the new values.
    wait_until("the webhook settings are loaded", Duration::from_secs(10), || {
        let value: String =
            super::admin().query_one("SHOW litebase_streams.webhook_allowed_hosts", &[]).unwrap().get(0);
        value == "127.0.0.1"
    });
    let live = Arc::new(LocalEndpoints);
    *shared = Arc::downgrade(&live);
    live
}

impl Drop for LocalEndpoints {
    fn drop(&mut self) {
        let shared = SHARED.lock().unwrap_or_else(|p| p.into_inner());
        if shared.upgrade().is_some() {
            // A test started meanwhile set them again and holds them now.
            return;
        }
        let mut admin = admin();
        for (name, _) in SETTINGS {
            let _ = admin.batch_execute(&format!("ALTER SYSTEM RESET {name}"));
        }
        let _ = admin.batch_execute("SELECT pg_reload_conf()");
    }
}

/// A throwaway cluster with `settings` (for server-wide webhook settings
/// of a test's own, and crashes), a database `app` with the extension and
/// its worker running, and a connection to it.
pub fn scratch_cluster(name: &str, settings: &[&str]) -> (ScratchCluster, Client) {
    let mut all = vec!["shared_preload_libraries = 'litebase_streams'", "track_commit_timestamp = on"];
    all.extend_from_slice(settings);
    let cluster = ScratchCluster::start(name, &all);
    cluster.connect("postgres").batch_execute("CREATE DATABASE app").unwrap();
    let mut c = cluster.connect("app");
    c.batch_execute("CREATE EXTENSION litebase_streams").unwrap();
    cluster.wait_for_worker("app");
    (cluster, c)
}

/// One row of `streams.webhooks`.
#[derive(Debug, Clone, PartialEq)]
pub struct State {
    pub state: String,
    pub position: i64,
    pub pending: i64,
    pub attempts: i32,
    pub last_status: Option<i32>,
    pub last_error: Option<String>,
}

pub fn state(c: &mut Client, name: &str) -> State {
    let row = c
        .query_one(
            "SELECT state, position, pending, attempts, last_status, last_error FROM streams.webhooks WHERE name = $1",
            &[&name],
        )
        .unwrap_or_else(|e| panic!("webhook {name}: {e:?}"));
    State {
        state: row.get(0),
        position: row.get(1),
        pending: row.get(2),
        attempts: row.get(3),
        last_status: row.get(4),
        last_error: row.get(5),
    }
}

pub fn wait_for_state(c: &mut Client, name: &str, what: &str, mut condition: impl FnMut(&State) -> bool) -> State {
    let mut last = None;
    wait_until(&format!("webhook {name}: {what}"), Duration::from_secs(30), || {
        let now = state(c, name);
        let done = condition(&now);
        last = Some(now);
        done
    });
    last.unwrap()
}

pub fn create_webhook(c: &mut Client, name: &str, stream: &str, url: &str) {
    c.query_one("SELECT streams.create_webhook($1, $2, $3, secret => $4)", &[&name, &stream, &url, &SECRET])
        .unwrap_or_else(|e| panic!("create_webhook {name}: {e:?}"));
}

/// Publish one event per transaction; their positions, once final.
pub fn publish_each(c: &mut Client, stream: &str, count: usize) -> Vec<i64> {
    let positions: Vec<i64> = (0..count).map(|n| publish(c, stream, &format!(r#"{{"n": {n}}}"#))).collect();
    wait_for_horizon(c, *positions.last().unwrap());
    positions
}

/// A [`Receiver`] on the shared test cluster: while it lives, the cluster
/// has the [`local_endpoints`] settings. It derefs to the receiver.
pub struct LocalReceiver {
    receiver: Receiver,
    _settings: Arc<LocalEndpoints>,
}

impl Deref for LocalReceiver {
    type Target = Receiver;

    fn deref(&self) -> &Receiver {
        &self.receiver
    }
}

/// The start of a webhook test on the shared test cluster: the
/// [`local_endpoints`] settings, a receiver with each of `paths` answering
/// as given ([`Receiver::answering`]), and a fresh database.
pub fn local_receiver_and_db(paths: &[(&str, Behaviour)]) -> (LocalReceiver, TestDb) {
    let settings = local_endpoints();
    let receiver = LocalReceiver { receiver: Receiver::answering(paths), _settings: settings };
    (receiver, TestDb::new())
}
