//! Keys as a platform runs them, on real Redis: expiry, rate limits per key and per
//! workspace, metadata that travels with the key, last use, and operator tokens with roles.

use super::*;
use std::time::Duration;
use svcgate::shared::rfc3339;

/// What `check` finds, asked again until it finds something (for at most 5 s).
async fn poll<T, F, Fut>(mut check: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while std::time::Instant::now() < deadline {
        if let Some(found) = check().await {
            return Some(found);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}

/// A key created through the admin API with `extra` fields besides the usual ones; its
/// (id, value).
async fn key_with(gw: &Gateway, workspace: &str, extra: Value) -> (String, String) {
    let mut body = json!({
        "workspace": workspace,
        "environment": "live",
        "scopes": ["chat.completions:create", "tokens:create"],
    });
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    let resp = gw
        .admin_request(Method::POST, "/admin/v1/keys")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);
    let created: Value = resp.json().await.unwrap();
    (
        created["id"].as_str().unwrap().to_string(),
        created["key"].as_str().unwrap().to_string(),
    )
}

#[tokio::test]
async fn a_key_that_expires_works_until_then_and_its_tokens_die_with_it() {
    let ns = TestNamespace::new();
    let gw = on_redis(&ns).await;
    let ws = gw.create_workspace().await;
    // Two seconds ahead, rounded up to the second (RFC 3339 here has no fractions).
    let expires_at = (svcgate::ids::unix_millis() + 2000).div_ceil(1000);
    let (id, key) = key_with(&gw, &ws, json!({"expires_at": rfc3339::format(expires_at)})).await;
    assert_eq!(gw.chat(&key).await.status(), 200);
    let token = gw
        .mint_token(&key, json!({"scopes": ["chat.completions:create"]}))
        .await;
    assert_eq!(gw.chat(&token).await.status(), 200);
    let shown = gw.admin_get(&format!("/admin/v1/keys/{id}")).await;
    assert_eq!(shown["expires_at"], rfc3339::format(expires_at));
    // Listed among those expiring within the minute; not among those within a second of a
    // time before it.
    let soon = gw
        .admin_get(&format!(
            "/admin/v1/keys?workspace={ws}&expiring_within_seconds=60"
        ))
        .await;
    assert_eq!(soon["data"][0]["id"], id.as_str());
    let (other, _) = gw.create_key_in(&ws, "live", &["models:read"]).await;
    assert!(!soon["data"]
        .as_array()
        .unwrap()
        .iter()
        .any(|k| k["id"] == other.as_str()));

    let wait = Duration::from_millis(1000 * (expires_at + 1) - svcgate::ids::unix_millis());
    tokio::time::sleep(wait).await;
    let body = assert_error(gw.chat(&key).await, 401, "authentication_error").await;
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("expired"),
        "{body}"
    );
    assert_error(gw.chat(&token).await, 401, "authentication_error").await;

    // Moved later, it works again, on the next request.
    let resp = gw
        .admin_request(Method::PATCH, &format!("/admin/v1/keys/{id}"))
        .json(&json!({"expires_at": null}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(gw.chat(&key).await.status(), 200);
    // An expiry that is not RFC 3339, or already past at creation, is refused.
    for bad in [json!("tomorrow"), json!("2001-01-01T00:00:00Z"), json!(12)] {
        let resp = gw
            .admin_request(Method::POST, "/admin/v1/keys")
            .json(&json!({"workspace": ws, "environment": "live",
                          "scopes": ["models:read"], "expires_at": bad}))
            .send()
            .await
            .unwrap();
        assert_error(resp, 400, "invalid_request_error").await;
    }
}

#[tokio::test]
async fn a_key_limit_refuses_its_sixth_request_and_a_workspace_limit_reaches_every_replica() {
    let ns = TestNamespace::new();
    let (a, b) = replicas(&ns).await;
    let ws = a.create_workspace().await;
    let limited = json!({"rate_limit": {"requests_per_minute": 5}});
    let (_, key) = key_with(&a, &ws, limited).await;
    let (sibling_id, sibling) = key_with(&a, &ws, json!({})).await;
    for n in 1..=5 {
        let resp = a.chat(&key).await;
        assert_eq!(resp.status(), 200, "request {n}");
        assert_eq!(resp.headers()["ratelimit-limit"], "5");
    }
    let refused = a.chat(&key).await;
    assert!(refused.headers().contains_key("retry-after"));
    assert_eq!(refused.headers()["ratelimit-limit"], "5");
    assert_error(refused, 429, "rate_limit_error").await;
    for n in 1..=6 {
        let resp = a.chat(&sibling).await;
        assert_eq!(resp.status(), 200, "sibling request {n}");
        assert_ne!(resp.headers()["ratelimit-limit"], "5");
    }

    // A workspace limit, set through one replica, applies to the keys without their own on
    // the other, without their being read again; the key's own limit still wins.
    let resp = b
        .admin_request(Method::PATCH, &format!("/admin/v1/workspaces/{ws}"))
        .json(&json!({"rate_limit": {"requests_per_minute": 3, "burst": 3}}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.json::<Value>().await.unwrap()["rate_limit"]["requests_per_minute"],
        3
    );
    let (_, fresh) = key_with(&a, &ws, json!({})).await;
    let applied = eventually(Duration::from_secs(5), || async {
        a.chat(&fresh).await.headers()["ratelimit-limit"] == "3"
    })
    .await;
    assert!(applied.is_some(), "the workspace limit reached the replica");
    let mut statuses = Vec::new();
    for _ in 0..4 {
        statuses.push(a.chat(&fresh).await.status().as_u16());
    }
    assert_eq!(statuses.last(), Some(&429), "{statuses:?}");
    assert_eq!(a.chat(&key).await.headers()["ratelimit-limit"], "5");
    // A key's own limit changed through one replica reaches the other, as a revocation does.
    let resp = b
        .admin_request(Method::PATCH, &format!("/admin/v1/keys/{sibling_id}"))
        .json(&json!({"rate_limit": {"requests_per_minute": 1000}}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let applied = eventually(Duration::from_secs(5), || async {
        a.chat(&sibling).await.headers()["ratelimit-limit"] == "1000"
    })
    .await;
    assert!(applied.is_some(), "the key's new limit reached the replica");
    // Out of range: refused.
    let resp = b
        .admin_request(Method::PATCH, &format!("/admin/v1/workspaces/{ws}"))
        .json(&json!({"rate_limit": {"requests_per_minute": 0}}))
        .send()
        .await
        .unwrap();
    assert_error(resp, 400, "invalid_request_error").await;
}

#[tokio::test]
async fn metadata_comes_back_reaches_the_backend_and_is_in_every_audit_record() {
    let ns = TestNamespace::new();
    let live = RecordingUpstream::start("live").await;
    let gw = Gateway::builder()
        .redis(&redis_url(), &ns.name)
        .live(live.addr)
        .config(|c| c.upstream.forward_key_metadata = true)
        .start()
        .await;
    let ws = gw.create_workspace().await;
    let metadata = json!({"customer": "cus_42", "plan": "pro", "name": "Zoë"});
    let (id, key) = key_with(&gw, &ws, json!({"metadata": metadata})).await;
    assert_eq!(
        gw.admin_get(&format!("/admin/v1/keys/{id}")).await["metadata"],
        metadata
    );
    let listed = gw.list_keys(&ws).await;
    assert_eq!(listed[0]["metadata"], metadata);

    // A client's own `Service-Key-Metadata` is not the gateway's: replaced.
    let resp = gw
        .request(Method::POST, "/v1/chat/completions")
        .bearer_auth(&key)
        .header("service-key-metadata", "{\"plan\":\"free\"}")
        .json(&json!({"model": "m"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let token = gw
        .mint_token(
            &key,
            json!({"scopes": ["chat.completions:create"], "metadata": {"user": "u1"}}),
        )
        .await;
    assert_eq!(gw.chat(&token).await.status(), 200);
    let seen = live.requests();
    assert_eq!(seen.len(), 2);
    for request in &seen {
        let values: Vec<_> = request
            .headers
            .get_all("service-key-metadata")
            .iter()
            .collect();
        assert_eq!(values.len(), 1);
        let sent: Value = serde_json::from_slice(values[0].as_bytes()).unwrap();
        assert_eq!(sent, metadata);
    }

    // Both requests' audit records carry it; the token's has its own metadata too.
    let query = format!("/admin/v1/audit?workspace={ws}&key_id={id}");
    let records = poll(|| async {
        let page = gw.admin_get(&query).await;
        let records = page["data"].as_array().cloned().unwrap_or_default();
        let chats = records
            .iter()
            .filter(|r| r["path"] == "/v1/chat/completions");
        (chats.count() == 2).then_some(records)
    })
    .await
    .expect("both requests audited");
    for record in records
        .iter()
        .filter(|r| r["path"] == "/v1/chat/completions")
    {
        assert_eq!(record["key_metadata"], metadata, "{record}");
    }
    assert!(records.iter().any(|r| r["metadata"]["user"] == "u1"));

    // Capped, and an object.
    for bad in [json!({"blob": "x".repeat(5000)}), json!(["a"]), json!("a")] {
        let resp = gw
            .admin_request(Method::PATCH, &format!("/admin/v1/keys/{id}"))
            .json(&json!({"metadata": bad}))
            .send()
            .await
            .unwrap();
        assert_error(resp, 400, "invalid_request_error").await;
    }
}

#[tokio::test]
async fn last_used_at_is_set_after_a_request() {
    let ns = TestNamespace::new();
    let gw = on_redis(&ns).await;
    let ws = gw.create_workspace().await;
    let (id, key) = key_with(&gw, &ws, json!({})).await;
    let shown = gw.admin_get(&format!("/admin/v1/keys/{id}")).await;
    assert_eq!(shown["last_used_at"], Value::Null);
    let before = svcgate::ids::unix_now();
    assert_eq!(gw.chat(&key).await.status(), 200);
    let used = poll(|| async {
        let shown = gw.admin_get(&format!("/admin/v1/keys/{id}")).await;
        shown["last_used_at"].as_str().and_then(rfc3339::parse)
    })
    .await;
    assert!(used.is_some(), "last_used_at set");
    // To the minute: the start of the minute of the request.
    let used = used.unwrap();
    assert_eq!(used % 60, 0);
    assert!(
        used <= svcgate::ids::unix_now() && used + 60 > before,
        "{used} vs {before}"
    );
    let listed = gw.list_keys(&ws).await;
    assert_eq!(listed[0]["last_used_at"], rfc3339::format(used));
}

/// Creates an operator token as the root; its (id, value).
async fn operator(gw: &Gateway, body: Value) -> (String, String) {
    let resp = gw
        .admin_request(Method::POST, "/admin/v1/tokens")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);
    let created: Value = resp.json().await.unwrap();
    assert!(created["token"].as_str().unwrap().starts_with("svcop_"));
    (
        created["id"].as_str().unwrap().to_string(),
        created["token"].as_str().unwrap().to_string(),
    )
}

#[tokio::test]
async fn operator_tokens_act_within_their_role_and_a_revoked_one_is_refused_everywhere() {
    let ns = TestNamespace::new();
    let (a, b) = replicas(&ns).await;
    let ws = a.create_workspace().await;
    let other_ws = a.create_workspace().await;
    let (read_id, read) = operator(&a, json!({"name": "ci-reader", "role": "read"})).await;
    let (_, scoped) = operator(
        &a,
        json!({"name": "billing", "role": "workspace", "workspace": ws}),
    )
    .await;
    let as_operator = |gw: &Gateway, token: &str, method: Method, path: &str| {
        gw.http
            .request(method, format!("{}{path}", gw.admin))
            .bearer_auth(token)
    };
    let new_key =
        |ws: &str| json!({"workspace": ws, "environment": "live", "scopes": ["models:read"]});

    // Read: lists keys, may not create one.
    let listed = as_operator(
        &b,
        &read,
        Method::GET,
        &format!("/admin/v1/keys?workspace={ws}"),
    )
    .send()
    .await
    .unwrap();
    assert_eq!(listed.status(), 200);
    let refused = as_operator(&b, &read, Method::POST, "/admin/v1/keys")
        .json(&new_key(&ws))
        .send()
        .await
        .unwrap();
    assert_error(refused, 403, "permission_error").await;

    // Workspace: its own workspace's keys only.
    let created = as_operator(&b, &scoped, Method::POST, "/admin/v1/keys")
        .json(&new_key(&ws))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201);
    let created: Value = created.json().await.unwrap();
    let elsewhere = as_operator(&b, &scoped, Method::POST, "/admin/v1/keys")
        .json(&new_key(&other_ws))
        .send()
        .await
        .unwrap();
    assert_error(elsewhere, 403, "permission_error").await;
    let (foreign, _) = a.create_key_in(&other_ws, "live", &["models:read"]).await;
    let revoke_foreign = as_operator(
        &b,
        &scoped,
        Method::POST,
        &format!("/admin/v1/keys/{foreign}/revoke"),
    )
    .send()
    .await
    .unwrap();
    assert_error(revoke_foreign, 403, "permission_error").await;
    let tokens = as_operator(&b, &scoped, Method::GET, "/admin/v1/tokens")
        .send()
        .await
        .unwrap();
    assert_error(tokens, 403, "permission_error").await;

    // Listed without their values; deleted on one replica, refused at once on the other.
    let listed = a.admin_get("/admin/v1/tokens").await;
    let mut names: Vec<&str> = listed["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    names.sort_unstable();
    assert_eq!(names, ["billing", "ci-reader"]);
    assert!(!listed.to_string().contains(&read));
    let deleted = a
        .admin_request(Method::DELETE, &format!("/admin/v1/tokens/{read_id}"))
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), 200);
    let after = as_operator(
        &b,
        &read,
        Method::GET,
        &format!("/admin/v1/keys?workspace={ws}"),
    )
    .send()
    .await
    .unwrap();
    assert_error(after, 401, "authentication_error").await;

    // Every state-changing action is audited with who acted.
    let audit = a
        .admin_get(&format!("/admin/v1/audit?workspace={ws}&actions=true"))
        .await;
    let by_billing = audit["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["actor"] == "operator:billing" && r["method"] == "POST")
        .cloned()
        .expect("the key's creation audited");
    assert_eq!(by_billing["status"], 201);
    assert_eq!(by_billing["key_id"], created["id"]);
    assert_eq!(by_billing["path"], "/admin/v1/keys");
    let global = a.admin_get("/admin/v1/audit?workspace=_admin").await;
    assert!(global["data"]
        .as_array()
        .unwrap()
        .iter()
        .any(|r| r["actor"] == "root"
            && r["path"] == "/admin/v1/workspaces"
            && r["status"] == 201));
    assert!(global["data"]
        .as_array()
        .unwrap()
        .iter()
        .any(|r| r["actor"] == "root"
            && r["method"] == "DELETE"
            && r["path"] == format!("/admin/v1/tokens/{read_id}")));
    // So is an attempt its role refused, under the workspace it reached for.
    let other_audit = a
        .admin_get(&format!(
            "/admin/v1/audit?workspace={other_ws}&actions=true"
        ))
        .await;
    assert!(other_audit["data"]
        .as_array()
        .unwrap()
        .iter()
        .any(|r| r["status"] == 403
            && r["actor"] == "operator:billing"
            && r["key_id"] == foreign.as_str()));
}
