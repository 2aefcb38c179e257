//! A webhook receiver's check: any headers and body are accepted only with the signature the
//! secret makes, and what is signed verifies.
#![no_main]

use libfuzzer_sys::fuzz_target;
use svcgate::webhooks::signature::{sign, verify, SIGNATURE_HEADER, TIMESTAMP_HEADER};

const SECRET: &str = "whsec_fuzz";

fuzz_target!(|data: &[u8]| {
    // `<timestamp>\n<signature>\n<body>`
    let mut parts = data.splitn(3, |b| *b == b'\n');
    let (timestamp, signature, body) = (
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or_default(),
    );
    let mut headers = http::HeaderMap::new();
    for (name, value) in [(TIMESTAMP_HEADER, timestamp), (SIGNATURE_HEADER, signature)] {
        if let Ok(value) = http::HeaderValue::from_bytes(value) {
            headers.insert(name, value);
        }
    }
    let now = 1_764_000_000;
    if verify(SECRET, &headers, body, now).is_ok() {
        // Only the real signature passes.
        let ts: u64 = std::str::from_utf8(timestamp)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert_eq!(
            std::str::from_utf8(signature).unwrap().trim(),
            sign(SECRET, ts, body)
        );
    }
    let mut signed = http::HeaderMap::new();
    signed.insert(TIMESTAMP_HEADER, http::HeaderValue::from(now));
    let signature = sign(SECRET, now, body);
    signed.insert(
        SIGNATURE_HEADER,
        http::HeaderValue::from_str(&signature).unwrap(),
    );
    assert!(verify(SECRET, &signed, body, now).is_ok());
});
