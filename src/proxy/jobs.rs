//! The simulator's async jobs on the request path: a test key's image batch, video, voice
//! render or agent run starts a [`Job`] kept in the store, and its `GET …/{id}` and `approve`
//! routes read and move it ([`crate::sandbox`]). Any replica answers: the job is in the store.

use serde_json::Value;
use std::sync::Arc;

use super::routes::Route;
use crate::error::ApiError;
use crate::ids::unix_millis;
use crate::keys::Environment;
use crate::sandbox::store::SandboxStore;
use crate::sandbox::{Job, JobKind};

/// The route that approves an agent run's gated action.
const APPROVE: &str = "/v1/agents/runs/{id}/approve";

/// The simulator's jobs: where they are kept and how long a step takes.
pub struct SimulatedJobs {
    store: Arc<dyn SandboxStore>,
    step_ms: u64,
}

impl SimulatedJobs {
    /// Jobs kept in `store`, each step `job_seconds` long.
    pub fn new(store: Arc<dyn SandboxStore>, job_seconds: u64) -> Self {
        Self {
            store,
            step_ms: job_seconds * 1000,
        }
    }

    /// The answer to a job route (its view: created, polled or approved), or `None` for a
    /// route that is no job's.
    pub async fn answer(
        &self,
        route: &Route,
        workspace: &str,
        environment: Environment,
        body: Option<&[u8]>,
        path: &str,
    ) -> Result<Option<Value>, ApiError> {
        let now_ms = unix_millis();
        let template = &*route.template;
        if let Some(kind) = JobKind::created_by(template) {
            let request = body
                .and_then(|b| serde_json::from_slice::<Value>(b).ok())
                .unwrap_or(Value::Null);
            let (job, events) =
                Job::start(kind, workspace, environment, &request, now_ms, self.step_ms);
            let record = serde_json::to_string(&job).unwrap_or_default();
            self.store
                .save_job(&job.id, &record, None, &events)
                .await
                .map_err(unavailable)?;
            return Ok(job.current(now_ms).map(|p| p.view.clone()));
        }
        if let Some(kind) = JobKind::polled_by(template) {
            let id = path.rsplit('/').next().unwrap_or_default();
            let (job, _) = self.find(id, kind, workspace, environment).await?;
            return Ok(job.current(now_ms).map(|p| p.view.clone()));
        }
        if template == APPROVE {
            let id = path.split('/').nth(4).unwrap_or_default();
            let (job, record) = self
                .find(id, JobKind::AgentRun, workspace, environment)
                .await?;
            let (approved, events) = job.approve(now_ms, self.step_ms).map_err(|_| {
                ApiError::invalid("the run is not awaiting approval; poll GET /v1/agents/runs/{id}")
            })?;
            let next = serde_json::to_string(&approved).unwrap_or_default();
            let saved = self
                .store
                .save_job(id, &next, Some(&record), &events)
                .await
                .map_err(unavailable)?;
            if !saved {
                return Err(ApiError::invalid("the run was approved already"));
            }
            return Ok(approved.current(now_ms).map(|p| p.view.clone()));
        }
        Ok(None)
    }

    /// The job `id` of `kind`, if it is the caller's (workspace and environment: a test key
    /// sees only sandbox jobs), and its record as stored.
    async fn find(
        &self,
        id: &str,
        kind: JobKind,
        workspace: &str,
        environment: Environment,
    ) -> Result<(Job, String), ApiError> {
        let missing = || ApiError::not_found(format!("no such job: {id}"));
        let record = self
            .store
            .job(id)
            .await
            .map_err(unavailable)?
            .ok_or_else(missing)?;
        let job: Job = serde_json::from_str(&record).map_err(|_| missing())?;
        if job.kind != kind || job.workspace != workspace || job.environment != environment {
            return Err(missing());
        }
        Ok((job, record))
    }
}

fn unavailable(e: crate::shared::store::StoreError) -> ApiError {
    ApiError::ServiceUnavailable(format!("the sandbox cannot keep jobs now: {e}").into())
}
