//! Bare Pingora, no authentication: the ceiling svcgate is measured against.
//!
//! ```sh
//! cargo run --release --example passthrough -- 127.0.0.1:8090 127.0.0.1:9000
//! curl -s localhost:8090/v1/chat/completions -d '{}'
//! ```

use async_trait::async_trait;
use pingora::prelude::*;
use pingora::proxy::{ProxyHttp, Session};

struct Passthrough {
    peer: HttpPeer,
}

#[async_trait]
impl ProxyHttp for Passthrough {
    type CTX = ();

    fn new_ctx(&self) {}

    async fn upstream_peer(&self, _session: &mut Session, _ctx: &mut ()) -> Result<Box<HttpPeer>> {
        Ok(Box::new(self.peer.clone()))
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
        },
    );
    proxy.add_tcp(&listen);
    server.add_service(proxy);
    server.run(pingora::server::RunArgs::default());
}
