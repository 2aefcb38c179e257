//! Scoped tokens and idempotency salts in Redis, and the tokens channel a key directory
//! follows.

use redis::aio::ConnectionManager;
use redis::Script;
use std::sync::LazyLock;

use super::*;
use crate::keys::directory::MintedTokens;
use crate::keys::KeyHash;

/// Stores a scoped token by digest, and by id (so a token can be shown and revoked like a key),
/// for `ttl` seconds, unless its digest is taken (0), and tells every replica of it: on the
/// tokens channel (best effort: a Redis user not allowed the channel still mints), and in the
/// set of live tokens, which a replica reads when it subscribes (pub/sub keeps no backlog; the
/// set drops the expired, and lives as long as its longest-lived token). KEYS: by digest, by
/// id, the live tokens. ARGV: record JSON, digest hex, ttl, the tokens channel, its expiry, the
/// time (unix seconds).
pub(super) static INSERT_TOKEN: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/insert_token.lua")));

/// A value set once: KEYS[1] if it exists, else ARGV[1], stored for ARGV[2] seconds.
pub(super) static GET_OR_SET: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/get_or_set.lua")));

/// Notes a token minted, from a tokens-channel message (`<digest hex> <expires_at>`); anything
/// else is ignored.
pub(super) fn heard_of_token(minted: &MintedTokens, payload: &[u8]) {
    let text = std::str::from_utf8(payload).unwrap_or_default();
    let mut parts = text.split(' ');
    let hash = parts.next().and_then(KeyHash::from_hex);
    let expires_at = parts.next().and_then(|e| e.parse().ok());
    if let (Some(hash), Some(expires_at)) = (hash, expires_at) {
        minted.add(&hash, expires_at);
    }
}

/// Live tokens read by one `ZSCAN` ([`read_live_tokens`]).
pub(super) const LIVE_TOKENS_SCAN: usize = 1_000;

/// Adds to `minted` the scoped tokens in the set of live tokens `key` that have not expired:
/// read after subscribing to the tokens channel, it finds every token minted before (while this
/// replica was not subscribed: pub/sub keeps no backlog), and the channel every token after.
pub(super) async fn read_live_tokens(
    conn: &mut ConnectionManager,
    key: &str,
    minted: &MintedTokens,
) -> Result<(), redis::RedisError> {
    let now = crate::ids::unix_now();
    let mut cursor = 0u64;
    loop {
        let (next, page): (u64, Vec<(String, f64)>) = redis::cmd("ZSCAN")
            .arg(key)
            .arg(cursor)
            .arg("COUNT")
            .arg(LIVE_TOKENS_SCAN)
            .query_async(conn)
            .await?;
        for (hex, expires_at) in page {
            let expires_at = expires_at as u64;
            match KeyHash::from_hex(&hex) {
                Some(hash) if expires_at > now => minted.add(&hash, expires_at),
                _ => {}
            }
        }
        if next == 0 {
            return Ok(());
        }
        cursor = next;
    }
}

/// The tokens channel's part of [`listen_for_changes`].
pub(super) struct TokensFeed<'a> {
    pub(super) channels: &'a Channels,
    pub(super) minted: &'a MintedTokens,
    /// Whether the current subscription includes the channel.
    pub(super) hearing: bool,
    /// Whether the channel was refused last time: a run of refusals is logged once.
    pub(super) refused: bool,
}

impl TokensFeed<'_> {
    /// Subscribes `sink` (a subscription already up) to the tokens channel, then reads the
    /// live tokens over `conn` (a token minted meanwhile is in one or both).
    pub(super) async fn subscribe(
        &mut self,
        sink: &mut redis::aio::PubSubSink,
        conn: &mut ConnectionManager,
    ) {
        self.hearing = match sink.subscribe(&self.channels.minted).await {
            Ok(()) => true,
            Err(e) => {
                if !std::mem::replace(&mut self.refused, true) {
                    let again_in_secs = SUBSCRIPTION_CHECK.as_secs();
                    tracing::warn!(error = %e, again_in_secs, "cannot subscribe to scoped tokens minted; meanwhile the key directory lists those its listings find");
                }
                false
            }
        };
        if !self.hearing {
            return;
        }
        if std::mem::take(&mut self.refused) {
            tracing::info!("subscribed to scoped tokens minted");
        }
        if let Err(e) = read_live_tokens(conn, &self.channels.live_tokens, self.minted).await {
            tracing::warn!(error = %e, "cannot read the scoped tokens minted before subscribing; the key directory lists those its listings find");
        }
    }
}
