//! The workspace dashboard end to end: a real gateway process, real Redis, a real SMTP sink
//! and webhook receiver; pages driven in headless Chromium over WebDriver, and plain HTTP for
//! what a browser hides (headers, cookies, refusals).

mod browser;
#[path = "../common/mod.rs"]
mod common;
mod plain;
mod walk;

use common::*;
use std::time::Duration;
use svcgate::config::Config;

/// The address every test workspace has as its admin.
const ADMIN_EMAIL: &str = "ops@example.com";

/// `[smtp]` for the sink at `port`, and webhooks that may target loopback receivers.
fn mail_and_hooks(port: u16) -> impl FnOnce(&mut Config) {
    move |c| {
        c.smtp.host = Some("127.0.0.1".to_string());
        c.smtp.port = port;
        c.smtp.from = "dashboard@svcgate.test".to_string();
        c.webhooks.allow_insecure_targets = true;
        c.webhooks.retry_schedule_seconds = vec![1, 1];
    }
}

/// Waits for the sign-in mail to `to` in `sink` and returns the link in it.
async fn mailed_link(sink: &SmtpSink, to: &str) -> String {
    let mut link = None;
    let found = eventually(Duration::from_secs(10), || {
        let mails = sink.mails();
        link = mails
            .iter()
            .rev()
            .find(|m| m.to.iter().any(|t| t.contains(to)))
            .and_then(|m| link_in(&m.data));
        std::future::ready(link.is_some())
    })
    .await;
    assert!(found.is_some(), "no sign-in mail to {to}");
    link.unwrap()
}

/// The sign-in link in a mail's text (quoted-printable: long lines are broken with `=`).
fn link_in(mail: &str) -> Option<String> {
    let mail = mail.replace("=\r\n", "").replace("=3D", "=");
    let start = mail.find("http://")?;
    let rest = &mail[start..];
    let end = rest.find(char::is_whitespace).unwrap_or(rest.len());
    Some(rest[..end].to_string())
}
