//! Operator tokens: narrower credentials for the admin API than the configured admin token
//! (the root), for automation such as CI, Terraform or a billing system, each revocable alone.
//!
//! A token is shown once when it is created and stored as its SHA-256 digest, like a key. Its
//! role decides what it may do ([`Role::allows`]); the storage it needs is [`OperatorStore`].

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::shared::store::StoreError;

/// The prefix of an operator token's value.
pub const TOKEN_PREFIX: &str = "svcop_";

/// What an operator token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Everything the admin token may do.
    Admin,
    /// Read only: `GET` requests.
    Read,
    /// Only its workspace's keys, project budgets and webhooks (and reading its workspace,
    /// usage and audit log).
    Workspace,
}

/// What an admin request touches, as far as roles are concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reach<'a> {
    /// Workspace `id`'s keys, project budgets or webhooks, or a read of the workspace, its
    /// usage or its audit log.
    Workspace(&'a str),
    /// Anything else: workspaces as a whole, leak reports, events, operator tokens.
    Global,
}

impl Role {
    /// The name used in JSON and messages.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Admin => "admin",
            Self::Read => "read",
            Self::Workspace => "workspace",
        }
    }

    /// Whether a token of this role, bound to `own` (a workspace token's workspace), may make
    /// a request with `method` that reaches `reach`.
    pub fn allows(self, own: Option<&str>, method: &http::Method, reach: Reach<'_>) -> bool {
        match self {
            Self::Admin => true,
            Self::Read => method == http::Method::GET || method == http::Method::HEAD,
            Self::Workspace => matches!(reach, Reach::Workspace(ws) if Some(ws) == own),
        }
    }
}

/// A stored operator token: never its value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperatorToken {
    /// `op_…`
    pub id: String,
    /// Who or what holds it; audit records name it (`operator:<name>`).
    pub name: String,
    /// What it may do.
    pub role: Role,
    /// For a `workspace` token, its workspace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<String>,
    /// Unix seconds.
    pub created_at: u64,
    /// SHA-256 of the token's value, hex.
    pub digest: String,
}

impl OperatorToken {
    /// The name audit records give whoever acts with it.
    pub fn actor(&self) -> String {
        format!("operator:{}", self.name)
    }
}

/// The SHA-256 digest of a presented token, as stored.
pub fn digest_of(token: &[u8]) -> [u8; 32] {
    Sha256::digest(token).into()
}

/// A new token's value (shown once) and its record.
pub fn issue(
    name: String,
    role: Role,
    workspace: Option<String>,
    now: u64,
) -> (String, OperatorToken) {
    let random: [u8; 32] = rand::random();
    let value = format!("{TOKEN_PREFIX}{}", hex::encode(random));
    let record = OperatorToken {
        id: crate::ids::new_id("op"),
        name,
        role,
        workspace,
        created_at: now,
        digest: hex::encode(digest_of(value.as_bytes())),
    };
    (value, record)
}

/// Operator tokens, shared by every replica. Admin traffic is light: each admin request
/// presenting one reads the store, so a deleted token is refused at once everywhere.
#[async_trait]
pub trait OperatorStore: Send + Sync + 'static {
    /// Stores a new token.
    async fn insert_operator(&self, token: &OperatorToken) -> Result<(), StoreError>;

    /// The token whose digest (hex) is `digest`.
    async fn operator_by_digest(&self, digest: &str) -> Result<Option<OperatorToken>, StoreError>;

    /// Every token, oldest first.
    async fn operators(&self) -> Result<Vec<OperatorToken>, StoreError>;

    /// Deletes token `id`; the deleted token, or `None` if there was none.
    async fn delete_operator(&self, id: &str) -> Result<Option<OperatorToken>, StoreError>;
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Method;

    #[test]
    fn roles_allow_what_they_name() {
        let ws = Reach::Workspace("ws_1");
        assert!(Role::Admin.allows(None, &Method::DELETE, Reach::Global));
        assert!(Role::Read.allows(None, &Method::GET, Reach::Global));
        assert!(!Role::Read.allows(None, &Method::POST, ws));
        assert!(!Role::Read.allows(None, &Method::PATCH, ws));
        assert!(Role::Workspace.allows(Some("ws_1"), &Method::POST, ws));
        assert!(!Role::Workspace.allows(Some("ws_2"), &Method::GET, ws));
        assert!(!Role::Workspace.allows(Some("ws_1"), &Method::GET, Reach::Global));
        assert!(!Role::Workspace.allows(None, &Method::GET, ws));
    }

    #[test]
    fn a_token_is_stored_as_its_digest() {
        let (value, record) = issue("ci".into(), Role::Read, None, 7);
        assert!(value.starts_with(TOKEN_PREFIX));
        assert_eq!(value.len(), TOKEN_PREFIX.len() + 64);
        assert_eq!(record.digest, hex::encode(digest_of(value.as_bytes())));
        assert!(!serde_json::to_string(&record).unwrap().contains(&value));
        assert_eq!(record.actor(), "operator:ci");
    }
}
