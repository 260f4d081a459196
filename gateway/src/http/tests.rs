//! The routes in-process (tower's `oneshot`, no socket), on a hub whose
//! database is never reached: what a request decides before its first
//! query, and what it answers when the database cannot be reached.

use axum::body::Body;
use axum::http::{header, HeaderMap, Request, StatusCode};
use axum::Router;
use clap::Parser;
use http_body_util::BodyExt;
use serde_json::Value;
use tower::ServiceExt;

use super::router;
use crate::auth::{mint, Auth};
use crate::config::Cli;
use crate::db::Db;
use crate::hub::Hub;

const SECRET: &str = "the secret of the in-process gateway tests";
/// A socket directory that does not exist: a connection attempt fails at
/// once, and no server is ever contacted.
const NO_DATABASE: &str = "host=/nonexistent/litebase-streams-gateway-tests port=1 user=nobody dbname=none";

/// The router of a gateway with `args`, whose hub runs no LISTEN connection.
fn gateway(args: &[&str]) -> Router {
    crate::metrics::install();
    let argv =
        ["gateway", "--database-url", NO_DATABASE, "--jwt-secret", SECRET].into_iter().chain(args.iter().copied());
    let cfg = Cli::parse_from(argv).serve;
    let auth = Auth::new(cfg.jwt_secret.as_deref(), cfg.anonymous_role.clone(), None);
    let db = Db::new(&cfg).expect("pools (they connect only when asked)");
    let (hub, _listen) = Hub::new(cfg, db);
    router(hub, auth)
}

struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: String,
}

impl Answer {
    /// The body as a JSON error: its `error` and `sqlstate`.
    fn error(&self) -> (String, Option<String>) {
        assert_eq!(self.headers[header::CONTENT_TYPE], "application/json", "{}", self.body);
        let json: Value = serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body));
        let error = json["error"].as_str().unwrap_or_else(|| panic!("no error: {json}")).to_owned();
        (error, json["sqlstate"].as_str().map(str::to_owned))
    }
}

async fn send(app: &Router, request: Request<Body>) -> Answer {
    let response = app.clone().oneshot(request).await.expect("a router does not fail");
    let status = response.status();
    let headers = response.headers().clone();
    let bytes = response.into_body().collect().await.expect("a body").to_bytes();
    Answer { status, headers, body: String::from_utf8_lossy(&bytes).into_owned() }
}

fn bearer() -> String {
    format!("Bearer {}", mint(SECRET, "reader", 60))
}

/// `method` on `uri` with a valid token and these headers.
fn request(method: &str, uri: &str, headers: &[(&str, &str)], body: impl Into<Body>) -> Request<Body> {
    let mut builder = Request::builder().method(method).uri(uri).header(header::AUTHORIZATION, bearer());
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    builder.body(body.into()).expect("a valid request")
}

fn get(uri: &str) -> Request<Body> {
    request("GET", uri, &[], Body::empty())
}

const SSE: (&str, &str) = ("accept", "text/event-stream");

#[tokio::test]
async fn an_unknown_route_is_a_json_404() {
    let app = gateway(&[]);
    for uri in ["/v1/nothing/here", "/", "/v1/streams/pay.a", "/v1/streams/pay.a/events/more"] {
        let answer = send(&app, get(uri)).await;
        assert_eq!(answer.status, 404, "{uri}");
        assert_eq!(answer.body, r#"{"error":"no such route","sqlstate":null}"#, "{uri}");
    }
}

#[tokio::test]
async fn a_wrong_method_is_a_json_405() {
    let app = gateway(&[]);
    for (method, uri) in [
        ("PUT", "/v1/streams/pay.x/events"),
        ("DELETE", "/v1/streams/pay.x/events"),
        ("POST", "/healthz"),
        ("DELETE", "/v1/ws"),
        ("POST", "/metrics"),
    ] {
        let answer = send(&app, request(method, uri, &[], Body::empty())).await;
        assert_eq!(answer.status, 405, "{method} {uri}");
        assert_eq!(answer.error(), ("method not allowed on this route".into(), None), "{method} {uri}");
    }
}

#[tokio::test]
async fn a_malformed_pattern_is_400_with_22023() {
    let app = gateway(&[]);
    for (uri, headers) in [
        ("/v1/streams/bad%20name/events", &[][..]),
        ("/v1/streams/a*b*/events", &[SSE][..]),
        ("/v1/streams/.x/events", &[][..]),
        ("/v1/streams/.x/events", &[SSE][..]),
    ] {
        let answer = send(&app, request("GET", uri, headers, Body::empty())).await;
        assert_eq!(answer.status, 400, "{uri} {headers:?}: {}", answer.body);
        let (error, sqlstate) = answer.error();
        assert_eq!(sqlstate.as_deref(), Some("22023"), "{uri}");
        assert!(error.starts_with("invalid stream pattern"), "{uri}: {error}");
    }
}

#[tokio::test]
async fn bad_starts_and_page_sizes_are_400_with_22023() {
    let app = gateway(&[]);
    for query in [
        "after=x",
        "after=1x",
        "after=x&since=now",
        "since=now&from_tx=1",
        "after=1&since=now&from_tx=1",
        "frames=named",
        "frames=",
        "frames=MESSAGE",
        "from_tx=1%27or%271",
        "from_tx=-1",
        "from_tx=1.5",
        "from_tx=",
        "max_events=-1",
        "max_events=x",
        "max_events=100000000",
    ] {
        for headers in [&[][..], &[SSE][..]] {
            if query.starts_with("max_events") && !headers.is_empty() {
                continue; // SSE takes no page size
            }
            let answer = send(&app, request("GET", &format!("/v1/streams/pay.*/events?{query}"), headers, "")).await;
            assert_eq!(answer.status, 400, "{query} {headers:?}: {}", answer.body);
            assert_eq!(answer.error().1.as_deref(), Some("22023"), "{query} {headers:?}");
        }
    }
    let bad_id = request("GET", "/v1/streams/pay.*/events", &[SSE, ("last-event-id", "abc")], "");
    let answer = send(&app, bad_id).await;
    assert_eq!(answer.status, 400, "{}", answer.body);
    assert_eq!(answer.error().1.as_deref(), Some("22023"));
}

#[tokio::test]
async fn a_bad_until_is_400_with_22023() {
    let app = gateway(&[]);
    for until in ["-1", "x", "1x", "", "1.5", "%2B", "9223372036854775808", "1%27or%271"] {
        for headers in [&[][..], &[SSE][..]] {
            let uri = format!("/v1/streams/pay.*/events?after=0&until={until}");
            let answer = send(&app, request("GET", &uri, headers, "")).await;
            assert_eq!(answer.status, 400, "{until:?} {headers:?}: {}", answer.body);
            let (error, sqlstate) = answer.error();
            assert_eq!(sqlstate.as_deref(), Some("22023"), "{until:?} {headers:?}");
            assert!(error.starts_with("until must be a position"), "{until:?}: {error}");
        }
    }
}

/// An EventSource that got everything up to `until` reconnects with
/// Last-Event-ID = until (the stream's last `id:`): 204 makes it stop, and
/// no query is needed to say so.
#[tokio::test]
async fn sse_with_nothing_left_up_to_until_is_204() {
    let app = gateway(&[]);
    for (uri, last_event_id) in [
        ("/v1/streams/pay.*/events?until=7", Some("7")),
        ("/v1/streams/pay.*/events?until=7", Some("9")),
        ("/v1/streams/pay.*/events?after=7&until=7", None),
        ("/v1/streams/pay.*/events?after=8&until=0", None),
    ] {
        let mut headers = vec![SSE];
        headers.extend(last_event_id.map(|id| ("last-event-id", id)));
        let answer = send(&app, request("GET", uri, &headers, "")).await;
        assert_eq!(answer.status, 204, "{uri} {last_event_id:?}: {}", answer.body);
        assert_eq!(answer.body, "", "{uri}");
    }
    // Below `until` the stream opens (here: the database is away, so the
    // EventSource is told to come back).
    let answer =
        send(&app, request("GET", "/v1/streams/pay.*/events?until=7", &[SSE, ("last-event-id", "6")], "")).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert!(answer.body.starts_with("retry: "), "{}", answer.body);
}

#[tokio::test]
async fn a_bad_query_string_is_400() {
    let app = gateway(&[]);
    for (method, uri) in [
        ("GET", "/v1/streams/pay.*/events?after=1&after=2"),
        ("POST", "/v1/streams/pay.a/events?access_token=a&access_token=b"),
    ] {
        let answer = send(&app, request(method, uri, &[], "{}")).await;
        assert_eq!(answer.status, 400, "{method} {uri}: {}", answer.body);
        let (error, sqlstate) = answer.error();
        assert!(error.starts_with("bad query string: "), "{error}");
        assert_eq!(sqlstate, None);
    }
}

#[tokio::test]
async fn requests_without_a_good_token_are_401() {
    let app = gateway(&[]);
    let other_secret = format!("Bearer {}", mint("another secret", "reader", 60));
    for authorization in [None, Some("Bearer not.a.token"), Some("Basic cmVhZGVyOg=="), Some(other_secret.as_str())] {
        for method in ["GET", "POST"] {
            let mut builder = Request::builder().method(method).uri("/v1/streams/pay.a/events");
            if let Some(value) = authorization {
                builder = builder.header(header::AUTHORIZATION, value);
            }
            let answer = send(&app, builder.body(Body::from("{}")).unwrap()).await;
            assert_eq!(answer.status, 401, "{method} {authorization:?}: {}", answer.body);
            assert_eq!(answer.error().1, None);
        }
    }
    // The token may come as access_token (EventSource cannot set headers).
    let token = mint(SECRET, "reader", 60);
    let query = Request::get(format!("/v1/streams/bad%20name/events?access_token={token}")).body(Body::empty());
    assert_eq!(send(&app, query.unwrap()).await.status, 400, "past the token, to the pattern");
}

#[tokio::test]
async fn publish_checks_its_body_and_stream_before_the_database() {
    let app = gateway(&["--max-body-bytes", "16"]);
    let publish = |stream: &str, body: Body| request("POST", &format!("/v1/streams/{stream}/events"), &[], body);
    let answer = send(&app, publish("pay.a", "{not json".into())).await;
    assert_eq!(answer.status, 400);
    let (error, sqlstate) = answer.error();
    assert!(error.starts_with("the body is not JSON: "), "{error}");
    assert_eq!(sqlstate.as_deref(), Some("22P02"));

    let answer = send(&app, publish("bad%20name!", "{}".into())).await;
    assert_eq!(answer.status, 400);
    let (error, sqlstate) = answer.error();
    assert!(error.starts_with("invalid stream name"), "{error}");
    assert_eq!(sqlstate.as_deref(), Some("22023"));
    // A pattern is no stream to publish to.
    assert_eq!(send(&app, publish("pay.*", "{}".into())).await.error().1.as_deref(), Some("22023"));

    let answer = send(&app, publish("pay.a", Body::from(vec![b'"', 0xff, b'"']))).await;
    assert_eq!(answer.status, 400);
    assert_eq!(answer.error(), ("the body is not UTF-8".into(), None));

    let answer = send(&app, publish("pay.a", "[1, 2, 3, 4, 5, 6, 7, 8]".into())).await;
    assert_eq!(answer.status, 413);
    assert_eq!(answer.error(), ("the body is larger than 16 bytes (--max-body-bytes)".into(), None));
}

#[tokio::test]
async fn an_unreachable_database_is_503() {
    let app = gateway(&[]);
    for request in
        [get("/v1/streams/pay.*/events"), request("POST", "/v1/streams/pay.a/events", &[], "{}"), get("/healthz")]
    {
        let what = format!("{} {}", request.method(), request.uri());
        let answer = send(&app, request).await;
        assert_eq!(answer.status, 503, "{what}: {}", answer.body);
        let (error, sqlstate) = answer.error();
        assert!(error.starts_with("database unavailable: "), "{what}: {error}");
        assert_eq!(sqlstate, None, "{what}");
    }
}

/// The `retry:` and the JSON reason of an SSE body that says come back later.
fn retry_later(answer: &Answer) -> (u32, Value) {
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(answer.headers[header::CONTENT_TYPE], "text/event-stream");
    let (retry, reason) = answer
        .body
        .strip_prefix("retry: ")
        .and_then(|rest| rest.strip_suffix("\n\n"))
        .and_then(|rest| rest.split_once("\n: "))
        .unwrap_or_else(|| panic!("not a retry: {:?}", answer.body));
    (retry.parse().unwrap(), serde_json::from_str(reason).unwrap())
}

#[tokio::test]
async fn sse_clients_are_told_to_come_back_when_the_database_is_away_or_the_gateway_full() {
    let app = gateway(&[]);
    let (retry, reason) = retry_later(&send(&app, request("GET", "/v1/streams/pay.*/events", &[SSE], "")).await);
    assert!((1000..3000).contains(&retry), "{retry}");
    assert!(reason["error"].as_str().unwrap().starts_with("database unavailable: "), "{reason}");
    assert_eq!(reason["sqlstate"], Value::Null);

    let full = gateway(&["--max-connections", "0"]);
    let (_, reason) = retry_later(&send(&full, request("GET", "/v1/streams/pay.*/events", &[SSE], "")).await);
    assert_eq!(reason, serde_json::json!({"error": "too many connections (--max-connections)", "sqlstate": null}));
}

#[tokio::test]
async fn metrics_render_without_a_database() {
    let answer = send(&gateway(&[]), Request::get("/metrics").body(Body::empty()).unwrap()).await;
    assert_eq!(answer.status, 200);
    assert_eq!(answer.headers[header::CONTENT_TYPE], "text/plain; version=0.0.4");
    assert!(answer.body.contains("litebase_streams_gateway_database_connections"), "{}", answer.body);
}

#[tokio::test]
async fn cors_answers_the_allowed_origins_only() {
    let preflight = |origin: &str| {
        Request::options("/v1/streams/pay.*/events")
            .header(header::ORIGIN, origin)
            .header(header::ACCESS_CONTROL_REQUEST_METHOD, "GET")
            .body(Body::empty())
            .unwrap()
    };
    let app = gateway(&["--allow-origin", "https://app.example.com, http://localhost:3000"]);
    for origin in ["https://app.example.com", "http://localhost:3000"] {
        let answer = send(&app, preflight(origin)).await;
        assert_eq!(answer.status, 200, "{origin}");
        assert_eq!(answer.headers[header::ACCESS_CONTROL_ALLOW_ORIGIN], origin);
        assert!(answer.headers.get(header::ACCESS_CONTROL_ALLOW_CREDENTIALS).is_none());
    }
    let answer = send(&app, preflight("https://evil.example.com")).await;
    assert!(answer.headers.get(header::ACCESS_CONTROL_ALLOW_ORIGIN).is_none(), "{:?}", answer.headers);
    // Errors carry the header too, so that a browser can read them.
    let answer = send(&app, request("GET", "/v1/nothing", &[("origin", "http://localhost:3000")], "")).await;
    assert_eq!(answer.status, 404);
    assert_eq!(answer.headers[header::ACCESS_CONTROL_ALLOW_ORIGIN], "http://localhost:3000");

    let any = gateway(&["--allow-origin", "*"]);
    assert_eq!(
        send(&any, preflight("https://anywhere.example")).await.headers[header::ACCESS_CONTROL_ALLOW_ORIGIN],
        "*"
    );
    // Without --allow-origin, no CORS at all.
    let none = gateway(&[]);
    let answer = send(&none, request("GET", "/v1/nothing", &[("origin", "http://localhost:3000")], "")).await;
    assert!(answer.headers.get(header::ACCESS_CONTROL_ALLOW_ORIGIN).is_none());
}
