//! svcgate's authentication alone — bearer key → key cache → route → scope → identity headers
//! → forward — with no rate limits, budgets, spend or audit: the baseline the full policy is
//! measured against. Reads keys from the same Redis namespace as a `svcgate serve`.
//!
//! ```sh
//! cargo run --release --example auth_only -- 127.0.0.1:8091 127.0.0.1:9000 redis://127.0.0.1:6379 svcgate
//! curl -s localhost:8091/v1/chat/completions -H "Authorization: Bearer $KEY" -d '{}'
//! ```

use async_trait::async_trait;
use pingora::prelude::*;
use pingora::proxy::{ProxyHttp, Session};
use std::sync::Arc;

use svcgate::config::default_routes;
use svcgate::keys::cache::{CacheConfig, KeyCache};
use svcgate::proxy::auth::{Authenticated, Authenticator};
use svcgate::proxy::client_ip::TrustedProxies;
use svcgate::proxy::routes::RouteTable;
use svcgate::proxy::{policy, upstream};
use svcgate::store::RedisStore;

struct AuthOnly {
    auth: Authenticator,
    routes: RouteTable,
    peer: HttpPeer,
}

#[async_trait]
impl ProxyHttp for AuthOnly {
    type CTX = Option<(Authenticated, svcgate::ids::RequestId)>;

    /// No downstream modules, as svcgate and the passthrough run none.
    fn init_downstream_modules(&self, _modules: &mut pingora::modules::http::HttpModules) {}

    fn new_ctx(&self) -> Self::CTX {
        None
    }

    async fn request_filter(&self, session: &mut Session, ctx: &mut Self::CTX) -> Result<bool> {
        let req = session.req_header();
        let caller = self
            .auth
            .authenticate(
                req.headers.get("authorization"),
                svcgate::ids::unix_now(),
                || session.client_addr()?.as_inet().map(|a| a.ip()),
            )
            .await;
        let route = self.routes.find(&req.method, req.uri.path());
        match (caller, route) {
            (Ok(caller), Some(route)) if policy::check_scope(&caller, route).is_ok() => {
                *ctx = Some((caller, svcgate::ids::request_id()));
                Ok(false)
            }
            _ => {
                session.respond_error(401).await?;
                Ok(true)
            }
        }
    }

    async fn upstream_peer(
        &self,
        _session: &mut Session,
        _ctx: &mut Self::CTX,
    ) -> Result<Box<HttpPeer>> {
        Ok(Box::new(self.peer.clone()))
    }

    async fn upstream_request_filter(
        &self,
        session: &mut Session,
        req: &mut RequestHeader,
        ctx: &mut Self::CTX,
    ) -> Result<()> {
        match ctx {
            Some((caller, request_id)) => {
                let peer = session
                    .client_addr()
                    .and_then(|a| a.as_inet())
                    .map(|a| a.ip());
                let forwarded_for = TrustedProxies::default().forwarded_for(peer, &req.headers);
                let identity = upstream::Identity::new(&caller.key, request_id)?;
                upstream::set_identity_headers(req, identity, forwarded_for)
            }
            None => Ok(()),
        }
    }
}

/// The same allocator as `svcgate`, so the comparison measures the gateway, not malloc.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    let mut args = std::env::args().skip(1);
    let listen = args.next().unwrap_or_else(|| "127.0.0.1:8091".into());
    let upstream: std::net::SocketAddr = args
        .next()
        .unwrap_or_else(|| "127.0.0.1:9000".into())
        .parse()
        .expect("upstream is ip:port");
    let redis_url = args
        .next()
        .unwrap_or_else(|| "redis://127.0.0.1:6379".into());
    let namespace = args.next().unwrap_or_else(|| "svcgate".into());

    let store_runtime = tokio::runtime::Runtime::new().expect("runtime");
    let cache = store_runtime.block_on(async {
        let store = Arc::new(RedisStore::connect(&redis_url, &namespace).expect("Redis URL"));
        let cache = Arc::new(KeyCache::new(store, CacheConfig::default()));
        cache.sync().await.expect("Redis answers");
        tokio::spawn(cache.clone().follow());
        cache
    });
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
        AuthOnly {
            auth: Authenticator::new(cache),
            routes: RouteTable::new(&default_routes()).expect("default routes"),
            peer: HttpPeer::new(upstream, false, String::new()),
        },
    );
    proxy.add_tcp(&listen);
    server.add_service(proxy);
    server.run(pingora::server::RunArgs::default());
}
