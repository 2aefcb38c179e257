//! The dashboard on a listener of its own (`[dashboard] listen`), served like the admin API
//! ([`RouterService`]), each request told its client.

use axum::extract::ConnectInfo;
use axum::Router;
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;

use crate::shared::net::ClientAddress;
use crate::shared::router_service::RouterService;

/// How the client of a request is told from its peer and headers (trusted proxies).
pub type ClientOf = Arc<dyn Fn(SocketAddr, &http::HeaderMap) -> ClientAddress + Send + Sync>;

/// Serves `router` on an already-bound `listener`; `client_of` names each request's client.
pub fn own_listener(listener: TcpListener, router: Router, client_of: ClientOf) -> RouterService {
    let router = router.layer(axum::middleware::from_fn(
        move |ConnectInfo(peer): ConnectInfo<SocketAddr>,
              mut req: axum::extract::Request,
              next: axum::middleware::Next| {
            let client = client_of(peer, req.headers());
            req.extensions_mut().insert(client);
            next.run(req)
        },
    ));
    RouterService::new("dashboard", listener, router)
}
