//! An endpoint's delivery rate limit, held across workers.

use super::*;

#[tokio::test]
async fn an_endpoints_rate_limit_holds_across_workers() {
    let s = setup(&[1], 5, false).await;
    let _second = s.gw.start_worker();
    let receiver = Receiver::start().await;
    let resp = call(
        &s.gw,
        &s.key,
        Method::POST,
        "/v1/webhooks",
        Some(
            json!({"url": receiver.url("/limited"), "events": ["agent.run.*"],
                    "rate_limit_per_second": 2}),
        ),
    )
    .await;
    assert_eq!(resp.status(), 201);
    let created: Value = resp.json().await.unwrap();
    assert_eq!(created["rate_limit_per_second"], 2);
    for _ in 0..8 {
        publish(&s.gw, &s.ws, "agent.run.completed", "live").await;
    }
    let got = received(&receiver, "/limited", 8, Duration::from_secs(20)).await;
    let mut at: Vec<Instant> = got.iter().map(|r| r.at).collect();
    at.sort();
    // Two a second at most: any five deliveries span three seconds of the clock.
    for w in at.windows(5) {
        assert!(
            w[4] - w[0] >= Duration::from_millis(900),
            "five deliveries within {:?}",
            w[4] - w[0]
        );
    }
    // Every one was delivered once; none failed for the limit.
    let mut ids = event_ids(&receiver, "/limited");
    ids.dedup();
    assert_eq!(ids.len(), 8);
    let id = created["id"].as_str().unwrap();
    for d in deliveries(&s.gw, &s.key, id).await {
        assert_eq!(d["status"], "succeeded");
        assert_eq!(d["attempts"], 1);
    }

    // The limit is changed, or removed, by PATCH; 0 is no limit at all, so it is refused.
    let path = format!("/v1/webhooks/{id}");
    let resp = call(
        &s.gw,
        &s.key,
        Method::PATCH,
        &path,
        Some(json!({"rate_limit_per_second": 0})),
    )
    .await;
    assert_error(resp, 400, "invalid_request_error").await;
    let resp = call(
        &s.gw,
        &s.key,
        Method::PATCH,
        &path,
        Some(json!({"rate_limit_per_second": null})),
    )
    .await;
    let body: Value = resp.json().await.unwrap();
    assert!(body.get("rate_limit_per_second").is_none(), "{body}");
}
