//! Delivery signatures: what the worker signs, a receiver accepts; any change, it refuses.

use http::{HeaderMap, HeaderValue};
use proptest::prelude::*;
use svcgate::webhooks::signature::{
    sign, verify, VerifyError, SIGNATURE_HEADER, TIMESTAMP_HEADER, TOLERANCE_SECS,
};

fn headers(timestamp: &str, signature: &str) -> HeaderMap {
    let mut headers = HeaderMap::new();
    if let Ok(v) = HeaderValue::from_str(timestamp) {
        headers.insert(TIMESTAMP_HEADER, v);
    }
    if let Ok(v) = HeaderValue::from_str(signature) {
        headers.insert(SIGNATURE_HEADER, v);
    }
    headers
}

proptest! {
    #[test]
    fn a_signed_delivery_verifies_within_the_tolerance_and_not_after(
        secret in "whsec_[A-Za-z0-9]{1,40}",
        body in prop::collection::vec(any::<u8>(), 0..512),
        timestamp in 1_000_000_000u64..4_000_000_000,
        skew in 0..=TOLERANCE_SECS,
        late in 1u64..100_000,
    ) {
        let signature = sign(&secret, timestamp, &body);
        let h = headers(&timestamp.to_string(), &signature);
        prop_assert_eq!(verify(&secret, &h, &body, timestamp + skew), Ok(()));
        prop_assert_eq!(verify(&secret, &h, &body, timestamp - skew), Ok(()));
        prop_assert_eq!(
            verify(&secret, &h, &body, timestamp + TOLERANCE_SECS + late),
            Err(VerifyError::Stale)
        );
    }

    #[test]
    fn a_changed_body_secret_or_timestamp_is_refused(
        secret in "whsec_[A-Za-z0-9]{1,40}",
        other in "whsec_[A-Za-z0-9]{1,40}",
        body in prop::collection::vec(any::<u8>(), 1..256),
        at in any::<prop::sample::Index>(),
        flip in 1u8..=255,
        timestamp in 1_000_000_000u64..4_000_000_000,
    ) {
        let signature = sign(&secret, timestamp, &body);
        let h = headers(&timestamp.to_string(), &signature);
        let mut changed = body.clone();
        changed[at.index(body.len())] ^= flip;
        prop_assert_eq!(verify(&secret, &h, &changed, timestamp), Err(VerifyError::BadSignature));
        if other != secret {
            prop_assert_eq!(verify(&other, &h, &body, timestamp), Err(VerifyError::BadSignature));
        }
        let moved = headers(&(timestamp + 1).to_string(), &signature);
        prop_assert_eq!(verify(&secret, &moved, &body, timestamp), Err(VerifyError::BadSignature));
    }

    #[test]
    fn any_headers_are_verified_or_refused_without_panicking(
        timestamp in ".{0,24}",
        signature in ".{0,80}",
        body in prop::collection::vec(any::<u8>(), 0..64),
        now in any::<u64>(),
    ) {
        let h = headers(&timestamp, &signature);
        // Nothing made up verifies (a match would be a forged HMAC).
        prop_assert!(verify("whsec_x", &h, &body, now).is_err());
    }
}
