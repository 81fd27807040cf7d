//! The API's authentication when it listens beyond 127.0.0.1: a bearer token, read by the
//! supervisor from a file of mode 0600. Health checks stay open (load balancers poll them
//! without credentials) and so do the page's static files (they hold no data); everything
//! else needs the token.

use axum::extract::{Request, State};
use axum::http::{header, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

/// True when an API listening on `listen` must require the token: anywhere but exactly
/// 127.0.0.1 or ::1 (other loopback addresses count as beyond, so the rule stays simple to
/// state and to test).
pub fn needs_token(listen: std::net::IpAddr) -> bool {
    listen != std::net::IpAddr::from([127, 0, 0, 1]) && listen != std::net::Ipv6Addr::LOCALHOST
}

/// The name of the cookie the page keeps the token in.
pub const COOKIE: &str = "herd_token";

/// True when a request may pass: on a path that needs no token, or with the token in an
/// `Authorization: Bearer` header, or — for reads only, so another site cannot make a
/// visitor's browser post an action — in the page's cookie.
pub fn allowed(
    method: &Method,
    path: &str,
    authorization: Option<&str>,
    cookie: Option<&str>,
    token: &str,
) -> bool {
    if is_open(path) {
        return true;
    }
    if authorization
        .and_then(|a| a.strip_prefix("Bearer "))
        .is_some_and(|t| same(t.trim(), token))
    {
        return true;
    }
    let read = method == Method::GET || method == Method::HEAD;
    read && cookie.is_some_and(|c| {
        c.split(';')
            .filter_map(|kv| kv.trim().split_once('='))
            .any(|(k, v)| k == COOKIE && same(v, token))
    })
}

fn is_open(path: &str) -> bool {
    matches!(path, "/" | "/dashboard.js" | "/dashboard.css")
        || path == "/primary"
        || path == "/replica"
        || path.starts_with("/primary/")
        || path.starts_with("/replica/")
}

/// Compares without stopping at the first difference, so timing does not reveal a prefix.
fn same(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

/// The middleware: 401 unless [`allowed`].
pub async fn require(
    State(token): State<std::sync::Arc<str>>,
    request: Request,
    next: Next,
) -> Response {
    // Owned copies: a borrow of the request (its body is not `Sync`) must not live across
    // the await below.
    let text = |headers: &axum::http::HeaderMap, name| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let authorization = text(request.headers(), header::AUTHORIZATION);
    let cookie = text(request.headers(), header::COOKIE);
    let pass = allowed(
        request.method(),
        request.uri().path(),
        authorization.as_deref(),
        cookie.as_deref(),
        &token,
    );
    if pass {
        return next.run(request).await;
    }
    (
        StatusCode::UNAUTHORIZED,
        [(header::WWW_AUTHENTICATE, "Bearer")],
        "this API needs the token from the data directory's secrets/api-token \
         (Authorization: Bearer TOKEN)\n",
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn which_addresses_need_the_token() {
        for (addr, want) in [
            ("127.0.0.1", false),
            ("::1", false),
            ("127.0.0.2", true),
            ("0.0.0.0", true),
            ("10.1.2.3", true),
            ("::", true),
        ] {
            let ip: std::net::IpAddr = addr.parse().expect("address");
            assert_eq!(needs_token(ip), want, "{addr}");
        }
    }

    #[test]
    fn who_passes() {
        let get = Method::GET;
        let post = Method::POST;
        let t = "s3cret";
        // (method, path, authorization, cookie, allowed)
        type Case<'a> = (&'a Method, &'a str, Option<&'a str>, Option<&'a str>, bool);
        let cases: &[Case] = &[
            (&get, "/", None, None, true),
            (&get, "/dashboard.js", None, None, true),
            (&get, "/primary", None, None, true),
            (&get, "/replica/node1", None, None, true),
            (&get, "/status", None, None, false),
            (&get, "/metrics", None, None, false),
            (&get, "/events/stream", None, None, false),
            (&get, "/status", Some("Bearer s3cret"), None, true),
            (&get, "/status", Some("Bearer s3cre"), None, false),
            (&get, "/status", Some("Basic s3cret"), None, false),
            (&get, "/status", None, Some("a=b; herd_token=s3cret"), true),
            (&get, "/status", None, Some("herd_token=wrong"), false),
            (&post, "/switchover", Some("Bearer s3cret"), None, true),
            // No action on the strength of a cookie alone (cross-site requests carry it).
            (&post, "/switchover", None, Some("herd_token=s3cret"), false),
            (&post, "/switchover", None, None, false),
        ];
        for (method, path, authorization, cookie, want) in cases {
            assert_eq!(
                allowed(method, path, *authorization, *cookie, t),
                *want,
                "{method} {path} {authorization:?} {cookie:?}"
            );
        }
    }
}
