//! The workspace dashboard: server-rendered pages under `/dashboard/` where a workspace's
//! admins (signed in by a mailed one-time link) and operators (signed in with the admin token)
//! manage keys, budgets and webhook endpoints.
//!
//! The gateway hands requests under `/dashboard/` to [`router`]; `[dashboard] listen` serves
//! the same router on a listener of its own ([`own_listener`]). Every change goes through
//! the functions the admin API and the webhooks API call ([`crate::keys::manage`],
//! [`crate::webhooks::manage`]), and is written to the audit log with who made it.

pub mod config;
mod pages;
pub mod service;
mod signin;
pub mod store;
mod web;

use axum::routing::{get, post};
use axum::Router;
use sha2::{Digest, Sha256};
use std::sync::Arc;

use crate::ids::{request_id, unix_millis};
use crate::keys::cache::KeyCache;
use crate::keys::store::KeyStore;
use crate::keys::Environment;
use crate::metering::audit::AuditRecord;
use crate::metering::store::{AuditStore, UsageStore};
use crate::shared::mail::Mailer;
use crate::webhooks::store::{DeliveryQueue, EventLog};
pub use config::DashboardConfig;
pub use service::own_listener;
pub use signin::Signed;
use store::SessionStore;
pub use web::CONTENT_SECURITY_POLICY;

/// Where every dashboard path starts.
pub const PREFIX: &str = "/dashboard";

/// The stores the dashboard reads and writes, by area.
#[derive(Clone)]
pub struct DashboardStores {
    /// Workspaces and keys.
    pub keys: Arc<dyn KeyStore>,
    /// Spend and project budgets.
    pub usage: Arc<dyn UsageStore>,
    /// The audit log.
    pub audit: Arc<dyn AuditStore>,
    /// The event log.
    pub events: Arc<dyn EventLog>,
    /// Webhook endpoints and deliveries.
    pub deliveries: Arc<dyn DeliveryQueue>,
    /// Sessions and sign-in links.
    pub sessions: Arc<dyn SessionStore>,
}

/// What the dashboard is built from.
pub struct DashboardSettings {
    /// `[dashboard]`.
    pub config: DashboardConfig,
    /// The admin token, with which operators sign in.
    pub admin_token: String,
    /// Whether the admin token is the demo's: accepted from loopback clients only.
    pub demo_token: bool,
    /// The grace period of a rotation that names none (seconds).
    pub rotation_grace_seconds: u64,
    /// The scopes of the route table, offered when a key is created.
    pub scopes: Vec<String>,
    /// Whether webhook endpoints may be `http://` or internal (development and tests).
    pub allow_insecure_targets: bool,
}

/// Everything the dashboard's handlers reach; cheap to clone.
#[derive(Clone)]
pub struct Dashboard(Arc<Inner>);

struct Inner {
    stores: DashboardStores,
    /// Where mail is sent from: the runtime the mailer's connections belong to.
    background: tokio::runtime::Handle,
    key_cache: Arc<KeyCache>,
    mailer: Mailer,
    token_digest: [u8; 32],
    settings: DashboardSettings,
}

impl Dashboard {
    /// A dashboard over `stores`, bringing `key_cache` up to date after each key change, and
    /// mailing sign-in links with `mailer` on `background` (the runtime it was made on).
    pub fn new(
        stores: DashboardStores,
        key_cache: Arc<KeyCache>,
        mailer: Mailer,
        settings: DashboardSettings,
        background: tokio::runtime::Handle,
    ) -> Self {
        Self(Arc::new(Inner {
            stores,
            background,
            key_cache,
            mailer,
            token_digest: Sha256::digest(settings.admin_token.as_bytes()).into(),
            settings,
        }))
    }

    fn stores(&self) -> &DashboardStores {
        &self.0.stores
    }

    fn config(&self) -> &DashboardConfig {
        &self.0.settings.config
    }

    /// Brings this replica's key cache up to date, so a change made here applies to its very
    /// next request (other replicas follow through the store's change signal).
    async fn refresh_keys(&self) {
        if let Err(e) = self.0.key_cache.sync().await {
            tracing::warn!(error = %e, "key cache not refreshed after a change");
        }
    }

    /// Writes an audit record of a dashboard action: who (`dashboard:<email>` or
    /// `dashboard:root`), the action's path, the workspace, the key acted on (if any) and the
    /// status it ended with.
    async fn audit(&self, action: Action<'_>) {
        let record = AuditRecord {
            time_ms: unix_millis(),
            request_id: request_id().as_str().into(),
            workspace: action.workspace.into(),
            key_id: action.key_id.unwrap_or_default().into(),
            key: Default::default(),
            environment: action.environment.unwrap_or(Environment::Live),
            project: None,
            method: "POST".into(),
            path: action.path.into(),
            model: None,
            status: action.status,
            credits: 0.0,
            client_ip: Some(action.ip),
            latency_ms: 0,
            token_id: None,
            metadata: None,
            key_metadata: None,
            actor: Some(action.signed.actor()),
            suppressed: None,
            tunnel: None,
        };
        if let Err(e) = self.stores().audit.append_audit(&[record], None).await {
            tracing::error!(error = %e, path = action.path, "dashboard action not audited");
        }
    }
}

/// A dashboard action, for its audit record.
struct Action<'a> {
    signed: &'a Signed,
    path: &'a str,
    workspace: &'a str,
    key_id: Option<&'a str>,
    environment: Option<Environment>,
    status: u16,
    ip: std::net::IpAddr,
}

/// The dashboard's routes, every one under [`PREFIX`].
pub fn router(dashboard: Dashboard) -> Router {
    let w = |rest: &str| format!("{PREFIX}/w/{{ws}}{rest}");
    Router::new()
        .route(&format!("{PREFIX}/"), get(pages::home))
        .route(PREFIX, get(pages::home))
        .route(&format!("{PREFIX}/assets/app.css"), get(pages::css))
        .route(&format!("{PREFIX}/assets/app.js"), get(pages::js))
        .route(
            &format!("{PREFIX}/sign-in"),
            get(signin::page).post(signin::request_link),
        )
        .route(&format!("{PREFIX}/sign-in/token"), post(signin::with_token))
        .route(
            &format!("{PREFIX}/sign-in/link"),
            get(signin::link_page).post(signin::with_link),
        )
        .route(&format!("{PREFIX}/sign-out"), post(signin::sign_out))
        .route(&format!("{PREFIX}/workspaces"), get(pages::workspaces))
        .route(&w(""), get(pages::overview::show))
        .route(&w("/audit"), get(pages::audit::show))
        .route(
            &w("/keys"),
            get(pages::keys::list).post(pages::keys::create),
        )
        .route(&w("/keys/{id}"), get(pages::keys::show))
        .route(&w("/keys/{id}/rotate"), post(pages::keys::rotate))
        .route(
            &w("/keys/{id}/revoke"),
            get(pages::keys::confirm_revoke).post(pages::keys::revoke),
        )
        .route(&w("/keys/{id}/budget"), post(pages::keys::set_budget))
        .route(
            &w("/webhooks"),
            get(pages::webhooks::list).post(pages::webhooks::create),
        )
        .route(&w("/webhooks/{id}"), get(pages::webhooks::show))
        .route(&w("/webhooks/{id}/replay"), post(pages::webhooks::replay))
        .route(&w("/webhooks/{id}/resume"), post(pages::webhooks::resume))
        .route(&w("/webhooks/{id}/delete"), post(pages::webhooks::delete))
        .route(&w("/webhooks/{id}/test"), post(pages::webhooks::send_test))
        .fallback(|| async { web::PageError::not_found("There is no such page.") })
        .layer(axum::middleware::from_fn(web::security_headers))
        .with_state(dashboard)
}

/// Whether `path` is the dashboard's: `/dashboard` or under `/dashboard/`.
pub fn is_dashboard_path(path: &str) -> bool {
    path.strip_prefix(PREFIX)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}
