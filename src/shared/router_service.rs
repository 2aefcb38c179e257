//! An axum router served inside the Pingora server on a listener bound before start-up (so a
//! taken port fails fast), stopping with the server: the admin API and the dashboard's own
//! listener.

use async_trait::async_trait;
use axum::Router;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use std::net::{SocketAddr, TcpListener};
use std::sync::Mutex;

/// A router as a Pingora background service.
pub struct RouterService {
    name: &'static str,
    listener: Mutex<Option<TcpListener>>,
    router: Router,
}

impl RouterService {
    /// Serves `router` on an already-bound `listener`; `name` says which in the logs.
    pub fn new(name: &'static str, listener: TcpListener, router: Router) -> Self {
        Self {
            name,
            listener: Mutex::new(Some(listener)),
            router,
        }
    }
}

#[async_trait]
impl BackgroundService for RouterService {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let name = self.name;
        let Some(listener) = self.listener.lock().ok().and_then(|mut l| l.take()) else {
            tracing::error!(service = name, "started twice");
            return;
        };
        let listener = match listener
            .set_nonblocking(true)
            .and_then(|()| tokio::net::TcpListener::from_std(listener))
        {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(service = name, error = %e, "cannot use its listener");
                return;
            }
        };
        // With each connection's peer address: the admin API throttles failed tokens by it,
        // the dashboard names its client by it.
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
            tracing::error!(service = name, error = %e, "stopped");
        }
    }
}
