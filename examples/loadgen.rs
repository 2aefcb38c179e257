//! A constant-rate HTTP load generator for `benches/load.sh`: latency at a chosen load, not at
//! saturation (which is what wrk measures).
//!
//! ```sh
//! cargo run --release --example loadgen -- URL RATE SECONDS CONNECTIONS [BEARER] [BODY]
//! ```
//!
//! Requests are scheduled at fixed intervals and each latency is measured from its scheduled
//! start, so a stall delays the requests behind it and shows up in the percentiles (no
//! coordinated omission). Each connection is a bare hyper HTTP/1.1 connection: on a 2-core
//! machine the generator shares the CPU with what it measures, so it must cost little per
//! request. Prints one line: `sent=… rate=… p50_ms=… p99_ms=… p999_ms=… errors=…`.
//!
//! With `LOADGEN_TRACE=FILE` it also writes every answered request to FILE, one line each:
//! its scheduled time (microseconds from the start) and its latency (microseconds), in
//! scheduled order. Stalls that recur at a fixed rhythm (a timer in the proxy, a kernel thread)
//! show up there as bursts of slow requests at that period.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use std::sync::atomic::{AtomicUsize, Ordering};
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

/// What every request carries.
struct Target {
    addr: String,
    uri: http::Uri,
    authority: http::HeaderValue,
    bearer: Option<http::HeaderValue>,
    body: Bytes,
}

impl Target {
    fn request(&self) -> http::Request<Full<Bytes>> {
        let mut req = http::Request::post(self.uri.clone())
            .header(http::header::HOST, self.authority.clone())
            .header(http::header::CONTENT_TYPE, "application/json");
        if let Some(b) = &self.bearer {
            req = req.header(http::header::AUTHORIZATION, b.clone());
        }
        req.body(Full::new(self.body.clone())).expect("request")
    }

    async fn connect(&self) -> Option<http1::SendRequest<Full<Bytes>>> {
        let stream = tokio::net::TcpStream::connect(&self.addr).await.ok()?;
        stream.set_nodelay(true).ok()?;
        let (sender, conn) = http1::handshake(TokioIo::new(stream)).await.ok()?;
        tokio::spawn(conn);
        Some(sender)
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 1)]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 4 {
        eprintln!("usage: loadgen URL RATE SECONDS CONNECTIONS [BEARER] [BODY]");
        std::process::exit(2);
    }
    let url: http::Uri = args[0].parse().expect("URL");
    let rate: f64 = args[1].parse().expect("RATE is requests per second");
    let seconds: f64 = args[2].parse().expect("SECONDS");
    let connections: usize = args[3].parse().expect("CONNECTIONS");
    let authority = url.authority().expect("URL has host:port").clone();
    let target = Arc::new(Target {
        addr: authority.to_string(),
        uri: url
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .parse()
            .expect("path"),
        authority: authority.as_str().parse().expect("authority"),
        bearer: args
            .get(4)
            .filter(|b| !b.is_empty())
            .map(|b| format!("Bearer {b}").parse().expect("bearer")),
        body: Bytes::from(args.get(5).cloned().unwrap_or_else(|| {
            r#"{"model":"load-1","messages":[{"role":"user","content":"hello"}]}"#.into()
        })),
    });

    let total = (rate * seconds) as usize;
    let interval = Duration::from_secs_f64(1.0 / rate);
    // Connections take scheduled start times from one queue, as they become free.
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Instant>();
    let rx = Arc::new(Mutex::new(rx));
    let latencies: Arc<Mutex<Vec<(Instant, Duration)>>> =
        Arc::new(Mutex::new(Vec::with_capacity(total)));
    let errors = Arc::new(AtomicUsize::new(0));
    let mut workers = Vec::new();
    for _ in 0..connections {
        let (rx, target) = (rx.clone(), target.clone());
        let (latencies, errors) = (latencies.clone(), errors.clone());
        workers.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            let mut sender = None;
            loop {
                let Some(scheduled) = rx.lock().await.recv().await else {
                    break;
                };
                if sender.is_none() {
                    sender = target.connect().await;
                }
                let ok = match &mut sender {
                    Some(s) => match s.send_request(target.request()).await {
                        Ok(resp) => {
                            let success = resp.status().is_success();
                            success && resp.into_body().collect().await.is_ok()
                        }
                        Err(_) => false,
                    },
                    None => false,
                };
                if ok {
                    mine.push((scheduled, scheduled.elapsed()));
                } else {
                    // A failed exchange may have left the connection unusable: start afresh.
                    errors.fetch_add(1, Ordering::Relaxed);
                    sender = None;
                }
            }
            latencies.lock().await.extend(mine);
        }));
    }
    // The pacer is an OS thread: tokio's timers tick in whole milliseconds, which would release
    // the requests in bursts (16 at once every millisecond at 16,000/s). It wakes every
    // PACER_TICK at most and releases what is due: one wakeup per request would cost the
    // generator more CPU than the requests. Latency still counts from each request's own time.
    const PACER_TICK: Duration = Duration::from_micros(200);
    let start = Instant::now();
    let pacer = std::thread::spawn(move || {
        let mut next = 0;
        while next < total {
            let now = Instant::now();
            while next < total {
                let at = start + interval.mul_f64(next as f64);
                if at > now {
                    std::thread::sleep((at - now).max(PACER_TICK));
                    break;
                }
                let _ = tx.send(at);
                next += 1;
            }
        }
    });
    for w in workers {
        let _ = w.await;
    }
    pacer.join().expect("pacer");
    let elapsed = start.elapsed();
    let mut answered = std::mem::take(&mut *latencies.lock().await);
    if let Ok(path) = std::env::var("LOADGEN_TRACE") {
        answered.sort_unstable_by_key(|(at, _)| *at);
        let mut out = String::with_capacity(answered.len() * 16);
        for (at, latency) in &answered {
            let at = at.duration_since(start).as_micros();
            out.push_str(&format!("{at} {}\n", latency.as_micros()));
        }
        std::fs::write(&path, out).expect("LOADGEN_TRACE is writable");
    }
    let mut all: Vec<Duration> = answered.into_iter().map(|(_, l)| l).collect();
    all.sort_unstable();
    println!(
        "sent={} rate={:.0} p50_ms={:.3} p99_ms={:.3} p999_ms={:.3} errors={}",
        all.len(),
        all.len() as f64 / elapsed.as_secs_f64(),
        percentile(&all, 0.5),
        percentile(&all, 0.99),
        percentile(&all, 0.999),
        errors.load(Ordering::Relaxed)
    );
}
