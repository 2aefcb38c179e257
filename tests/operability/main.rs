//! Running svcgate as an operator would: metrics that parse and move, logs without secrets,
//! and a shutdown that finishes what it started.

#[path = "../common/mod.rs"]
mod common;
mod lifecycle;
mod metrics;
mod tracing;
mod unknown_keys;

use common::*;
use reqwest::Method;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

fn sample(metrics: &prometheus_parse::Scrape, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    metrics
        .samples
        .iter()
        .find(|s| {
            s.metric == name
                && labels
                    .iter()
                    .all(|(k, v)| s.labels.get(k).is_some_and(|l| l == *v))
        })
        .map(|s| match s.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => v,
            prometheus_parse::Value::Histogram(ref h) => h.last().map_or(0.0, |b| b.count),
            _ => 0.0,
        })
}

async fn scrape(gw: &Gateway) -> prometheus_parse::Scrape {
    let text = gw.metrics_text().await;
    prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string())))
        .expect("/metrics is Prometheus text")
}
