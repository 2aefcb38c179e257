//! `[dashboard]`: where the workspace dashboard is served, how its sessions last and how often
//! sign-in may be tried; and the checks on it.

use serde::{Deserialize, Serialize};

use crate::shared::problem::Problem;

/// `[dashboard]`
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DashboardConfig {
    /// Serve the dashboard under `/dashboard/` on the gateway listener (and on `listen`).
    pub enabled: bool,
    /// Also serve it on a listener of its own (e.g. `127.0.0.1:8082`); absent: only on the
    /// gateway listener.
    pub listen: Option<String>,
    /// The dashboard's address as users reach it (e.g. `https://api.example.com/dashboard/`),
    /// for the links in sign-in mails; absent: taken from the request's `Host`.
    pub public_url: Option<String>,
    /// A session ends after this long without a request (seconds).
    pub session_idle_seconds: u64,
    /// Sign-in attempts one client address may make per hour.
    pub sign_in_per_address_per_hour: u64,
    /// Sign-in links one e-mail address may be sent per hour.
    pub sign_in_per_email_per_hour: u64,
}

impl Default for DashboardConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            listen: None,
            public_url: None,
            session_idle_seconds: 3600,
            sign_in_per_address_per_hour: 30,
            sign_in_per_email_per_hour: 5,
        }
    }
}

impl DashboardConfig {
    /// Checks the section; every problem, in order.
    pub fn validate(&self) -> Vec<Problem> {
        let mut problems = Vec::new();
        if let Some(listen) = &self.listen {
            if listen.parse::<std::net::SocketAddr>().is_err() {
                problems.push(Problem::new(
                    "dashboard.listen",
                    "not an address like 127.0.0.1:8082",
                ));
            }
        }
        if let Some(public) = &self.public_url {
            let ok = url::Url::parse(public)
                .is_ok_and(|u| matches!(u.scheme(), "http" | "https") && u.host().is_some());
            if !ok {
                problems.push(Problem::new(
                    "dashboard.public_url",
                    "not an http(s) URL like https://api.example.com/dashboard/",
                ));
            }
        }
        if !(60..=30 * 86_400).contains(&self.session_idle_seconds) {
            problems.push(Problem::new(
                "dashboard.session_idle_seconds",
                "must be 60 to 2592000 (30 days)",
            ));
        }
        for (key, value) in [
            (
                "dashboard.sign_in_per_address_per_hour",
                self.sign_in_per_address_per_hour,
            ),
            (
                "dashboard.sign_in_per_email_per_hour",
                self.sign_in_per_email_per_hour,
            ),
        ] {
            if value == 0 {
                problems.push(Problem::new(key, "must be at least 1"));
            }
        }
        problems
    }

    /// The base of links in sign-in mails, ending in `/dashboard/`: `public_url`, else `host`
    /// reached over `https` or `http`.
    pub fn link_base(&self, host: &str, secure: bool) -> String {
        match &self.public_url {
            Some(url) => {
                let trimmed = url.trim_end_matches('/');
                match trimmed.ends_with("/dashboard") {
                    true => format!("{trimmed}/"),
                    false => format!("{trimmed}/dashboard/"),
                }
            }
            None => {
                let scheme = if secure { "https" } else { "http" };
                format!("{scheme}://{host}/dashboard/")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_start_at_the_public_url_or_the_request_host() {
        let mut c = DashboardConfig::default();
        assert_eq!(c.link_base("gw:8080", false), "http://gw:8080/dashboard/");
        c.public_url = Some("https://api.example.com".into());
        assert_eq!(
            c.link_base("evil", false),
            "https://api.example.com/dashboard/"
        );
        c.public_url = Some("https://api.example.com/dashboard/".into());
        assert_eq!(
            c.link_base("evil", true),
            "https://api.example.com/dashboard/"
        );
    }

    #[test]
    fn bad_values_are_named() {
        let c = DashboardConfig {
            listen: Some("nowhere".into()),
            public_url: Some("ftp://x".into()),
            session_idle_seconds: 5,
            sign_in_per_email_per_hour: 0,
            ..DashboardConfig::default()
        };
        let keys: Vec<String> = c.validate().into_iter().map(|p| p.key).collect();
        assert_eq!(
            keys,
            [
                "dashboard.listen",
                "dashboard.public_url",
                "dashboard.session_idle_seconds",
                "dashboard.sign_in_per_email_per_hour"
            ]
        );
    }
}
