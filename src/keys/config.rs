//! `[keys]`: key lifecycle settings, and their checks.

use serde::{Deserialize, Serialize};

use crate::shared::problem::Problem;

/// `[keys]`
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KeysConfig {
    /// How long a rotated key keeps working (seconds).
    pub rotation_grace_seconds: u64,
}

impl Default for KeysConfig {
    fn default() -> Self {
        Self {
            rotation_grace_seconds: 86_400,
        }
    }
}

impl KeysConfig {
    /// Checks the section; every problem, in order.
    pub fn validate(&self) -> Vec<Problem> {
        let mut problems = Vec::new();
        if self.rotation_grace_seconds > crate::keys::MAX_GRACE_SECONDS {
            problems.push(Problem::new(
                "keys.rotation_grace_seconds",
                format!(
                    "must be at most {} (30 days)",
                    crate::keys::MAX_GRACE_SECONDS
                ),
            ));
        }
        problems
    }
}
