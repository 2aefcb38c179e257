//! Webhook endpoints: where a workspace wants its events, and which ones.

use serde::{Deserialize, Serialize};
use std::net::IpAddr;

use crate::events::EVENT_TYPES;
use crate::keys::format::find_keys;
use crate::keys::Environment;
pub use crate::shared::net::is_internal;

/// Most endpoints a workspace may have in each environment: each is a fan-out target of every
/// matching event and a queue for the workers.
pub const MAX_ENDPOINTS_PER_WORKSPACE: usize = 100;

/// A customer endpoint. Holds its signing secret: the worker needs it to sign.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Endpoint {
    /// `we_…`
    pub id: String,
    /// Owner.
    pub workspace: String,
    /// `live` or `test`: an endpoint receives only events of its own environment.
    pub environment: Environment,
    /// Where deliveries are POSTed.
    pub url: String,
    /// Event names and `resource.*` wildcards.
    pub events: Vec<String>,
    /// `whsec_…`: shown once, at creation (and at each rotation).
    pub secret: String,
    /// `active`, `paused` or `disabled`.
    pub status: EndpointStatus,
    /// Unix seconds.
    pub created_at: u64,
    /// How deliveries are signed and which headers carry the signature.
    #[serde(default)]
    pub format: WebhookFormat,
    /// The secret a rotation replaced: it signs too, beside [`Self::secret`], until
    /// [`Self::previous_secret_until`], so receivers can switch over without losing a delivery.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_secret: Option<String>,
    /// When the previous secret stops signing (unix seconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_secret_until: Option<u64>,
    /// Most deliveries per second to this endpoint, across every worker; none: no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit_per_second: Option<u32>,
}

/// How an endpoint's deliveries are signed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum WebhookFormat {
    /// `Service-Signature` (hex HMAC-SHA256 of `<timestamp>.<body>`), `Service-Timestamp`,
    /// `Service-Event-Id`, as the service interface describes.
    #[default]
    Service,
    /// The Standard Webhooks headers `webhook-id`, `webhook-timestamp` and
    /// `webhook-signature` (`v1,<base64>` of HMAC-SHA256 over `<id>.<timestamp>.<body>`, keyed
    /// with the base64-decoded secret), which the official Standard Webhooks libraries verify.
    StandardWebhooks,
}

impl WebhookFormat {
    /// The name used in JSON.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Service => "service",
            Self::StandardWebhooks => "standard-webhooks",
        }
    }
}

/// Whether an endpoint gets deliveries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum EndpointStatus {
    /// Deliveries go out.
    Active,
    /// Every retry failed; nothing goes out until it is resumed.
    Paused,
    /// The receiver answered 410 Gone; nothing goes out until it is resumed.
    Disabled,
}

impl EndpointStatus {
    /// The name used in JSON.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Active => "active",
            Self::Paused => "paused",
            Self::Disabled => "disabled",
        }
    }
}

impl Endpoint {
    /// Whether the endpoint subscribes to `event_type`.
    pub fn wants(&self, event_type: &str) -> bool {
        self.events.iter().any(|f| matches_filter(f, event_type))
    }

    /// The secrets that sign a delivery at `now` (unix seconds): the current one first, then
    /// the one a rotation replaced while its grace period lasts.
    pub fn signing_secrets(&self, now: u64) -> Vec<&str> {
        let mut secrets = vec![self.secret.as_str()];
        if let (Some(old), Some(until)) = (&self.previous_secret, self.previous_secret_until) {
            if now < until {
                secrets.push(old);
            }
        }
        secrets
    }

    /// Replaces the secret with `secret`; the old one keeps signing for `grace_secs`.
    pub fn rotate_secret(&mut self, secret: String, grace_secs: u64, now: u64) {
        let old = std::mem::replace(&mut self.secret, secret);
        (self.previous_secret, self.previous_secret_until) = match grace_secs {
            0 => (None, None),
            _ => (Some(old), Some(now.saturating_add(grace_secs))),
        };
    }

    /// Forgets the rotated-out secret once its grace period is over at `now`: it signs
    /// nothing any more, and is not kept longer than it is needed.
    pub fn drop_expired_secret(&mut self, now: u64) {
        if self.previous_secret_until.is_some_and(|until| until <= now) {
            (self.previous_secret, self.previous_secret_until) = (None, None);
        }
    }

    /// Whether its status lets deliveries go out.
    pub fn is_active(&self) -> bool {
        self.status == EndpointStatus::Active
    }
}

/// Whether `filter` (an event name or `resource.*`) covers `event_type`.
pub fn matches_filter(filter: &str, event_type: &str) -> bool {
    match filter.strip_suffix(".*") {
        Some(resource) => event_type
            .strip_prefix(resource)
            .is_some_and(|rest| rest.starts_with('.')),
        None => filter == event_type,
    }
}

/// Checks an event filter: a known event name, or a wildcard over a known resource.
pub fn check_filter(filter: &str) -> Result<(), String> {
    let known = match filter.strip_suffix(".*") {
        Some(resource) => {
            !resource.is_empty() && EVENT_TYPES.iter().any(|t| matches_filter(filter, t))
        }
        None => EVENT_TYPES.contains(&filter),
    };
    if known {
        Ok(())
    } else {
        Err(format!(
            "'{filter}' is not an event name or a resource wildcard such as agent.run.*"
        ))
    }
}

/// A new signing secret: `whsec_` and 32 random base62 characters (≈190 bits).
///
/// The 32 characters are also valid base64 (of 24 bytes), so an endpoint switched to the
/// Standard Webhooks format keeps a secret its libraries read.
pub fn new_secret() -> String {
    use rand::distr::{Alphanumeric, SampleString};
    let mut s = String::from("whsec_");
    Alphanumeric.append_string(&mut rand::rng(), &mut s, 32);
    s
}

/// A new signing secret for an endpoint of `format`: for the Standard Webhooks format,
/// `whsec_` and the base64 of 32 random bytes, as its specification asks; otherwise
/// [`new_secret`].
pub fn new_secret_for(format: WebhookFormat) -> String {
    use base64::Engine;
    use rand::RngCore;
    match format {
        WebhookFormat::Service => new_secret(),
        WebhookFormat::StandardWebhooks => {
            let mut key = [0u8; 32];
            rand::rng().fill_bytes(&mut key);
            format!(
                "whsec_{}",
                base64::engine::general_purpose::STANDARD.encode(key)
            )
        }
    }
}

/// `raw` with its percent-escapes decoded (split at `&` and `=`, which keys never hold).
fn percent_decoded(raw: &str) -> Vec<u8> {
    url::form_urlencoded::parse(raw.as_bytes())
        .flat_map(|(k, v)| {
            let mut pair = k.into_owned().into_bytes();
            pair.push(b' ');
            pair.extend(v.as_bytes());
            pair.push(b' ');
            pair
        })
        .collect()
}

/// How long [`check_url`] waits for a host name to resolve.
pub const RESOLVE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Checks an endpoint URL. Without `allow_insecure`, it must be `https://` and must not name a
/// private, loopback, link-local or otherwise internal address — as an IP literal or through
/// what its host name resolves to now. (The worker checks the address it actually dials too,
/// so a name that later resolves elsewhere does not get through.)
///
/// The name is resolved asynchronously ([`super::dns`]; a gateway worker thread serves every
/// request) and for at most [`RESOLVE_TIMEOUT`]: a name server that does not answer gets the
/// caller a 400, holds up nobody else, and the lookup ends there.
pub async fn check_url(raw: &str, allow_insecure: bool) -> Result<url::Url, String> {
    let url = url::Url::parse(raw).map_err(|e| format!("not a URL: {e}"))?;
    if raw.len() > 2048 {
        return Err("a URL is at most 2048 characters".into());
    }
    match url.scheme() {
        "https" => {}
        "http" if allow_insecure => {}
        _ => return Err("the URL must be https://".into()),
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err("the URL must not carry credentials".into());
    }
    // Decoded too: `%5F` hides the `_` of a key's prefix from a plain search.
    let decoded = percent_decoded(raw);
    if find_keys(raw.as_bytes()).next().is_some() || find_keys(&decoded).next().is_some() {
        crate::metrics::record_leak("webhook", "refused");
        return Err(
            "the URL holds an API key or token (svc_…): it would be stored and shown \
                    with the endpoint; put no credential in a webhook URL"
                .into(),
        );
    }
    let host = url.host().ok_or("the URL has no host")?;
    // Nothing listens on port 0, in development or not: such an endpoint could never be
    // delivered to.
    if url.port() == Some(0) {
        return Err(
            "the URL's port must be 1-65535; nothing can receive deliveries on port 0".into(),
        );
    }
    if allow_insecure {
        return Ok(url);
    }
    let addrs: Vec<IpAddr> = match host {
        url::Host::Ipv4(ip) => vec![IpAddr::V4(ip)],
        url::Host::Ipv6(ip) => vec![IpAddr::V6(ip)],
        url::Host::Domain(name) => {
            match tokio::time::timeout(RESOLVE_TIMEOUT, super::dns::lookup(name)).await {
                Ok(Ok(addrs)) => addrs,
                Ok(Err(_)) => return Err(format!("the host '{name}' does not resolve")),
                Err(_) => return Err(format!("the host '{name}' did not resolve in time")),
            }
        }
    };
    if let Some(ip) = addrs.iter().find(|ip| is_internal(ip)) {
        return Err(format!(
            "the URL points at an internal address ({ip}); endpoints must be public"
        ));
    }
    Ok(url)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_match_names_and_resource_wildcards() {
        assert!(matches_filter("agent.run.*", "agent.run.completed"));
        assert!(matches_filter("agent.run.completed", "agent.run.completed"));
        assert!(!matches_filter("agent.run.*", "agent.runner.completed"));
        assert!(!matches_filter("agent.*", "key.auto_revoked"));
        assert!(matches_filter("agent.*", "agent.run.failed"));
        for ok in [
            "agent.run.*",
            "image.batch.*",
            "key.auto_revoked",
            "billing.credits.low",
            "agent.*",
        ] {
            assert!(check_filter(ok).is_ok(), "{ok}");
        }
        for bad in [
            "*",
            ".*",
            "agent.run",
            "agent.run.exploded",
            "nope.*",
            "agent.run.**",
            "",
        ] {
            assert!(check_filter(bad).is_err(), "{bad}");
        }
    }

    #[tokio::test]
    async fn internal_addresses_are_refused() {
        for url in [
            "https://127.0.0.1/hook",
            "https://10.1.2.3/hook",
            "https://169.254.169.254/latest/meta-data",
            "https://192.168.0.1/",
            "https://172.16.5.4/",
            "https://[::1]/",
            "https://[fd00::1]/",
            "https://[::ffff:127.0.0.1]/",
            "https://[::10.0.0.5]/",
            "https://[64:ff9b::a00:5]/x",
            "https://[64:ff9b::a9fe:a9fe]/latest/meta-data",
            "https://[64:ff9b:1::5]/",
            "https://[2002:a00:5::1]/",
            "https://[fec0::1]/",
            "https://[::ffff:0:a00:5]/",
            "https://[2001:0:4136:e378:8000:63bf:3fff:fdd2]/",
            "https://[2001:db8::1]/",
            "https://[100::1]/",
            "https://192.0.0.8/",
            "https://0.0.0.0/",
            "https://localhost/hook",
            "http://example.com/hook",
            "ftp://example.com/",
            "not a url",
            "https://user:pass@example.com/",
        ] {
            assert!(check_url(url, false).await.is_err(), "{url}");
        }
        assert!(check_url("https://93.184.216.34/hook", false).await.is_ok());
        // The same translations of a public address are public.
        assert!(check_url("https://[64:ff9b::5db8:d822]/hook", false)
            .await
            .is_ok());
        assert!(check_url("https://[2002:5db8:d822::1]/hook", false)
            .await
            .is_ok());
        assert!(check_url("https://[::ffff:0:5db8:d822]/hook", false)
            .await
            .is_ok());
        // Global unicast in 2001::/16 outside Teredo and documentation stays public.
        assert!(check_url("https://[2001:4860::8888]/hook", false)
            .await
            .is_ok());
        assert!(check_url("http://127.0.0.1:9999/hook", true).await.is_ok());
    }

    #[tokio::test]
    async fn port_zero_is_refused_even_when_insecure_targets_are_allowed() {
        for (url, allow_insecure) in [
            ("https://8.8.8.8:0/x", false),
            ("https://example.com:0/x", false),
            ("https://[2001:4860:4860::8888]:0/", false),
            ("http://127.0.0.1:0/hook", true),
        ] {
            let err = check_url(url, allow_insecure).await.unwrap_err();
            assert!(err.contains("port"), "{url}: {err}");
        }
        assert!(check_url("https://8.8.8.8:8443/x", false).await.is_ok());
        assert!(check_url("http://127.0.0.1:1/hook", true).await.is_ok());
    }

    #[test]
    fn secrets_are_prefixed_and_random() {
        use base64::Engine;
        let a = new_secret();
        assert!(a.starts_with("whsec_") && a.len() == 38);
        assert_ne!(a, new_secret());
        let b64 = base64::engine::general_purpose::STANDARD;
        for secret in [a, new_secret_for(WebhookFormat::StandardWebhooks)] {
            let key = b64.decode(&secret["whsec_".len()..]).unwrap();
            assert!((24..=64).contains(&key.len()), "{secret}");
        }
    }

    #[test]
    fn a_rotated_secret_signs_beside_the_new_one_until_its_grace_ends() {
        let mut e: Endpoint = serde_json::from_value(serde_json::json!({
            "id": "we_1", "workspace": "ws_1", "environment": "live",
            "url": "https://example.com/", "events": ["agent.run.*"], "secret": "whsec_old",
            "status": "active", "created_at": 1
        }))
        .unwrap();
        assert_eq!(e.format, WebhookFormat::Service);
        assert_eq!(e.signing_secrets(100), ["whsec_old"]);
        e.rotate_secret("whsec_new".into(), 60, 100);
        assert_eq!(e.signing_secrets(100), ["whsec_new", "whsec_old"]);
        assert_eq!(e.signing_secrets(159), ["whsec_new", "whsec_old"]);
        assert_eq!(e.signing_secrets(160), ["whsec_new"]);
        e.drop_expired_secret(159);
        assert_eq!(e.previous_secret.as_deref(), Some("whsec_old"));
        e.drop_expired_secret(160);
        assert_eq!((&e.previous_secret, e.previous_secret_until), (&None, None));
        e.rotate_secret("whsec_newer".into(), 0, 200);
        assert_eq!(e.signing_secrets(200), ["whsec_newer"]);
    }
}
