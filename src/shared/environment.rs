//! Live, test and scoped: the environment every key, event and webhook endpoint belongs to.

use serde::{Deserialize, Serialize};

/// Which environment a key belongs to, selected by its prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Environment {
    /// `svc_live_`: bills credits, reaches production backends.
    Live,
    /// `svc_test_`: never billed, never reaches production backends.
    Test,
    /// `svc_scoped_`: short-lived token minted from a parent key.
    Scoped,
}

impl Environment {
    /// Every environment, in prefix-matching order.
    pub const ALL: [Environment; 3] = [Environment::Live, Environment::Test, Environment::Scoped];

    /// The key prefix that selects this environment.
    pub const fn key_prefix(self) -> &'static str {
        match self {
            Self::Live => "svc_live_",
            Self::Test => "svc_test_",
            Self::Scoped => "svc_scoped_",
        }
    }

    /// The name used in headers, metrics and JSON.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Live => "live",
            Self::Test => "test",
            Self::Scoped => "scoped",
        }
    }
}
