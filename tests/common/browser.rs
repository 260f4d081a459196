//! Headless Chromium driven over the DevTools protocol (a WebSocket to the
//! page target, tungstenite): open a page, navigate, evaluate JavaScript
//! (awaiting promises), click and type by CSS selector, set the viewport,
//! and save screenshots. Used by tests/gateway.rs (EventSource and WebSocket
//! in a real browser) and tests/gateway_console.rs (the web console).
//!
//! Chromium comes from the Debian package `chromium` (make setup installs
//! it); it runs with a profile of its own that is removed with the Browser.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Value};

use super::wait_until;

type Page = tungstenite::WebSocket<tungstenite::stream::MaybeTlsStream<std::net::TcpStream>>;

/// A running Chromium and a DevTools connection to its page.
pub struct Browser {
    page: Page,
    next_id: u64,
    // Dropped in this order: the connection, the process, its profile.
    _child: KillOnDrop,
    _profile: TempDir,
}

/// A child process killed when dropped, also by a panic before it is in place.
pub struct KillOnDrop(pub std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A directory removed when dropped.
pub struct TempDir(pub PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// An exception thrown by an evaluated expression, as the page reported it.
#[derive(Debug)]
pub struct PageError(pub String);

impl Browser {
    /// Chromium with `url` open in its one page.
    pub fn open(url: &str) -> Browser {
        // Unique per Browser, also when one test binary opens several.
        static OPENED: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = OPENED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = format!("gateway-chromium-{}-{n}", std::process::id());
        let profile = TempDir(std::env::temp_dir().join(&name));
        // Chromium's own output, kept after the test for a launch that fails.
        let log_path = std::env::temp_dir().join(format!("{name}.log"));
        let log = std::fs::File::create(&log_path).unwrap();
        eprintln!("chromium's output: {}", log_path.display());
        // Port 0: Chromium picks a free port itself and writes it to
        // DevToolsActivePort in the profile (no race for a port we chose).
        let mut child = std::process::Command::new("chromium")
            .args(["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run"])
            .args(["--disable-extensions", "--hide-scrollbars", "--force-device-scale-factor=1"])
            .arg("--remote-debugging-port=0")
            .arg(format!("--user-data-dir={}", profile.0.display()))
            .arg(url)
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .map(KillOnDrop)
            .expect("chromium runs (Debian package chromium; make setup installs it)");
        let mut ws_url = None;
        // A loaded machine can take long to start a browser: wait generously,
        // and fail at once, with its output, if it exits.
        wait_until("Chromium lists the page on its DevTools port", Duration::from_secs(120), || {
            if let Ok(Some(status)) = child.0.try_wait() {
                panic!("chromium exited ({status}): {}", std::fs::read_to_string(&log_path).unwrap_or_default());
            }
            let Some(port) = std::fs::read_to_string(profile.0.join("DevToolsActivePort"))
                .ok()
                .and_then(|s| s.lines().next().and_then(|l| l.trim().parse::<u16>().ok()))
            else {
                return false;
            };
            let Some(body) = devtools_list(port) else { return false };
            let targets: Vec<Value> = serde_json::from_str(&body).unwrap_or_default();
            ws_url = targets
                .iter()
                .find(|t| t["type"] == "page")
                .and_then(|t| t["webSocketDebuggerUrl"].as_str().map(String::from));
            ws_url.is_some()
        });
        let (page, _) = tungstenite::connect(ws_url.unwrap()).unwrap();
        if let tungstenite::stream::MaybeTlsStream::Plain(s) = page.get_ref() {
            s.set_read_timeout(Some(Duration::from_secs(30))).unwrap(); // a dead browser fails the test, not hangs it
        }
        Browser { _child: child, page, next_id: 1, _profile: profile }
    }

    /// One DevTools command; its result (panics on a protocol error).
    pub fn command(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        let call = json!({"id": id, "method": method, "params": params});
        self.page.send(tungstenite::Message::Text(call.to_string().into())).unwrap();
        loop {
            // Events (no id) and answers to earlier calls are skipped.
            if let tungstenite::Message::Text(t) = self.page.read().unwrap() {
                let reply: Value = serde_json::from_str(t.as_str()).unwrap();
                if reply["id"] == id {
                    assert!(reply["error"].is_null(), "{method}: {}", reply["error"]);
                    return reply["result"].clone();
                }
            }
        }
    }

    /// The value of a JavaScript expression in the page (a promise is
    /// awaited), or what it threw.
    pub fn try_eval(&mut self, expression: &str) -> Result<Value, PageError> {
        let result = self.command(
            "Runtime.evaluate",
            json!({"expression": expression, "returnByValue": true, "awaitPromise": true}),
        );
        match result.get("exceptionDetails") {
            Some(details) => Err(PageError(
                details["exception"]["description"]
                    .as_str()
                    .unwrap_or_else(|| details["text"].as_str().unwrap_or("?"))
                    .to_owned(),
            )),
            None => Ok(result["result"]["value"].clone()),
        }
    }

    /// The value of a JavaScript expression in the page (a promise is
    /// awaited); null if it threw (a page still loading), so that it can be
    /// polled with wait_until.
    pub fn eval(&mut self, expression: &str) -> Value {
        self.try_eval(expression).unwrap_or(Value::Null)
    }

    /// Loads `url` and waits until the document has loaded.
    pub fn navigate(&mut self, url: &str) {
        self.command("Page.navigate", json!({"url": url}));
        // Page.navigate answers once the new document is committed: its
        // readyState is the new page's.
        wait_until(&format!("{url} loads"), Duration::from_secs(30), || {
            self.eval("document.readyState") == json!("complete")
        });
    }

    /// The text of the first element `selector` matches (null: none).
    pub fn text(&mut self, selector: &str) -> Option<String> {
        let selector = json!(selector);
        self.eval(&format!("document.querySelector({selector})?.textContent ?? null")).as_str().map(String::from)
    }

    /// Waits until an element matches `selector`.
    pub fn wait_for(&mut self, selector: &str) {
        let query = format!("document.querySelector({}) !== null", json!(selector));
        self.wait(&format!("the page shows {selector}"), |browser| browser.eval(&query) == json!(true));
    }

    /// Waits until the first element `selector` matches contains `text`.
    pub fn wait_for_text(&mut self, selector: &str, text: &str) {
        self.wait(&format!("{selector} says {text:?}"), |browser| {
            browser.text(selector).is_some_and(|t| t.contains(text))
        });
    }

    /// wait_until for the page; a timeout also says what the page showed.
    pub fn wait(&mut self, what: &str, mut condition: impl FnMut(&mut Browser) -> bool) {
        let waited = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            wait_until(what, Duration::from_secs(30), || condition(self))
        }));
        if let Err(panic) = waited {
            let shown = self.eval(
                "JSON.stringify({href: location.href, body: document.body?.innerText?.slice(0, 3000), \
                 page: window.__console ?? null})",
            );
            eprintln!("the page at the timeout: {}", shown.as_str().unwrap_or("?"));
            std::panic::resume_unwind(panic);
        }
    }

    /// Clicks the first element `selector` matches, as a user would: it is
    /// scrolled into view and gets a mouse press and release at its centre
    /// (so that an element covered by another is not clicked through).
    pub fn click(&mut self, selector: &str) {
        self.wait_for(selector);
        let selector_json = json!(selector);
        let point = self.eval(&format!(
            "(() => {{ const e = document.querySelector({selector_json}); e.scrollIntoView({{block: 'center'}}); \
             const r = e.getBoundingClientRect(); return [r.left + r.width / 2, r.top + r.height / 2]; }})()"
        ));
        let (x, y) = (point[0].as_f64().unwrap(), point[1].as_f64().unwrap());
        for kind in ["mousePressed", "mouseReleased"] {
            self.command(
                "Input.dispatchMouseEvent",
                json!({"type": kind, "x": x, "y": y, "button": "left", "clickCount": 1}),
            );
        }
    }

    /// Replaces the value of the field `selector` matches with `text`, typed
    /// (focus, then the text inserted as by a keyboard, firing input events).
    pub fn type_into(&mut self, selector: &str, text: &str) {
        self.wait_for(selector);
        let selector = json!(selector);
        self.eval(&format!("(() => {{ const e = document.querySelector({selector}); e.focus(); e.select?.(); }})()"));
        self.command("Input.insertText", json!({"text": text}));
    }

    /// Presses and releases a key (e.g. "Tab", "Enter") on the focused element.
    pub fn press(&mut self, key: &str) {
        let (code, text) = match key {
            "Enter" => (13, "\r"),
            "Tab" => (9, ""),
            _ => (0, ""),
        };
        self.command(
            "Input.dispatchKeyEvent",
            json!({"type": "keyDown", "key": key, "code": key, "windowsVirtualKeyCode": code, "text": text}),
        );
        self.command(
            "Input.dispatchKeyEvent",
            json!({"type": "keyUp", "key": key, "code": key, "windowsVirtualKeyCode": code}),
        );
    }

    /// The viewport: `width` x `height` CSS pixels at scale 1; a width under
    /// 600 is emulated as a phone (touch, mobile viewport).
    pub fn viewport(&mut self, width: u32, height: u32) {
        let mobile = width < 600;
        self.command(
            "Emulation.setDeviceMetricsOverride",
            json!({"width": width, "height": height, "deviceScaleFactor": 1, "mobile": mobile}),
        );
    }

    /// A PNG of the viewport, written to `path` (its directory is created).
    pub fn screenshot(&mut self, path: &Path) {
        let result = self.command("Page.captureScreenshot", json!({"format": "png", "captureBeyondViewport": false}));
        let png = decode_base64(result["data"].as_str().expect("a screenshot"));
        assert!(png.starts_with(b"\x89PNG"), "Page.captureScreenshot gives a PNG");
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).unwrap();
        }
        std::fs::write(path, png).unwrap();
        eprintln!("screenshot: {}", path.display());
    }
}

/// Standard base64 (with padding), as DevTools sends binary data.
fn decode_base64(text: &str) -> Vec<u8> {
    let value = |c: u8| -> u32 {
        match c {
            b'A'..=b'Z' => (c - b'A') as u32,
            b'a'..=b'z' => (c - b'a' + 26) as u32,
            b'0'..=b'9' => (c - b'0' + 52) as u32,
            b'+' => 62,
            b'/' => 63,
            _ => panic!("not base64: {c}"),
        }
    };
    let bytes: Vec<u8> = text.bytes().filter(|c| !c.is_ascii_whitespace()).collect();
    let mut out = Vec::with_capacity(bytes.len() / 4 * 3);
    for chunk in bytes.chunks(4) {
        let data: Vec<u8> = chunk.iter().copied().take_while(|&c| c != b'=').collect();
        let mut n = 0u32;
        for (i, &c) in data.iter().enumerate() {
            n |= value(c) << (18 - 6 * i);
        }
        let produced = data.len().saturating_sub(1);
        out.extend_from_slice(&n.to_be_bytes()[1..1 + produced]);
    }
    out
}

/// GET /json/list of Chromium's DevTools HTTP server (HTTP/1.1, Content-Length).
fn devtools_list(port: u16) -> Option<String> {
    use std::io::{BufRead, Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    stream.write_all(format!("GET /json/list HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n").as_bytes()).ok()?;
    let mut reader = std::io::BufReader::new(stream);
    let mut length = 0;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).ok()? == 0 {
            return None;
        }
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((k, v)) = line.split_once(':') {
            if k.eq_ignore_ascii_case("content-length") {
                length = v.trim().parse().ok()?;
            }
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).ok()?;
    String::from_utf8(body).ok()
}
