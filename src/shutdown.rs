//! Stopping without refusing traffic.
//!
//! When a pod is deleted, Kubernetes sends SIGTERM and takes the pod out of its Services at the
//! same moment; load balancers and kube-proxy learn of it a few seconds later and keep sending
//! new connections until then. So on SIGTERM svcgate first *drains*: for
//! `server.shutdown_grace_seconds` it keeps accepting and serving, `/readyz` answers 503 and
//! every response closes its connection (clients reconnect to a replica that stays). Only
//! then are the listeners closed; requests in flight get `server.shutdown_timeout_seconds`
//! to finish. SIGINT stops at once, also in the middle of a drain; SIGQUIT hands the
//! listeners to a new process (graceful upgrade), which needs no drain.

use async_trait::async_trait;
use pingora::server::{ShutdownSignal, ShutdownSignalWatch};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::signal::unix::{signal, SignalKind};

/// Whether this process is draining: shared by the gateway, the admin API and the signal
/// watch that sets it.
#[derive(Debug, Clone, Default)]
pub struct Draining(Arc<AtomicBool>);

impl Draining {
    /// True once SIGTERM has arrived.
    pub fn is_draining(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    fn start(&self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Pingora's shutdown signal watch with a drain in front of a graceful terminate.
pub struct DrainingSignalWatch {
    draining: Draining,
    drain_for: Duration,
}

impl DrainingSignalWatch {
    /// A watch that drains for `drain_for` after SIGTERM and reports it through `draining`.
    pub fn new(draining: Draining, drain_for: Duration) -> Self {
        Self {
            draining,
            drain_for,
        }
    }
}

#[async_trait]
impl ShutdownSignalWatch for DrainingSignalWatch {
    async fn recv(&self) -> ShutdownSignal {
        let (Ok(mut quit), Ok(mut term), Ok(mut int)) = (
            signal(SignalKind::quit()),
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) else {
            // No signal handlers (cannot happen on a live Unix process): stop on Ctrl-C alone.
            let _ = tokio::signal::ctrl_c().await;
            return ShutdownSignal::FastShutdown;
        };
        tokio::select! {
            _ = quit.recv() => return ShutdownSignal::GracefulUpgrade,
            _ = int.recv() => return ShutdownSignal::FastShutdown,
            _ = term.recv() => {}
        }
        self.draining.start();
        tracing::info!(
            seconds = self.drain_for.as_secs(),
            "SIGTERM: draining (not ready, closing connections after each response)"
        );
        tokio::select! {
            _ = tokio::time::sleep(self.drain_for) => {}
            _ = int.recv() => return ShutdownSignal::FastShutdown,
        }
        tracing::info!("drained: closing the listeners; requests in flight may finish");
        ShutdownSignal::GracefulTerminate
    }
}
