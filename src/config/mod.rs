//! Configuration: TOML file → `SVCGATE_*` environment overrides → one validation pass that
//! names every problem at start-up.
//!
//! Every key is optional; [`Config::default`] is the zero-config demo (in-memory store,
//! simulated backends). `config/svcgate.toml` documents every key next to its default.
//!
//! Each area owns its section and that section's checks (`[store]` in [`crate::store`],
//! `[upstream]`, `[cors]` and `[[routes]]` in [`crate::proxy`], …); this module composes them,
//! loads the file and applies the environment. Areas do not import it.

use serde::{Deserialize, Serialize};
use std::path::Path;

mod env;
mod server;

pub use crate::admin::config::DEMO_ADMIN_TOKEN;
pub use crate::dashboard::config::DashboardConfig;
pub use crate::keys::config::KeysConfig;
pub use crate::logging::{LogConfig, LogFormat};
pub use crate::metering::config::{LimitsConfig, MeteringConfig, ProjectBudgetConfig};
pub use crate::proxy::config::{
    default_routes, resolve, CorsConfig, RouteConfig, SimulatorConfig, UpstreamConfig, SIMULATED,
};
pub use crate::scanners::config::{FoundKeyAction, ScannersConfig};
pub use crate::shared::problem::Problem;
pub use crate::store::config::{StoreConfig, StoreKind};
pub use crate::telemetry::TracingConfig;
pub use crate::webhooks::config::{SmtpConfig, SmtpTls, WebhooksConfig};
pub use server::ServerConfig;

use env::{apply_env, without_quoted_values};

/// Prefix of every environment override: `SVCGATE_<SECTION>_<KEY>`.
pub const ENV_PREFIX: &str = "SVCGATE_";

/// The whole configuration.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Listeners, admin token, threads, shutdown.
    pub server: ServerConfig,
    /// Where shared state lives.
    pub store: StoreConfig,
    /// Backends requests are forwarded to.
    pub upstream: UpstreamConfig,
    /// Key lifecycle settings.
    pub keys: KeysConfig,
    /// Logging.
    pub log: LogConfig,
    /// Spend, audit and their flush to the store.
    pub metering: MeteringConfig,
    /// Per-key rate limits, by environment.
    pub limits: LimitsConfig,
    /// Webhook endpoints and deliveries.
    pub webhooks: WebhooksConfig,
    /// Admin e-mails.
    pub smtp: SmtpConfig,
    /// Browser apps allowed to call the API (with scoped tokens).
    pub cors: CorsConfig,
    /// Traces exported over OTLP/HTTP.
    pub tracing: TracingConfig,
    /// GitHub's secret-scanning alerts and the gateway's own scanners.
    pub scanners: ScannersConfig,
    /// The built-in simulated backend's async jobs.
    pub simulator: SimulatorConfig,
    /// The workspace dashboard.
    pub dashboard: DashboardConfig,
    /// The route table. Giving any `[[routes]]` replaces the whole default table.
    pub routes: Vec<RouteConfig>,
}

impl Config {
    /// The meter's settings.
    pub fn meter(&self) -> crate::metering::meter::MeterConfig {
        use crate::metering::ratelimit::Limit;
        crate::metering::meter::MeterConfig {
            flush_interval: std::time::Duration::from_millis(self.metering.flush_interval_ms),
            live_limit: Limit {
                requests_per_minute: self.limits.live_requests_per_minute,
                burst: self.limits.live_burst,
            },
            test_limit: Limit {
                requests_per_minute: self.limits.test_requests_per_minute,
                burst: self.limits.test_burst,
            },
            token_mints: Limit {
                requests_per_minute: self.limits.token_mints_per_minute,
                burst: self.limits.token_mints_per_minute,
            },
            token_metadata_bytes: self.limits.token_metadata_bytes,
            spool_dir: self.metering.spool_dir.clone().into(),
            audit_backlog: self.metering.audit_backlog,
            audit_backlog_bytes: self.metering.audit_backlog_bytes,
            refused_audit_per_second: self.metering.refused_audit_per_second,
            max_credits_per_request: self.metering.max_credits_per_request,
            budget_when_store_down: self.metering.budget_when_store_down,
            project_budgets: self
                .metering
                .project_budgets
                .iter()
                .map(|b| {
                    (
                        (b.workspace.clone(), b.project.clone()),
                        b.monthly_budget.micros(),
                    )
                })
                .collect(),
        }
    }
}

/// The TOML table of a configuration file's `text`; an error says where and what, without the
/// line itself: it may hold a secret.
fn parse_table(text: &str, shown: String) -> Result<toml::Table, ConfigError> {
    text.parse::<toml::Table>()
        .map_err(|e| ConfigError::Syntax {
            message: match e.span() {
                Some(span) => {
                    let before = &text[..span.start.min(text.len())];
                    let line = before.matches('\n').count() + 1;
                    let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
                    format!("line {line}, column {column}: {}", e.message())
                }
                None => e.message().to_string(),
            },
            path: shown,
        })
}

/// Why the configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not valid TOML.
    #[error("config file {path} is not valid TOML: {message}")]
    Syntax {
        /// The file.
        path: String,
        /// The parser's message, with line and column.
        message: String,
    },
    /// One or more keys are wrong.
    #[error("invalid configuration:{}", .0.iter().map(|p| format!("\n  {}: {}", p.key, p.reason)).collect::<String>())]
    Invalid(Vec<Problem>),
}

/// What a process runs, for what its configuration must hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// `svcgate serve`: the gateway and the admin API.
    Server,
    /// `svcgate worker`: webhook deliveries alone, no admin API, so no admin token.
    Worker,
}

impl Config {
    /// Reads `path` (or nothing: the embedded defaults), applies `SVCGATE_*` variables from
    /// `env`, and validates the result for `svcgate serve`.
    pub fn load(
        path: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Config, ConfigError> {
        Self::load_as(path, env, Role::Server)
    }

    /// [`Config::load`], validated for `role`.
    pub fn load_as(
        path: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
        role: Role,
    ) -> Result<Config, ConfigError> {
        let table = match path {
            Some(path) => {
                let shown = path.display().to_string();
                let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                    path: shown.clone(),
                    source,
                })?;
                parse_table(&text, shown)?
            }
            None => toml::Table::new(),
        };
        Self::from_table(table, env, role)
    }

    /// [`Config::load_as`] from the text of a configuration file (`shown` names it in errors).
    pub fn load_text(
        text: &str,
        shown: &str,
        env: impl IntoIterator<Item = (String, String)>,
        role: Role,
    ) -> Result<Config, ConfigError> {
        Self::from_table(parse_table(text, shown.to_string())?, env, role)
    }

    fn from_table(
        mut table: toml::Table,
        env: impl IntoIterator<Item = (String, String)>,
        role: Role,
    ) -> Result<Config, ConfigError> {
        apply_env(&mut table, env).map_err(|p| ConfigError::Invalid(vec![p]))?;
        let config: Config =
            serde_path_to_error::deserialize(toml::Value::Table(table)).map_err(|e| {
                let key = e.path().to_string();
                let message = without_quoted_values(&e.into_inner().to_string());
                ConfigError::Invalid(vec![Problem::new(key, message)])
            })?;
        config.validate_as(role)?;
        Ok(config)
    }

    /// The effective route table: the configured one, or [`default_routes`].
    pub fn routes(&self) -> Vec<RouteConfig> {
        if self.routes.is_empty() {
            default_routes()
        } else {
            self.routes.clone()
        }
    }

    /// Checks every value and reports all problems at once, for `svcgate serve`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_as(Role::Server)
    }

    /// [`Config::validate`] for `role`: a worker serves no admin API, and is not asked for an
    /// admin token (its manifest keeps the token out of the process that calls customers'
    /// URLs).
    pub fn validate_as(&self, role: Role) -> Result<(), ConfigError> {
        let mut problems = self.server.validate(role, self.store.kind);
        problems.extend(self.keys.validate());
        problems.extend(self.log.validate());
        problems.extend(self.webhooks.validate());
        problems.extend(self.smtp.validate());
        problems.extend(crate::proxy::config::validate_trusted_proxies(
            &self.server.trusted_proxies,
        ));
        problems.extend(self.cors.validate());
        problems.extend(self.dashboard.validate());
        problems.extend(self.store.validate());
        problems.extend(self.upstream.validate());
        if role == Role::Server && self.store.kind != StoreKind::Memory {
            problems.extend(self.upstream.validate_shared());
        }
        problems.extend(self.scanners.validate());
        problems.extend(self.simulator.validate());
        problems.extend(self.metering.validate());
        problems.extend(self.limits.validate());
        problems.extend(self.tracing.validate());
        problems.extend(crate::proxy::config::validate_routes(&self.routes()));
        if problems.is_empty() {
            Ok(())
        } else {
            Err(ConfigError::Invalid(problems))
        }
    }
}

/// Loading whole files: defaults, environment overrides, every section's checks.
#[cfg(test)]
mod tests {
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
            "[server]\nadmin_token = \"a-long-admin-token\"\n[upstream]\nlive = \"simulated\"\n\
             [store]\nkind = \"redis\"\n{extra}"
        ))
        };
        let ok =
            f("sentinels = [\"10.0.0.1:26379\", \"s.db.svc:26379\"]\nsentinel_master = \"m\"\n");
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

        let p =
            problems(Config::load(None, env(&[("SVCGATE_SERVER_THREADS", "many")])).unwrap_err());
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
        // A shared store is production: live keys are simulated only when the file says so.
        refused(
            "[server]\nadmin_token = \"a-long-admin-token\"\n[store]\nkind = \"redis\"\n",
            "upstream.live",
        );
        let simulated = file(
            "[server]\nadmin_token = \"a-long-admin-token\"\n[store]\nkind = \"redis\"\n\
             [upstream]\nlive = \"simulated\"\n",
        );
        let c = Config::load(Some(simulated.path()), env(&[])).unwrap();
        assert_eq!(c.upstream.live_backend(), None);
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
        assert_eq!(
            toml::to_string(&shipped.tracing).unwrap(),
            toml::to_string(&defaults.tracing).unwrap()
        );
        assert_eq!(shipped.routes(), default_routes());
    }
}
