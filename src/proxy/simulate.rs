//! The built-in simulated backend: plausible JSON for every default route, so the zero-config
//! gateway works end to end and `svc_test_` keys get free answers when no sandbox exists.

use pingora::proxy::Session;
use serde_json::{json, Value};

use super::routes::Route;
use crate::ids::{new_id, unix_now};
use crate::keys::Environment;

/// Largest request body read to shape the simulated answer; larger bodies are not parsed.
const BODY_LIMIT: usize = 1024 * 1024;

/// What the simulator learned from the request body.
#[derive(Debug, Default)]
pub struct RequestSummary {
    /// The `model` field, if the body is JSON and has one.
    pub model: Option<String>,
    /// Characters of text in `messages` / `prompt` / `input`, for a plausible token count.
    pub text_chars: usize,
}

/// Reads (and so drains) up to [`BODY_LIMIT`] bytes of the request body and summarises it;
/// the body too, unless it was larger.
pub async fn read_request(
    session: &mut Session,
) -> pingora::Result<(RequestSummary, Option<Vec<u8>>)> {
    // Too large to summarise: answer anyway, with a generic shape.
    let body = super::body::read_bounded(session, BODY_LIMIT).await?;
    let summary = body.as_deref().map(summarize).unwrap_or_default();
    Ok((summary, body))
}

fn summarize(body: &[u8]) -> RequestSummary {
    let Ok(v) = serde_json::from_slice::<Value>(body) else {
        return RequestSummary::default();
    };
    let model = v.get("model").and_then(Value::as_str).map(str::to_owned);
    let mut text_chars = 0;
    if let Some(messages) = v.get("messages").and_then(Value::as_array) {
        for m in messages {
            text_chars += m.get("content").and_then(Value::as_str).map_or(0, str::len);
        }
    }
    for field in ["prompt", "input"] {
        text_chars += v.get(field).and_then(Value::as_str).map_or(0, str::len);
    }
    RequestSummary { model, text_chars }
}

/// The simulated response body for `route`.
pub fn response_body(
    route: &Route,
    env: Environment,
    request: &RequestSummary,
    path: &str,
) -> Value {
    let now = unix_now();
    let model = |default: &str| request.model.clone().unwrap_or_else(|| default.to_string());
    let body = match &*route.template {
        "/v1/models" => json!({
            "object": "list",
            "data": [
                {"id": "svc-chat-1", "object": "model", "owned_by": "svcgate-simulator"},
                {"id": "svc-image-1", "object": "model", "owned_by": "svcgate-simulator"},
                {"id": "svc-video-1", "object": "model", "owned_by": "svcgate-simulator"},
                {"id": "svc-voice-1", "object": "model", "owned_by": "svcgate-simulator"},
            ],
        }),
        "/v1/chat/completions" => {
            let prompt_tokens = request.text_chars.div_ceil(4).max(1);
            let reply = "This is a simulated response from svcgate.";
            let completion_tokens = reply.len().div_ceil(4);
            json!({
                "id": new_id("chatcmpl"),
                "object": "chat.completion",
                "created": now,
                "model": model("svc-chat-1"),
                "choices": [{
                    "index": 0,
                    "message": {"role": "assistant", "content": reply},
                    "finish_reason": "stop",
                }],
                "usage": {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": completion_tokens,
                    "total_tokens": prompt_tokens + completion_tokens,
                },
            })
        }
        "/v1/images/generations" => json!({
            "created": now,
            "model": model("svc-image-1"),
            "data": [{"url": format!("https://simulated.invalid/images/{}.png", new_id("img"))}],
        }),
        "/v1/images/batches" => json!({
            "id": new_id("batch"), "object": "image.batch", "status": "queued", "created": now,
        }),
        "/v1/videos" => json!({
            "id": new_id("video"), "object": "video.render", "status": "queued",
            "model": model("svc-video-1"), "created": now,
        }),
        "/v1/audio/speech" => json!({
            "id": new_id("voice"), "object": "voice.render", "status": "queued",
            "model": model("svc-voice-1"), "created": now,
        }),
        "/v1/agents/runs" => json!({
            "id": new_id("run"), "object": "agent.run", "status": "running", "created": now,
        }),
        "/v1/agents/runs/{id}/approve" => json!({
            "id": path.split('/').nth(4).unwrap_or_default(),
            "object": "agent.run", "status": "running",
        }),
        other => json!({"object": "simulated", "route": other, "created": now}),
    };
    labelled(body, env)
}

/// `body` marked as the simulator's, for a key of `env`.
pub fn labelled(body: Value, env: Environment) -> Value {
    let Value::Object(mut body) = body else {
        return body;
    };
    body.insert("simulated".into(), Value::Bool(true));
    body.insert("environment".into(), Value::from(env.as_str()));
    Value::Object(body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::config::default_routes;
    use crate::proxy::routes::RouteTable;
    use http::Method;

    #[test]
    fn summarises_chat_bodies() {
        let s = summarize(br#"{"model":"m1","messages":[{"role":"user","content":"12345678"}]}"#);
        assert_eq!(s.model.as_deref(), Some("m1"));
        assert_eq!(s.text_chars, 8);
        let s = summarize(b"not json");
        assert!(s.model.is_none());
    }

    #[test]
    fn every_default_route_has_a_plausible_body() {
        let table = RouteTable::new(&default_routes()).unwrap();
        let chat = table.find(&Method::POST, "/v1/chat/completions").unwrap();
        let summary = RequestSummary {
            model: Some("m1".into()),
            text_chars: 40,
        };
        let body = response_body(chat, Environment::Test, &summary, "/v1/chat/completions");
        assert_eq!(body["object"], "chat.completion");
        assert_eq!(body["model"], "m1");
        assert_eq!(body["usage"]["prompt_tokens"], 10);
        assert_eq!(body["environment"], "test");
        for route in default_routes() {
            let path = route.path.replace("{id}", "run_1");
            let r = table.find(&route.method.parse().unwrap(), &path).unwrap();
            let body = response_body(r, Environment::Live, &RequestSummary::default(), &path);
            assert_eq!(body["simulated"], true, "{path}");
            assert!(body.as_object().unwrap().len() > 2, "{path}");
        }
    }
}
