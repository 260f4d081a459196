//! Who a request runs as: the `role` claim of an HS256 JWT (from
//! `Authorization: Bearer`, or the `access_token` query parameter for
//! browsers, whose EventSource and WebSocket cannot set headers), or the
//! anonymous role when one is configured. Tokens are never logged.
//!
//! A token's `exp`, `nbf` and `iat`, when present, must be integers of
//! seconds since 1970: jsonwebtoken skips the check of a time claim it
//! cannot read as a number (`"nbf": "99999999999"` would pass unchecked),
//! so anything else makes the token invalid here. An `exp` beyond what the
//! system clock can hold is refused too, and a stream's end is computed with
//! bounded arithmetic: no claim can make a request panic.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::http::{header, HeaderMap};
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{de, Deserialize, Deserializer, Serialize};

use crate::error::ApiError;

/// The furthest off a stream's end is put: a token without `exp`, or with
/// one further away, ends no stream (and the timer stays far from overflow).
const NEVER: Duration = Duration::from_secs(100 * 365 * 86_400);

#[derive(Debug, Serialize, Deserialize)]
pub struct Claims {
    pub role: String,
    #[serde(default, deserialize_with = "numeric_date", skip_serializing_if = "Option::is_none")]
    pub exp: Option<u64>,
    #[serde(default, deserialize_with = "numeric_date", skip_serializing_if = "Option::is_none")]
    pub nbf: Option<u64>,
    #[serde(default, deserialize_with = "numeric_date", skip_serializing_if = "Option::is_none")]
    pub iat: Option<u64>,
}

/// A present time claim: a non-negative JSON integer, nothing else (not a
/// string, a float, a negative number or null).
fn numeric_date<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<u64>, D::Error> {
    struct Seconds;
    impl de::Visitor<'_> for Seconds {
        type Value = Option<u64>;

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("an integer number of seconds since 1970 (exp, nbf and iat)")
        }

        fn visit_u64<E: de::Error>(self, seconds: u64) -> Result<Option<u64>, E> {
            Ok(Some(seconds))
        }
    }
    deserializer.deserialize_u64(Seconds)
}

pub struct Auth {
    key: Option<DecodingKey>,
    validation: Validation,
    anonymous: Option<String>,
    /// The gateway's own login role: a token must never name it.
    login: Option<String>,
}

/// Who a request runs as, and until when (a token's `exp`, plus the leeway
/// it was checked with): streams end then.
#[derive(Debug, Clone)]
pub struct Identity {
    pub role: String,
    pub expires: Option<SystemTime>,
}

impl Identity {
    /// When a stream of this identity must end, on tokio's clock (at most
    /// `NEVER` from now).
    pub fn deadline(&self) -> tokio::time::Instant {
        let left = self.expires.map_or(NEVER, |at| at.duration_since(SystemTime::now()).unwrap_or_default());
        tokio::time::Instant::now() + left.min(NEVER)
    }
}

/// Whether a role claim names a role that `set_config('role', ...)` would
/// not switch to as asked: `none` is RESET ROLE (the gateway's own role), the
/// SQL keywords are not role names, and `pg_*` are the server's own roles.
fn reserved_role(role: &str) -> bool {
    let lower = role.to_ascii_lowercase();
    matches!(lower.as_str(), "none" | "public" | "current_user" | "current_role" | "session_user" | "user")
        || lower.starts_with("pg_")
}

impl Auth {
    pub fn new(secret: Option<&str>, anonymous: Option<String>, login: Option<String>) -> Auth {
        let mut validation = Validation::new(Algorithm::HS256);
        // `exp` and `nbf` are checked when present; tokens for services may go without.
        validation.required_spec_claims.clear();
        validation.validate_aud = false;
        validation.validate_nbf = true;
        validation.leeway = 5;
        Auth { key: secret.map(|s| DecodingKey::from_secret(s.as_bytes())), validation, anonymous, login }
    }

    /// The role of a request, or 401.
    pub fn role(&self, headers: &HeaderMap, query_token: Option<&str>) -> Result<String, ApiError> {
        self.identity(headers, query_token).map(|id| id.role)
    }

    /// The role of a request and when its token expires, or 401.
    pub fn identity(&self, headers: &HeaderMap, query_token: Option<&str>) -> Result<Identity, ApiError> {
        let bearer = match headers.get(header::AUTHORIZATION) {
            Some(value) => {
                let value = value.to_str().map_err(|_| ApiError::unauthorized("malformed Authorization header"))?;
                let token = value
                    .strip_prefix("Bearer ")
                    .or_else(|| value.strip_prefix("bearer "))
                    .ok_or_else(|| ApiError::unauthorized("Authorization must be: Bearer <token>"))?;
                Some(token.trim())
            }
            None => None,
        };
        let Some(token) = bearer.or(query_token.filter(|t| !t.is_empty())) else {
            let role = self
                .anonymous
                .clone()
                .ok_or_else(|| ApiError::unauthorized("no token (Authorization: Bearer <JWT>)"))?;
            return Ok(Identity { role, expires: None });
        };
        let key =
            self.key.as_ref().ok_or_else(|| ApiError::unauthorized("this gateway accepts no tokens (no secret)"))?;
        let claims = jsonwebtoken::decode::<Claims>(token, key, &self.validation)
            .map_err(|e| ApiError::unauthorized(format!("invalid token: {e}")))?
            .claims;
        if claims.role.is_empty() || claims.role.len() > 63 || claims.role.contains('\0') {
            return Err(ApiError::unauthorized("invalid token: bad role claim"));
        }
        if reserved_role(&claims.role) || self.login.as_deref() == Some(claims.role.as_str()) {
            return Err(ApiError::unauthorized("invalid token: the role claim names a role tokens may not use"));
        }
        let expires = match claims.exp {
            Some(exp) => Some(
                exp.checked_add(self.validation.leeway)
                    .and_then(|secs| UNIX_EPOCH.checked_add(Duration::from_secs(secs)))
                    .ok_or_else(|| ApiError::unauthorized("invalid token: exp is beyond the range of the clock"))?,
            ),
            None => None,
        };
        Ok(Identity { role: claims.role, expires })
    }
}

/// A token for `role`, valid for `expires_in` seconds.
pub fn mint(secret: &str, role: &str, expires_in: u64) -> String {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).expect("after 1970").as_secs();
    let claims = Claims { role: role.to_owned(), exp: Some(now.saturating_add(expires_in)), nbf: None, iat: None };
    jsonwebtoken::encode(&Header::new(Algorithm::HS256), &claims, &EncodingKey::from_secret(secret.as_bytes()))
        .expect("HS256 signing does not fail")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(token: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, format!("Bearer {token}").parse().unwrap());
        h
    }

    #[test]
    fn tokens_name_roles_and_bad_ones_are_refused() {
        let auth = Auth::new(Some("s3cret"), None, Some("gateway".into()));
        assert_eq!(auth.role(&headers(&mint("s3cret", "app", 60)), None).unwrap(), "app");
        assert_eq!(auth.role(&HeaderMap::new(), Some(&mint("s3cret", "web", 60))).unwrap(), "web");
        assert_eq!(auth.role(&headers(&mint("other", "app", 60)), None).unwrap_err().status(), 401);
        assert_eq!(auth.role(&headers("garbage"), None).unwrap_err().status(), 401);
        assert_eq!(auth.role(&HeaderMap::new(), None).unwrap_err().status(), 401);
        let expired = {
            let claims = Claims { role: "app".into(), exp: Some(1), nbf: None, iat: None };
            jsonwebtoken::encode(&Header::default(), &claims, &EncodingKey::from_secret(b"s3cret")).unwrap()
        };
        assert_eq!(auth.role(&headers(&expired), None).unwrap_err().status(), 401);
        for reserved in ["none", "NONE", "None", "public", "session_user", "pg_read_all_data", "gateway"] {
            assert_eq!(
                auth.role(&headers(&mint("s3cret", reserved, 60)), None).unwrap_err().status(),
                401,
                "{reserved}"
            );
        }
        let not_yet = {
            let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs();
            let claims = serde_json::json!({"role": "app", "nbf": now + 600});
            jsonwebtoken::encode(&Header::default(), &claims, &EncodingKey::from_secret(b"s3cret")).unwrap()
        };
        assert_eq!(auth.role(&headers(&not_yet), None).unwrap_err().status(), 401);
        let id = auth.identity(&headers(&mint("s3cret", "app", 60)), None).unwrap();
        let left = id.expires.unwrap().duration_since(SystemTime::now()).unwrap().as_secs();
        assert!((60..=66).contains(&left), "{left}");
    }

    fn signed(claims: serde_json::Value) -> String {
        jsonwebtoken::encode(&Header::default(), &claims, &EncodingKey::from_secret(b"s3cret")).unwrap()
    }

    fn now() -> u64 {
        SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs()
    }

    #[test]
    fn time_claims_that_are_not_integers_are_refused() {
        let auth = Auth::new(Some("s3cret"), None, None);
        let later = now() + 3600;
        for claim in ["exp", "nbf", "iat"] {
            for value in [
                serde_json::json!(later.to_string()),
                serde_json::json!("99999999999"),
                serde_json::json!(1e30),
                serde_json::json!(later as f64 + 0.5),
                serde_json::json!(-1),
                serde_json::json!(null),
                serde_json::json!(true),
                serde_json::json!([later]),
            ] {
                let mut claims = serde_json::json!({"role": "app", "exp": later});
                claims[claim] = value.clone();
                let refused = auth.role(&headers(&signed(claims)), None).unwrap_err();
                assert_eq!(refused.status(), 401, "{claim}: {value}");
                assert!(refused.message().contains("seconds since 1970"), "{claim}: {value}: {}", refused.message());
            }
        }
        // Integers are taken, and an integer nbf in the future is refused as before.
        let fine = signed(serde_json::json!({"role": "app", "exp": later, "nbf": now() - 10, "iat": now() - 10}));
        assert_eq!(auth.role(&headers(&fine), None).unwrap(), "app");
        let not_yet = signed(serde_json::json!({"role": "app", "nbf": 99_999_999_999u64}));
        assert_eq!(auth.role(&headers(&not_yet), None).unwrap_err().status(), 401);
    }

    #[test]
    fn an_exp_beyond_the_clock_is_refused_without_a_panic() {
        let auth = Auth::new(Some("s3cret"), None, None);
        for exp in [1u64 << 63, u64::MAX, u64::MAX - 2] {
            let refused = auth.identity(&headers(&signed(serde_json::json!({"role": "app", "exp": exp}))), None);
            let refused = refused.unwrap_err();
            assert_eq!(refused.status(), 401, "{exp}");
            assert!(refused.message().contains("exp"), "{exp}: {}", refused.message());
        }
        // A thousand years is taken, and its stream's end stays within reach of tokio's clock.
        let far = signed(serde_json::json!({"role": "app", "exp": now() + 10 * NEVER.as_secs()}));
        let id = auth.identity(&headers(&far), None).unwrap();
        let left = id.deadline() - tokio::time::Instant::now();
        assert!(left > NEVER - Duration::from_secs(60) && left <= NEVER, "{left:?}");
        let none = Identity { role: "app".into(), expires: None };
        assert!(none.deadline() - tokio::time::Instant::now() > NEVER - Duration::from_secs(60));
    }

    #[test]
    fn anonymous_role_only_without_a_token() {
        let auth = Auth::new(Some("s3cret"), Some("anon".into()), None);
        assert_eq!(auth.role(&HeaderMap::new(), None).unwrap(), "anon");
        assert_eq!(auth.role(&headers("garbage"), None).unwrap_err().status(), 401);
    }
}
