//! The storage the sandbox needs: simulated jobs (kept a day), and their events scheduled for
//! the event log.

use async_trait::async_trait;

use super::Scheduled;
use crate::shared::store::StoreError;

/// How long a simulated job can be polled after it was created.
pub const JOB_TTL_MS: u64 = 86_400_000;

/// Simulated jobs and their scheduled events.
#[async_trait]
pub trait SandboxStore: Send + Sync + 'static {
    /// Saves the job `record` (JSON) under `id` for [`JOB_TTL_MS`] and schedules `events`, in one
    /// atomic step. With `previous`, only if the stored record is still exactly `previous`
    /// (`false` if it is not, or is gone): two approvals of one run cannot both win.
    async fn save_job(
        &self,
        id: &str,
        record: &str,
        previous: Option<&str>,
        events: &[Scheduled],
    ) -> Result<bool, StoreError>;

    /// The job record saved under `id`, if any.
    async fn job(&self, id: &str) -> Result<Option<String>, StoreError>;

    /// Moves up to `max` scheduled events due at `now_ms` into the event log, atomically (each
    /// goes exactly once, whichever replica moves it), stamped as created now. Their types.
    async fn release_due_events(&self, now_ms: u64, max: usize) -> Result<Vec<String>, StoreError>;
}
