//! `svcgate check`: a configuration checked as `serve` checks it, for a CI pipeline before a
//! rollout; with `--connect`, the store and the backends it names are tried as well.
//!
//! The file is loaded and validated by the same code as `serve` (the caller does that part);
//! here are the parts `serve` builds from a valid configuration before it binds anything, and
//! the reachability checks.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use crate::config::{Config, Problem, StoreKind};
use crate::proxy::routes::RouteTable;
use crate::proxy::upstream::Upstreams;
use crate::webhooks::mail::Mailer;

/// Exit code of a configuration with problems, as for `serve`.
const PROBLEMS: u8 = 2;

/// How long the store gets to answer.
const STORE_TIMEOUT: Duration = Duration::from_secs(5);

/// Checks a loaded configuration; prints every problem with its key, and with `connect` one
/// line per thing tried. Exit 0 when all is well, 2 otherwise.
pub fn run(config: &Config, connect: bool) -> ExitCode {
    let runtime = match super::command_runtime() {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    // Some parts (the SMTP transport's pool) are made where a runtime runs, as in `serve`.
    let problems = {
        let _guard = runtime.enter();
        components(config)
    };
    if !problems.is_empty() {
        eprintln!("svcgate: invalid configuration:");
        for p in &problems {
            eprintln!("  {}: {}", p.key, p.reason);
        }
        return ExitCode::from(PROBLEMS);
    }
    println!("configuration: valid");
    if !connect {
        return ExitCode::SUCCESS;
    }
    let reached = runtime.block_on(reach_all(config));
    let mut failed = false;
    for (key, outcome) in reached {
        match outcome {
            Ok(what) => println!("{key}: ok ({what})"),
            Err(why) => {
                failed = true;
                eprintln!("{key}: FAILED: {why}");
            }
        }
    }
    match failed {
        true => ExitCode::from(PROBLEMS),
        false => ExitCode::SUCCESS,
    }
}

/// What `serve` builds from the configuration before it binds a listener, built the same way;
/// each failure under the key to change.
fn components(config: &Config) -> Vec<Problem> {
    let mut problems = Vec::new();
    if let Err(why) = RouteTable::new(&config.routes()) {
        problems.push(Problem::new("routes", why));
    }
    if let Err(why) = Upstreams::from_config(&config.upstream) {
        problems.push(Problem::new("upstream", why));
    }
    if let Err(p) = config.store.tls() {
        problems.push(p);
    }
    if let Err(why) = Mailer::new(&config.smtp, &config.webhooks.outbox_dir) {
        problems.push(Problem::new("smtp", why));
    }
    problems
}

/// One outcome per thing tried: what answered, or why not.
type Reached = Vec<(&'static str, Result<String, String>)>;

/// Tries the store, each configured backend, the SMTP relay and the trace collector.
async fn reach_all(config: &Config) -> Reached {
    let connect_timeout = Duration::from_millis(config.upstream.connect_timeout_ms);
    let mut reached = vec![("store", reach_store(config).await)];
    for (key, addr) in [
        ("upstream.live", &config.upstream.live),
        ("upstream.sandbox", &config.upstream.sandbox),
    ] {
        let outcome = match addr {
            Some(addr) => tcp_connect(addr, connect_timeout).await,
            None => Ok("simulated: nothing to connect to".into()),
        };
        reached.push((key, outcome));
    }
    if let Some(host) = &config.smtp.host {
        let addr = match host.contains(':') {
            true => host.clone(),
            false => format!("{host}:{}", config.smtp.port),
        };
        reached.push(("smtp.host", tcp_connect(&addr, connect_timeout).await));
    }
    if let Some(endpoint) = &config.tracing.otlp_endpoint {
        let outcome = match url::Url::parse(endpoint) {
            Ok(url) => match (url.host_str(), url.port_or_known_default()) {
                (Some(host), Some(port)) => {
                    let host = host.trim_start_matches('[').trim_end_matches(']');
                    tcp_connect_to(host, port, connect_timeout).await
                }
                _ => Err("the URL names no host and port".into()),
            },
            Err(e) => Err(format!("not a URL: {e}")),
        };
        reached.push(("tracing.otlp_endpoint", outcome));
    }
    reached
}

/// PING, then the schema version: a store that answers but holds data of a newer version is
/// one `serve` refuses.
async fn reach_store(config: &Config) -> Result<String, String> {
    if config.store.kind == StoreKind::Memory {
        return Ok("in memory: nothing to connect to".into());
    }
    let store = crate::server::connect_store(config).map_err(|e| e.to_string())?;
    let checked = tokio::time::timeout(STORE_TIMEOUT, async {
        store.health.ping().await?;
        store.health.check_schema().await
    })
    .await;
    match checked {
        Ok(Ok(())) => Ok("answers; its schema version is one this build reads".into()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!(
            "no answer within {} s",
            STORE_TIMEOUT.as_secs_f32()
        )),
    }
}

/// A TCP connection to `host:port`, within `timeout`.
async fn tcp_connect(addr: &str, timeout: Duration) -> Result<String, String> {
    let (host, port) = addr
        .rsplit_once(':')
        .and_then(|(h, p)| Some((h, p.parse::<u16>().ok()?)))
        .ok_or_else(|| format!("'{addr}' is not host:port"))?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    tcp_connect_to(host, port, timeout).await
}

async fn tcp_connect_to(host: &str, port: u16, timeout: Duration) -> Result<String, String> {
    let shown = match host.contains(':') {
        true => format!("[{host}]:{port}"),
        false => format!("{host}:{port}"),
    };
    let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host, port))
        .await
        .map_err(|e| format!("cannot resolve {shown}: {e}"))?
        .collect();
    let Some(first) = addrs.first() else {
        return Err(format!("{shown} resolves to no address"));
    };
    match tokio::time::timeout(timeout, tokio::net::TcpStream::connect(first)).await {
        Ok(Ok(_)) => Ok(format!("connected to {shown}")),
        Ok(Err(e)) => Err(format!("cannot connect to {shown}: {e}")),
        Err(_) => Err(format!(
            "no connection to {shown} within {} ms",
            timeout.as_millis()
        )),
    }
}
