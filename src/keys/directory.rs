//! The key directory: every key the store holds, by digest, in each replica's memory.
//!
//! The key cache holds the keys in use; the directory only says which digests exist. It lets
//! the request path tell a key new to this replica from a made-up one without asking the store,
//! so a client inventing keys cannot make a real key wait (the unknown-key limit, which keeps
//! such a flood off the store, then holds up made-up keys only).
//!
//! Eight bytes of each digest are kept (SHA-256 output is uniform, and a client cannot aim at a
//! digest it does not know): 24 MB of resident memory for a million keys. Filled by listing the
//! store once (in pages, in the background) and from the change log the cache follows, which
//! names every key written; filled again whenever the cache must start over on the change log
//! (the store lost writes, or the log no longer reaches back), since the keys written in the gap
//! are named nowhere else. Keys are never deleted, so nothing leaves it.
//!
//! Scoped tokens are not in the change log (they are minted at up to their parents' rate
//! limits, and live 15 minutes at most): the store tells every replica of each one minted, best
//! effort ([`MintedTokens`], over Redis pub/sub), and they are listed until they expire. Those a
//! listing finds stay until the process ends. Pub/sub keeps no backlog: on every subscription
//! the store also reads which tokens are live, so that those minted while a replica was not
//! subscribed (disconnected, or its Redis user not allowed the channel) are heard of too.

use dashmap::{DashMap, DashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::sync::Notify;

use crate::keys::KeyHash;

/// Scoped tokens minted lately, on any replica, that this one has heard of: filled by the
/// store, read by the key directory. Best effort: a token it missed is read from the store as
/// any key not listed is.
#[derive(Default)]
pub struct MintedTokens {
    /// Short digest → when the token expires (unix seconds).
    expiries: DashMap<u64, u64, foldhash::fast::RandomState>,
}

impl MintedTokens {
    /// A token with digest `hash` was minted, valid until `expires_at`.
    pub fn add(&self, hash: &KeyHash, expires_at: u64) {
        self.expiries.insert(short(hash), expires_at);
    }

    /// Whether a token with digest `hash` was minted and is valid at unix second `now`.
    pub fn listed(&self, hash: &KeyHash, now: u64) -> bool {
        self.expiries
            .get(&short(hash))
            .is_some_and(|expires_at| *expires_at > now)
    }

    /// Forgets the tokens expired at `now`.
    pub fn sweep(&self, now: u64) {
        self.expiries.retain(|_, expires_at| *expires_at > now);
    }

    /// Tokens held.
    #[allow(clippy::len_without_is_empty)]
    pub fn len(&self) -> usize {
        self.expiries.len()
    }
}

/// Key digests, as the store holds them (see the module's documentation).
pub struct KeyDirectory {
    digests: DashSet<u64, foldhash::fast::RandomState>,
    tokens: Arc<MintedTokens>,
    /// Times the change log was started over, doubled, plus one once a listing that began after
    /// the last of them has ended (the directory is complete). One word, so that a listing that
    /// overlaps a restart cannot mark the directory complete after the restart cleared it.
    state: AtomicU64,
    /// Woken when a listing is due.
    due: Notify,
}

impl KeyDirectory {
    /// An empty directory, to be filled: [`KeyDirectory::restart`] asks for the first listing.
    /// Lists the scoped tokens of `tokens` too.
    pub fn new(tokens: Arc<MintedTokens>) -> Self {
        Self {
            digests: DashSet::default(),
            tokens,
            state: AtomicU64::new(0),
            due: Notify::new(),
        }
    }

    /// Whether `hash` is a key's, or a scoped token's valid at unix second `now`. A key written
    /// since the cache last synced is not listed yet, nor, until the directory is complete, one
    /// the listing has not reached.
    pub fn listed(&self, hash: &KeyHash, now: u64) -> bool {
        self.digests.contains(&short(hash)) || self.tokens.listed(hash, now)
    }

    /// Forgets the scoped tokens expired at `now`.
    pub fn sweep_tokens(&self, now: u64) {
        self.tokens.sweep(now);
    }

    /// Adds keys the store holds: the change log's, or a listing's page.
    pub fn add<'a>(&self, hashes: impl IntoIterator<Item = &'a KeyHash>) {
        for hash in hashes {
            self.digests.insert(short(hash));
        }
    }

    /// The change log cannot name what changed since the cache last read it: whatever keys
    /// were written meanwhile are found only by listing the store again. Until that listing
    /// ends, a digest not listed may be a key's.
    pub fn restart(&self) {
        let _ = self
            .state
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |state| {
                Some(((state >> 1) + 1) << 1)
            });
        self.due.notify_one();
    }

    /// Waits until a listing is due, then returns its ticket for [`KeyDirectory::listed_all`].
    pub async fn listing_due(&self) -> u64 {
        self.due.notified().await;
        self.ticket()
    }

    /// The ticket a listing would begin with now: while it is the one a listing began with,
    /// the change log has not started over since.
    pub fn ticket(&self) -> u64 {
        self.state.load(Ordering::Acquire) >> 1
    }

    /// A listing that began with `ticket` has added every key the store held: the directory is
    /// complete, unless the change log was started over meanwhile (another listing is due).
    pub fn listed_all(&self, ticket: u64) {
        let _ = self.state.compare_exchange(
            ticket << 1,
            (ticket << 1) | 1,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
    }

    /// Whether a listing has completed the directory since the change log last started over.
    pub fn is_complete(&self) -> bool {
        self.state.load(Ordering::Acquire) & 1 == 1
    }

    /// Digests listed.
    #[allow(clippy::len_without_is_empty)]
    pub fn len(&self) -> usize {
        self.digests.len()
    }

    /// What it holds, for the metrics.
    pub fn size(&self) -> crate::metrics::DirectorySize {
        crate::metrics::DirectorySize {
            keys: self.digests.len(),
            tokens: self.tokens.len(),
            complete: self.is_complete(),
        }
    }
}

/// The part of a digest kept.
fn short(hash: &KeyHash) -> u64 {
    let mut first = [0u8; 8];
    first.copy_from_slice(&hash.0[..8]);
    u64::from_le_bytes(first)
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::FutureExt;

    fn hash(n: u8) -> KeyHash {
        KeyHash::of(&format!("key-{n}"))
    }

    #[test]
    fn a_digest_not_listed_is_unknown_only_once_a_listing_has_ended() {
        let directory = KeyDirectory::new(Arc::default());
        directory.add([&hash(1)]);
        assert!(directory.listed(&hash(1), 0));
        assert!(!directory.listed(&hash(2), 0) && !directory.is_complete());

        directory.restart();
        let ticket = directory
            .listing_due()
            .now_or_never()
            .expect("a listing is due");
        directory.add([&hash(2)]);
        directory.listed_all(ticket);
        assert!(directory.is_complete());
        assert!(directory.listed(&hash(2), 0));
        assert!(!directory.listed(&hash(3), 0));
        assert_eq!(directory.len(), 2);
    }

    #[test]
    fn a_restart_during_a_listing_leaves_the_directory_incomplete_and_asks_for_another() {
        let directory = KeyDirectory::new(Arc::default());
        directory.restart();
        let ticket = directory
            .listing_due()
            .now_or_never()
            .expect("a listing is due");
        assert!(directory.listing_due().now_or_never().is_none());

        directory.restart();
        directory.listed_all(ticket);
        assert!(!directory.is_complete());

        let again = directory
            .listing_due()
            .now_or_never()
            .expect("another is due");
        directory.listed_all(again);
        assert!(directory.is_complete());

        // Once complete, a restart makes it incomplete again.
        directory.restart();
        assert!(!directory.is_complete());
    }

    #[test]
    fn minted_tokens_are_listed_until_they_expire() {
        let tokens = Arc::new(MintedTokens::default());
        let directory = KeyDirectory::new(tokens.clone());
        tokens.add(&hash(1), 1_000);
        tokens.add(&hash(2), 2_000);
        assert!(directory.listed(&hash(1), 999));
        assert!(!directory.listed(&hash(1), 1_000), "expired");
        assert!(!directory.listed(&hash(3), 0));
        directory.sweep_tokens(1_500);
        assert_eq!(tokens.len(), 1);
        assert!(directory.listed(&hash(2), 1_500));
    }
}
