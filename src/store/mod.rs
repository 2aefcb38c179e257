//! The shared state of a deployment, as each area declares it: keys and tokens
//! ([`KeyStore`]), usage and budgets ([`UsageStore`]), audit ([`AuditStore`]), the event log
//! ([`EventLog`]), the delivery queue ([`DeliveryQueue`]), pause notices ([`NoticeStore`]) and
//! listen slots ([`ListenSlots`]), simulated jobs ([`SandboxStore`]), dashboard sessions
//! ([`SessionStore`]).
//!
//! Implementations: [`MemoryStore`] for the zero-config demo and unit tests; Redis for
//! production. Each implements every area's trait; [`Stores`] hands them out by area. Every
//! method is one round trip to the backing store, so the request path never chains several of
//! them.

pub mod config;
pub(crate) mod memory;
mod redis;

use std::sync::Arc;

pub use crate::dashboard::store::SessionStore;
pub use crate::keys::operators::OperatorStore;
pub use crate::keys::store::{KeyChange, KeyChanges, KeyStore, Rotation, WorkspaceChange};
pub use crate::metering::store::{AuditStore, UsageReport, UsageStore};
pub use crate::sandbox::store::SandboxStore;
pub use crate::shared::store::{StoreError, StoreHealth};
pub use crate::webhooks::store::{
    too_many_endpoints, AfterAttempt, ClaimRequest, ClaimedDelivery, DeliveryQueue, EndpointChange,
    EndpointRetry, EventFeed, EventLog, EventPage, ListenSlots, NoticeStore, QueueStats, Saved,
    WorkerStores,
};
pub use config::{StoreConfig, StoreKind};
pub use memory::MemoryStore;
pub use redis::{sentinel_address, IndexFillTiming, RedisStore, Sentinels, SCHEMA_VERSION};

/// One backing store, by area: what `serve` hands to each part of the gateway.
#[derive(Clone)]
pub struct Stores {
    /// The store as a whole: health, connections, upkeep.
    pub health: Arc<dyn StoreHealth>,
    /// Workspaces, keys and scoped tokens.
    pub keys: Arc<dyn KeyStore>,
    /// Operator tokens of the admin API.
    pub operators: Arc<dyn OperatorStore>,
    /// Spend, rate counts and budgets.
    pub usage: Arc<dyn UsageStore>,
    /// The audit log.
    pub audit: Arc<dyn AuditStore>,
    /// The event log.
    pub events: Arc<dyn EventLog>,
    /// Webhook endpoints and their deliveries.
    pub deliveries: Arc<dyn DeliveryQueue>,
    /// Pause notices owed to admins.
    pub notices: Arc<dyn NoticeStore>,
    /// The slots of `svcgate listen` streams.
    pub listen: Arc<dyn ListenSlots>,
    /// Simulated jobs and their scheduled events.
    pub sandbox: Arc<dyn SandboxStore>,
    /// The dashboard's sessions and sign-in links.
    pub sessions: Arc<dyn SessionStore>,
}

impl Stores {
    /// Every area served by `store`.
    pub fn of<S>(store: Arc<S>) -> Self
    where
        S: StoreHealth
            + KeyStore
            + OperatorStore
            + UsageStore
            + AuditStore
            + EventLog
            + DeliveryQueue
            + NoticeStore
            + ListenSlots
            + SandboxStore
            + SessionStore,
    {
        Self {
            health: store.clone(),
            keys: store.clone(),
            operators: store.clone(),
            usage: store.clone(),
            audit: store.clone(),
            events: store.clone(),
            deliveries: store.clone(),
            notices: store.clone(),
            listen: store.clone(),
            sandbox: store.clone(),
            sessions: store,
        }
    }

    /// What a webhook worker reads and writes.
    pub fn worker(&self) -> WorkerStores {
        WorkerStores {
            events: self.events.clone(),
            deliveries: self.deliveries.clone(),
            notices: self.notices.clone(),
            workspaces: self.keys.clone(),
        }
    }
}
