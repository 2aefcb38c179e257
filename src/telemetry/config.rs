//! `[tracing]`: where traces go, under which service name, and how many are kept; and their
//! checks.

use serde::{Deserialize, Serialize};

use crate::shared::problem::Problem;

/// `[tracing]`
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TracingConfig {
    /// OTLP/HTTP (protobuf) collector, e.g. `http://otel-collector:4318`: spans go to its
    /// `/v1/traces` (a URL with a path of its own is used as it is). Absent: no traces.
    pub otlp_endpoint: Option<String>,
    /// `service.name` of the exported spans.
    pub service_name: String,
    /// Share of the traces that start here (no sampled `traceparent` came in) that are
    /// recorded, 0.0 to 1.0; a request whose caller's trace is sampled is always recorded.
    pub sampling_ratio: f64,
}

impl Default for TracingConfig {
    fn default() -> Self {
        Self {
            otlp_endpoint: None,
            service_name: "svcgate".into(),
            sampling_ratio: 1.0,
        }
    }
}

impl TracingConfig {
    /// Checks the section; every problem, in order.
    pub fn validate(&self) -> Vec<Problem> {
        let mut problems = Vec::new();
        if let Some(endpoint) = &self.otlp_endpoint {
            if let Err(why) = traces_url(endpoint) {
                problems.push(Problem::new("tracing.otlp_endpoint", why));
            }
        }
        if self.service_name.trim().is_empty() {
            problems.push(Problem::new("tracing.service_name", "must not be empty"));
        }
        if !(0.0..=1.0).contains(&self.sampling_ratio) {
            problems.push(Problem::new(
                "tracing.sampling_ratio",
                "must be between 0.0 and 1.0",
            ));
        }
        problems
    }
}

/// The URL spans are POSTed to: the collector's `/v1/traces`, unless `endpoint` has a path.
pub(crate) fn traces_url(endpoint: &str) -> Result<String, String> {
    let mut url = url::Url::parse(endpoint).map_err(|e| format!("not a URL: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!(
            "must be http:// or https://, not {}://",
            url.scheme()
        ));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err("names no host".into());
    }
    if !url.username().is_empty() || url.password().is_some() {
        // It would be logged and shown by `svcgate check`; a collector that wants credentials
        // gets them from a sidecar or the network, not from this URL.
        return Err("must not carry credentials".into());
    }
    if url.path() == "/" {
        url.set_path("/v1/traces");
    }
    Ok(url.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_collector_base_url_gets_the_traces_path() {
        assert_eq!(
            traces_url("http://collector:4318").unwrap(),
            "http://collector:4318/v1/traces"
        );
        assert_eq!(
            traces_url("https://otel.example/custom/traces").unwrap(),
            "https://otel.example/custom/traces"
        );
        for bad in [
            "collector:4318",
            "grpc://collector:4317",
            "http://user:secret@collector:4318",
        ] {
            assert!(traces_url(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn every_bad_value_is_named() {
        let config = TracingConfig {
            otlp_endpoint: Some("ftp://x".into()),
            service_name: " ".into(),
            sampling_ratio: 1.5,
        };
        let keys: Vec<_> = config.validate().into_iter().map(|p| p.key).collect();
        assert_eq!(
            keys,
            [
                "tracing.otlp_endpoint",
                "tracing.service_name",
                "tracing.sampling_ratio"
            ]
        );
        assert!(TracingConfig::default().validate().is_empty());
        let nan = TracingConfig {
            sampling_ratio: f64::NAN,
            ..TracingConfig::default()
        };
        assert_eq!(nan.validate().len(), 1);
    }
}
