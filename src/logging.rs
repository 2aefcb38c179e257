//! Log set-up: `tracing` to stderr, text or JSON, filtered by `RUST_LOG` or the config.
//!
//! Nothing logged anywhere carries a key value or a signing secret: request logs name key ids.
//! Pingora's own records are held at `info` whatever the filter asks for: below that it logs
//! raw request bytes (a malformed request's buffer, every request's headers), credentials
//! included.

use serde::{Deserialize, Serialize};
use tracing::level_filters::LevelFilter;
use tracing_subscriber::filter::{EnvFilter, FilterFn};
use tracing_subscriber::prelude::*;

use crate::shared::problem::Problem;

/// The most detail Pingora's records may carry.
const PINGORA_MAX_LEVEL: LevelFilter = LevelFilter::INFO;

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// `[log]`
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogConfig {
    /// `text` or `json`.
    pub format: LogFormat,
    /// A `tracing` filter such as `info` or `svcgate=debug`; `RUST_LOG` wins when set.
    pub level: String,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            format: LogFormat::Text,
            level: "info".into(),
        }
    }
}

impl LogConfig {
    /// Checks the section; every problem, in order.
    pub fn validate(&self) -> Vec<Problem> {
        let mut problems = Vec::new();
        if let Err(e) = tracing_subscriber::EnvFilter::try_new(&self.level) {
            problems.push(Problem::new("log.level", format!("not a log filter: {e}")));
        }
        problems
    }
}

/// Installs the global subscriber. Safe to call more than once (later calls do nothing).
pub fn init(config: &LogConfig) {
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(&config.level))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    // A filter of its own, so no directive of the one above can lift it. It only ever narrows
    // that one, whose most detailed level it passes on: without that hint, every `log` record
    // of every crate would reach the filters (Pingora writes several per request).
    let most_detail = filter.max_level_hint().unwrap_or(LevelFilter::TRACE);
    let pingora_cap = FilterFn::new(|meta| {
        !meta.target().starts_with("pingora") || *meta.level() <= PINGORA_MAX_LEVEL
    })
    .with_max_level_hint(most_detail);
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let fmt = match config.format {
        LogFormat::Json => fmt.json().boxed(),
        LogFormat::Text => fmt.boxed(),
    };
    let _ = tracing_subscriber::registry()
        .with(fmt.with_filter(filter).with_filter(pingora_cap))
        .try_init();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pingora_cap_leaves_the_level_to_the_filter() {
        std::env::remove_var("RUST_LOG");
        init(&LogConfig {
            level: "info".into(),
            ..LogConfig::default()
        });
        // Records above `info` are dropped where they are made, not filtered one by one.
        assert_eq!(LevelFilter::current(), LevelFilter::INFO);
    }
}
