//! `[server]`: the process's listeners, admin token, threads and shutdown; and their checks.

use serde::{Deserialize, Serialize};
use std::net::SocketAddr;

use super::Role;
use crate::admin::config::{validate_admin_token, DEMO_ADMIN_TOKEN};
use crate::shared::problem::Problem;
use crate::store::StoreKind;

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

impl ServerConfig {
    /// Checks the section for `role`; every problem, in order. A shared store (`store_kind`)
    /// is production, where a placeholder admin token is refused.
    pub fn validate(&self, role: Role, store_kind: StoreKind) -> Vec<Problem> {
        let mut problems = Vec::new();
        let s = self;
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
        if role == Role::Worker {
            // No admin API: the token is not read.
        } else {
            let admin_listen = listeners
                .iter()
                .find(|(k, _)| *k == "server.admin_listen")
                .map(|(_, addr)| *addr);
            problems.extend(validate_admin_token(
                &s.admin_token,
                admin_listen,
                store_kind == StoreKind::Redis,
            ));
        }
        if self.keepalive_timeout_seconds == 0 {
            problems.push(Problem::new(
                "server.keepalive_timeout_seconds",
                "must be greater than 0",
            ));
        }
        problems
    }
}
