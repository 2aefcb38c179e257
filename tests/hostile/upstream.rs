//! What a client sends that the backend must not get: the gateway's `Service-*` headers,
//! method overrides, protocol upgrades, a target naming another host.

use reqwest::Method;
use svcgate::metering::Credits;
use svcgate::proxy::config::RouteConfig;

use super::common::*;
use super::{body, host_of, raw, status};

#[tokio::test]
async fn no_client_service_header_but_service_project_reaches_the_backend() {
    let live = RecordingUpstream::start("live").await;
    let gw = Gateway::builder().live(live.addr).start().await;
    let (key_id, key) = gw.create_key("live", &["chat.completions:create"]).await;
    let resp = gw
        .request(Method::POST, "/v1/chat/completions")
        .bearer_auth(&key)
        .header("Service-Project", "p1")
        .header("Service-Scopes", "admin:*")
        .header("Service-Credits", "0")
        .header("Service-Signature", "forged")
        .header("Service-Token-Metadata", "{\"role\":\"admin\"}")
        .header("Service-Workspace", "ws_other")
        .header("Service-Key-Id", "key_other")
        .header("Service_Environment", "live")
        .header("X-Custom", "kept")
        .json(&serde_json::json!({"model": "m1", "messages": []}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let seen = live.requests();
    assert_eq!(seen.len(), 1);
    let headers = &seen[0].headers;
    let mut service: Vec<&str> = headers
        .keys()
        .map(|n| n.as_str())
        .filter(|n| n.starts_with("service") && !n.starts_with("service-"))
        .collect();
    assert!(
        service.is_empty(),
        "lookalikes reached the backend: {service:?}"
    );
    service = headers
        .keys()
        .map(|n| n.as_str())
        .filter(|n| n.starts_with("service-"))
        .collect();
    service.sort_unstable();
    assert_eq!(
        service,
        [
            "service-environment",
            "service-key-id",
            "service-project",
            "service-request-id",
            "service-workspace",
        ]
    );
    assert_eq!(headers["service-project"], "p1");
    assert_eq!(headers["service-workspace"], DEMO_WS);
    assert_eq!(headers["service-key-id"], key_id.as_str());
    assert_eq!(headers["x-custom"], "kept");
}

#[tokio::test]
async fn method_overrides_are_refused_and_never_forwarded() {
    let live = RecordingUpstream::start("live").await;
    let gw = Gateway::builder().live(live.addr).start().await;
    let (_, key) = gw.create_key("live", &["models:read"]).await;
    for name in [
        "X-HTTP-Method-Override",
        "X-HTTP-Method",
        "X-Method-Override",
    ] {
        let resp = gw
            .request(Method::GET, "/v1/models")
            .bearer_auth(&key)
            .header(name, "DELETE")
            .send()
            .await
            .unwrap();
        let body = assert_error(resp, 400, "invalid_request_error").await;
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains("method-override"), "{message}");
    }
    assert!(live.requests().is_empty());
}

/// `GET /v1/realtime`, a route that takes upgrades.
fn realtime_route() -> RouteConfig {
    RouteConfig {
        method: "GET".into(),
        path: "/v1/realtime".into(),
        scope: "realtime:connect".into(),
        price: Credits::ZERO,
        upgrade: true,
        reserve: None,
    }
}

#[tokio::test]
async fn upgrades_are_refused_unless_the_route_takes_them() {
    let live = RecordingUpstream::start("live").await;
    let gw = Gateway::builder()
        .live(live.addr)
        .config(|c| {
            let mut routes = svcgate::proxy::config::default_routes();
            routes.push(realtime_route());
            c.routes = routes;
        })
        .start()
        .await;
    let (_, key) = gw
        .create_key("live", &["models:read", "realtime:connect"])
        .await;
    let host = host_of(&gw);
    for upgrade in [
        "Upgrade: websocket\r\nConnection: Upgrade, close\r\n",
        "Upgrade: h2c\r\nConnection: close\r\n",
        "Connection: keep-alive, upgrade\r\n",
    ] {
        let answer = raw(
            &gw.base,
            format!(
                "GET /v1/models HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {key}\r\n\
                 Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\
                 {upgrade}\r\n"
            ),
        )
        .await;
        assert_eq!(status(&answer), 400, "{upgrade:?}: {answer}");
        let body = body(&answer);
        assert_eq!(body["error"]["code"], "invalid_request_error");
        assert_eq!(
            body["error"]["message"],
            "upgrades are not allowed on this route"
        );
    }
    assert!(live.requests().is_empty(), "an upgrade reached the backend");

    // The route that takes them forwards them.
    let answer = raw(
        &gw.base,
        format!(
            "GET /v1/realtime HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {key}\r\n\
             Upgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        ),
    )
    .await;
    let seen = live.requests();
    assert_eq!(seen.len(), 1, "{answer}");
    assert_eq!(seen[0].path, "/v1/realtime");
    assert_eq!(seen[0].headers["upgrade"], "websocket");
}

#[tokio::test]
async fn an_absolute_form_target_goes_in_origin_form_with_the_backends_host() {
    let backend = RawBackend::start(
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\
          connection: close\r\n\r\n{}",
    )
    .await;
    let gw = Gateway::builder().live(backend.addr).start().await;
    let (_, key) = gw.create_key("live", &["models:read"]).await;
    let answer = raw(
        &gw.base,
        format!(
            "GET http://evil.example/v1/models?page=2 HTTP/1.1\r\nHost: evil.example\r\n\
             Authorization: Bearer {key}\r\nConnection: close\r\n\r\n"
        ),
    )
    .await;
    assert_eq!(status(&answer), 200, "{answer}");
    let seen = backend.requests();
    assert_eq!(seen.len(), 1);
    let head = seen[0].to_ascii_lowercase();
    assert!(
        head.starts_with("get /v1/models?page=2 http/1.1\r\n"),
        "{head}"
    );
    let hosts: Vec<&str> = head
        .lines()
        .filter_map(|l| l.strip_prefix("host:"))
        .map(str::trim)
        .collect();
    assert_eq!(hosts, [backend.addr.to_string()], "{head}");
    assert!(!head.contains("evil.example"), "{head}");
}
