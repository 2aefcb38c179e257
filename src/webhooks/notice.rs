//! Pause notices: the e-mail owed to a workspace's admins when every retry to one of its
//! endpoints failed and the endpoint was paused.
//!
//! The store queues a notice in the same atomic step that pauses the endpoint
//! ([`DeliveryQueue::save_delivery`](super::store::DeliveryQueue::save_delivery)), so the notice outlives the worker that paused it, a mail relay
//! that is down for hours, and a lost reply to that step. Workers claim due notices for a lease
//! (a worker that dies mid-send leaves its notice to be claimed again when the lease ends), mail
//! them, and remove one only once the relay has taken the mail; a failed try is retried on a
//! capped exponential backoff ([`retry_wait`]), without end. A notice whose workspace or
//! endpoint was deleted meanwhile, or whose workspace has no address that can be mailed (the
//! zero-config demo workspace has none), is dropped, with a warning: nobody is left to tell,
//! or nothing to fix.

use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;

use super::store::WorkerStores;
use crate::ids::{new_id, unix_millis};
use crate::metrics;
use crate::shared::store::StoreError;
use crate::webhooks::delivery::Delivery;
use crate::webhooks::mail::{MailError, Mailer};
use crate::webhooks::worker::Backoff;

/// How long a claim on a notice holds: longer than one try can last ([`MAIL_TIMEOUT`]).
const NOTICE_LEASE: Duration = Duration::from_secs(120);
/// Longest wait for the mail transport on one try.
const MAIL_TIMEOUT: Duration = Duration::from_secs(60);
/// Most notices claimed (and mailed concurrently) at once.
const NOTICE_BATCH: usize = 16;
/// How often the store is asked for due notices when nothing wakes the loop.
const NOTICE_POLL: Duration = Duration::from_secs(2);
/// The first wait after a failed try; each next one doubles, up to [`RETRY_MAX`].
const RETRY_FIRST: Duration = Duration::from_secs(2);
/// The longest wait between two tries.
const RETRY_MAX: Duration = Duration::from_secs(600);

/// An e-mail owed to a workspace's admins: one of its endpoints was paused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PauseNotice {
    /// `pn_…`: one per pause (a resumed endpoint that is paused again is owed a new one).
    pub id: String,
    /// The endpoint's workspace, whose admins are told.
    pub workspace: String,
    /// The paused endpoint (`we_…`).
    pub endpoint: String,
    /// Why the last attempt failed: never a secret, never a response body.
    pub last_error: String,
    /// When the endpoint was paused (unix milliseconds); the notice is due from then.
    pub paused_ms: u64,
    /// Tries to mail it that failed so far.
    #[serde(default)]
    pub failures: u32,
    /// Whether the receiver answered 410 Gone: the endpoint is `disabled` rather than
    /// `paused`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub disabled: bool,
}

impl PauseNotice {
    /// The notice owed when `delivery`'s final failure pauses its endpoint at `now_ms`.
    pub fn new(delivery: &Delivery, now_ms: u64) -> Self {
        Self {
            id: new_id("pn"),
            workspace: delivery.workspace.clone(),
            endpoint: delivery.endpoint.clone(),
            last_error: delivery
                .last_attempt
                .as_ref()
                .and_then(|a| a.error.clone())
                .unwrap_or_default(),
            paused_ms: now_ms,
            failures: 0,
            disabled: false,
        }
    }
}

/// The wait before the next try after `failures` failed tries (at least one): 2 s, doubling,
/// at most 10 minutes.
pub fn retry_wait(failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(16);
    (RETRY_FIRST * 2u32.pow(doublings)).min(RETRY_MAX)
}

/// What became of one try.
enum Tried {
    /// The mail transport took the mail.
    Sent,
    /// Nobody is left to tell, or nothing to fix: the notice is dropped.
    Gone(&'static str),
    /// The mail did not go; it is tried again later.
    Failed(String),
}

/// Mails due pause notices: one loop per worker, sharing the queue with every other worker.
pub struct Notifier {
    store: WorkerStores,
    mailer: Mailer,
    /// Wakes the loop: a notice was queued by this worker.
    wake: Notify,
}

impl Notifier {
    /// A notifier on `store`, mailing through `mailer`.
    pub fn new(store: WorkerStores, mailer: Mailer) -> Arc<Self> {
        Arc::new(Self {
            store,
            mailer,
            wake: Notify::new(),
        })
    }

    /// Looks for due notices now rather than at the next poll.
    pub fn wake(&self) {
        self.wake.notify_one();
    }

    /// Claims and mails due notices until the task is aborted. An abort mid-send leaves the
    /// notice claimed; it is due again when the lease ends.
    pub async fn run(self: Arc<Self>) {
        let mut backoff = Backoff::default();
        loop {
            let claimed = self
                .store
                .notices
                .claim_pause_notices(unix_millis(), NOTICE_LEASE, NOTICE_BATCH)
                .await;
            match claimed {
                Ok(notices) => {
                    backoff.reset();
                    let full = notices.len() == NOTICE_BATCH;
                    futures_util::future::join_all(notices.into_iter().map(|n| self.send(n))).await;
                    if full {
                        continue;
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot claim pause notices; retrying");
                    backoff.wait().await;
                    continue;
                }
            }
            let _ = tokio::time::timeout(NOTICE_POLL, self.wake.notified()).await;
        }
    }

    /// One try at a claimed notice, and its consequence in the store.
    async fn send(&self, mut notice: PauseNotice) {
        let tried = match self.try_send(&notice).await {
            Ok(tried) => tried,
            Err(e) => {
                tracing::warn!(
                    endpoint = %notice.endpoint,
                    error = %e,
                    "cannot read a paused endpoint's workspace; the notice is tried again when its lease ends"
                );
                return;
            }
        };
        let finished = match tried {
            Tried::Sent => {
                metrics::record_pause_mail("sent");
                tracing::info!(endpoint = %notice.endpoint, workspace = %notice.workspace, "admins told the endpoint is paused");
                self.remove(&notice).await
            }
            Tried::Gone(why) => {
                metrics::record_pause_mail("dropped");
                tracing::warn!(endpoint = %notice.endpoint, workspace = %notice.workspace, why, "dropping a pause notice");
                self.remove(&notice).await
            }
            Tried::Failed(error) => {
                metrics::record_pause_mail("failed");
                notice.failures = notice.failures.saturating_add(1);
                let wait = retry_wait(notice.failures);
                tracing::warn!(
                    endpoint = %notice.endpoint,
                    workspace = %notice.workspace,
                    %error,
                    failures = notice.failures,
                    retry_in_secs = wait.as_secs(),
                    "could not e-mail the admins; will retry"
                );
                let due_ms = unix_millis() + wait.as_millis() as u64;
                self.store.notices.retry_pause_notice(&notice, due_ms).await
            }
        };
        if let Err(e) = finished {
            tracing::warn!(endpoint = %notice.endpoint, error = %e, "could not save a pause notice's progress; it is tried again when its lease ends");
        }
    }

    async fn try_send(&self, notice: &PauseNotice) -> Result<Tried, StoreError> {
        let Some(workspace) = self.store.workspaces.workspace(&notice.workspace).await? else {
            return Ok(Tried::Gone("the workspace was deleted"));
        };
        let endpoints = self.store.deliveries.endpoints(&notice.workspace).await?;
        let Some(endpoint) = endpoints.iter().find(|e| e.id == notice.endpoint) else {
            return Ok(Tried::Gone("the endpoint was deleted"));
        };
        let mail = crate::webhooks::mail::endpoint_paused(
            &self.mailer,
            &workspace.admin_emails,
            endpoint,
            &notice.last_error,
            notice.disabled,
        );
        Ok(match tokio::time::timeout(MAIL_TIMEOUT, mail).await {
            Ok(Ok(())) => Tried::Sent,
            Ok(Err(MailError::NoRecipients)) => {
                Tried::Gone("the workspace has no admin address that can be mailed")
            }
            Ok(Err(MailError::Failed(e))) => Tried::Failed(e),
            Err(_) => Tried::Failed(format!(
                "the mail transport did not answer within {} s",
                MAIL_TIMEOUT.as_secs()
            )),
        })
    }

    /// Removes a finished notice, retrying briefly while the store is away: left in place, it
    /// would be mailed again when its lease ends.
    async fn remove(&self, notice: &PauseNotice) -> Result<(), StoreError> {
        let mut backoff = Backoff::default();
        let deadline = tokio::time::Instant::now() + NOTICE_LEASE / 4;
        loop {
            match self.store.notices.remove_pause_notice(&notice.id).await {
                Ok(()) => return Ok(()),
                Err(e) if tokio::time::Instant::now() >= deadline => return Err(e),
                Err(_) => backoff.wait().await,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_wait_twice_as_long_each_time_up_to_ten_minutes() {
        let waits: Vec<u64> = (1..=11).map(|n| retry_wait(n).as_secs()).collect();
        assert_eq!(waits, [2, 4, 8, 16, 32, 64, 128, 256, 512, 600, 600]);
        assert_eq!(retry_wait(0), RETRY_FIRST);
        assert_eq!(retry_wait(u32::MAX), RETRY_MAX);
    }
}
