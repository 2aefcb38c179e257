//! Upstreams: where a request goes, and what the backend is told about it.
//!
//! Addresses are resolved once at start-up (Pingora's `HttpPeer::new` would resolve, blocking,
//! on every request and panic on failure). `svc_test_` keys can never be sent to the live
//! backend: [`Upstreams::target`] has no path from `Test` to `Live`.

use http::header::{AUTHORIZATION, FORWARDED};
use http::{HeaderName, HeaderValue};
use pingora::http::RequestHeader;
use pingora::upstreams::peer::{HttpPeer, Peer};
use std::time::Duration;

use super::client_ip::X_FORWARDED_FOR;
use super::config::{resolve, UpstreamConfig};
use super::headers::{edit_request_headers, joint_values};
use crate::keys::{CachedKey, Environment};

/// Identity headers the gateway sets on every forwarded request (client values are replaced).
pub static IDENTITY_HEADERS: [HeaderName; 5] = [
    HeaderName::from_static("service-workspace"),
    HeaderName::from_static("service-key-id"),
    HeaderName::from_static("service-environment"),
    HeaderName::from_static("service-request-id"),
    HeaderName::from_static("service-token-id"),
];

/// Where a request is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// The production backend.
    Live,
    /// The sandbox backend, for test keys.
    Sandbox,
    /// The gateway's built-in simulated backend.
    Simulated,
}

/// The configured backends, pre-resolved, each with its configured address as a `Host` value
/// (for a request that came without one, [`super::framing`]).
pub struct Upstreams {
    live: Option<(HttpPeer, HeaderValue)>,
    sandbox: Option<(HttpPeer, HeaderValue)>,
}

impl Upstreams {
    /// Resolves the configured addresses; fails naming the one that does not resolve.
    pub fn from_config(config: &UpstreamConfig) -> Result<Self, String> {
        let peer = |addr: Option<&str>| -> Result<Option<(HttpPeer, HeaderValue)>, String> {
            let Some(addr) = addr else { return Ok(None) };
            let sockaddr = resolve(addr)?;
            // As configured (a name, for a backend that serves several), not as resolved.
            let host = HeaderValue::from_str(addr).map_err(|_| format!("{addr}: no Host value"))?;
            let mut peer = HttpPeer::new(sockaddr, false, String::new());
            let options = peer.get_mut_peer_options().expect("HttpPeer has options");
            options.connection_timeout = Some(Duration::from_millis(config.connect_timeout_ms));
            options.total_connection_timeout =
                Some(Duration::from_millis(config.connect_timeout_ms));
            options.read_timeout = Some(Duration::from_millis(config.read_timeout_ms));
            options.write_timeout = Some(Duration::from_millis(config.write_timeout_ms));
            // An idle pooled connection stays until the backend closes it (Pingora's default):
            // an idle timeout here would register a timer each time a connection goes back to
            // the pool, on every request.
            Ok(Some((peer, host)))
        };
        Ok(Self {
            live: peer(config.live_backend())?,
            sandbox: peer(config.sandbox_backend())?,
        })
    }

    /// Where requests of a key in `env` go.
    pub fn target(&self, env: Environment) -> Target {
        match env {
            Environment::Live | Environment::Scoped if self.live.is_some() => Target::Live,
            Environment::Test if self.sandbox.is_some() => Target::Sandbox,
            _ => Target::Simulated,
        }
    }

    /// The peer for a forwarding target; `None` for [`Target::Simulated`].
    pub fn peer(&self, target: Target) -> Option<&HttpPeer> {
        self.backend(target).map(|(peer, _)| peer)
    }

    /// The configured address of a forwarding target's backend, as a `Host` value.
    pub fn host(&self, target: Target) -> Option<&HeaderValue> {
        self.backend(target).map(|(_, host)| host)
    }

    fn backend(&self, target: Target) -> Option<&(HttpPeer, HeaderValue)> {
        match target {
            Target::Live => self.live.as_ref(),
            Target::Sandbox => self.sandbox.as_ref(),
            Target::Simulated => None,
        }
    }
}

/// A forwarded request's identity header values: the key's workspace, the key billed and its
/// environment, the request's id and, for a scoped token, the token's id.
pub struct Identity {
    /// `Service-Workspace`.
    pub workspace: HeaderValue,
    /// `Service-Key-Id`: the key billed (a scoped token's parent).
    pub key_id: HeaderValue,
    /// `Service-Environment`.
    pub environment: HeaderValue,
    /// `Service-Request-Id`.
    pub request_id: HeaderValue,
    /// `Service-Token-Id`, for a scoped token.
    pub token_id: Option<HeaderValue>,
}

impl Identity {
    /// The values for `key`'s request `request_id`, made together ([`joint_values`]).
    pub fn new(key: &CachedKey, request_id: &str) -> pingora::Result<Self> {
        Ok(Self::from_values(
            key,
            joint_values(Self::parts(key, request_id))?,
        ))
    }

    /// What the values are made of, in order: workspace, billed key, request id, token id
    /// (empty for a key).
    pub fn parts<'a>(key: &'a CachedKey, request_id: &'a str) -> [&'a [u8]; 4] {
        let token_id = match &key.scoped {
            Some(_) => key.id.as_bytes(),
            None => b"",
        };
        [
            key.workspace.as_bytes(),
            key.billed_key_id().as_bytes(),
            request_id.as_bytes(),
            token_id,
        ]
    }

    /// The identity of values made from [`Identity::parts`].
    pub fn from_values(key: &CachedKey, values: [HeaderValue; 4]) -> Self {
        let [workspace, key_id, request_id, token_id] = values;
        Self {
            workspace,
            key_id,
            environment: HeaderValue::from_static(key.effective_environment().as_str()),
            request_id,
            token_id: key.scoped.as_ref().map(|_| token_id),
        }
    }
}

/// Rewrites the request for the backend: drops the credential, states who is calling. For a
/// scoped token, `Service-Key-Id` names the parent key (the one billed) and `Service-Token-Id`
/// the token. `X-Forwarded-For` becomes `forwarded_for` ([`super::client_ip`]), or goes.
/// Header names go out without the client's capitalization ([`super::headers`]). The client's
/// other `Service-*` headers are gone already ([`super::hygiene`]).
pub fn set_identity_headers(
    req: &mut RequestHeader,
    identity: Identity,
    forwarded_for: Option<HeaderValue>,
) -> pingora::Result<()> {
    let [workspace, key_id, environment, request, token] = &IDENTITY_HEADERS;
    let token_id = identity.token_id;
    let identity = [
        (workspace, identity.workspace),
        (key_id, identity.key_id),
        (environment, identity.environment),
        (request, identity.request_id),
    ];
    // A client's own `Service-Token-Id` goes; a token's is replaced by the insert. So does
    // `X-Forwarded-For`, unless the gateway has one to send. The gateway's `X-Forwarded-For`
    // is the one statement of the client's address the backend gets: a client's `Forwarded`
    // and `X-Real-IP` go.
    let removed: &[&HeaderName] = match (token_id.is_some(), forwarded_for.is_some()) {
        (false, false) => &[
            &AUTHORIZATION,
            token,
            &X_FORWARDED_FOR,
            &FORWARDED,
            &X_REAL_IP,
        ],
        (false, true) => &[&AUTHORIZATION, token, &FORWARDED, &X_REAL_IP],
        (true, false) => &[&AUTHORIZATION, &X_FORWARDED_FOR, &FORWARDED, &X_REAL_IP],
        (true, true) => &[&AUTHORIZATION, &FORWARDED, &X_REAL_IP],
    };
    let token = token_id.map(|t| (token, t));
    let forwarded = forwarded_for.map(|v| (&X_FORWARDED_FOR, v));
    edit_request_headers(
        req,
        removed,
        &mut identity.into_iter().chain(token).chain(forwarded),
    )
}

/// The key's metadata, for backends that want it (`[upstream] forward_key_metadata`).
pub static SERVICE_KEY_METADATA: HeaderName = HeaderName::from_static("service-key-metadata");

/// Sets `Service-Key-Metadata` to `json`: the key's metadata as compact JSON of visible ASCII
/// ([`crate::keys::settings::header_json`]).
pub fn set_key_metadata(req: &mut RequestHeader, json: &str) -> pingora::Result<()> {
    let value = HeaderValue::from_str(json).map_err(|_| {
        pingora::Error::explain(
            pingora::ErrorType::InternalError,
            "metadata is no header value",
        )
    })?;
    req.insert_header(&SERVICE_KEY_METADATA, value)
}

/// A client address some backends read (nginx's `real_ip_header`, many frameworks).
static X_REAL_IP: HeaderName = HeaderName::from_static("x-real-ip");

#[cfg(test)]
mod tests {
    use super::*;

    fn upstreams(live: bool, sandbox: bool) -> Upstreams {
        Upstreams::from_config(&UpstreamConfig {
            live: live.then(|| "127.0.0.1:9000".to_string()),
            sandbox: sandbox.then(|| "127.0.0.1:9001".to_string()),
            ..UpstreamConfig::default()
        })
        .unwrap()
    }

    #[test]
    fn test_keys_never_target_live() {
        for (live, sandbox) in [(true, true), (true, false), (false, true), (false, false)] {
            let u = upstreams(live, sandbox);
            assert_ne!(u.target(Environment::Test), Target::Live);
        }
        assert_eq!(
            upstreams(true, false).target(Environment::Test),
            Target::Simulated
        );
        assert_eq!(
            upstreams(true, true).target(Environment::Test),
            Target::Sandbox
        );
        assert_eq!(
            upstreams(true, true).target(Environment::Live),
            Target::Live
        );
        assert_eq!(
            upstreams(false, true).target(Environment::Live),
            Target::Simulated
        );
        assert!(upstreams(false, false).peer(Target::Simulated).is_none());
    }

    #[test]
    fn unresolvable_addresses_are_refused() {
        let err = Upstreams::from_config(&UpstreamConfig {
            live: Some("no-such-host.invalid:80".into()),
            ..UpstreamConfig::default()
        });
        assert!(err.is_err());
    }
}
