//! The one error type of the HTTP API: a status, a message and the SQLSTATE
//! when the database said no. Rendered as `{"error": ..., "sqlstate": ...}`.
//! Messages never carry tokens or connection strings.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;

#[derive(Debug, Clone, Serialize)]
pub struct ApiError {
    #[serde(skip)]
    pub status: StatusCode,
    pub error: String,
    pub sqlstate: Option<String>,
}

impl ApiError {
    pub fn new(status: StatusCode, error: impl Into<String>) -> ApiError {
        ApiError { status, error: error.into(), sqlstate: None }
    }

    pub fn bad_request(error: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, error)
    }

    pub fn unauthorized(error: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::UNAUTHORIZED, error)
    }

    pub fn forbidden(error: impl Into<String>) -> ApiError {
        ApiError { sqlstate: Some("42501".into()), ..ApiError::new(StatusCode::FORBIDDEN, error) }
    }

    pub fn unavailable(error: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, error)
    }

    pub fn not_found() -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, "no such route")
    }

    pub fn not_found_sub() -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, "not subscribed to that stream")
    }

    /// The JSON body, for WebSocket error messages.
    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({"error": self.error, "sqlstate": self.sqlstate})
    }

    pub fn method_not_allowed() -> ApiError {
        ApiError::new(StatusCode::METHOD_NOT_ALLOWED, "method not allowed on this route")
    }

    /// A database error as the API reports it: privilege 403, bad argument
    /// or input past a limit of the server (a JSON body nested too deep:
    /// 54001) 400, connection trouble 503, anything else 500.
    pub fn from_db(e: &tokio_postgres::Error) -> ApiError {
        let Some(db) = e.as_db_error() else {
            // Closed connection, I/O error, timeout: the database is not there.
            return ApiError::unavailable(format!("database unavailable: {e}"));
        };
        let code = db.code().code();
        let status = match code {
            "42501" => StatusCode::FORBIDDEN,
            c if c.starts_with("22") || c.starts_with("54") => StatusCode::BAD_REQUEST,
            c if c.starts_with("08") || c.starts_with("57P") || c.starts_with("53") => StatusCode::SERVICE_UNAVAILABLE,
            // statement_timeout, and a database without the extension.
            "57014" | "3F000" | "42883" | "3D000" | "25006" => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        let mut error = db.message().to_owned();
        if let Some(detail) = db.detail() {
            error = format!("{error}: {detail}");
        }
        ApiError { status, error, sqlstate: Some(code.to_owned()) }
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
        (self.status, Json(self.json())).into_response()
    }
}
