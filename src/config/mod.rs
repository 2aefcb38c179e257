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
#[cfg(test)]
mod tests;

pub use crate::admin::config::DEMO_ADMIN_TOKEN;
pub use crate::keys::config::KeysConfig;
pub use crate::logging::{LogConfig, LogFormat};
pub use crate::metering::config::{LimitsConfig, MeteringConfig, ProjectBudgetConfig};
pub use crate::proxy::config::{default_routes, resolve, CorsConfig, RouteConfig, UpstreamConfig};
pub use crate::shared::problem::Problem;
pub use crate::store::config::{StoreConfig, StoreKind};
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
            spool_dir: self.metering.spool_dir.clone().into(),
            audit_backlog: self.metering.audit_backlog,
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
        let mut table = match path {
            Some(path) => {
                let shown = path.display().to_string();
                let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                    path: shown.clone(),
                    source,
                })?;
                // Where and what, without the line itself: it may hold a secret.
                text.parse::<toml::Table>()
                    .map_err(|e| ConfigError::Syntax {
                        message: match e.span() {
                            Some(span) => {
                                let before = &text[..span.start.min(text.len())];
                                let line = before.matches('\n').count() + 1;
                                let column =
                                    before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
                                format!("line {line}, column {column}: {}", e.message())
                            }
                            None => e.message().to_string(),
                        },
                        path: shown,
                    })?
            }
            None => toml::Table::new(),
        };
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
        problems.extend(self.store.validate());
        problems.extend(self.upstream.validate());
        problems.extend(self.metering.validate());
        problems.extend(self.limits.validate());
        problems.extend(crate::proxy::config::validate_routes(&self.routes()));
        if problems.is_empty() {
            Ok(())
        } else {
            Err(ConfigError::Invalid(problems))
        }
    }
}
