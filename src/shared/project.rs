//! Project names: the `Service-Project` header and the budgets set per project.

/// Longest `Service-Project` value.
pub const MAX_PROJECT_LEN: usize = 64;

/// Whether `name` is a valid project name: 1–64 characters of `[A-Za-z0-9._-]`.
pub fn is_valid_project(name: &str) -> bool {
    (1..=MAX_PROJECT_LEN).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}
