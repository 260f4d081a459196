//! A server binary of this workspace (the gateway, the bridge) run as a
//! process for a test: on a free port of its own, its stderr in a log file,
//! killed on drop (the log stays when the test failed, to be read).

use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use super::wait_until;

/// The binary `name` of this workspace: `$env_var` if set, else the
/// `gateway` profile's build (scripts/test.sh builds it before the
/// integration tests), a release or a debug build; or a panic that says how
/// to build it.
pub fn workspace_binary(name: &str, env_var: &str, package: &str) -> PathBuf {
    if let Ok(bin) = std::env::var(env_var) {
        return PathBuf::from(bin);
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let target = std::env::var("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|_| root.join("target"));
    for profile in ["gateway", "release", "debug"] {
        let bin = target.join(profile).join(name);
        if bin.exists() {
            return bin;
        }
    }
    panic!("no {name} binary: run `cargo build --profile gateway -p {package} --bins` (scripts/test.sh does)");
}

/// A port nothing listens on now, and one this test process has not handed
/// out before: the port is free again once the probe closes, and tests run
/// in parallel threads, so the system may offer it to the next probe before
/// the service it was meant for binds it (two gateways were given one port).
pub fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        if !given.contains(&port) {
            given.push(port);
            return port;
        }
    }
}

/// One process of `program` with `args` (which give it `port`) and `env`.
pub struct Service {
    what: &'static str,
    program: PathBuf,
    args: Vec<String>,
    env: Vec<(&'static str, String)>,
    child: Option<Child>,
    pub port: u16,
    pub log: PathBuf,
}

impl Service {
    /// Start it and wait until it accepts connections on `port`.
    pub fn start(
        what: &'static str,
        program: PathBuf,
        port: u16,
        args: Vec<String>,
        env: Vec<(&'static str, String)>,
    ) -> Service {
        let log = std::env::temp_dir().join(format!("litebase-{what}-test-{}-{port}.log", std::process::id()));
        let mut service = Service { what, program, args, env, child: None, port, log };
        service.spawn();
        service
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&self.log).unwrap();
        let child = Command::new(&self.program)
            .args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("the {} starts: {e}", self.what));
        self.child = Some(child);
        let port = self.port;
        wait_until(&format!("the {} accepts connections", self.what), Duration::from_secs(20), || {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("the {} exited ({status}):\n{}", self.what, self.log_text());
            }
            TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    /// SIGKILL (no goodbye to anyone), then the same command again.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Its exit status, once it exited by itself.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.as_mut().and_then(|c| c.try_wait().unwrap())
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// A field of /proc/<pid>/status in kB (VmRSS, VmHWM).
    pub fn memory_kb(&self, field: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap();
        let line = status.lines().find(|l| l.starts_with(field)).unwrap_or_else(|| panic!("no {field}"));
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    }

    /// GET `path` over HTTP/1.0: (status, body); (0, "") when nothing answers.
    pub fn get(&self, path: &str) -> (u16, String) {
        use std::io::{Read, Write};
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.port)) else { return (0, String::new()) };
        let _ = s.set_read_timeout(Some(Duration::from_secs(30)));
        let _ = write!(s, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n");
        let mut text = String::new();
        let _ = s.read_to_string(&mut text);
        let status = text.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
        (status, text.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default())
    }

    /// One value of GET /metrics (0 when absent): a name with its labels as
    /// exposed, `litebase_streams_gateway_topics` or `litebase_streams_bridge_up{target="nats"}`.
    pub fn metric(&self, name: &str) -> f64 {
        let (_, body) = self.get("/metrics");
        body.lines()
            .filter(|l| !l.starts_with('#'))
            .find_map(|l| l.strip_prefix(name).filter(|r| r.starts_with(' ')).and_then(|r| r.trim().parse().ok()))
            .unwrap_or(0.0)
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        self.kill();
        if !std::thread::panicking() {
            let _ = std::fs::remove_file(&self.log);
        }
    }
}
