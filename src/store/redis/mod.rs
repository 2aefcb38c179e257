//! The Redis store: state shared by every gateway replica.
//!
//! Its keys are listed in [`layout`]; each area's operations are in a module of its own.
//!
//! The event log is consumed by the consumer group `webhooks`; see [`events`] for the entry
//! format backends may add.
//!
//! The key registry and the event log share one hash tag, `{ns}`, so that a key write, the
//! epoch bump, the change-log entry, an event it causes and the notification happen in one Lua
//! script, atomically, on Redis Cluster too. At about 500 bytes a key, one slot holds millions
//! of keys; high-volume counters go to other slots.

mod audit;
mod audit_codec;
mod changes;
mod connection;
mod deliveries;
mod events;
mod keys;
mod layout;
mod listen;
mod notices;
mod operators;
mod sandbox;
mod schema;
mod sessions;
mod streams;
mod tokens;
mod usage;
mod workspaces;

use self::{changes::*, events::*, layout::*, tokens::*, workspaces::*};
use super::{StoreError, StoreHealth};
use crate::keys::directory::MintedTokens;
use async_trait::async_trait;
use connection::Connections;
pub use connection::{sentinel_address, Sentinels};
use redis::aio::{ConnectionManager, MultiplexedConnection};
use redis::{AsyncCommands, Value};
pub use schema::SCHEMA_VERSION;
use std::sync::Arc;
use tokio::sync::Notify;
pub use workspaces::IndexFillTiming;

/// How long a key change waits for a replica to confirm it, behind Sentinels (under the
/// connection's 500 ms answer timeout: the wait holds up the commands behind it).
const REPLICA_WAIT_MS: u64 = 300;

/// Optimistic update attempts before giving up on a hot key.
const UPDATE_ATTEMPTS: usize = 16;

/// What a compare-and-set script's answer means for the value it was to write: written (1),
/// gone (-1), or changed meanwhile (`None`: read it again).
fn settled<T>(answer: i64, next: T) -> Option<Option<T>> {
    match answer {
        1 => Some(Some(next)),
        -1 => Some(None),
        _ => None,
    }
}

/// The error for a value that kept changing under [`UPDATE_ATTEMPTS`] compare-and-sets.
fn changing_too_often(what: &str, id: &str) -> StoreError {
    StoreError::Conflict(format!("{what} {id} is changing too often; retry"))
}

/// Workspaces and keys in Redis.
pub struct RedisStore {
    connections: Arc<Connections>,
    layout: Layout,
    changed: Arc<Notify>,
    /// Tokens minted on any replica, heard of on the tokens channel.
    minted: Arc<MintedTokens>,
    audit_retention_secs: u64,
    /// Audit records a page of a listing decodes at most.
    audit_scan_budget: usize,
    /// Compresses audit batches for their stream entries.
    audit_codec: audit_codec::AuditCodec,
    /// Behind Sentinels: a master with replicas, any of which a failover may promote.
    replicated: bool,
    /// Held while this replica fills the workspace index or waits for a fill, so a listing
    /// during `serve`'s start-up fill waits for it instead of scanning too
    /// ([`RedisStore::fill_workspace_index`]). A scan a listing started goes on without it,
    /// under its lease, which keeps the others waiting.
    filling: tokio::sync::Mutex<()>,
    /// The runtime that drives the store's connections: a scan a listing starts runs there,
    /// not on the listing's (the admin service's, stopped first at shutdown).
    runtime: tokio::runtime::Handle,
    /// The pace of the workspace index fill and of its lease.
    index_fill: IndexFillTiming,
}

impl RedisStore {
    /// Connects lazily (the gateway starts, and reports not-ready, while Redis is down) and
    /// starts the change listener. Must run inside the Tokio runtime that will drive the
    /// connection for the life of the process.
    pub fn connect(url: &str, namespace: &str) -> Result<Self, StoreError> {
        Self::connect_with_tls(url, namespace, None)
    }

    /// [`connect`](Self::connect) to a `rediss://` URL with a CA of its own to trust or a
    /// client certificate (`None`: the system's roots, no client certificate).
    pub fn connect_with_tls(
        url: &str,
        namespace: &str,
        tls: Option<redis::TlsCertificates>,
    ) -> Result<Self, StoreError> {
        Self::connect_with(url, namespace, tls, None)
    }

    /// [`connect_with_tls`](Self::connect_with_tls), and with `sentinels`, to the master they
    /// name, followed through failovers (`url` then gives the credentials, database and TLS,
    /// and the node to start with).
    pub fn connect_with(
        url: &str,
        namespace: &str,
        tls: Option<redis::TlsCertificates>,
        sentinels: Option<&Sentinels>,
    ) -> Result<Self, StoreError> {
        let client = connection::client_for(url, tls.clone())?;
        let connections = match sentinels {
            Some(sentinels) => Connections::via_sentinels(client, sentinels, tls)?,
            None => Connections::direct(client)?,
        };
        let layout = Layout::new(namespace);
        let changed = Arc::new(Notify::new());
        let minted = Arc::new(MintedTokens::default());
        tokio::spawn(listen_for_changes(
            Arc::downgrade(&connections),
            Channels {
                changed: layout.channel(),
                minted: layout.tokens_channel(),
                live_tokens: layout.live_tokens(),
            },
            changed.clone(),
            minted.clone(),
        ));
        Ok(Self {
            connections,
            layout,
            changed,
            minted,
            audit_retention_secs: 30 * 86_400,
            audit_scan_budget: audit::AUDIT_SCAN_BUDGET,
            audit_codec: audit_codec::AuditCodec::new(),
            replicated: sentinels.is_some(),
            filling: tokio::sync::Mutex::new(()),
            runtime: tokio::runtime::Handle::current(),
            index_fill: IndexFillTiming::default(),
        })
    }

    /// Where the store's connections go now (`host:port`): the master, with Sentinels.
    pub fn address(&self) -> String {
        self.connections.address()
    }

    /// Keeps audit records for `days` (default 30).
    pub fn with_audit_retention_days(mut self, days: u64) -> Self {
        self.audit_retention_secs = days.saturating_mul(86_400);
        self
    }

    /// Lets a page of an audit listing decode at most `records` (default
    /// [`AUDIT_SCAN_BUDGET`](audit::AUDIT_SCAN_BUDGET)).
    pub fn with_audit_scan_budget(mut self, records: usize) -> Self {
        self.audit_scan_budget = records.max(1);
        self
    }

    /// Paces the workspace index fill and its lease by `timing` instead of the defaults.
    pub fn with_index_fill_timing(mut self, timing: IndexFillTiming) -> Self {
        self.index_fill = timing;
        self
    }

    fn conn(&self) -> ConnectionManager {
        self.connections.manager()
    }

    /// One page of a stream: `XRANGE` (oldest first, `from` ≤ `to`) or `XREVRANGE` (newest
    /// first, `from` ≥ `to`), at most `count` entries.
    async fn stream_range(
        &self,
        command: &str,
        key: &str,
        from: &str,
        to: &str,
        count: usize,
    ) -> Result<Vec<redis::streams::StreamId>, StoreError> {
        let reply: Value = redis::cmd(command)
            .arg(key)
            .arg(from)
            .arg(to)
            .arg("COUNT")
            .arg(count)
            .query_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        streams::range(reply)
    }

    /// Behind Sentinels, waits until a replica has this connection's writes. A key change
    /// (a revocation, an end of grace, fewer scopes) is confirmed only then: replication is
    /// asynchronous, and a failover right after a change no replica had would undo it, and
    /// the revoked key would work again everywhere. Unconfirmed, the change is an error (503):
    /// the caller retries, and the retry, which changes nothing more, is confirmed once a
    /// replica has caught up.
    async fn on_a_replica(&self) -> Result<(), StoreError> {
        if !self.replicated {
            return Ok(());
        }
        let confirmed: i64 = redis::cmd("WAIT")
            .arg(1)
            .arg(REPLICA_WAIT_MS)
            .query_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        if confirmed >= 1 {
            Ok(())
        } else {
            tracing::warn!("a change is on the Redis master, and no replica has confirmed it");
            Err(StoreError::Unavailable(
                "no replica confirmed the change".into(),
            ))
        }
    }

    async fn get_json<T: serde::de::DeserializeOwned>(
        &self,
        key: &str,
    ) -> Result<Option<T>, StoreError> {
        let raw: Option<String> = self.conn().get(key).await.map_err(unavailable)?;
        raw.map(|s| decode(key, &s)).transpose()
    }

    pub(super) fn prefix(&self) -> String {
        format!("{{{}}}", self.layout.ns)
    }

    /// A connection of its own, without a response timeout: for blocking reads.
    async fn blocking_connection(&self) -> Result<MultiplexedConnection, StoreError> {
        blocking_connection(&self.connections).await
    }
}

/// `Ok` for a write that created its record; a conflict naming it otherwise.
fn created_or_conflict(created: bool, what: &str, id: &str) -> Result<(), StoreError> {
    if created {
        Ok(())
    } else {
        Err(StoreError::Conflict(format!("{what} {id} exists")))
    }
}

fn unavailable(e: redis::RedisError) -> StoreError {
    StoreError::Unavailable(e.to_string())
}

/// `text` matched literally in a `SCAN … MATCH` pattern.
fn glob_escape(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped
}

fn decode<T: serde::de::DeserializeOwned>(key: &str, raw: &str) -> Result<T, StoreError> {
    serde_json::from_str(raw)
        .map_err(|e| StoreError::Unavailable(format!("unreadable record at {key}: {e}")))
}

fn encode<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_string(value).expect("records serialize")
}

#[async_trait]
impl StoreHealth for RedisStore {
    fn reopen_connections(&self) {
        if let Err(e) = self.connections.reconnect() {
            tracing::warn!(error = %e, "cannot reopen the Redis connections");
        }
    }

    async fn ping(&self) -> Result<(), StoreError> {
        let _: String = redis::cmd("PING")
            .query_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    async fn check_schema(&self) -> Result<(), StoreError> {
        self.check_schema_version().await
    }

    async fn prepare(&self) -> Result<(), StoreError> {
        self.check_schema_version().await?;
        self.fill_workspace_index(None).await?;
        self.write_schema_version().await
    }
}
