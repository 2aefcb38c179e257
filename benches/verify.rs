//! The request path's per-request work, piece by piece and as a whole:
//! `cargo bench --bench verify`.
//!
//! `warm_verify` is what every request with a cached key pays before it is forwarded: bearer
//! parsing, format and checksum, SHA-256, the cache lookup and the scope check.

use criterion::{criterion_group, criterion_main, Criterion};
use http::{HeaderValue, Method};
use std::hint::black_box;
use std::sync::Arc;

use svcgate::config::default_routes;
use svcgate::keys::{self, format, Environment, KeyHash, KeyParams, Scopes};
use svcgate::proxy::auth::Authenticator;
use svcgate::proxy::routes::RouteTable;
use svcgate::store::{CacheConfig, KeyCache, MemoryStore, Store};

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
            monthly_budget: None,
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
    rt.block_on(auth.authenticate(Some(&header), now)).unwrap();
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
                .authenticate(Some(black_box(&header)), now)
                .await
                .unwrap();
            let route = routes.find(&Method::POST, "/v1/chat/completions").unwrap();
            black_box(caller.allows(&route.scope))
        })
    });
    let bad =
        HeaderValue::from_str("Bearer svc_live_notakeyatallnotakeyatallnotakeyatall12").unwrap();
    c.bench_function("reject_malformed", |b| {
        b.to_async(&rt)
            .iter(|| async { auth.authenticate(Some(black_box(&bad)), now).await.is_err() })
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
