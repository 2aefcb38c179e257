//! `svcgate listen`: forwards the workspace's webhook events to a local URL.
//!
//! The gateway streams every event with a secret made for this session (see
//! [`crate::proxy::listen`]); this side POSTs each body, byte for byte, with the signature
//! headers production sends, and prints one line per delivery. It signs each delivery again
//! as it forwards it, as production signs each attempt: a backlog behind a slow receiver
//! would otherwise arrive with the time it was read from the log, and a receiver refuses a
//! signature older than five minutes.

use eventsource_stream::Eventsource;
use futures_util::StreamExt;
use serde::Deserialize;
use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;

use crate::ids::unix_now;
use crate::webhooks::endpoint::WebhookFormat;
use crate::webhooks::signature::{
    signature_headers, EVENT_ID_HEADER, SIGNATURE_HEADER, TIMESTAMP_HEADER,
};

/// A delivery succeeds on an answer within this time, as in production.
const FORWARD_TIMEOUT: Duration = Duration::from_secs(10);
/// The gateway sends a keep-alive every 15 s; silence three times as long means it is gone.
const STREAM_IDLE_TIMEOUT: Duration = Duration::from_secs(45);
/// Chunks of the stream read ahead of the forwarding.
const READ_AHEAD_CHUNKS: usize = 64;
/// Deliveries forwarded at once: a slow receiver delays the stream only once all are busy.
const MAX_IN_FLIGHT: usize = 8;

/// What to listen to and where to forward it.
pub struct Options {
    /// The API key (`webhooks:read`); sent to the gateway only, never printed.
    pub api_key: String,
    /// Where deliveries are POSTed.
    pub forward_to: url::Url,
    /// Event names and `resource.*` wildcards; empty means every event.
    pub events: Vec<String>,
    /// The gateway's base URL.
    pub gateway_url: String,
    /// The signature headers forwards carry, as an endpoint of this format gets them.
    pub format: WebhookFormat,
}

#[derive(Deserialize)]
struct SessionData {
    secret: String,
}

/// One signed delivery, as the gateway streams it.
#[derive(Deserialize)]
struct Delivery {
    event_id: String,
    event_type: String,
    timestamp: u64,
    signature: String,
    body: String,
}

impl Delivery {
    /// The signature headers of the delivery as it leaves for the receiver: signed again
    /// with the session's `secret` at `now`, in `format`; without the secret (none came), as
    /// the gateway signed it.
    fn signed(
        &self,
        format: WebhookFormat,
        secret: Option<&str>,
        now: u64,
    ) -> [(&'static str, String); 3] {
        match secret {
            Some(secret) => {
                signature_headers(format, &[secret], &self.event_id, now, self.body.as_bytes())
            }
            None => [
                (SIGNATURE_HEADER, self.signature.clone()),
                (TIMESTAMP_HEADER, self.timestamp.to_string()),
                (EVENT_ID_HEADER, self.event_id.clone()),
            ],
        }
    }
}

/// Streams and forwards until the stream ends; the reason it ended.
pub async fn run(options: Options) -> Result<(), String> {
    let base = options.gateway_url.trim_end_matches('/');
    let stream_client = reqwest::Client::builder()
        .connect_timeout(FORWARD_TIMEOUT)
        .build()
        .map_err(|e| format!("cannot start an HTTP client: {e}"))?;
    let forward_client = reqwest::Client::builder()
        .timeout(FORWARD_TIMEOUT)
        .redirect(reqwest::redirect::Policy::none())
        .user_agent(concat!("svcgate-listen/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| format!("cannot start an HTTP client: {e}"))?;

    let mut request = stream_client
        .get(format!("{base}/v1/webhooks/listen"))
        .bearer_auth(&options.api_key)
        .header(http::header::ACCEPT, "text/event-stream");
    if !options.events.is_empty() {
        request = request.query(&[("events", options.events.join(","))]);
    }
    // The stream's reads have their own idle limit (`read_ahead`); the answer's head, and an
    // error's body, get the same.
    let silent = || format!("the gateway at {base} did not answer");
    let response = tokio::time::timeout(STREAM_IDLE_TIMEOUT, request.send())
        .await
        .map_err(|_| silent())?
        .map_err(|e| format!("cannot reach the gateway at {base}: {}", causes(&e)))?;
    let status = response.status();
    if status != reqwest::StatusCode::OK {
        let body = tokio::time::timeout(STREAM_IDLE_TIMEOUT, response.json())
            .await
            .map_err(|_| silent())?
            .unwrap_or_default();
        return Err(super::api_error(Some(status.as_u16()), &body));
    }

    let in_flight = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    let forward_to = Arc::new(options.forward_to);
    let mut secret: Option<Arc<str>> = None;
    let mut events = read_ahead(response.bytes_stream(), STREAM_IDLE_TIMEOUT).eventsource();
    let ended = loop {
        let event = match events.next().await {
            Some(Ok(event)) => event,
            Some(Err(e)) => break format!("lost the stream from the gateway: {e}"),
            None => break "the gateway closed the stream".to_string(),
        };
        match event.event.as_str() {
            "session" => match serde_json::from_str::<SessionData>(&event.data) {
                Ok(session) => {
                    say(&format!(
                        "Ready. Webhook signing secret for this session: {}",
                        session.secret
                    ));
                    secret = Some(session.secret.into());
                    say(&format!(
                        "Forwarding events to {forward_to} (Ctrl-C to stop)"
                    ));
                }
                Err(e) => break format!("unreadable session from the gateway: {e}"),
            },
            "delivery" => {
                let delivery: Delivery = match serde_json::from_str(&event.data) {
                    Ok(d) => d,
                    Err(e) => {
                        eprintln!("svcgate: skipped an unreadable delivery: {e}");
                        continue;
                    }
                };
                let Ok(permit) = in_flight.clone().acquire_owned().await else {
                    break "stopped forwarding".to_string();
                };
                let (client, url) = (forward_client.clone(), forward_to.clone());
                let secret = secret.clone();
                let format = options.format;
                tokio::spawn(async move {
                    let headers = delivery.signed(format, secret.as_deref(), unix_now());
                    say(&forward(&client, &url, delivery, headers).await);
                    drop(permit);
                });
            }
            "error" => {
                let body = serde_json::from_str(&event.data).unwrap_or_default();
                break format!(
                    "the gateway ended the stream: {}",
                    super::api_error(None, &body)
                );
            }
            _ => {}
        }
    };
    // Let deliveries already on their way finish and print their line.
    let _ = in_flight.acquire_many(MAX_IN_FLIGHT as u32).await;
    Err(ended)
}

/// POSTs one delivery and describes the outcome in one line.
async fn forward(
    client: &reqwest::Client,
    url: &url::Url,
    delivery: Delivery,
    headers: [(&'static str, String); 3],
) -> String {
    let started = Instant::now();
    let received = now_utc();
    let mut request = client
        .post(url.clone())
        .header(http::header::CONTENT_TYPE, "application/json");
    for (name, value) in headers {
        request = request.header(name, value);
    }
    let outcome = request.body(delivery.body).send().await;
    let result = match outcome {
        Ok(response) => {
            let status = response.status().as_u16();
            // Read the answer so the connection can be reused; its content is not shown.
            let _ = response.bytes().await;
            status.to_string()
        }
        Err(e) => format!("failed: {}", failure(&e)),
    };
    format!(
        "{received}  {}  {}  -> {result} ({} ms)",
        delivery.event_type,
        delivery.event_id,
        started.elapsed().as_millis()
    )
}

/// Why a forward failed, briefly: `connection refused`, `timed out after 10 s`, …
fn failure(e: &reqwest::Error) -> String {
    if e.is_timeout() {
        return format!("timed out after {} s", FORWARD_TIMEOUT.as_secs());
    }
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    let mut innermost = e.to_string();
    while let Some(err) = source {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            // An OS error's kind reads best ("connection refused"); others say more themselves.
            return match io.raw_os_error() {
                Some(_) => io.kind().to_string(),
                None => io.to_string(),
            };
        }
        innermost = err.to_string();
        source = err.source();
    }
    innermost
}

/// An error and its causes, as one line.
fn causes(e: &(dyn std::error::Error + 'static)) -> String {
    let mut line = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        line.push_str(": ");
        line.push_str(&cause.to_string());
        source = cause.source();
    }
    line
}

/// `YYYY-MM-DD HH:MM:SS`, UTC.
fn now_utc() -> String {
    let t = time::OffsetDateTime::now_utc();
    format!(
        "{:04}-{:02}-{:02} {:02}:{:02}:{:02}",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second()
    )
}

/// Prints a line at once (stdout may be a pipe); a closed stdout is not worth a panic.
fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// Reads `body` in a task of its own, a few chunks ahead, and hands the chunks on; fails the
/// stream when the gateway sends nothing (not even its keep-alive) for `idle`. The body is read
/// whatever the forwarding is doing: were it read only when the next event is wanted, a burst
/// waiting behind a slow receiver would leave it unread longer than `idle`, and the stream
/// would be taken for dead with data waiting.
fn read_ahead<S, E>(
    mut body: S,
    idle: Duration,
) -> impl futures_util::Stream<Item = Result<bytes::Bytes, String>> + Unpin
where
    S: futures_util::Stream<Item = Result<bytes::Bytes, E>> + Send + Unpin + 'static,
    E: std::error::Error + Send + 'static,
{
    let (tx, mut rx) = tokio::sync::mpsc::channel(READ_AHEAD_CHUNKS);
    tokio::spawn(async move {
        loop {
            let chunk = match tokio::time::timeout(idle, body.next()).await {
                Ok(Some(Ok(chunk))) => Ok(chunk),
                Ok(Some(Err(e))) => Err(causes(&e)),
                Ok(None) => return,
                Err(_) => Err(format!("nothing from the gateway for {} s", idle.as_secs())),
            };
            let failed = chunk.is_err();
            if tx.send(chunk).await.is_err() || failed {
                return;
            }
        }
    });
    futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_stream_is_read_ahead_while_forwarding_is_slow() {
        // Three chunks at once, then the gateway holds the stream open without a word.
        let chunks = futures_util::stream::iter(
            ["a", "b", "c"].map(|c| Ok::<_, std::io::Error>(bytes::Bytes::from(c))),
        )
        .chain(futures_util::stream::pending());
        let mut stream = Box::pin(read_ahead(chunks, Duration::from_secs(45)));
        assert_eq!(stream.next().await.unwrap().unwrap(), "a");
        // Forwarding takes longer than the idle limit: what was sent is still there.
        tokio::time::sleep(Duration::from_secs(100)).await;
        assert_eq!(stream.next().await.unwrap().unwrap(), "b");
        assert_eq!(stream.next().await.unwrap().unwrap(), "c");
        // Silence past the limit ends the stream with a reason.
        let err = stream.next().await.unwrap().unwrap_err();
        assert!(err.contains("nothing from the gateway"), "{err}");
        assert!(stream.next().await.is_none());
    }
    use crate::webhooks::signature::{sign, verify};

    #[test]
    fn a_delivery_that_waited_is_signed_again_when_it_leaves_in_the_format_asked() {
        let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
        let now = unix_now();
        let read_at = now - 400;
        let body = r#"{"id":"evt_1","type":"agent.run.completed"}"#.to_string();
        let waited = Delivery {
            event_id: "evt_1".into(),
            event_type: "agent.run.completed".into(),
            timestamp: read_at,
            signature: sign(secret, read_at, body.as_bytes()),
            body,
        };
        let map = |headers: [(&'static str, String); 3]| {
            let mut h = http::HeaderMap::new();
            for (name, value) in headers {
                h.insert(name, value.parse().unwrap());
            }
            h
        };
        let as_read = map(waited.signed(WebhookFormat::Service, None, now));
        assert!(verify(secret, &as_read, waited.body.as_bytes(), now).is_err());
        for format in [WebhookFormat::Service, WebhookFormat::StandardWebhooks] {
            let sent = map(waited.signed(format, Some(secret), now));
            verify(secret, &sent, waited.body.as_bytes(), now).unwrap();
            let standard = sent.contains_key("webhook-signature");
            assert_eq!(standard, format == WebhookFormat::StandardWebhooks);
        }
    }
}
