//! What the full policy costs on top of authentication, and how many Redis commands it sends:
//! `cargo bench --bench metering` (needs Redis at `REDIS_URL`; under `cargo test` a short run).
//!
//! In process, on the real store: N requests spread over 50 keys go through authentication
//! alone, then through authentication + rate limit + budget + spend + audit record, with the
//! meter's background flush writing to Redis as in the gateway. Reported: time per request of
//! each, their throughput ratio, and Redis commands per request (from `INFO commandstats`).
//! HTTP and proxying are left out here; the side-by-side load benchmark measures them.

use http::HeaderValue;
use std::sync::Arc;
use std::time::{Duration, Instant};

use svcgate::keys::cache::{CacheConfig, KeyCache};
use svcgate::keys::{self, Environment, KeyParams, Scopes};
use svcgate::metering::audit::PendingAudit;
use svcgate::metering::meter::MeterConfig;
use svcgate::metering::ratelimit::Limit;
use svcgate::metering::{Credits, Meter};
use svcgate::proxy::auth::Authenticator;
use svcgate::store::{KeyStore, RedisStore, StoreHealth};

fn commands(conn: &mut redis::Connection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(conn)
        .unwrap_or_default();
    info.lines()
        .filter_map(|l| l.split("calls=").nth(1))
        .filter_map(|rest| rest.split(',').next()?.parse::<u64>().ok())
        .sum()
}

fn main() {
    let requests: usize = if std::env::args().any(|a| a == "--bench") {
        400_000
    } else {
        2_000
    };
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let ns = svcgate::ids::new_id("bench");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut info_conn = redis::Client::open(url.as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    rt.block_on(async {
        let store = Arc::new(RedisStore::connect(&url, &ns).unwrap());
        store.ping().await.expect("Redis answers at REDIS_URL");
        let mut headers = Vec::new();
        for i in 0..50 {
            let (key, record) = keys::issue(
                KeyParams {
                    workspace: format!("ws_bench{}", i % 5),
                    environment: Environment::Live,
                    scopes: Scopes::new(["chat.completions:create"]),
                    name: String::new(),
                    monthly_budget: Some(Credits::from_micros(1_000_000_000_000)),
                    expires_at: None,
                    rate_limit: None,
                    metadata: None,
                },
                0,
            );
            store.insert_key(&record).await.unwrap();
            headers.push(HeaderValue::from_str(&format!("Bearer {}", key.value)).unwrap());
        }
        let cache = Arc::new(KeyCache::new(store.clone(), CacheConfig::default()));
        cache.sync().await.unwrap();
        tokio::spawn(cache.clone().follow());
        let auth = Authenticator::new(cache);
        let spool = tempfile_dir(&ns);
        let (meter, writer) = Meter::new(
            store.clone(),
            store.clone(),
            MeterConfig {
                flush_interval: Duration::from_millis(200),
                live_limit: Limit { requests_per_minute: u32::MAX / 2, burst: u32::MAX / 2 },
                test_limit: Limit { requests_per_minute: 600, burst: 50 },
                token_mints: Limit { requests_per_minute: 60, burst: 60 },
                token_metadata_bytes: 4096,
                spool_dir: spool.clone(),
                audit_backlog: 1_000_000,
                audit_backlog_bytes: usize::MAX,
                refused_audit_per_second: 5,
                project_budgets: Default::default(),
                max_credits_per_request: svcgate::metering::config::DEFAULT_MAX_CREDITS_PER_REQUEST,
                budget_when_store_down: Default::default(),
            },
        );
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let flusher = tokio::spawn(meter.clone().run(writer, stopped));
        let now = svcgate::ids::unix_now();
        for h in &headers {
            auth.authenticate(Some(h), now, || None).await.unwrap();
        }

        let started = Instant::now();
        for i in 0..requests {
            let caller = auth.authenticate(Some(&headers[i % headers.len()]), now, || None).await.unwrap();
            std::hint::black_box(caller.allows("chat.completions:create"));
        }
        let auth_only = started.elapsed();

        let before = commands(&mut info_conn);
        let started = Instant::now();
        for i in 0..requests {
            let caller = auth.authenticate(Some(&headers[i % headers.len()]), now, || None).await.unwrap();
            std::hint::black_box(caller.allows("chat.completions:create"));
            let now_ms = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_millis() as u64;
            let price = Credits::from_micros(500_000);
            let reservation = meter
                .admit(&caller.key, None, caller.monthly_budget(), Some("bench"), true, price, now_ms)
                .await
                .1
                .unwrap();
            meter.finish(PendingAudit {
                time_ms: now_ms,
                request_id: svcgate::ids::request_id(),
                key: caller.key.clone(),
                project: Some("bench".into()),
                method: http::Method::POST,
                path: "/v1/chat/completions".into(),
                model: Some("m".into()),
                status: 200,
                credits: Credits::from_micros(500_000),
                client_ip: Some(std::net::Ipv4Addr::LOCALHOST.into()),
                latency_ms: 1,
                suppressed: None,
                tunnel: None,
            }, reservation);
        }
        let full = started.elapsed();
        let _ = stop.send(true);
        flusher.await.unwrap();
        let sent = commands(&mut info_conn) - before;
        let per = |d: Duration| d.as_nanos() as f64 / requests as f64;
        println!(
            "metering: {requests} requests; auth alone {:.0} ns/request, full policy {:.0} ns/request \
             (throughput ratio {:.0}%), Redis commands per request {:.4}",
            per(auth_only),
            per(full),
            100.0 * auth_only.as_secs_f64() / full.as_secs_f64(),
            sent as f64 / requests as f64
        );
        let _ = std::fs::remove_dir_all(&spool);
    });
    if let Ok(mut conn) = redis::Client::open(url).and_then(|c| c.get_connection()) {
        for pattern in [
            format!("{ns}:*"),
            format!("{{{ns}}}*"),
            format!("{ns}:audit:*"),
        ] {
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

fn tempfile_dir(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("svcgate-{name}"))
}
