//! The console in-process (tower's `oneshot`, no socket), on a hub whose
//! database is never reached: the files and their headers, what the API
//! refuses before its first query, and the parsing of its parameters.

use axum::body::Body;
use axum::http::{header, HeaderMap, Request, StatusCode};
use axum::Router;
use clap::Parser;
use http_body_util::BodyExt;
use tower::ServiceExt;

use super::api::{after_name, page_limit, position, Failure, DEFAULT_STREAMS, MAX_STREAMS};
use super::{asset_path, CONTENT_SECURITY_POLICY};
use crate::auth::{mint, Auth};
use crate::config::Cli;
use crate::db::Db;
use crate::hub::Hub;

const SECRET: &str = "the secret of the in-process console tests";
/// A socket directory that does not exist: no server is ever contacted.
const NO_DATABASE: &str = "host=/nonexistent/litebase-streams-console-tests port=1 user=nobody dbname=none";

fn gateway() -> Router {
    crate::metrics::install();
    let cfg = Cli::parse_from(["gateway", "--database-url", NO_DATABASE, "--jwt-secret", SECRET]).serve;
    let auth = Auth::new(cfg.jwt_secret.as_deref(), None, None);
    let db = Db::new(&cfg).expect("pools (they connect only when asked)");
    let (hub, _listen) = Hub::new(cfg, db);
    crate::http::router(hub, auth)
}

async fn send(method: &str, uri: &str, headers: &[(&str, &str)]) -> (StatusCode, HeaderMap, serde_json::Value) {
    let mut request = Request::builder().method(method).uri(uri);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = gateway().oneshot(request.body(Body::empty()).unwrap()).await.unwrap();
    let (status, headers) = (response.status(), response.headers().clone());
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let body = serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null);
    (status, headers, body)
}

fn assert_console_headers(headers: &HeaderMap, what: &str) {
    assert_eq!(headers[header::CONTENT_SECURITY_POLICY], CONTENT_SECURITY_POLICY, "{what}");
    assert_eq!(headers[header::X_CONTENT_TYPE_OPTIONS], "nosniff", "{what}");
    assert_eq!(headers[header::REFERRER_POLICY], "no-referrer", "{what}");
    assert_eq!(headers[header::CACHE_CONTROL], "no-cache", "{what}");
}

#[tokio::test]
async fn the_page_needs_no_token_and_carries_its_policy() {
    for uri in ["/console", "/console/", "/console/index.html"] {
        let (status, headers, _) = send("GET", uri, &[]).await;
        assert_eq!(status, 200, "{uri}");
        assert!(headers[header::CONTENT_TYPE].to_str().unwrap().starts_with("text/html"), "{uri}");
        assert_console_headers(&headers, uri);
    }
    let policy = CONTENT_SECURITY_POLICY;
    for directive in ["default-src 'self'", "script-src 'self'", "frame-ancestors 'none'", "base-uri 'none'"] {
        assert!(policy.contains(directive), "{directive}");
    }
    assert!(!policy.contains("unsafe"), "{policy}");
}

#[tokio::test]
async fn paths_out_of_the_console_are_not_found() {
    for uri in [
        "/console/../Cargo.toml",
        "/console/%2e%2e/Cargo.toml",
        "/console/..%2fsrc%2fmain.rs",
        "/console/vendor/../../Cargo.toml",
        "/console/%5c..%5cCargo.toml",
        "/console/.hidden",
        "/console/a//b",
        "/console/index.html%00.js",
        "/console/%ff%fe",
        "/console/no-such-file.js",
    ] {
        let (status, headers, body) = send("GET", uri, &[]).await;
        assert_eq!(status, 404, "{uri}");
        assert_eq!(body["error"], "no such route", "{uri}");
        assert_console_headers(&headers, uri);
    }
}

#[test]
fn asset_paths_are_plain_relative_names() {
    for fine in ["index.html", "console.js", "vendor/uPlot.min.css", "pages/streams.js"] {
        assert_eq!(asset_path(fine), Some(fine));
    }
    for refused in
        ["", "/etc/passwd", "..", "../x", "a/../b", "a/./b", "./a", ".env", "a//b", "a/", "a\\b", "a\0b", "a\nb"]
    {
        assert_eq!(asset_path(refused), None, "{refused:?}");
    }
    assert_eq!(asset_path(&"a".repeat(201)), None);
}

/// Every API route, with a path that parses.
const API: [(&str, &str); 11] = [
    ("GET", "/v1/console/session"),
    ("GET", "/v1/console/overview"),
    ("GET", "/v1/console/streams"),
    ("GET", "/v1/console/events/1"),
    ("GET", "/v1/console/subscriptions"),
    ("GET", "/v1/console/subscriptions/app/orders/dead-letters"),
    ("POST", "/v1/console/subscriptions/app/orders/dead-letters/5/retry"),
    ("POST", "/v1/console/subscriptions/app/orders/dead-letters/5/discard"),
    ("GET", "/v1/console/webhooks"),
    ("POST", "/v1/console/webhooks/app/hook/pause"),
    ("POST", "/v1/console/webhooks/app/hook/resume"),
];

#[tokio::test]
async fn the_api_refuses_requests_without_a_good_bearer_token_before_any_query() {
    let expired = {
        let claims = serde_json::json!({"role": "app", "exp": 1});
        let key = jsonwebtoken::EncodingKey::from_secret(SECRET.as_bytes());
        jsonwebtoken::encode(&jsonwebtoken::Header::default(), &claims, &key).unwrap()
    };
    let (good, wrong) = (mint(SECRET, "app", 60), mint("another secret", "app", 60));
    for (method, route) in API {
        let bearer = |t: &str| format!("Bearer {t}");
        for (what, header_value, query) in [
            ("no token", None, String::new()),
            ("an empty bearer", Some(bearer("")), String::new()),
            ("an expired token", Some(bearer(&expired)), String::new()),
            ("a token of another secret", Some(bearer(&wrong)), String::new()),
            ("access_token", None, format!("?access_token={good}")),
            ("access_token besides a good header", Some(bearer(&good)), format!("?access_token={good}")),
        ] {
            let auth: Vec<(&str, &str)> = header_value.iter().map(|v| ("authorization", v.as_str())).collect();
            let (status, headers, body) = send(method, &format!("{route}{query}"), &auth).await;
            assert_eq!(status, 401, "{method} {route} with {what}: {body}");
            assert!(body["error"].is_string(), "{method} {route} with {what}: {body}");
            assert_eq!(headers[header::CACHE_CONTROL], "no-store", "{method} {route}");
        }
    }
    // With a good token the request goes on to the database, which is not there.
    for (method, route) in API {
        let (status, _, body) = send(method, route, &[("authorization", &format!("Bearer {good}"))]).await;
        assert_eq!(status, 503, "{method} {route}: {body}");
    }
}

#[tokio::test]
async fn bad_parameters_are_refused_before_any_query() {
    let good = format!("Bearer {}", mint(SECRET, "app", 60));
    for uri in [
        "/v1/console/streams?limit=0",
        "/v1/console/streams?limit=501",
        "/v1/console/streams?limit=ten",
        "/v1/console/streams?after=has%20space",
        "/v1/console/streams?after=.dot",
        "/v1/console/events/abc",
        "/v1/console/events/1.5",
        "/v1/console/events/99999999999999999999",
    ] {
        let (status, _, body) = send("GET", uri, &[("authorization", &good)]).await;
        assert_eq!((status.as_u16(), body["sqlstate"].as_str()), (400, Some("22023")), "{uri}: {body}");
    }
    for uri in ["/v1/console/subscriptions/app/orders/dead-letters/x/retry", "/v1/console/webhooks/app/hook/stop"] {
        let (status, _, body) = send("POST", uri, &[("authorization", &good)]).await;
        assert!(matches!(status.as_u16(), 400 | 404), "{uri}: {status} {body}");
    }
    let (status, _, _) = send("GET", "/v1/console/webhooks/app/hook/pause", &[("authorization", &good)]).await;
    assert_eq!(status, 405, "a change is a POST");
}

#[test]
fn stream_pages_take_a_limit_and_a_name_to_start_after() {
    assert_eq!(page_limit(None).unwrap(), DEFAULT_STREAMS);
    assert_eq!(page_limit(Some("1")).unwrap(), 1);
    assert_eq!(page_limit(Some(" 500 ")).unwrap(), MAX_STREAMS);
    for bad in ["0", "-1", "501", "", "x", "1e2", "9223372036854775808"] {
        let e = page_limit(Some(bad)).expect_err(bad);
        assert_eq!((e.status().as_u16(), e.sqlstate()), (400, Some("22023")), "{bad:?}");
        assert!(e.message().starts_with("limit must be 1 to 500"), "{bad:?}: {}", e.message());
    }
    assert_eq!(after_name(None).unwrap(), None);
    assert_eq!(after_name(Some("")).unwrap(), None);
    assert_eq!(after_name(Some("pay.a")).unwrap(), Some("pay.a"));
    for bad in ["pay.*", "a b", "-x", &"a".repeat(64), "a'; DROP TABLE x; --"] {
        let e = after_name(Some(bad)).expect_err(bad);
        assert_eq!((e.status().as_u16(), e.sqlstate()), (400, Some("22023")), "{bad:?}");
    }
}

#[test]
fn positions_are_integers() {
    assert_eq!(position("42").unwrap(), 42);
    assert_eq!(position("-1").unwrap(), -1);
    for bad in ["", "x", "1.0", " 1", "0x1", "1'or'1"] {
        let e = position(bad).expect_err(bad);
        assert_eq!((e.status().as_u16(), e.sqlstate()), (400, Some("22023")), "{bad:?}");
    }
}

#[test]
fn what_the_database_says_is_missing_is_404() {
    for (code, status) in [
        ("42704", 404),
        ("P0002", 404),
        ("02000", 500),
        ("42809", 422),
        ("42501", 403),
        ("22023", 400),
        ("42P09", 500),
        ("57014", 503),
        ("XX000", 500),
    ] {
        let failure = Failure::from_sqlstate(code, "it failed", Some("the detail"));
        assert_eq!(failure.status(), status, "{code}");
        let response = axum::response::IntoResponse::into_response(failure);
        assert_eq!(response.status(), status, "{code}");
    }
    match Failure::from_sqlstate("P0002", "event 5 is not a dead letter", None) {
        Failure::Missing { message, sqlstate } => {
            assert_eq!((message.as_str(), sqlstate.as_deref()), ("event 5 is not a dead letter", Some("P0002")))
        }
        other => panic!("{other:?}"),
    }
}
