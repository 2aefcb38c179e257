//! The sandbox: simulated async jobs that finish like real ones.
//!
//! With no backend for it, the built-in simulator ([`crate::proxy::simulate`]) starts a job for
//! an image batch, a video render, a voice render or an agent run, and the job moves through
//! the states a real one would, `[simulator] job_seconds` apart:
//!
//! | job | after `job_seconds` | event |
//! |---|---|---|
//! | image batch | `completed`, with signed image URLs | `image.batch.completed` |
//! | video render | `completed`, or `failed` with a `failure_reason` when the prompt holds [`FAIL_PROMPT`] | `video.render.completed` |
//! | voice render | `completed`, with an audio URL | `voice.render.completed` |
//! | agent run | `awaiting_approval` on a gated action; `failed` if `max_steps` < 2 | `agent.run.awaiting_approval` / `agent.run.failed` |
//! | agent run, approved | `completed` `job_seconds` after approval; `failed` if `max_steps` < 3 | `agent.run.completed` / `agent.run.failed` |
//!
//! A job is a timeline of what it shows from when ([`Job`]), saved in the store with its events
//! scheduled; any replica answers a poll from the record, and the [`runner`] puts each event
//! into the event log when it is due, for the worker to deliver. Events are only for test keys'
//! jobs, in the test environment.

pub mod runner;
pub mod store;

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};

use crate::events::Event;
use crate::ids::new_id;
use crate::shared::environment::Environment;

/// A prompt holding this makes a simulated video render fail (with a reason), so a test can
/// see the failure its integration must handle.
pub const FAIL_PROMPT: &str = "simulate:failure";
/// Steps a simulated agent run takes: the plan, the gated action, the result.
pub const AGENT_STEPS: u64 = 3;
/// Images in a simulated batch unless the request asks for `n` (at most [`MAX_IMAGES`]).
const DEFAULT_IMAGES: u64 = 2;
/// Most images in a simulated batch.
const MAX_IMAGES: u64 = 10;
/// How long a simulated signed URL is valid.
const URL_TTL_SECS: u64 = 3_600;
/// Where simulated media lives: a name that never resolves.
const MEDIA_HOST: &str = "https://sandbox.svcgate.invalid";

/// What kind of job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobKind {
    /// `POST /v1/images/batches`
    ImageBatch,
    /// `POST /v1/videos`
    VideoRender,
    /// `POST /v1/audio/speech`
    VoiceRender,
    /// `POST /v1/agents/runs`
    AgentRun,
}

impl JobKind {
    /// The job kind a route template starts, if any.
    pub fn created_by(template: &str) -> Option<Self> {
        Some(match template {
            "/v1/images/batches" => Self::ImageBatch,
            "/v1/videos" => Self::VideoRender,
            "/v1/audio/speech" => Self::VoiceRender,
            "/v1/agents/runs" => Self::AgentRun,
            _ => return None,
        })
    }

    /// The job kind a route template polls (`GET …/{id}`), if any.
    pub fn polled_by(template: &str) -> Option<Self> {
        Self::created_by(template.strip_suffix("/{id}")?)
    }

    fn object(self) -> &'static str {
        match self {
            Self::ImageBatch => "image.batch",
            Self::VideoRender => "video.render",
            Self::VoiceRender => "voice.render",
            Self::AgentRun => "agent.run",
        }
    }

    fn id_prefix(self) -> &'static str {
        match self {
            Self::ImageBatch => "batch",
            Self::VideoRender => "video",
            Self::VoiceRender => "voice",
            Self::AgentRun => "run",
        }
    }
}

/// What a job shows from `at_ms` on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Phase {
    /// Unix milliseconds.
    pub at_ms: u64,
    /// The job as a poll shows it.
    pub view: Value,
    /// The event that announces it, if one does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event: Option<String>,
}

/// A simulated job: who owns it and its timeline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Job {
    /// `batch_…`, `video_…`, `voice_…`, `run_…`
    pub id: String,
    /// What it is.
    pub kind: JobKind,
    /// The workspace of the key that created it: only it can see the job.
    pub workspace: String,
    /// The key's environment: events go out only for `test`.
    pub environment: Environment,
    /// `max_steps` of an agent run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_steps: Option<u64>,
    /// What it shows, in order of time.
    pub timeline: Vec<Phase>,
}

/// An event to put into the event log at `due_ms`.
#[derive(Debug, Clone, PartialEq)]
pub struct Scheduled {
    /// Unix milliseconds.
    pub due_ms: u64,
    /// The event (its `created` is set when it goes out).
    pub event: Event,
}

/// Why an agent run cannot be approved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotAwaitingApproval;

impl Job {
    /// Starts a job of `kind` for a key of `workspace` and `environment`, from the request
    /// body `request`, at `now_ms`, each step `step_ms` long. The events it will send, each at
    /// its time.
    pub fn start(
        kind: JobKind,
        workspace: &str,
        environment: Environment,
        request: &Value,
        now_ms: u64,
        step_ms: u64,
    ) -> (Job, Vec<Scheduled>) {
        let id = new_id(kind.id_prefix());
        let done_ms = now_ms + step_ms;
        let text = |field: &str| request.get(field).and_then(Value::as_str);
        let model = |default: &str| text("model").unwrap_or(default).to_string();
        let created = now_ms / 1000;
        let base = json!({"id": id, "object": kind.object(), "created": created});
        let (first, next, event, max_steps) = match kind {
            JobKind::ImageBatch => {
                let n = request
                    .get("n")
                    .and_then(Value::as_u64)
                    .unwrap_or(DEFAULT_IMAGES)
                    .clamp(1, MAX_IMAGES);
                let expires = done_ms / 1000 + URL_TTL_SECS;
                let images: Vec<Value> = (0..n)
                    .map(|i| {
                        let path = format!("/images/{id}/{i}.png");
                        json!({"url": signed_url(&path, expires), "expires_at": expires})
                    })
                    .collect();
                let model = model("svc-image-1");
                (
                    json!({"status": "queued", "model": model, "n": n}),
                    json!({"status": "completed", "model": model, "n": n, "images": images, "completed_at": done_ms / 1000}),
                    "image.batch.completed",
                    None,
                )
            }
            JobKind::VideoRender => {
                let model = model("svc-video-1");
                let fail = text("prompt").is_some_and(|p| p.contains(FAIL_PROMPT));
                let outcome = match fail {
                    true => json!({"status": "failed", "model": model,
                        "failure_reason": format!("the prompt asked the simulator to fail ({FAIL_PROMPT})")}),
                    false => {
                        let expires = done_ms / 1000 + URL_TTL_SECS;
                        json!({"status": "completed", "model": model, "duration_seconds": 5,
                            "video_url": signed_url(&format!("/videos/{id}.mp4"), expires),
                            "expires_at": expires})
                    }
                };
                (
                    json!({"status": "queued", "model": model}),
                    outcome,
                    "video.render.completed",
                    None,
                )
            }
            JobKind::VoiceRender => {
                let model = model("svc-voice-1");
                let expires = done_ms / 1000 + URL_TTL_SECS;
                (
                    json!({"status": "queued", "model": model}),
                    json!({"status": "completed", "model": model,
                        "audio_url": signed_url(&format!("/voice/{id}.mp3"), expires),
                        "expires_at": expires}),
                    "voice.render.completed",
                    None,
                )
            }
            JobKind::AgentRun => {
                let max_steps = request
                    .get("max_steps")
                    .and_then(Value::as_u64)
                    .unwrap_or(AGENT_STEPS * 4);
                let (view, event) = match max_steps {
                    0 | 1 => (agent_failed(max_steps), "agent.run.failed"),
                    _ => (
                        json!({"status": "awaiting_approval", "steps": 2, "max_steps": max_steps,
                            "pending_action": {"type": "tool_call", "name": "send_email",
                                "arguments": {"to": "customer@example.com", "subject": "Your order"},
                                "approve_url": format!("/v1/agents/runs/{id}/approve")}}),
                        "agent.run.awaiting_approval",
                    ),
                };
                (
                    json!({"status": "running", "steps": 0, "max_steps": max_steps}),
                    view,
                    event,
                    Some(max_steps),
                )
            }
        };
        let job = Job {
            id,
            kind,
            workspace: workspace.to_string(),
            environment,
            max_steps,
            timeline: vec![
                Phase {
                    at_ms: now_ms,
                    view: merged(&base, &first),
                    event: None,
                },
                Phase {
                    at_ms: done_ms,
                    view: merged(&base, &next),
                    event: Some(event.to_string()),
                },
            ],
        };
        let scheduled = job.scheduled(1);
        (job, scheduled)
    }

    /// Approves an agent run waiting on its gated action at `now_ms`: it runs again, and
    /// finishes (or runs out of steps) `step_ms` later.
    pub fn approve(
        &self,
        now_ms: u64,
        step_ms: u64,
    ) -> Result<(Job, Vec<Scheduled>), NotAwaitingApproval> {
        let awaiting = self.kind == JobKind::AgentRun
            && self.current(now_ms).and_then(|p| p.view["status"].as_str())
                == Some("awaiting_approval")
            && self.timeline.len() == 2;
        if !awaiting {
            return Err(NotAwaitingApproval);
        }
        let max_steps = self.max_steps.unwrap_or(AGENT_STEPS);
        let base = json!({"id": self.id, "object": "agent.run", "created": self.timeline[0].view["created"]});
        let (last, event) = match max_steps < AGENT_STEPS {
            true => (agent_failed(max_steps), "agent.run.failed"),
            false => (
                json!({"status": "completed", "steps": AGENT_STEPS, "max_steps": max_steps,
                    "result": {"output": "The e-mail was sent.", "verified": true}}),
                "agent.run.completed",
            ),
        };
        let mut job = self.clone();
        job.timeline.push(Phase {
            at_ms: now_ms,
            view: merged(
                &base,
                &json!({"status": "running", "steps": 2, "max_steps": max_steps, "approved_at": now_ms / 1000}),
            ),
            event: None,
        });
        job.timeline.push(Phase {
            at_ms: now_ms + step_ms,
            view: merged(&base, &last),
            event: Some(event.to_string()),
        });
        let scheduled = job.scheduled(2);
        Ok((job, scheduled))
    }

    /// What the job shows at `now_ms`.
    pub fn current(&self, now_ms: u64) -> Option<&Phase> {
        self.timeline.iter().rev().find(|p| p.at_ms <= now_ms)
    }

    /// The events of the phases from `from` on, for a test key's job; none for a live key's.
    fn scheduled(&self, from: usize) -> Vec<Scheduled> {
        if self.environment != Environment::Test {
            return Vec::new();
        }
        self.timeline[from..]
            .iter()
            .filter_map(|p| {
                let event = p.event.as_deref()?;
                let mut data = p.view.clone();
                if let Some(obj) = data.as_object_mut() {
                    obj.insert("simulated".into(), Value::Bool(true));
                }
                Some(Scheduled {
                    due_ms: p.at_ms,
                    event: Event::new(event, &self.workspace, Environment::Test, data),
                })
            })
            .collect()
    }
}

fn agent_failed(max_steps: u64) -> Value {
    json!({"status": "failed", "steps": max_steps, "max_steps": max_steps,
        "failure_reason": "max_steps_exhausted"})
}

fn merged(base: &Value, more: &Value) -> Value {
    let mut out: Map<String, Value> = base.as_object().cloned().unwrap_or_default();
    if let Some(more) = more.as_object() {
        out.extend(more.clone());
    }
    Value::Object(out)
}

/// A URL to simulated media, signed the way a storage service signs one: an expiry and a
/// signature over path and expiry. The host never resolves; the shape is what matters.
fn signed_url(path: &str, expires: u64) -> String {
    let digest = Sha256::digest(format!("{path}\n{expires}").as_bytes());
    let signature = hex::encode(&digest[..16]);
    format!("{MEDIA_HOST}{path}?expires={expires}&signature={signature}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_image_batch_completes_with_signed_urls_after_a_step() {
        let (job, events) = Job::start(
            JobKind::ImageBatch,
            "ws_1",
            Environment::Test,
            &json!({"n": 3}),
            1_000_000,
            3_000,
        );
        assert_eq!(job.current(1_000_000).unwrap().view["status"], "queued");
        let done = &job.current(1_003_000).unwrap().view;
        assert_eq!(done["status"], "completed");
        let urls = done["images"].as_array().unwrap();
        assert_eq!(urls.len(), 3);
        assert!(urls[0]["url"].as_str().unwrap().contains("signature="));
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].due_ms, 1_003_000);
        assert_eq!(events[0].event.event_type, "image.batch.completed");
        assert_eq!(events[0].event.environment, Environment::Test);
        assert_eq!(events[0].event.data["id"], job.id.as_str());
        assert_eq!(events[0].event.data["simulated"], true);
    }

    #[test]
    fn a_live_key_s_job_sends_no_event() {
        let (job, events) = Job::start(
            JobKind::VoiceRender,
            "ws_1",
            Environment::Live,
            &json!({}),
            0,
            1_000,
        );
        assert!(events.is_empty());
        assert_eq!(job.current(1_000).unwrap().view["status"], "completed");
    }

    #[test]
    fn the_magic_prompt_fails_a_video_render_with_a_reason() {
        let request = json!({"prompt": format!("a cat, {FAIL_PROMPT}")});
        let (_, events) = Job::start(JobKind::VideoRender, "w", Environment::Test, &request, 0, 1);
        let data = &events[0].event.data;
        assert_eq!(events[0].event.event_type, "video.render.completed");
        assert_eq!(data["status"], "failed");
        assert!(data["failure_reason"]
            .as_str()
            .unwrap()
            .contains(FAIL_PROMPT));
    }

    #[test]
    fn an_agent_run_waits_for_approval_then_completes_or_runs_out_of_steps() {
        let start = |max: Option<u64>| {
            let request = max.map_or(json!({}), |m| json!({"max_steps": m}));
            Job::start(JobKind::AgentRun, "w", Environment::Test, &request, 0, 10)
        };
        let (run, events) = start(None);
        assert_eq!(events[0].event.event_type, "agent.run.awaiting_approval");
        assert_eq!(
            run.approve(5, 10),
            Err(NotAwaitingApproval),
            "not yet waiting"
        );
        let (approved, events) = run.approve(10, 10).unwrap();
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].event.event_type, "agent.run.completed");
        assert_eq!(events[0].due_ms, 20);
        assert_eq!(approved.current(15).unwrap().view["status"], "running");
        assert_eq!(approved.approve(30, 10), Err(NotAwaitingApproval), "once");

        let (run, _) = start(Some(2));
        let (_, events) = run.approve(10, 10).unwrap();
        assert_eq!(events[0].event.event_type, "agent.run.failed");
        assert_eq!(
            events[0].event.data["failure_reason"],
            "max_steps_exhausted"
        );

        let (_, events) = start(Some(1));
        assert_eq!(events[0].event.event_type, "agent.run.failed");
    }

    #[test]
    fn routes_name_their_jobs() {
        assert_eq!(
            JobKind::created_by("/v1/videos"),
            Some(JobKind::VideoRender)
        );
        assert_eq!(
            JobKind::polled_by("/v1/agents/runs/{id}"),
            Some(JobKind::AgentRun)
        );
        assert_eq!(JobKind::polled_by("/v1/agents/runs/{id}/approve"), None);
        assert_eq!(JobKind::created_by("/v1/chat/completions"), None);
    }
}
