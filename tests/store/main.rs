//! The store contract, run against the in-memory store and against a real Redis: one module
//! per area, each case run on both stores ([`store_suite!`]); cases only Redis has are in
//! [`redis_only`].

#[path = "../common/mod.rs"]
mod common;

use common::*;
use std::sync::Arc;
use std::time::Duration;
use svcgate::events::{log_position, Event};
use svcgate::ids::{new_id, unix_now};
use svcgate::keys::KeyHash;
use svcgate::keys::{self, Environment, KeyParams, KeyRecord, KeyStatus, Scopes, Workspace};
use svcgate::metering::audit::{AuditCursor, AuditQuery, AuditRecord};
use svcgate::store::{
    AfterAttempt, AuditStore, ClaimRequest, ClaimedDelivery, DeliveryQueue, EventLog,
    IndexFillTiming, KeyStore, ListenSlots, MemoryStore, NoticeStore, RedisStore, Saved,
    StoreError, StoreHealth, UsageStore, SCHEMA_VERSION,
};
use svcgate::webhooks::delivery::{Attempt, Delivery, DeliveryStatus, DeliverySummary};
use svcgate::webhooks::endpoint::{Endpoint, EndpointStatus};
use svcgate::webhooks::notice::PauseNotice;

/// Every area's storage, as both stores provide it: what the suite runs against.
trait Store:
    StoreHealth
    + KeyStore
    + UsageStore
    + AuditStore
    + EventLog
    + DeliveryQueue
    + NoticeStore
    + ListenSlots
{
}

impl<T> Store for T where
    T: StoreHealth
        + KeyStore
        + UsageStore
        + AuditStore
        + EventLog
        + DeliveryQueue
        + NoticeStore
        + ListenSlots
        + ?Sized
{
}

fn workspace() -> Workspace {
    Workspace {
        id: new_id("ws"),
        name: "Acme".into(),
        admin_emails: vec!["ops@acme.example".into()],
        monthly_credits: None,
        credits_low_threshold: None,
        rate_limit: None,
        created_at: unix_now(),
    }
}

fn key(workspace: &str, created_at: u64) -> KeyRecord {
    keys::issue(
        KeyParams {
            workspace: workspace.into(),
            environment: Environment::Live,
            scopes: Scopes::new(["models:read"]),
            name: "k".into(),
            monthly_budget: None,
            expires_at: None,
            rate_limit: None,
            metadata: None,
        },
        created_at,
    )
    .1
}

/// A scoped token of `parent`, for 900 s from `now`.
fn token_of(parent: &KeyRecord, now: u64) -> KeyRecord {
    let cached = keys::CachedKey::new(
        parent,
        parent.workspace.as_str().into(),
        Arc::new(parent.scopes.clone()),
    );
    let scopes = Scopes::new(["models:read"]);
    keys::mint(&cached, parent.hash, scopes, 900, Default::default(), now).1
}

fn endpoint(workspace: &str, events: &[&str]) -> Endpoint {
    Endpoint {
        id: new_id("we"),
        workspace: workspace.into(),
        environment: Environment::Live,
        url: "https://example.com/hook".into(),
        events: events.iter().map(|e| e.to_string()).collect(),
        secret: "whsec_x".into(),
        status: EndpointStatus::Active,
        created_at: 1,
        format: Default::default(),
        previous_secret: None,
        previous_secret_until: None,
        rate_limit_per_second: None,
    }
}

fn event(workspace: &str, event_type: &str) -> Event {
    Event::new(
        event_type,
        workspace,
        Environment::Live,
        serde_json::json!({"n": 1}),
    )
}

/// Claims pause notices due at `now_ms` for a 5-second lease; answers their ids.
async fn claim_notices(store: &Arc<dyn Store>, now_ms: u64) -> Vec<String> {
    let claimed = store
        .claim_pause_notices(now_ms, Duration::from_secs(5), 10)
        .await
        .unwrap();
    claimed.into_iter().map(|n| n.id).collect()
}

/// Claims at `now_ms` with 5 s leases, up to 10 deliveries, 4 per endpoint, nothing busy.
async fn claim_from(
    store: &Arc<dyn Store>,
    now_ms: u64,
    struggling_max: usize,
) -> Vec<ClaimedDelivery> {
    store
        .claim_deliveries(&ClaimRequest {
            now_ms,
            lease: Duration::from_secs(5),
            max: 10,
            per_endpoint: 4,
            busy: &[],
            struggling: &[],
            struggling_max,
        })
        .await
        .unwrap()
}

/// `delivery` failed `tried`, its endpoint having failed `failures` times in a row before:
/// retried on `schedule`, and saved as the endpoint's failure. Answers it as saved.
async fn save_failure(
    store: &Arc<dyn Store>,
    mut delivery: Delivery,
    tried: Attempt,
    schedule: &[Duration],
    failures: u32,
) -> Delivery {
    assert!(!delivery.fail(tried, schedule, failures));
    store
        .save_delivery(&delivery, AfterAttempt::Failing(failures + 1))
        .await
        .unwrap();
    delivery
}

fn attempt(at_ms: u64, status_code: Option<u16>) -> Attempt {
    Attempt {
        at_ms,
        status_code,
        error: None,
        duration_ms: 5,
        url: None,
        response_body: None,
        retry_after: None,
    }
}

/// An audit record of `workspace` that arrived at `time_ms`.
fn audit_record(workspace: &str, time_ms: u64) -> AuditRecord {
    AuditRecord {
        time_ms,
        request_id: new_id("req").into(),
        workspace: workspace.into(),
        key_id: "key_1".into(),
        key: "svc_live_…abcd".into(),
        environment: Environment::Live,
        project: None,
        method: "POST".into(),
        path: "/v1/chat/completions".into(),
        model: None,
        status: 200,
        credits: 1.0,
        client_ip: None,
        latency_ms: 1,
        token_id: None,
        metadata: None,
        key_metadata: None,
        actor: None,
        suppressed: None,
        tunnel: None,
    }
}

/// Runs each named case, a fn of this module taking the store, on both stores.
macro_rules! store_suite {
    ($($name:ident),*) => {
        mod memory {
            use super::*;
            $(
                #[tokio::test]
                async fn $name() {
                    super::$name(Arc::new(MemoryStore::new())).await;
                }
            )*
        }
        mod redis {
            use super::*;
            $(
                #[tokio::test]
                async fn $name() {
                    let ns = TestNamespace::new();
                    let store = RedisStore::connect(&redis_url(), &ns.name).unwrap();
                    store.ping().await.expect("Redis answers at REDIS_URL");
                    super::$name(Arc::new(store)).await;
                }
            )*
        }
    };
}

mod audit;
mod deliveries;
mod events;
mod key_store;
mod listen;
mod notices;
mod redis_only;
mod usage;
