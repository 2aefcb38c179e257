//! A webhook receiver whose answers a test sets per path, and the signature it expects.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Uri};
use axum::response::IntoResponse;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What a webhook receiver does with a request to one path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reply {
    /// Answer with this status at once.
    Status(u16),
    /// Wait this long, then answer 200.
    Slow(Duration),
    /// Redirect elsewhere (302).
    Redirect,
    /// Answer with this status, these headers and this body.
    Full(u16, &'static [(&'static str, &'static str)], &'static str),
}

/// One request a receiver got.
#[derive(Debug, Clone)]
pub struct Received {
    pub path: String,
    pub headers: HeaderMap,
    pub body: Bytes,
    pub at: Instant,
}

type Replies = Arc<Mutex<std::collections::HashMap<String, Vec<Reply>>>>;

/// A webhook receiver on loopback that records every request; what it answers is set per path
/// (a queue of replies, the last one repeating; default 200).
pub struct Receiver {
    pub addr: SocketAddr,
    seen: Arc<Mutex<Vec<Received>>>,
    replies: Replies,
    _task: tokio::task::JoinHandle<()>,
}

impl Receiver {
    pub async fn start() -> Self {
        let seen: Arc<Mutex<Vec<Received>>> = Arc::default();
        let replies: Replies = Arc::default();
        let state = (seen.clone(), replies.clone());
        let app = axum::Router::new()
            .fallback(
                |State((seen, replies)): State<(Arc<Mutex<Vec<Received>>>, Replies)>,
                 uri: Uri,
                 headers: HeaderMap,
                 body: Bytes| async move {
                    let path = uri.path().to_string();
                    seen.lock().unwrap().push(Received {
                        path: path.clone(),
                        headers,
                        body,
                        at: Instant::now(),
                    });
                    let reply = {
                        let mut replies = replies.lock().unwrap();
                        match replies.get_mut(&path) {
                            Some(queue) if queue.len() > 1 => queue.remove(0),
                            Some(queue) => queue[0],
                            None => Reply::Status(200),
                        }
                    };
                    match reply {
                        Reply::Status(code) => axum::http::StatusCode::from_u16(code)
                            .unwrap()
                            .into_response(),
                        Reply::Slow(wait) => {
                            tokio::time::sleep(wait).await;
                            axum::http::StatusCode::OK.into_response()
                        }
                        Reply::Full(code, headers, body) => {
                            let mut response =
                                (axum::http::StatusCode::from_u16(code).unwrap(), body)
                                    .into_response();
                            for (name, value) in headers {
                                response.headers_mut().insert(
                                    axum::http::HeaderName::from_static(name),
                                    axum::http::HeaderValue::from_static(value),
                                );
                            }
                            response
                        }
                        Reply::Redirect => (
                            axum::http::StatusCode::FOUND,
                            [(axum::http::header::LOCATION, "/elsewhere")],
                        )
                            .into_response(),
                    }
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
            replies,
            _task: task,
        }
    }

    /// The URL of `path` on this receiver.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Sets what `path` answers: these replies in turn, the last one repeating.
    pub fn reply(&self, path: &str, replies: &[Reply]) {
        self.replies
            .lock()
            .unwrap()
            .insert(path.to_string(), replies.to_vec());
    }

    /// Requests to `path` so far.
    pub fn received(&self, path: &str) -> Vec<Received> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .filter(|r| r.path == path)
            .cloned()
            .collect()
    }
}

/// Lowercase hex HMAC-SHA256 of `<timestamp>.<body>` keyed with the secret's bytes, computed
/// here, independently of the crate's signing code.
pub fn expected_signature(secret: &str, timestamp: &str, body: &[u8]) -> String {
    use hmac::{Hmac, Mac};
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(secret.as_bytes()).unwrap();
    mac.update(timestamp.as_bytes());
    mac.update(b".");
    mac.update(body);
    hex::encode(mac.finalize().into_bytes())
}
