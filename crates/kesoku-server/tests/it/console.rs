//! The console's files: served with a strict policy, self-contained.

use http::StatusCode;

use crate::harness::{TestServer, get, send};

#[tokio::test]
async fn the_console_is_served_with_a_strict_policy_and_loads_nothing_external() {
    let server = TestServer::new().await;
    let app = server.app();
    let page = send(&app, get("/")).await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(page.content_type().starts_with("text/html"));
    assert!(page.text.contains("/console/app.js") && page.text.contains("/console/app.css"));
    let csp = page.headers.get("content-security-policy").and_then(|v| v.to_str().ok()).unwrap_or("");
    assert_eq!(csp, kesoku_server::CONSOLE_CSP);
    assert!(csp.contains("script-src 'self'") && !csp.contains("unsafe-inline"), "{csp}");
    assert_eq!(page.headers.get("x-content-type-options").and_then(|v| v.to_str().ok()), Some("nosniff"));

    let script = send(&app, get("/console/app.js")).await;
    assert!(script.content_type().starts_with("text/javascript"));
    let style = send(&app, get("/console/app.css")).await;
    assert!(style.content_type().starts_with("text/css"));
    for (name, text) in [("index.html", &page.text), ("app.js", &script.text), ("app.css", &style.text)] {
        assert!(!text.contains("http://") && !text.contains("https://"), "{name} must not load anything external");
        assert!(!text.contains("innerHTML"), "{name} must not build HTML from strings");
    }
    assert!(!page.text.contains("<script>"), "no inline script");
    assert!(script.text.contains("EventSource") && script.text.contains("access_token"));
    assert_eq!(send(&app, get("/console/")).await.status, StatusCode::OK);
}
