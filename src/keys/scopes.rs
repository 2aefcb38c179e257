//! Scopes: what a key may do. A route names the one scope it needs.

use serde::{Deserialize, Serialize};

/// One scope name, e.g. `chat.completions:create`.
pub type Scope = Box<str>;

/// The set of scopes a key carries. Small (a handful of entries), so a linear scan beats
/// hashing on the hot path.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Scopes(Vec<Scope>);

impl Scopes {
    /// Builds a set from names, dropping duplicates and keeping a stable order.
    pub fn new<I, S>(names: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut v: Vec<Scope> = names.into_iter().map(|s| s.as_ref().into()).collect();
        v.sort_unstable();
        v.dedup();
        Self(v)
    }

    /// Whether the set grants `scope`.
    #[inline]
    pub fn allows(&self, scope: &str) -> bool {
        self.0.iter().any(|s| &**s == scope)
    }

    /// Whether every scope of `other` is also in `self`.
    pub fn contains_all(&self, other: &Scopes) -> bool {
        other.0.iter().all(|s| self.allows(s))
    }

    /// The scope names.
    pub fn iter(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(|s| &**s)
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Whether `name` is a well-formed scope: `resource:action`, with the resource made of
/// lower-case letters, digits, `.` and `_`, and the action of lower-case letters and `_`.
pub fn is_valid_scope(name: &str) -> bool {
    let Some((resource, action)) = name.split_once(':') else {
        return false;
    };
    let resource_ok = !resource.is_empty()
        && resource
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'_');
    let action_ok =
        !action.is_empty() && action.bytes().all(|b| b.is_ascii_lowercase() || b == b'_');
    resource_ok && action_ok && name.len() <= 64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allows_only_exact_scopes() {
        let s = Scopes::new(["images:create", "chat.completions:create"]);
        assert!(s.allows("images:create"));
        assert!(s.allows("chat.completions:create"));
        assert!(!s.allows("images:read"));
        assert!(!s.allows("images"));
        assert!(!s.allows(""));
        assert!(!Scopes::default().allows("images:create"));
    }

    #[test]
    fn dedups_and_compares_as_sets() {
        let a = Scopes::new(["b:x", "a:x", "b:x"]);
        assert_eq!(a.iter().collect::<Vec<_>>(), ["a:x", "b:x"]);
        assert!(a.contains_all(&Scopes::new(["a:x"])));
        assert!(!Scopes::new(["a:x"]).contains_all(&a));
        assert!(a.contains_all(&Scopes::default()));
    }

    #[test]
    fn scope_names_are_validated() {
        for ok in [
            "models:read",
            "chat.completions:create",
            "tokens:create",
            "agents:run",
        ] {
            assert!(is_valid_scope(ok), "{ok}");
        }
        for bad in [
            "",
            "models",
            ":read",
            "models:",
            "Models:read",
            "a:b:c",
            "a b:c",
            "*",
        ] {
            assert!(!is_valid_scope(bad), "{bad}");
        }
    }
}
