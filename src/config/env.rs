//! `SVCGATE_<SECTION>_<KEY>` environment overrides, applied to the file before it is read.

use super::{Config, ENV_PREFIX};
use crate::shared::problem::Problem;

/// `SVCGATE_*` variables that are not settings: the configuration file's path and what the
/// CLI's client commands (`keys`, `events`, `listen`) read.
const CLI_VARIABLES: [&str; 4] = ["CONFIG", "ADMIN_URL", "GATEWAY_URL", "API_KEY"];

/// A deserializer's message with the values it quotes (between backticks) left out: the value
/// of a mistyped setting may be a secret (`admin_token = 1234…`).
pub(super) fn without_quoted_values(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    for (i, part) in message.split('`').enumerate() {
        out.push_str(if i % 2 == 1 { "…" } else { part });
    }
    out
}

/// Whether `SVCGATE_<rest>=value` is a Kubernetes service link, not a setting: a pod created
/// after a Service named `svcgate` gets `SVCGATE_SERVICE_HOST`, `SVCGATE_SERVICE_PORT[_NAME]`,
/// `SVCGATE_PORT` (`tcp://10.0.0.1:80`) and `SVCGATE_PORT_80_TCP[_PROTO|_PORT|_ADDR]`, and one
/// named `svcgate-metrics` the same names with `METRICS_` after `SVCGATE_`. (`SVCGATE_SMTP_PORT`
/// is a setting, unless it holds an address such as `tcp://…`.)
fn is_service_link(rest: &str, value: &str) -> bool {
    let words: Vec<&str> = rest.split('_').collect();
    let address = ["tcp://", "udp://", "sctp://"]
        .iter()
        .any(|scheme| value.starts_with(scheme));
    words.iter().enumerate().any(|(i, word)| {
        let next = |n: usize| words.get(i + n).copied();
        match *word {
            "SERVICE" => matches!(next(1), Some("HOST" | "PORT")),
            "PORT" => match next(1) {
                None => address,
                Some(port) => {
                    port.bytes().all(|b| b.is_ascii_digit())
                        && matches!(next(2), Some("TCP" | "UDP" | "SCTP"))
                }
            },
            _ => false,
        }
    })
}

/// Applies `SVCGATE_<SECTION>_<KEY>` overrides to the parsed file.
///
/// A value becomes a string when the setting is a string (so `SVCGATE_SERVER_ADMIN_TOKEN=1234`
/// stays a token), and is read as a TOML value otherwise (`8`, `true`, `[60, 300]`).
pub(super) fn apply_env(
    table: &mut toml::Table,
    env: impl IntoIterator<Item = (String, String)>,
) -> Result<(), Problem> {
    let defaults = match toml::Value::try_from(Config::default()) {
        Ok(toml::Value::Table(t)) => t,
        _ => toml::Table::new(),
    };
    for (name, value) in env {
        let Some(rest) = name.strip_prefix(ENV_PREFIX) else {
            continue;
        };
        // `SVCGATE_CONFIG` names the file itself, and the CLI's commands read where the admin
        // API and the gateway are and the key to call with: not settings of the server.
        if CLI_VARIABLES.contains(&rest) {
            continue;
        }
        if is_service_link(rest, &value) {
            continue;
        }
        let rest = rest.to_ascii_lowercase();
        let Some((section, key)) = rest.split_once('_') else {
            return Err(Problem::new(name, "expected SVCGATE_<SECTION>_<KEY>"));
        };
        let Some(toml::Value::Table(section_defaults)) = defaults.get(section) else {
            return Err(Problem::new(name, format!("unknown section '{section}'")));
        };
        let is_string = match section_defaults.get(key) {
            Some(toml::Value::String(_)) => true,
            Some(_) => false,
            // Optional settings (no default) are addresses or names: strings.
            None if is_optional_string(section, key) => true,
            None => {
                return Err(Problem::new(
                    name,
                    format!("unknown setting '{key}' in section '{section}'"),
                ))
            }
        };
        if value.is_empty() && !section_defaults.contains_key(key) {
            // An optional setting set to nothing is unset (what a template writes for "no
            // sandbox"), also over the file's value.
            if let Some(toml::Value::Table(t)) = table.get_mut(section) {
                t.remove(key);
            }
            continue;
        }
        let parsed = if is_string {
            toml::Value::String(value)
        } else {
            parse_toml_value(&value).ok_or_else(|| {
                Problem::new(name.clone(), format!("'{value}' is not a valid value"))
            })?
        };
        let entry = table
            .entry(section.to_string())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        match entry {
            toml::Value::Table(t) => {
                t.insert(key.to_string(), parsed);
            }
            _ => return Err(Problem::new(section, "must be a table")),
        }
    }
    Ok(())
}

fn is_optional_string(section: &str, key: &str) -> bool {
    matches!(
        (section, key),
        ("upstream", "live")
            | ("upstream", "sandbox")
            | ("smtp", "host")
            | ("smtp", "username")
            | ("smtp", "password")
            | ("smtp", "tls_ca_file")
            | ("store", "tls_ca_file")
            | ("store", "tls_cert_file")
            | ("store", "tls_key_file")
            | ("store", "sentinel_master")
            | ("store", "sentinel_password")
            | ("tracing", "otlp_endpoint")
            | ("dashboard", "listen")
            | ("dashboard", "public_url")
    )
}

fn parse_toml_value(text: &str) -> Option<toml::Value> {
    let doc: toml::Table = format!("v = {text}").parse().ok()?;
    doc.get("v").cloned()
}
