//! Requests through the gateway: keys, scopes, routes, backends, test mode, probes, metrics.

use super::*;

#[tokio::test]
async fn zero_config_demo_answers_with_simulated_backends() {
    let gw = Gateway::builder().start().await;
    let (_, key) = gw
        .create_key("live", &["chat.completions:create", "models:read"])
        .await;

    let resp = gw.chat(&key).await;
    assert_eq!(resp.status(), 200);
    assert!(resp.headers()["service-request-id"]
        .to_str()
        .unwrap()
        .starts_with("req_"));
    assert_eq!(resp.headers()["service-credits"], "1");
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["model"], "m1");
    assert!(body["usage"]["total_tokens"].as_u64().unwrap() > 0);

    let models: Value = gw
        .request(Method::GET, "/v1/models")
        .bearer_auth(&key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(models["object"], "list");

    let resp = gw
        .request(Method::POST, "/v1/chat/completions")
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_error(resp, 401, "authentication_error").await;
}

#[tokio::test]
async fn answers_the_gateway_makes_itself_carry_the_rate_limit_headers() {
    let gw = Gateway::builder().start().await;
    let (_, key) = gw
        .create_key(
            "live",
            &[
                "tokens:create",
                "webhooks:read",
                "webhooks:write",
                "models:read",
            ],
        )
        .await;
    let token = gw
        .request(Method::POST, "/v1/tokens")
        .bearer_auth(&key)
        .json(&json!({"scopes": ["models:read"], "expires_in": 60}))
        .send()
        .await
        .unwrap();
    let endpoints = gw
        .request(Method::GET, "/v1/webhooks")
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    let models = gw
        .request(Method::GET, "/v1/models")
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    let stream = gw
        .request(Method::GET, "/v1/webhooks/listen")
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    for (what, resp) in [
        ("minted token", &token),
        ("endpoint list", &endpoints),
        ("simulated answer", &models),
        ("listen stream", &stream),
    ] {
        assert!(resp.status().is_success(), "{what}: {}", resp.status());
        for name in ["ratelimit-limit", "ratelimit-remaining", "ratelimit-reset"] {
            assert!(resp.headers().contains_key(name), "{what} lacks {name}");
        }
    }
}

#[tokio::test]
async fn head_is_answered_like_get_without_a_body() {
    let live = RecordingUpstream::start("live").await;
    let gw = Gateway::builder().live(live.addr).start().await;
    let (_, key) = gw
        .create_key("live", &["models:read", "webhooks:read"])
        .await;
    let head = |path: &'static str, key: Option<String>| {
        let req = gw.request(Method::HEAD, path);
        async move {
            match key {
                Some(key) => req.bearer_auth(key),
                None => req,
            }
            .send()
            .await
            .unwrap()
        }
    };
    // Forwarded to the backend as HEAD, under the GET route's scope.
    let resp = head("/v1/models", Some(key.clone())).await;
    assert_eq!(resp.status(), 200);
    assert!(resp.headers().contains_key("service-request-id"));
    assert!(resp.bytes().await.unwrap().is_empty());
    let seen = live.requests();
    assert_eq!(
        (seen.len(), &seen[0].method, seen[0].path.as_str()),
        (1, &Method::HEAD, "/v1/models")
    );
    // The gateway's own GET routes too; refusals are the same. No body goes out after the
    // headers: the next request on the same connection reads its own answer.
    let resp = head("/v1/webhooks", Some(key.clone())).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "application/json");
    let resp = head("/v1/models", None).await;
    assert_eq!(resp.status(), 401);
    let addr = gw.base.trim_start_matches("http://").to_string();
    let mut raw = std::net::TcpStream::connect(&addr).unwrap();
    raw.set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .unwrap();
    for method in ["HEAD", "HEAD", "GET"] {
        write!(
            raw,
            "{method} /v1/webhooks HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n\r\n"
        )
        .unwrap();
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            assert_eq!(raw.read(&mut byte).unwrap(), 1, "closed early");
            head.push(byte[0]);
        }
        let head = String::from_utf8_lossy(&head).to_lowercase();
        assert!(head.starts_with("http/1.1 200"), "{method}: {head}");
        if method == "GET" {
            let length: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length: "))
                .unwrap()
                .trim()
                .parse()
                .unwrap();
            let mut body = vec![0u8; length];
            raw.read_exact(&mut body).unwrap();
            assert!(body.starts_with(b"{\"data\":"));
        }
    }
    // Not the event stream, and not a POST route.
    assert_eq!(
        head("/v1/webhooks/listen", Some(key.clone()))
            .await
            .status(),
        404
    );
    assert_eq!(head("/v1/chat/completions", Some(key)).await.status(), 404);
    assert_eq!(live.requests().len(), 1);
}

#[tokio::test]
async fn backend_sees_identity_headers_and_never_the_credential() {
    let live = RecordingUpstream::start("live").await;
    let gw = Gateway::builder().live(live.addr).start().await;
    let (key_id, key) = gw.create_key("live", &["chat.completions:create"]).await;

    let body = r#"{"model":"m1","messages":[{"role":"user","content":"héllo"}]}"#;
    let resp = gw
        .request(Method::POST, "/v1/chat/completions")
        .bearer_auth(&key)
        .header("content-type", "application/json")
        .header("service-project", "team-a.prod_1")
        // Spoofed identity must be replaced, not passed on.
        .header("service-workspace", "ws_evil")
        .header("service-key-id", "key_evil")
        .header("service-environment", "test")
        // Underscore lookalikes, which CGI, WSGI and Rack read as the real ones, are dropped.
        .header("Service_Workspace", "ws_evil")
        .header("service_project", "evil project")
        .header("X_Trace_Id", "kept")
        // Client addresses of the client's own: the gateway's `X-Forwarded-For` is the one.
        .header("X_Forwarded_For", "6.6.6.6")
        .header("Forwarded", "for=6.6.6.6")
        .header("X-Real-IP", "6.6.6.6")
        // The client's own headers pass, repeated ones in order.
        .header("X-Trace", "a")
        .header("X-Trace", "b")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let request_id = resp.headers()["service-request-id"]
        .to_str()
        .unwrap()
        .to_string();
    assert_eq!(resp.headers()["service-credits"], "0.5");
    // The gateway's own headers on the proxied answer, once each.
    for name in [
        "service-request-id",
        "ratelimit-limit",
        "ratelimit-remaining",
        "ratelimit-reset",
    ] {
        assert_eq!(resp.headers().get_all(name).iter().count(), 1, "{name}");
    }
    let remaining: u64 = resp.headers()["ratelimit-remaining"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let limit: u64 = resp.headers()["ratelimit-limit"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(remaining < limit);
    let answer: Value = resp.json().await.unwrap();
    assert_eq!(answer["upstream"], "live");

    let seen = live.requests();
    assert_eq!(seen.len(), 1);
    let r = &seen[0];
    assert_eq!(r.path, "/v1/chat/completions");
    assert!(r.headers.get("authorization").is_none());
    assert_eq!(r.headers["service-workspace"], DEMO_WS);
    assert_eq!(r.headers["service-key-id"], key_id.as_str());
    assert_eq!(r.headers["service-environment"], "live");
    assert_eq!(r.headers["service-request-id"], request_id.as_str());
    assert_eq!(r.headers["service-project"], "team-a.prod_1");
    assert_eq!(r.headers.get_all("service-workspace").iter().count(), 1);
    assert!(r.headers.get("service_workspace").is_none());
    assert!(r.headers.get("service_project").is_none());
    assert_eq!(r.headers["x_trace_id"], "kept");
    for spoofed in ["x_forwarded_for", "forwarded", "x-real-ip"] {
        assert!(
            r.headers.get(spoofed).is_none(),
            "{spoofed} reached the backend"
        );
    }
    assert_eq!(r.headers["x-forwarded-for"], "127.0.0.1");
    let trace: Vec<_> = r.headers.get_all("x-trace").iter().collect();
    assert_eq!(trace, ["a", "b"]);
    assert_eq!(&r.body[..], body.as_bytes(), "body forwarded byte for byte");
    let raw = format!("{:?}", r.headers);
    assert!(!raw.contains(&key), "the key reached the backend");
}

#[tokio::test]
async fn requests_without_project_carry_no_project_header() {
    let live = RecordingUpstream::start("live").await;
    let gw = Gateway::builder().live(live.addr).start().await;
    let (_, key) = gw.create_key("live", &["chat.completions:create"]).await;
    assert_eq!(gw.chat(&key).await.status(), 200);
    assert!(live.requests()[0].headers.get("service-project").is_none());
}

#[tokio::test]
async fn invalid_project_is_refused_before_the_backend() {
    let live = RecordingUpstream::start("live").await;
    let gw = Gateway::builder().live(live.addr).start().await;
    let (_, key) = gw.create_key("live", &["chat.completions:create"]).await;
    for bad in ["", "has space", "a/b", &"x".repeat(65)] {
        let resp = gw
            .request(Method::POST, "/v1/chat/completions")
            .bearer_auth(&key)
            .header("service-project", bad)
            .json(&json!({"model": "m"}))
            .send()
            .await
            .unwrap();
        assert_error(resp, 400, "invalid_request_error").await;
    }
    // Two headers, the second one unchecked, would reach the backend as they are.
    let resp = gw
        .request(Method::POST, "/v1/chat/completions")
        .bearer_auth(&key)
        .header("service-project", "p1")
        .header("service-project", "not valid!")
        .json(&json!({"model": "m"}))
        .send()
        .await
        .unwrap();
    assert_error(resp, 400, "invalid_request_error").await;
    assert!(live.requests().is_empty());
}

#[tokio::test]
async fn test_keys_go_to_the_sandbox_and_never_to_live() {
    let live = RecordingUpstream::start("live").await;
    let sandbox = RecordingUpstream::start("sandbox").await;
    let gw = Gateway::builder()
        .live(live.addr)
        .sandbox(sandbox.addr)
        .start()
        .await;
    let (_, test_key) = gw.create_key("test", &["chat.completions:create"]).await;
    let (_, live_key) = gw.create_key("live", &["chat.completions:create"]).await;

    let answer: Value = gw.chat(&test_key).await.json().await.unwrap();
    assert_eq!(answer["upstream"], "sandbox");
    let answer: Value = gw.chat(&live_key).await.json().await.unwrap();
    assert_eq!(answer["upstream"], "live");

    assert_eq!(sandbox.requests().len(), 1);
    assert_eq!(sandbox.requests()[0].headers["service-environment"], "test");
    assert_eq!(live.requests().len(), 1);
    assert_eq!(live.requests()[0].headers["service-environment"], "live");
}

#[tokio::test]
async fn test_keys_get_simulated_answers_when_no_sandbox_exists() {
    let live = RecordingUpstream::start("live").await;
    let gw = Gateway::builder().live(live.addr).start().await;
    let (_, test_key) = gw.create_key("test", &["chat.completions:create"]).await;
    let resp = gw.chat(&test_key).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["service-credits"], "0");
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["simulated"], true);
    assert_eq!(body["environment"], "test");
    assert!(
        live.requests().is_empty(),
        "a test key reached the live backend"
    );
}

#[tokio::test]
async fn bad_authorization_values_get_401_and_the_gateway_keeps_serving() {
    let live = RecordingUpstream::start("live").await;
    let gw = Gateway::builder().live(live.addr).start().await;
    let (revoked_id, revoked) = gw.create_key("live", &["chat.completions:create"]).await;
    let resp = gw
        .admin_post(&format!("/admin/v1/keys/{revoked_id}/revoke"))
        .await;
    assert_eq!(resp.status(), 200);
    let (_, valid) = gw.create_key("live", &["chat.completions:create"]).await;

    let mut flipped = valid.clone().into_bytes();
    let i = flipped.len() - 10;
    flipped[i] = if flipped[i] == b'A' { b'B' } else { b'A' };
    let flipped = String::from_utf8(flipped).unwrap();
    // A key of ours that was never stored: right shape, right checksum.
    let unknown_but_well_formed = svcgate::keys::format::generate(Environment::Live).value;

    let mut values: Vec<Vec<u8>> = vec![
        b"".to_vec(),
        b"Basic dXNlcjpwYXNz".to_vec(),
        format!("Bearer\t{valid}").into_bytes(),
        format!("Bearer{valid}").into_bytes(),
        b"Bearer".to_vec(),
        b"Bearer ".to_vec(),
        [b"Bearer svc_live_".as_slice(), "ключ".as_bytes()].concat(),
        format!("Bearer {}", "a".repeat(8 * 1024)).into_bytes(),
        format!("Bearer svc_live_{}", "A".repeat(8 * 1024)).into_bytes(),
        format!("Bearer {flipped}").into_bytes(),
        format!("Bearer {revoked}").into_bytes(),
        format!("Bearer {unknown_but_well_formed}").into_bytes(),
        format!("Bearer {}", valid.replace("svc_live_", "svc_test_")).into_bytes(),
    ];
    values.push(format!("Bearer {}", &valid[..valid.len() - 1]).into_bytes());
    for value in values {
        let header = reqwest::header::HeaderValue::from_bytes(&value).unwrap();
        let resp = gw
            .request(Method::POST, "/v1/chat/completions")
            .header("authorization", header)
            .json(&json!({"model": "m"}))
            .send()
            .await
            .unwrap();
        let shown = String::from_utf8_lossy(&value[..value.len().min(40)]).to_string();
        assert_eq!(resp.status(), 401, "for {shown:?}");
        let body = assert_error(resp, 401, "authentication_error").await;
        let message = body["error"]["message"].as_str().unwrap();
        assert!(
            !message.contains("svc_"),
            "message echoes the key: {message}"
        );
    }
    assert!(live.requests().is_empty());
    assert_eq!(gw.chat(&valid).await.status(), 200);
    assert_eq!(live.requests().len(), 1);
    // The scheme in any case, and more than one space (RFC 9110 §11.1, RFC 6750 §2.1).
    for value in [
        format!("bearer {valid}"),
        format!("BEARER {valid}"),
        format!("Bearer  {valid}"),
    ] {
        let resp = gw
            .request(Method::POST, "/v1/chat/completions")
            .header("authorization", &value)
            .json(&json!({"model": "m"}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200, "{}", &value[..9]);
    }
}

#[tokio::test]
async fn missing_scope_is_403_and_never_forwarded() {
    let live = RecordingUpstream::start("live").await;
    let gw = Gateway::builder().live(live.addr).start().await;
    let (_, key) = gw.create_key("live", &["images:create"]).await;
    let body = assert_error(gw.chat(&key).await, 403, "permission_error").await;
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("chat.completions:create"));
    assert!(live.requests().is_empty());
}

#[tokio::test]
async fn unknown_paths_are_404_from_the_gateway() {
    let live = RecordingUpstream::start("live").await;
    let gw = Gateway::builder().live(live.addr).start().await;
    let (_, key) = gw.create_key("live", &["chat.completions:create"]).await;
    for (method, path) in [
        (Method::POST, "/v1/nope"),
        (Method::GET, "/v1/chat/completions"),
        (Method::POST, "/v1/agents/runs//approve"),
        (Method::GET, "/"),
        (Method::GET, "/v2/models"),
    ] {
        let resp = gw
            .request(method, path)
            .bearer_auth(&key)
            .send()
            .await
            .unwrap();
        assert_error(resp, 404, "not_found").await;
    }
    assert!(live.requests().is_empty());
}

#[tokio::test]
async fn routes_with_parameters_are_forwarded() {
    let live = RecordingUpstream::start("live").await;
    let gw = Gateway::builder().live(live.addr).start().await;
    let (_, key) = gw.create_key("live", &["agents:run"]).await;
    let resp = gw
        .request(Method::POST, "/v1/agents/runs/run_42/approve?step=3")
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(live.requests()[0].path, "/v1/agents/runs/run_42/approve");
}

#[tokio::test]
async fn a_backend_that_fails_is_502_upstream_error() {
    let broken = broken_upstream().await;
    let gw = Gateway::builder().live(broken).start().await;
    let (_, key) = gw.create_key("live", &["chat.completions:create"]).await;
    assert_error(gw.chat(&key).await, 502, "upstream_error").await;
    // And the gateway is still there.
    assert_eq!(
        gw.request(Method::GET, "/healthz")
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
}

#[tokio::test]
async fn an_unreachable_backend_is_503_upstream_unavailable() {
    let closed = std::net::SocketAddr::from(([127, 0, 0, 1], free_port()));
    let gw = Gateway::builder().live(closed).start().await;
    let (_, key) = gw.create_key("live", &["chat.completions:create"]).await;
    let resp = gw.chat(&key).await;
    assert!(resp.headers().contains_key("retry-after"));
    assert_error(resp, 503, "upstream_unavailable").await;
}

#[tokio::test]
async fn revoked_keys_stop_working_at_once() {
    let gw = Gateway::builder().start().await;
    let (id, key) = gw.create_key("live", &["chat.completions:create"]).await;
    assert_eq!(gw.chat(&key).await.status(), 200);
    gw.revoke(&id).await;
    let body = assert_error(gw.chat(&key).await, 401, "authentication_error").await;
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("revoked"));
}

#[tokio::test]
async fn health_probes_answer_on_the_gateway_port() {
    let gw = Gateway::builder().start().await;
    for path in ["/healthz", "/readyz"] {
        let resp = gw.request(Method::GET, path).send().await.unwrap();
        assert_eq!(resp.status(), 200, "{path}");
        assert!(resp.headers().contains_key("service-request-id"));
    }
}

#[tokio::test]
async fn metrics_count_requests_and_auth_failures() {
    let gw = Gateway::builder().start().await;
    let (_, key) = gw.create_key("live", &["chat.completions:create"]).await;
    assert_eq!(gw.chat(&key).await.status(), 200);
    assert_eq!(gw.chat("svc_live_nope").await.status(), 401);
    // A request is counted in its logging phase, just after its answer went out.
    let scrape = || gw.metrics_text();
    let counted = |text: &str| {
        text.contains(
            r#"svcgate_requests_total{environment="live",route="/v1/chat/completions",status="200"} 1"#,
        ) && text.contains(r#"svcgate_auth_failures_total{reason="bad_length"} 1"#)
            // The refused request is counted under its route too.
            && text.contains(
                r#"svcgate_requests_total{environment="none",route="/v1/chat/completions",status="401"} 1"#,
            )
    };
    eventually(std::time::Duration::from_secs(5), || async {
        counted(&scrape().await)
    })
    .await
    .expect("both requests are counted");
    let text = scrape().await;
    assert!(!text.contains(&key));
}
