//! What a configuration check reports: the key and what is wrong with it.

/// A configuration problem, naming the key it is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// Dotted key, e.g. `server.listen`, or the environment variable.
    pub key: String,
    /// What is wrong with it.
    pub reason: String,
}

impl Problem {
    /// A problem with `key`.
    pub fn new(key: impl Into<String>, reason: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            reason: reason.into(),
        }
    }
}
