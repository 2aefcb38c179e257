//! The request path's settings: `[upstream]`, `[cors]`, `[[routes]]` and the trusted proxies
//! of `[server]`; and their checks.

use serde::{Deserialize, Serialize};
use std::net::{SocketAddr, ToSocketAddrs};

use crate::keys::scopes::is_valid_scope;
use crate::shared::problem::Problem;
use crate::shared::Credits;

/// The value of `upstream.live` that asks for the built-in simulator, on a store where leaving
/// it out is refused.
pub const SIMULATED: &str = "simulated";

/// `[upstream]`
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct UpstreamConfig {
    /// Production backend `host:port`; `"simulated"` (or absent, on the in-memory store):
    /// built-in simulated responses, never billed.
    pub live: Option<String>,
    /// Sandbox backend for `svc_test_` keys; absent: simulated responses.
    pub sandbox: Option<String>,
    /// TCP connect timeout (milliseconds).
    pub connect_timeout_ms: u64,
    /// Longest wait for the next bytes of the backend's response (milliseconds).
    pub read_timeout_ms: u64,
    /// Longest wait to write to the backend (milliseconds).
    pub write_timeout_ms: u64,
    /// Send the key's metadata to the backend as `Service-Key-Metadata` (compact JSON).
    pub forward_key_metadata: bool,
}

impl Default for UpstreamConfig {
    fn default() -> Self {
        Self {
            live: None,
            sandbox: None,
            connect_timeout_ms: 1_000,
            read_timeout_ms: 60_000,
            write_timeout_ms: 60_000,
            forward_key_metadata: false,
        }
    }
}

impl UpstreamConfig {
    /// Checks the section; every problem, in order.
    pub fn validate(&self) -> Vec<Problem> {
        let mut problems = Vec::new();
        for (key, addr) in [
            ("upstream.live", &self.live),
            ("upstream.sandbox", &self.sandbox),
        ] {
            if let Some(addr) = addr.as_deref().filter(|a| *a != SIMULATED) {
                if let Err(reason) = resolve(addr) {
                    problems.push(Problem::new(key, reason));
                }
            }
        }
        for (key, ms) in [
            ("upstream.connect_timeout_ms", self.connect_timeout_ms),
            ("upstream.read_timeout_ms", self.read_timeout_ms),
            ("upstream.write_timeout_ms", self.write_timeout_ms),
        ] {
            if ms == 0 {
                problems.push(Problem::new(key, "must be greater than 0"));
            }
        }
        problems
    }
}

impl UpstreamConfig {
    /// The production backend's address; `None` for the simulator.
    pub fn live_backend(&self) -> Option<&str> {
        self.live.as_deref().filter(|a| *a != SIMULATED)
    }

    /// The sandbox backend's address; `None` for the simulator.
    pub fn sandbox_backend(&self) -> Option<&str> {
        self.sandbox.as_deref().filter(|a| *a != SIMULATED)
    }

    /// On a shared store (a production deployment): live keys get simulated answers only if
    /// the file says so, never because an address was forgotten.
    pub fn validate_shared(&self) -> Vec<Problem> {
        match self.live {
            Some(_) => Vec::new(),
            None => vec![Problem::new(
                "upstream.live",
                "not set, on a shared store: live keys would get simulated answers; set the \
                 production backend's host:port, or live = \"simulated\" to mean it",
            )],
        }
    }
}

/// `[simulator]`: the built-in simulated backend's async jobs (image batches, video and voice
/// renders, agent runs), which finish and send their events like the real ones.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SimulatorConfig {
    /// Seconds from a simulated job's creation to its completion (and its event).
    pub job_seconds: u64,
}

impl Default for SimulatorConfig {
    fn default() -> Self {
        Self { job_seconds: 3 }
    }
}

impl SimulatorConfig {
    /// Checks the section; every problem, in order.
    pub fn validate(&self) -> Vec<Problem> {
        match self.job_seconds {
            0..=3_600 => Vec::new(),
            _ => vec![Problem::new(
                "simulator.job_seconds",
                "must be at most 3600",
            )],
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

impl CorsConfig {
    /// Checks the section; every problem, in order.
    pub fn validate(&self) -> Vec<Problem> {
        let mut problems = Vec::new();
        for origin in &self.allowed_origins {
            if !super::cors::is_valid_origin(origin) {
                problems.push(Problem::new(
                    "cors.allowed_origins",
                    "each must be \"*\" or scheme://host[:port] in lower case, with no path",
                ));
                break;
            }
        }
        problems
    }
}

/// Checks `server.trusted_proxies`: each an address or a CIDR block.
pub fn validate_trusted_proxies(trusted_proxies: &[String]) -> Vec<Problem> {
    let mut problems = Vec::new();
    if let Some(bad) = trusted_proxies
        .iter()
        .find(|p| super::client_ip::parse(p).is_none())
    {
        problems.push(Problem::new(
            "server.trusted_proxies",
            format!("'{bad}' is not an address or CIDR block"),
        ));
    }
    problems
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
    /// Whether the route takes protocol upgrades (WebSocket): refused on every other route.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub upgrade: bool,
    /// Credits reserved against the caller's budgets while a request is in flight, for a
    /// route whose cost the backend reports (`Service-Credits`); default: the price.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reserve: Option<Credits>,
}

impl RouteConfig {
    fn new(method: &str, path: &str, scope: &str, price_micros: i64) -> Self {
        Self {
            method: method.into(),
            path: path.into(),
            scope: scope.into(),
            price: Credits::from_micros(price_micros),
            upgrade: false,
            reserve: None,
        }
    }
}

/// The default route table, used when the configuration gives no `[[routes]]`.
pub fn default_routes() -> Vec<RouteConfig> {
    const C: i64 = 1_000_000;
    vec![
        RouteConfig::new("GET", "/v1/models", "models:read", 0),
        RouteConfig::new("POST", "/v1/chat/completions", "chat.completions:create", C),
        RouteConfig::new("POST", "/v1/images/generations", "images:create", 4 * C),
        RouteConfig::new("POST", "/v1/images/batches", "images:create", 4 * C),
        RouteConfig::new("GET", "/v1/images/batches/{id}", "images:create", 0),
        RouteConfig::new("POST", "/v1/videos", "videos:create", 20 * C),
        RouteConfig::new("GET", "/v1/videos/{id}", "videos:create", 0),
        RouteConfig::new("POST", "/v1/audio/speech", "voice:create", 2 * C),
        RouteConfig::new("GET", "/v1/audio/speech/{id}", "voice:create", 0),
        RouteConfig::new("POST", "/v1/agents/runs", "agents:run", 10 * C),
        RouteConfig::new("GET", "/v1/agents/runs/{id}", "agents:run", 0),
        RouteConfig::new("POST", "/v1/agents/runs/{id}/approve", "agents:run", 0),
    ]
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

/// Checks a route table; every problem, in order.
pub fn validate_routes(routes: &[RouteConfig]) -> Vec<Problem> {
    let mut problems = Vec::new();
    for (i, route) in routes.iter().enumerate() {
        let key = |field: &str| format!("routes[{i}].{field}");
        if route.method.parse::<http::Method>().is_err() || route.method.is_empty() {
            problems.push(Problem::new(key("method"), "not an HTTP method"));
        }
        if !route.path.starts_with("/v1/") {
            problems.push(Problem::new(key("path"), "must start with /v1/"));
        }
        if route.reserve.is_some_and(|r| r < Credits::ZERO) {
            problems.push(Problem::new(key("reserve"), "must not be negative"));
        }
        if !is_valid_scope(&route.scope) {
            problems.push(Problem::new(
                key("scope"),
                format!("'{}' is not a scope like resource:action", route.scope),
            ));
        }
    }
    if let Err(e) = super::routes::RouteTable::new(routes) {
        problems.push(Problem::new("routes", e));
    }
    problems
}
