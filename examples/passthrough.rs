//! Bare Pingora, no authentication: the ceiling svcgate is measured against.
//!
//! ```sh
//! cargo run --release --example passthrough -- 127.0.0.1:8090 127.0.0.1:9000
//! curl -s localhost:8090/v1/chat/completions -d '{}'
//! ```
//!
//! With a third argument, `host:port`, it also times what svcgate's
//! `svcgate_gateway_overhead_seconds` times (from a request's header being read to its header
//! going to the backend) into `passthrough_overhead_seconds`, with the same buckets, served
//! there at `/metrics`: the same measure of bare Pingora's own time, for `benches/load.sh`.

use async_trait::async_trait;
use pingora::prelude::*;
use pingora::proxy::{ProxyHttp, Session};
use std::sync::LazyLock;
use std::time::Instant;

struct Passthrough {
    peer: HttpPeer,
    /// Whether requests are timed.
    timed: bool,
}

static OVERHEAD: LazyLock<prometheus::Histogram> = LazyLock::new(|| {
    prometheus::register_histogram!(
        "passthrough_overhead_seconds",
        "Time from a request's header being read to its header going to the backend.",
        svcgate::metrics::OVERHEAD_BUCKETS.to_vec()
    )
    .expect("registers once")
});

/// A timed request: when its header was read, and when it last went to the backend.
struct Timing {
    started: Instant,
    sent: Option<Instant>,
}

#[async_trait]
impl ProxyHttp for Passthrough {
    type CTX = Option<Timing>;

    /// No downstream modules, as svcgate runs none (Pingora adds its response compression,
    /// disabled, by default): the ceiling measures the same core.
    fn init_downstream_modules(&self, _modules: &mut pingora::modules::http::HttpModules) {}

    fn new_ctx(&self) -> Option<Timing> {
        self.timed.then(|| Timing {
            started: Instant::now(),
            sent: None,
        })
    }

    async fn upstream_peer(
        &self,
        _session: &mut Session,
        _ctx: &mut Option<Timing>,
    ) -> Result<Box<HttpPeer>> {
        Ok(Box::new(self.peer.clone()))
    }

    async fn upstream_request_filter(
        &self,
        _session: &mut Session,
        _upstream_request: &mut RequestHeader,
        ctx: &mut Option<Timing>,
    ) -> Result<()> {
        if let Some(timing) = ctx {
            timing.sent = Some(Instant::now());
        }
        Ok(())
    }

    /// Observed once, to the last attempt, as svcgate does.
    async fn logging(&self, _session: &mut Session, _e: Option<&Error>, ctx: &mut Option<Timing>) {
        if let Some(Timing {
            started,
            sent: Some(sent),
        }) = ctx
        {
            OVERHEAD.observe(sent.saturating_duration_since(*started).as_secs_f64());
        }
    }
}

/// The same allocator as `svcgate`, so the comparison measures the gateway, not malloc.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    let mut args = std::env::args().skip(1);
    let listen = args.next().unwrap_or_else(|| "127.0.0.1:8090".into());
    let upstream: std::net::SocketAddr = args
        .next()
        .unwrap_or_else(|| "127.0.0.1:9000".into())
        .parse()
        .expect("upstream is ip:port");
    let metrics = args.next();
    let conf = pingora::server::configuration::ServerConf {
        // `THREADS` as `svcgate serve` takes `SVCGATE_SERVER_THREADS`: 0 or unset, one per CPU.
        threads: match std::env::var("THREADS").ok().and_then(|t| t.parse().ok()) {
            Some(n) if n > 0 => n,
            _ => std::thread::available_parallelism().map_or(2, usize::from),
        },
        grace_period_seconds: Some(0),
        graceful_shutdown_timeout_seconds: Some(1),
        ..Default::default()
    };
    let mut server = Server::new_with_opt_and_conf(None, conf);
    server.bootstrap();
    let mut proxy = pingora::proxy::http_proxy_service(
        &server.configuration,
        Passthrough {
            peer: HttpPeer::new(upstream, false, String::new()),
            timed: metrics.is_some(),
        },
    );
    proxy.add_tcp(&listen);
    server.add_service(proxy);
    if let Some(addr) = metrics {
        LazyLock::force(&OVERHEAD);
        let mut prometheus = pingora_prometheus::prometheus_http_service();
        prometheus.add_tcp(&addr);
        server.add_service(prometheus);
    }
    server.run(pingora::server::RunArgs::default());
}
