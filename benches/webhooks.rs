//! Webhook delivery throughput and latency: `cargo bench --bench webhooks` (needs Redis at
//! `REDIS_URL`; under `cargo test` a quick run with a few hundred events).
//!
//! One worker (the library's [`Worker`], as `svcgate worker` runs it) on Redis, delivering
//! over loopback HTTP to a local receiver that verifies every signature. Ten workspaces with
//! one endpoint each.
//!
//! 1. **Throughput**: N events are logged first, then the worker starts; deliveries per second
//!    from its start until the receiver has every one.
//! 2. **Latency**: events are logged at 1,000 per second, as a backend would (`XADD`), with
//!    the worker running; the receiver measures each from just before its `XADD` to its arrival.
//! 3. **Fan-out**: 100 events of 100 KB for one workspace with 50 endpoints (5,000 deliveries,
//!    500 MB of bodies in all), logged with the worker running: deliveries per second. (The
//!    process's peak memory is not shown: the receiver's buffers, in the same process, swamp
//!    the worker's.)

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use svcgate::config::{SmtpConfig, WebhooksConfig};
use svcgate::events::Event;
use svcgate::ids::{new_id, unix_millis, unix_now};
use svcgate::keys::Environment;
use svcgate::store::{DeliveryQueue, EventLog, RedisStore, StoreHealth, Stores};
use svcgate::webhooks::endpoint::{new_secret, Endpoint, EndpointStatus};
use svcgate::webhooks::mail::Mailer;
use svcgate::webhooks::{verify, Worker, WorkerSettings};

const WORKSPACES: usize = 10;
/// Endpoints of the fan-out workspace.
const FAN_OUT_ENDPOINTS: usize = 50;
/// Bytes of data of each fan-out event.
const FAN_OUT_DATA: usize = 100_000;

#[derive(Default)]
struct Seen {
    count: usize,
    bad_signatures: usize,
    latencies_ms: Vec<u64>,
}

type Receiver = Arc<(Mutex<Seen>, HashMap<String, String>)>;

async fn receive(State(state): State<Receiver>, headers: HeaderMap, body: Bytes) -> &'static str {
    let arrived = unix_millis();
    let (seen, secrets) = &*state;
    let parsed: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let ws = parsed["workspace"].as_str().unwrap_or_default();
    let good = secrets
        .get(ws)
        .is_some_and(|secret| verify(secret, &headers, &body, unix_now()).is_ok());
    let mut seen = seen.lock().unwrap();
    seen.count += 1;
    if !good {
        seen.bad_signatures += 1;
    }
    if let Some(sent) = parsed["data"]["sent_ms"].as_u64() {
        seen.latencies_ms.push(arrived.saturating_sub(sent));
    }
    "ok"
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let (events, rate_seconds, fan_out_events) = if full { (20_000, 10, 100) } else { (300, 1, 4) };
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let ns = new_id("bench");

    // The receiver on a runtime of its own, like a separate process.
    let receiver_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let workspaces: Vec<String> = (0..WORKSPACES).map(|_| new_id("ws")).collect();
    let fan_out_ws = new_id("ws");
    let secrets: HashMap<String, String> = workspaces
        .iter()
        .chain([&fan_out_ws])
        .map(|ws| (ws.clone(), new_secret()))
        .collect();
    let state: Receiver = Arc::new((Mutex::default(), secrets.clone()));
    let addr = receiver_rt.block_on(async {
        let app = axum::Router::new()
            .fallback(receive)
            .with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        addr
    });

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let store = Arc::new(RedisStore::connect(&url, &ns).expect("Redis URL"));
        store.ping().await.expect("Redis answers at REDIS_URL");
        for ws in &workspaces {
            store
                .create_endpoint(&Endpoint {
                    id: new_id("we"),
                    workspace: ws.clone(),
                    environment: Environment::Live,
                    url: format!("http://{addr}/{ws}"),
                    events: vec!["agent.run.*".into()],
                    secret: secrets[ws].clone(),
                    status: EndpointStatus::Active,
                    created_at: unix_now(),
                    format: Default::default(),
                    previous_secret: None,
                    previous_secret_until: None,
                    rate_limit_per_second: None,
                }, 1)
                .await
                .unwrap();
        }
        let log = |i: usize, sent_ms: Option<u64>| {
            let mut data = serde_json::json!({"run_id": format!("run_{i}"), "steps": 7});
            if let Some(ms) = sent_ms {
                data["sent_ms"] = ms.into();
            }
            Event::new(
                "agent.run.completed",
                &workspaces[i % WORKSPACES],
                Environment::Live,
                data,
            )
        };

        // 1. Throughput: a backlog, then the worker.
        let appends: Vec<_> = (0..events)
            .map(|i| {
                let (store, event) = (store.clone(), log(i, None));
                tokio::spawn(async move { store.append_event(&event).await.unwrap() })
            })
            .collect();
        for a in appends {
            a.await.unwrap();
        }
        let config = WebhooksConfig {
            allow_insecure_targets: true,
            ..WebhooksConfig::default()
        };
        let mailer = Mailer::new(&SmtpConfig::default(), &config.outbox_dir).expect("outbox mailer");
        let worker = Worker::new(Stores::of(store.clone()).worker(), WorkerSettings::from_config(&config), mailer)
            .expect("worker");
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let started = Instant::now();
        let running = tokio::spawn(worker.run(stopped));
        wait_for(&state, events, Duration::from_secs(120)).await;
        let took = started.elapsed();
        let per_second = events as f64 / took.as_secs_f64();
        println!(
            "throughput: {events} signed deliveries in {:.2} s = {per_second:.0} deliveries/s (target >= 5000)",
            took.as_secs_f64()
        );

        // 2. Latency at 1,000 events per second.
        state.0.lock().unwrap().latencies_ms.clear();
        let total = 1_000 * rate_seconds;
        let mut tick = tokio::time::interval(Duration::from_millis(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
        for i in 0..total {
            tick.tick().await;
            let store = store.clone();
            let event = log(i, Some(unix_millis()));
            tokio::spawn(async move { store.append_event(&event).await.unwrap() });
        }
        wait_for(&state, events + total, Duration::from_secs(60)).await;
        let mut lat = state.0.lock().unwrap().latencies_ms.clone();
        lat.sort_unstable();
        println!(
            "latency at 1000 events/s over {rate_seconds} s ({} deliveries): p50 {} ms, p99 {} ms, max {} ms (target p99 < 50 ms)",
            lat.len(),
            percentile(&lat, 0.5),
            percentile(&lat, 0.99),
            lat[lat.len() - 1]
        );

        // 3. Fan-out: large events for many endpoints of one workspace.
        for _ in 0..FAN_OUT_ENDPOINTS {
            let endpoint = Endpoint {
                id: new_id("we"),
                workspace: fan_out_ws.clone(),
                environment: Environment::Live,
                url: format!("http://{addr}/{fan_out_ws}"),
                events: vec!["agent.run.*".into()],
                secret: secrets[&fan_out_ws].clone(),
                status: EndpointStatus::Active,
                created_at: unix_now(),
                format: Default::default(),
                previous_secret: None,
                previous_secret_until: None,
                rate_limit_per_second: None,
            };
            store.create_endpoint(&endpoint, FAN_OUT_ENDPOINTS).await.unwrap();
        }
        let before = state.0.lock().unwrap().count;
        let fanned = fan_out_events * FAN_OUT_ENDPOINTS;
        let started = Instant::now();
        for _ in 0..fan_out_events {
            let data = serde_json::json!({"blob": "x".repeat(FAN_OUT_DATA)});
            let event = Event::new("agent.run.completed", &fan_out_ws, Environment::Live, data);
            store.append_event(&event).await.unwrap();
        }
        wait_for(&state, before + fanned, Duration::from_secs(300)).await;
        let took = started.elapsed();
        println!(
            "fan-out: {fan_out_events} events of {} KB to {FAN_OUT_ENDPOINTS} endpoints, {fanned} deliveries in {:.2} s = {:.0} deliveries/s",
            FAN_OUT_DATA / 1000,
            took.as_secs_f64(),
            fanned as f64 / took.as_secs_f64(),
        );

        let _ = stop.send(true);
        let _ = running.await;
        let seen = state.0.lock().unwrap();
        assert_eq!(seen.bad_signatures, 0, "every delivery verifies");
        assert_eq!(seen.count, events + total + fanned, "each event delivered once");
    });
    clean_up(&url, &ns);
}

async fn wait_for(state: &Receiver, n: usize, limit: Duration) {
    let started = Instant::now();
    while state.0.lock().unwrap().count < n {
        assert!(
            started.elapsed() < limit,
            "only {} of {n} deliveries arrived",
            state.0.lock().unwrap().count
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Deletes the benchmark's namespace.
fn clean_up(url: &str, ns: &str) {
    let client = redis::Client::open(url).unwrap();
    let mut conn = client.get_connection().unwrap();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{{{ns}}}*"))
        .query(&mut conn)
        .unwrap_or_default();
    for chunk in keys.chunks(500) {
        let _: redis::RedisResult<()> = redis::cmd("DEL").arg(chunk).query(&mut conn);
    }
}
