//! The schema version: which storage format the data in Redis is in.
//!
//! `{ns}:schema` holds an integer. A store with none holds data of an earlier version (before
//! the key existed), which this build reads as it is; `prepare` writes the current version once
//! what earlier versions wrote is brought up to date. A version newer than this build knows
//! means a newer svcgate wrote the data in a format this one may misread: it refuses to start.
//! `docs/redis-layout.md` tells what each version changed.

use redis::{AsyncCommands, Script};
use std::sync::LazyLock;

use super::{unavailable, RedisStore};
use crate::store::StoreError;

/// The storage format this build writes and reads (older ones are read too).
pub const SCHEMA_VERSION: u64 = 7;

/// Records [`SCHEMA_VERSION`] unless the store holds a newer one. KEYS: the schema key. ARGV:
/// the version. Returns the version found.
static WRITE_SCHEMA: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/write_schema.lua")));

/// The error for data in a newer schema than this build knows.
fn too_new(found: u64) -> StoreError {
    StoreError::Conflict(format!(
        "the store holds data in schema version {found}, newer than this build's \
         {SCHEMA_VERSION}: a newer svcgate wrote it; run that version or a later one"
    ))
}

/// Reads a schema version as stored: an integer, or nothing.
fn parse(raw: Option<String>) -> Result<Option<u64>, StoreError> {
    raw.map(|v| {
        v.trim().parse().map_err(|_| {
            StoreError::Conflict(format!("the store's schema version {v:?} is not a number"))
        })
    })
    .transpose()
}

impl RedisStore {
    /// The schema version the store holds, if any.
    pub async fn schema_version(&self) -> Result<Option<u64>, StoreError> {
        let raw: Option<String> = self
            .conn()
            .get(self.layout.schema())
            .await
            .map_err(unavailable)?;
        parse(raw)
    }

    /// Fails if the store holds data of a newer schema than this build knows.
    pub(super) async fn check_schema_version(&self) -> Result<(), StoreError> {
        match self.schema_version().await? {
            Some(found) if found > SCHEMA_VERSION => Err(too_new(found)),
            _ => Ok(()),
        }
    }

    /// Records [`SCHEMA_VERSION`], unless the store holds a newer one (an error then).
    pub(super) async fn write_schema_version(&self) -> Result<(), StoreError> {
        let found: Option<String> = WRITE_SCHEMA
            .key(self.layout.schema())
            .arg(SCHEMA_VERSION)
            .invoke_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        match parse(found)? {
            Some(found) if found > SCHEMA_VERSION => Err(too_new(found)),
            _ => Ok(()),
        }
    }
}
