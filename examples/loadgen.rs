//! A constant-rate HTTP load generator for `benches/load.sh`: latency at a chosen load, not at
//! saturation (which is what wrk measures).
//!
//! ```sh
//! cargo run --release --example loadgen -- URL RATE SECONDS CONNECTIONS [BEARER] [BODY]
//! ```
//!
//! Requests are scheduled at fixed intervals and each latency is measured from its scheduled
//! start, so a stall delays the requests behind it and shows up in the percentiles (no
//! coordinated omission). Prints one line: `sent=… rate=… p50_ms=… p99_ms=… p999_ms=… errors=…`.

use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Mutex;

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1000.0
}

#[tokio::main(flavor = "multi_thread", worker_threads = 1)]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 4 {
        eprintln!("usage: loadgen URL RATE SECONDS CONNECTIONS [BEARER] [BODY]");
        std::process::exit(2);
    }
    let url = args[0].clone();
    let rate: f64 = args[1].parse().expect("RATE is requests per second");
    let seconds: f64 = args[2].parse().expect("SECONDS");
    let connections: usize = args[3].parse().expect("CONNECTIONS");
    let bearer = args.get(4).cloned().filter(|b| !b.is_empty());
    let body = args.get(5).cloned().unwrap_or_else(|| {
        r#"{"model":"load-1","messages":[{"role":"user","content":"hello"}]}"#.into()
    });

    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(connections)
        .build()
        .expect("client");
    let total = (rate * seconds) as usize;
    let interval = Duration::from_secs_f64(1.0 / rate);
    // Connections take scheduled start times from one queue, as they become free.
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Instant>();
    let rx = Arc::new(Mutex::new(rx));
    let latencies = Arc::new(Mutex::new(Vec::with_capacity(total)));
    let errors = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut workers = Vec::new();
    for _ in 0..connections {
        let (rx, client, url, bearer, body) = (
            rx.clone(),
            client.clone(),
            url.clone(),
            bearer.clone(),
            body.clone(),
        );
        let (latencies, errors) = (latencies.clone(), errors.clone());
        workers.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            loop {
                let Some(scheduled) = rx.lock().await.recv().await else {
                    break;
                };
                let mut req = client
                    .post(&url)
                    .header("content-type", "application/json")
                    .body(body.clone());
                if let Some(b) = &bearer {
                    req = req.bearer_auth(b);
                }
                match req.send().await {
                    Ok(resp) if resp.status().is_success() => {
                        let _ = resp.bytes().await;
                        mine.push(scheduled.elapsed());
                    }
                    _ => {
                        errors.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                }
            }
            latencies.lock().await.extend(mine);
        }));
    }
    // The pacer is an OS thread: tokio's timers tick in whole milliseconds, which would release
    // the requests in bursts (16 at once every millisecond at 16,000/s) instead of one by one.
    let start = Instant::now();
    let pacer = std::thread::spawn(move || {
        for i in 0..total {
            let at = start + interval.mul_f64(i as f64);
            let now = Instant::now();
            if at > now {
                std::thread::sleep(at - now);
            }
            let _ = tx.send(at);
        }
    });
    for w in workers {
        let _ = w.await;
    }
    pacer.join().expect("pacer");
    let elapsed = start.elapsed();
    let mut all = latencies.lock().await.clone();
    all.sort_unstable();
    println!(
        "sent={} rate={:.0} p50_ms={:.3} p99_ms={:.3} p999_ms={:.3} errors={}",
        all.len(),
        all.len() as f64 / elapsed.as_secs_f64(),
        percentile(&all, 0.5),
        percentile(&all, 0.99),
        percentile(&all, 0.999),
        errors.load(std::sync::atomic::Ordering::Relaxed)
    );
}
