//! Runs the admin router inside the Pingora server, on a listener bound before start-up so a
//! taken port fails fast.

use async_trait::async_trait;
use axum::Router;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use std::net::TcpListener;
use std::sync::Mutex;

/// The admin API as a Pingora background service.
pub struct AdminService {
    listener: Mutex<Option<TcpListener>>,
    router: Router,
}

impl AdminService {
    /// Wraps an already-bound listener.
    pub fn new(listener: TcpListener, router: Router) -> Self {
        Self {
            listener: Mutex::new(Some(listener)),
            router,
        }
    }
}

#[async_trait]
impl BackgroundService for AdminService {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let Some(listener) = self.listener.lock().ok().and_then(|mut l| l.take()) else {
            tracing::error!("admin API started twice");
            return;
        };
        let listener = match listener
            .set_nonblocking(true)
            .and_then(|()| tokio::net::TcpListener::from_std(listener))
        {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(error = %e, "admin API cannot use its listener");
                return;
            }
        };
        // With each connection's peer address, which the token check throttles by.
        let service = self
            .router
            .clone()
            .into_make_service_with_connect_info::<std::net::SocketAddr>();
        let served = axum::serve(listener, service)
            .with_graceful_shutdown(async move {
                let _ = shutdown.changed().await;
            })
            .await;
        if let Err(e) = served {
            tracing::error!(error = %e, "admin API stopped");
        }
    }
}
