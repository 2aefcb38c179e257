//! A configuration file's text: loaded, or refused with a reason, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use svcgate::config::{Config, Role};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let _ = Config::load_text(&text, "fuzz.toml", [], Role::Server);
    let _ = Config::load_text(&text, "fuzz.toml", [], Role::Worker);
});
