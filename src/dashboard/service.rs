//! The dashboard on a listener of its own (`[dashboard] listen`), inside the Pingora server
//! like the admin API.

use async_trait::async_trait;
use axum::extract::ConnectInfo;
use axum::Router;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use std::net::{SocketAddr, TcpListener};
use std::sync::{Arc, Mutex};

use crate::shared::net::ClientAddress;

/// How the client of a request is told from its peer and headers (trusted proxies).
pub type ClientOf = Arc<dyn Fn(SocketAddr, &http::HeaderMap) -> ClientAddress + Send + Sync>;

/// The dashboard as a Pingora background service.
pub struct DashboardService {
    listener: Mutex<Option<TcpListener>>,
    router: Router,
}

impl DashboardService {
    /// Serves `router` on an already-bound `listener`; `client_of` names each request's client.
    pub fn new(listener: TcpListener, router: Router, client_of: ClientOf) -> Self {
        let router = router.layer(axum::middleware::from_fn(
            move |ConnectInfo(peer): ConnectInfo<SocketAddr>,
                  mut req: axum::extract::Request,
                  next: axum::middleware::Next| {
                let client = client_of(peer, req.headers());
                req.extensions_mut().insert(client);
                next.run(req)
            },
        ));
        Self {
            listener: Mutex::new(Some(listener)),
            router,
        }
    }
}

#[async_trait]
impl BackgroundService for DashboardService {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let Some(listener) = self.listener.lock().ok().and_then(|mut l| l.take()) else {
            tracing::error!("dashboard listener started twice");
            return;
        };
        let listener = match listener
            .set_nonblocking(true)
            .and_then(|()| tokio::net::TcpListener::from_std(listener))
        {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(error = %e, "dashboard cannot use its listener");
                return;
            }
        };
        let service = self
            .router
            .clone()
            .into_make_service_with_connect_info::<SocketAddr>();
        let served = axum::serve(listener, service)
            .with_graceful_shutdown(async move {
                let _ = shutdown.changed().await;
            })
            .await;
        if let Err(e) = served {
            tracing::error!(error = %e, "dashboard listener stopped");
        }
    }
}
