//! A bearer header's bytes: the header parser, the key format and redaction never panic, and
//! redacted text never holds a well-formed key.
#![no_main]

use libfuzzer_sys::fuzz_target;
use svcgate::keys::format;
use svcgate::proxy::auth;

fuzz_target!(|data: &[u8]| {
    if let Ok(value) = http::HeaderValue::from_bytes(data) {
        let mut headers = http::HeaderMap::new();
        headers.insert(http::header::AUTHORIZATION, value);
        if let Ok(header) = auth::authorization(&headers) {
            if let Ok(token) = auth::bearer_token(header) {
                let _ = format::parse(token);
            }
        }
    }
    let text = String::from_utf8_lossy(data);
    if let Ok(env) = format::parse(&text) {
        assert!(text.starts_with(env.key_prefix()));
        assert!(!format::redact(&text).contains(&*text));
    }
    let _ = format::redact(&text);
});
