//! Calls to a test gateway and its admin API, and checks of their answers.

use axum::http::Method;
use serde_json::{json, Value};

use super::gateway::Gateway;
use super::{ADMIN_TOKEN, DEMO_WS};

impl Gateway {
    /// A request to the gateway.
    pub fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        self.http.request(method, format!("{}{path}", self.base))
    }

    /// A request to the admin API with the admin token.
    pub fn admin_request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        self.http
            .request(method, format!("{}{path}", self.admin))
            .bearer_auth(ADMIN_TOKEN)
    }

    /// Creates a key in the demo workspace; returns (id, full key value).
    pub async fn create_key(&self, environment: &str, scopes: &[&str]) -> (String, String) {
        self.create_key_in(DEMO_WS, environment, scopes).await
    }

    /// Publishes an event through the admin API (`POST /admin/v1/events`); returns its id.
    pub async fn publish_event(
        &self,
        workspace: &str,
        event_type: &str,
        environment: &str,
        data: Value,
    ) -> String {
        let resp = self
            .admin_request(Method::POST, "/admin/v1/events")
            .json(
                &json!({"workspace": workspace, "type": event_type, "data": data,
                          "environment": environment}),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 202);
        resp.json::<Value>().await.unwrap()["id"]
            .as_str()
            .unwrap()
            .to_string()
    }

    /// Creates a workspace through the admin API and returns its id.
    pub async fn create_workspace(&self) -> String {
        let resp = self
            .admin_request(reqwest::Method::POST, "/admin/v1/workspaces")
            .json(&json!({"name": "Test", "admin_emails": ["ops@example.com"]}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 201);
        let body: Value = resp.json().await.unwrap();
        body["id"].as_str().unwrap().to_string()
    }

    /// Creates a key through the admin API; returns (id, full key value).
    pub async fn create_key_in(
        &self,
        workspace: &str,
        environment: &str,
        scopes: &[&str],
    ) -> (String, String) {
        let resp = self
            .admin_request(reqwest::Method::POST, "/admin/v1/keys")
            .json(&json!({"workspace": workspace, "environment": environment, "scopes": scopes}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 201);
        let body: Value = resp.json().await.unwrap();
        (
            body["id"].as_str().unwrap().to_string(),
            body["key"].as_str().unwrap().to_string(),
        )
    }

    /// `POST /v1/tokens` with `key` and `body`, whatever the answer.
    pub async fn mint_request(&self, key: &str, body: Value) -> reqwest::Response {
        self.request(reqwest::Method::POST, "/v1/tokens")
            .bearer_auth(key)
            .json(&body)
            .send()
            .await
            .unwrap()
    }

    /// Mints a scoped token with `key` (`body` as `POST /v1/tokens` takes it); its value.
    pub async fn mint_token(&self, key: &str, body: Value) -> String {
        let resp = self.mint_request(key, body).await;
        assert_eq!(resp.status(), 201);
        let minted: Value = resp.json().await.unwrap();
        minted["value"].as_str().unwrap().to_string()
    }

    /// `GET` on the admin API, as JSON.
    pub async fn admin_get(&self, path: &str) -> Value {
        self.admin_request(reqwest::Method::GET, path)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    /// `POST` on the admin API with no body.
    pub async fn admin_post(&self, path: &str) -> reqwest::Response {
        self.admin_request(reqwest::Method::POST, path)
            .send()
            .await
            .unwrap()
    }

    /// The keys of a workspace, as the admin API lists them.
    pub async fn list_keys(&self, workspace: &str) -> Vec<Value> {
        let listed = self
            .admin_get(&format!("/admin/v1/keys?workspace={workspace}"))
            .await;
        listed["data"].as_array().cloned().unwrap_or_default()
    }

    /// Revokes a key through the admin API.
    pub async fn revoke(&self, id: &str) {
        let resp = self
            .admin_request(
                reqwest::Method::POST,
                &format!("/admin/v1/keys/{id}/revoke"),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
    }

    /// `POST /v1/chat/completions` with `key`.
    pub async fn chat(&self, key: &str) -> reqwest::Response {
        self.request(reqwest::Method::POST, "/v1/chat/completions")
            .bearer_auth(key)
            .json(&json!({"model": "m1", "messages": [{"role": "user", "content": "hi"}]}))
            .send()
            .await
            .unwrap()
    }
}

/// Asserts an error answer: status, `error.code`, and a request id equal to the header's.
pub async fn assert_error(resp: reqwest::Response, status: u16, code: &str) -> Value {
    assert_eq!(resp.status().as_u16(), status, "status");
    let header = resp
        .headers()
        .get("service-request-id")
        .expect("Service-Request-Id header")
        .to_str()
        .unwrap()
        .to_string();
    let body: Value = resp.json().await.expect("JSON error body");
    assert_eq!(body["error"]["code"], code, "code in {body}");
    assert!(body["error"]["message"]
        .as_str()
        .is_some_and(|m| !m.is_empty()));
    assert_eq!(body["error"]["request_id"], header.as_str());
    assert!(header.starts_with("req_"));
    body
}

/// A gateway request with `key` as the bearer, and a JSON body if given.
pub async fn call(
    gw: &Gateway,
    key: &str,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> reqwest::Response {
    let mut req = gw.request(method, path).bearer_auth(key);
    if let Some(b) = body {
        req = req.json(&b);
    }
    req.send().await.unwrap()
}
