//! A PgBouncer of the test's own, in transaction pooling mode, in front of
//! the test server; stopped on drop. Its pgbouncer.ini is the one `make
//! pgbouncer` writes (`scripts/pgbouncer.sh ini`, with a directory in the
//! scratch dir and a free port), as in the extension's tests/common/pgbouncer.rs.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tokio_postgres::config::Host;
use tokio_postgres::{Config, NoTls};

use super::base_config;

pub struct Pgbouncer {
    dir: PathBuf,
    pub port: u16,
    child: Child,
}

fn as_server_user(program: &str) -> Command {
    match std::env::var("LITEBASE_STREAMS_RUNAS").unwrap_or_default() {
        user if user.is_empty() => Command::new(program),
        user => {
            let mut cmd = Command::new("runuser");
            cmd.args(["-u", &user, "--", program]);
            cmd
        }
    }
}

impl Pgbouncer {
    pub async fn start() -> Pgbouncer {
        let target = base_config();
        let host = match target.get_hosts().first() {
            Some(Host::Tcp(host)) => host.clone(),
            other => panic!("LITEBASE_STREAMS_DSN must name a TCP host for pgbouncer, not {other:?}"),
        };
        let target_port = target.get_ports().first().copied().unwrap_or(5432);
        let scratch = std::env::var("LITEBASE_STREAMS_SCRATCH_DIR")
            .unwrap_or_else(|_| "/tmp/litebase_streams-scratch-54329".to_owned());
        let dir = PathBuf::from(scratch).join(format!("pgbouncer-rs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let ok = as_server_user("mkdir").arg("-p").arg(&dir).status().expect("mkdir runs");
        assert!(ok.success(), "mkdir {}", dir.display());
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/pgbouncer.sh");
        let out = Command::new("bash")
            .arg(script)
            .arg("ini")
            .env("PGBOUNCER_DIR", &dir)
            .env("PGBOUNCER_PORT", port.to_string())
            .env("PGBOUNCER_TARGET_HOST", &host)
            .env("PGPORT", target_port.to_string())
            .output()
            .expect("scripts/pgbouncer.sh runs");
        assert!(out.status.success(), "pgbouncer.sh ini: {}", String::from_utf8_lossy(&out.stderr));
        let ini = dir.join("pgbouncer.ini");
        std::fs::write(&ini, &out.stdout).unwrap();
        let child = as_server_user("/usr/sbin/pgbouncer")
            .arg(&ini)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("pgbouncer starts");
        let mut bouncer = Pgbouncer { dir, port, child };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = bouncer.child.try_wait().unwrap() {
                panic!("pgbouncer exited ({status}): {}", bouncer.log());
            }
            if let Ok((client, connection)) = bouncer.config("postgres").connect(NoTls).await {
                tokio::spawn(connection);
                if client.simple_query("SELECT 1").await.is_ok() {
                    return bouncer;
                }
            }
            assert!(Instant::now() < deadline, "pgbouncer does not accept connections: {}", bouncer.log());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// A config for database `db` through it, as `postgres`.
    pub fn config(&self, db: &str) -> Config {
        let mut config = Config::new();
        config.host("127.0.0.1").port(self.port).user("postgres").dbname(db).connect_timeout(Duration::from_secs(10));
        config
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("pgbouncer.log")).unwrap_or_default()
    }

    fn pid(&self) -> Option<i32> {
        std::fs::read_to_string(self.dir.join("pgbouncer.pid")).ok()?.trim().parse().ok()
    }
}

impl Drop for Pgbouncer {
    fn drop(&mut self) {
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
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
