//! Who may see what of GET /metrics. The gateway's one listener faces
//! browsers, so a scrape may come from anyone who reaches the port; the
//! parts whose labels name things (the database's `streams.metrics()` rows:
//! streams, subscriptions, webhooks and their owners' roles, which SQL shows
//! only to pg_monitor; the topic patterns clients subscribed to) are shown
//! only to a scrape that sends `--metrics-token`. Without one configured,
//! /metrics is open and shows only the gateway's own counters, which name
//! nothing.

use axum::http::{header, HeaderMap};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::error::ApiError;

/// What one scrape is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// The gateway's own counters only (no --metrics-token configured).
    Counters,
    /// Everything, names included (the scrape sent the metrics token).
    Everything,
}

/// The scope of a scrape with `headers`, when the gateway's metrics token
/// is `token`; 401 when a token is configured and the scrape did not send
/// it as `Authorization: Bearer <token>`.
pub fn scope(token: Option<&str>, headers: &HeaderMap) -> Result<Scope, ApiError> {
    let Some(token) = token else { return Ok(Scope::Counters) };
    let Some(value) = headers.get(header::AUTHORIZATION) else {
        return Err(ApiError::unauthorized("/metrics needs the metrics token (Authorization: Bearer <token>)"));
    };
    let sent = value
        .to_str()
        .ok()
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, sent)| sent.trim())
        .ok_or_else(|| ApiError::unauthorized("Authorization must be: Bearer <token>"))?;
    if same_secret(sent, token) {
        Ok(Scope::Everything)
    } else {
        Err(ApiError::unauthorized("invalid metrics token"))
    }
}

/// Whether `sent` is `secret`, in time independent of where they differ
/// and of their lengths: both are hashed to 32 bytes first, which are
/// compared in constant time (a plain `==` stops at the first difference,
/// and a slice compare at a difference in length).
fn same_secret(sent: &str, secret: &str) -> bool {
    let sent = Sha256::digest(sent.as_bytes());
    let secret = Sha256::digest(secret.as_bytes());
    sent.ct_eq(&secret).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(authorization: &[u8]) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, axum::http::HeaderValue::from_bytes(authorization).unwrap());
        h
    }

    #[test]
    fn without_a_token_configured_anyone_sees_the_counters_only() {
        assert_eq!(scope(None, &HeaderMap::new()), Ok(Scope::Counters));
        // Whatever a scrape sends, it is not more than that.
        assert_eq!(scope(None, &with(b"Bearer anything")), Ok(Scope::Counters));
    }

    #[test]
    fn with_a_token_configured_only_its_bearer_sees_anything() {
        let token = Some("metrics-s3cret");
        assert_eq!(scope(token, &with(b"Bearer metrics-s3cret")), Ok(Scope::Everything));
        assert_eq!(scope(token, &with(b"bearer metrics-s3cret")), Ok(Scope::Everything));
        assert_eq!(scope(token, &with(b"Bearer  metrics-s3cret ")), Ok(Scope::Everything));
        for refused in [
            &b"Bearer metrics-s3cre"[..],
            b"Bearer metrics-s3cret2",
            b"Bearer METRICS-S3CRET",
            b"Bearer ",
            b"Bearer",
            b"metrics-s3cret",
            b"Basic metrics-s3cret",
            b"Bearer metrics-s3cret\xff",
        ] {
            let error = scope(token, &with(refused)).unwrap_err();
            assert_eq!(error.status(), 401, "{}", String::from_utf8_lossy(refused));
            // The answer never echoes the secret.
            assert!(!error.json().to_string().contains("s3cret"), "{}", error.json());
        }
        let missing = scope(token, &HeaderMap::new()).unwrap_err();
        assert_eq!(missing.status(), 401);
        assert_eq!(missing.json()["sqlstate"], serde_json::Value::Null);
    }

    #[test]
    fn secrets_compare_by_content_only() {
        assert!(same_secret("a", "a"));
        assert!(!same_secret("a", "b"));
        assert!(!same_secret("a", "aa"));
        assert!(!same_secret("", "a"));
    }
}
