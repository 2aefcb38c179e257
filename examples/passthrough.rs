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

#[async_trait]
impl ProxyHttp for Passthrough {
    /// When the request's header was read, if requests are timed.
    type CTX = Option<Instant>;

    fn new_ctx(&self) -> Option<Instant> {
        self.timed.then(Instant::now)
    }

    async fn upstream_peer(
        &self,
        _session: &mut Session,
        _ctx: &mut Option<Instant>,
    ) -> Result<Box<HttpPeer>> {
        Ok(Box::new(self.peer.clone()))
    }

    async fn upstream_request_filter(
        &self,
        _session: &mut Session,
        _upstream_request: &mut RequestHeader,
        ctx: &mut Option<Instant>,
    ) -> Result<()> {
        if let Some(started) = ctx.take() {
            OVERHEAD.observe(started.elapsed().as_secs_f64());
        }
        Ok(())
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
