//! What the dashboard keeps in the store: sessions, one-time sign-in links and sign-in attempt
//! counts. Every replica reads the same records, so a session works on any of them and ends on
//! all of them at once.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::shared::store::StoreError;

/// A signed-in browser. Stored under the SHA-256 of the session cookie's value, which never
/// reaches the store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DashboardSession {
    /// The workspace admin's e-mail address; `None` for an operator signed in with the admin
    /// token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub email: Option<String>,
    /// The token every form of this session carries (hex).
    pub csrf: String,
    /// Unix seconds.
    pub created_at: u64,
}

/// A sign-in link mailed to `email`, stored under the SHA-256 of its token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignInLink {
    /// Who it was sent to.
    pub email: String,
    /// Unix seconds.
    pub created_at: u64,
}

/// Sessions, sign-in links and attempt counts.
#[async_trait]
pub trait SessionStore: Send + Sync + 'static {
    /// Stores a session under `digest`, ending after `idle_seconds` without use.
    async fn save_session(
        &self,
        digest: &str,
        session: &DashboardSession,
        idle_seconds: u64,
    ) -> Result<(), StoreError>;

    /// The session under `digest`, its idle expiry pushed back to `idle_seconds` from now.
    async fn touch_session(
        &self,
        digest: &str,
        idle_seconds: u64,
    ) -> Result<Option<DashboardSession>, StoreError>;

    /// Ends the session under `digest`.
    async fn end_session(&self, digest: &str) -> Result<(), StoreError>;

    /// Stores a sign-in link under `digest` for `ttl_seconds`.
    async fn save_sign_in_link(
        &self,
        digest: &str,
        link: &SignInLink,
        ttl_seconds: u64,
    ) -> Result<(), StoreError>;

    /// Takes the link under `digest`: the first call gets it, every later one `None`.
    async fn take_sign_in_link(&self, digest: &str) -> Result<Option<SignInLink>, StoreError>;

    /// Counts one attempt in `bucket`'s current window of `window_seconds`; the count so far,
    /// this one included.
    async fn count_attempt(&self, bucket: &str, window_seconds: u64) -> Result<u64, StoreError>;
}
