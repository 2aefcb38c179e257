//! Test harness: a real `svcgate` process on loopback ports, real backends that record what
//! they receive, and an admin client. Each test starts its own gateway, so tests share nothing.
// Each test binary compiles the whole harness and uses part of it.
#![allow(dead_code, unused_imports)]

mod builder;
mod certs;
mod cli;
mod gateway;
mod http;
mod namespace;
mod otlp;
mod ports;
mod receiver;
mod redis_server;
mod smtp;
mod upstream;

pub use builder::{on_redis, replicas, GatewayBuilder};
pub use certs::Certificates;
pub use cli::{svcgate_command, Worker};
pub use gateway::Gateway;
pub use http::{assert_error, call};
pub use namespace::{redis_url, TestNamespace};
pub use otlp::{ExportedSpan, OtlpCollector};
pub use ports::{eventually, free_port, free_ports, wait_for_port};
pub use receiver::{expected_signature, Received, Receiver, Reply};
pub use redis_server::RedisServer;
pub use smtp::{Mail, SmtpSink};
pub use upstream::{broken_upstream, RawBackend, Recorded, RecordingUpstream};

/// The admin token every test gateway uses.
pub const ADMIN_TOKEN: &str = "test-admin-token";
/// The workspace the in-memory store starts with.
pub const DEMO_WS: &str = "ws_demo";
