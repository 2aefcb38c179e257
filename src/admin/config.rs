//! The admin API's setting in `[server]`: its token, and the checks on it.

use std::net::SocketAddr;

use crate::shared::problem::Problem;

/// The admin token of the zero-config demo; refused on a non-loopback admin address.
pub const DEMO_ADMIN_TOKEN: &str = "change-me";

/// The shortest admin token accepted with a shared store.
pub const MIN_SHARED_TOKEN_CHARS: usize = 16;

/// Checks `server.admin_token` for a process that serves the admin API. `admin_listen` is the
/// admin listener's address (if it is one); with a shared store (`shared_store`, production) a
/// placeholder token, or one shorter than [`MIN_SHARED_TOKEN_CHARS`], is refused.
pub fn validate_admin_token(
    token: &str,
    admin_listen: Option<SocketAddr>,
    shared_store: bool,
) -> Vec<Problem> {
    let mut problems = Vec::new();
    let placeholder = token.to_ascii_lowercase().contains("change-me");
    if token.trim().is_empty() {
        problems.push(Problem::new("server.admin_token", "must not be empty"));
    } else if token.trim() != token {
        // No `Authorization` header can carry it: every admin call would be refused.
        problems.push(Problem::new(
            "server.admin_token",
            "starts or ends with whitespace (a trailing newline from a Secret made from a \
             file?); no request can present it",
        ));
    } else if placeholder && shared_store {
        // A shared store is production: a token copied from an example (the Secret's
        // `CHANGE-ME-…`) is known to everyone, the model container next door included.
        problems.push(Problem::new(
            "server.admin_token",
            "is a placeholder ('change-me'); set SVCGATE_SERVER_ADMIN_TOKEN to a random secret",
        ));
    } else if shared_store && token.chars().count() < MIN_SHARED_TOKEN_CHARS {
        // A shared store is reachable from every replica's network: a short token is guessed.
        problems.push(Problem::new(
            "server.admin_token",
            format!(
                "is shorter than {MIN_SHARED_TOKEN_CHARS} characters, too easy to guess on a \
                 shared store; set SVCGATE_SERVER_ADMIN_TOKEN to a random secret \
                 (openssl rand -hex 32)"
            ),
        ));
    } else if token == DEMO_ADMIN_TOKEN {
        if let Some(addr) = admin_listen {
            if !addr.ip().is_loopback() {
                problems.push(Problem::new(
                    "server.admin_token",
                    "the demo token 'change-me' is only allowed on a loopback admin_listen; \
                     set SVCGATE_SERVER_ADMIN_TOKEN",
                ));
            }
        }
    }
    problems
}
