//! A backend's `Service-Credits`: parsed to an amount between zero and a trillion credits, or
//! to none, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use svcgate::metering::Credits;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Some(credits) = Credits::parse_decimal(text) {
        assert!((0..=1_000_000_000_000 * 1_000_000).contains(&credits.micros()));
    }
});
