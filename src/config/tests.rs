//! Loading whole files: defaults, environment overrides, every section's checks.

use super::*;
use std::io::Write;
use std::path::Path;

fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn problems(err: ConfigError) -> Vec<Problem> {
    match err {
        ConfigError::Invalid(p) => p,
        other => panic!("expected Invalid, got {other}"),
    }
}

fn file(text: &str) -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    f.write_all(text.as_bytes()).unwrap();
    f
}

#[test]
fn no_file_gives_the_demo_defaults() {
    let c = Config::load(None, env(&[])).unwrap();
    assert_eq!(c.server.listen, "0.0.0.0:8080");
    assert_eq!(c.server.admin_listen, "127.0.0.1:8081");
    assert_eq!(c.server.metrics_listen, "0.0.0.0:9090");
    assert_eq!(c.store.kind, StoreKind::Memory);
    assert!(c.upstream.live.is_none());
    assert_eq!(c.keys.rotation_grace_seconds, 86_400);
    assert_eq!(c.routes(), default_routes());
}

#[test]
fn sentinels_need_a_master_name_and_host_port_addresses() {
    let f = |extra: &str| {
        file(&format!(
            "[server]\nadmin_token = \"a-long-admin-token\"\n[store]\nkind = \"redis\"\n{extra}"
        ))
    };
    let ok = f("sentinels = [\"10.0.0.1:26379\", \"s.db.svc:26379\"]\nsentinel_master = \"m\"\n");
    let c = Config::load(Some(ok.path()), env(&[])).unwrap();
    let sentinels = c.store.sentinels().unwrap();
    assert_eq!(sentinels.addresses.len(), 2);
    assert_eq!(sentinels.master, "m");
    // From the environment, as Kubernetes would set them.
    let c = Config::load(
        Some(f("").path()),
        env(&[
            ("SVCGATE_STORE_SENTINELS", "[\"10.0.0.1:26379\"]"),
            ("SVCGATE_STORE_SENTINEL_MASTER", "mymaster"),
            ("SVCGATE_STORE_SENTINEL_PASSWORD", "12345"),
        ]),
    )
    .unwrap();
    assert_eq!(
        c.store.sentinels().unwrap().password.as_deref(),
        Some("12345")
    );
    assert!(Config::load(Some(f("").path()), env(&[]))
        .unwrap()
        .store
        .sentinels()
        .is_none());
    for (bad, key) in [
        (
            "sentinels = [\"10.0.0.1:26379\"]\n",
            "store.sentinel_master",
        ),
        (
            "sentinels = [\"10.0.0.1:26379\"]\nsentinel_master = \"\"\n",
            "store.sentinel_master",
        ),
        ("sentinel_master = \"m\"\n", "store.sentinel_master"),
        (
            "sentinels = [\"10.0.0.1\"]\nsentinel_master = \"m\"\n",
            "store.sentinels",
        ),
        (
            "sentinels = [\"h:0\"]\nsentinel_master = \"m\"\n",
            "store.sentinels",
        ),
    ] {
        let found = problems(Config::load(Some(f(bad).path()), env(&[])).unwrap_err());
        assert!(found.iter().any(|p| p.key == key), "{bad}: {found:?}");
    }
}

#[test]
fn environment_overrides_the_file_with_typed_values() {
    let f = file("[server]\nlisten = \"127.0.0.1:1\"\nthreads = 1\n");
    let c = Config::load(
        Some(f.path()),
        env(&[
            ("SVCGATE_SERVER_LISTEN", "127.0.0.1:7000"),
            ("SVCGATE_SERVER_THREADS", "3"),
            ("SVCGATE_SERVER_ADMIN_TOKEN", "12345"),
            ("SVCGATE_UPSTREAM_LIVE", "127.0.0.1:9000"),
            ("SVCGATE_CONFIG", "ignored"),
            ("SVCGATE_ADMIN_URL", "http://127.0.0.1:8081"),
            ("SVCGATE_GATEWAY_URL", "http://127.0.0.1:8080"),
            ("SVCGATE_API_KEY", "svc_live_ignored"),
            ("HOME", "/root"),
        ]),
    )
    .unwrap();
    assert_eq!(c.server.listen, "127.0.0.1:7000");
    assert_eq!(c.server.threads, 3);
    assert_eq!(c.server.admin_token, "12345");
    assert_eq!(c.upstream.live.as_deref(), Some("127.0.0.1:9000"));
}

#[test]
fn a_worker_is_not_asked_for_an_admin_token() {
    let redis = [("SVCGATE_STORE_KIND", "redis")];
    let p = problems(Config::load(None, env(&redis)).unwrap_err());
    assert!(p.iter().any(|p| p.key == "server.admin_token"), "{p:?}");
    assert!(Config::load_as(None, env(&redis), Role::Worker).is_ok());
}

#[test]
fn an_empty_variable_unsets_an_optional_setting() {
    let f = file("[upstream]\nlive = \"127.0.0.1:1\"\nsandbox = \"127.0.0.1:2\"\n");
    let c = Config::load(
        Some(f.path()),
        env(&[("SVCGATE_UPSTREAM_SANDBOX", ""), ("SVCGATE_SMTP_HOST", "")]),
    )
    .unwrap();
    assert_eq!(c.upstream.live.as_deref(), Some("127.0.0.1:1"));
    assert_eq!(c.upstream.sandbox, None);
    assert_eq!(c.smtp.host, None);
    // A setting with a default is not optional: empty is a value, checked as such.
    let p = problems(Config::load(None, env(&[("SVCGATE_SERVER_LISTEN", "")])).unwrap_err());
    assert!(p.iter().any(|p| p.key == "server.listen"), "{p:?}");
}

#[test]
fn errors_name_the_key() {
    let f = file("[server]\nlisten = 5\n");
    let p = problems(Config::load(Some(f.path()), env(&[])).unwrap_err());
    assert_eq!(p[0].key, "server.listen");

    let f = file("[server]\nlisen = \"x\"\n");
    let err = Config::load(Some(f.path()), env(&[])).unwrap_err();
    assert!(err.to_string().contains("lisen"), "{err}");

    let p = problems(Config::load(None, env(&[("SVCGATE_SERVER_THREADS", "many")])).unwrap_err());
    assert_eq!(p[0].key, "SVCGATE_SERVER_THREADS");

    let p = problems(Config::load(None, env(&[("SVCGATE_NOPE_X", "1")])).unwrap_err());
    assert!(p[0].reason.contains("unknown section"));

    let err =
        Config::load(Some(f.path().with_extension("missing").as_path()), env(&[])).unwrap_err();
    assert!(matches!(err, ConfigError::Read { .. }));

    let f = file("[server\n");
    let err = Config::load(Some(f.path()), env(&[])).unwrap_err();
    assert!(matches!(err, ConfigError::Syntax { .. }));
}

#[test]
fn placeholders_and_settings_that_lose_data_are_refused() {
    let refused = |text: &str, key: &str| {
        let f = file(text);
        let found = problems(Config::load(Some(f.path()), env(&[])).unwrap_err());
        assert!(found.iter().any(|p| p.key == key), "{text}: {found:?}");
    };
    // The Secret's placeholder, with a shared store: production.
    refused(
        "[server]\nadmin_token = \"CHANGE-ME-long-random-admin-token\"\n[store]\nkind = \"redis\"\n",
        "server.admin_token",
    );
    refused("[store]\nkind = \"redis\"\n", "server.admin_token");
    // The demo keeps its token on loopback.
    assert!(Config::load(None, env(&[])).is_ok());
    refused(
        "[webhooks]\nretry_schedule_seconds = [60, 0]\n",
        "webhooks.retry_schedule_seconds",
    );
    refused(
        "[webhooks]\nretry_schedule_seconds = [2592000, 1]\n",
        "webhooks.retry_schedule_seconds",
    );
    refused(
        "[webhooks]\nretry_schedule_seconds = [9223372036854775807, 9223372036854775807]\n",
        "webhooks.retry_schedule_seconds",
    );
    refused(
        "[metering]\naudit_retention_days = 0\n",
        "metering.audit_retention_days",
    );
    let ok = file("[webhooks]\nretry_schedule_seconds = []\n");
    assert!(Config::load(Some(ok.path()), env(&[])).is_ok());
}

#[test]
fn config_errors_do_not_quote_what_may_be_a_secret() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.toml");
    for text in [
        "[server]\nadmin_token = \"SuperSecretTok\n",
        "[server]\nadmin_token = 987654321012\n",
    ] {
        std::fs::write(&path, text).unwrap();
        let err = Config::load(Some(&path), Vec::new())
            .unwrap_err()
            .to_string();
        assert!(
            !err.contains("SuperSecretTok") && !err.contains("987654321012"),
            "{err}"
        );
        assert!(
            err.contains("line 2") || err.contains("admin_token"),
            "{err}"
        );
    }
}

#[test]
fn an_admin_token_with_surrounding_whitespace_is_refused() {
    let err = Config::load(
        None,
        env(&[("SVCGATE_SERVER_ADMIN_TOKEN", "a-long-admin-token\n")]),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("server.admin_token"), "{err}");
    assert!(
        !err.contains("a-long-admin-token"),
        "the token is not echoed: {err}"
    );
}

#[test]
fn kubernetes_service_link_variables_are_not_settings() {
    let vars = env(&[
        ("SVCGATE_PORT", "tcp://10.0.0.1:80"),
        ("SVCGATE_PORT_80_TCP_ADDR", "10.0.0.1"),
        ("SVCGATE_SERVICE_HOST", "10.0.0.1"),
        ("SVCGATE_SERVICE_PORT_HTTP", "80"),
        // A Service named `svcgate-metrics`, and one named `svcgate-smtp`.
        ("SVCGATE_METRICS_SERVICE_HOST", "10.0.0.2"),
        ("SVCGATE_METRICS_SERVICE_PORT", "9090"),
        ("SVCGATE_METRICS_PORT", "tcp://10.0.0.2:9090"),
        ("SVCGATE_METRICS_PORT_9090_TCP_PROTO", "tcp"),
        ("SVCGATE_SMTP_PORT", "tcp://10.0.0.3:25"),
        ("SVCGATE_SMTP_PORT_25_TCP", "tcp://10.0.0.3:25"),
        ("SVCGATE_SERVER_THREADS", "3"),
    ]);
    let c = Config::load(None, vars).unwrap();
    assert_eq!(c.server.threads, 3);
    // The setting of the same name is still one.
    let c = Config::load(None, env(&[("SVCGATE_SMTP_PORT", "2525")])).unwrap();
    assert_eq!(c.smtp.port, 2525);
    // A misspelt section is still an error.
    assert!(Config::load(None, env(&[("SVCGATE_SERVR_THREADS", "3")])).is_err());
}

#[test]
fn validation_reports_every_problem() {
    let f = file(
        r#"
[server]
listen = "nonsense"
admin_listen = "0.0.0.0:8081"
[upstream]
live = "no-such-host.invalid:80"
read_timeout_ms = 0
[keys]
rotation_grace_seconds = 99999999999
[log]
level = "not[a]filter"
[[routes]]
method = "POST"
path = "/chat"
scope = "Chat"
"#,
    );
    let keys: Vec<_> = problems(Config::load(Some(f.path()), env(&[])).unwrap_err())
        .into_iter()
        .map(|p| p.key)
        .collect();
    for expected in [
        "server.listen",
        "server.admin_token",
        "upstream.live",
        "upstream.read_timeout_ms",
        "routes[0].path",
        "routes[0].scope",
        "keys.rotation_grace_seconds",
        "log.level",
    ] {
        assert!(keys.iter().any(|k| k == expected), "{expected} in {keys:?}");
    }
}

#[test]
fn the_promised_defaults_hold() {
    // The promised retry schedule (1 m, 5 m, 30 m, 2 h, 12 h) and delivery timeout, and the
    // documented ports, without a file.
    let config = Config::load(None, env(&[])).unwrap();
    assert_eq!(
        config.webhooks.retry_schedule_seconds,
        [60, 300, 1_800, 7_200, 43_200]
    );
    assert_eq!(config.webhooks.timeout_seconds, 10);
    assert_eq!(config.keys.rotation_grace_seconds, 86_400);
    assert_eq!(config.server.listen, "0.0.0.0:8080");
    assert_eq!(config.server.metrics_listen, "0.0.0.0:9090");
    assert!(config.cors.allowed_origins.is_empty());
}

#[test]
fn smtp_settings_that_cannot_work_are_refused() {
    let smtp_problems = |vars: &[(&str, &str)]| -> Vec<(String, String)> {
        match Config::load(None, env(vars)) {
            Ok(_) => Vec::new(),
            Err(e) => problems(e)
                .into_iter()
                .map(|p| (p.key, p.reason))
                .filter(|(k, _)| k.starts_with("smtp."))
                .collect(),
        }
    };
    let keys = |vars: &[(&str, &str)]| -> Vec<String> {
        smtp_problems(vars).into_iter().map(|(k, _)| k).collect()
    };
    assert_eq!(
        keys(&[("SVCGATE_SMTP_HOST", "smtp://relay:25")]),
        ["smtp.host"]
    );
    assert_eq!(
        keys(&[("SVCGATE_SMTP_HOST", "relay.example.com:25")]),
        Vec::<String>::new()
    );
    // Empty in the environment unsets it (no relay: mail goes to the outbox).
    assert_eq!(keys(&[("SVCGATE_SMTP_HOST", "")]), Vec::<String>::new());
    assert_eq!(keys(&[("SVCGATE_SMTP_PORT", "0")]), ["smtp.port"]);
    assert_eq!(keys(&[("SVCGATE_SMTP_USERNAME", "u")]), ["smtp.password"]);
    // A password is never sent in the clear.
    let cleartext = smtp_problems(&[
        ("SVCGATE_SMTP_USERNAME", "u"),
        ("SVCGATE_SMTP_PASSWORD", "hunter2"),
    ]);
    assert_eq!(cleartext.len(), 1);
    assert_eq!(cleartext[0].0, "smtp.tls");
    assert!(!cleartext[0].1.contains("hunter2"));
    let over_tls = keys(&[
        ("SVCGATE_SMTP_USERNAME", "u"),
        ("SVCGATE_SMTP_PASSWORD", "hunter2"),
        ("SVCGATE_SMTP_TLS", "starttls"),
    ]);
    assert_eq!(over_tls, Vec::<String>::new());
    assert_eq!(
        keys(&[("SVCGATE_SMTP_TLS_CA_FILE", "/etc/hostname")]),
        ["smtp.tls_ca_file"]
    );
    assert_eq!(
        keys(&[
            ("SVCGATE_SMTP_TLS", "tls"),
            ("SVCGATE_SMTP_TLS_CA_FILE", "/nonexistent/ca.pem")
        ]),
        ["smtp.tls_ca_file"]
    );
    assert!(Config::load(None, env(&[("SVCGATE_SMTP_TLS", "ssl")])).is_err());
}

#[test]
fn duplicate_ports_and_routes_are_refused() {
    let f = file(
        r#"
[server]
admin_listen = "127.0.0.1:8080"
[[routes]]
method = "GET"
path = "/v1/models"
scope = "models:read"
[[routes]]
method = "GET"
path = "/v1/models"
scope = "models:read"
"#,
    );
    let keys: Vec<_> = problems(Config::load(Some(f.path()), env(&[])).unwrap_err())
        .into_iter()
        .map(|p| p.key)
        .collect();
    assert!(
        keys.contains(&"server.admin_listen".to_string()),
        "{keys:?}"
    );
    assert!(keys.contains(&"routes".to_string()), "{keys:?}");
}

#[test]
fn the_shipped_config_file_is_valid_and_documents_the_defaults() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/svcgate.toml");
    let shipped = Config::load(Some(&path), env(&[])).unwrap();
    let defaults = Config::default();
    assert_eq!(
        toml::to_string(&shipped.server).unwrap(),
        toml::to_string(&defaults.server).unwrap()
    );
    assert_eq!(
        toml::to_string(&shipped.upstream).unwrap(),
        toml::to_string(&defaults.upstream).unwrap()
    );
    assert_eq!(
        toml::to_string(&shipped.store).unwrap(),
        toml::to_string(&defaults.store).unwrap()
    );
    assert_eq!(
        toml::to_string(&shipped.keys).unwrap(),
        toml::to_string(&defaults.keys).unwrap()
    );
    assert_eq!(
        toml::to_string(&shipped.log).unwrap(),
        toml::to_string(&defaults.log).unwrap()
    );
    assert_eq!(
        toml::to_string(&shipped.metering).unwrap(),
        toml::to_string(&defaults.metering).unwrap()
    );
    assert_eq!(
        toml::to_string(&shipped.limits).unwrap(),
        toml::to_string(&defaults.limits).unwrap()
    );
    assert_eq!(
        toml::to_string(&shipped.webhooks).unwrap(),
        toml::to_string(&defaults.webhooks).unwrap()
    );
    assert_eq!(
        toml::to_string(&shipped.smtp).unwrap(),
        toml::to_string(&defaults.smtp).unwrap()
    );
    assert_eq!(shipped.routes(), default_routes());
}
