//! What every storage trait shares: the error its calls fail with, and the operations on the
//! store as a whole (health, connections, upkeep of data written by earlier versions).

use async_trait::async_trait;

/// Why a store call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// The store could not be reached; the caller may retry later.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The write conflicts with existing data (for example a duplicate id).
    #[error("conflict: {0}")]
    Conflict(String),
    /// The store replaced its connections while an event feed read through one of its own: the
    /// master moved (the Sentinels name another), or the connections were reopened after
    /// Redis stopped answering. Nothing was lost: the feed is to be opened again.
    #[error("the store's connections were replaced")]
    Reconnected,
}

/// The store as a whole: whether it answers, its connections, and bringing data written by
/// earlier versions up to date.
#[async_trait]
pub trait StoreHealth: Send + Sync + 'static {
    /// Checks that the store answers.
    async fn ping(&self) -> Result<(), StoreError>;

    /// Opens new connections, driven from the calling runtime. A connection is reopened by
    /// whichever task finds it broken, and runs on that task's runtime: at shutdown, once
    /// the gateway's runtimes have stopped, the store runtime calls this before its last
    /// writes. Nothing to do for a store without connections.
    fn reopen_connections(&self) {}

    /// Fails with [`StoreError::Conflict`] if the store holds data in a newer format (schema
    /// version) than this build knows: `serve` and `worker` then refuse to start. Data of an
    /// earlier version, or of none, passes: [`StoreHealth::prepare`] brings it up to date.
    async fn check_schema(&self) -> Result<(), StoreError> {
        Ok(())
    }

    /// Brings up to date what an earlier version wrote and this one reads differently (the
    /// Redis store indexes the workspaces created before its index existed). Run by `serve` at
    /// start, in the background, until it succeeds; every read that needs it also works
    /// without it, only slower. Idempotent. Nothing to do for a store with no such data. The
    /// Redis store then records the schema version this build writes.
    async fn prepare(&self) -> Result<(), StoreError> {
        Ok(())
    }
}
