//! The audit log: what it records, what it never records, how it is read.

use super::*;

/// A client chooses its path: a 60 KB one is audited cut to 2 KiB and marked, not stored whole.
#[tokio::test]
async fn a_long_path_is_audited_cut_and_marked() {
    let gw = Gateway::builder().start().await;
    let (_, key) = gw.create_key("live", &["models:read"]).await;
    let path = format!("/v1/{}", "a".repeat(60 * 1024));
    let resp = gw
        .request(Method::GET, &path)
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 404);
    until_audited(&gw, DEMO_WS, 1, "the request's audit record").await;
    let records = audit(&gw, &format!("workspace={DEMO_WS}")).await;
    let audited = records[0]["path"].as_str().unwrap();
    assert!(audited.len() <= 2048, "{} bytes", audited.len());
    assert!(audited.ends_with('…'), "marked as cut");
    assert!(path.starts_with(audited.trim_end_matches('…')));
}

#[tokio::test]
async fn a_key_in_the_path_is_cut_to_its_last_four_in_answers_and_audit_records() {
    let live = RecordingUpstream::start("live").await;
    let gw = Gateway::builder().live(live.addr).start().await;
    let (_, key) = gw.create_key("live", &["agents:run"]).await;
    let shown = format!("svc_live_…{}", &key[key.len() - 4..]);
    // No route: the 404 names the path, without the key.
    let resp = gw
        .request(Method::GET, &format!("/v1/{key}"))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    let body = assert_error(resp, 404, "not_found").await;
    let message = body["error"]["message"].as_str().unwrap();
    assert_eq!(message, format!("no route for GET /v1/{shown}"));
    // A route with a parameter: the backend gets the path as sent, the audit log does not.
    let path = format!("/v1/agents/runs/{key}/approve");
    let resp = gw
        .request(Method::POST, &path)
        .bearer_auth(&key)
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(live.requests()[0].path, path);
    // Both requests were authenticated, so both are audited, the 404 too.
    until_audited(&gw, DEMO_WS, 2, "two audit records").await;
    let records = audit(&gw, &format!("workspace={DEMO_WS}")).await;
    let mut seen: Vec<(String, u64)> = records
        .iter()
        .map(|r| {
            (
                r["path"].as_str().unwrap().into(),
                r["status"].as_u64().unwrap(),
            )
        })
        .collect();
    seen.sort();
    assert_eq!(
        seen,
        [
            (format!("/v1/agents/runs/{shown}/approve"), 200),
            (format!("/v1/{shown}"), 404)
        ]
    );
}

#[tokio::test]
async fn the_audit_log_records_who_did_what_and_never_a_secret() {
    let live = RecordingUpstream::start("live").await;
    let gw = Gateway::builder().live(live.addr).start().await;
    let (id, key) = gw
        .create_key("live", &["chat.completions:create", "tokens:create"])
        .await;
    let minted: Value = gw
        .request(Method::POST, "/v1/tokens")
        .bearer_auth(&key)
        .json(&json!({"scopes": ["chat.completions:create"], "metadata": {"user": "u_7"}}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let token = minted["value"].as_str().unwrap();
    let resp = gw
        .request(Method::POST, "/v1/chat/completions?stream=false")
        .bearer_auth(token)
        .header("service-project", "web")
        .json(&json!({"model": "gpt-sim", "messages": []}))
        .send()
        .await
        .unwrap();
    let request_id = resp.headers()["service-request-id"]
        .to_str()
        .unwrap()
        .to_string();
    assert_eq!(resp.status(), 200);
    assert_eq!(gw.chat("svc_live_nope").await.status(), 401);

    until_audited(
        &gw,
        DEMO_WS,
        2,
        "two authenticated requests, two records (the 401 has no key to record)",
    )
    .await;
    let records = audit(&gw, &format!("workspace={DEMO_WS}&project=web")).await;
    assert_eq!(records.len(), 1);
    let r = &records[0];
    assert_eq!(r["request_id"], request_id.as_str());
    assert_eq!(r["key_id"], id.as_str());
    assert_eq!(r["workspace"], DEMO_WS);
    assert_eq!(r["environment"], "live");
    assert_eq!(r["method"], "POST");
    assert_eq!(r["path"], "/v1/chat/completions");
    assert_eq!(r["model"], "gpt-sim");
    assert_eq!(r["status"], 200);
    assert_eq!(r["credits"], 0.5);
    assert_eq!(r["client_ip"], "127.0.0.1");
    assert_eq!(r["metadata"], json!({"user": "u_7"}));
    assert!(r["token_id"].as_str().unwrap().starts_with("tok_"));
    assert!(r["key"].as_str().unwrap().starts_with("svc_scoped_"));
    let all = serde_json::to_string(&audit(&gw, &format!("workspace={DEMO_WS}")).await).unwrap();
    assert!(
        !all.contains(&key) && !all.contains(token),
        "a secret in the audit log"
    );
    // Filters and bad queries.
    assert_eq!(
        audit(&gw, &format!("workspace={DEMO_WS}&key_id=key_other"))
            .await
            .len(),
        0
    );
    assert_eq!(
        audit(&gw, &format!("workspace={DEMO_WS}&limit=1"))
            .await
            .len(),
        1
    );
    assert_eq!(
        audit(&gw, &format!("workspace={DEMO_WS}&since=9999999999"))
            .await
            .len(),
        0
    );
    for q in [
        "",
        "workspace=ws_demo&limit=0",
        "workspace=ws_demo&limit=x",
        "workspace=ws_demo&nope=1",
        "workspace=ws_demo&since=-1",
        // Seconds that overflow as milliseconds (a panic in a debug build, wrap-around in a
        // release one).
        "workspace=ws_demo&since=18446744073709552",
    ] {
        let resp = gw
            .admin_request(Method::GET, &format!("/admin/v1/audit?{q}"))
            .send()
            .await
            .unwrap();
        assert_error(resp, 400, "invalid_request_error").await;
    }
    let resp = gw
        .admin_request(
            Method::GET,
            "/admin/v1/usage?workspace=ws_demo&month=2026-13",
        )
        .send()
        .await
        .unwrap();
    assert_error(resp, 400, "invalid_request_error").await;
}

#[tokio::test]
async fn the_simulator_audits_at_most_256_characters_of_a_model() {
    let gw = Gateway::builder().start().await;
    let (id, key) = gw.create_key("test", &["chat.completions:create"]).await;
    let long = "m".repeat(5_000);
    let resp = gw
        .request(Method::POST, "/v1/chat/completions")
        .bearer_auth(&key)
        .json(&json!({"model": long}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let query = format!("workspace={DEMO_WS}&key_id={id}");
    eventually(Duration::from_secs(5), || async {
        audit(&gw, &query).await.len() == 1
    })
    .await
    .expect("audited");
    let record = &audit(&gw, &query).await[0];
    assert_eq!(record["model"].as_str().unwrap(), &long[..256]);
}

#[tokio::test]
async fn the_audit_log_is_read_page_by_page() {
    let ns = TestNamespace::new();
    let gw = Gateway::builder()
        .redis(&redis_url(), &ns.name)
        .start()
        .await;
    let ws = gw.create_workspace().await;
    let (_, key) = gw
        .create_key_in(&ws, "live", &["chat.completions:create"])
        .await;
    for _ in 0..5 {
        assert_eq!(gw.chat(&key).await.status(), 200);
    }
    until_audited(&gw, &ws, 5, "audited").await;
    let everything = audit(&gw, &format!("workspace={ws}")).await;

    let mut pages = Vec::new();
    let mut query = format!("workspace={ws}&limit=2");
    loop {
        let page = gw.admin_get(&format!("/admin/v1/audit?{query}")).await;
        pages.push(page["data"].as_array().unwrap().len());
        if page["has_more"] == false {
            assert!(page.get("next_cursor").is_none(), "{page}");
            break;
        }
        let cursor = page["next_cursor"].as_str().unwrap().to_string();
        query = format!("workspace={ws}&limit=2&cursor={cursor}");
        let last = page["data"].as_array().unwrap().last().unwrap().clone();
        assert!(cursor.ends_with(last["request_id"].as_str().unwrap()));
    }
    assert_eq!(pages, [2, 2, 1]);
    // Page by page is the whole listing, in its order.
    let mut paged = Vec::new();
    let mut cursor = String::new();
    while paged.len() < 5 {
        let page = gw
            .admin_get(&format!("/admin/v1/audit?workspace={ws}&limit=2{cursor}"))
            .await;
        paged.extend(page["data"].as_array().unwrap().iter().cloned());
        cursor = format!(
            "&cursor={}",
            page["next_cursor"].as_str().unwrap_or_default()
        );
    }
    assert_eq!(paged, everything);

    for bad in [
        "",
        "1",
        "x_req_1",
        "1_key_1",
        "1_req_",
        "1_req_a-b",
        "99999999999999999999_req_1",
    ] {
        let resp = gw
            .admin_request(
                Method::GET,
                &format!("/admin/v1/audit?workspace={ws}&cursor={bad}"),
            )
            .send()
            .await
            .unwrap();
        assert_error(resp, 400, "invalid_request_error").await;
    }
}

#[tokio::test]
async fn a_body_larger_than_the_sniffing_window_reaches_the_backend_intact() {
    let live = RecordingUpstream::start("live").await;
    let gw = Gateway::builder().live(live.addr).start().await;
    let (_, key) = gw.create_key("live", &["chat.completions:create"]).await;
    let big = "x".repeat(300_000);
    let body =
        format!(r#"{{"model":"long-context","messages":[{{"role":"user","content":"{big}"}}]}}"#);
    let resp = gw
        .request(Method::POST, "/v1/chat/completions")
        .bearer_auth(&key)
        .header("content-type", "application/json")
        .body(body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(live.requests()[0].body.len(), body.len());
    assert_eq!(&live.requests()[0].body[..], body.as_bytes());
    eventually(Duration::from_secs(5), || async {
        audit(&gw, &format!("workspace={DEMO_WS}"))
            .await
            .first()
            .is_some_and(|r| r["model"] == "long-context")
    })
    .await
    .expect("the model is found in the body's first bytes");
}
