//! The console's static files: `console/` at the workspace root, built into the binary.
//!
//! `/console` redirects to `/console/` (so relative module imports resolve); `/console/` is
//! `index.html`. A path that names no file is a 404 (the console routes by URL fragment, so it
//! never needs a fallback page).

use std::borrow::Cow;

use rust_embed::RustEmbed;
use warp::filters::BoxedFilter;
use warp::http::{header, HeaderValue, Response, StatusCode};
use warp::Filter;

#[derive(RustEmbed)]
#[folder = "../console/"]
struct Embedded;

/// Read once per request from here when set: the console's source folder, for development.
const DEV_DIR_ENV: &str = "FERROHUB_CONSOLE_DIR";

/// The policy every console response carries: this origin only, and no framing.
const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; style-src 'self'; \
     img-src 'self' data: blob:; connect-src 'self'; object-src 'none'; base-uri 'none'; \
     form-action 'none'; frame-ancestors 'none'";

pub fn routes() -> BoxedFilter<(warp::reply::Response,)> {
    let bare = warp::path::end()
        .and(warp::get())
        .and(warp::path::full())
        .map(|full: warp::path::FullPath| {
            if full.as_str().ends_with('/') {
                file("index.html")
            } else {
                redirect_to_folder()
            }
        });
    // `api/...` is the console's API: left to its own routes (and its refusals), never a file.
    let file = warp::path::tail()
        .and(warp::get())
        .and_then(|tail: warp::path::Tail| async move {
            let path = tail.as_str();
            if path == "api" || path.starts_with("api/") {
                Err(warp::reject::not_found())
            } else {
                Ok(file(path))
            }
        });
    bare.or(file).unify().boxed()
}

pub(super) fn redirect_to_folder() -> warp::reply::Response {
    let mut response = Response::new(warp::hyper::Body::empty());
    *response.status_mut() = StatusCode::MOVED_PERMANENTLY;
    response
        .headers_mut()
        .insert(header::LOCATION, HeaderValue::from_static("/console/"));
    response
}

fn file(path: &str) -> warp::reply::Response {
    let Some(body) = contents(path) else {
        return crate::rest::error::ApiError::NotFound(format!("console file {path:?}"))
            .into_response();
    };
    let mut response = Response::new(warp::hyper::Body::from(body.into_owned()));
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(media_type(path)),
    );
    // Small files, always revalidated: a new binary's console is seen at the next load.
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert(
        "content-security-policy",
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    headers.insert("referrer-policy", HeaderValue::from_static("no-referrer"));
    response
}

/// The file's bytes: from the development folder when one is set, else built in.
fn contents(path: &str) -> Option<Cow<'static, [u8]>> {
    // Plain names only: no empty or dot segments, no other separator or drive prefix.
    if path
        .split('/')
        .any(|s| s.is_empty() || s == "." || s == ".." || s.contains(['\\', ':']))
    {
        return None;
    }
    match std::env::var_os(DEV_DIR_ENV) {
        Some(dir) => std::fs::read(std::path::Path::new(&dir).join(path))
            .ok()
            .map(Cow::Owned),
        None => Embedded::get(path).map(|f| f.data),
    }
}

fn media_type(path: &str) -> &'static str {
    match path.rsplit_once('.').map(|(_, ext)| ext) {
        Some("html") => "text/html; charset=utf-8",
        Some("js") => "text/javascript; charset=utf-8",
        Some("css") => "text/css; charset=utf-8",
        Some("json") => "application/json",
        Some("svg") => "image/svg+xml",
        Some("png") => "image/png",
        Some("ico") => "image/x-icon",
        _ => "application/octet-stream",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_that_leave_the_folder_name_no_file() {
        assert!(contents("../Cargo.toml").is_none());
        assert!(contents("lib/../../Cargo.toml").is_none());
        assert!(contents("/etc/passwd").is_none());
        assert!(contents("lib\\..\\..\\Cargo.toml").is_none());
        assert!(contents("C:/Windows/win.ini").is_none());
    }

    #[test]
    fn the_page_and_its_script_are_built_in() {
        assert!(Embedded::get("index.html").is_some());
        assert!(Embedded::get("app.js").is_some());
    }
}
