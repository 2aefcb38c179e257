//! Spend, rate counts and budgets in Redis.

use async_trait::async_trait;
use redis::{AsyncCommands, Script};
use std::collections::HashMap;
use std::sync::LazyLock;

use super::*;
use crate::metering::lease::LEASE_TTL_MS;
use crate::metering::usage::{
    LeaseGrant, LeaseRequest, RateTotals, UsageFlush, UsageSnapshot, WorkspaceTotals,
};
use crate::store::{StoreError, UsageReport, UsageStore};

/// Applies one usage flush (see [`UsageStore::flush_usage`]). KEYS: the event log, the batch's
/// marker, its rate counts' marker, then `(spend, budgets, workspace record)` of each workspace
/// and `(this window, the one before)` of each rate count, in the flush's order, then the lease
/// hash of each lease the flush carries, then the keys' last uses (set from the rate counts, to
/// the minute); every one starts with the `{ns}` hash tag, so it runs on one Cluster slot.
/// ARGV[1] is the flush as JSON, ARGV[2] the lease lifetime (ms).
/// Answers JSON with totals as decimal strings (Lua numbers would lose digits).
pub(super) static FLUSH_USAGE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/flush_usage.lua")));

/// Grants budget leases (see [`UsageStore::lease_budget`]). KEYS: the month's spend, the
/// workspace's project budgets, its record, then each ask's lease hash and, for a key, those
/// of its lineage; all under the `{ns}` hash tag. ARGV[1] is the request as JSON.
pub(super) static LEASE_BUDGET: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/lease_budget.lua")));

/// [`UsageSnapshot`] as the flush script writes it: numbers as strings.
#[derive(serde::Deserialize, Default)]
pub(super) struct RawSnapshot {
    #[serde(default)]
    pub(super) workspaces: HashMap<String, RawTotals>,
    #[serde(default)]
    pub(super) rate: HashMap<String, RawRate>,
}

#[derive(serde::Deserialize, Default)]
pub(super) struct RawTotals {
    pub(super) total: String,
    #[serde(default)]
    pub(super) monthly_credits: Option<String>,
    #[serde(default)]
    pub(super) keys: RawMap,
    #[serde(default)]
    pub(super) projects: RawMap,
    #[serde(default)]
    pub(super) project_budgets: RawMap,
}

#[derive(serde::Deserialize)]
pub(super) struct RawRate {
    pub(super) window: String,
    pub(super) previous: String,
    pub(super) current: String,
}

/// cjson writes an empty table as `{}` and never as `[]`, so maps decode either way.
#[derive(Default)]
pub(super) struct RawMap(HashMap<String, String>);

impl<'de> serde::Deserialize<'de> for RawMap {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match serde_json::Value::deserialize(d)? {
            serde_json::Value::Object(m) => Ok(RawMap(
                m.into_iter()
                    .map(|(k, v)| {
                        (
                            k,
                            v.as_str()
                                .map(str::to_owned)
                                .unwrap_or_else(|| v.to_string()),
                        )
                    })
                    .collect(),
            )),
            _ => Ok(RawMap::default()),
        }
    }
}

pub(super) fn parse_int(s: &str) -> i64 {
    s.parse().unwrap_or(0)
}

impl RawMap {
    pub(super) fn parsed(self) -> HashMap<String, i64> {
        self.0
            .into_iter()
            .map(|(k, v)| (k, parse_int(&v)))
            .collect()
    }
}

#[async_trait]
impl UsageStore for RedisStore {
    async fn flush_usage(&self, flush: &UsageFlush) -> Result<UsageSnapshot, StoreError> {
        let batch = serde_json::to_string(flush).expect("flushes serialize");
        let p = self.prefix();
        let mut invocation = FLUSH_USAGE.prepare_invoke();
        invocation
            .key(self.layout.events())
            .key(format!("{p}:flush:{}", flush.id))
            .key(format!("{p}:flush:{}", flush.rate_id));
        for w in &flush.workspaces {
            let month = w.month.as_deref().unwrap_or(&flush.month);
            invocation
                .key(self.layout.spend(&w.workspace, month))
                .key(self.layout.budgets(&w.workspace))
                .key(self.layout.workspace(&w.workspace));
        }
        for r in &flush.rate {
            let window = i128::from(r.window);
            invocation
                .key(format!("{p}:rl:{}:{window}", r.key))
                .key(format!("{p}:rl:{}:{}", r.key, window - 1));
        }
        for w in &flush.workspaces {
            let month = w.month.as_deref().unwrap_or(&flush.month);
            for l in &w.leases {
                invocation.key(self.layout.lease(&w.workspace, month, &l.scope));
            }
        }
        invocation.key(self.layout.last_used());
        let raw: String = invocation
            .arg(batch)
            .arg(LEASE_TTL_MS)
            .invoke_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        let raw: RawSnapshot = serde_json::from_str(&raw)
            .map_err(|e| StoreError::Unavailable(format!("unreadable flush reply: {e}")))?;
        Ok(UsageSnapshot {
            workspaces: raw
                .workspaces
                .into_iter()
                .map(|(ws, t)| {
                    (
                        ws,
                        WorkspaceTotals {
                            total: parse_int(&t.total),
                            monthly_credits: t.monthly_credits.as_deref().map(parse_int),
                            keys: t.keys.parsed(),
                            projects: t.projects.parsed(),
                            project_budgets: t.project_budgets.parsed(),
                        },
                    )
                })
                .collect(),
            rate: raw
                .rate
                .into_iter()
                .map(|(key, r)| {
                    (
                        key,
                        RateTotals {
                            window: parse_int(&r.window) as u64,
                            previous: parse_int(&r.previous) as u64,
                            current: parse_int(&r.current) as u64,
                        },
                    )
                })
                .collect(),
        })
    }

    async fn lease_budget(&self, request: &LeaseRequest) -> Result<Vec<LeaseGrant>, StoreError> {
        let (ws, month) = (&request.workspace, &request.month);
        let mut invocation = LEASE_BUDGET.prepare_invoke();
        invocation
            .key(self.layout.spend(ws, month))
            .key(self.layout.budgets(ws))
            .key(self.layout.workspace(ws));
        for ask in &request.asks {
            invocation.key(self.layout.lease(ws, month, &ask.scope));
            for peer in &ask.peers {
                invocation.key(self.layout.lease(ws, month, &format!("key:{peer}")));
            }
        }
        let body = serde_json::to_string(request).expect("lease requests serialize");
        let raw: String = invocation
            .arg(body)
            .invoke_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        #[derive(serde::Deserialize)]
        struct RawGrant {
            granted: String,
            free: String,
        }
        // cjson writes an empty array as `{}`: no asks, no grants.
        let raw: Vec<RawGrant> = match raw.as_str() {
            "{}" => Vec::new(),
            raw => serde_json::from_str(raw)
                .map_err(|e| StoreError::Unavailable(format!("unreadable lease reply: {e}")))?,
        };
        Ok(raw
            .into_iter()
            .map(|g| LeaseGrant {
                granted: parse_int(&g.granted),
                free: parse_int(&g.free),
            })
            .collect())
    }

    async fn project_budgets(&self, workspace: &str) -> Result<HashMap<String, i64>, StoreError> {
        let raw: HashMap<String, String> = self
            .conn()
            .hgetall(self.layout.budgets(workspace))
            .await
            .map_err(unavailable)?;
        Ok(raw
            .into_iter()
            .filter_map(|(project, budget)| Some((project, budget.parse().ok()?)))
            .collect())
    }

    async fn set_project_budget(
        &self,
        workspace: &str,
        project: &str,
        budget: Option<i64>,
    ) -> Result<(), StoreError> {
        let key = self.layout.budgets(workspace);
        let mut conn = self.conn();
        match budget {
            Some(b) => conn.hset::<_, _, _, ()>(key, project, b).await,
            None => conn.hdel::<_, _, ()>(key, project).await,
        }
        .map_err(unavailable)
    }

    async fn keys_last_used(&self, ids: &[&str]) -> Result<Vec<Option<u64>>, StoreError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let used: Vec<Option<u64>> = redis::cmd("HMGET")
            .arg(self.layout.last_used())
            .arg(ids)
            .query_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        Ok(used)
    }

    async fn usage_report(&self, workspace: &str, month: &str) -> Result<UsageReport, StoreError> {
        let fields: HashMap<String, String> = self
            .conn()
            .hgetall(self.layout.spend(workspace, month))
            .await
            .map_err(unavailable)?;
        let mut report = UsageReport::default();
        for (field, value) in fields {
            let v = parse_int(&value);
            if field == "total" {
                report.total = v;
            } else if let Some(id) = field.strip_prefix("key:") {
                report.keys.insert(id.to_string(), v);
            } else if let Some(p) = field.strip_prefix("project:") {
                report.projects.insert(p.to_string(), v);
            }
        }
        Ok(report)
    }
}
