//! Operator tokens in memory.

use super::*;
use crate::keys::operators::{OperatorStore, OperatorToken};
use crate::store::StoreError;
use async_trait::async_trait;

#[async_trait]
impl OperatorStore for MemoryStore {
    async fn insert_operator(&self, token: &OperatorToken) -> Result<(), StoreError> {
        let mut inner = self.write();
        if inner.operators.contains_key(&token.digest) {
            return Err(StoreError::Conflict(format!(
                "operator token {} exists",
                token.id
            )));
        }
        inner.operators.insert(token.digest.clone(), token.clone());
        Ok(())
    }

    async fn operator_by_digest(&self, digest: &str) -> Result<Option<OperatorToken>, StoreError> {
        Ok(self.read().operators.get(digest).cloned())
    }

    async fn operators(&self) -> Result<Vec<OperatorToken>, StoreError> {
        let mut all: Vec<OperatorToken> = self.read().operators.values().cloned().collect();
        all.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
        Ok(all)
    }

    async fn delete_operator(&self, id: &str) -> Result<Option<OperatorToken>, StoreError> {
        let mut inner = self.write();
        let digest = inner
            .operators
            .values()
            .find(|t| t.id == id)
            .map(|t| t.digest.clone());
        Ok(digest.and_then(|d| inner.operators.remove(&d)))
    }
}
