//! Backends the gateway forwards to: one that records what it receives, one that answers
//! raw bytes, one that closes every connection.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, Uri};
use axum::response::IntoResponse;
use serde_json::json;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What a backend received.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: Method,
    pub path: String,
    pub headers: HeaderMap,
    pub body: Bytes,
}

/// A backend on loopback that answers every request with the same raw bytes, and keeps the
/// first read of each request as it came (its head, for a small request): for what an HTTP
/// library would parse away, such as a header line given twice.
pub struct RawBackend {
    pub addr: SocketAddr,
    seen: Arc<Mutex<Vec<String>>>,
}

impl RawBackend {
    pub async fn start(response: &'static [u8]) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let kept = seen.clone();
        tokio::spawn(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            while let Ok((mut conn, _)) = listener.accept().await {
                let mut buf = vec![0u8; 64 * 1024];
                let n = conn.read(&mut buf).await.unwrap_or(0);
                kept.lock()
                    .unwrap()
                    .push(String::from_utf8_lossy(&buf[..n]).into_owned());
                let _ = conn.write_all(response).await;
            }
        });
        Self { addr, seen }
    }

    /// The requests so far, as they came.
    pub fn requests(&self) -> Vec<String> {
        self.seen.lock().unwrap().clone()
    }
}

/// A backend on loopback that records every request and answers with JSON and a
/// `Service-Credits` header.
pub struct RecordingUpstream {
    pub addr: SocketAddr,
    seen: Arc<Mutex<Vec<Recorded>>>,
    _task: tokio::task::JoinHandle<()>,
}

impl RecordingUpstream {
    pub async fn start(name: &'static str) -> Self {
        let seen: Arc<Mutex<Vec<Recorded>>> = Arc::default();
        let state = (seen.clone(), name);
        let app = axum::Router::new()
            .fallback(
                |State((seen, name)): State<(Arc<Mutex<Vec<Recorded>>>, &'static str)>,
                 method: Method,
                 uri: Uri,
                 headers: HeaderMap,
                 body: Bytes| async move {
                    // A test can ask for a slow answer.
                    if let Some(ms) = headers
                        .get("x-test-delay-ms")
                        .and_then(|v| v.to_str().ok())
                        .and_then(|v| v.parse().ok())
                    {
                        tokio::time::sleep(Duration::from_millis(ms)).await;
                    }
                    seen.lock().unwrap().push(Recorded {
                        method,
                        path: uri.path().to_string(),
                        headers,
                        body,
                    });
                    (
                        [
                            ("content-type", "application/json"),
                            ("service-credits", "0.5"),
                        ],
                        axum::Json(json!({"upstream": name})),
                    )
                        .into_response()
                },
            )
            .with_state(state);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Self {
            addr,
            seen,
            _task: task,
        }
    }

    /// Everything received so far.
    pub fn requests(&self) -> Vec<Recorded> {
        self.seen.lock().unwrap().clone()
    }
}

/// A backend that accepts connections and closes them without answering.
pub async fn broken_upstream() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            drop(stream);
        }
    });
    addr
}
