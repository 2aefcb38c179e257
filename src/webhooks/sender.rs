//! One signed POST to one endpoint, guarded against server-side request forgery.
//!
//! The guard checks the address actually dialled, not the URL's host name: names are resolved
//! by [`PublicOnly`], which hands the connector public addresses only, so a name that resolves
//! (or re-resolves, as in DNS rebinding) to an internal address is never dialled. Address
//! literals never reach a resolver, so they are checked before sending. Redirects are not
//! followed: a 3xx is a failure like any other non-2xx.

use bytes::Bytes;
use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::ids::{unix_millis, unix_now};
use crate::telemetry::TraceHeaders;
use crate::webhooks::delivery::{Attempt, RESPONSE_BODY_KEPT};
use crate::webhooks::endpoint::{is_internal, Endpoint};
use crate::webhooks::schedule::parse_retry_after;
use crate::webhooks::signature::signature_headers;

/// Most response bytes read (and discarded) so the connection can be reused.
const RESPONSE_READ_LIMIT: usize = 64 * 1024;

/// Sends deliveries.
#[derive(Clone)]
pub struct Sender {
    client: reqwest::Client,
    allow_insecure: bool,
    timeout: Duration,
}

impl Sender {
    /// A sender whose attempts succeed on a 2xx within `timeout`. With `allow_insecure`,
    /// `http://` and internal addresses are allowed (development and tests).
    pub fn new(timeout: Duration, allow_insecure: bool) -> Result<Self, String> {
        let mut builder = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout.min(Duration::from_secs(5)))
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .user_agent(concat!("svcgate-webhooks/", env!("CARGO_PKG_VERSION")))
            .pool_idle_timeout(Duration::from_secs(60));
        if !allow_insecure {
            builder = builder.https_only(true).dns_resolver(Arc::new(PublicOnly));
        }
        let client = builder
            .build()
            .map_err(|e| format!("cannot build the HTTP client: {e}"))?;
        Ok(Self {
            client,
            allow_insecure,
            timeout,
        })
    }

    /// POSTs `payload`, the body of the event `event_id` ([`crate::webhooks::delivery::body`]),
    /// to `endpoint`, signed in its format with its secrets (two during a rotation), with the
    /// attempt's trace context (`trace`, empty when not traced). The attempts of one event in
    /// flight share one copy of the payload.
    pub async fn send(
        &self,
        endpoint: &Endpoint,
        event_id: &str,
        payload: Bytes,
        trace: &TraceHeaders,
    ) -> Attempt {
        let at_ms = unix_millis();
        let started = Instant::now();
        let result = self.post(endpoint, event_id, payload, trace).await;
        let duration_ms = started.elapsed().as_millis() as u64;
        let (answer, error) = match result {
            Ok(a) if (200..300).contains(&a.status) => (Some(a), None),
            Ok(a) if (300..400).contains(&a.status) => {
                let error = format!("HTTP {}: redirects are not followed", a.status);
                (Some(a), Some(error))
            }
            Ok(a) => {
                let error = format!("HTTP {}", a.status);
                (Some(a), Some(error))
            }
            Err(error) => (None, Some(error)),
        };
        let (status_code, response_body, retry_after) = match answer {
            Some(a) => (Some(a.status), a.body, a.retry_after),
            None => (None, None, None),
        };
        Attempt {
            at_ms,
            status_code,
            error,
            duration_ms,
            url: Some(endpoint.url.clone()),
            response_body,
            retry_after,
        }
    }

    async fn post(
        &self,
        endpoint: &Endpoint,
        event_id: &str,
        payload: Bytes,
        trace: &TraceHeaders,
    ) -> Result<Answer, String> {
        let url = reqwest::Url::parse(&endpoint.url).map_err(|e| format!("bad URL: {e}"))?;
        if !self.allow_insecure {
            let literal = match url.host() {
                Some(url::Host::Ipv4(ip)) => Some(std::net::IpAddr::V4(ip)),
                Some(url::Host::Ipv6(ip)) => Some(std::net::IpAddr::V6(ip)),
                _ => None,
            };
            if let Some(ip) = literal.filter(is_internal) {
                return Err(format!("refused: {ip} is an internal address"));
            }
        }
        let timestamp = unix_now();
        let signed = signature_headers(
            endpoint.format,
            &endpoint.signing_secrets(timestamp),
            event_id,
            timestamp,
            &payload,
        );
        let mut request = self
            .client
            .post(url)
            .header(http::header::CONTENT_TYPE, "application/json");
        for (name, value) in signed {
            request = request.header(name, value);
        }
        for (name, value) in [
            ("traceparent", &trace.traceparent),
            ("tracestate", &trace.tracestate),
        ] {
            if let Some(value) = value {
                request = request.header(name, value);
            }
        }
        let mut response = request
            .body(payload)
            .send()
            .await
            .map_err(|e| self.describe(&e))?;
        let status = response.status().as_u16();
        let retry_after = match status {
            429 | 503 => response
                .headers()
                .get(http::header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| parse_retry_after(v, std::time::SystemTime::now())),
            _ => None,
        };
        // The answer is its status (success: a 2xx within the timeout). The body is read so
        // the connection can serve the next attempt, and its start is kept for the listing;
        // one that breaks off or stalls past the timeout costs the connection, not the
        // delivery.
        let mut kept: Vec<u8> = Vec::new();
        let mut read = 0;
        while read < RESPONSE_READ_LIMIT {
            match response.chunk().await {
                Ok(Some(chunk)) => {
                    read += chunk.len();
                    let room = RESPONSE_BODY_KEPT.saturating_sub(kept.len());
                    kept.extend_from_slice(&chunk[..chunk.len().min(room)]);
                }
                Ok(None) | Err(_) => break,
            }
        }
        Ok(Answer {
            status,
            body: (!kept.is_empty()).then(|| kept_text(&kept)),
            retry_after,
        })
    }

    fn describe(&self, e: &reqwest::Error) -> String {
        if e.is_timeout() {
            return format!("no answer within {} s", self.timeout.as_secs());
        }
        let mut text = if e.is_connect() {
            "cannot connect".to_string()
        } else {
            "request failed".to_string()
        };
        let mut source = std::error::Error::source(e);
        while let Some(s) = source {
            text.push_str(": ");
            text.push_str(&s.to_string());
            source = s.source();
        }
        text
    }
}

/// What an endpoint answered.
struct Answer {
    status: u16,
    /// The start of the body ([`RESPONSE_BODY_KEPT`] bytes).
    body: Option<String>,
    /// `Retry-After` of a 429 or 503.
    retry_after: Option<Duration>,
}

/// The kept start of a body as text: invalid UTF-8 replaced, and a character the cut split
/// left out.
fn kept_text(bytes: &[u8]) -> String {
    let text = match std::str::from_utf8(bytes) {
        Ok(text) => text,
        // Cut in the middle of a character: up to it.
        Err(e) if e.error_len().is_none() => {
            return String::from_utf8_lossy(&bytes[..e.valid_up_to()]).into_owned()
        }
        Err(_) => return String::from_utf8_lossy(bytes).into_owned(),
    };
    text.to_string()
}

/// Resolves host names to their public addresses only; a name with none fails.
struct PublicOnly;

impl Resolve for PublicOnly {
    fn resolve(&self, name: Name) -> Resolving {
        Box::pin(async move {
            let host = name.as_str().to_string();
            let found = super::dns::lookup(&host)
                .await
                .map_err(|e| format!("{host}: {e}"))?;
            let public: Vec<SocketAddr> = found
                .into_iter()
                .filter(|ip| !is_internal(ip))
                .map(|ip| SocketAddr::new(ip, 0))
                .collect();
            if public.is_empty() {
                return Err(format!("refused: {host} resolves only to internal addresses").into());
            }
            Ok(Box::new(public.into_iter()) as Addrs)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::Event;
    use crate::keys::Environment;
    use crate::webhooks::delivery::body;
    use crate::webhooks::endpoint::EndpointStatus;

    fn endpoint(url: &str) -> Endpoint {
        Endpoint {
            id: "we_1".into(),
            workspace: "ws_1".into(),
            environment: Environment::Live,
            url: url.into(),
            events: vec!["agent.run.*".into()],
            secret: "whsec_x".into(),
            status: EndpointStatus::Active,
            created_at: 0,
            format: Default::default(),
            previous_secret: None,
            previous_secret_until: None,
            rate_limit_per_second: None,
        }
    }

    /// A 2xx is a success even when the body after it breaks off: the receiver has the event.
    #[tokio::test]
    async fn a_2xx_whose_body_breaks_off_is_a_success() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut conn, _) = listener.accept().await.unwrap();
            let mut buf = vec![0; 64 * 1024];
            let _ = conn.read(&mut buf).await;
            // 100 bytes promised, 2 sent, then the connection closes.
            let _ = conn
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nok")
                .await;
        });
        let sender = Sender::new(Duration::from_secs(2), true).unwrap();
        let event = Event::new(
            "agent.run.completed",
            "ws_1",
            Environment::Live,
            "{}".parse().unwrap(),
        );
        let attempt = sender
            .send(
                &endpoint(&format!("http://{addr}/hook")),
                &event.id,
                body(&event).into(),
                &TraceHeaders::default(),
            )
            .await;
        assert_eq!(attempt.status_code, Some(200));
        assert_eq!(attempt.error, None);
    }

    /// The guard holds at dial time, whatever the endpoint record says: an endpoint stored
    /// before a name started resolving inside (DNS rebinding) is never dialled there.
    #[tokio::test]
    async fn internal_addresses_are_never_dialled() {
        let sender = Sender::new(Duration::from_secs(2), false).unwrap();
        let event = Event::new(
            "agent.run.completed",
            "ws_1",
            Environment::Live,
            "{}".parse().unwrap(),
        );
        for url in [
            "https://127.0.0.1:1/hook",
            "https://10.0.0.1/hook",
            "https://169.254.169.254/latest/meta-data",
            "https://[::1]:1/hook",
            "https://localhost:1/hook",
        ] {
            let attempt = sender
                .send(
                    &endpoint(url),
                    &event.id,
                    body(&event).into(),
                    &TraceHeaders::default(),
                )
                .await;
            let error = attempt.error.unwrap_or_default();
            assert!(error.contains("internal"), "{url}: {error}");
            assert_eq!(attempt.status_code, None);
        }
        let attempt = sender
            .send(
                &endpoint("http://example.com/hook"),
                &event.id,
                body(&event).into(),
                &TraceHeaders::default(),
            )
            .await;
        // Refused before any lookup or connection: the error is the scheme's, not the
        // network's (this machine may have no route to example.com at all).
        let error = attempt.error.unwrap_or_default();
        assert!(
            error.contains("scheme"),
            "plain http without allow_insecure: {error}"
        );
    }
}
