//! Configuration: any file is loaded or refused with a reason, never with a panic, and a
//! refused value is never echoed back (it may be a secret).

use proptest::prelude::*;
use svcgate::config::{Config, Role};

/// Keys of the configuration, a few per section, with the odd one no section has.
fn key() -> impl Strategy<Value = (&'static str, &'static str)> {
    prop::sample::select(vec![
        ("server", "listen"),
        ("server", "admin_token"),
        ("server", "keepalive_seconds"),
        ("store", "kind"),
        ("store", "url"),
        ("metering", "flush_interval_ms"),
        ("metering", "audit_backlog_bytes"),
        ("metering", "max_credits_per_request"),
        ("limits", "live_burst"),
        ("limits", "token_metadata_bytes"),
        ("webhooks", "timeout_seconds"),
        ("cors", "allowed_origins"),
        ("nowhere", "nothing"),
    ])
}

/// A TOML value of any kind.
fn value() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<i64>().prop_map(|n| n.to_string()),
        any::<f64>().prop_map(|n| format!("{n:?}")),
        "[ -~]{0,30}".prop_map(|s| format!("{s:?}")),
        any::<bool>().prop_map(|b| b.to_string()),
        Just("[]".to_string()),
        Just("[1, \"a\"]".to_string()),
        Just("{ a = 1 }".to_string()),
    ]
}

proptest! {
    #[test]
    fn any_text_loads_or_is_refused(text in "[ -~\\n]{0,200}") {
        let _ = Config::load_text(&text, "test.toml", [], Role::Server);
    }

    #[test]
    fn any_value_of_any_key_loads_or_is_refused(entries in prop::collection::vec((key(), value()), 0..6)) {
        let text: String = entries
            .iter()
            .map(|((section, key), value)| format!("[{section}]\n{key} = {value}\n"))
            .collect();
        let _ = Config::load_text(&text, "test.toml", [], Role::Server);
    }

    #[test]
    fn a_refused_secret_is_not_echoed(
        secret in "[A-Za-z0-9]{8,40}",
        (section, key, form) in prop::sample::select(vec![
            ("server", "admin_token", "{}"),
            ("server", "admin_token", "{} with a space"),
            ("store", "url", "redis://:{}@127.0.0.1:notaport"),
            ("store", "url", "{}"),
            ("store", "url", "rediss://user:{}@"),
            ("smtp", "password", "{}"),
        ]),
        store in prop::sample::select(vec!["memory", "redis"]),
    ) {
        let value = form.replace("{}", &secret);
        let text = format!("[store]\nkind = \"{store}\"\n[{section}]\n{key} = {value:?}\n");
        if let Err(e) = Config::load_text(&text, "test.toml", [], Role::Server) {
            prop_assert!(!e.to_string().contains(&secret), "{}", e);
        }
        let env = [
            ("SVCGATE_STORE_KIND".to_string(), store.to_string()),
            (format!("SVCGATE_{}_{}", section.to_uppercase(), key.to_uppercase()), value),
        ];
        if let Err(e) = Config::load_text("", "test.toml", env, Role::Server) {
            prop_assert!(!e.to_string().contains(&secret), "{}", e);
        }
    }
}
