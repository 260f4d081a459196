//! The harness of the client's integration tests: a fresh database with the
//! extension per test (dropped at the end), clients, a wait_until, and a
//! PgBouncer of the test's own (pgbouncer.rs).
//!
//! The server comes from the environment the test harness sets:
//! `LITEBASE_STREAMS_DSN` (key=value), `LITEBASE_STREAMS_SCRATCH_DIR`,
//! `LITEBASE_STREAMS_RUNAS` (the server's OS user, for pgbouncer).
#![allow(dead_code)]

pub mod pgbouncer;

use std::future::Future;
use std::str::FromStr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use tokio_postgres::{Client, Config, NoTls};

pub fn dsn() -> String {
    std::env::var("LITEBASE_STREAMS_DSN")
        .unwrap_or_else(|_| "host=127.0.0.1 port=54329 user=postgres dbname=postgres".to_owned())
}

pub fn base_config() -> Config {
    Config::from_str(&dsn()).expect("LITEBASE_STREAMS_DSN is a connection string")
}

/// A client for `config`, retrying for 30 s (the server may be restarting).
pub async fn connect(config: &Config) -> Client {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match config.connect(NoTls).await {
            Ok((client, connection)) => {
                tokio::spawn(connection);
                return client;
            }
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("cannot connect to the test server: {e}"),
        }
    }
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A fresh database with the extension, dropped (WITH FORCE) at the end.
pub struct TestDb {
    pub name: String,
}

impl TestDb {
    pub async fn new() -> TestDb {
        let name = format!("lbs_rs_{}_{}", std::process::id(), COUNTER.fetch_add(1, Ordering::Relaxed));
        let admin = connect(&base_config()).await;
        admin.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")).await.unwrap();
        admin.batch_execute(&format!("CREATE DATABASE {name}")).await.expect("CREATE DATABASE");
        let db = TestDb { name };
        db.client().await.batch_execute("CREATE EXTENSION litebase_streams").await.expect("CREATE EXTENSION");
        db.worker_pid().await;
        db
    }

    pub fn config(&self) -> Config {
        let mut config = base_config();
        config.dbname(&self.name);
        config
    }

    /// The config of a client named `application_name` (to find its backends).
    pub fn named(&self, application_name: &str) -> Config {
        let mut config = self.config();
        config.application_name(application_name);
        config
    }

    pub async fn client(&self) -> Client {
        connect(&self.config()).await
    }

    /// The worker's pid, once it runs.
    pub async fn worker_pid(&self) -> i32 {
        let client = self.client().await;
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let pid: Option<i32> = client.query_one("SELECT streams.worker_pid()", &[]).await.unwrap().get(0);
            if let Some(pid) = pid {
                return pid;
            }
            assert!(Instant::now() < deadline, "no worker for {} after 20 s", self.name);
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Terminate the backends of the clients named `application_name`; how many.
    pub async fn terminate(&self, application_name: &str) -> i64 {
        let admin = connect(&base_config()).await;
        admin
            .query_one(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = $1 AND application_name = $2",
                &[&self.name, &application_name],
            )
            .await
            .unwrap()
            .get(0)
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let name = self.name.clone();
        // Drop runs outside async: a thread of its own with its own runtime.
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            runtime.block_on(async {
                if let Ok((admin, connection)) = base_config().connect(NoTls).await {
                    tokio::spawn(connection);
                    let _ = admin.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")).await;
                }
            });
        })
        .join();
    }
}

/// Publish `data` (JSON text) to `stream` and commit; its position.
pub async fn publish(client: &Client, stream: &str, data: &str) -> i64 {
    client.query_one("SELECT streams.publish($1, $2::text::jsonb)", &[&stream, &data]).await.expect("publish").get(0)
}

/// Check `condition` every 10 ms until it holds; fail naming `what` after
/// `timeout`. The one way the tests wait.
pub async fn wait_until<F, Fut>(what: &str, timeout: Duration, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    while !condition().await {
        assert!(Instant::now() < deadline, "timed out after {timeout:?} waiting until {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
