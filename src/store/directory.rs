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
//! are named nowhere else. Keys are never deleted, so nothing leaves it. Scoped tokens are not
//! in the change log; those the listing finds stay until the process ends.

use dashmap::DashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::sync::Notify;

use crate::keys::KeyHash;

/// Key digests, as the store holds them (see the module's documentation).
pub struct KeyDirectory {
    digests: DashSet<u64, foldhash::fast::RandomState>,
    /// Times the change log was started over, doubled, plus one once a listing that began after
    /// the last of them has ended (the directory is complete). One word, so that a listing that
    /// overlaps a restart cannot mark the directory complete after the restart cleared it.
    state: AtomicU64,
    /// Woken when a listing is due.
    due: Notify,
}

impl Default for KeyDirectory {
    fn default() -> Self {
        Self::new()
    }
}

impl KeyDirectory {
    /// An empty directory, to be filled: [`KeyDirectory::restart`] asks for the first listing.
    pub fn new() -> Self {
        Self {
            digests: DashSet::default(),
            state: AtomicU64::new(0),
            due: Notify::new(),
        }
    }

    /// Whether `hash` is a key's. A key written since the cache last synced is not listed yet,
    /// nor, until the directory is complete, one the listing has not reached.
    pub fn listed(&self, hash: &KeyHash) -> bool {
        self.digests.contains(&short(hash))
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
        let directory = KeyDirectory::new();
        directory.add([&hash(1)]);
        assert!(directory.listed(&hash(1)));
        assert!(!directory.listed(&hash(2)) && !directory.is_complete());

        directory.restart();
        let ticket = directory
            .listing_due()
            .now_or_never()
            .expect("a listing is due");
        directory.add([&hash(2)]);
        directory.listed_all(ticket);
        assert!(directory.is_complete());
        assert!(directory.listed(&hash(2)));
        assert!(!directory.listed(&hash(3)));
        assert_eq!(directory.len(), 2);
    }

    #[test]
    fn a_restart_during_a_listing_leaves_the_directory_incomplete_and_asks_for_another() {
        let directory = KeyDirectory::new();
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
}
