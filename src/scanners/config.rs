//! `[scanners]`: where GitHub's secret-scanning keys come from, and what the scanners inside
//! the gateway do with a key they find; and their checks.

use serde::{Deserialize, Serialize};

use crate::shared::problem::Problem;

/// GitHub's published secret-scanning signing keys.
pub const GITHUB_KEYS_URL: &str = "https://api.github.com/meta/public_keys/secret_scanning";

/// What the gateway does with a key a scanner finds where it must not be.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FoundKeyAction {
    /// Refuse the request (where there is one to refuse) and nothing else.
    Refuse,
    /// Refuse it, and revoke the live key as leaked (`key.auto_revoked`).
    Revoke,
    /// Refuse it, and tell the workspace's admins (metric, audit record, e-mail); the key keeps
    /// working.
    Report,
}

impl FoundKeyAction {
    /// The name used in metrics and audit records.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Refuse => "refuse",
            Self::Revoke => "revoke",
            Self::Report => "report",
        }
    }
}

/// `[scanners]`
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ScannersConfig {
    /// Where GitHub's secret-scanning public keys are read: an `https://` URL (GitHub's by
    /// default), or a `file://` URL or path for an air-gapped install.
    pub github_keys_url: String,
    /// A live key sent by a browser (a cross-site request) is refused with a 403, and then:
    /// `refuse` (nothing more), `revoke` (revoked as leaked) or `report` (admins told).
    pub live_key_in_browser: FoundKeyAction,
    /// A key found in a request body the gateway reads: `report` or `revoke` (a live key).
    /// The request itself goes on.
    pub key_in_body: FoundKeyAction,
}

impl Default for ScannersConfig {
    fn default() -> Self {
        Self {
            github_keys_url: GITHUB_KEYS_URL.to_string(),
            live_key_in_browser: FoundKeyAction::Report,
            key_in_body: FoundKeyAction::Report,
        }
    }
}

impl ScannersConfig {
    /// Checks the section; every problem, in order.
    pub fn validate(&self) -> Vec<Problem> {
        let mut problems = Vec::new();
        let url = self.github_keys_url.as_str();
        let usable = url.starts_with("https://")
            || url.starts_with("http://")
            || url.starts_with("file://")
            || url.starts_with('/');
        if !usable {
            problems.push(Problem::new(
                "scanners.github_keys_url",
                "must be an https:// URL, a file:// URL or an absolute path",
            ));
        }
        if self.key_in_body == FoundKeyAction::Refuse {
            problems.push(Problem::new(
                "scanners.key_in_body",
                "must be \"report\" or \"revoke\" (a body is scanned as it passes)",
            ));
        }
        problems
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_bad_values_named() {
        assert!(ScannersConfig::default().validate().is_empty());
        let bad = ScannersConfig {
            github_keys_url: "ftp://x".into(),
            key_in_body: FoundKeyAction::Refuse,
            ..ScannersConfig::default()
        };
        let keys: Vec<_> = bad.validate().into_iter().map(|p| p.key).collect();
        assert_eq!(keys, ["scanners.github_keys_url", "scanners.key_in_body"]);
    }
}
