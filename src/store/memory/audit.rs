//! The audit log in memory.

use super::*;
use crate::metering::audit::{AuditQuery, AuditRecord};
use crate::store::{AuditStore, StoreError};
use async_trait::async_trait;

/// How many audit records the memory store keeps per workspace.
pub(super) const AUDIT_KEPT: usize = 100_000;

#[async_trait]
impl AuditStore for MemoryStore {
    async fn append_audit(
        &self,
        records: &[AuditRecord],
        once: Option<&str>,
    ) -> Result<(), StoreError> {
        let mut inner = self.write();
        if let Some(id) = once {
            if !first_sight(&mut inner.audit_batches, id) {
                return Ok(());
            }
        }
        for r in records {
            let log = inner.audit.entry(r.workspace.to_string()).or_default();
            if log.len() == AUDIT_KEPT {
                log.pop_front();
            }
            log.push_back(r.clone());
        }
        Ok(())
    }

    async fn audit(&self, query: &AuditQuery) -> Result<Vec<AuditRecord>, StoreError> {
        let inner = self.read();
        let Some(log) = inner.audit.get(&query.workspace) else {
            return Ok(Vec::new());
        };
        let mut out: Vec<AuditRecord> = log.iter().filter(|r| query.matches(r)).cloned().collect();
        AuditRecord::sort_listing(&mut out);
        out.truncate(query.limit);
        Ok(out)
    }
}
