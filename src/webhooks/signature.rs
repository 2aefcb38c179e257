//! Delivery signatures, both sides, in the two formats an endpoint may choose
//! ([`WebhookFormat`]).
//!
//! - **service** (the default): `Service-Timestamp` (unix seconds) and `Service-Signature`,
//!   the lowercase hex HMAC-SHA256 of `<timestamp>.<raw body>` keyed with the UTF-8 bytes of
//!   the endpoint's secret exactly as shown (`whsec_…` included), and `Service-Event-Id`.
//! - **standard-webhooks**: `webhook-id` (the event id), `webhook-timestamp` and
//!   `webhook-signature`, `v1,` and the base64 HMAC-SHA256 of `<id>.<timestamp>.<raw body>`
//!   keyed with the secret's base64-decoded bytes (after `whsec_`), as the Standard Webhooks
//!   specification has it.
//!
//! During a secret rotation a delivery carries one signature per secret: comma-separated hex
//! in `Service-Signature`, space-separated `v1,` entries in `webhook-signature`. [`sign`] and
//! [`signature_headers`] are what the worker does; [`verify`] is what a receiver does, in
//! either format: timing-safe comparison against every listed signature, and at most
//! [`TOLERANCE_SECS`] between the timestamp and the receiver's clock.

use base64::Engine;
use hmac::{Hmac, Mac};
use http::HeaderMap;
use sha2::Sha256;
use subtle::ConstantTimeEq;

use super::endpoint::WebhookFormat;

/// Header with the signature.
pub const SIGNATURE_HEADER: &str = "service-signature";
/// Header with the signing time.
pub const TIMESTAMP_HEADER: &str = "service-timestamp";
/// Header with the event id, the same on every retry and replay.
pub const EVENT_ID_HEADER: &str = "service-event-id";
/// Standard Webhooks: the event id.
pub const STANDARD_ID_HEADER: &str = "webhook-id";
/// Standard Webhooks: the signing time.
pub const STANDARD_TIMESTAMP_HEADER: &str = "webhook-timestamp";
/// Standard Webhooks: the signatures, `v1,<base64>`, space-separated.
pub const STANDARD_SIGNATURE_HEADER: &str = "webhook-signature";
/// Largest accepted difference between a delivery's timestamp and now.
pub const TOLERANCE_SECS: u64 = 300;
/// Most signatures a receiver compares in one header: a rotation lists two.
const MAX_SIGNATURES: usize = 8;

/// Why a delivery is not to be trusted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    /// A signature header is missing or unreadable.
    #[error("missing or malformed signature headers")]
    MissingHeaders,
    /// The timestamp is more than [`TOLERANCE_SECS`] away from now (a replay, or a bad clock).
    #[error("timestamp outside the tolerance")]
    Stale,
    /// No listed signature matches the body and timestamp.
    #[error("signature mismatch")]
    BadSignature,
}

/// The service-format signature of `body` sent at `timestamp`, as lowercase hex.
pub fn sign(secret: &str, timestamp: u64, body: &[u8]) -> String {
    hex::encode(mac(secret.as_bytes(), None, timestamp, body))
}

/// The Standard Webhooks signature of `body` of event `id` sent at `timestamp`: `v1,<base64>`.
pub fn sign_standard(secret: &str, id: &str, timestamp: u64, body: &[u8]) -> String {
    let mac = mac(&standard_key(secret), Some(id.as_bytes()), timestamp, body);
    format!(
        "v1,{}",
        base64::engine::general_purpose::STANDARD.encode(mac)
    )
}

/// The headers that sign a delivery of event `event_id` with `body` at `timestamp`, in
/// `format`, one signature per secret of `secrets` (current first): names in lower case.
pub fn signature_headers(
    format: WebhookFormat,
    secrets: &[&str],
    event_id: &str,
    timestamp: u64,
    body: &[u8],
) -> [(&'static str, String); 3] {
    match format {
        WebhookFormat::Service => {
            let signatures: Vec<String> =
                secrets.iter().map(|s| sign(s, timestamp, body)).collect();
            [
                (SIGNATURE_HEADER, signatures.join(",")),
                (TIMESTAMP_HEADER, timestamp.to_string()),
                (EVENT_ID_HEADER, event_id.to_string()),
            ]
        }
        WebhookFormat::StandardWebhooks => {
            let signatures: Vec<String> = secrets
                .iter()
                .map(|s| sign_standard(s, event_id, timestamp, body))
                .collect();
            [
                (STANDARD_SIGNATURE_HEADER, signatures.join(" ")),
                (STANDARD_TIMESTAMP_HEADER, timestamp.to_string()),
                (STANDARD_ID_HEADER, event_id.to_string()),
            ]
        }
    }
}

/// The key of a Standard Webhooks secret: the base64 after `whsec_` (padded or not). A secret
/// that is not base64 (svcgate makes none) keys with its bytes after the prefix.
fn standard_key(secret: &str) -> Vec<u8> {
    use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD};
    let encoded = secret.strip_prefix("whsec_").unwrap_or(secret);
    STANDARD
        .decode(encoded)
        .or_else(|_| STANDARD_NO_PAD.decode(encoded))
        .unwrap_or_else(|_| encoded.as_bytes().to_vec())
}

fn mac(key: &[u8], id: Option<&[u8]>, timestamp: u64, body: &[u8]) -> [u8; 32] {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes any key length");
    if let Some(id) = id {
        mac.update(id);
        mac.update(b".");
    }
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    mac.finalize().into_bytes().into()
}

/// Checks a delivery as a receiver must, in whichever format it came (`webhook-signature`
/// present: Standard Webhooks; otherwise the service format): the headers present, the
/// timestamp within [`TOLERANCE_SECS`] of `now` (unix seconds), and one of the listed
/// signatures equal — compared in constant time — to the HMAC of the signed content. During a
/// rotation either secret verifies.
pub fn verify(secret: &str, headers: &HeaderMap, body: &[u8], now: u64) -> Result<(), VerifyError> {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let standard = headers.contains_key(STANDARD_SIGNATURE_HEADER);
    let (timestamp, signatures, id) = match standard {
        true => (
            header(STANDARD_TIMESTAMP_HEADER),
            header(STANDARD_SIGNATURE_HEADER),
            Some(header(STANDARD_ID_HEADER).ok_or(VerifyError::MissingHeaders)?),
        ),
        false => (header(TIMESTAMP_HEADER), header(SIGNATURE_HEADER), None),
    };
    let timestamp: u64 = timestamp
        .and_then(|t| t.trim().parse().ok())
        .ok_or(VerifyError::MissingHeaders)?;
    let signatures = signatures.ok_or(VerifyError::MissingHeaders)?;
    if timestamp.abs_diff(now) > TOLERANCE_SECS {
        return Err(VerifyError::Stale);
    }
    let (expected, listed): ([u8; 32], Vec<&str>) = match id {
        Some(id) => (
            mac(&standard_key(secret), Some(id.as_bytes()), timestamp, body),
            signatures.split(' ').filter(|s| !s.is_empty()).collect(),
        ),
        None => (
            mac(secret.as_bytes(), None, timestamp, body),
            signatures.split(',').map(str::trim).collect(),
        ),
    };
    let mut matched = subtle::Choice::from(0);
    for signature in listed.into_iter().take(MAX_SIGNATURES) {
        let mut presented = [0u8; 32];
        let decoded = match id {
            Some(_) => signature
                .strip_prefix("v1,")
                .and_then(|b64| base64::engine::general_purpose::STANDARD.decode(b64).ok())
                .filter(|raw| raw.len() == 32)
                .map(|raw| presented.copy_from_slice(&raw))
                .is_some(),
            None => hex::decode_to_slice(signature, &mut presented).is_ok(),
        };
        if decoded {
            matched |= expected.ct_eq(&presented);
        }
    }
    if bool::from(matched) {
        Ok(())
    } else {
        Err(VerifyError::BadSignature)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    const SECRET: &str = "whsec_test_secret";

    fn headers(timestamp: &str, signature: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(TIMESTAMP_HEADER, HeaderValue::from_str(timestamp).unwrap());
        h.insert(SIGNATURE_HEADER, HeaderValue::from_str(signature).unwrap());
        h
    }

    #[test]
    fn signs_timestamp_dot_body_with_the_secret_bytes() {
        // Independent computation: HMAC-SHA256("whsec_test_secret", "1700000000.{}").
        let mut m = Hmac::<Sha256>::new_from_slice(b"whsec_test_secret").unwrap();
        m.update(b"1700000000.{}");
        let expected = hex::encode(m.finalize().into_bytes());
        assert_eq!(sign(SECRET, 1_700_000_000, b"{}"), expected);
        assert_eq!(expected.len(), 64);
        assert!(expected
            .chars()
            .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c)));
    }

    #[test]
    fn verifies_good_deliveries_and_refuses_bad_ones() {
        let body = br#"{"id":"evt_1","type":"agent.run.completed"}"#;
        let now = 1_700_000_000;
        let sig = sign(SECRET, now, body);
        assert_eq!(
            verify(SECRET, &headers(&now.to_string(), &sig), body, now),
            Ok(())
        );
        assert_eq!(
            verify(SECRET, &headers(&now.to_string(), &sig), body, now + 300),
            Ok(())
        );
        assert_eq!(
            verify(SECRET, &headers(&now.to_string(), &sig), body, now + 301),
            Err(VerifyError::Stale)
        );
        assert_eq!(
            verify(SECRET, &headers(&now.to_string(), &sig), b"{}", now),
            Err(VerifyError::BadSignature)
        );
        assert_eq!(
            verify("whsec_other", &headers(&now.to_string(), &sig), body, now),
            Err(VerifyError::BadSignature)
        );
        assert_eq!(
            verify(SECRET, &headers(&(now + 1).to_string(), &sig), body, now),
            Err(VerifyError::BadSignature)
        );
        assert_eq!(
            verify(SECRET, &headers(&now.to_string(), "zz"), body, now),
            Err(VerifyError::BadSignature)
        );
        assert_eq!(
            verify(SECRET, &HeaderMap::new(), body, now),
            Err(VerifyError::MissingHeaders)
        );
        // During a rotation, either listed signature verifies; a third secret does not.
        let both = format!("{},{sig}", sign("whsec_new", now, body));
        for secret in [SECRET, "whsec_new"] {
            assert_eq!(
                verify(secret, &headers(&now.to_string(), &both), body, now),
                Ok(())
            );
        }
        assert_eq!(
            verify("whsec_third", &headers(&now.to_string(), &both), body, now),
            Err(VerifyError::BadSignature)
        );
        assert_eq!(
            verify(SECRET, &headers("yesterday", &sig), body, now),
            Err(VerifyError::MissingHeaders)
        );
    }

    fn standard(id: &str, timestamp: u64, signatures: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(STANDARD_ID_HEADER, HeaderValue::from_str(id).unwrap());
        h.insert(STANDARD_TIMESTAMP_HEADER, timestamp.into());
        h.insert(
            STANDARD_SIGNATURE_HEADER,
            HeaderValue::from_str(signatures).unwrap(),
        );
        h
    }

    #[test]
    fn standard_webhooks_signatures_match_the_specifications_example() {
        // The example of the Standard Webhooks specification's reference libraries.
        let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
        let body = br#"{"test": 2432232314}"#;
        let id = "msg_p5jXN8AQM9LWM0D4loKWxJek";
        assert_eq!(
            sign_standard(secret, id, 1614265330, body),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
    }

    #[test]
    fn standard_webhooks_deliveries_verify_with_any_listed_secret() {
        let body = br#"{"id":"evt_1"}"#;
        let now = 1_700_000_000;
        let (new, old) = (
            "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
            "whsec_c2VjcmV0LXRoYXQtaXMtb2xkLWFuZC1sb25n",
        );
        let signed = signature_headers(
            WebhookFormat::StandardWebhooks,
            &[new, old],
            "evt_1",
            now,
            body,
        );
        let mut h = HeaderMap::new();
        for (name, value) in &signed {
            h.insert(*name, HeaderValue::from_str(value).unwrap());
        }
        assert_eq!(signed[0].1.split(' ').count(), 2);
        assert!(signed[0].1.split(' ').all(|s| s.starts_with("v1,")));
        assert_eq!(verify(new, &h, body, now), Ok(()));
        assert_eq!(verify(old, &h, body, now), Ok(()));
        assert_eq!(verify(old, &h, body, now + 301), Err(VerifyError::Stale));
        assert_eq!(
            verify("whsec_b3RoZXI=", &h, body, now),
            Err(VerifyError::BadSignature)
        );
        assert_eq!(verify(new, &h, b"{}", now), Err(VerifyError::BadSignature));
        // The id is signed: another event's id does not verify.
        let sig = sign_standard(new, "evt_1", now, body);
        assert_eq!(
            verify(new, &standard("evt_2", now, &sig), body, now),
            Err(VerifyError::BadSignature)
        );
        assert_eq!(
            verify(new, &standard("evt_1", now, "v2,abc v1,!!"), body, now),
            Err(VerifyError::BadSignature)
        );
        h.remove(STANDARD_ID_HEADER);
        assert_eq!(verify(new, &h, body, now), Err(VerifyError::MissingHeaders));
    }
}
