//! A PgBouncer of the test's own in front of the test cluster, in
//! transaction pooling mode, stopped on drop.
//!
//! Its pgbouncer.ini is the one `make pgbouncer` writes (`scripts/pgbouncer.sh
//! ini`, with a directory in the scratch dir and a free port of its own), so
//! the tests exercise what users run. It runs as the server's OS user, like
//! the test clusters. Any role of the server may connect through it, also one
//! created after it started (`auth_user` looks unknown names up in the
//! server).
//!
//! Transaction pooling hands the server connection to another client after
//! each transaction, and pgbouncer 1.18 has no named prepared statements:
//! talk to it with `simple_query` / `batch_execute` (see [`rows`]), never
//! `query`/`execute`, which prepare named statements.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use postgres::{Client, Config, NoTls, SimpleQueryMessage};

use super::{as_server_user, base_config, env, COUNTER};

pub struct Pgbouncer {
    dir: PathBuf,
    pub port: u16,
    child: Child,
}

impl Pgbouncer {
    /// Start one in front of the test cluster (`LITEBASE_STREAMS_DSN`'s host
    /// and port) and wait until it accepts connections.
    pub fn start() -> Pgbouncer {
        let target = base_config();
        let host = match target.get_hosts().first() {
            Some(postgres::config::Host::Tcp(host)) => host.clone(),
            other => panic!("LITEBASE_STREAMS_DSN must name a TCP host for pgbouncer, not {other:?}"),
        };
        let target_port = target.get_ports().first().copied().unwrap_or(5432);

        let dir = PathBuf::from(env("LITEBASE_STREAMS_SCRATCH_DIR")).join(format!(
            "pgbouncer-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        // Created by the server user: pgbouncer writes its log and pid file there.
        let ok = as_server_user("mkdir").arg("-p").arg(&dir).status().expect("mkdir runs");
        assert!(ok.success(), "mkdir {}", dir.display());

        let port = super::service::free_port();
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/pgbouncer.sh");
        let out = Command::new("bash")
            .arg(script)
            .arg("ini")
            .env("PGBOUNCER_DIR", &dir)
            .env("PGBOUNCER_PORT", port.to_string())
            .env("PGBOUNCER_TARGET_HOST", &host)
            .env("PGPORT", target_port.to_string())
            .output()
            .expect("scripts/pgbouncer.sh runs");
        assert!(out.status.success(), "scripts/pgbouncer.sh ini: {}", String::from_utf8_lossy(&out.stderr));
        let ini = dir.join("pgbouncer.ini");
        std::fs::write(&ini, &out.stdout).unwrap();

        // Foreground (no -d): it lives as long as this child; its log goes to
        // the logfile the ini names.
        let child = as_server_user(&pgbouncer_binary())
            .arg(&ini)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("pgbouncer starts (the Debian package pgbouncer: make setup installs it)");
        let mut bouncer = Pgbouncer { dir, port, child };
        bouncer.wait_until_ready();
        bouncer
    }

    fn wait_until_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("pgbouncer exited ({status}):\n{}", self.log());
            }
            if let Ok(mut client) = self.config("postgres").connect(NoTls) {
                if client.simple_query("SELECT 1").is_ok() {
                    return;
                }
            }
            assert!(Instant::now() < deadline, "pgbouncer does not accept connections:\n{}", self.log());
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// A connection config for database `db` through it, as `postgres`.
    pub fn config(&self, db: &str) -> Config {
        let mut config = Config::new();
        config
            .host("127.0.0.1")
            .port(self.port)
            .user("postgres")
            .dbname(db)
            .application_name("lbs-test-via-pgbouncer")
            .connect_timeout(Duration::from_secs(10));
        config
    }

    /// A client on `db` through it (as `user`, default `postgres`).
    pub fn connect(&self, db: &str, user: Option<&str>) -> Client {
        let mut config = self.config(db);
        if let Some(user) = user {
            config.user(user);
        }
        super::connect_retrying(&config)
    }

    /// Its log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("pgbouncer.log")).unwrap_or_default()
    }

    fn pid(&self) -> Option<i32> {
        std::fs::read_to_string(self.dir.join("pgbouncer.pid")).ok()?.trim().parse().ok()
    }
}

impl Drop for Pgbouncer {
    fn drop(&mut self) {
        // The child may be `runuser`: signal pgbouncer itself (SIGTERM:
        // immediate shutdown), then reap the child.
        match self.pid() {
            Some(pid) => {
                let _ = Command::new("kill").args(["-TERM", &pid.to_string()]).status();
            }
            None => {
                let _ = self.child.kill();
            }
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        if matches!(self.child.try_wait(), Ok(None)) {
            if let Some(pid) = self.pid() {
                let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).status();
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn pgbouncer_binary() -> String {
    if let Ok(bin) = std::env::var("PGBOUNCER_BIN") {
        return bin;
    }
    std::env::var_os("PATH")
        .and_then(|paths| {
            std::env::split_paths(&paths).map(|dir| dir.join("pgbouncer")).find(|candidate| candidate.is_file())
        })
        .map(|path| path.to_string_lossy().into_owned())
        .unwrap_or_else(|| "/usr/sbin/pgbouncer".into())
}

/// The rows of a simple-protocol query (the way to query through
/// pgbouncer), each as its columns' text.
pub fn rows(client: &mut Client, sql: &str) -> Result<Vec<Vec<Option<String>>>, postgres::Error> {
    Ok(client
        .simple_query(sql)?
        .into_iter()
        .filter_map(|message| match message {
            SimpleQueryMessage::Row(row) => Some((0..row.len()).map(|i| row.get(i).map(str::to_owned)).collect()),
            _ => None,
        })
        .collect())
}

/// The first column of a simple-protocol query's rows, parsed.
pub fn column<T: std::str::FromStr>(client: &mut Client, sql: &str) -> Result<Vec<T>, postgres::Error>
where
    T::Err: std::fmt::Debug,
{
    Ok(rows(client, sql)?
        .into_iter()
        .map(|row| row[0].as_deref().expect("not null").parse().expect("parses"))
        .collect())
}
