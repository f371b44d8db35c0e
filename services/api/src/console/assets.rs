//! The console's files, embedded in the binary at build time (no file is
//! read at run time, no Node toolchain builds them), served with a strict
//! Content-Security-Policy and an ETag so a browser revalidates instead of
//! downloading them again.

use std::sync::OnceLock;

use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use sha2::{Digest, Sha256};

use crate::error::ApiError;
use crate::extract::Segments;
use crate::state::AppState;

/// One embedded file.
pub struct Asset {
    /// Its path below `/console/` (`index.html` is also served at `/`).
    pub path: &'static str,
    /// Its `Content-Type`.
    pub content_type: &'static str,
    /// Its bytes.
    pub body: &'static [u8],
}

macro_rules! asset {
    ($path:literal, $type:literal) => {
        Asset {
            path: $path,
            content_type: $type,
            body: include_bytes!(concat!("../../console/", $path)),
        }
    };
}

/// Every file of the console.
pub const ASSETS: &[Asset] = &[
    asset!("index.html", "text/html; charset=utf-8"),
    asset!("app.css", "text/css; charset=utf-8"),
    asset!("favicon.svg", "image/svg+xml"),
    asset!("js/main.js", "text/javascript; charset=utf-8"),
    asset!("js/api.js", "text/javascript; charset=utf-8"),
    asset!("js/dom.js", "text/javascript; charset=utf-8"),
    asset!("js/format.js", "text/javascript; charset=utf-8"),
    asset!("js/executions.js", "text/javascript; charset=utf-8"),
    asset!("js/execution.js", "text/javascript; charset=utf-8"),
    asset!("js/graph.js", "text/javascript; charset=utf-8"),
    asset!("js/timeline.js", "text/javascript; charset=utf-8"),
    asset!("js/history.js", "text/javascript; charset=utf-8"),
    asset!("js/catalog.js", "text/javascript; charset=utf-8"),
    asset!("js/credentials.js", "text/javascript; charset=utf-8"),
];

/// The Content-Security-Policy of every console file: this origin's
/// scripts, styles and API only; no inline script, no plugin, no framing.
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
    img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; \
    frame-ancestors 'none'";

/// The asset at `path`, if there is one.
pub fn find(path: &str) -> Option<(usize, &'static Asset)> {
    ASSETS.iter().enumerate().find(|(_, a)| a.path == path)
}

/// The ETag of each asset (a hash of its bytes), computed once.
fn etag(index: usize) -> &'static str {
    static TAGS: OnceLock<Vec<String>> = OnceLock::new();
    let tags = TAGS.get_or_init(|| {
        ASSETS
            .iter()
            .map(|a| format!("\"{}\"", &hex::encode(Sha256::digest(a.body))[..20]))
            .collect()
    });
    &tags[index]
}

/// The answer for asset `index`: 304 when the browser's copy is current.
fn serve(index: usize, asset: &'static Asset, request: &HeaderMap) -> Response {
    let tag = etag(index);
    let current = request
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == tag));
    let mut response = if current {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        ([(header::CONTENT_TYPE, asset.content_type)], asset.body).into_response()
    };
    let h = response.headers_mut();
    h.insert(header::ETAG, HeaderValue::from_static(tag));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    response
}

/// `GET /`: the app.
async fn index(request: HeaderMap) -> Response {
    let (i, asset) = find("index.html").expect("index.html is embedded");
    serve(i, asset, &request)
}

/// `GET /console/{*file}`: one of its files, or 404.
async fn file(Segments(path): Segments<String>, request: HeaderMap) -> Result<Response, ApiError> {
    let (i, asset) = find(&path)
        .ok_or_else(|| ApiError::NotFound(format!("the console has no file {path:?}")))?;
    Ok(serve(i, asset, &request))
}

/// The app at `/` and its files at `/console/...` (no token needed).
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/", get(index))
        .route("/console/{*file}", get(file))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_asset_is_found_by_its_path_with_its_type() {
        for a in ASSETS {
            let (_, found) = find(a.path).unwrap();
            assert!(!found.body.is_empty(), "{} is empty", a.path);
            if a.path.ends_with(".js") {
                assert!(a.content_type.starts_with("text/javascript"), "{}", a.path);
            }
        }
        assert!(find("../Cargo.toml").is_none());
        assert!(find("js/nope.js").is_none());
    }

    #[test]
    fn every_module_an_asset_imports_is_embedded() {
        for a in ASSETS.iter().filter(|a| a.path.ends_with(".js")) {
            let text = std::str::from_utf8(a.body).unwrap();
            for line in text.lines().filter(|l| l.starts_with("import ")) {
                let spec = line.split(['\'', '"']).nth(1).unwrap_or_default();
                let target = spec.strip_prefix("./").map(|s| format!("js/{s}"));
                assert!(
                    target.as_deref().is_some_and(|t| find(t).is_some()),
                    "{}: {line}",
                    a.path
                );
            }
        }
    }

    #[test]
    fn etags_differ_for_different_files() {
        let tags: std::collections::BTreeSet<&str> = (0..ASSETS.len()).map(etag).collect();
        assert_eq!(tags.len(), ASSETS.len());
    }
}
