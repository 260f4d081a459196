//! The console's JSON API (`/v1/console/...`) and its files, against the
//! real server (the gateway runs as tests/gateway.rs describes): each
//! endpoint's answer, and what a token may not do: no token or an expired
//! one is 401; a role without read on a stream sees it nowhere (the streams
//! list, an event's detail, its transaction); a role cannot retry or
//! discard another role's dead letters or pause another's webhook, while a
//! member of the owner can, exactly as in SQL; the files carry the console's
//! Content-Security-Policy, and paths out of the console are 404.
#![cfg(feature = "integration")]

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::gateway::{header, raw_head, token, Gateway, Setup, SECRET};
use common::{publish, wait_for_horizon, wait_until, TestRole};
use serde_json::Value;

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs()
}

/// A request with `token` as Bearer (none: no Authorization); (status, JSON body).
fn call(gw: &Gateway, method: &str, path: &str, token: Option<&str>) -> (u16, Value) {
    let auth = token.map(|t| format!("Bearer {t}"));
    let headers: Vec<(&str, &str)> = auth.iter().map(|a| ("Authorization", a.as_str())).collect();
    let (status, body) = gw.request(method, path, &headers, "");
    let json = serde_json::from_str(&body).unwrap_or_else(|_| panic!("{method} {path}: not JSON: {body:?}"));
    (status, json)
}

/// GET as `role`, which must answer 200; the body.
fn get(gw: &Gateway, path: &str, role: &str) -> Value {
    let (status, body) = call(gw, "GET", path, Some(&token(role)));
    assert_eq!(status, 200, "GET {path} as {role}: {body}");
    body
}

/// The names of a streams page.
fn names(page: &Value) -> Vec<&str> {
    page["streams"].as_array().unwrap().iter().map(|s| s["stream"].as_str().unwrap()).collect()
}

/// Every route of the API, with a path that parses.
const ROUTES: [(&str, &str); 11] = [
    ("GET", "/v1/console/session"),
    ("GET", "/v1/console/overview"),
    ("GET", "/v1/console/streams"),
    ("GET", "/v1/console/events/1"),
    ("GET", "/v1/console/subscriptions"),
    ("GET", "/v1/console/subscriptions/x/y/dead-letters"),
    ("POST", "/v1/console/subscriptions/x/y/dead-letters/1/retry"),
    ("POST", "/v1/console/subscriptions/x/y/dead-letters/1/discard"),
    ("GET", "/v1/console/webhooks"),
    ("POST", "/v1/console/webhooks/x/y/pause"),
    ("POST", "/v1/console/webhooks/x/y/resume"),
];

#[test]
fn no_token_an_expired_one_or_an_unknown_role_is_401_everywhere() {
    let s = Setup::new(&[]);
    let expired = {
        let claims = serde_json::json!({"role": s.reader.name, "exp": now() - 60});
        let key = jsonwebtoken::EncodingKey::from_secret(SECRET.as_bytes());
        jsonwebtoken::encode(&jsonwebtoken::Header::default(), &claims, &key).unwrap()
    };
    for (method, path) in ROUTES {
        for (what, t) in [("no token", None), ("expired", Some(expired.clone())), ("unknown", Some(token("nobody_x")))]
        {
            let (status, body) = call(&s.gateway, method, path, t.as_deref());
            assert_eq!(status, 401, "{method} {path} with {what}: {body}");
            assert!(body["error"].is_string() && !body["error"].as_str().unwrap().is_empty(), "{body}");
        }
        // A token in the URL is refused, however good, also beside a good header.
        let good = token(&s.reader.name);
        let with_query = format!("{path}?access_token={good}");
        assert_eq!(call(&s.gateway, method, &with_query, None).0, 401, "{method} {with_query}");
        let (status, body) = call(&s.gateway, method, &with_query, Some(&good));
        assert_eq!(status, 401, "{method} {with_query} with a good header: {body}");
        assert!(body["error"].as_str().unwrap().contains("Authorization header"), "{body}");
    }
}

#[test]
fn the_session_names_the_role_its_expiry_the_database_and_the_log() {
    let s = Setup::new(&[]);
    let stranger = s.role("stranger", "");
    let log_id: String = s.db.connect().query_one("SELECT streams.log_id()::text", &[]).unwrap().get(0);
    let before = now();
    let session = get(&s.gateway, "/v1/console/session", &s.reader.name);
    assert_eq!(session["role"], s.reader.name.as_str());
    assert_eq!(session["database"], s.db.name.as_str());
    assert_eq!(session["log_id"], log_id.as_str());
    // token() signs an hour; the gateway takes it 5 s longer.
    let expires_at = session["expires_at"].as_u64().unwrap();
    assert!((before + 3600..=now() + 3605).contains(&expires_at), "{session}");
    // A role without any read grant may not call streams.log_id(): none.
    let session = get(&s.gateway, "/v1/console/session", &stranger.name);
    assert_eq!((session["role"].as_str(), &session["log_id"]), (Some(stranger.name.as_str()), &Value::Null));
}

#[test]
fn the_overview_shows_the_worker_to_roles_granted_it_and_says_what_to_grant() {
    let s = Setup::new(&[]);
    let ops = s.role(
        "ops",
        "GRANT USAGE ON SCHEMA streams TO {r}; GRANT SELECT ON streams.status TO {r};
         GRANT EXECUTE ON FUNCTION streams._worker_status() TO {r};",
    );
    let stranger = s.role("stranger", "");
    let mut owner = s.db.connect();
    let position = publish(&mut owner, "pay.a", "{}");
    wait_for_horizon(&mut owner, position);

    let overview = get(&s.gateway, "/v1/console/overview", &ops.name);
    assert_eq!(overview["status_error"], Value::Null, "{overview}");
    let status = &overview["status"];
    assert!(status["horizon"].as_i64().unwrap() >= position, "{overview}");
    assert!(status["worker_pid"].as_i64().unwrap() > 0, "{overview}");
    assert!(status["worker_state"].is_string(), "{overview}");
    assert!(status["log_id"].is_string(), "{overview}");
    assert!(overview["time"].as_str().unwrap().ends_with("+00:00"), "{overview}");
    // ops has no read grant: no horizon() for it.
    assert_eq!(overview["horizon"], Value::Null, "{overview}");

    // A reader may read the horizon but not the worker's state: the
    // overview says what to grant instead of failing.
    let overview = get(&s.gateway, "/v1/console/overview", &s.reader.name);
    assert!(overview["horizon"].as_i64().unwrap() >= position, "{overview}");
    assert_eq!(overview["status"], Value::Null, "{overview}");
    let error = overview["status_error"].as_str().unwrap();
    assert!(error.contains("permission denied") && error.contains("GRANT SELECT ON streams.status"), "{error}");
    let overview = get(&s.gateway, "/v1/console/overview", &stranger.name);
    assert_eq!((&overview["status"], &overview["horizon"]), (&Value::Null, &Value::Null), "{overview}");
    assert!(overview["status_error"].as_str().unwrap().contains("GRANT USAGE ON SCHEMA streams"), "{overview}");
}

#[test]
fn streams_are_listed_by_name_in_pages_and_only_those_the_role_reads() {
    let s = Setup::new(&[]);
    let other = s.role("other", "SELECT streams.grant('read', 'other', '{r}');");
    let stranger = s.role("stranger", "");
    let mut owner = s.db.connect();
    let mut last = 0;
    for (stream, count) in [("pay.a", 3), ("pay.b", 1), ("secret.x", 2), ("other", 1)] {
        for n in 0..count {
            last = publish(&mut owner, stream, &format!(r#"{{"n": {n}}}"#));
        }
    }
    wait_for_horizon(&mut owner, last);
    let expected: Vec<(String, i64, i64, i64)> = owner
        .query(
            "SELECT stream, count(*), min(position), max(position) FROM streams.events
             WHERE stream LIKE 'pay.%' GROUP BY stream ORDER BY stream",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect();
    // The counts trail the log by the worker's stats pass (about a second).
    let mut page = Value::Null;
    wait_until("the console counts every published event", Duration::from_secs(20), || {
        page = get(&s.gateway, "/v1/console/streams", &s.reader.name);
        page["streams"].as_array().unwrap().iter().map(|s| s["events"].as_i64().unwrap()).sum::<i64>() == 4
    });
    assert_eq!(names(&page), ["pay.a", "pay.b"], "{page}");
    assert_eq!(page["next"], Value::Null);
    for (row, (stream, events, first, last)) in page["streams"].as_array().unwrap().iter().zip(&expected) {
        assert_eq!(row["stream"], stream.as_str());
        assert_eq!((row["events"].as_i64(), row["first_position"].as_i64()), (Some(*events), Some(*first)), "{row}");
        assert_eq!(row["last_position"].as_i64(), Some(*last), "{row}");
        assert!(row["last_time"].as_str().unwrap().ends_with("+00:00"), "{row}");
    }

    // Paged by name: `next` is the `after` of the following page.
    let first = get(&s.gateway, "/v1/console/streams?limit=1", &s.reader.name);
    assert_eq!((names(&first), first["next"].as_str()), (vec!["pay.a"], Some("pay.a")), "{first}");
    let second = get(&s.gateway, "/v1/console/streams?limit=1&after=pay.a", &s.reader.name);
    assert_eq!((names(&second), &second["next"]), (vec!["pay.b"], &Value::Null), "{second}");
    let past = get(&s.gateway, "/v1/console/streams?after=pay.b", &s.reader.name);
    assert_eq!(names(&past), Vec::<&str>::new());

    // Other roles see their own streams, or none; secret.x nobody but the owner.
    assert_eq!(names(&get(&s.gateway, "/v1/console/streams", &other.name)), ["other"]);
    let (status, body) = call(&s.gateway, "GET", "/v1/console/streams", Some(&token(&stranger.name)));
    assert!(status == 403 || (status == 200 && names(&body).is_empty()), "{status} {body}");
    let (status, body) = call(&s.gateway, "GET", "/v1/console/streams?limit=501", Some(&token(&s.reader.name)));
    assert_eq!((status, body["sqlstate"].as_str()), (400, Some("22023")), "{body}");
}

#[test]
fn an_event_comes_with_the_events_of_its_transaction_the_role_may_read() {
    let s = Setup::new(&[]);
    let mut owner = s.db.connect();
    let mut tx = owner.transaction().unwrap();
    let mut positions = Vec::new();
    for (stream, data) in [("pay.a", r#"{"amount": 49.00}"#), ("secret.x", r#"{"pin": 1234}"#), ("pay.b", "{}")] {
        positions.push(tx.query_one("SELECT streams.publish($1, $2::text::jsonb)", &[&stream, &data]).unwrap().get(0));
    }
    tx.commit().unwrap();
    let lone = publish(&mut owner, "pay.a", "{}");
    wait_for_horizon(&mut owner, lone);
    let (paid, secret, other): (i64, i64, i64) = (positions[0], positions[1], positions[2]);
    let canonical: String =
        owner.query_one("SELECT streams.to_json(e)::text FROM streams.get($1) e", &[&paid]).unwrap().get(0);

    let auth = format!("Bearer {}", token(&s.reader.name));
    let (status, text) =
        s.gateway.request("GET", &format!("/v1/console/events/{paid}"), &[("Authorization", &auth)], "");
    assert_eq!(status, 200, "{text}");
    // The event's canonical JSON, byte for byte (49.00 stays 49.00).
    assert!(text.starts_with(&format!(r#"{{"event":{canonical},"transaction":["#)), "{text}");
    let detail: Value = serde_json::from_str(&text).unwrap();
    let in_tx: Vec<i64> =
        detail["transaction"].as_array().unwrap().iter().map(|e| e["position"].as_i64().unwrap()).collect();
    assert_eq!(in_tx, [paid, other], "the secret event of the transaction is left out: {detail}");
    assert_eq!(detail["transaction_truncated"], false);
    assert!(!text.contains("1234") && !text.contains("secret.x"), "{text}");

    // An event the role may not read is not found, as one that does not exist.
    let (status, hidden) =
        call(&s.gateway, "GET", &format!("/v1/console/events/{secret}"), Some(&token(&s.reader.name)));
    assert_eq!(status, 404, "{hidden}");
    let missing = 1_000_000;
    let (status, absent) =
        call(&s.gateway, "GET", &format!("/v1/console/events/{missing}"), Some(&token(&s.reader.name)));
    assert_eq!(status, 404, "{absent}");
    let hidden_text = hidden["error"].as_str().unwrap().replace(&secret.to_string(), "N");
    assert_eq!(hidden_text, absent["error"].as_str().unwrap().replace(&missing.to_string(), "N"), "no oracle");
    assert_eq!(hidden["sqlstate"], absent["sqlstate"]);
    // The owner sees the whole transaction.
    let lone_detail = get(&s.gateway, &format!("/v1/console/events/{lone}"), &s.reader.name);
    assert_eq!(lone_detail["transaction"].as_array().unwrap().len(), 1, "{lone_detail}");
}

/// `alice` owns subscription `dl` on pay.a with `parked` dead letters (as
/// `role`, from the owner's session by SET ROLE); their positions.
fn dead_letters(s: &Setup, role: &str, parked: usize) -> Vec<i64> {
    let mut c = s.db.connect();
    c.batch_execute(&format!(
        "SET ROLE {role}; SELECT streams.create_subscription('dl', 'pay.a', after => 0, max_attempts => 1); RESET ROLE"
    ))
    .unwrap();
    let positions: Vec<i64> = (0..parked).map(|n| publish(&mut c, "pay.a", &format!(r#"{{"n": {n}}}"#))).collect();
    wait_for_horizon(&mut c, *positions.last().unwrap());
    for position in &positions {
        c.batch_execute(&format!(
            "SET ROLE {role}; BEGIN; SELECT * FROM streams.poll('dl', 1);
             SELECT streams.nack('dl', {position}, reason => 'bad'); COMMIT; RESET ROLE"
        ))
        .unwrap();
    }
    positions
}

fn parked(s: &Setup, role: &str) -> Vec<i64> {
    let mut c = s.db.connect();
    c.query(
        "SELECT position FROM streams.dead_letters WHERE subscription = 'dl' AND owner = $1::text::regrole ORDER BY 1",
        &[&role],
    )
    .unwrap()
    .iter()
    .map(|r| r.get(0))
    .collect()
}

#[test]
fn dead_letters_are_retried_and_discarded_by_their_owner_and_its_members_only() {
    let s = Setup::new(&[]);
    let alice = s.role("alice", "SELECT streams.grant('read', 'pay.*', '{r}');");
    let mallory = s.role("mallory", "SELECT streams.grant('read', 'pay.*', '{r}');");
    // A member that does not inherit alice's privileges: in SQL it would
    // SET ROLE alice first; and it has a `dl` of its own.
    let member = TestRole::new(&s.db, "member", "NOLOGIN NOINHERIT");
    s.db.connect()
        .batch_execute(&format!(
            "SELECT streams.grant('read', 'pay.*', '{m}'); GRANT {a} TO {m}; GRANT {m} TO {g};",
            m = member.name,
            a = alice.name,
            g = s.login.name
        ))
        .unwrap();
    let p = dead_letters(&s, &alice.name, 3);
    let own = dead_letters_of_member(&s, &member.name, p[2]);
    let gw = &s.gateway;

    let subs = get(gw, "/v1/console/subscriptions", &alice.name);
    let dl = subs["subscriptions"].as_array().unwrap().iter().find(|r| r["name"] == "dl").unwrap().clone();
    assert_eq!((dl["owner"].as_str(), dl["parked"].as_i64()), (Some(alice.name.as_str()), Some(3)), "{subs}");
    assert!(dl["claimed_by"].is_array() && dl["stream"] == "pay.a", "{dl}");
    assert!(dl["lag_seconds"].is_null() || dl["lag_seconds"].is_number(), "{dl}");
    let list = get(gw, &format!("/v1/console/subscriptions/{}/dl/dead-letters", alice.name), &alice.name);
    let listed: Vec<i64> =
        list["dead_letters"].as_array().unwrap().iter().map(|d| d["position"].as_i64().unwrap()).collect();
    assert_eq!((listed, &list["more"]), (p.clone(), &Value::Bool(false)), "{list}");
    assert_eq!(list["dead_letters"][0]["last_error"], "bad");

    // Mallory may read the stream but is no member of alice: nothing.
    let mine = get(gw, "/v1/console/subscriptions", &mallory.name);
    assert!(mine["subscriptions"].as_array().unwrap().is_empty(), "{mine}");
    let base = format!("/v1/console/subscriptions/{}/dl/dead-letters", alice.name);
    for (method, path) in [
        ("GET", base.clone()),
        ("POST", format!("{base}/{}/retry", p[0])),
        ("POST", format!("{base}/{}/discard", p[0])),
    ] {
        let (status, body) = call(gw, method, &path, Some(&token(&mallory.name)));
        assert_eq!((status, body["sqlstate"].as_str()), (403, Some("42501")), "{method} {path}: {body}");
    }
    assert_eq!(parked(&s, &alice.name), p, "mallory changed nothing");

    // The owner retries one and discards another.
    let (status, body) = call(gw, "POST", &format!("{base}/{}/retry", p[0]), Some(&token(&alice.name)));
    assert_eq!((status, body["changed"].as_i64()), (200, Some(1)), "{body}");
    let (status, body) = call(gw, "POST", &format!("{base}/{}/discard", p[1]), Some(&token(&alice.name)));
    assert_eq!((status, body["changed"].as_i64()), (200, Some(1)), "{body}");
    assert_eq!(parked(&s, &alice.name), [p[2]]);
    // Not (or no longer) a dead letter, no such subscription, no such owner: 404.
    for path in [
        format!("{base}/{}/retry", p[0]),
        format!("/v1/console/subscriptions/{}/nope/dead-letters/{}/retry", alice.name, p[2]),
        format!("/v1/console/subscriptions/no_such_owner_x/dl/dead-letters/{}/retry", p[2]),
    ] {
        let (status, body) = call(gw, "POST", &path, Some(&token(&alice.name)));
        assert_eq!(status, 404, "{path}: {body}");
        assert!(body["sqlstate"] == "P0002" || body["sqlstate"] == "42704", "{path}: {body}");
    }

    // The NOINHERIT member acts as alice, and on alice's `dl`, not its own.
    let (status, body) = call(gw, "POST", &format!("{base}/{}/retry", p[2]), Some(&token(&member.name)));
    assert_eq!((status, body["changed"].as_i64()), (200, Some(1)), "{body}");
    assert_eq!(parked(&s, &alice.name), Vec::<i64>::new());
    assert_eq!(parked(&s, &member.name), own, "the member's own dead letter stays");
    // Alice is no member of the member: its subscription stays out of reach.
    let path = format!("/v1/console/subscriptions/{}/dl/dead-letters/{}/discard", member.name, own[0]);
    assert_eq!(call(gw, "POST", &path, Some(&token(&alice.name))).0, 403);
    assert_eq!(parked(&s, &member.name), own);
}

/// The member's own `dl` (from past `after`) with one dead letter; its position.
fn dead_letters_of_member(s: &Setup, member: &str, after: i64) -> Vec<i64> {
    let mut c = s.db.connect();
    c.batch_execute(&format!(
        "SET ROLE {member};
         SELECT streams.create_subscription('dl', 'pay.a', after => {after}, max_attempts => 1); RESET ROLE"
    ))
    .unwrap();
    let position = publish(&mut c, "pay.a", r#"{"member": true}"#);
    wait_for_horizon(&mut c, position);
    c.batch_execute(&format!(
        "SET ROLE {member}; BEGIN; SELECT * FROM streams.poll('dl', 1);
         SELECT streams.nack('dl', {position}, reason => 'mine'); COMMIT; RESET ROLE"
    ))
    .unwrap();
    vec![position]
}

#[test]
fn webhooks_are_paused_and_resumed_by_their_owner_only() {
    let s = Setup::new(&[]);
    let alice = s.role(
        "alice",
        "SELECT streams.grant('read', 'pay.*', '{r}');
         GRANT EXECUTE ON FUNCTION
             streams.create_webhook(text, text, text, bigint, text, integer, text[], jsonb) TO {r};",
    );
    let mallory = s.role("mallory", "SELECT streams.grant('read', 'pay.*', '{r}');");
    let mut c = s.db.connect();
    c.batch_execute(&format!(
        "SET ROLE {}; SELECT streams.create_webhook('hook', 'pay.*', 'https://console-test.invalid/hook');
         RESET ROLE",
        alice.name
    ))
    .unwrap();
    let gw = &s.gateway;

    let hooks = get(gw, "/v1/console/webhooks", &alice.name);
    let hook = &hooks["webhooks"][0];
    assert_eq!((hook["name"].as_str(), hook["owner"].as_str()), (Some("hook"), Some(alice.name.as_str())), "{hooks}");
    assert_eq!(hook["url"], "https://console-test.invalid/hook");
    assert!(hook["state"].is_string() && hook.get("secret").is_none(), "{hook}");
    assert!(!hooks.to_string().contains("whsec_"), "the signing secret never leaves the database: {hooks}");
    assert!(get(gw, "/v1/console/webhooks", &mallory.name)["webhooks"].as_array().unwrap().is_empty());

    let base = format!("/v1/console/webhooks/{}/hook", alice.name);
    for action in ["pause", "resume"] {
        let (status, body) = call(gw, "POST", &format!("{base}/{action}"), Some(&token(&mallory.name)));
        assert_eq!((status, body["sqlstate"].as_str()), (403, Some("42501")), "{action}: {body}");
    }
    let state = |c: &mut postgres::Client| -> String {
        c.query_one("SELECT state FROM streams.webhooks WHERE name = 'hook'", &[]).unwrap().get(0)
    };
    assert_ne!(state(&mut c), "paused", "mallory paused nothing");

    let (status, body) = call(gw, "POST", &format!("{base}/pause"), Some(&token(&alice.name)));
    assert_eq!((status, body["state"].as_str()), (200, Some("paused")), "{body}");
    assert_eq!(state(&mut c), "paused");
    let (status, body) = call(gw, "POST", &format!("{base}/resume"), Some(&token(&alice.name)));
    assert_eq!(status, 200, "{body}");
    assert_ne!(body["state"], "paused", "{body}");
    assert_ne!(state(&mut c), "paused");
    // A subscription that is no webhook, and a webhook that does not exist.
    c.batch_execute(&format!(
        "SET ROLE {}; SELECT streams.create_subscription('plain', 'pay.a'); RESET ROLE",
        alice.name
    ))
    .unwrap();
    for name in ["plain", "nope"] {
        let path = format!("/v1/console/webhooks/{}/{name}/pause", alice.name);
        let (status, body) = call(gw, "POST", &path, Some(&token(&alice.name)));
        assert_eq!((status, body["sqlstate"].as_str()), (404, Some("42704")), "{name}: {body}");
    }
}

#[test]
fn the_files_carry_the_policy_and_paths_out_of_the_console_are_404() {
    let s = Setup::new(&[]);
    let port = s.gateway.port;
    for path in ["/console", "/console/", "/console/index.html"] {
        let (status, headers) = raw_head(port, "GET", path);
        assert_eq!(status, 200, "{path}");
        let policy = header(&headers, "content-security-policy").unwrap_or_default();
        for directive in ["default-src 'self'", "script-src 'self'", "frame-ancestors 'none'", "base-uri 'none'"] {
            assert!(policy.contains(directive), "{path}: {policy}");
        }
        assert_eq!(header(&headers, "x-content-type-options"), Some("nosniff"), "{path}");
        assert_eq!(header(&headers, "referrer-policy"), Some("no-referrer"), "{path}");
        assert!(header(&headers, "content-type").unwrap().starts_with("text/html"), "{path}");
    }
    for path in [
        "/console/../Cargo.toml",
        "/console/../../../../etc/passwd",
        "/console/%2e%2e/%2e%2e/Cargo.toml",
        "/console/..%2f..%2fCargo.toml",
        "/console/%5c..%5c..%5cCargo.toml",
        "/console/vendor/../../src/main.rs",
        "/console/.git/config",
        "/console//etc/passwd",
    ] {
        let (status, headers) = raw_head(port, "GET", path);
        assert_eq!(status, 404, "{path}");
        assert!(header(&headers, "content-security-policy").is_some(), "{path}");
    }
    // The API's answers are not cached.
    let auth = format!("Bearer {}", token(&s.reader.name));
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(stream, "GET /v1/console/session HTTP/1.0\r\nAuthorization: {auth}\r\n\r\n").unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    assert!(answer.to_ascii_lowercase().contains("cache-control: no-store"), "{answer}");
}
