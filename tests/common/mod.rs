//! Shared harness for the integration tests: each test gets a fresh database
//! with the extension (so tests never see each other's events), a client, and
//! helpers to publish, LISTEN with a timeout, and wait for the horizon.
//!
//! The cluster comes from the Makefile: `LITEBASE_STREAMS_DSN` (a libpq
//! key=value string), and for tests that restart the server or make a
//! throwaway one, `LITEBASE_STREAMS_PGDATA`, `LITEBASE_STREAMS_PG_BINDIR` and
//! `LITEBASE_STREAMS_RUNAS` (the OS user that runs the server, empty for the
//! current one).
#![allow(dead_code)]

pub mod browser;
pub mod gateway;
pub mod nats;
pub mod pgbouncer;
pub mod service;
pub mod subscriptions;
pub mod webhooks;

use std::process::Command;
use std::str::FromStr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use postgres::fallible_iterator::FallibleIterator;
use postgres::{Client, Config, NoTls};

pub const PAYMENT: &str = r#"{"order_id":"ord_123","amount":49.00}"#;

pub fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set: run the tests with `make test`"))
}

/// What the test server's `pg_config` prints for `arg` (`--sharedir`, ...).
pub fn pg_config(arg: &str) -> String {
    let out = Command::new(env("LITEBASE_STREAMS_PG_CONFIG")).arg(arg).output().expect("pg_config runs");
    assert!(out.status.success(), "pg_config {arg}");
    String::from_utf8(out.stdout).expect("pg_config prints UTF-8").trim().to_owned()
}

pub fn base_config() -> Config {
    Config::from_str(&env("LITEBASE_STREAMS_DSN")).expect("LITEBASE_STREAMS_DSN is a valid connection string")
}

/// A client on the cluster's `postgres` database.
pub fn admin() -> Client {
    connect_retrying(&base_config())
}

/// A client for `config`, retrying for 30 s (the server may be restarting).
pub fn connect_retrying(config: &Config) -> Client {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match config.connect(NoTls) {
            Ok(client) => return client,
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => panic!("cannot connect to the test cluster: {e}"),
        }
    }
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A fresh database with the extension installed, dropped at the end.
pub struct TestDb {
    pub name: String,
}

impl TestDb {
    pub fn new() -> TestDb {
        let db = Self::without_extension();
        db.connect().batch_execute("CREATE EXTENSION litebase_streams").expect("CREATE EXTENSION");
        db.wait_for_worker();
        db
    }

    pub fn without_extension() -> TestDb {
        let name = format!("lbs_test_{}_{}", std::process::id(), COUNTER.fetch_add(1, Ordering::Relaxed));
        admin().batch_execute(&format!("CREATE DATABASE {name}")).expect("CREATE DATABASE");
        TestDb { name }
    }

    pub fn config(&self) -> Config {
        let mut config = base_config();
        config.dbname(&self.name);
        config
    }

    pub fn connect(&self) -> Client {
        connect_retrying(&self.config())
    }

    /// A client on this database as another role.
    pub fn connect_as(&self, role: &str) -> Client {
        let mut config = self.config();
        config.user(role);
        connect_retrying(&config)
    }

    /// The pid of this database's worker (see [`wait_for_worker`]).
    pub fn wait_for_worker(&self) -> i32 {
        wait_for_worker(&mut admin(), &self.name)
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if let Ok(mut admin) = base_config().connect(NoTls) {
            let _ = admin.batch_execute(&format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name));
        }
    }
}

pub fn publish(client: &mut Client, stream: &str, data: &str) -> i64 {
    client.query_one("SELECT streams.publish($1, $2::text::jsonb)", &[&stream, &data]).expect("publish").get(0)
}

pub fn horizon(client: &mut Client) -> i64 {
    client.query_one("SELECT streams.horizon()", &[]).unwrap().get(0)
}

/// Poll `condition` every 10 ms until it holds; fail the test naming `what`
/// after `timeout`. The one way tests wait for something to happen (never a
/// fixed sleep before a negative assertion).
pub fn wait_until(what: &str, timeout: Duration, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !condition() {
        assert!(Instant::now() < deadline, "timed out after {timeout:?} waiting until {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The pid of the worker of database `db`, once it shows in
/// pg_stat_activity alone (a worker that has not yet noticed a DROP
/// EXTENSION may show next to its successor for a moment).
pub fn wait_for_worker(client: &mut Client, db: &str) -> i32 {
    let mut pid = None;
    wait_until(&format!("one worker for {db}"), Duration::from_secs(20), || {
        let rows = client
            .query(
                "SELECT pid FROM pg_stat_activity WHERE backend_type = 'litebase_streams worker' AND datname = $1",
                &[&db],
            )
            .unwrap();
        pid = (rows.len() == 1).then(|| rows[0].get(0));
        pid.is_some()
    });
    pid.unwrap()
}

/// Wait until the horizon reaches `position` (the worker runs after commit).
pub fn wait_for_horizon(client: &mut Client, position: i64) {
    wait_until(&format!("the horizon reaches {position}"), Duration::from_secs(20), || horizon(client) >= position);
}

/// A role created for one test and dropped (with everything it owns or was
/// granted in `db`) at the end.
pub struct TestRole {
    pub name: String,
    db: String,
}

impl TestRole {
    pub fn new(db: &TestDb, suffix: &str, attributes: &str) -> TestRole {
        let name = format!("{}_{suffix}", db.name);
        let login = if attributes.contains("NOLOGIN") { "" } else { "LOGIN" };
        admin().batch_execute(&format!("CREATE ROLE {name} {login} {attributes}")).expect("CREATE ROLE");
        TestRole { name, db: db.name.clone() }
    }
}

impl Drop for TestRole {
    fn drop(&mut self) {
        let mut config = base_config();
        config.dbname(&self.db);
        if let Ok(mut c) = config.connect(NoTls) {
            let _ = c.batch_execute(&format!("DROP OWNED BY {}", self.name));
        }
        if let Ok(mut admin) = base_config().connect(NoTls) {
            let _ = admin.batch_execute(&format!(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '{0}'; DROP ROLE IF EXISTS {0}",
                self.name
            ));
        }
    }
}

/// Positions of `streams.events`, in order.
pub fn event_positions(client: &mut Client, query: &str) -> Vec<i64> {
    client.query(query, &[]).unwrap().iter().map(|r| r.get(0)).collect()
}

pub fn count_stored(client: &mut Client) -> i64 {
    client.query_one("SELECT count(*) FROM streams.event_log", &[]).unwrap().get(0)
}

/// The SQLSTATE of a failed statement.
pub fn sqlstate(err: &postgres::Error) -> String {
    err.code().map(|c| c.code().to_owned()).unwrap_or_else(|| format!("no SQLSTATE: {err}"))
}

/// `text` parsed as JSON, or a panic that shows it.
pub fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text:?}"))
}

/// A client that LISTENs on some channels and, following the client rule
/// of docs/security.md, accepts a notification only from the database's worker (it re-reads
/// `streams.worker_pid()` when the sender differs, since the worker may have
/// restarted, and fails the test when it still differs).
pub struct Listener {
    pub client: Client,
    worker_pid: Option<i32>,
}

impl Listener {
    pub fn new(db: &TestDb, channels: &[&str]) -> Listener {
        Listener::on(db.connect(), channels)
    }

    /// A listener on a client of any cluster.
    pub fn on(mut client: Client, channels: &[&str]) -> Listener {
        for channel in channels {
            client.batch_execute(&format!("LISTEN \"{channel}\"")).unwrap();
        }
        Listener { client, worker_pid: None }
    }

    /// The next notification's (channel, payload), or None after `timeout`.
    pub fn next(&mut self, timeout: Duration) -> Option<(String, String)> {
        let (pid, channel, payload) = {
            let mut notifications = self.client.notifications();
            let mut it = notifications.timeout_iter(timeout);
            let n = it.next().unwrap()?;
            (n.process_id(), n.channel().to_owned(), n.payload().to_owned())
        };
        if Some(pid) != self.worker_pid {
            // 0.1.0 databases have no worker_pid(): nothing to check against.
            self.worker_pid =
                self.client.query_one("SELECT streams.worker_pid()", &[]).ok().and_then(|r| r.get::<_, Option<i32>>(0));
            if self.worker_pid.is_some() && Some(pid) != self.worker_pid {
                // A worker that was just replaced has left pg_stat_activity; a
                // live sender that is not a worker is a forger.
                let sender: Option<String> = self
                    .client
                    .query_opt("SELECT backend_type FROM pg_stat_activity WHERE pid = $1", &[&pid])
                    .unwrap()
                    .map(|r| r.get(0));
                assert!(
                    sender.is_none() || sender.as_deref() == Some("litebase_streams worker"),
                    "a notification sent by a {sender:?} process, not the worker: {payload}"
                );
            }
        }
        Some((channel, payload))
    }

    /// A listener over an existing client (which LISTENs already).
    pub fn from_client(client: Client) -> Listener {
        Listener { client, worker_pid: None }
    }

    /// The positions of the next `count` notifications (fewer if `timeout`
    /// passes in silence).
    pub fn positions(&mut self, count: usize, timeout: Duration) -> Vec<i64> {
        self.collect(count, timeout)
            .iter()
            .map(|event| event["position"].as_i64().expect("a payload has a position"))
            .collect()
    }

    /// Payloads parsed as JSON until `count` arrived or `timeout` passed in silence.
    pub fn collect(&mut self, count: usize, timeout: Duration) -> Vec<serde_json::Value> {
        let mut out = Vec::new();
        while out.len() < count {
            match self.next(timeout) {
                Some((_, payload)) => out.push(serde_json::from_str(&payload).expect("payload is JSON")),
                None => break,
            }
        }
        out
    }
}

/// Run `pg_ctl <args>` on the test cluster as its OS user.
pub fn pg_ctl(args: &[&str]) {
    let bindir = env("LITEBASE_STREAMS_PG_BINDIR");
    let pgdata = env("LITEBASE_STREAMS_PGDATA");
    let status = as_server_user(&format!("{bindir}/pg_ctl"))
        .args(["-D", &pgdata, "-l", &format!("{pgdata}/server.log"), "-w"])
        .args(args)
        .env_remove("RUST_BACKTRACE")
        .status()
        .expect("pg_ctl runs");
    assert!(status.success(), "pg_ctl {args:?} failed");
}

/// Run a client program of the server's installation (pg_dump, pg_restore)
/// against the test cluster as `postgres`; panics with its stderr on failure.
pub fn run_pg_tool(tool: &str, args: &[&str]) {
    let output = Command::new(format!("{}/{tool}", env("LITEBASE_STREAMS_PG_BINDIR")))
        .args(["-h", &env("LITEBASE_STREAMS_PGHOST"), "-p", &env("LITEBASE_STREAMS_PGPORT")])
        .args(["-U", "postgres", "--no-password"])
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{tool} runs: {e}"));
    assert!(
        output.status.success(),
        "{tool} {args:?} failed ({}):\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A command run as the server's OS user (`runuser` when the tests run as root).
pub fn as_server_user(program: &str) -> Command {
    match std::env::var("LITEBASE_STREAMS_RUNAS").unwrap_or_default() {
        user if user.is_empty() => Command::new(program),
        user => {
            let mut cmd = Command::new("runuser");
            cmd.args(["-u", &user, "--", program]);
            cmd
        }
    }
}

/// A throwaway cluster of its own (initdb in the scratch directory, a free
/// port), stopped and removed on drop. `settings` go to postgresql.conf.
pub struct ScratchCluster {
    dir: std::path::PathBuf,
    pub port: u16,
}

impl ScratchCluster {
    /// A new cluster (initdb).
    pub fn start(name: &str, settings: &[&str]) -> ScratchCluster {
        let dir = Self::new_dir(name);
        let data = dir.to_str().unwrap().to_owned();
        let ok = as_server_user(&format!("{}/initdb", env("LITEBASE_STREAMS_PG_BINDIR")))
            .args(["-D", &data, "-U", "postgres", "--auth=trust", "--encoding=UTF8", "--locale=C"])
            .stdout(std::process::Stdio::null())
            .status()
            .expect("initdb runs");
        assert!(ok.success(), "initdb {data}");
        Self::configure_and_start(dir, settings)
    }

    /// A streaming hot standby of the test cluster (`pg_basebackup -R`).
    pub fn standby_of_test_cluster() -> ScratchCluster {
        let dir = Self::new_dir("standby");
        let ok = as_server_user(&format!("{}/pg_basebackup", env("LITEBASE_STREAMS_PG_BINDIR")))
            .args(["-D", dir.to_str().unwrap(), "-R", "-c", "fast", "-X", "stream", "-U", "postgres"])
            .args(["-h", &env("LITEBASE_STREAMS_PGHOST"), "-p", &env("LITEBASE_STREAMS_PGPORT")])
            .status()
            .expect("pg_basebackup runs");
        assert!(ok.success(), "pg_basebackup");
        Self::configure_and_start(dir, &[])
    }

    fn new_dir(name: &str) -> std::path::PathBuf {
        let dir = std::path::PathBuf::from(env("LITEBASE_STREAMS_SCRATCH_DIR")).join(format!(
            "{name}-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    /// Append a port of its own, its socket directory and `settings` to the
    /// data directory's postgresql.conf (later lines win), and start it.
    fn configure_and_start(dir: std::path::PathBuf, settings: &[&str]) -> ScratchCluster {
        let data = dir.to_str().unwrap().to_owned();
        let port = service::free_port();
        let mut conf = format!("\nport = {port}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{data}'\n");
        for setting in settings {
            conf.push_str(setting);
            conf.push('\n');
        }
        let path = dir.join("postgresql.conf");
        let mut text = std::fs::read_to_string(&path).unwrap();
        text.push_str(&conf);
        std::fs::write(&path, text).unwrap();
        let cluster = ScratchCluster { dir, port };
        cluster.pg_ctl(&["-l", &format!("{data}/server.log"), "start"]);
        cluster
    }

    /// `pg_ctl <args>` on this cluster, waiting (at most a minute) for it to finish.
    pub fn pg_ctl(&self, args: &[&str]) {
        let ok = as_server_user(&format!("{}/pg_ctl", env("LITEBASE_STREAMS_PG_BINDIR")))
            .args(["-D", self.dir.to_str().unwrap(), "-w", "-t", "60"])
            .args(args)
            .env_remove("RUST_BACKTRACE")
            .status()
            .expect("pg_ctl runs");
        assert!(ok.success(), "pg_ctl {args:?} on {}", self.dir.display());
    }

    /// Stop it (`-m mode`: smart, fast or immediate) and start it again.
    pub fn restart(&self, mode: &str) {
        self.pg_ctl(&["-m", mode, "stop"]);
        let log = self.dir.join("server.log");
        self.pg_ctl(&["-l", log.to_str().unwrap(), "start"]);
    }

    pub fn config(&self, db: &str) -> Config {
        let mut config = Config::new();
        config.host("127.0.0.1").port(self.port).user("postgres").dbname(db).connect_timeout(Duration::from_secs(10));
        config
    }

    pub fn connect(&self, db: &str) -> Client {
        connect_retrying(&self.config(db))
    }

    /// Arguments that point a libpq program (pg_dump, psql) at this cluster.
    pub fn libpq_args(&self) -> Vec<String> {
        vec!["-h".into(), "127.0.0.1".into(), "-p".into(), self.port.to_string(), "-U".into(), "postgres".into()]
    }

    /// The server log so far.
    pub fn server_log(&self) -> String {
        std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
    }

    /// The pid of the worker of `db` (see [`wait_for_worker`]).
    pub fn wait_for_worker(&self, db: &str) -> i32 {
        wait_for_worker(&mut self.connect("postgres"), db)
    }
}

impl Drop for ScratchCluster {
    fn drop(&mut self) {
        let bindir = env("LITEBASE_STREAMS_PG_BINDIR");
        let _ = as_server_user(&format!("{bindir}/pg_ctl"))
            .args(["-D", self.dir.to_str().unwrap(), "-m", "immediate", "stop"])
            .status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A worker stopped with SIGSTOP while it is between rounds (no transaction,
/// no snapshot), resumed on drop.
pub struct StoppedWorker(i32);

impl StoppedWorker {
    pub fn stop(client: &mut Client, pid: i32) -> StoppedWorker {
        loop {
            signal("STOP", pid);
            let idle: bool = client
                .query_one(
                    "SELECT backend_xid IS NULL AND backend_xmin IS NULL FROM pg_stat_activity WHERE pid = $1",
                    &[&pid],
                )
                .unwrap()
                .get(0);
            if idle {
                return StoppedWorker(pid);
            }
            signal("CONT", pid);
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for StoppedWorker {
    fn drop(&mut self) {
        signal("CONT", self.0);
    }
}

pub fn signal(name: &str, pid: i32) {
    let ok = Command::new("kill").args([&format!("-{name}"), &pid.to_string()]).status().unwrap();
    assert!(ok.success(), "kill -{name} {pid}");
}

/// Tests that change a server-wide setting run one at a time (within a test
/// binary; put them in a binary of their own, so that no other test sees it).
static SETTING: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Sets a server-wide setting for the test, and resets it on drop.
pub struct SystemSetting(&'static str, #[allow(dead_code)] std::sync::MutexGuard<'static, ()>);

impl SystemSetting {
    pub fn set(name: &'static str, value: &str) -> SystemSetting {
        let guard = SETTING.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut admin = admin();
        admin.batch_execute(&format!("ALTER SYSTEM SET {name} = '{value}'")).unwrap();
        admin.batch_execute("SELECT pg_reload_conf()").unwrap();
        SystemSetting(name, guard)
    }
}

impl Drop for SystemSetting {
    fn drop(&mut self) {
        let mut admin = admin();
        let _ = admin.batch_execute(&format!("ALTER SYSTEM RESET {}", self.0));
        let _ = admin.batch_execute("SELECT pg_reload_conf()");
    }
}

// --- the partitioned log (tests/partitions.rs, tests/retention.rs) ----------

/// One row of `streams.partitions`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Partition {
    pub name: String,
    pub first_position: Option<i64>,
    pub end_position: i64,
    pub size: i64,
    pub tablespace: Option<String>,
    pub state: String,
}

/// The rows of `streams.partitions`, in its order.
pub fn partitions(client: &mut Client) -> Vec<Partition> {
    client
        .query(
            "SELECT partition::text, first_position, end_position, size, tablespace::text, state
             FROM streams.partitions",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| Partition {
            name: r.get(0),
            first_position: r.get(1),
            end_position: r.get(2),
            size: r.get(3),
            tablespace: r.get(4),
            state: r.get(5),
        })
        .collect()
}

/// Publish `count` events to `stream` with publish_batch, `per_tx` to a
/// transaction (quicker than one by one for the tens of thousands a
/// partitioned log needs), and wait until they are final. Their positions.
pub fn publish_many(client: &mut Client, stream: &str, count: usize, per_tx: usize) -> Vec<i64> {
    let positions =
        publish_batches(client, stream, count, per_tx, "jsonb_build_object('n', g, 'pad', repeat('x', 40))");
    wait_for_horizon(client, *positions.last().unwrap());
    positions
}

/// Publish `count` events to `stream` with publish_batch, `per_tx` to a
/// transaction, each event `object` (SQL of the series number `g`), and
/// return their positions without waiting for them to become final.
pub fn publish_batches(client: &mut Client, stream: &str, count: usize, per_tx: usize, object: &str) -> Vec<i64> {
    let sql =
        format!("SELECT p FROM streams.publish_batch($1, ARRAY(SELECT {object} FROM generate_series(1, $2) g)) p");
    let mut positions = Vec::with_capacity(count);
    while positions.len() < count {
        let n = per_tx.min(count - positions.len()) as i32;
        let batch = client.query(&sql, &[&stream, &n]).unwrap();
        positions.extend(batch.iter().map(|r| r.get::<_, i64>(0)));
    }
    positions
}

/// Every final event from `query` (its columns: position, stream, time,
/// tx, data, as text), in its order: for comparing row by row.
pub fn event_rows(client: &mut Client, query: &str) -> Vec<(i64, String, String, String, String)> {
    client
        .query(query, &[])
        .unwrap_or_else(|e| panic!("{query}: {e}"))
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4)))
        .collect()
}

/// The columns [`event_rows`] compares, of streams.replay or streams.get.
pub const EVENT_COLUMNS: &str = "position, stream, time::text, tx::text, data::text";
