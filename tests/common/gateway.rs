//! The gateway (gateway/, `litebase-streams-gateway`) as the tests use it:
//! started as a process against a test database, as a role of its own that
//! only holds membership of the roles it serves (docs/gateway.md's recipe), plus
//! small clients: raw HTTP/1.0 requests, an SSE reader, WebSocket
//! (tungstenite) and tokens (jsonwebtoken). [`Setup`] is the usual start of a
//! gateway test, [`Writers`] publish while it runs, and
//! [`assert_exactly_once_in_order`] checks what a client received.
//!
//! The binary comes from `LITEBASE_STREAMS_GATEWAY_BIN`, or the `gateway`
//! profile's build (`cargo build --profile gateway -p litebase-streams-gateway`,
//! which scripts/test.sh runs before the integration tests), or a debug build.

use std::collections::HashSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use super::service::{free_port, workspace_binary, Service};
use super::{base_config, wait_for_horizon, TestDb, TestRole};

pub const SECRET: &str = "gateway-test-secret";

/// The gateway binary (`LITEBASE_STREAMS_GATEWAY_BIN`, or a build of it).
pub fn binary() -> PathBuf {
    workspace_binary("litebase-streams-gateway", "LITEBASE_STREAMS_GATEWAY_BIN", "litebase-streams-gateway")
}

/// A libpq connection string for `db` as `user` on the test cluster.
pub fn dsn(db: &str, user: &str) -> String {
    let config = base_config();
    let host = match config.get_hosts().first() {
        Some(postgres::config::Host::Tcp(h)) => h.clone(),
        #[cfg(unix)]
        Some(postgres::config::Host::Unix(p)) => p.display().to_string(),
        None => "127.0.0.1".into(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    format!("host={host} port={port} user={user} dbname={db}")
}

pub fn token(role: &str) -> String {
    token_with(role, SECRET)
}

pub fn token_with(role: &str, secret: &str) -> String {
    #[derive(serde::Serialize)]
    struct Claims<'a> {
        role: &'a str,
        exp: u64,
    }
    let exp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() + 3600;
    jsonwebtoken::encode(
        &jsonwebtoken::Header::default(),
        &Claims { role, exp },
        &jsonwebtoken::EncodingKey::from_secret(secret.as_bytes()),
    )
    .unwrap()
}

/// A running gateway; killed on drop. Its process: [`Service`] (port, log,
/// restart, kill, metric, memory_kb).
pub struct Gateway {
    service: Service,
}

impl std::ops::Deref for Gateway {
    type Target = Service;
    fn deref(&self) -> &Service {
        &self.service
    }
}

impl std::ops::DerefMut for Gateway {
    fn deref_mut(&mut self) -> &mut Service {
        &mut self.service
    }
}

impl Gateway {
    /// A gateway for `db`, logging in as `login` (a role that is a member of
    /// the roles its tokens name), with extra flags.
    pub fn start(db: &TestDb, login: &str, args: &[&str]) -> Gateway {
        Self::start_url(&dsn(&db.name, login), args)
    }

    pub fn start_url(database_url: &str, args: &[&str]) -> Gateway {
        let port = free_port();
        let mut all = vec![
            "--listen".to_owned(),
            format!("127.0.0.1:{port}"),
            "--database-url".to_owned(),
            database_url.to_owned(),
        ];
        all.extend(args.iter().map(|s| s.to_string()));
        let env = vec![
            ("LITEBASE_GATEWAY_JWT_SECRET", SECRET.to_owned()),
            ("LITEBASE_GATEWAY_LOG", "info,litebase_streams_gateway=debug".to_owned()),
        ];
        Gateway { service: Service::start("gateway", binary(), port, all, env) }
    }

    /// A request; (status, body).
    pub fn request(&self, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> (u16, String) {
        request(self.port, method, path, headers, body)
    }

    pub fn sse(&self, path: &str, token: Option<&str>, last_event_id: Option<i64>) -> Sse {
        Sse::connect(self.port, path, token, last_event_id)
    }

    pub fn ws(&self, token: &str) -> Ws {
        Ws::connect(self.port, token)
    }
}

/// A database, the gateway's own login role (NOINHERIT, member of `reader`),
/// a role `reader` that may read `pay.*` (and publish there, with
/// [`Setup::publishing`]), and the gateway. The fields drop in this order.
pub struct Setup {
    pub gateway: Gateway,
    pub reader: TestRole,
    pub login: TestRole,
    pub db: TestDb,
}

impl Setup {
    /// `reader` may read `pay.*`; the gateway runs with `args`.
    pub fn new(args: &[&str]) -> Setup {
        Self::with_reader_grants("SELECT streams.grant('read', 'pay.*', '{r}');", args)
    }

    /// `reader` may read and publish `pay.*`; the gateway runs with `args`.
    pub fn publishing(args: &[&str]) -> Setup {
        Self::with_reader_grants(
            "SELECT streams.grant('read', 'pay.*', '{r}'); SELECT streams.grant('publish', 'pay.*', '{r}');",
            args,
        )
    }

    /// `grants` run for `reader` (`{r}` stands for its name).
    fn with_reader_grants(grants: &str, args: &[&str]) -> Setup {
        let db = TestDb::new();
        let login = TestRole::new(&db, "gw", "NOINHERIT");
        let reader = TestRole::new(&db, "reader", "NOLOGIN");
        db.connect()
            .batch_execute(&format!(
                "{} GRANT {r} TO {g};",
                grants.replace("{r}", &reader.name),
                r = reader.name,
                g = login.name
            ))
            .unwrap();
        let gateway = Gateway::start(&db, &login.name, args);
        Setup { gateway, reader, login, db }
    }

    /// A NOLOGIN role the gateway may act as, with `grants` run for it
    /// (`{r}` stands for its name).
    pub fn role(&self, suffix: &str, grants: &str) -> TestRole {
        let role = TestRole::new(&self.db, suffix, "NOLOGIN");
        let sql = format!("{} GRANT {} TO {};", grants.replace("{r}", &role.name), role.name, self.login.name);
        self.db.connect().batch_execute(&sql).unwrap();
        role
    }

    /// Positions of the events of streams starting with `prefix`, as the
    /// owner sees them, once the horizon has passed every event committed so
    /// far (a writer's last commit may not be final yet when it stops).
    pub fn positions(&self, prefix: &str) -> Vec<i64> {
        let mut owner = self.db.connect();
        let newest: Option<i64> = owner.query_one("SELECT max(position) FROM streams.event_log", &[]).unwrap().get(0);
        if let Some(newest) = newest {
            wait_for_horizon(&mut owner, newest);
        }
        owner
            .query("SELECT position FROM streams.events WHERE starts_with(stream, $1) ORDER BY position", &[&prefix])
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect()
    }
}

/// Publishers on `streams`, in turn, until stopped; they reconnect after
/// errors (the server may be restarting). Which events committed is read
/// from the database afterwards.
pub struct Writers {
    stop: Arc<AtomicBool>,
    threads: Vec<thread::JoinHandle<u64>>,
}

impl Writers {
    pub fn start(db: &TestDb, streams: &[&str]) -> Writers {
        let stop = Arc::new(AtomicBool::new(false));
        let threads = streams
            .iter()
            .map(|stream| {
                let (stop, config, stream) = (stop.clone(), db.config(), stream.to_string());
                thread::spawn(move || {
                    let mut sent = 0u64;
                    let mut client = None;
                    while !stop.load(Ordering::Relaxed) {
                        let c = match client.as_mut() {
                            Some(c) => c,
                            None => match config.connect(postgres::NoTls) {
                                Ok(c) => client.insert(c),
                                Err(_) => {
                                    thread::sleep(Duration::from_millis(50));
                                    continue;
                                }
                            },
                        };
                        let data = format!(r#"{{"n": {sent}, "s": "{stream}"}}"#);
                        match c.execute("SELECT streams.publish($1, $2::text::jsonb)", &[&stream, &data]) {
                            Ok(_) => sent += 1,
                            Err(_) => client = None,
                        }
                        thread::sleep(Duration::from_millis(3));
                    }
                    sent
                })
            })
            .collect();
        Writers { stop, threads }
    }

    /// Stop them; how many publishes were acknowledged.
    pub fn stop(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.threads.into_iter().map(|t| t.join().unwrap()).sum()
    }
}

pub fn assert_exactly_once_in_order(received: &[i64], committed: &[i64], what: &str) {
    let unique: HashSet<_> = received.iter().collect();
    assert_eq!(unique.len(), received.len(), "{what}: duplicates in {received:?}");
    assert!(received.windows(2).all(|w| w[0] < w[1]), "{what}: out of order: {received:?}");
    assert_eq!(received, committed, "{what}: received vs committed");
}

/// A small receive buffer for `socket` (std has no setter), so that the
/// gateway's writes to a client that stops reading block soon.
pub fn set_receive_buffer(socket: &TcpStream, bytes: libc::c_int) {
    use std::os::fd::AsRawFd;
    // SAFETY: the socket is open for the duration of the call and `bytes` outlives it.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            &bytes as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(rc, 0, "setsockopt SO_RCVBUF");
}

fn write_request(
    stream: &mut TcpStream,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> std::io::Result<()> {
    let mut request = format!("{method} {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Length: {}\r\n", body.len());
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    request.push_str(body);
    stream.write_all(request.as_bytes())
}

/// Status line and headers; the reader is left at the body.
fn read_head(reader: &mut BufReader<TcpStream>) -> std::io::Result<(u16, Vec<(String, String)>)> {
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let status = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidData, format!("bad status line {line:?}")))?;
    let mut headers = Vec::new();
    loop {
        line.clear();
        reader.read_line(&mut line)?;
        let l = line.trim_end();
        if l.is_empty() {
            return Ok((status, headers));
        }
        if let Some((k, v)) = l.split_once(':') {
            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_owned()));
        }
    }
}

/// An HTTP/1.0 request (the body ends with the connection); (status, body).
pub fn request(port: u16, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write_request(&mut stream, method, path, headers, body).unwrap();
    let mut reader = BufReader::new(stream);
    let (status, _) = read_head(&mut reader).unwrap();
    let mut body = String::new();
    reader.read_to_string(&mut body).unwrap();
    (status, body)
}

/// One Server-Sent Event.
#[derive(Debug, Clone)]
pub struct SseEvent {
    pub id: Option<i64>,
    pub event: Option<String>,
    pub data: serde_json::Value,
    /// `data:` as sent, byte for byte.
    pub raw: String,
}

/// An SSE response being read (HTTP/1.0: the body is the rest of the connection).
pub struct Sse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    reader: BufReader<TcpStream>,
    pub pings: usize,
    line: String,
    partial: Partial,
}

#[derive(Default)]
struct Partial {
    id: Option<i64>,
    event: Option<String>,
    data: Option<String>,
}

/// Why `Sse::next` returned no event.
#[derive(Debug, PartialEq, Eq)]
pub enum SseEnd {
    Timeout,
    Closed,
}

impl Sse {
    pub fn connect(port: u16, path: &str, token: Option<&str>, last_event_id: Option<i64>) -> Sse {
        Self::try_connect(port, path, token, last_event_id).unwrap()
    }

    /// Connect, or the I/O error (the gateway may be restarting).
    pub fn try_connect(port: u16, path: &str, token: Option<&str>, last_event_id: Option<i64>) -> std::io::Result<Sse> {
        let stream = TcpStream::connect(("127.0.0.1", port))?;
        Self::over(stream, path, token, last_event_id)
    }

    /// Over a given socket (the slow-client test shrinks its receive buffer).
    pub fn over(
        mut stream: TcpStream,
        path: &str,
        token: Option<&str>,
        last_event_id: Option<i64>,
    ) -> std::io::Result<Sse> {
        stream.set_read_timeout(Some(Duration::from_secs(30)))?;
        let auth = token.map(|t| format!("Bearer {t}"));
        let id = last_event_id.map(|i| i.to_string());
        let mut headers = vec![("Accept", "text/event-stream")];
        if let Some(auth) = &auth {
            headers.push(("Authorization", auth));
        }
        if let Some(id) = &id {
            headers.push(("Last-Event-ID", id));
        }
        write_request(&mut stream, "GET", path, &headers, "")?;
        let mut reader = BufReader::new(stream);
        let (status, headers) = read_head(&mut reader)?;
        Ok(Sse { status, headers, reader, pings: 0, line: String::new(), partial: Partial::default() })
    }

    /// The error body of a refused request.
    pub fn error_body(mut self) -> serde_json::Value {
        let mut body = String::new();
        self.reader.read_to_string(&mut body).unwrap();
        serde_json::from_str(&body).unwrap_or_else(|_| panic!("not JSON: {body:?}"))
    }

    /// The next event, or why none came within `timeout`. A line cut by the
    /// timeout is kept for the next call.
    pub fn next(&mut self, timeout: Duration) -> Result<SseEvent, SseEnd> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(SseEnd::Timeout);
            }
            self.reader.get_ref().set_read_timeout(Some(left)).unwrap();
            match self.reader.read_line(&mut self.line) {
                Ok(0) => return Err(SseEnd::Closed),
                Ok(_) => {}
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                    return Err(SseEnd::Timeout)
                }
                Err(_) => return Err(SseEnd::Closed),
            }
            if !self.line.ends_with('\n') {
                continue; // the rest of the line is still on its way
            }
            let line = std::mem::take(&mut self.line);
            let l = line.trim_end_matches('\n');
            if l.is_empty() {
                if let Some(d) = self.partial.data.take() {
                    let data = serde_json::from_str(&d).unwrap_or_else(|_| panic!("data is not JSON: {d:?}"));
                    let (id, event) = (self.partial.id.take(), self.partial.event.take());
                    return Ok(SseEvent { id, event, data, raw: d });
                }
                continue;
            }
            if l.starts_with(':') {
                self.pings += 1;
            } else if let Some(v) = l.strip_prefix("id: ") {
                self.partial.id = Some(v.parse().unwrap());
            } else if let Some(v) = l.strip_prefix("event: ") {
                self.partial.event = Some(v.to_owned());
            } else if let Some(v) = l.strip_prefix("data: ") {
                self.partial.data = Some(v.to_owned());
            }
        }
    }

    /// Read until the gateway closes the connection (at most `timeout`); the
    /// events read meanwhile.
    pub fn drain_until_closed(&mut self, timeout: Duration) -> Vec<SseEvent> {
        let deadline = Instant::now() + timeout;
        let mut events = Vec::new();
        loop {
            assert!(
                Instant::now() < deadline,
                "the gateway did not close the connection within {timeout:?} ({} events read meanwhile)",
                events.len()
            );
            match self.next(Duration::from_secs(1)) {
                Ok(e) => events.push(e),
                Err(SseEnd::Closed) => return events,
                Err(SseEnd::Timeout) => {}
            }
        }
    }
}

/// A WebSocket client.
pub struct Ws {
    pub socket: tungstenite::WebSocket<tungstenite::stream::MaybeTlsStream<TcpStream>>,
}

impl Ws {
    pub fn connect(port: u16, token: &str) -> Ws {
        let (socket, _) = tungstenite::connect(format!("ws://127.0.0.1:{port}/v1/ws?access_token={token}")).unwrap();
        Ws { socket }
    }

    pub fn send(&mut self, message: serde_json::Value) {
        self.socket.send(tungstenite::Message::Text(message.to_string().into())).unwrap();
    }

    /// The next JSON message, or None after `timeout` (panics when closed).
    pub fn next(&mut self, timeout: Duration) -> Option<serde_json::Value> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            if let tungstenite::stream::MaybeTlsStream::Plain(s) = self.socket.get_ref() {
                s.set_read_timeout(Some(left)).unwrap();
            }
            match self.socket.read() {
                Ok(tungstenite::Message::Text(t)) => return Some(serde_json::from_str(t.as_str()).unwrap()),
                Ok(_) => {}
                Err(tungstenite::Error::Io(e))
                    if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) =>
                {
                    return None
                }
                Err(e) => panic!("WebSocket failed: {e}"),
            }
        }
    }
}

/// Status line and headers of a raw request (`path` sent byte for byte).
pub fn raw_head(port: u16, method: &str, path: &str) -> (u16, Vec<(String, String)>) {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    stream.write_all(format!("{method} {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes()).unwrap();
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    let status = line.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let mut headers = Vec::new();
    loop {
        line.clear();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            break;
        }
        match line.trim_end().split_once(':') {
            Some((name, value)) => headers.push((name.trim().to_ascii_lowercase(), value.trim().to_owned())),
            None => break,
        }
    }
    let _ = reader.read_to_end(&mut Vec::new());
    (status, headers)
}

/// The value of a header of [`raw_head`]'s answer (names lowercased).
pub fn header<'h>(headers: &'h [(String, String)], name: &str) -> Option<&'h str> {
    headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
}
