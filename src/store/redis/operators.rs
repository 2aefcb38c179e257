//! Operator tokens in Redis: one hash, digest → record.

use async_trait::async_trait;
use redis::AsyncCommands;
use std::collections::HashMap;

use super::*;
use crate::keys::operators::{OperatorStore, OperatorToken};
use crate::store::StoreError;

#[async_trait]
impl OperatorStore for RedisStore {
    async fn insert_operator(&self, token: &OperatorToken) -> Result<(), StoreError> {
        let added: bool = self
            .conn()
            .hset_nx(self.layout.operators(), &token.digest, encode(token))
            .await
            .map_err(unavailable)?;
        match added {
            true => Ok(()),
            false => Err(StoreError::Conflict(format!(
                "operator token {} exists",
                token.id
            ))),
        }
    }

    async fn operator_by_digest(&self, digest: &str) -> Result<Option<OperatorToken>, StoreError> {
        let key = self.layout.operators();
        let raw: Option<String> = self.conn().hget(&key, digest).await.map_err(unavailable)?;
        raw.map(|raw| decode(&key, &raw)).transpose()
    }

    async fn operators(&self) -> Result<Vec<OperatorToken>, StoreError> {
        let key = self.layout.operators();
        let raw: HashMap<String, String> = self.conn().hgetall(&key).await.map_err(unavailable)?;
        let mut all = raw
            .values()
            .map(|raw| decode::<OperatorToken>(&key, raw))
            .collect::<Result<Vec<_>, _>>()?;
        all.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
        Ok(all)
    }

    async fn delete_operator(&self, id: &str) -> Result<Option<OperatorToken>, StoreError> {
        let Some(token) = self.operators().await?.into_iter().find(|t| t.id == id) else {
            return Ok(None);
        };
        let removed: u64 = self
            .conn()
            .hdel(self.layout.operators(), &token.digest)
            .await
            .map_err(unavailable)?;
        Ok((removed > 0).then_some(token))
    }
}
