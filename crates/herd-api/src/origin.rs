//! Requests that browsers send on behalf of other sites. The page's actions are plain POSTs, so
//! a page elsewhere could post them through a visitor's browser (cross-site request forgery),
//! and a name that resolves to 127.0.0.1 could make the browser treat the API as that other
//! site's own (DNS rebinding). Two checks, cheap and invisible to `herd`, curl and scripts
//! (which send no `Origin` and use the address): an action whose `Origin` is not the API's own
//! address is refused, and without a token only IP addresses and `localhost` are accepted as
//! the `Host`.

use axum::extract::{Request, State};
use axum::http::{header, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

/// Why a request is refused, or `None` when it may pass. `names_allowed`: host names other than
/// `localhost` may be used (the API needs a token, so a rebound name gains nothing).
pub fn refusal(
    method: &Method,
    host: Option<&str>,
    origin: Option<&str>,
    names_allowed: bool,
) -> Option<&'static str> {
    if let Some(host) = host {
        if !names_allowed && !is_address(host) {
            return Some(
                "this API answers to its IP address (or localhost), not to other host names",
            );
        }
    }
    let action = !(method == Method::GET || method == Method::HEAD);
    match (action, origin, host) {
        (false, _, _) | (true, None, _) => None,
        (true, Some(origin), Some(host)) if origin == format!("http://{host}") => None,
        (true, Some(_), _) => Some("actions are accepted from this API's own page only"),
    }
}

/// True for `127.0.0.1`, `127.0.0.1:7532`, `[::1]:7532`, `localhost:7532` and the like.
fn is_address(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => host.rsplit_once(':').map_or(host, |(name, _)| name),
    };
    name.eq_ignore_ascii_case("localhost") || name.parse::<std::net::IpAddr>().is_ok()
}

/// The middleware: 403 with the reason when [`refusal`] says so.
pub async fn check(State(names_allowed): State<bool>, request: Request, next: Next) -> Response {
    // Decided before the await below: a borrow of the request (its body is not `Sync`) must
    // not live across it.
    let why = {
        let text = |name| request.headers().get(name).and_then(|v| v.to_str().ok());
        refusal(
            request.method(),
            text(header::HOST),
            text(header::ORIGIN),
            names_allowed,
        )
    };
    match why {
        Some(why) => (StatusCode::FORBIDDEN, format!("{why}\n")).into_response(),
        None => next.run(request).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cross_site_requests_are_refused() {
        let (get, post) = (Method::GET, Method::POST);
        let h = Some("127.0.0.1:7532");
        // (method, host, origin, names allowed, passes)
        type Case<'a> = (&'a Method, Option<&'a str>, Option<&'a str>, bool, bool);
        let cases: &[Case] = &[
            (&get, h, None, false, true),
            (&get, Some("localhost:7532"), None, false, true),
            (&get, Some("[::1]:7532"), None, false, true),
            (&get, Some("127.0.0.1"), None, false, true),
            (&get, None, None, false, true),
            // DNS rebinding: a name that resolves to 127.0.0.1.
            (&get, Some("evil.example:7532"), None, false, false),
            (&get, Some("herd.internal:7532"), None, true, true),
            // Actions: from the page itself, or from a client that is not a browser.
            (&post, h, Some("http://127.0.0.1:7532"), false, true),
            (&post, h, None, false, true),
            (&post, h, Some("http://evil.example"), false, false),
            (&post, h, Some("null"), false, false),
            (&post, h, Some("http://127.0.0.1:7533"), false, false),
            (&post, None, Some("http://127.0.0.1:7532"), false, false),
            // Reads carry no effect; a foreign page cannot read the answer anyway (no CORS).
            (&get, h, Some("http://evil.example"), false, true),
        ];
        for (method, host, origin, names, passes) in cases {
            assert_eq!(
                refusal(method, *host, *origin, *names).is_none(),
                *passes,
                "{method} host {host:?} origin {origin:?}"
            );
        }
    }
}
