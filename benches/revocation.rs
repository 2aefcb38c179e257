//! How long a revocation takes to reach another replica: `cargo bench --bench revocation`
//! (needs Redis at `REDIS_URL`; 500 rounds; under `cargo test` a quick 20-round run).
//!
//! Two replicas in one process: each has its own Redis connections, change subscription and
//! key cache, as two gateway processes would. Each round revokes a warm key through replica A
//! and measures until replica B refuses it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use svcgate::keys::cache::{CacheConfig, KeyCache};
use svcgate::keys::{self, Environment, KeyParams, KeyRecord, KeyStatus, Scopes};
use svcgate::store::RedisStore;

fn replica(url: &str, ns: &str) -> Arc<KeyCache> {
    let store = Arc::new(RedisStore::connect(url, ns).expect("Redis URL"));
    let cache = Arc::new(KeyCache::new(store, CacheConfig::default()));
    tokio::spawn(cache.clone().follow());
    cache
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

fn main() {
    let rounds = if std::env::args().any(|a| a == "--bench") {
        500
    } else {
        20
    };
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let ns = svcgate::ids::new_id("bench");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut samples = rt.block_on(async {
        let a = replica(&url, &ns);
        let b = replica(&url, &ns);
        a.sync().await.expect("Redis answers at REDIS_URL");
        b.sync().await.unwrap();
        let mut samples = Vec::with_capacity(rounds);
        for _ in 0..rounds {
            let (_, record) = keys::issue(
                KeyParams {
                    workspace: "ws_bench".into(),
                    environment: Environment::Live,
                    scopes: Scopes::new(["models:read"]),
                    name: String::new(),
                    monthly_budget: None,
                    expires_at: None,
                    rate_limit: None,
                    metadata: None,
                },
                0,
            );
            a.store().insert_key(&record).await.unwrap();
            // Warm b's cache with the active key.
            loop {
                let (found, _) = b.get(&record.hash).await.unwrap();
                if found.is_some_and(|r| r.status == KeyStatus::Active) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            let started = Instant::now();
            a.store()
                .update_key(&record.id, &|k: &mut KeyRecord| {
                    k.status = KeyStatus::Revoked
                })
                .await
                .unwrap();
            loop {
                let (found, _) = b.get(&record.hash).await.unwrap();
                if found.is_some_and(|r| r.status == KeyStatus::Revoked) {
                    break;
                }
                assert!(
                    started.elapsed() < Duration::from_secs(5),
                    "revocation never arrived"
                );
                tokio::task::yield_now().await;
            }
            samples.push(started.elapsed());
        }
        samples
    });
    samples.sort();
    println!(
        "revocation: {rounds} rounds across two replicas: p50 {:?}, p99 {:?}, max {:?}",
        percentile(&samples, 0.5),
        percentile(&samples, 0.99),
        samples[samples.len() - 1]
    );
    // Leave nothing behind in a shared Redis.
    if let Ok(mut conn) = redis::Client::open(url).and_then(|c| c.get_connection()) {
        for pattern in [format!("{ns}:*"), format!("{{{ns}}}*")] {
            let keys: Vec<String> = redis::cmd("KEYS")
                .arg(&pattern)
                .query(&mut conn)
                .unwrap_or_default();
            if !keys.is_empty() {
                let _: redis::RedisResult<()> = redis::cmd("DEL").arg(keys).query(&mut conn);
            }
        }
    }
}
