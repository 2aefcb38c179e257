//! Keys found where they must not be: GitHub's secret-scanning alerts, live keys sent by web
//! pages, keys in request bodies, webhook URLs and event payloads.

#[path = "../common/mod.rs"]
mod common;

mod github;
mod requests;

use common::*;
use serde_json::Value;

/// The `key.auto_revoked` events of the namespace's event log, as `(workspace, data)`.
pub async fn auto_revoked(ns: &TestNamespace) -> Vec<(String, Value)> {
    ns.logged_events()
        .await
        .iter()
        .filter(|e| e.get::<String>("type").as_deref() == Some("key.auto_revoked"))
        .map(|e| {
            let data: String = e.get("data").unwrap();
            (
                e.get("workspace").unwrap(),
                serde_json::from_str(&data).unwrap(),
            )
        })
        .collect()
}

/// The e-mails written to `outbox`, as text.
pub fn mails(outbox: &std::path::Path) -> Vec<String> {
    std::fs::read_dir(outbox)
        .map(|dir| {
            dir.filter_map(|e| std::fs::read_to_string(e.ok()?.path()).ok())
                .collect()
        })
        .unwrap_or_default()
}
