//! Delivery signatures, both sides.
//!
//! A delivery carries `Service-Timestamp` (unix seconds) and `Service-Signature`, the lowercase
//! hex HMAC-SHA256 of `<timestamp>.<raw body>` keyed with the UTF-8 bytes of the endpoint's
//! secret exactly as shown (`whsec_…` included). [`sign`] is what the worker does; [`verify`]
//! is what a receiver does: timing-safe comparison, and at most [`TOLERANCE_SECS`] between the
//! timestamp and the receiver's clock.

use hmac::{Hmac, Mac};
use http::HeaderMap;
use sha2::Sha256;
use subtle::ConstantTimeEq;

/// Header with the signature.
pub const SIGNATURE_HEADER: &str = "service-signature";
/// Header with the signing time.
pub const TIMESTAMP_HEADER: &str = "service-timestamp";
/// Header with the event id, the same on every retry and replay.
pub const EVENT_ID_HEADER: &str = "service-event-id";
/// Largest accepted difference between a delivery's timestamp and now.
pub const TOLERANCE_SECS: u64 = 300;

/// Why a delivery is not to be trusted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    /// A signature header is missing or unreadable.
    #[error("missing or malformed signature headers")]
    MissingHeaders,
    /// The timestamp is more than [`TOLERANCE_SECS`] away from now (a replay, or a bad clock).
    #[error("timestamp outside the tolerance")]
    Stale,
    /// The signature does not match the body and timestamp.
    #[error("signature mismatch")]
    BadSignature,
}

/// The signature of `body` sent at `timestamp`, as lowercase hex.
pub fn sign(secret: &str, timestamp: u64, body: &[u8]) -> String {
    hex::encode(mac(secret, timestamp, body))
}

fn mac(secret: &str, timestamp: u64, body: &[u8]) -> [u8; 32] {
    let mut mac =
        Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("HMAC takes any key length");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    mac.finalize().into_bytes().into()
}

/// Checks a delivery as a receiver must: both headers present, the timestamp within
/// [`TOLERANCE_SECS`] of `now` (unix seconds), and the signature equal — compared in constant
/// time — to the HMAC of `<timestamp>.<body>`.
pub fn verify(secret: &str, headers: &HeaderMap, body: &[u8], now: u64) -> Result<(), VerifyError> {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let timestamp: u64 = header(TIMESTAMP_HEADER)
        .and_then(|t| t.trim().parse().ok())
        .ok_or(VerifyError::MissingHeaders)?;
    let signature = header(SIGNATURE_HEADER).ok_or(VerifyError::MissingHeaders)?;
    if timestamp.abs_diff(now) > TOLERANCE_SECS {
        return Err(VerifyError::Stale);
    }
    let mut presented = [0u8; 32];
    hex::decode_to_slice(signature.trim(), &mut presented)
        .map_err(|_| VerifyError::BadSignature)?;
    let expected = mac(secret, timestamp, body);
    if bool::from(expected.ct_eq(&presented)) {
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
        assert_eq!(
            verify(SECRET, &headers("yesterday", &sig), body, now),
            Err(VerifyError::MissingHeaders)
        );
    }
}
