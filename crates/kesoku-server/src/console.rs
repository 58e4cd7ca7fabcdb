//! The web console: static files embedded in the binary, served at `/` and `/console/…`.
//!
//! Plain HTML, CSS and JavaScript with no build step and nothing loaded from elsewhere. The
//! files carry no data, so they are served without the token; the page asks for the token when
//! the API answers 401, keeps it in `sessionStorage` (gone when the tab closes), sends it as a
//! bearer header on API calls, and as `?access_token=` on the event stream, the only route that
//! accepts it there (`EventSource` cannot set headers). A strict Content-Security-Policy allows
//! only these files to run.

use axum::Router;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use http::{HeaderValue, header};

use crate::server::AppState;

const INDEX_HTML: &str = include_str!("../assets/index.html");
const APP_JS: &str = include_str!("../assets/app.js");
const APP_CSS: &str = include_str!("../assets/app.css");

/// Only our own files; no inline script or style; no framing.
pub const CONSOLE_CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
                               img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

fn asset(content_type: &'static str, body: &'static str) -> Response {
    let mut response = ([(header::CONTENT_TYPE, content_type)], body).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CONSOLE_CSP));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

async fn index() -> Response {
    asset("text/html; charset=utf-8", INDEX_HTML)
}

async fn app_js() -> Response {
    asset("text/javascript; charset=utf-8", APP_JS)
}

async fn app_css() -> Response {
    asset("text/css; charset=utf-8", APP_CSS)
}

/// The console's routes (open: static files only).
pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route("/", get(index))
        .route("/console", get(index))
        .route("/console/", get(index))
        .route("/console/app.js", get(app_js))
        .route("/console/app.css", get(app_css))
}
