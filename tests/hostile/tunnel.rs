//! A route that takes upgrades (`upgrade = true`): its tunnel is admitted like a request (rate
//! limit included) and audited when it closes, with its duration and the bytes each way.

use serde_json::Value;
use std::net::SocketAddr;
use std::time::Duration;
use svcgate::metering::Credits;
use svcgate::proxy::config::RouteConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::common::*;
use super::host_of;

/// A WebSocket-like backend: answers an upgrade with `101`, then reads `ping` and writes
/// `pong!`, and closes.
async fn echo_backend() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    if conn.read(&mut byte).await.unwrap_or(0) == 0 {
                        return;
                    }
                    head.push(byte[0]);
                }
                let _ = conn
                    .write_all(
                        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\
                          Connection: Upgrade\r\n\r\n",
                    )
                    .await;
                let mut ping = [0u8; 4];
                if conn.read_exact(&mut ping).await.is_ok() && &ping == b"ping" {
                    let _ = conn.write_all(b"pong!").await;
                }
            });
        }
    });
    addr
}

/// Opens a tunnel through the gateway, sends `ping`, reads `pong!`, closes. The status line.
async fn through_tunnel(gw: &Gateway, key: &str) -> String {
    let mut conn = tokio::net::TcpStream::connect(host_of(gw)).await.unwrap();
    let head = format!(
        "GET /v1/realtime HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {key}\r\n\
         Upgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
        host_of(gw)
    );
    conn.write_all(head.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let mut byte = [0u8; 1];
    while !answer.ends_with(b"\r\n\r\n") {
        let n = tokio::time::timeout(Duration::from_secs(5), conn.read(&mut byte))
            .await
            .expect("an answer")
            .unwrap();
        if n == 0 {
            break;
        }
        answer.push(byte[0]);
    }
    let answer = String::from_utf8_lossy(&answer).into_owned();
    if answer.starts_with("HTTP/1.1 101") {
        conn.write_all(b"ping").await.unwrap();
        let mut pong = [0u8; 5];
        tokio::time::timeout(Duration::from_secs(5), conn.read_exact(&mut pong))
            .await
            .expect("the backend's answer through the tunnel")
            .unwrap();
        assert_eq!(&pong, b"pong!");
    }
    answer
}

#[tokio::test]
async fn a_tunnel_is_rate_limited_like_a_request_and_audited_when_it_closes() {
    let backend = echo_backend().await;
    let gw = Gateway::builder()
        .live(backend)
        .config(|c| {
            let mut routes = svcgate::proxy::config::default_routes();
            routes.push(RouteConfig {
                method: "GET".into(),
                path: "/v1/realtime".into(),
                scope: "realtime:connect".into(),
                price: Credits::from_micros(2_000_000),
                upgrade: true,
                reserve: None,
            });
            c.routes = routes;
            c.limits.live_requests_per_minute = 60;
            c.limits.live_burst = 1;
        })
        .start()
        .await;
    let (key_id, key) = gw.create_key("live", &["realtime:connect"]).await;
    let first = through_tunnel(&gw, &key).await;
    assert!(first.starts_with("HTTP/1.1 101"), "{first}");
    // The tunnel is one request of the key: the next, at once, is past its burst.
    let second = through_tunnel(&gw, &key).await;
    assert!(second.starts_with("HTTP/1.1 429"), "{second}");

    let mut found = None;
    for _ in 0..100 {
        let page = gw
            .admin_get(&format!(
                "/admin/v1/audit?workspace={DEMO_WS}&key_id={key_id}"
            ))
            .await;
        let records = page["data"].as_array().cloned().unwrap_or_default();
        found = records.into_iter().find(|r| r["status"] == 101);
        if found.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let record: Value = found.expect("the tunnel's audit record");
    assert_eq!(record["path"], "/v1/realtime");
    assert_eq!(record["credits"], 2.0, "the route's price, once");
    assert_eq!(record["tunnel"]["bytes_from_client"], 4, "{record}");
    assert_eq!(record["tunnel"]["bytes_to_client"], 5, "{record}");
    assert!(
        record["tunnel"]["duration_ms"].as_u64().is_some(),
        "{record}"
    );
}
