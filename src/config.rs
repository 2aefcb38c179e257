//! Configuration: TOML file → `SVCGATE_*` environment overrides → one validation pass that
//! names every problem at start-up.
//!
//! Every key is optional; [`Config::default`] is the zero-config demo (in-memory store,
//! simulated backends). `config/svcgate.toml` documents every key next to its default.

use serde::{Deserialize, Serialize};
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::Path;

use crate::keys::scopes::is_valid_scope;
use crate::metering::Credits;

/// Prefix of every environment override: `SVCGATE_<SECTION>_<KEY>`.
pub const ENV_PREFIX: &str = "SVCGATE_";

/// The admin token of the zero-config demo; refused on a non-loopback admin address.
pub const DEMO_ADMIN_TOKEN: &str = "change-me";

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

/// `[server]`
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// Gateway listener.
    pub listen: String,
    /// Admin API and health listener.
    pub admin_listen: String,
    /// Prometheus listener.
    pub metrics_listen: String,
    /// Bearer token of the admin API.
    pub admin_token: String,
    /// Worker threads of the gateway; 0 means one per CPU.
    pub threads: usize,
    /// After SIGTERM, how long the gateway drains (seconds): it keeps accepting and serving
    /// while `/readyz` answers 503 and each response closes its connection.
    pub shutdown_grace_seconds: u64,
    /// Then, with the listeners closed, how long in-flight requests get to finish (seconds).
    pub shutdown_timeout_seconds: u64,
    /// Socket used to hand listeners over during a graceful upgrade (`serve -u`).
    pub upgrade_sock: String,
    /// How long an idle client connection stays open between requests (seconds).
    pub keepalive_timeout_seconds: u64,
    /// Load balancers or ingress proxies (addresses or CIDR blocks) whose `X-Forwarded-For`
    /// names the client in audit records; none by default (the peer is the client).
    pub trusted_proxies: Vec<String>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            listen: "0.0.0.0:8080".into(),
            admin_listen: "127.0.0.1:8081".into(),
            metrics_listen: "0.0.0.0:9090".into(),
            admin_token: DEMO_ADMIN_TOKEN.into(),
            threads: 0,
            shutdown_grace_seconds: 5,
            shutdown_timeout_seconds: 5,
            upgrade_sock: "/tmp/svcgate_upgrade.sock".into(),
            keepalive_timeout_seconds: 60,
            trusted_proxies: Vec::new(),
        }
    }
}

/// Which store backs the deployment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StoreKind {
    /// In-process; for the demo and tests. One replica only.
    Memory,
    /// Redis; shared by every replica.
    Redis,
}

/// `[store]`
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StoreConfig {
    /// `memory` or `redis`.
    pub kind: StoreKind,
    /// Redis URL, for `kind = "redis"`.
    pub url: String,
    /// Prefix of every Redis key.
    pub namespace: String,
    /// How long cached keys keep working after the store stops answering (seconds).
    pub cache_staleness_seconds: u64,
    /// How long an unknown key is remembered as unknown (seconds).
    pub negative_cache_seconds: u64,
    /// Most unknown keys remembered.
    pub negative_cache_entries: usize,
    /// How often the key cache checks the change log when no notification arrives (ms).
    pub sync_interval_ms: u64,
    /// For a `rediss://` URL: a PEM file of the CA certificates to trust instead of the
    /// system's (a managed Redis with a private CA).
    pub tls_ca_file: Option<String>,
    /// For a `rediss://` URL to a Redis that asks for a client certificate (mutual TLS): the
    /// PEM certificate chain; `tls_key_file` holds its key.
    pub tls_cert_file: Option<String>,
    /// The PEM private key of `tls_cert_file`.
    pub tls_key_file: Option<String>,
    /// `host:port` of Redis Sentinels: the store then uses the master they name
    /// (`sentinel_master`) and follows it through failovers; `url` gives the credentials,
    /// database and TLS, and the node used until a Sentinel answers.
    pub sentinels: Vec<String>,
    /// The name the Sentinels monitor the master under (`sentinel monitor <name> …`).
    pub sentinel_master: Option<String>,
    /// `requirepass` of the Sentinels, if they have one.
    pub sentinel_password: Option<String>,
}

impl StoreConfig {
    /// The Sentinels to follow, if any are set.
    pub fn sentinels(&self) -> Option<crate::store::Sentinels> {
        if self.sentinels.is_empty() {
            return None;
        }
        Some(crate::store::Sentinels {
            addresses: self.sentinels.clone(),
            master: self.sentinel_master.clone().unwrap_or_default(),
            password: self.sentinel_password.clone(),
        })
    }

    fn validate_sentinels(&self) -> Vec<Problem> {
        let mut problems = Vec::new();
        for address in &self.sentinels {
            if let Err(e) = crate::store::sentinel_address(address) {
                problems.push(Problem::new("store.sentinels", e));
            }
        }
        let master = self.sentinel_master.as_deref().filter(|m| !m.is_empty());
        match (self.sentinels.is_empty(), master) {
            (false, None) => problems.push(Problem::new(
                "store.sentinel_master",
                "the name the Sentinels monitor the master under is required with store.sentinels",
            )),
            (true, Some(_)) => problems.push(Problem::new(
                "store.sentinel_master",
                "needs store.sentinels",
            )),
            _ => {}
        }
        problems
    }

    /// The key cache settings.
    pub fn cache(&self) -> crate::store::CacheConfig {
        crate::store::CacheConfig {
            max_staleness: std::time::Duration::from_secs(self.cache_staleness_seconds),
            negative_ttl: std::time::Duration::from_secs(self.negative_cache_seconds),
            negative_capacity: self.negative_cache_entries,
            poll_interval: std::time::Duration::from_millis(self.sync_interval_ms),
            ..crate::store::CacheConfig::default()
        }
    }

    /// The TLS files read into what the Redis client takes; `None` when none is set (a
    /// `rediss://` URL then verifies the server against the system's roots).
    pub fn tls(&self) -> Result<Option<redis::TlsCertificates>, Problem> {
        let read = |key: &str, path: &str| {
            std::fs::read(path).map_err(|e| Problem::new(key, format!("cannot read {path}: {e}")))
        };
        let root_cert = match &self.tls_ca_file {
            Some(path) => Some(read("store.tls_ca_file", path)?),
            None => None,
        };
        let client_tls = match (&self.tls_cert_file, &self.tls_key_file) {
            (Some(cert), Some(key)) => Some(redis::ClientTlsConfig {
                client_cert: read("store.tls_cert_file", cert)?,
                client_key: read("store.tls_key_file", key)?,
            }),
            (None, None) => None,
            (Some(_), None) => {
                return Err(Problem::new("store.tls_key_file", "tls_cert_file needs it"))
            }
            (None, Some(_)) => {
                return Err(Problem::new("store.tls_cert_file", "tls_key_file needs it"))
            }
        };
        if root_cert.is_none() && client_tls.is_none() {
            return Ok(None);
        }
        if !self.url.starts_with("rediss://") {
            let key = match root_cert {
                Some(_) => "store.tls_ca_file",
                None => "store.tls_cert_file",
            };
            return Err(Problem::new(key, "needs a rediss:// store.url"));
        }
        Ok(Some(redis::TlsCertificates {
            client_tls,
            root_cert,
        }))
    }
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            kind: StoreKind::Memory,
            url: "redis://127.0.0.1:6379/0".into(),
            namespace: "svcgate".into(),
            cache_staleness_seconds: 60,
            negative_cache_seconds: 30,
            negative_cache_entries: 100_000,
            sync_interval_ms: 1_000,
            tls_ca_file: None,
            tls_cert_file: None,
            tls_key_file: None,
            sentinels: Vec::new(),
            sentinel_master: None,
            sentinel_password: None,
        }
    }
}

/// `[upstream]`
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct UpstreamConfig {
    /// Production backend `host:port`; absent: built-in simulated responses.
    pub live: Option<String>,
    /// Sandbox backend for `svc_test_` keys; absent: simulated responses.
    pub sandbox: Option<String>,
    /// TCP connect timeout (milliseconds).
    pub connect_timeout_ms: u64,
    /// Longest wait for the next bytes of the backend's response (milliseconds).
    pub read_timeout_ms: u64,
    /// Longest wait to write to the backend (milliseconds).
    pub write_timeout_ms: u64,
}

impl Default for UpstreamConfig {
    fn default() -> Self {
        Self {
            live: None,
            sandbox: None,
            connect_timeout_ms: 1_000,
            read_timeout_ms: 60_000,
            write_timeout_ms: 60_000,
        }
    }
}

/// `[keys]`
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KeysConfig {
    /// How long a rotated key keeps working (seconds).
    pub rotation_grace_seconds: u64,
}

impl Default for KeysConfig {
    fn default() -> Self {
        Self {
            rotation_grace_seconds: 86_400,
        }
    }
}

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// `[log]`
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogConfig {
    /// `text` or `json`.
    pub format: LogFormat,
    /// A `tracing` filter such as `info` or `svcgate=debug`; `RUST_LOG` wins when set.
    pub level: String,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            format: LogFormat::Text,
            level: "info".into(),
        }
    }
}

/// `[metering]`
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MeteringConfig {
    /// How often spend, rate counts and audit records are sent to the store (ms).
    pub flush_interval_ms: u64,
    /// Where spend and audit records wait when the store cannot take them.
    pub spool_dir: String,
    /// Audit records held in memory while the store is unreachable, before spooling to disk
    /// (they are spooled after 5 s in any case).
    pub audit_backlog: usize,
    /// How long audit records are kept in Redis (days).
    pub audit_retention_days: u64,
    /// Monthly budgets of projects, set here rather than through the admin API.
    pub project_budgets: Vec<ProjectBudgetConfig>,
}

impl Default for MeteringConfig {
    fn default() -> Self {
        Self {
            flush_interval_ms: 200,
            spool_dir: "data/spool".into(),
            audit_backlog: 100_000,
            audit_retention_days: 30,
            project_budgets: Vec::new(),
        }
    }
}

/// One `[[metering.project_budgets]]` entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProjectBudgetConfig {
    /// `ws_…`
    pub workspace: String,
    /// The `Service-Project` value.
    pub project: String,
    /// Credits per calendar month (UTC).
    pub monthly_budget: Credits,
}

/// `[webhooks]`
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WebhooksConfig {
    /// Waits before each retry, counted from the previous failure (seconds). After the last
    /// one fails, the endpoint is paused.
    pub retry_schedule_seconds: Vec<u64>,
    /// A delivery succeeds on a 2xx within this time (seconds).
    pub timeout_seconds: u64,
    /// Allow `http://` endpoints and internal addresses (development and tests only).
    pub allow_insecure_targets: bool,
    /// Where admin e-mails are written when no `[smtp]` host is configured.
    pub outbox_dir: String,
    /// Deliveries one worker has in flight at most.
    pub max_in_flight: usize,
    /// Deliveries one worker has in flight to one endpoint at most.
    pub max_in_flight_per_endpoint: usize,
}

impl Default for WebhooksConfig {
    fn default() -> Self {
        Self {
            retry_schedule_seconds: vec![60, 300, 1_800, 7_200, 43_200],
            timeout_seconds: 10,
            allow_insecure_targets: false,
            outbox_dir: "data/outbox".to_string(),
            max_in_flight: 512,
            max_in_flight_per_endpoint: 16,
        }
    }
}

/// `[cors]`
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CorsConfig {
    /// Origins (`https://app.example.com`, or `*`) whose pages may call the API; none by
    /// default.
    pub allowed_origins: Vec<String>,
}

/// `[smtp]`: how admin e-mails are sent. Without a host they go to `webhooks.outbox_dir`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SmtpConfig {
    /// SMTP relay host; absent: write e-mails to the outbox directory.
    pub host: Option<String>,
    /// SMTP port: 25 for a local relay, 587 with `starttls`, 465 with `tls`.
    pub port: u16,
    /// Sender address.
    pub from: String,
    /// How the connection is protected.
    pub tls: SmtpTls,
    /// User name for SMTP AUTH (with `password`; needs `tls`).
    pub username: Option<String>,
    /// Password for SMTP AUTH; best set as `SVCGATE_SMTP_PASSWORD` from a secret.
    pub password: Option<String>,
    /// A PEM file of CA certificates to trust besides the system's (a relay with a private CA).
    pub tls_ca_file: Option<String>,
}

/// `smtp.tls`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SmtpTls {
    /// Plain SMTP, as to a relay on the node or in the pod.
    None,
    /// Upgrade with STARTTLS, which the server must offer (port 587).
    Starttls,
    /// TLS from the first byte (port 465).
    Tls,
}

impl Default for SmtpConfig {
    fn default() -> Self {
        Self {
            host: None,
            port: 25,
            from: "svcgate@example.com".to_string(),
            tls: SmtpTls::None,
            username: None,
            password: None,
            tls_ca_file: None,
        }
    }
}

/// `[limits]`
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LimitsConfig {
    /// Requests per minute of a live key, across every replica.
    pub live_requests_per_minute: u32,
    /// Requests a live key may send at once.
    pub live_burst: u32,
    /// Keys that do not exist one client address may present per minute (per replica); past
    /// it, its requests with keys that are not cached are refused without a store read.
    pub unknown_keys_per_minute: u32,
    /// Keys that do not exist all clients together may present per minute (per replica,
    /// clients without an address of their own included); past it, every request with a key
    /// that is not cached is refused without a store read.
    pub unknown_keys_per_minute_total: u32,
    /// Requests per minute of a test key.
    pub test_requests_per_minute: u32,
    /// Requests a test key may send at once.
    pub test_burst: u32,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        Self {
            live_requests_per_minute: 6_000,
            live_burst: 200,
            unknown_keys_per_minute: 60,
            unknown_keys_per_minute_total: 6_000,
            test_requests_per_minute: 600,
            test_burst: 50,
        }
    }
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

/// One `[[routes]]` entry: a forwarded operation and the scope it needs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteConfig {
    /// HTTP method.
    pub method: String,
    /// Path template; `{name}` matches one segment.
    pub path: String,
    /// The scope a key needs.
    pub scope: String,
    /// Credits charged when the backend reports no `Service-Credits`.
    #[serde(default)]
    pub price: Credits,
}

impl RouteConfig {
    fn new(method: &str, path: &str, scope: &str, price_micros: i64) -> Self {
        Self {
            method: method.into(),
            path: path.into(),
            scope: scope.into(),
            price: Credits::from_micros(price_micros),
        }
    }
}

/// The SPEC's route table.
pub fn default_routes() -> Vec<RouteConfig> {
    const C: i64 = 1_000_000;
    vec![
        RouteConfig::new("GET", "/v1/models", "models:read", 0),
        RouteConfig::new("POST", "/v1/chat/completions", "chat.completions:create", C),
        RouteConfig::new("POST", "/v1/images/generations", "images:create", 4 * C),
        RouteConfig::new("POST", "/v1/images/batches", "images:create", 4 * C),
        RouteConfig::new("POST", "/v1/videos", "videos:create", 20 * C),
        RouteConfig::new("POST", "/v1/audio/speech", "voice:create", 2 * C),
        RouteConfig::new("POST", "/v1/agents/runs", "agents:run", 10 * C),
        RouteConfig::new("POST", "/v1/agents/runs/{id}/approve", "agents:run", 0),
    ]
}

/// A configuration problem, naming the key it is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// Dotted key, e.g. `server.listen`, or the environment variable.
    pub key: String,
    /// What is wrong with it.
    pub reason: String,
}

impl Problem {
    fn new(key: impl Into<String>, reason: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            reason: reason.into(),
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

    /// The effective route table: the configured one, or the SPEC's defaults.
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
        let mut problems = Vec::new();
        let s = &self.server;
        let mut listeners = Vec::new();
        for (key, value) in [
            ("server.listen", &s.listen),
            ("server.admin_listen", &s.admin_listen),
            ("server.metrics_listen", &s.metrics_listen),
        ] {
            match value.parse::<SocketAddr>() {
                Ok(addr) => listeners.push((key, addr)),
                Err(_) => problems.push(Problem::new(
                    key,
                    format!("'{value}' is not an IP address with a port, like 0.0.0.0:8080"),
                )),
            }
        }
        for (i, (key, addr)) in listeners.iter().enumerate() {
            if let Some((other, _)) = listeners[..i]
                .iter()
                .find(|(_, a)| a.port() == addr.port() && addr.port() != 0)
            {
                problems.push(Problem::new(*key, format!("same port as {other}")));
            }
        }
        let placeholder = s.admin_token.to_ascii_lowercase().contains("change-me");
        if role == Role::Worker {
            // No admin API: the token is not read.
        } else if s.admin_token.trim().is_empty() {
            problems.push(Problem::new("server.admin_token", "must not be empty"));
        } else if s.admin_token.trim() != s.admin_token {
            // No `Authorization` header can carry it: every admin call would be refused.
            problems.push(Problem::new(
                "server.admin_token",
                "starts or ends with whitespace (a trailing newline from a Secret made from a \
                 file?); no request can present it",
            ));
        } else if placeholder && self.store.kind == StoreKind::Redis {
            // A shared store is production: a token copied from an example (the Secret's
            // `CHANGE-ME-…`) is known to everyone, the model container next door included.
            problems.push(Problem::new(
                "server.admin_token",
                "is a placeholder ('change-me'); set SVCGATE_SERVER_ADMIN_TOKEN to a random secret",
            ));
        } else if s.admin_token == DEMO_ADMIN_TOKEN {
            if let Some((_, addr)) = listeners.iter().find(|(k, _)| *k == "server.admin_listen") {
                if !addr.ip().is_loopback() {
                    problems.push(Problem::new(
                        "server.admin_token",
                        "the demo token 'change-me' is only allowed on a loopback admin_listen; \
                         set SVCGATE_SERVER_ADMIN_TOKEN",
                    ));
                }
            }
        }
        if self.server.keepalive_timeout_seconds == 0 {
            problems.push(Problem::new(
                "server.keepalive_timeout_seconds",
                "must be greater than 0",
            ));
        }
        if self.keys.rotation_grace_seconds > crate::keys::MAX_GRACE_SECONDS {
            problems.push(Problem::new(
                "keys.rotation_grace_seconds",
                format!(
                    "must be at most {} (30 days)",
                    crate::keys::MAX_GRACE_SECONDS
                ),
            ));
        }
        if let Err(e) = tracing_subscriber::EnvFilter::try_new(&self.log.level) {
            problems.push(Problem::new("log.level", format!("not a log filter: {e}")));
        }
        let w = &self.webhooks;
        if w.retry_schedule_seconds.len() > 20 {
            problems.push(Problem::new(
                "webhooks.retry_schedule_seconds",
                "at most 20 retries",
            ));
        }
        // Retries of events the log still holds (30 days), each at least a second apart.
        let schedule: u64 = w
            .retry_schedule_seconds
            .iter()
            .fold(0, |sum, s| sum.saturating_add(*s));
        if w.retry_schedule_seconds.contains(&0) || schedule > crate::events::RETENTION_SECS {
            problems.push(Problem::new(
                "webhooks.retry_schedule_seconds",
                "each wait at least 1 s, all of them within 30 days",
            ));
        }
        if self.metering.audit_retention_days == 0 {
            // Every write would trim the whole audit log.
            problems.push(Problem::new(
                "metering.audit_retention_days",
                "must be at least 1",
            ));
        }
        if w.timeout_seconds == 0 || w.timeout_seconds > 60 {
            problems.push(Problem::new("webhooks.timeout_seconds", "must be 1-60"));
        }
        if w.max_in_flight == 0 {
            problems.push(Problem::new("webhooks.max_in_flight", "must be at least 1"));
        }
        if w.max_in_flight_per_endpoint == 0 || w.max_in_flight_per_endpoint > w.max_in_flight {
            problems.push(Problem::new(
                "webhooks.max_in_flight_per_endpoint",
                "must be 1 to webhooks.max_in_flight",
            ));
        }
        if self.smtp.from.parse::<lettre::message::Mailbox>().is_err() {
            problems.push(Problem::new("smtp.from", "not an e-mail address"));
        }
        problems.extend(validate_smtp(&self.smtp));
        if let Some(bad) = self
            .server
            .trusted_proxies
            .iter()
            .find(|p| crate::proxy::client_ip::parse(p).is_none())
        {
            problems.push(Problem::new(
                "server.trusted_proxies",
                format!("'{bad}' is not an address or CIDR block"),
            ));
        }
        for origin in &self.cors.allowed_origins {
            if !crate::proxy::cors::is_valid_origin(origin) {
                problems.push(Problem::new(
                    "cors.allowed_origins",
                    "each must be \"*\" or scheme://host[:port] in lower case, with no path",
                ));
                break;
            }
        }
        if self.store.kind == StoreKind::Redis {
            if let Err(e) = redis::Client::open(self.store.url.as_str()) {
                problems.push(Problem::new("store.url", format!("not a Redis URL: {e}")));
            }
            if let Err(problem) = self.store.tls() {
                problems.push(problem);
            }
            problems.extend(self.store.validate_sentinels());
        }
        if self.store.sync_interval_ms == 0 {
            problems.push(Problem::new(
                "store.sync_interval_ms",
                "must be greater than 0",
            ));
        }
        if self.store.namespace.is_empty()
            || !self
                .store
                .namespace
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.')
        {
            problems.push(Problem::new(
                "store.namespace",
                "must be non-empty and made of [A-Za-z0-9._-]",
            ));
        }
        for (key, addr) in [
            ("upstream.live", &self.upstream.live),
            ("upstream.sandbox", &self.upstream.sandbox),
        ] {
            if let Some(addr) = addr {
                if let Err(reason) = resolve(addr) {
                    problems.push(Problem::new(key, reason));
                }
            }
        }
        for (key, ms) in [
            (
                "upstream.connect_timeout_ms",
                self.upstream.connect_timeout_ms,
            ),
            ("upstream.read_timeout_ms", self.upstream.read_timeout_ms),
            ("upstream.write_timeout_ms", self.upstream.write_timeout_ms),
        ] {
            if ms == 0 {
                problems.push(Problem::new(key, "must be greater than 0"));
            }
        }
        if self.metering.flush_interval_ms == 0 {
            problems.push(Problem::new(
                "metering.flush_interval_ms",
                "must be greater than 0",
            ));
        }
        if self.metering.spool_dir.trim().is_empty() {
            problems.push(Problem::new("metering.spool_dir", "must not be empty"));
        }
        for (key, v) in [
            (
                "limits.live_requests_per_minute",
                self.limits.live_requests_per_minute,
            ),
            ("limits.live_burst", self.limits.live_burst),
            (
                "limits.test_requests_per_minute",
                self.limits.test_requests_per_minute,
            ),
            ("limits.test_burst", self.limits.test_burst),
            (
                "limits.unknown_keys_per_minute",
                self.limits.unknown_keys_per_minute,
            ),
            (
                "limits.unknown_keys_per_minute_total",
                self.limits.unknown_keys_per_minute_total,
            ),
        ] {
            if v == 0 {
                problems.push(Problem::new(key, "must be greater than 0"));
            }
        }
        for (i, b) in self.metering.project_budgets.iter().enumerate() {
            if !crate::proxy::policy::is_valid_project(&b.project) {
                problems.push(Problem::new(
                    format!("metering.project_budgets[{i}].project"),
                    "must be 1-64 characters of [A-Za-z0-9._-]",
                ));
            }
        }
        problems.extend(validate_routes(&self.routes()));
        if problems.is_empty() {
            Ok(())
        } else {
            Err(ConfigError::Invalid(problems))
        }
    }
}

/// Resolves `host:port` once, at start-up, to the first address it names.
pub fn resolve(addr: &str) -> Result<SocketAddr, String> {
    let mut addrs = addr
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve '{addr}': {e}"))?;
    addrs
        .next()
        .ok_or_else(|| format!("'{addr}' resolves to no address"))
}

fn validate_smtp(smtp: &SmtpConfig) -> Vec<Problem> {
    let mut problems = Vec::new();
    if let Some(host) = &smtp.host {
        // A name or an address, as a relay is written; no scheme, port or path.
        let is_host = !host.is_empty()
            && host.len() <= 253
            && host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-.:[]_".contains(&b));
        if !is_host {
            problems.push(Problem::new(
                "smtp.host",
                "not a host name or address (the port goes in smtp.port)",
            ));
        }
    }
    if smtp.port == 0 {
        problems.push(Problem::new("smtp.port", "must be 1 to 65535"));
    }
    match (&smtp.username, &smtp.password) {
        (Some(_), None) => problems.push(Problem::new("smtp.password", "smtp.username needs it")),
        (None, Some(_)) => problems.push(Problem::new("smtp.username", "smtp.password needs it")),
        (Some(_), Some(_)) if smtp.tls == SmtpTls::None => problems.push(Problem::new(
            "smtp.tls",
            "a password is sent only over TLS: set \"starttls\" or \"tls\"",
        )),
        _ => {}
    }
    if let Some(path) = &smtp.tls_ca_file {
        if smtp.tls == SmtpTls::None {
            problems.push(Problem::new(
                "smtp.tls_ca_file",
                "needs smtp.tls = \"starttls\" or \"tls\"",
            ));
        } else if let Err(e) = std::fs::read(path) {
            problems.push(Problem::new(
                "smtp.tls_ca_file",
                format!("cannot read {path}: {e}"),
            ));
        }
    }
    problems
}

fn validate_routes(routes: &[RouteConfig]) -> Vec<Problem> {
    let mut problems = Vec::new();
    for (i, route) in routes.iter().enumerate() {
        let key = |field: &str| format!("routes[{i}].{field}");
        if route.method.parse::<http::Method>().is_err() || route.method.is_empty() {
            problems.push(Problem::new(key("method"), "not an HTTP method"));
        }
        if !route.path.starts_with("/v1/") {
            problems.push(Problem::new(key("path"), "must start with /v1/"));
        }
        if !is_valid_scope(&route.scope) {
            problems.push(Problem::new(
                key("scope"),
                format!("'{}' is not a scope like resource:action", route.scope),
            ));
        }
    }
    if let Err(e) = crate::proxy::routes::RouteTable::new(routes) {
        problems.push(Problem::new("routes", e));
    }
    problems
}

/// `SVCGATE_*` variables that are not settings: the configuration file's path and what the
/// CLI's client commands (`keys`, `events`, `listen`) read.
const CLI_VARIABLES: [&str; 4] = ["CONFIG", "ADMIN_URL", "GATEWAY_URL", "API_KEY"];

/// Applies `SVCGATE_<SECTION>_<KEY>` overrides to the parsed file.
///
/// A value becomes a string when the setting is a string (so `SVCGATE_SERVER_ADMIN_TOKEN=1234`
/// stays a token), and is read as a TOML value otherwise (`8`, `true`, `[60, 300]`).
/// A deserializer's message with the values it quotes (between backticks) left out: the value
/// of a mistyped setting may be a secret (`admin_token = 1234…`).
fn without_quoted_values(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    for (i, part) in message.split('`').enumerate() {
        out.push_str(if i % 2 == 1 { "…" } else { part });
    }
    out
}

/// Whether `SVCGATE_<rest>=value` is a Kubernetes service link, not a setting: a pod created
/// after a Service named `svcgate` gets `SVCGATE_SERVICE_HOST`, `SVCGATE_SERVICE_PORT[_NAME]`,
/// `SVCGATE_PORT` (`tcp://10.0.0.1:80`) and `SVCGATE_PORT_80_TCP[_PROTO|_PORT|_ADDR]`, and one
/// named `svcgate-metrics` the same names with `METRICS_` after `SVCGATE_`. (`SVCGATE_SMTP_PORT`
/// is a setting, unless it holds an address such as `tcp://…`.)
fn is_service_link(rest: &str, value: &str) -> bool {
    let words: Vec<&str> = rest.split('_').collect();
    let address = ["tcp://", "udp://", "sctp://"]
        .iter()
        .any(|scheme| value.starts_with(scheme));
    words.iter().enumerate().any(|(i, word)| {
        let next = |n: usize| words.get(i + n).copied();
        match *word {
            "SERVICE" => matches!(next(1), Some("HOST" | "PORT")),
            "PORT" => match next(1) {
                None => address,
                Some(port) => {
                    port.bytes().all(|b| b.is_ascii_digit())
                        && matches!(next(2), Some("TCP" | "UDP" | "SCTP"))
                }
            },
            _ => false,
        }
    })
}

fn apply_env(
    table: &mut toml::Table,
    env: impl IntoIterator<Item = (String, String)>,
) -> Result<(), Problem> {
    let defaults = match toml::Value::try_from(Config::default()) {
        Ok(toml::Value::Table(t)) => t,
        _ => toml::Table::new(),
    };
    for (name, value) in env {
        let Some(rest) = name.strip_prefix(ENV_PREFIX) else {
            continue;
        };
        // `SVCGATE_CONFIG` names the file itself, and the CLI's commands read where the admin
        // API and the gateway are and the key to call with: not settings of the server.
        if CLI_VARIABLES.contains(&rest) {
            continue;
        }
        if is_service_link(rest, &value) {
            continue;
        }
        let rest = rest.to_ascii_lowercase();
        let Some((section, key)) = rest.split_once('_') else {
            return Err(Problem::new(name, "expected SVCGATE_<SECTION>_<KEY>"));
        };
        let Some(toml::Value::Table(section_defaults)) = defaults.get(section) else {
            return Err(Problem::new(name, format!("unknown section '{section}'")));
        };
        let is_string = match section_defaults.get(key) {
            Some(toml::Value::String(_)) => true,
            Some(_) => false,
            // Optional settings (no default) are addresses or names: strings.
            None if is_optional_string(section, key) => true,
            None => {
                return Err(Problem::new(
                    name,
                    format!("unknown setting '{key}' in section '{section}'"),
                ))
            }
        };
        if value.is_empty() && !section_defaults.contains_key(key) {
            // An optional setting set to nothing is unset (what a template writes for "no
            // sandbox"), also over the file's value.
            if let Some(toml::Value::Table(t)) = table.get_mut(section) {
                t.remove(key);
            }
            continue;
        }
        let parsed = if is_string {
            toml::Value::String(value)
        } else {
            parse_toml_value(&value).ok_or_else(|| {
                Problem::new(name.clone(), format!("'{value}' is not a valid value"))
            })?
        };
        let entry = table
            .entry(section.to_string())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        match entry {
            toml::Value::Table(t) => {
                t.insert(key.to_string(), parsed);
            }
            _ => return Err(Problem::new(section, "must be a table")),
        }
    }
    Ok(())
}

fn is_optional_string(section: &str, key: &str) -> bool {
    matches!(
        (section, key),
        ("upstream", "live")
            | ("upstream", "sandbox")
            | ("smtp", "host")
            | ("smtp", "username")
            | ("smtp", "password")
            | ("smtp", "tls_ca_file")
            | ("store", "tls_ca_file")
            | ("store", "tls_cert_file")
            | ("store", "tls_key_file")
            | ("store", "sentinel_master")
            | ("store", "sentinel_password")
    )
}

fn parse_toml_value(text: &str) -> Option<toml::Value> {
    let doc: toml::Table = format!("v = {text}").parse().ok()?;
    doc.get("v").cloned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

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
        // The seed's retry schedule (1 m, 5 m, 30 m, 2 h, 12 h) and delivery timeout, and the
        // SPEC's ports, without a file.
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
}
