//! The storage metering needs: spend and budgets, and the audit log.

use async_trait::async_trait;

use super::audit::{AuditQuery, AuditRead, AuditRecord};
use super::lease::{LeaseGrant, LeaseRequest};
use super::usage::{UsageFlush, UsageSnapshot};
use crate::shared::store::StoreError;

/// A workspace's spend in one month, in micro-credits.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct UsageReport {
    /// The workspace total.
    pub total: i64,
    /// Per key id.
    pub keys: std::collections::HashMap<String, i64>,
    /// Per project.
    pub projects: std::collections::HashMap<String, i64>,
}

/// Spend, rate counts and budgets, shared by every replica.
#[async_trait]
pub trait UsageStore: Send + Sync + 'static {
    /// Adds a replica's batched spend and rate counts, fires `billing.credits.low` for a
    /// workspace whose remaining credits this batch takes below its threshold (once per
    /// crossing), and answers the month's totals of everything the batch watches. Atomic.
    async fn flush_usage(&self, flush: &UsageFlush) -> Result<UsageSnapshot, StoreError>;

    /// Grants budget leases (see [`lease`](super::lease)), atomically for every ask: to each,
    /// what it asks for or a [`LEASE_SHARE`](super::lease::LEASE_SHARE)th of what is left,
    /// whichever is more, and never more than what is left — the budget less the month's
    /// spend and every unexpired lease's unspent part, of every replica. Answers, per ask in
    /// order, the lease's whole grant so far and what is left after it.
    async fn lease_budget(&self, request: &LeaseRequest) -> Result<Vec<LeaseGrant>, StoreError>;

    /// The monthly budgets set for a workspace's projects, in micro-credits, by project.
    async fn project_budgets(
        &self,
        workspace: &str,
    ) -> Result<std::collections::HashMap<String, i64>, StoreError>;

    /// Sets (or, with `None`, removes) a project's monthly budget in micro-credits.
    async fn set_project_budget(
        &self,
        workspace: &str,
        project: &str,
        budget: Option<i64>,
    ) -> Result<(), StoreError>;

    /// When each of `ids` (key ids) was last used, in unix seconds to the minute (the start
    /// of the minute of its latest request flushed), in the same order; `None` for a key not
    /// used since the store began keeping it.
    async fn keys_last_used(&self, ids: &[&str]) -> Result<Vec<Option<u64>>, StoreError>;

    /// A workspace's spend in `month` (`YYYY-MM`).
    async fn usage_report(&self, workspace: &str, month: &str) -> Result<UsageReport, StoreError>;
}

/// The audit log: one record per authenticated request.
#[async_trait]
pub trait AuditStore: Send + Sync + 'static {
    /// Appends audit records (any workspaces, any order of arrival). With `once`, a batch id,
    /// a batch of that id is appended at most once (within a day): a spool file replayed again
    /// after the process replaying it died adds nothing.
    async fn append_audit(
        &self,
        records: &[AuditRecord],
        once: Option<&str>,
    ) -> Result<(), StoreError>;

    /// Reads audit records back, newest first.
    async fn audit(&self, query: &AuditQuery) -> Result<Vec<AuditRecord>, StoreError>;

    /// Reads a page of audit records back within the store's scan budget: a filter that
    /// matches little or nothing of a large log answers in bounded time, with where to go on
    /// ([`AuditRead::resume`]). A store whose whole log reads within the budget answers as
    /// [`audit`](Self::audit) does.
    async fn audit_page(&self, query: &AuditQuery) -> Result<AuditRead, StoreError> {
        Ok(AuditRead {
            records: self.audit(query).await?,
            resume: None,
        })
    }
}
