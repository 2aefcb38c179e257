//! Scanners: keys found where they must not be, and what the gateway does about them.
//!
//! - [`github`]: GitHub's secret-scanning partner alerts (`POST /v1/secret-scanning/github`),
//!   signed by GitHub; a live key is revoked at once.
//! - [`browser`]: a live key sent by a web page is refused (403), and per
//!   `[scanners] live_key_in_browser` revoked or reported.
//! - request bodies: a key in the part of a body the gateway reads anyway is reported or
//!   revoked per `[scanners] key_in_body` ([`crate::keys::format::find_keys`]).
//! - webhook endpoint URLs and event payloads with a key in them are refused where they are
//!   written.
//!
//! Whoever finds a key, it goes one way ([`leak::handle`]): revoked with `key.auto_revoked`, or
//! reported; then counted (`svcgate_leaked_keys_total`), written to the workspace's audit log
//! (`actor: scanner:<name>`) and mailed to the workspace's admins.

pub mod browser;
pub mod config;
pub mod github;
pub mod leak;

use dashmap::mapref::entry::Entry;
use dashmap::DashMap;
use serde_json::{json, Value};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::ApiError;
use crate::ids::unix_millis;
use crate::keys::cache::KeyCache;
use crate::keys::store::KeyStore;
use crate::keys::KeyRecord;
use crate::metering::audit::AuditRecord;
use crate::metering::store::AuditStore;
use crate::metrics;
use crate::shared::store::StoreError;
use crate::webhooks::mail::{LeakNotice, Mailer};
pub use config::{FoundKeyAction, ScannersConfig};
use github::{AlertToken, GithubKeys, SignatureError};
use leak::{FoundToken, Handled, LeakAction};

/// How often the admins of a workspace hear of the same key reported (not revoked) by the
/// same scanner: a page that keeps sending a live key would otherwise mail on every request.
const REPORT_MAIL_EVERY: Duration = Duration::from_secs(3_600);
/// Most tokens one GitHub alert may carry.
const MAX_ALERT_TOKENS: usize = 1_000;
/// Most bytes of a GitHub alert.
pub const MAX_ALERT_BYTES: usize = 1024 * 1024;

/// Where a scanner saw a key: the request it came with.
#[derive(Debug, Clone)]
pub struct Sighting {
    /// The scanner's name (`github`, `browser`, `request_body`).
    pub scanner: &'static str,
    /// The request's id.
    pub request_id: String,
    /// The request's method and path (as audited: any key in it cut).
    pub method: String,
    /// See `method`.
    pub path: String,
    /// The client's address.
    pub client_ip: Option<IpAddr>,
}

/// The scanners' shared machinery: the stores a finding is written to, the mailer, GitHub's
/// keys.
pub struct Scanners {
    keys: Arc<dyn KeyStore>,
    audit: Arc<dyn AuditStore>,
    cache: Option<Arc<KeyCache>>,
    /// The mailer, and the runtime its SMTP connections live on.
    mailer: Option<(Mailer, tokio::runtime::Handle)>,
    config: ScannersConfig,
    github: GithubKeys,
    /// When each (key, scanner) report was last mailed.
    mailed: DashMap<(String, &'static str), Instant>,
}

impl Scanners {
    /// Scanners writing to `keys` and `audit`, as `config` says.
    pub fn new(
        keys: Arc<dyn KeyStore>,
        audit: Arc<dyn AuditStore>,
        config: &ScannersConfig,
    ) -> Self {
        Self {
            keys,
            audit,
            cache: None,
            mailer: None,
            github: GithubKeys::new(&config.github_keys_url),
            config: config.clone(),
            mailed: DashMap::new(),
        }
    }

    /// Refreshes `cache` after a revocation, so this replica refuses the key at once.
    pub fn with_key_cache(mut self, cache: Arc<KeyCache>) -> Self {
        self.cache = Some(cache);
        self
    }

    /// Mails workspace admins through `mailer`, sending on `runtime` (the one it was made on:
    /// an SMTP pool belongs to the runtime that made it).
    pub fn with_mailer(mut self, mailer: Mailer, runtime: tokio::runtime::Handle) -> Self {
        self.mailer = Some((mailer, runtime));
        self
    }

    /// The configuration.
    pub fn config(&self) -> &ScannersConfig {
        &self.config
    }

    /// Handles one key `found` where `seen` says: revoked if `revoke` and it is live, else
    /// reported; counted, audited and mailed.
    pub async fn found(
        &self,
        seen: &Sighting,
        found: FoundToken<'_>,
        revoke: bool,
    ) -> Result<Handled, StoreError> {
        let handled = leak::handle(self.keys.as_ref(), found, revoke).await?;
        metrics::record_leak(seen.scanner, handled.action.as_str());
        let Some(key) = &handled.key else {
            return Ok(handled);
        };
        if handled.newly_revoked {
            if let Some(cache) = &self.cache {
                if let Err(e) = cache.sync().await {
                    tracing::warn!(error = %e, "key cache not refreshed after a revocation");
                }
            }
        }
        self.audit(seen, key, handled.action).await;
        let first_report = || match self.mailed.entry((key.id.clone(), seen.scanner)) {
            Entry::Occupied(last) if last.get().elapsed() < REPORT_MAIL_EVERY => false,
            Entry::Occupied(mut last) => {
                last.insert(Instant::now());
                true
            }
            Entry::Vacant(slot) => {
                slot.insert(Instant::now());
                true
            }
        };
        let mail =
            handled.newly_revoked || (handled.action == LeakAction::Reported && first_report());
        if mail {
            self.mail(seen.scanner, key, found.url, handled.newly_revoked)
                .await;
        }
        Ok(handled)
    }

    /// Writes the finding to the workspace's audit log. A record that cannot be written is
    /// logged: the revocation and its event stand without it.
    async fn audit(&self, seen: &Sighting, key: &KeyRecord, action: LeakAction) {
        let record = AuditRecord {
            time_ms: unix_millis(),
            request_id: seen.request_id.as_str().into(),
            workspace: Arc::from(key.workspace.as_str()),
            key_id: Arc::from(
                key.scoped
                    .as_ref()
                    .map_or(key.id.as_str(), |g| g.parent_id.as_str()),
            ),
            key: format!("{}…{}", key.prefix, key.last4).into(),
            environment: key
                .scoped
                .as_ref()
                .map_or(key.environment, |g| g.parent_environment),
            project: None,
            method: seen.method.clone().into(),
            path: seen.path.as_str().into(),
            model: None,
            status: match action {
                LeakAction::Revoked => 410,
                _ => 200,
            },
            credits: 0.0,
            client_ip: seen.client_ip,
            latency_ms: 0,
            token_id: key.scoped.as_ref().map(|_| key.id.clone()),
            metadata: None,
            key_metadata: None,
            actor: Some(format!("scanner:{}:{}", seen.scanner, action.as_str())),
            suppressed: None,
            tunnel: None,
        };
        if let Err(e) = self.audit.append_audit(&[record], None).await {
            tracing::warn!(error = %e, key_id = %key.id, "audit record of a found key not written");
        }
    }

    /// Mails the workspace's admins, if a mailer is set. Failure is logged: the finding is in
    /// the audit log and the event.
    async fn mail(&self, scanner: &str, key: &KeyRecord, url: Option<&str>, revoked: bool) {
        let Some((mailer, runtime)) = &self.mailer else {
            return;
        };
        let admins = match self.keys.workspace(&key.workspace).await {
            Ok(Some(ws)) => ws.admin_emails,
            Ok(None) => return,
            Err(e) => {
                tracing::warn!(error = %e, workspace = %key.workspace, "leak mail not sent");
                return;
            }
        };
        let (mailer, key, scanner, url) = (
            mailer.clone(),
            key.clone(),
            scanner.to_string(),
            url.map(str::to_owned),
        );
        let sent = runtime.spawn(async move {
            let masked = format!("{}…{}", key.prefix, key.last4);
            let notice = LeakNotice {
                workspace: &key.workspace,
                key_id: &key.id,
                masked: &masked,
                scanner: &scanner,
                url: url.as_deref(),
                revoked,
            };
            if let Err(e) = crate::webhooks::mail::key_leaked(&mailer, &admins, &notice).await {
                tracing::warn!(error = %e, workspace = %key.workspace, "leak mail not sent");
            }
        });
        let _ = sent.await;
    }

    /// A GitHub secret-scanning alert: checks its signature, handles every token in it and
    /// answers in GitHub's format (`[{"token_raw", "token_type", "label"}]`): `true_positive`
    /// for a key of this deployment (a live one revoked), `false_positive` for anything else.
    pub async fn github_alert(
        &self,
        identifier: Option<&str>,
        signature: Option<&str>,
        body: &[u8],
        seen: &Sighting,
    ) -> Result<Vec<u8>, ApiError> {
        if let Err(e) = self.github.verify(identifier, signature, body).await {
            metrics::record_leak("github", "refused");
            tracing::warn!(error = %e, "GitHub alert refused");
            return Err(match e {
                SignatureError::KeysUnavailable(_) => {
                    ApiError::ServiceUnavailable(e.to_string().into())
                }
                _ => ApiError::Authentication(e.to_string().into()),
            });
        }
        let tokens: Vec<AlertToken> = serde_json::from_slice(body).map_err(|_| {
            ApiError::invalid(
                "an alert is a JSON array of {\"token\", \"type\", \"url\", \"source\"}",
            )
        })?;
        if tokens.len() > MAX_ALERT_TOKENS {
            return Err(ApiError::invalid(format!(
                "at most {MAX_ALERT_TOKENS} tokens per alert"
            )));
        }
        let mut answer = Vec::with_capacity(tokens.len());
        for t in &tokens {
            let found = FoundToken {
                token: &t.token,
                url: t.url.as_deref(),
                source: Some(t.source.as_deref().unwrap_or("github")),
            };
            let handled = self.found(seen, found, true).await.map_err(|e| {
                ApiError::ServiceUnavailable(
                    format!("{e}; tokens before this one were handled; send the alert again")
                        .into(),
                )
            })?;
            let label = match handled.action {
                LeakAction::NotFound => "false_positive",
                LeakAction::Revoked | LeakAction::Reported => "true_positive",
            };
            answer.push(json!({"token_raw": t.token, "token_type": t.token_type, "label": label}));
        }
        Ok(serde_json::to_vec(&Value::Array(answer)).unwrap_or_default())
    }
}
