//! The key change log in Redis, and the channel that tells every replica of a change.

use redis::Script;
use std::sync::{Arc, LazyLock};
use std::time::Duration;
use tokio::sync::Notify;

use super::connection::Connections;
use super::*;
use crate::keys::directory::MintedTokens;

/// Log entries kept for replicas catching up after a disconnect.
pub(super) const CHANGE_LOG_LEN: usize = 100_000;

/// Most changes one catch-up reads; a replica further behind drops its whole cache instead.
pub(super) const CATCH_UP_MAX: u64 = 10_000;

/// Reads the changes after an epoch. KEYS: epoch, log. ARGV: since, max, the mark the caller
/// read with `since`. Returns `{epoch, mark}` (nothing new), `{epoch, mark, 'reset'}` (history
/// gone, or not the one the caller read), or `{epoch, mark, hash, hash, …}`.
///
/// Each entry carries a random mark, and a reader keeps the mark of the entry at its epoch:
/// after a failover that lost the last writes, or a restore from an older copy, the same
/// epoch names another change, and only the mark tells. (Entries written before marks read
/// as `0`; an entry that is gone as `-`.)
pub(super) static CHANGES_SINCE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/changes_since.lua")));

/// How often the key-change subscription is asked whether it still answers.
pub(super) const SUBSCRIPTION_CHECK: Duration = Duration::from_secs(5);

/// How long that answer may take before the subscription is opened anew.
pub(super) const SUBSCRIPTION_PING_TIMEOUT: Duration = Duration::from_secs(3);

/// The channels [`listen_for_changes`] subscribes to.
pub(super) struct Channels {
    /// Key changes: the new epoch.
    pub(super) changed: String,
    /// Tokens minted: `<digest hex> <expires_at>`.
    pub(super) minted: String,
    /// Not a channel: the set of live tokens, read after subscribing to `minted`.
    pub(super) live_tokens: String,
}

/// Subscribes to the change channel and wakes the key cache for every message, and once after
/// every (re)subscription so anything missed while disconnected is caught up; and to the tokens
/// channel, whose messages go to `minted`, as do the live tokens, read after each subscription
/// to it (a channel refused is asked for again at every PING below). Resubscribes on the new
/// master when Sentinel moves it, and when the subscription stops answering a PING; ends with
/// the store.
pub(super) async fn listen_for_changes(
    connections: std::sync::Weak<Connections>,
    channels: Channels,
    changed: Arc<Notify>,
    minted: Arc<MintedTokens>,
) {
    use futures_util::StreamExt;
    let mut backoff = Duration::from_millis(100);
    let mut tokens = TokensFeed {
        channels: &channels,
        minted: &minted,
        hearing: false,
        refused: false,
    };
    loop {
        let Some((client, mut conn, mut moved)) = connections
            .upgrade()
            .map(|c| (c.client(), c.manager(), c.moved()))
        else {
            return;
        };
        moved.mark_unchanged();
        match client.get_async_pubsub().await {
            Ok(pubsub) => {
                let (mut sink, mut messages) = pubsub.split();
                match sink.subscribe(&channels.changed).await {
                    Ok(()) => {
                        backoff = Duration::from_millis(100);
                        // Apart: a Redis user may be allowed one channel and not the other.
                        tokens.subscribe(&mut sink, &mut conn).await;
                        changed.notify_one();
                        // A subscriber only reads: a connection that stays open and carries
                        // nothing (a NAT or proxy that dropped the flow) would go unnoticed.
                        let mut check = tokio::time::interval_at(
                            tokio::time::Instant::now() + SUBSCRIPTION_CHECK,
                            SUBSCRIPTION_CHECK,
                        );
                        loop {
                            tokio::select! {
                                message = messages.next() => match message {
                                    Some(m) if m.get_channel_name() == channels.minted => {
                                        heard_of_token(&minted, m.get_payload_bytes());
                                    }
                                    Some(_) => changed.notify_one(),
                                    None => {
                                        tracing::warn!("key change subscription lost; reconnecting");
                                        break;
                                    }
                                },
                                _ = check.tick() => {
                                    let pong = tokio::time::timeout(
                                        SUBSCRIPTION_PING_TIMEOUT,
                                        sink.ping::<redis::Value>(),
                                    );
                                    if !matches!(pong.await, Ok(Ok(_))) {
                                        tracing::warn!(
                                            "key change subscription stopped answering; reconnecting"
                                        );
                                        break;
                                    }
                                    // A channel refused may have been allowed since.
                                    if !tokens.hearing {
                                        tokens.subscribe(&mut sink, &mut conn).await;
                                    }
                                }
                                // The master moved, or the store is gone.
                                _ = moved.changed() => break,
                            }
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "cannot subscribe to key changes"),
                }
            }
            Err(e) => tracing::debug!(error = %e, "cannot connect for key changes"),
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(2));
    }
}

/// A random mark for a change-log entry ([`CHANGES_SINCE`]).
pub(super) fn new_mark() -> String {
    crate::ids::new_id("m")
}
