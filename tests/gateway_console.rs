//! The web console (gateway/console/, served by the gateway at /console) in
//! headless Chromium, driven over the DevTools protocol
//! (tests/common/browser.rs): signing in with the API's token, the streams
//! list, the live tail (publish from SQL, the event shows up; pause and
//! resume), replay by time in pages, an event's detail, a dead letter
//! retried and a webhook paused from the console, and what a role may not
//! read appearing nowhere. Bad and expired tokens and an unreadable pattern
//! are reported as text. Hostile event data renders as text. Every page is
//! checked through the DOM and saved as a screenshot under
//! target/console-screenshots/ at 1280x800 and 390x844; with
//! LITEBASE_STREAMS_UPDATE_SCREENSHOTS=1 the streams page is also written to
//! docs/console.png (the README shows it).
//!
//! The page runs under the console's CSP: every test ends by checking that
//! the page reported no CSP violation and no uncaught error.
#![cfg(feature = "integration")]

mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::browser::Browser;
use common::gateway::{token, Setup, SECRET};
use common::{publish, wait_for_horizon, wait_until};
use postgres::Client;
use serde_json::{json, Value};

const WIDE: (u32, u32) = (1280, 800);
const PHONE: (u32, u32) = (390, 844);

/// Records what the page reports about itself, installed before any of its
/// scripts run (DevTools-injected scripts are not subject to the page's CSP).
const RECORDER: &str = "window.__console = {violations: [], errors: []};
document.addEventListener('securitypolicyviolation', e => window.__console.violations.push([e.violatedDirective, e.blockedURI, e.sourceFile, e.lineNumber, e.originalPolicy, e.sample].join(' | ')));
window.addEventListener('error', e => window.__console.errors.push(String(e.message)));
window.addEventListener('unhandledrejection', e => window.__console.errors.push(String(e.reason)));";

/// The console in a browser, signed in or not.
struct Console {
    browser: Browser,
    base: String,
}

impl Console {
    /// The console of `s`'s gateway at `fragment` (e.g. `#token=...`), 1280x800.
    fn open(s: &Setup, fragment: &str) -> Console {
        let mut browser = Browser::open("about:blank");
        browser.command("Page.enable", json!({}));
        browser.command("Page.addScriptToEvaluateOnNewDocument", json!({"source": RECORDER}));
        browser.viewport(WIDE.0, WIDE.1);
        let base = format!("http://127.0.0.1:{}/console", s.gateway.port);
        browser.navigate(&format!("{base}{fragment}"));
        Console { browser, base }
    }

    /// Signed in as `role` with a sign-in link, on the streams page.
    fn signed_in(s: &Setup, role: &str) -> Console {
        let mut console = Console::open(s, &format!("#token={}", token(role)));
        console.browser.wait_for("#streams-list");
        console
    }

    /// Goes to a hash route and waits for its heading.
    fn go(&mut self, route: &str) {
        self.browser.eval(&format!("location.hash = {}", json!(route)));
        self.browser.wait_for("#page-title");
    }

    /// The text of the page's main area.
    fn main_text(&mut self) -> String {
        self.browser.text("main").unwrap_or_default()
    }

    /// The positions of the elements `selector` matches (data-position), in page order.
    fn positions(&mut self, selector: &str) -> Vec<i64> {
        let query = format!("[...document.querySelectorAll({})].map(e => Number(e.dataset.position))", json!(selector));
        serde_json::from_value(self.browser.eval(&query)).unwrap_or_default()
    }

    /// Screenshots of the page at 1280x800 and 390x844 (back at 1280x800 after).
    fn screenshots(&mut self, name: &str) {
        for (width, height) in [PHONE, WIDE] {
            self.browser.viewport(width, height);
            // Let the layout (and the charts' ResizeObserver) catch up.
            self.browser.eval("new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))");
            self.browser.screenshot(&screenshot_dir().join(format!("{name}-{width}x{height}.png")));
        }
    }

    /// No CSP violation and no uncaught error in the page.
    fn assert_clean(&mut self) {
        assert_eq!(self.browser.eval("window.__console.violations"), json!([]), "CSP violations");
        assert_eq!(self.browser.eval("window.__console.errors"), json!([]), "uncaught errors");
    }
}

fn screenshot_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target"));
    target.join("console-screenshots")
}

/// Positions published in one transaction, in order.
fn publish_together(owner: &mut Client, events: &[(&str, &str)]) -> Vec<i64> {
    let mut tx = owner.transaction().unwrap();
    let positions = events.iter().map(|(stream, data)| publish_in(&mut tx, stream, data)).collect();
    tx.commit().unwrap();
    positions
}

fn publish_in(tx: &mut postgres::Transaction, stream: &str, data: &str) -> i64 {
    tx.query_one("SELECT streams.publish($1, $2::text::jsonb)", &[&stream, &data]).unwrap().get(0)
}

/// Waits until the worker counted `stream` into streams.streams (about once a second).
fn wait_for_stats(owner: &mut Client, stream: &str, events: i64) {
    wait_until(&format!("streams.streams counts {events} events of {stream}"), Duration::from_secs(30), || {
        owner
            .query_opt("SELECT events FROM streams.streams WHERE stream = $1", &[&stream])
            .unwrap()
            .is_some_and(|r| r.get::<_, i64>(0) >= events)
    });
}

const HOSTILE: &str =
    r#"{"note": "<img src=x onerror=\"window.pwned=1\"><script>window.pwned=2</script>", "amount": 1}"#;

#[test]
fn the_console_tails_a_stream_live_and_shows_event_data_as_text() {
    let s = Setup::publishing(&[]);
    let mut owner = s.db.connect();
    publish(&mut owner, "pay.a", r#"{"order_id": "ord_1", "amount": 49.00}"#);
    let hostile = publish(&mut owner, "pay.hostile", HOSTILE);
    // A stream the reader may not read, in a transaction with one it may.
    let together =
        publish_together(&mut owner, &[("pay.a", r#"{"order_id": "ord_2"}"#), ("secret.s", r#"{"hidden": true}"#)]);
    wait_for_horizon(&mut owner, together[1]);
    wait_for_stats(&mut owner, "secret.s", 1);

    let mut console = Console::signed_in(&s, &s.reader.name);
    let href = console.browser.eval("location.href").as_str().unwrap_or_default().to_owned();
    assert!(href.ends_with("/console#/streams"), "the token left the address bar: {href}");
    console.browser.wait_for_text("#streams-list", "pay.hostile");
    assert!(console.main_text().contains("pay.a"));
    assert!(!console.main_text().contains("secret"), "a stream the role may not read is not listed");
    assert_eq!(console.browser.text("#session-role").as_deref(), Some(s.reader.name.as_str()));
    console.screenshots("streams");

    // Keyboard: the first Tab reaches the skip link, Enter moves to the content.
    console.browser.eval("document.activeElement.blur()");
    console.browser.press("Tab");
    assert_eq!(console.browser.eval("document.activeElement.id"), json!("skip-link"));
    console.browser.press("Enter");
    assert_eq!(console.browser.eval("document.activeElement.id"), json!("page-title"));

    // The live tail: an event published from SQL appears, newest first.
    console.go("#/streams/pay.*");
    console.browser.wait_for_text("#tail-state", "live");
    let started = Instant::now();
    let live = publish(&mut owner, "pay.a", r#"{"order_id": "ord_3", "amount": 12.50}"#);
    let row = format!(".event-row[data-position=\"{live}\"]");
    console.browser.wait_for(&row);
    eprintln!("published from SQL to shown in the live tail: {:?}", started.elapsed());
    assert!(console.browser.text(&row).unwrap().contains("ord_3"));

    // Paused: events are counted, not shown; resumed: shown, newest first.
    console.browser.click("#tail-pause");
    let held = [publish(&mut owner, "pay.b", r#"{"held": 1}"#), publish(&mut owner, "pay.b", r#"{"held": 2}"#)];
    console.browser.wait_for_text("#tail-buffered", "2");
    assert_eq!(console.positions(".event-row"), [live], "nothing shown while paused");
    assert_eq!(console.browser.text("#tail-pause").as_deref(), Some("Resume"));
    console.browser.click("#tail-pause");
    assert_eq!(console.positions(".event-row"), [held[1], held[0], live]);
    assert_eq!(console.browser.text("#tail-buffered").as_deref(), Some("0"));

    // Hostile data is text: no element made of it, no script run.
    let live_hostile = publish(&mut owner, "pay.hostile", HOSTILE);
    console.browser.wait_for(&format!(".event-row[data-position=\"{live_hostile}\"]"));
    assert!(console.main_text().contains(r#"<img src=x onerror=\"window.pwned=1\">"#));
    assert_eq!(console.browser.eval("document.querySelectorAll('main img, main script').length"), json!(0));
    assert_eq!(console.browser.eval("window.pwned === undefined"), json!(true));
    console.screenshots("tail");

    // An event's detail: envelope, pretty data, its transaction without what the role may not read.
    console.go(&format!("#/events/{}", together[0]));
    console.browser.wait_for("#event-data");
    assert_eq!(console.browser.text("#event-data").as_deref(), Some("{\n  \"order_id\": \"ord_2\"\n}"));
    let envelope = console.browser.text(".facts").unwrap_or_default();
    assert!(envelope.contains(&format!("Position{}", together[0])) && envelope.contains("Streampay.a"), "{envelope}");
    assert!(console.main_text().contains("(this one)"));
    assert!(!console.main_text().contains("secret"), "the transaction's unreadable event is not shown");
    console.screenshots("event");
    console.go(&format!("#/events/{hostile}"));
    console.browser.wait_for_text("#event-data", "<img src=x onerror=");
    assert_eq!(console.browser.eval("document.querySelectorAll('main img, main script').length"), json!(0));
    assert_eq!(console.browser.eval("window.pwned === undefined"), json!(true));

    // What the role may not read: no detail, and a tail that says why.
    console.go(&format!("#/events/{}", together[1]));
    console.browser.wait_for_text("#event-body", &format!("No event at position {}", together[1]));
    assert!(!console.main_text().contains("hidden"));
    console.go("#/streams/secret.*");
    console.browser.wait_for_text("#tail-problem", "42501");
    assert_eq!(console.browser.text("#tail-state").as_deref(), Some("stopped"));
    console.screenshots("tail-refused");
    assert!(!console.main_text().contains(" at "), "no stack trace: {}", console.main_text());
    console.assert_clean();
}

#[test]
fn replay_by_time_shows_the_events_from_that_time_in_pages() {
    let s = Setup::publishing(&[]);
    let mut owner = s.db.connect();
    let before: Vec<i64> = (0..3).map(|i| publish(&mut owner, "pay.a", &format!(r#"{{"before": {i}}}"#))).collect();
    wait_for_horizon(&mut owner, before[2]);
    // A time after those commits and before the next ones.
    let since: String = owner
        .query_one("SELECT to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')", &[])
        .unwrap()
        .get(0);
    let after: Vec<i64> = (0..5).map(|i| publish(&mut owner, "pay.b", &format!(r#"{{"after": {i}}}"#))).collect();
    wait_for_horizon(&mut owner, after[4]);

    let mut console = Console::signed_in(&s, &s.reader.name);
    console.go("#/streams/pay.*");
    console.browser.click("#tab-replay");
    console.browser.eval("(() => { const m = document.querySelector('#replay-mode'); m.value = 'since'; m.dispatchEvent(new Event('change')); })()");
    console.browser.type_into("#replay-value", &since);
    console.browser.type_into("#replay-size", "3");
    console.browser.click("#replay-submit");
    console.browser.wait_for("#replay-summary");
    assert_eq!(console.positions(".replay-row"), after[..3], "the first page from {since}");
    console.screenshots("replay");
    console.browser.click("#replay-next");
    wait_until("the next page", Duration::from_secs(30), || console.positions(".replay-row") == after[3..]);

    // A bad time is the database's error, as text.
    console.browser.type_into("#replay-value", "not a time");
    console.browser.click("#replay-submit");
    console.browser.wait_for_text("#replay-result", "SQLSTATE");
    console.assert_clean();
}

#[test]
fn a_dead_letter_is_retried_and_a_webhook_paused_from_the_console() {
    let s = Setup::publishing(&[]);
    let mut owner = s.db.connect();
    let role = &s.reader.name;
    let p = publish(&mut owner, "pay.a", r#"{"order_id": "ord_poison"}"#);
    wait_for_horizon(&mut owner, p);
    // One statement at a time: the worker writes the poll's delivery down
    // in its own transaction, which must see the committed subscription.
    for sql in [
        format!("GRANT EXECUTE ON FUNCTION streams.create_webhook TO {role}"),
        format!("SET ROLE {role}"),
        "SELECT streams.create_subscription('billing', 'pay.*', after => 0, max_attempts => 1)".to_owned(),
        "BEGIN".to_owned(),
        "SELECT count(*) FROM streams.poll('billing', 1)".to_owned(),
        format!("SELECT streams.nack('billing', {p}, reason => 'card declined <b>twice</b>')"),
        "COMMIT".to_owned(),
        "SELECT streams.create_webhook('ledger', 'pay.*', 'https://ledger.example.invalid/hook/s3cr3t-path?token=s3cr3t')"
            .to_owned(),
        "RESET ROLE".to_owned(),
    ] {
        owner.batch_execute(&sql).unwrap();
    }
    let parked = |owner: &mut Client| -> i64 {
        owner.query_one("SELECT count(*) FROM streams.dead_letters WHERE subscription = 'billing'", &[]).unwrap().get(0)
    };
    assert_eq!(parked(&mut owner), 1);

    let mut console = Console::signed_in(&s, role);
    console.go("#/subscriptions");
    console.browser.wait_for_text("#subscriptions-list", "billing");
    console.browser.click("[data-action=\"dead-letters\"][data-subscription=\"billing\"]");
    console.browser.wait_for(&format!(".dead-letter[data-position=\"{p}\"]"));
    assert!(console.main_text().contains("card declined <b>twice</b>"), "the error as text");
    console.screenshots("subscriptions");
    console.browser.click(&format!("[data-action=\"retry\"][data-position=\"{p}\"]"));
    console.browser.wait_for_text("#subscriptions-message", &format!("Retried position {p} of billing (1 changed)"));
    wait_until("the dead letter is retried", Duration::from_secs(10), || parked(&mut owner) == 0);
    // Retried, not discarded: the subscription delivers it again.
    owner.batch_execute(&format!("SET ROLE {role}")).unwrap();
    owner.batch_execute("BEGIN").unwrap();
    let again: Vec<i64> =
        owner.query("SELECT position FROM streams.poll('billing', 1)", &[]).unwrap().iter().map(|r| r.get(0)).collect();
    owner.batch_execute("ROLLBACK").unwrap();
    owner.batch_execute("RESET ROLE").unwrap();
    assert_eq!(again, [p], "the retried dead letter is delivered again");

    console.go("#/webhooks");
    console.browser.wait_for_text("#webhooks-list", "ledger");
    assert!(console.main_text().contains("ledger.example.invalid"));
    assert!(!console.main_text().contains("s3cr3t"), "a webhook URL's path and query are not shown");
    console.browser.click("[data-action=\"pause\"][data-webhook=\"ledger\"]");
    console.browser.wait_for_text("#webhooks-message", "Paused ledger");
    console.browser.wait_for_text("[data-webhook=\"ledger\"]", "paused");
    let state: String =
        owner.query_one("SELECT state FROM streams.webhooks WHERE name = 'ledger'", &[]).unwrap().get(0);
    assert_eq!(state, "paused");
    console.browser.wait_for("[data-action=\"resume\"][data-webhook=\"ledger\"]");
    console.screenshots("webhooks");

    console.go("#/worker");
    console.browser.wait_for_text("#worker-body", "Horizon");
    console.screenshots("worker");
    console.assert_clean();
}

#[test]
fn another_roles_subscriptions_and_dead_letters_are_not_shown() {
    let s = Setup::publishing(&[]);
    let other = s.role("other", "SELECT streams.grant('read', 'pay.*', '{r}');");
    let mut owner = s.db.connect();
    let p = publish(&mut owner, "pay.a", r#"{"order_id": "ord_x"}"#);
    wait_for_horizon(&mut owner, p);
    for sql in [
        format!("SET ROLE {}", other.name),
        "SELECT streams.create_subscription('theirs', 'pay.*', after => 0, max_attempts => 1)".to_owned(),
        "BEGIN".to_owned(),
        "SELECT count(*) FROM streams.poll('theirs', 1)".to_owned(),
        format!("SELECT streams.nack('theirs', {p})"),
        "COMMIT".to_owned(),
        "RESET ROLE".to_owned(),
    ] {
        owner.batch_execute(&sql).unwrap();
    }
    // The reader sees neither the other role's subscription nor its dead letters.
    let mut console = Console::signed_in(&s, &s.reader.name);
    console.go("#/subscriptions");
    console.browser.wait_for_text("#subscriptions-list", "No subscriptions");
    assert!(!console.main_text().contains("theirs"));
    console.assert_clean();
}

#[test]
fn bad_and_expired_tokens_are_reported_as_text_and_a_pasted_token_signs_in() {
    let s = Setup::new(&[]);
    let mut console = Console::open(&s, "#token=not-a-jwt");
    console.browser.wait_for("#signin-reason");
    let bad = console.browser.text("#signin-reason").unwrap();
    assert!(bad.starts_with("The gateway refused the token: "), "{bad}");
    assert!(!bad.contains("Error:") && !bad.contains(" at "), "a reason, not a stack trace: {bad}");
    console.screenshots("signin");

    #[derive(serde::Serialize)]
    struct Claims<'a> {
        role: &'a str,
        exp: u64,
    }
    let past = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() - 600;
    let expired = jsonwebtoken::encode(
        &jsonwebtoken::Header::default(),
        &Claims { role: &s.reader.name, exp: past },
        &jsonwebtoken::EncodingKey::from_secret(SECRET.as_bytes()),
    )
    .unwrap();
    console.browser.type_into("#token", &expired);
    console.browser.click("#sign-in");
    wait_until("the expired token is refused", Duration::from_secs(30), || {
        console.browser.text("#signin-reason").is_some_and(|t| t != bad && t.to_lowercase().contains("expired"))
    });
    assert_eq!(
        console
            .browser
            .eval("sessionStorage.length === 0 || !Object.keys(sessionStorage).some(k => k.endsWith('.token'))"),
        json!(true)
    );

    // A good token pasted into the form signs in; signing out forgets it.
    console.browser.type_into("#token", &token(&s.reader.name));
    console.browser.click("#sign-in");
    console.browser.wait_for("#streams-list");
    assert_eq!(console.browser.text("#session-role").as_deref(), Some(s.reader.name.as_str()));
    console.browser.click("#sign-out");
    console.browser.wait_for("#signin-form");
    assert_eq!(console.browser.eval("Object.keys(sessionStorage).some(k => k.endsWith('.token'))"), json!(false));
    let _ = &console.base;
    console.assert_clean();
}

/// The streams page with realistic streams and a steady trickle of events,
/// for the README: written to docs/console.png with
/// LITEBASE_STREAMS_UPDATE_SCREENSHOTS=1 (always to target/console-screenshots/).
#[test]
fn the_streams_page_with_live_traffic() {
    let s = Setup::new(&[]);
    let ops = s.role(
        "ops",
        "SELECT streams.grant('read', '*', '{r}');
         GRANT USAGE ON SCHEMA streams TO {r}; GRANT SELECT ON streams.status TO {r};
         GRANT EXECUTE ON FUNCTION streams._worker_status() TO {r};",
    );
    let mut owner = s.db.connect();
    let streams = ["orders.created", "orders.paid", "payments.captured", "inventory.reserved", "shipping.dispatched"];
    let mut order = 1000;
    let mut burst = |owner: &mut Client, n: usize| {
        let mut tx = owner.transaction().unwrap();
        let mut last = 0;
        for i in 0..n {
            order += 1;
            let stream = streams[(order as usize * 7 + i) % streams.len()];
            let data = json!({"order_id": format!("ord_{order}"), "amount": format!("{}.{:02}", 10 + order % 90, order % 100), "currency": "EUR"});
            last = publish_in(&mut tx, stream, &data.to_string());
        }
        tx.commit().unwrap();
        last
    };
    for _ in 0..40 {
        burst(&mut owner, 5);
    }
    let mut console = Console::signed_in(&s, &ops.name);
    // About half a minute of traffic, so that the charts have a shape.
    let until = Instant::now() + Duration::from_secs(30);
    let mut round = 0u64;
    let mut last = 0;
    while Instant::now() < until {
        round += 1;
        last = burst(&mut owner, (3 + (round * 5) % 11) as usize);
        std::thread::sleep(Duration::from_millis(250)); // paces the traffic; nothing is asserted on it
    }
    wait_for_horizon(&mut owner, last);
    wait_for_stats(&mut owner, "shipping.dispatched", 1);
    console.browser.wait_for_text("#streams-list", "shipping.dispatched");
    let samples =
        console.browser.eval("JSON.parse(sessionStorage.getItem('litebase-streams-console.samples')).samples.length");
    assert!(samples.as_u64().unwrap_or(0) >= 5, "the page sampled the totals: {samples}");
    console.browser.eval("window.scrollTo(0, 0); document.activeElement.blur()");
    console.screenshots("streams-traffic");
    if std::env::var("LITEBASE_STREAMS_UPDATE_SCREENSHOTS").is_ok_and(|v| v == "1") {
        let docs = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("docs/console.png");
        console.browser.viewport(WIDE.0, WIDE.1);
        console.browser.screenshot(&docs);
    }
    // A reload keeps the charts (the samples live in sessionStorage).
    console.browser.navigate(&format!("{}#/streams", console.base));
    console.browser.wait_for("#streams-list");
    let kept =
        console.browser.eval("JSON.parse(sessionStorage.getItem('litebase-streams-console.samples')).samples.length");
    assert!(kept.as_u64().unwrap_or(0) >= samples.as_u64().unwrap_or(0), "samples kept across a reload: {kept}");
    console.assert_clean();
    let _: Value = Value::Null;
}
