//! `[store]`: where shared state lives, and its checks.

use serde::{Deserialize, Serialize};

use crate::shared::problem::Problem;

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
    /// Checks the section; every problem, in order.
    pub fn validate(&self) -> Vec<Problem> {
        let mut problems = Vec::new();
        if self.kind == StoreKind::Redis {
            if let Err(e) = redis::Client::open(self.url.as_str()) {
                problems.push(Problem::new("store.url", format!("not a Redis URL: {e}")));
            }
            if let Err(problem) = self.tls() {
                problems.push(problem);
            }
            problems.extend(self.validate_sentinels());
        }
        if self.sync_interval_ms == 0 {
            problems.push(Problem::new(
                "store.sync_interval_ms",
                "must be greater than 0",
            ));
        }
        if self.namespace.is_empty()
            || !self
                .namespace
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.')
        {
            problems.push(Problem::new(
                "store.namespace",
                "must be non-empty and made of [A-Za-z0-9._-]",
            ));
        }
        problems
    }

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
    pub fn cache(&self) -> crate::keys::cache::CacheConfig {
        crate::keys::cache::CacheConfig {
            max_staleness: std::time::Duration::from_secs(self.cache_staleness_seconds),
            negative_ttl: std::time::Duration::from_secs(self.negative_cache_seconds),
            negative_capacity: self.negative_cache_entries,
            poll_interval: std::time::Duration::from_millis(self.sync_interval_ms),
            ..crate::keys::cache::CacheConfig::default()
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
