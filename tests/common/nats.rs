//! NATS for the bridge's tests: nats-server processes with JetStream on a
//! store directory and free ports of their own (one server, or a cluster of
//! three on loopback), the bridge (`litebase-streams-bridge`) as a process,
//! and a reader of what a JetStream stream holds (async-nats).
//!
//! nats-server comes from `LITEBASE_STREAMS_NATS_SERVER`, else PATH or
//! /usr/sbin (Debian's `nats-server`, which `make setup` installs); the bridge
//! binary from `LITEBASE_STREAMS_BRIDGE_BIN` or the `gateway` profile's build
//! (scripts/test.sh builds it).

use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use futures_util::StreamExt;

use super::service::{free_port, workspace_binary, Service};
use super::wait_until;

fn nats_server() -> String {
    if let Ok(bin) = std::env::var("LITEBASE_STREAMS_NATS_SERVER") {
        return bin;
    }
    for bin in ["/usr/sbin/nats-server", "/usr/bin/nats-server"] {
        if std::path::Path::new(bin).exists() {
            return bin.into();
        }
    }
    "nats-server".into()
}

fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(super::env("LITEBASE_STREAMS_SCRATCH_DIR")).join(format!(
        "nats-{name}-{}-{}",
        std::process::id(),
        free_port()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// One nats-server (a member of a cluster, or alone).
pub struct Server {
    pub name: String,
    pub port: u16,
    monitor: u16,
    args: Vec<String>,
    dir: PathBuf,
    child: Option<Child>,
}

impl Server {
    fn new(name: &str, dir: PathBuf, cluster: Option<(&str, u16, &[u16])>) -> Server {
        let (port, monitor) = (free_port(), free_port());
        let store = dir.join("store");
        let mut args: Vec<String> = vec![
            "-js".into(),
            "-n".into(),
            name.into(),
            "-a".into(),
            "127.0.0.1".into(),
            "-p".into(),
            port.to_string(),
            "-m".into(),
            monitor.to_string(),
            "-sd".into(),
            store.to_str().unwrap().into(),
        ];
        if let Some((cluster_name, cluster_port, routes)) = cluster {
            let routes: Vec<String> = routes.iter().map(|p| format!("nats://127.0.0.1:{p}")).collect();
            args.extend([
                "--cluster_name".into(),
                cluster_name.into(),
                "--cluster".into(),
                format!("nats://127.0.0.1:{cluster_port}"),
                "--routes".into(),
                routes.join(","),
            ]);
        }
        Server { name: name.into(), port, monitor, args, dir, child: None }
    }

    pub fn start(&mut self) {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.dir.join("server.log")).unwrap();
        let child = Command::new(nats_server())
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("nats-server starts (make setup installs it)");
        self.child = Some(child);
        let port = self.port;
        wait_until("nats-server accepts connections", Duration::from_secs(20), || {
            TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
    }

    /// SIGKILL: no goodbye, no flush.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// GET of the monitoring endpoint `path` (`/jsz?streams=1`), as JSON.
    pub fn monitor(&self, path: &str) -> Option<serde_json::Value> {
        use std::io::{Read, Write};
        let mut s = TcpStream::connect(("127.0.0.1", self.monitor)).ok()?;
        write!(s, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").ok()?;
        let mut body = String::new();
        s.read_to_string(&mut body).ok()?;
        serde_json::from_str(body.split_once("\r\n\r\n")?.1).ok()
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// nats-server processes, stopped and removed on drop.
pub struct Nats {
    pub servers: Vec<Server>,
    dir: PathBuf,
}

impl Nats {
    /// One server with JetStream.
    pub fn start() -> Nats {
        let dir = scratch("single");
        let mut server = Server::new("n1", dir.join("n1"), None);
        std::fs::create_dir_all(dir.join("n1")).unwrap();
        server.start();
        Nats { servers: vec![server], dir }
    }

    /// A JetStream cluster of three servers on loopback.
    pub fn cluster() -> Nats {
        let dir = scratch("cluster");
        let cluster_ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
        let mut servers: Vec<Server> = (0..3)
            .map(|i| {
                let own = dir.join(format!("n{}", i + 1));
                std::fs::create_dir_all(&own).unwrap();
                Server::new(&format!("n{}", i + 1), own, Some(("lbs", cluster_ports[i], &cluster_ports)))
            })
            .collect();
        for s in &mut servers {
            s.start();
        }
        let nats = Nats { servers, dir };
        wait_until("the JetStream cluster has a meta leader", Duration::from_secs(30), || {
            nats.servers.iter().any(|s| {
                s.monitor("/jsz").and_then(|j| j["meta_cluster"]["leader"].as_str().map(str::to_owned)).is_some()
            })
        });
        nats
    }

    /// Every server's client URL, comma-separated (the bridge's --nats-url).
    pub fn urls(&self) -> String {
        self.servers.iter().map(Server::url).collect::<Vec<_>>().join(",")
    }

    /// The index of the server leading JetStream stream `stream`.
    pub fn leader_of(&self, stream: &str) -> Option<usize> {
        for s in &self.servers {
            let Some(jsz) = s.monitor("/jsz?streams=1") else { continue };
            for account in jsz["account_details"].as_array().into_iter().flatten() {
                for detail in account["stream_detail"].as_array().into_iter().flatten() {
                    if detail["name"] == stream {
                        if let Some(leader) = detail["cluster"]["leader"].as_str() {
                            return self.servers.iter().position(|s| s.name == leader);
                        }
                    }
                }
            }
        }
        None
    }

    /// How many messages JetStream stream `stream` holds (0 if it does not
    /// exist yet).
    pub fn count(&self, stream: &str) -> u64 {
        self.with_jetstream(|js| async move {
            match js.get_stream(stream).await {
                Ok(mut handle) => handle.info().await.map(|i| i.state.messages).unwrap_or(0),
                Err(_) => 0,
            }
        })
    }

    /// A JetStream context on the servers that run, for `f`.
    fn with_jetstream<T, F, Fut>(&self, f: F) -> T
    where
        F: FnOnce(async_nats::jetstream::Context) -> Fut,
        Fut: std::future::Future<Output = T>,
    {
        let urls: Vec<async_nats::ServerAddr> =
            self.servers.iter().filter(|s| s.child.is_some()).map(|s| s.url().parse().unwrap()).collect();
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async move {
            let client = async_nats::connect(urls).await.expect("NATS answers");
            f(async_nats::jetstream::new(client)).await
        })
    }

    /// What JetStream stream `stream` holds, in its sequence order (empty if
    /// it does not exist yet).
    pub fn messages(&self, stream: &str) -> Vec<Stored> {
        self.with_jetstream(|js| async move {
            let Ok(mut handle) = js.get_stream(stream).await else { return Vec::new() };
            let state = handle.info().await.expect("stream info").state.clone();
            if state.messages == 0 {
                return Vec::new();
            }
            let handle = &handle;
            futures_util::stream::iter(state.first_sequence..=state.last_sequence)
                .map(|seq| async move { (seq, handle.get_raw_message(seq).await) })
                .buffered(64)
                .filter_map(|(seq, m)| async move {
                    let m = m.ok()?; // a deleted sequence
                                     // By name as text: HeaderMap::get misses a well-known
                                     // name (Nats-Msg-Id) parsed from a stored message.
                    let headers: Vec<(String, String)> =
                        m.headers.iter().map(|(k, v)| (k.to_string(), v[0].as_str().to_owned())).collect();
                    let header = |name: &str| headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
                    Some(Stored {
                        sequence: seq,
                        subject: m.subject.to_string(),
                        position: header("Litebase-Position").and_then(|p| p.parse().ok()).unwrap_or(-1),
                        msg_id: header("Nats-Msg-Id").unwrap_or_default(),
                        payload: String::from_utf8_lossy(&m.payload).into_owned(),
                        headers,
                    })
                })
                .collect()
                .await
        })
    }
}

impl Drop for Nats {
    fn drop(&mut self) {
        self.servers.clear();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A message as JetStream stored it.
#[derive(Debug, Clone)]
pub struct Stored {
    pub sequence: u64,
    pub subject: String,
    pub position: i64,
    pub msg_id: String,
    pub headers: Vec<(String, String)>,
    pub payload: String,
}

impl Stored {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }
}

/// The bridge as a process ([`Service`]: port, log, restart, kill,
/// exited, metric, memory_kb, get).
pub struct Bridge {
    service: Service,
}

impl std::ops::Deref for Bridge {
    type Target = Service;
    fn deref(&self) -> &Service {
        &self.service
    }
}

impl std::ops::DerefMut for Bridge {
    fn deref_mut(&mut self) -> &mut Service {
        &mut self.service
    }
}

impl Bridge {
    pub fn start(database_url: &str, nats_url: &str, args: &[&str]) -> Bridge {
        let port = free_port();
        let mut all = vec![
            "--database-url".to_owned(),
            database_url.to_owned(),
            "--nats-url".to_owned(),
            nats_url.to_owned(),
            "--listen".to_owned(),
            format!("127.0.0.1:{port}"),
        ];
        all.extend(args.iter().map(|s| s.to_string()));
        let binary =
            workspace_binary("litebase-streams-bridge", "LITEBASE_STREAMS_BRIDGE_BIN", "litebase-streams-bridge");
        let env = vec![("LITEBASE_BRIDGE_LOG", "info,litebase_streams_bridge=debug".to_owned())];
        Bridge { service: Service::start("bridge", binary, port, all, env) }
    }
}
