//! The request path's per-request work, piece by piece and as a whole, and the webhook
//! worker's per-delivery work: `cargo bench --bench verify`.
//!
//! `warm_verify` is what every request with a cached key pays before it is forwarded: bearer
//! parsing, format and checksum, SHA-256, the cache lookup and the scope check.
//! `budget_check_and_charge` is the budget arithmetic of one billable request (key, project and
//! workspace budgets checked against flushed plus unflushed spend, then the cost charged);
//! `credits_parse` reads a backend's `Service-Credits`. `event_filter_match` is an endpoint
//! with exact and wildcard filters deciding on one event; `webhook_sign` signs a 1 KiB body.
//! `model_sniff_*` finds the `model` of a forwarded chat body (4 and 16 KiB), after its
//! messages or before them. `audit_json_100` serializes a batch of 100 typical audit records
//! as the store writer does; `audit_json_100_serde` is the same through serde, for reference.

use criterion::{criterion_group, criterion_main, Criterion};
use http::{HeaderValue, Method};
use std::hint::black_box;
use std::sync::Arc;

use svcgate::config::default_routes;
use svcgate::keys::cache::{CacheConfig, KeyCache};
use svcgate::keys::{self, format, Environment, KeyHash, KeyParams, Scopes};
use svcgate::metering::audit::AuditRecord;
use svcgate::metering::usage::{KeyBudget, Usage, UsageSnapshot, Verdict, WorkspaceTotals};
use svcgate::metering::Credits;
use svcgate::proxy::auth::Authenticator;
use svcgate::proxy::routes::RouteTable;
use svcgate::store::{KeyStore, MemoryStore};
use svcgate::webhooks::endpoint::matches_filter;
use svcgate::webhooks::signature;

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let store = Arc::new(MemoryStore::new());
    let (key, record) = keys::issue(
        KeyParams {
            workspace: "ws_bench".into(),
            environment: Environment::Live,
            scopes: Scopes::new(["chat.completions:create", "models:read", "images:create"]),
            name: String::new(),
            monthly_budget: Some(Credits::from_micros(i64::MAX / 2)),
            expires_at: None,
            rate_limit: None,
            metadata: None,
        },
        0,
    );
    rt.block_on(store.insert_key(&record)).unwrap();
    let cache = Arc::new(KeyCache::new(store, CacheConfig::default()));
    rt.block_on(cache.sync()).unwrap();
    let auth = Authenticator::new(cache);
    let header = HeaderValue::from_str(&format!("Bearer {}", key.value)).unwrap();
    let now = svcgate::ids::unix_now();
    // Warm the cache.
    rt.block_on(auth.authenticate(Some(&header), now, || None))
        .unwrap();
    let routes = RouteTable::new(&default_routes()).unwrap();

    c.bench_function("key_parse_and_checksum", |b| {
        b.iter(|| format::parse(black_box(&key.value)))
    });
    c.bench_function("key_sha256", |b| {
        b.iter(|| KeyHash::of(black_box(&key.value)))
    });
    c.bench_function("route_find", |b| {
        b.iter(|| routes.find(black_box(&Method::POST), black_box("/v1/chat/completions")))
    });
    c.bench_function("scope_check", |b| {
        b.iter(|| record.scopes.allows(black_box("images:create")))
    });
    c.bench_function("warm_verify", |b| {
        b.to_async(&rt).iter(|| async {
            let caller = auth
                .authenticate(Some(black_box(&header)), now, || None)
                .await
                .unwrap();
            let route = routes.find(&Method::POST, "/v1/chat/completions").unwrap();
            black_box(caller.allows(&route.scope))
        })
    });
    let bad =
        HeaderValue::from_str("Bearer svc_live_notakeyatallnotakeyatallnotakeyatall12").unwrap();
    c.bench_function("reject_malformed", |b| {
        b.to_async(&rt).iter(|| async {
            auth.authenticate(Some(black_box(&bad)), now, || None)
                .await
                .is_err()
        })
    });

    let key = rt
        .block_on(auth.authenticate(Some(&header), now, || None))
        .unwrap()
        .key;
    let mut budgets = std::collections::HashMap::new();
    budgets.insert(("ws_bench".to_string(), "proj_a".to_string()), i64::MAX / 2);
    let usage = Usage::new(budgets);
    let cost = Credits::from_micros(12_500);
    // The steady state: one flush has read the totals the check watches.
    let now_ms = svcgate::ids::unix_millis();
    let _ = usage.check(&key, KeyBudget::of(&key), Some("proj_a"), now_ms);
    let (_, batch) = usage.begin_flush(&svcgate::metering::month::month_of(now_ms / 1000));
    let mut snapshot = UsageSnapshot::default();
    for w in batch {
        let totals = WorkspaceTotals {
            keys: w.watch_keys.into_iter().map(|k| (k, 0)).collect(),
            projects: w.watch_projects.into_iter().map(|p| (p, 0)).collect(),
            ..Default::default()
        };
        snapshot.workspaces.insert(w.workspace, totals);
    }
    usage.finish_flush(&snapshot);
    assert_eq!(
        usage.check(&key, KeyBudget::of(&key), Some("proj_a"), now_ms),
        Verdict::Within
    );
    c.bench_function("budget_check_and_charge", |b| {
        b.iter(|| {
            let ok = usage.check(black_box(&key), KeyBudget::of(&key), Some("proj_a"), now_ms)
                == Verdict::Within;
            usage.charge(&key, Some("proj_a"), cost, now_ms);
            ok
        })
    });
    c.bench_function("credits_parse", |b| {
        b.iter(|| Credits::parse_decimal(black_box("0.0125")))
    });

    let filters = [
        "image.batch.completed",
        "video.render.completed",
        "agent.run.*",
        "key.auto_revoked",
        "billing.*",
    ];
    c.bench_function("event_filter_match", |b| {
        b.iter(|| {
            let event = black_box("billing.credits.low");
            filters.iter().any(|f| matches_filter(f, event))
        })
    });
    // The model of a chat body: after the messages (the Python SDK's order), and before them.
    for (size, model_first) in [
        (4 * 1024, false),
        (16 * 1024 - 64, false),
        (16 * 1024 - 64, true),
    ] {
        let body = chat_body(size, model_first);
        let order = if model_first {
            "model_first"
        } else {
            "model_last"
        };
        let name = format!("model_sniff_{}k_{order}", size.div_ceil(1024));
        c.bench_function(&name, |b| {
            b.iter(|| svcgate::proxy::body::sniff_model(black_box(&body), true))
        });
    }
    let records: Vec<AuditRecord> = (0..100)
        .map(|i| AuditRecord {
            time_ms: 1_764_115_200_000 + i,
            request_id: svcgate::ids::request_id(),
            workspace: "ws_8cQ2bX0kP4mZ7rT1".into(),
            key_id: "key_3vN9sL2qW8eR5tY0".into(),
            key: "svc_live_…Ab9z".into(),
            environment: Environment::Live,
            project: Some("proj-search".into()),
            method: "POST".into(),
            path: "/v1/chat/completions".into(),
            model: Some("gpt-large-2".into()),
            status: 200,
            credits: 1.25,
            client_ip: Some(std::net::IpAddr::from([10, 1, 2, 3])),
            latency_ms: 182,
            token_id: None,
            metadata: None,
            key_metadata: None,
            actor: None,
            suppressed: None,
            tunnel: None,
        })
        .collect();
    let batch: Vec<&AuditRecord> = records.iter().collect();
    c.bench_function("audit_json_100", |b| {
        b.iter(|| {
            let mut out = Vec::with_capacity(40_000);
            AuditRecord::write_json_array(black_box(&batch), &mut out);
            out
        })
    });
    c.bench_function("audit_json_100_serde", |b| {
        b.iter(|| {
            let mut out = Vec::with_capacity(40_000);
            serde_json::to_writer(&mut out, black_box(&batch)).unwrap();
            out
        })
    });
    let secret = svcgate::webhooks::endpoint::new_secret();
    let body = vec![b'x'; 1024];
    c.bench_function("webhook_sign", |b| {
        b.iter(|| signature::sign(black_box(&secret), 1_764_115_200, black_box(&body)))
    });
}

/// A JSON chat-completion body of about `size` bytes: a system prompt and turns of prose with
/// escapes and non-ASCII text, the model before or after them, and sampling parameters.
fn chat_body(size: usize, model_first: bool) -> Vec<u8> {
    let turn = "Summarise the \"quarterly\" report in three bullet points.\nKeep the figures \
                exact; the café's revenue grew 12% (€1.2M). ";
    let mut messages =
        vec![serde_json::json!({"role": "system", "content": "You are a careful analyst."})];
    while serde_json::to_vec(&messages).unwrap().len() < size - 80 {
        let role = if messages.len() % 2 == 1 {
            "user"
        } else {
            "assistant"
        };
        messages.push(serde_json::json!({"role": role, "content": turn.repeat(3)}));
    }
    let messages = serde_json::to_string(&messages).unwrap();
    let model = r#""model":"gpt-large-2""#;
    let body = match model_first {
        true => format!(r#"{{{model},"messages":{messages},"temperature":0.2}}"#),
        false => format!(r#"{{"messages":{messages},{model},"temperature":0.2}}"#),
    };
    body.into_bytes()
}

criterion_group!(benches, bench);
criterion_main!(benches);
