//! Upgraded connections (a WebSocket) on a route that takes them (`upgrade = true`).
//!
//! The upgrade request is admitted like any other (authenticated, scoped, rate-limited,
//! budgeted); once the backend answers `101`, the connection is a tunnel of bytes both ways.
//! Its audit record is written when it closes, with how long it was open and the bytes that
//! went through it each way.

use std::time::Instant;

use crate::metering::audit::Tunnel;

/// Counts what goes through an open tunnel.
#[derive(Debug)]
pub struct TunnelMeter {
    opened: Instant,
    from_client: u64,
    to_client: u64,
}

impl TunnelMeter {
    /// A tunnel opened now (the backend's `101`).
    pub fn open() -> Self {
        Self {
            opened: Instant::now(),
            from_client: 0,
            to_client: 0,
        }
    }

    /// `n` bytes went from the client to the backend.
    pub fn from_client(&mut self, n: usize) {
        self.from_client += n as u64;
    }

    /// `n` bytes went from the backend to the client.
    pub fn to_client(&mut self, n: usize) {
        self.to_client += n as u64;
    }

    /// The tunnel closed: what went through it.
    pub fn finish(self) -> Tunnel {
        Tunnel {
            duration_ms: self.opened.elapsed().as_millis() as u64,
            bytes_from_client: self.from_client,
            bytes_to_client: self.to_client,
        }
    }
}
