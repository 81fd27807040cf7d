//! The page's files, embedded in the binary: no CDN, nothing fetched from the internet.

use axum::http::header;
use axum::routing::{get, MethodRouter};

const INDEX: &str = include_str!("assets/index.html");
const SCRIPT: &str = include_str!("assets/dashboard.js");
const STYLE: &str = include_str!("assets/dashboard.css");

/// `(path, route)` of each file.
pub fn routes<S: Clone + Send + Sync + 'static>() -> Vec<(&'static str, MethodRouter<S>)> {
    vec![
        ("/", file(INDEX, "text/html; charset=utf-8")),
        (
            "/dashboard.js",
            file(SCRIPT, "text/javascript; charset=utf-8"),
        ),
        ("/dashboard.css", file(STYLE, "text/css; charset=utf-8")),
    ]
}

fn file<S: Clone + Send + Sync + 'static>(
    body: &'static str,
    kind: &'static str,
) -> MethodRouter<S> {
    get(move || async move {
        (
            [
                (header::CONTENT_TYPE, kind),
                (header::CACHE_CONTROL, "no-cache"),
            ],
            body,
        )
    })
}
