//! Stopping without refusing traffic.
//!
//! When a pod is deleted, Kubernetes sends SIGTERM and takes the pod out of its Services at the
//! same moment; load balancers and kube-proxy learn of it a few seconds later and keep sending
//! new connections until then. So on SIGTERM svcgate first *drains*: for
//! `server.shutdown_grace_seconds` it keeps accepting and serving, `/readyz` answers 503 and
//! every response closes its connection (clients reconnect to a replica that stays). Only
//! then are the listeners closed; requests in flight get `server.shutdown_timeout_seconds`
//! to finish. SIGINT stops at once, also in the middle of a drain; SIGQUIT hands the
//! listeners to a new process (graceful upgrade), which needs no drain, once one waits for
//! them (a SIGQUIT with no `serve -u` listening on the upgrade socket is refused: the process
//! serves on). SIGHUP is ignored: the configuration is not re-read (upgrade instead).

use async_trait::async_trait;
use pingora::server::{ShutdownSignal, ShutdownSignalWatch};
use std::path::PathBuf;
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
    upgrade_sock: PathBuf,
}

impl DrainingSignalWatch {
    /// A watch that drains for `drain_for` after SIGTERM and reports it through `draining`,
    /// and hands over on SIGQUIT once a new process listens on `upgrade_sock`.
    pub fn new(draining: Draining, drain_for: Duration, upgrade_sock: PathBuf) -> Self {
        Self {
            draining,
            drain_for,
            upgrade_sock,
        }
    }
}

/// Whether a process listens on the Unix socket bound at `path`, by Linux's socket table
/// (`/proc/net/unix`); assumed where there is none. Connecting to find out would not do: the
/// new process takes the first connection for the hand-over.
fn upgrade_waiting(path: &std::path::Path) -> bool {
    match std::fs::read_to_string("/proc/net/unix") {
        Ok(table) => listening_at(&table, &path.to_string_lossy()),
        Err(_) => true,
    }
}

/// Whether `table` (`/proc/net/unix`) has a listening socket bound at `path`.
fn listening_at(table: &str, path: &str) -> bool {
    /// `__SO_ACCEPTCON`: the socket listens.
    const LISTENING: &str = "00010000";
    table.lines().skip(1).any(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        fields.get(3) == Some(&LISTENING) && fields.get(7) == Some(&path)
    })
}

#[async_trait]
impl ShutdownSignalWatch for DrainingSignalWatch {
    async fn recv(&self) -> ShutdownSignal {
        let (Ok(mut quit), Ok(mut term), Ok(mut int), Ok(mut hup)) = (
            signal(SignalKind::quit()),
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
            signal(SignalKind::hangup()),
        ) else {
            // No signal handlers (cannot happen on a live Unix process): stop on Ctrl-C alone.
            let _ = tokio::signal::ctrl_c().await;
            return ShutdownSignal::FastShutdown;
        };
        loop {
            tokio::select! {
                _ = quit.recv() => {
                    if upgrade_waiting(&self.upgrade_sock) {
                        return ShutdownSignal::GracefulUpgrade;
                    }
                    tracing::error!(
                        socket = %self.upgrade_sock.display(),
                        "SIGQUIT refused: no new process waits for the listeners (start `svcgate serve -u` first, then send SIGQUIT); serving on"
                    );
                }
                _ = hup.recv() => tracing::warn!(
                    "SIGHUP ignored: the configuration is not re-read (start `svcgate serve -u` and send this process SIGQUIT)"
                ),
                _ = int.recv() => return ShutdownSignal::FastShutdown,
                _ = term.recv() => break,
            }
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

#[cfg(test)]
mod tests {
    use super::listening_at;

    #[test]
    fn a_listening_upgrade_socket_is_found_in_the_socket_table() {
        let table = "Num       RefCount Protocol Flags    Type St Inode Path
0000000000000000: 00000002 00000000 00010000 0001 01 41214 /tmp/svcgate_upgrade.sock
0000000000000000: 00000003 00000000 00000000 0001 03 41300 /tmp/other.sock
0000000000000000: 00000002 00000000 00000000 0001 01 41301 /tmp/bound_only.sock
0000000000000000: 00000003 00000000 00000000 0001 03 41302
";
        assert!(listening_at(table, "/tmp/svcgate_upgrade.sock"));
        assert!(
            !listening_at(table, "/tmp/other.sock"),
            "connected, not listening"
        );
        assert!(
            !listening_at(table, "/tmp/bound_only.sock"),
            "bound, not listening"
        );
        assert!(!listening_at(table, "/tmp/missing.sock"));
    }
}
