//! The one error type of the HTTP API: what went wrong, its HTTP status (one
//! `match`, `ApiError::status`) and the SQLSTATE when the database said no
//! (or the gateway refused on its behalf). Rendered as
//! `{"error": ..., "sqlstate": ...}`. Messages never carry tokens or
//! connection strings.

use std::borrow::Cow;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

/// SQLSTATE invalid_parameter_value: a bad pattern, stream name or position.
pub const INVALID_PARAMETER: &str = "22023";
/// The extension's SQLSTATE for a read below the first position the log's
/// retention kept.
pub const EVENTS_REMOVED: &str = "LS001";

/// SQLSTATE insufficient_privilege.
pub const INSUFFICIENT_PRIVILEGE: &str = "42501";

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApiError {
    /// 400: bad input, with the SQLSTATE of the database's refusal when there is one.
    BadRequest { message: String, sqlstate: Option<String> },
    /// 401: no token, or one that is not accepted.
    Unauthorized(String),
    /// 401: the token names a role the database does not have (SQLSTATE 22023).
    UnknownRole,
    /// 403: the role may not do that (SQLSTATE 42501).
    Forbidden(String),
    /// 404: no such route.
    NotFound,
    /// 404: a WebSocket unsubscribe from a stream it is not subscribed to.
    NotSubscribed,
    /// 405.
    MethodNotAllowed,
    /// 408: a request body that did not arrive within --body-timeout-secs.
    BodyTimeout,
    /// 410: the events asked for were removed by the log's retention
    /// (SQLSTATE LS001; the message names the first position kept).
    Gone { message: String, sqlstate: Option<String> },
    /// 413: a request body over --max-body-bytes (`limit`).
    TooLarge { limit: usize },
    /// 422: well-formed, but refused as it stands: an idempotency key that
    /// published other data (SQLSTATE 23505).
    Unprocessable { message: String, sqlstate: Option<String> },
    /// 503: the database (or a limit of the gateway) says come back later.
    Unavailable { message: String, sqlstate: Option<String> },
    /// 500: any other refusal of the database.
    Internal { message: String, sqlstate: Option<String> },
}

impl ApiError {
    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::BadRequest { message: message.into(), sqlstate: None }
    }

    /// 400 with SQLSTATE 22023, as the database would refuse the same value.
    pub fn invalid_parameter(message: impl Into<String>) -> ApiError {
        ApiError::BadRequest { message: message.into(), sqlstate: Some(INVALID_PARAMETER.into()) }
    }

    pub fn unauthorized(message: impl Into<String>) -> ApiError {
        ApiError::Unauthorized(message.into())
    }

    pub fn forbidden(message: impl Into<String>) -> ApiError {
        ApiError::Forbidden(message.into())
    }

    pub fn unavailable(message: impl Into<String>) -> ApiError {
        ApiError::Unavailable { message: message.into(), sqlstate: None }
    }

    /// 422 for a database refusal that is the request's, not the server's
    /// (the caller decides which: the same SQLSTATE elsewhere is a 500).
    pub fn unprocessable(e: &tokio_postgres::Error) -> ApiError {
        match ApiError::from_db(e) {
            ApiError::Internal { message, sqlstate } => ApiError::Unprocessable { message, sqlstate },
            other => other,
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::BadRequest { .. } => StatusCode::BAD_REQUEST,
            ApiError::Unauthorized(_) | ApiError::UnknownRole => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden(_) => StatusCode::FORBIDDEN,
            ApiError::NotFound | ApiError::NotSubscribed => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::BodyTimeout => StatusCode::REQUEST_TIMEOUT,
            ApiError::Gone { .. } => StatusCode::GONE,
            ApiError::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::Unprocessable { .. } => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::Unavailable { .. } => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Internal { .. } => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The `error` and `sqlstate` of the JSON body.
    fn parts(&self) -> (Cow<'_, str>, Option<&str>) {
        match self {
            ApiError::BadRequest { message, sqlstate }
            | ApiError::Unavailable { message, sqlstate }
            | ApiError::Unprocessable { message, sqlstate }
            | ApiError::Gone { message, sqlstate }
            | ApiError::Internal { message, sqlstate } => (message.into(), sqlstate.as_deref()),
            ApiError::Unauthorized(message) => (message.into(), None),
            ApiError::UnknownRole => ("the token's role does not exist".into(), Some(INVALID_PARAMETER)),
            ApiError::Forbidden(message) => (message.into(), Some(INSUFFICIENT_PRIVILEGE)),
            ApiError::NotFound => ("no such route".into(), None),
            ApiError::NotSubscribed => ("not subscribed to that stream".into(), None),
            ApiError::MethodNotAllowed => ("method not allowed on this route".into(), None),
            ApiError::BodyTimeout => ("the request body did not arrive in time".into(), None),
            ApiError::TooLarge { limit } => {
                (format!("the body is larger than {limit} bytes (--max-body-bytes)").into(), None)
            }
        }
    }

    pub fn message(&self) -> Cow<'_, str> {
        self.parts().0
    }

    pub fn sqlstate(&self) -> Option<&str> {
        self.parts().1
    }

    /// The JSON body, for WebSocket error messages.
    pub fn json(&self) -> serde_json::Value {
        let (error, sqlstate) = self.parts();
        serde_json::json!({"error": error, "sqlstate": sqlstate})
    }

    /// A database error as the API reports it (see `from_sqlstate`); one
    /// that did not come from the server (closed connection, I/O error,
    /// timeout) means the database is not there: 503.
    pub fn from_db(e: &tokio_postgres::Error) -> ApiError {
        match e.as_db_error() {
            Some(db) => ApiError::from_sqlstate(db.code().code(), db.message(), db.detail()),
            None => ApiError::unavailable(format!("database unavailable: {e}")),
        }
    }

    /// The server's error `code`, `message` and `detail` as the API reports
    /// them: privilege 403, bad argument or input past a limit of the server
    /// (a JSON body nested too deep: 54001) 400, connection trouble 503,
    /// anything else 500. (tokio_postgres cannot build a `DbError`: tests
    /// call this directly.)
    pub fn from_sqlstate(code: &str, message: &str, detail: Option<&str>) -> ApiError {
        let message = match detail {
            Some(detail) => format!("{message}: {detail}"),
            None => message.to_owned(),
        };
        let sqlstate = Some(code.to_owned());
        match code {
            INSUFFICIENT_PRIVILEGE => ApiError::Forbidden(message),
            EVENTS_REMOVED => ApiError::Gone { message, sqlstate },
            c if c.starts_with("22") || c.starts_with("54") => ApiError::BadRequest { message, sqlstate },
            c if c.starts_with("08") || c.starts_with("57P") || c.starts_with("53") => {
                ApiError::Unavailable { message, sqlstate }
            }
            // statement_timeout, and a database without the extension.
            "57014" | "3F000" | "42883" | "3D000" | "25006" => ApiError::Unavailable { message, sqlstate },
            _ => ApiError::Internal { message, sqlstate },
        }
    }
}

impl From<deadpool_postgres::PoolError> for ApiError {
    fn from(e: deadpool_postgres::PoolError) -> ApiError {
        match e {
            deadpool_postgres::PoolError::Backend(e) => ApiError::from_db(&e),
            e => ApiError::unavailable(format!("database unavailable: {e}")),
        }
    }
}

impl From<tokio_postgres::Error> for ApiError {
    fn from(e: tokio_postgres::Error) -> ApiError {
        ApiError::from_db(&e)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status(), Json(self.json())).into_response()
    }
}

#[cfg(test)]
mod tests {
    use std::str::FromStr;

    use http_body_util::BodyExt;

    use super::*;

    #[test]
    fn sqlstates_map_to_statuses() {
        for (code, status) in [
            ("42501", 403),
            ("LS001", 410),
            ("22023", 400),
            ("22P02", 400),
            ("22007", 400),
            ("54001", 400),
            ("08006", 503),
            ("57P01", 503),
            ("53300", 503),
            ("57014", 503),
            ("3F000", 503),
            ("42883", 503),
            ("3D000", 503),
            ("25006", 503),
            ("42P01", 500),
            ("XX000", 500),
            ("23505", 500),
        ] {
            let e = ApiError::from_sqlstate(code, "it failed", None);
            assert_eq!(e.status(), status, "{code}");
            assert_eq!(e.sqlstate(), Some(code), "{code}");
            assert_eq!(e.message(), "it failed", "{code}");
        }
        assert_eq!(ApiError::from_sqlstate("42501", "denied", None), ApiError::Forbidden("denied".into()));
        assert_eq!(
            ApiError::from_sqlstate("22023", "bad value", Some("it is negative")).message(),
            "bad value: it is negative"
        );
    }

    #[test]
    fn an_error_that_is_not_the_servers_is_unavailable() {
        let e = tokio_postgres::Config::from_str("port=notaport").expect_err("a bad connection string");
        assert!(e.as_db_error().is_none());
        let mapped = ApiError::from_db(&e);
        assert_eq!(mapped.status(), 503);
        assert_eq!(mapped.sqlstate(), None);
        assert!(mapped.message().starts_with("database unavailable: "), "{}", mapped.message());
        assert_eq!(ApiError::from(e).status(), 503);
    }

    #[test]
    fn every_variant_has_its_status_message_and_sqlstate() {
        let variant = |e: ApiError| (e.status().as_u16(), e.message().into_owned(), e.sqlstate().map(str::to_owned));
        let s = |text: &str| text.to_owned();
        assert_eq!(variant(ApiError::bad_request("no")), (400, s("no"), None));
        assert_eq!(variant(ApiError::invalid_parameter("no")), (400, s("no"), Some(s("22023"))));
        assert_eq!(variant(ApiError::unauthorized("who")), (401, s("who"), None));
        assert_eq!(variant(ApiError::UnknownRole), (401, s("the token's role does not exist"), Some(s("22023"))));
        assert_eq!(variant(ApiError::forbidden("not you")), (403, s("not you"), Some(s("42501"))));
        assert_eq!(variant(ApiError::NotFound), (404, s("no such route"), None));
        assert_eq!(variant(ApiError::NotSubscribed), (404, s("not subscribed to that stream"), None));
        assert_eq!(variant(ApiError::MethodNotAllowed), (405, s("method not allowed on this route"), None));
        assert_eq!(variant(ApiError::BodyTimeout), (408, s("the request body did not arrive in time"), None));
        assert_eq!(
            variant(ApiError::TooLarge { limit: 10 }),
            (413, s("the body is larger than 10 bytes (--max-body-bytes)"), None)
        );
        assert_eq!(variant(ApiError::unavailable("later")), (503, s("later"), None));
        let unprocessable = ApiError::Unprocessable { message: s("taken"), sqlstate: Some(s("23505")) };
        assert_eq!(variant(unprocessable), (422, s("taken"), Some(s("23505"))));
        let internal = ApiError::Internal { message: s("oops"), sqlstate: Some(s("XX000")) };
        assert_eq!(variant(internal), (500, s("oops"), Some(s("XX000"))));
    }

    #[tokio::test]
    async fn errors_render_as_json_with_their_status() {
        for (e, status, body) in [
            (ApiError::NotFound, 404, r#"{"error":"no such route","sqlstate":null}"#),
            (ApiError::invalid_parameter("bad \"x\""), 400, r#"{"error":"bad \"x\"","sqlstate":"22023"}"#),
            (ApiError::forbidden("no"), 403, r#"{"error":"no","sqlstate":"42501"}"#),
        ] {
            assert_eq!(e.json().to_string(), body);
            let response = e.into_response();
            assert_eq!(response.status(), status);
            assert_eq!(response.headers()["content-type"], "application/json");
            let bytes = response.into_body().collect().await.unwrap().to_bytes();
            assert_eq!(std::str::from_utf8(&bytes).unwrap(), body);
        }
    }
}
