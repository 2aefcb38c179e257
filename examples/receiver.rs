//! A reference webhook receiver: verifies every delivery before trusting it, answers fast,
//! and deduplicates on the event id.
//!
//! - 200: verified (a repeated event id is acknowledged again and not processed twice);
//! - 400: the timestamp is more than 300 s away (stale: a replay, or a clock off), or the
//!   `Service-Event-Id` header is not the signed body's `id`;
//! - 401: missing or bad signature.
//!
//! It takes either delivery format (`Service-Signature…`, or Standard Webhooks'
//! `webhook-signature…`), and any one listed signature that matches: during a secret rotation
//! a delivery carries the new and the old secret's.
//!
//! Deduplication keys on the `id` inside the signed body: the header is outside the signature,
//! so a replayed delivery with a new header id must not pass as a new event.
//!
//! ```sh
//! SVCGATE_WEBHOOK_SECRET=whsec_… cargo run --example receiver -- 127.0.0.1:4000
//! svcgate listen --api-key $KEY --forward-to http://127.0.0.1:4000/
//! ```

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use svcgate::webhooks::signature::{EVENT_ID_HEADER, STANDARD_ID_HEADER};
use svcgate::webhooks::{verify, VerifyError};

struct Receiver {
    secret: String,
    seen: Mutex<HashSet<String>>,
}

async fn receive(State(r): State<Arc<Receiver>>, headers: HeaderMap, body: Bytes) -> StatusCode {
    // Verify over the raw body, before parsing anything.
    match verify(&r.secret, &headers, &body, svcgate::ids::unix_now()) {
        Err(VerifyError::Stale) => return StatusCode::BAD_REQUEST,
        Err(_) => return StatusCode::UNAUTHORIZED,
        Ok(()) => {}
    }
    #[derive(serde::Deserialize)]
    struct Signed {
        id: String,
    }
    let Ok(Signed { id: event_id }) = serde_json::from_slice::<Signed>(&body) else {
        return StatusCode::BAD_REQUEST;
    };
    let header_id = headers
        .get(EVENT_ID_HEADER)
        .or_else(|| headers.get(STANDARD_ID_HEADER))
        .and_then(|v| v.to_str().ok());
    if header_id != Some(event_id.as_str()) {
        return StatusCode::BAD_REQUEST;
    }
    let first_time = r
        .seen
        .lock()
        .map(|mut s| s.insert(event_id.clone()))
        .unwrap_or(true);
    if first_time {
        // Acknowledge now; heavy work belongs on a queue after the 2xx.
        println!("event {event_id}: {}", String::from_utf8_lossy(&body));
    } else {
        println!("event {event_id}: duplicate, acknowledged");
    }
    StatusCode::OK
}

#[tokio::main]
async fn main() {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:4000".into());
    let secret = std::env::var("SVCGATE_WEBHOOK_SECRET").expect("set SVCGATE_WEBHOOK_SECRET");
    let state = Arc::new(Receiver {
        secret,
        seen: Mutex::new(HashSet::new()),
    });
    let app = axum::Router::new().fallback(receive).with_state(state);
    let listener = tokio::net::TcpListener::bind(&addr).await.expect("bind");
    axum::serve(listener, app).await.expect("serve");
}
