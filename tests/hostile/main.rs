//! A hostile client's requests, against real gateway processes: what it sends the backend
//! must not act on, and what it tries on the admin API must not get it in.

mod admin;
#[path = "../common/mod.rs"]
mod common;
mod refused;
mod smuggling;
mod tokens;
mod tunnel;
mod upstream;

use std::io::{Read, Write};

use common::Gateway;

/// Sends `request` as it is to `base` (`http://host:port`) on a new connection, and reads the
/// answer until the connection closes or goes quiet.
async fn raw(base: &str, request: String) -> String {
    let addr = base.trim_start_matches("http://").to_string();
    tokio::task::spawn_blocking(move || {
        let mut conn = std::net::TcpStream::connect(&addr).unwrap();
        conn.set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .unwrap();
        conn.write_all(request.as_bytes()).unwrap();
        let mut answer = Vec::new();
        let _ = conn.read_to_end(&mut answer);
        String::from_utf8_lossy(&answer).into_owned()
    })
    .await
    .unwrap()
}

/// The status of a raw answer.
fn status(answer: &str) -> u16 {
    answer
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {answer:?}"))
}

/// The JSON body of a raw answer.
fn body(answer: &str) -> serde_json::Value {
    let body = answer.split("\r\n\r\n").nth(1).unwrap_or_default();
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {answer}"))
}

/// The gateway's address, for a raw request's `Host`.
fn host_of(gw: &Gateway) -> &str {
    gw.base.trim_start_matches("http://")
}
