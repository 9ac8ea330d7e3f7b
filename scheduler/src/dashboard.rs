//! The web dashboard: static HTML, CSS and JavaScript compiled into the binary and served under
//! `/` by the same server as the API, so there is no front-end server and no network fetch
//! beyond this instance.
//!
//! The pages call the JSON API with the operator's token in `Authorization: Bearer`, kept in the
//! tab's `sessionStorage`. No cookie carries authority, so another site cannot make the browser
//! send a request with the operator's rights: the dashboard's forms need no CSRF token, and the
//! API keeps refusing requests without the header. Every page is sent with a Content-Security-
//! Policy that allows only this origin's script and no inline script, and the script builds the
//! DOM with `textContent`, never `innerHTML`, so user-supplied strings (job names, params, log
//! lines, errors) are never interpreted as markup. The overview's chart is SVG built the same way
//! (`createElementNS` and text nodes), with no library.

use axum::Router;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

const INDEX: &str = include_str!("dashboard/index.html");
const STYLE: &str = include_str!("dashboard/dashboard.css");
const SCRIPT: &str = include_str!("dashboard/dashboard.js");

/// Only this origin's files; no inline script or style, no framing, no form posts elsewhere.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                   connect-src 'self'; form-action 'self'; frame-ancestors 'none'; \
                   base-uri 'none'";

/// The dashboard's routes: the page at `/` and its two assets.
pub fn router<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route(
            "/",
            get(|| async { asset("text/html; charset=utf-8", INDEX) }),
        )
        .route(
            "/dashboard.css",
            get(|| async { asset("text/css; charset=utf-8", STYLE) }),
        )
        .route(
            "/dashboard.js",
            get(|| async { asset("text/javascript; charset=utf-8", SCRIPT) }),
        )
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    let mut response = body.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::http::{Request, StatusCode};
    use tower::ServiceExt as _;

    use super::*;

    #[tokio::test]
    async fn every_asset_is_served_with_its_type_and_the_policy() {
        for (path, content_type, marker) in [
            ("/", "text/html", "<script src=\"/dashboard.js\""),
            ("/dashboard.css", "text/css", "font"),
            ("/dashboard.js", "text/javascript", "textContent"),
        ] {
            let response = router::<()>()
                .oneshot(Request::get(path).body(Body::empty()).expect("request"))
                .await
                .expect("response");
            assert_eq!(response.status(), StatusCode::OK, "{path}");
            let headers = response.headers();
            assert!(
                headers[header::CONTENT_TYPE]
                    .to_str()
                    .expect("type")
                    .starts_with(content_type),
                "{path}"
            );
            assert_eq!(headers[header::CONTENT_SECURITY_POLICY], CSP, "{path}");
            let body = axum::body::to_bytes(response.into_body(), usize::MAX)
                .await
                .expect("body");
            assert!(
                String::from_utf8_lossy(&body).contains(marker),
                "{path} lacks {marker}"
            );
        }
    }

    /// The escaping rule, checked on the source: data reaches the page only as text, and
    /// nothing is loaded from another host.
    #[test]
    fn the_script_never_writes_markup_and_the_page_loads_nothing_remote() {
        for sink in [
            "innerHTML",
            "outerHTML",
            "insertAdjacentHTML",
            "document.write",
            "eval(",
        ] {
            assert!(!SCRIPT.contains(sink), "dashboard.js uses {sink}");
        }
        for asset in [INDEX, STYLE, SCRIPT] {
            // The SVG namespace names the chart's elements; nothing is fetched from it.
            let asset = asset.replace("\"http://www.w3.org/2000/svg\"", "");
            assert!(!asset.contains("http://") && !asset.contains("https://"));
        }
        assert!(
            !INDEX.contains("<script>"),
            "no inline script (the CSP forbids it)"
        );
    }
}
