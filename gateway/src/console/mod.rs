//! The web console: its static files under /console (embedded in the
//! binary by assets.rs: nothing is read from disk or fetched at run time)
//! and the JSON API under /v1/console that the page calls (api.rs).
//!
//! The files need no token: they hold no data, and the page signs in with
//! the same JWT as the API, which it keeps in the tab's sessionStorage and
//! sends as `Authorization: Bearer`. Every file goes out with a
//! Content-Security-Policy that allows only the console's own origin (no
//! inline script, no framing, no <base>), so a stream's data shown on the
//! page can never run as script there.

pub mod api;
pub mod assets;

use std::sync::Arc;

use axum::extract::rejection::PathRejection;
use axum::extract::Path;
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use crate::app::App;
use crate::error::ApiError;

/// The policy of every console file: the page's own origin only; data: for
/// images (the favicon); no framing, no <base>, forms post nowhere else.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; img-src 'self' data:; style-src 'self'; \
     script-src 'self'; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'";

/// The console's routes: its files and its API (merged into http.rs's router).
pub fn routes() -> Router<Arc<App>> {
    Router::new()
        // A fallback of their own for other methods: the router's default
        // one (http.rs) would come after the layer and answer without it.
        .route("/console", get(index).fallback(method_not_allowed))
        .route("/console/", get(index).fallback(method_not_allowed))
        .route("/console/{*file}", get(file).fallback(method_not_allowed))
        // Every answer of these routes, their 404s and 405s too.
        .layer(axum::middleware::map_response(with_console_headers))
        .merge(api::routes())
}

async fn method_not_allowed() -> ApiError {
    ApiError::MethodNotAllowed
}

async fn index() -> Response {
    asset("index.html")
}

/// A path that does not decode (not UTF-8) names no file either.
async fn file(file: Result<Path<String>, PathRejection>) -> Response {
    match file {
        Ok(Path(file)) => asset(&file),
        Err(_) => asset(""),
    }
}

/// The embedded file at `path`, or 404.
fn asset(path: &str) -> Response {
    match asset_path(path).and_then(assets::get) {
        Some((bytes, content_type)) => ([(header::CONTENT_TYPE, content_type)], bytes).into_response(),
        None => ApiError::NotFound.into_response(),
    }
}

/// The console's headers on an answer of its routes.
async fn with_console_headers(mut response: Response) -> Response {
    let headers = response.headers_mut();
    for (name, value) in [
        (header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::CACHE_CONTROL, "no-cache"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}

/// `path` when it can name an embedded file: relative, `/`-separated, no
/// empty, `.` or `..` segment, no hidden file, no backslash or control
/// character. The files are a fixed table (nothing is read from disk), so
/// this is a second fence, and it keeps what reaches assets::get plain.
fn asset_path(path: &str) -> Option<&str> {
    let plain = !path.is_empty()
        && path.len() <= 200
        && !path.contains(['\\', '\0'])
        && !path.chars().any(char::is_control)
        && path.split('/').all(|segment| !segment.is_empty() && !segment.starts_with('.'));
    plain.then_some(path)
}

#[cfg(test)]
mod tests;
