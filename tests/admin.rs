//! The admin API, as an operator's dashboard would use it.

mod common;

use common::*;
use reqwest::Method;
use serde_json::{json, Value};

#[tokio::test]
async fn admin_calls_need_the_admin_token() {
    let gw = Gateway::builder().start().await;
    let url = format!("{}/admin/v1/keys?workspace={DEMO_WS}", gw.admin);
    let resp = gw.http.get(&url).send().await.unwrap();
    assert_error(resp, 401, "authentication_error").await;
    let resp = gw.http.get(&url).bearer_auth("wrong").send().await.unwrap();
    assert_error(resp, 401, "authentication_error").await;
    let resp = gw
        .http
        .get(&url)
        .bearer_auth(format!("{ADMIN_TOKEN}x"))
        .send()
        .await
        .unwrap();
    assert_error(resp, 401, "authentication_error").await;
    let resp = gw
        .http
        .get(&url)
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    // Probes need no token.
    for path in ["/healthz", "/readyz"] {
        let resp = gw
            .http
            .get(format!("{}{path}", gw.admin))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
    }
}

#[tokio::test]
async fn workspaces_are_created_and_validated() {
    let gw = Gateway::builder().start().await;
    let resp = gw
        .admin_request(Method::POST, "/admin/v1/workspaces")
        .json(&json!({"name": "Acme", "admin_emails": ["ops@acme.example"], "monthly_credits": 1000, "credits_low_threshold": 100}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);
    let ws: Value = resp.json().await.unwrap();
    assert!(ws["id"].as_str().unwrap().starts_with("ws_"));
    assert_eq!(ws["monthly_credits"], 1000.0);

    // A key in the new workspace works on the gateway.
    let resp = gw
        .admin_request(Method::POST, "/admin/v1/keys")
        .json(&json!({"workspace": ws["id"], "environment": "live", "scopes": ["models:read"]}))
        .send()
        .await
        .unwrap();
    let key: Value = resp.json().await.unwrap();
    let resp = gw
        .request(Method::GET, "/v1/models")
        .bearer_auth(key["key"].as_str().unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);

    // Names are limited in characters, not bytes.
    let resp = gw
        .admin_request(Method::POST, "/admin/v1/workspaces")
        .json(&json!({"name": "é".repeat(200), "admin_emails": ["ops@acme.example"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);

    for bad in [
        json!({"name": ""}),
        json!({"name": "é".repeat(201), "admin_emails": ["ops@acme.example"]}),
        json!({"name": "x"}),
        json!({"name": "x", "admin_emails": []}),
        json!({"name": "x", "admin_emails": ["not-an-email"]}),
        json!({"name": "x", "monthly_credits": -5}),
        json!({"name": "x", "surprise": 1}),
        json!({"admin_emails": []}),
    ] {
        let resp = gw
            .admin_request(Method::POST, "/admin/v1/workspaces")
            .json(&bad)
            .send()
            .await
            .unwrap();
        assert_error(resp, 400, "invalid_request_error").await;
    }
}

#[tokio::test]
async fn workspaces_are_read_back_and_changed_on_both_stores() {
    let ns = TestNamespace::new();
    for gw in [Gateway::builder().start().await, on_redis(&ns).await] {
        let created = gw
            .admin_request(Method::POST, "/admin/v1/workspaces")
            .json(&json!({"name": "Acme", "admin_emails": ["ops@acme.example"], "monthly_credits": 100, "credits_low_threshold": 10}))
            .send()
            .await
            .unwrap()
            .json::<Value>()
            .await
            .unwrap();
        let path = format!("/admin/v1/workspaces/{}", created["id"].as_str().unwrap());
        assert_eq!(gw.admin_get(&path).await, created);

        let patch = |body: Value| gw.admin_request(Method::PATCH, &path).json(&body).send();
        let resp = patch(json!({"name": " Acme Labs ", "admin_emails": ["a@acme.example", "b@acme.example"], "monthly_credits": 250.5}))
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        let changed: Value = resp.json().await.unwrap();
        let mut expected = created.clone();
        expected["name"] = json!("Acme Labs");
        expected["admin_emails"] = json!(["a@acme.example", "b@acme.example"]);
        expected["monthly_credits"] = json!(250.5);
        assert_eq!(changed, expected, "what is absent stays");
        assert_eq!(gw.admin_get(&path).await, expected);

        // null removes a cap or a threshold.
        let resp = patch(json!({"credits_low_threshold": null})).await.unwrap();
        let changed: Value = resp.json().await.unwrap();
        assert_eq!(changed["credits_low_threshold"], Value::Null);
        assert_eq!(changed["monthly_credits"], 250.5);
        let resp = patch(json!({"monthly_credits": null})).await.unwrap();
        assert_eq!(gw.admin_get(&path).await["monthly_credits"], Value::Null);
        assert_eq!(resp.status(), 200);

        for bad in [
            json!({"name": ""}),
            json!({"name": "é".repeat(201)}),
            json!({"admin_emails": []}),
            json!({"admin_emails": ["not-an-email"]}),
            json!({"monthly_credits": -5}),
            json!({"credits_low_threshold": "ten"}),
            json!({"id": "ws_other"}),
            json!({"created_at": 1}),
            json!([]),
        ] {
            let resp = patch(bad.clone()).await.unwrap();
            assert_error(resp, 400, "invalid_request_error").await;
        }
        assert_eq!(
            gw.admin_get(&path).await["name"],
            "Acme Labs",
            "nothing changed"
        );

        for method in [Method::GET, Method::PATCH] {
            let resp = gw
                .admin_request(method, "/admin/v1/workspaces/ws_nope")
                .json(&json!({"name": "x"}))
                .send()
                .await
                .unwrap();
            assert_error(resp, 404, "not_found").await;
        }
    }
}

#[tokio::test]
async fn a_key_is_shown_once_and_then_only_by_prefix_and_last4() {
    let gw = Gateway::builder().start().await;
    let resp = gw
        .admin_request(Method::POST, "/admin/v1/keys")
        .json(&json!({"workspace": DEMO_WS, "environment": "test", "scopes": ["images:create"], "name": "ci", "monthly_budget": 12.5}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);
    let created: Value = resp.json().await.unwrap();
    let key = created["key"].as_str().unwrap().to_string();
    assert!(key.starts_with("svc_test_"));
    assert_eq!(created["prefix"], "svc_test_");
    assert_eq!(created["last4"], &key[key.len() - 4..]);
    assert_eq!(created["environment"], "test");
    assert_eq!(created["scopes"], json!(["images:create"]));
    assert_eq!(created["monthly_budget"], 12.5);
    assert_eq!(created["status"], "active");
    assert_eq!(created["name"], "ci");
    let id = created["id"].as_str().unwrap();

    let shown = gw
        .admin_request(Method::GET, &format!("/admin/v1/keys/{id}"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let listed = gw
        .admin_request(Method::GET, &format!("/admin/v1/keys?workspace={DEMO_WS}"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for text in [&shown, &listed] {
        assert!(text.contains(id));
        assert!(!text.contains(&key), "full key shown again");
        assert!(
            !text.contains(&key[9..20]),
            "part of the key body shown again"
        );
        assert!(!text.contains("hash"), "digest exposed: {text}");
    }
    let listed: Value = serde_json::from_str(&listed).unwrap();
    assert_eq!(listed["data"].as_array().unwrap().len(), 1);
    assert!(!gw.logs().contains(&key), "the key reached the log");
}

#[tokio::test]
async fn patching_scopes_and_budget_takes_effect() {
    let gw = Gateway::builder().start().await;
    let (id, key) = gw.create_key("live", &["models:read"]).await;
    assert_error(gw.chat(&key).await, 403, "permission_error").await;

    let resp = gw
        .admin_request(Method::PATCH, &format!("/admin/v1/keys/{id}"))
        .json(&json!({"scopes": ["models:read", "chat.completions:create"], "monthly_budget": 50}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let patched: Value = resp.json().await.unwrap();
    assert_eq!(patched["monthly_budget"], 50.0);
    assert_eq!(gw.chat(&key).await.status(), 200);

    // `null` clears the budget; an absent field leaves it alone.
    let patched: Value = gw
        .admin_request(Method::PATCH, &format!("/admin/v1/keys/{id}"))
        .json(&json!({"monthly_budget": null}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(patched["monthly_budget"], Value::Null);
    assert_eq!(patched["scopes"].as_array().unwrap().len(), 2);
}

#[tokio::test]
async fn revoke_marks_the_key_revoked() {
    let gw = Gateway::builder().start().await;
    let (id, _) = gw.create_key("live", &["models:read"]).await;
    let resp = gw.admin_post(&format!("/admin/v1/keys/{id}/revoke")).await;
    assert_eq!(resp.status(), 200);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["status"], "revoked");
}

#[tokio::test]
async fn bad_admin_input_gets_documented_error_bodies() {
    let gw = Gateway::builder().start().await;
    let bad_keys = [
        json!({"workspace": DEMO_WS, "environment": "scoped", "scopes": ["a:b"]}),
        json!({"workspace": DEMO_WS, "environment": "prod", "scopes": ["a:b"]}),
        json!({"workspace": DEMO_WS, "environment": "live", "scopes": []}),
        json!({"workspace": DEMO_WS, "environment": "live", "scopes": ["nope"]}),
        json!({"workspace": DEMO_WS, "environment": "live"}),
        json!({"workspace": DEMO_WS, "environment": "live", "scopes": ["a:b"], "monthly_budget": "lots"}),
        json!([1, 2, 3]),
    ];
    for body in bad_keys {
        let resp = gw
            .admin_request(Method::POST, "/admin/v1/keys")
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_error(resp, 400, "invalid_request_error").await;
    }
    let resp = gw
        .admin_request(Method::POST, "/admin/v1/keys")
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_error(resp, 400, "invalid_request_error").await;
    let resp = gw
        .admin_request(Method::POST, "/admin/v1/keys")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_error(resp, 400, "invalid_request_error").await;

    let resp = gw
        .admin_request(Method::POST, "/admin/v1/keys")
        .json(&json!({"workspace": "ws_missing", "environment": "live", "scopes": ["a:b"]}))
        .send()
        .await
        .unwrap();
    assert_error(resp, 404, "not_found").await;
    for (method, path) in [
        (Method::GET, "/admin/v1/keys/key_missing"),
        (Method::POST, "/admin/v1/keys/key_missing/revoke"),
        (Method::GET, "/admin/v1/nothing"),
    ] {
        let resp = gw.admin_request(method, path).send().await.unwrap();
        assert_error(resp, 404, "not_found").await;
    }
    let resp = gw
        .admin_request(Method::PATCH, "/admin/v1/keys/key_missing")
        .json(&json!({"scopes": ["a:b"]}))
        .send()
        .await
        .unwrap();
    assert_error(resp, 404, "not_found").await;
    let resp = gw
        .admin_request(Method::GET, "/admin/v1/keys")
        .send()
        .await
        .unwrap();
    assert_error(resp, 400, "invalid_request_error").await;
    let resp = gw
        .admin_request(Method::DELETE, "/admin/v1/keys")
        .send()
        .await
        .unwrap();
    // What the path does take (RFC 9110 asks a 405 for it).
    let allow = resp.headers()["allow"].to_str().unwrap().to_string();
    assert!(allow.contains("GET") && allow.contains("POST"), "{allow}");
    assert_error(resp, 405, "invalid_request_error").await;
    // A filter the API does not have is refused, not ignored; a path that is not UTF-8 gets
    // the same JSON error as any other bad input.
    for path in [
        format!("/admin/v1/keys?workspace={DEMO_WS}&status=revoked"),
        "/admin/v1/keys/%FF".to_string(),
        format!("/admin/v1/workspaces/{DEMO_WS}/projects/%C3%28/budget"),
    ] {
        let method = match path.ends_with("budget") {
            true => Method::PUT,
            false => Method::GET,
        };
        let resp = gw.admin_request(method, &path).send().await.unwrap();
        assert_error(resp, 400, "invalid_request_error").await;
    }
}

#[tokio::test]
async fn a_key_put_where_an_id_belongs_is_not_repeated_in_the_404() {
    let gw = Gateway::builder().start().await;
    let (_, key) = gw.create_key("live", &["models:read"]).await;
    for path in [
        format!("/admin/v1/keys/{key}"),
        format!("/admin/v1/usage?workspace={key}"),
    ] {
        let resp = gw.admin_request(Method::GET, &path).send().await.unwrap();
        let body = assert_error(resp, 404, "not_found").await;
        let message = body["error"]["message"].as_str().unwrap();
        assert!(!message.contains(&key), "{message}");
        assert!(message.contains(&key[key.len() - 4..]), "{message}");
    }
}

#[tokio::test]
async fn workspaces_are_listed_a_page_at_a_time() {
    let gw = Gateway::builder().start().await;
    let made = [
        gw.create_workspace().await,
        gw.create_workspace().await,
        gw.create_workspace().await,
    ];
    let all = gw.admin_get("/admin/v1/workspaces").await;
    let ids: Vec<&str> = all["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["id"].as_str().unwrap())
        .collect();
    // The demo workspace and ours (the order is the store suite's to check).
    assert_eq!(ids.len(), 4, "{all}");
    assert!(made.iter().all(|m| ids.contains(&m.as_str())), "{all}");
    assert!(ids.contains(&DEMO_WS));
    assert_eq!(all["has_more"], false);
    let page = gw
        .admin_get(&format!(
            "/admin/v1/workspaces?limit=1&starting_after={}",
            ids[1]
        ))
        .await;
    assert_eq!(page["data"].as_array().unwrap().len(), 1);
    assert_eq!(page["data"][0]["id"], ids[2]);
    assert!(page["data"][0]["name"].is_string());
    assert_eq!(page["has_more"], true);
    for query in [
        "limit=0",
        "limit=1001",
        "starting_after=ws_nope",
        "sort=name",
    ] {
        let resp = gw
            .admin_request(Method::GET, &format!("/admin/v1/workspaces?{query}"))
            .send()
            .await
            .unwrap();
        assert_error(resp, 400, "invalid_request_error").await;
    }
}

/// A namespace an earlier version wrote, with no workspace index: `serve` indexes it at start,
/// in the background, so no listing waits for the scan.
#[tokio::test]
async fn serve_indexes_workspaces_of_an_earlier_version_at_start() {
    let ns = TestNamespace::new();
    let client = redis::Client::open(redis_url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let old = json!({
        "id": "ws_fromanearlierversion", "name": "old", "admin_emails": ["ops@example.com"],
        "created_at": 1_700_000_000u64
    });
    let () = redis::cmd("SET")
        .arg(format!("{{{}}}:ws:ws_fromanearlierversion", ns.name))
        .arg(old.to_string())
        .query_async(&mut conn)
        .await
        .unwrap();
    let _gw = Gateway::builder()
        .redis(&redis_url(), &ns.name)
        .start()
        .await;
    // The fill indexes what it finds, then marks the index filled: both, in that order.
    let indexed = eventually(std::time::Duration::from_secs(10), || {
        let mut conn = conn.clone();
        let index = format!("{{{}}}:workspaces", ns.name);
        let filled = format!("{{{}}}:workspaces:filled", ns.name);
        async move {
            let rank: Option<f64> = redis::cmd("ZSCORE")
                .arg(index)
                .arg("ws_fromanearlierversion")
                .query_async(&mut conn)
                .await
                .unwrap();
            let filled: bool = redis::cmd("EXISTS")
                .arg(filled)
                .query_async(&mut conn)
                .await
                .unwrap();
            rank.is_some() && filled
        }
    })
    .await;
    assert!(
        indexed.is_some(),
        "indexed and marked filled with no listing"
    );
}

#[tokio::test]
async fn reading_an_unknown_workspace_is_not_found_on_both_stores() {
    let ns = TestNamespace::new();
    for gw in [Gateway::builder().start().await, on_redis(&ns).await] {
        let resp = gw
            .admin_request(Method::POST, "/admin/v1/keys")
            .json(&json!({"workspace": "ws_nope", "environment": "live", "scopes": ["a:b"]}))
            .send()
            .await
            .unwrap();
        let created = assert_error(resp, 404, "not_found").await;
        for path in [
            "/admin/v1/keys?workspace=ws_nope",
            "/admin/v1/audit?workspace=ws_nope",
            "/admin/v1/usage?workspace=ws_nope",
            "/admin/v1/usage?workspace=ws_nope&month=2026-01",
        ] {
            let resp = gw.admin_request(Method::GET, path).send().await.unwrap();
            let listed = assert_error(resp, 404, "not_found").await;
            assert_eq!(
                listed["error"]["message"], created["error"]["message"],
                "{path}: the same answer as creating a key there"
            );
        }

        // A workspace that exists but has nothing in it is empty, not missing.
        let ws = gw.create_workspace().await;
        assert_eq!(gw.list_keys(&ws).await, Vec::<Value>::new());
        let audit = gw
            .admin_get(&format!("/admin/v1/audit?workspace={ws}"))
            .await;
        assert_eq!(audit["data"], json!([]));
        let usage = gw
            .admin_get(&format!("/admin/v1/usage?workspace={ws}"))
            .await;
        assert_eq!(usage["workspace"], ws.as_str());
    }
}

#[tokio::test]
async fn key_lists_come_a_page_at_a_time() {
    let ns = TestNamespace::new();
    for gw in [Gateway::builder().start().await, on_redis(&ns).await] {
        let ws = gw.create_workspace().await;
        let mut created = Vec::new();
        for _ in 0..5 {
            created.push(gw.create_key_in(&ws, "live", &["models:read"]).await.0);
        }
        let mut seen = Vec::new();
        let mut after: Option<String> = None;
        let mut pages = 0;
        loop {
            let mut path = format!("/admin/v1/keys?workspace={ws}&limit=2");
            if let Some(a) = &after {
                path.push_str(&format!("&starting_after={a}"));
            }
            let body = gw.admin_get(&path).await;
            let ids: Vec<String> = body["data"]
                .as_array()
                .unwrap()
                .iter()
                .map(|k| k["id"].as_str().unwrap().to_string())
                .collect();
            assert!(ids.len() <= 2);
            pages += 1;
            seen.extend(ids.clone());
            if body["has_more"] == false {
                break;
            }
            after = ids.last().cloned();
        }
        assert_eq!(pages, 3);
        assert_eq!(seen.len(), 5);
        let mut sorted_seen = seen.clone();
        sorted_seen.sort();
        let mut sorted_created = created.clone();
        sorted_created.sort();
        assert_eq!(sorted_seen, sorted_created, "every key once");

        // A cursor from another workspace, and limits out of range, are 400s.
        let other = gw.create_workspace().await;
        let (foreign, _) = gw.create_key_in(&other, "live", &["models:read"]).await;
        for query in [
            format!("starting_after={foreign}"),
            "limit=0".to_string(),
            "limit=1001".to_string(),
        ] {
            let resp = gw
                .admin_request(
                    Method::GET,
                    &format!("/admin/v1/keys?workspace={ws}&{query}"),
                )
                .send()
                .await
                .unwrap();
            assert_error(resp, 400, "invalid_request_error").await;
        }
    }
}

/// A body past the admin API's limit gets the documented error body on every route, rotation's
/// (which reads the body itself: it may be empty) included.
#[tokio::test]
async fn an_oversized_rotation_body_gets_the_documented_error_body() {
    let gw = Gateway::builder().start().await;
    let (id, _) = gw.create_key("live", &["models:read"]).await;
    let resp = gw
        .admin_request(Method::POST, &format!("/admin/v1/keys/{id}/rotate"))
        .header("content-type", "application/json")
        .body(" ".repeat(2 * 1024 * 1024 + 16))
        .send()
        .await
        .unwrap();
    assert_error(resp, 400, "invalid_request_error").await;
}
