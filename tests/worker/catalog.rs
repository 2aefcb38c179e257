//! The event catalog: `GET /v1/webhooks/event-types` lists every event with a JSON Schema of
//! its `data`, and every event that arrives at a receiver fits its schema: the samples
//! `svcgate events trigger` sends and the events svcgate emits itself.

use super::*;

/// The catalog's schemas, compiled, by event type.
async fn catalog(s: &Setup) -> std::collections::HashMap<String, jsonschema::Validator> {
    let resp = call(&s.gw, &s.key, Method::GET, "/v1/webhooks/event-types", None).await;
    assert_eq!(resp.status(), 200);
    let body: Value = resp.json().await.unwrap();
    let data = body["data"].as_array().unwrap();
    let types: Vec<&str> = data.iter().map(|t| t["type"].as_str().unwrap()).collect();
    assert_eq!(types, svcgate::events::EVENT_TYPES);
    data.iter()
        .map(|t| {
            assert!(t["description"].as_str().is_some_and(|d| !d.is_empty()));
            assert!(t["schema"].is_object(), "{t}");
            let validator = jsonschema::validator_for(&t["schema"])
                .unwrap_or_else(|e| panic!("{}: not a JSON Schema: {e}", t["type"]));
            (t["type"].as_str().unwrap().to_string(), validator)
        })
        .collect()
}

#[tokio::test]
async fn event_types_lists_the_eight_events_and_every_delivered_event_fits_its_schema() {
    let s = setup(&[60], 10, false).await;
    let schemas = catalog(&s).await;
    assert_eq!(schemas.len(), 8);
    // A workspace whose first credit spent crosses its alert threshold.
    let resp = admin(
        &s.gw,
        Method::POST,
        "/admin/v1/workspaces",
        Some(json!({"name": "Low", "admin_emails": ["ops@example.com"],
                    "monthly_credits": 10, "credits_low_threshold": 9.5})),
    )
    .await;
    assert_eq!(resp.status(), 201);
    let ws = resp.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let scopes = ["webhooks:write", "chat.completions:create"];
    let (_, key) = s.gw.create_key_in(&ws, "live", &scopes).await;
    let (_, leaked) = s.gw.create_key_in(&ws, "live", &scopes).await;
    let receiver = Receiver::start().await;
    endpoint(
        &s.gw,
        &key,
        &receiver.url("/all"),
        &svcgate::events::EVENT_TYPES,
    )
    .await;

    // The samples `events trigger` sends, one of each type.
    for event_type in svcgate::events::EVENT_TYPES {
        let out = svcgate_command()
            .args([
                "events",
                "--admin-url",
                &s.gw.admin,
                "--admin-token",
                ADMIN_TOKEN,
            ])
            .args(["trigger", event_type, "--workspace", &ws])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // What svcgate emits itself: a leaked key revoked, a low-credit alert.
    let resp = admin(
        &s.gw,
        Method::POST,
        "/admin/v1/leaks",
        Some(json!([{"token": leaked, "url": "https://example.com/paste/1", "source": "paste"}])),
    )
    .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(s.gw.chat(&key).await.status(), 200);

    let got = received(&receiver, "/all", 10, Duration::from_secs(15)).await;
    let mut seen = std::collections::HashMap::<String, usize>::new();
    for r in &got {
        let body: Value = serde_json::from_slice(&r.body).unwrap();
        let event_type = body["type"].as_str().unwrap();
        let errors: Vec<String> = schemas[event_type]
            .iter_errors(&body["data"])
            .map(|e| e.to_string())
            .collect();
        assert!(
            errors.is_empty(),
            "{event_type}: {errors:?} in {}",
            body["data"]
        );
        *seen.entry(event_type.to_string()).or_default() += 1;
    }
    assert_eq!(seen["key.auto_revoked"], 2, "{seen:?}");
    assert_eq!(seen["billing.credits.low"], 2, "{seen:?}");
    assert_eq!(seen.len(), 8, "{seen:?}");
}

#[tokio::test]
async fn the_openapi_document_describes_each_event_in_its_webhooks_section() {
    let s = setup(&[60], 10, true).await;
    let schemas: Value = call(&s.gw, &s.key, Method::GET, "/v1/webhooks/event-types", None)
        .await
        .json()
        .await
        .unwrap();
    let doc: Value =
        s.gw.request(Method::GET, "/v1/openapi.json")
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
    let section = doc["webhooks"].as_object().expect("a webhooks section");
    assert_eq!(section.len(), 8);
    for t in schemas["data"].as_array().unwrap() {
        let post = &section[t["type"].as_str().unwrap()]["post"];
        let body = &post["requestBody"]["content"]["application/json"]["schema"];
        assert_eq!(body["properties"]["data"], t["schema"], "{}", t["type"]);
        assert_eq!(body["properties"]["type"]["const"], t["type"]);
    }
}
