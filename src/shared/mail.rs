//! E-mail: over SMTP when `[smtp] host` is set, else as `.eml` files in an outbox directory
//! (development, tests, or a mail pickup directory). `[smtp]` and the mailer live here, where
//! every area that mails (pause notices, dashboard sign-in links) reaches them.

use lettre::message::Mailbox;
use lettre::transport::smtp::authentication::Credentials;
use lettre::transport::smtp::client::{Certificate, Tls, TlsParameters};
use lettre::{AsyncFileTransport, AsyncSmtpTransport, AsyncTransport, Message, Tokio1Executor};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

use super::problem::Problem;

/// `[smtp]`: how admin e-mails are sent. Without a host they go to `webhooks.outbox_dir`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SmtpConfig {
    /// SMTP relay host; absent: write e-mails to the outbox directory.
    pub host: Option<String>,
    /// SMTP port: 25 for a local relay, 587 with `starttls`, 465 with `tls`.
    pub port: u16,
    /// Sender address.
    pub from: String,
    /// How the connection is protected.
    pub tls: SmtpTls,
    /// User name for SMTP AUTH (with `password`; needs `tls`).
    pub username: Option<String>,
    /// Password for SMTP AUTH; best set as `SVCGATE_SMTP_PASSWORD` from a secret.
    pub password: Option<String>,
    /// A PEM file of CA certificates to trust besides the system's (a relay with a private CA).
    pub tls_ca_file: Option<String>,
}

/// `smtp.tls`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SmtpTls {
    /// Plain SMTP, as to a relay on the node or in the pod.
    None,
    /// Upgrade with STARTTLS, which the server must offer (port 587).
    Starttls,
    /// TLS from the first byte (port 465).
    Tls,
}

impl Default for SmtpConfig {
    fn default() -> Self {
        Self {
            host: None,
            port: 25,
            from: "svcgate@example.com".to_string(),
            tls: SmtpTls::None,
            username: None,
            password: None,
            tls_ca_file: None,
        }
    }
}

impl SmtpConfig {
    /// Checks the section; every problem, in order.
    pub fn validate(&self) -> Vec<Problem> {
        let mut problems = Vec::new();
        if self.from.parse::<lettre::message::Mailbox>().is_err() {
            problems.push(Problem::new("smtp.from", "not an e-mail address"));
        }
        problems.extend(validate_smtp(self));
        problems
    }
}

fn validate_smtp(smtp: &SmtpConfig) -> Vec<Problem> {
    let mut problems = Vec::new();
    if let Some(host) = &smtp.host {
        // A name or an address, as a relay is written; no scheme, port or path.
        let is_host = !host.is_empty()
            && host.len() <= 253
            && host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-.:[]_".contains(&b));
        if !is_host {
            problems.push(Problem::new(
                "smtp.host",
                "not a host name or address (the port goes in smtp.port)",
            ));
        }
    }
    if smtp.port == 0 {
        problems.push(Problem::new("smtp.port", "must be 1 to 65535"));
    }
    match (&smtp.username, &smtp.password) {
        (Some(_), None) => problems.push(Problem::new("smtp.password", "smtp.username needs it")),
        (None, Some(_)) => problems.push(Problem::new("smtp.username", "smtp.password needs it")),
        (Some(_), Some(_)) if smtp.tls == SmtpTls::None => problems.push(Problem::new(
            "smtp.tls",
            "a password is sent only over TLS: set \"starttls\" or \"tls\"",
        )),
        _ => {}
    }
    if let Some(path) = &smtp.tls_ca_file {
        if smtp.tls == SmtpTls::None {
            problems.push(Problem::new(
                "smtp.tls_ca_file",
                "needs smtp.tls = \"starttls\" or \"tls\"",
            ));
        } else if let Err(e) = std::fs::read(path) {
            problems.push(Problem::new(
                "smtp.tls_ca_file",
                format!("cannot read {path}: {e}"),
            ));
        }
    }
    problems
}
/// Why an e-mail did not go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MailError {
    /// None of the addresses can be mailed: trying again will not help.
    NoRecipients,
    /// The relay or the outbox did not take it (it may next time).
    Failed(String),
}

impl std::fmt::Display for MailError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NoRecipients => f.write_str("no e-mail address that can be mailed"),
            Self::Failed(why) => f.write_str(why),
        }
    }
}

/// Where admin e-mails go.
#[derive(Clone)]
pub struct Mailer {
    from: Mailbox,
    transport: Transport,
}

#[derive(Clone)]
enum Transport {
    Smtp(AsyncSmtpTransport<Tokio1Executor>),
    Outbox(PathBuf),
}

impl Mailer {
    /// From the `[smtp]` settings (already validated); without a host, mail goes to
    /// `outbox_dir`.
    pub fn new(smtp: &SmtpConfig, outbox_dir: &str) -> Result<Self, String> {
        let from = smtp
            .from
            .parse()
            .unwrap_or_else(|_| Mailbox::new(None, "svcgate@example.com".parse().expect("valid")));
        let transport = match &smtp.host {
            Some(host) => Transport::Smtp(smtp_transport(host, smtp)?),
            None => Transport::Outbox(PathBuf::from(outbox_dir)),
        };
        Ok(Self { from, transport })
    }

    /// Sends `subject` and `body` to those of `to` that can be mailed ([`can_mail`]); the others
    /// are skipped.
    pub async fn send(&self, to: &[String], subject: &str, body: String) -> Result<(), MailError> {
        let mut message = Message::builder().from(self.from.clone()).subject(subject);
        let mut recipients = 0;
        for address in to {
            match address.parse::<lettre::Address>() {
                Ok(address) if can_mail(address.as_ref()) => {
                    message = message.to(Mailbox::new(None, address));
                    recipients += 1;
                }
                _ => tracing::warn!("skipping an address that cannot be mailed"),
            }
        }
        if recipients == 0 {
            return Err(MailError::NoRecipients);
        }
        let message = message
            .body(body)
            .map_err(|e| MailError::Failed(format!("cannot build the mail: {e}")))?;
        let sent = match &self.transport {
            Transport::Smtp(smtp) => smtp
                .send(message)
                .await
                .map(drop)
                .map_err(|e| e.to_string()),
            Transport::Outbox(dir) => match tokio::fs::create_dir_all(dir).await {
                Err(e) => Err(format!("cannot create {}: {e}", dir.display())),
                Ok(()) => AsyncFileTransport::<Tokio1Executor>::new(dir)
                    .send(message)
                    .await
                    .map(drop)
                    .map_err(|e| e.to_string()),
            },
        };
        sent.map_err(MailError::Failed)
    }
}

/// Whether `address` is one the mailer can send to (and plausibly delivered: its domain has
/// a dot).
pub fn can_mail(address: &str) -> bool {
    address
        .parse::<lettre::Address>()
        .is_ok_and(|a| a.domain().contains('.') && !a.domain().ends_with('.'))
}

/// The relay connection `[smtp]` describes: plain, STARTTLS or TLS, verified against the
/// system's roots and `tls_ca_file`, with AUTH when a user name is set.
fn smtp_transport(
    host: &str,
    smtp: &SmtpConfig,
) -> Result<AsyncSmtpTransport<Tokio1Executor>, String> {
    let tls = || {
        let mut params = TlsParameters::builder(host.to_string());
        if let Some(path) = &smtp.tls_ca_file {
            let pem = std::fs::read(path)
                .map_err(|e| format!("smtp.tls_ca_file: cannot read {path}: {e}"))?;
            let ca = Certificate::from_pem(&pem)
                .map_err(|e| format!("smtp.tls_ca_file: not PEM certificates: {e}"))?;
            params = params.add_root_certificate(ca);
        }
        params
            .build()
            .map_err(|e| format!("smtp: cannot set up TLS: {e}"))
    };
    let tls = match smtp.tls {
        SmtpTls::None => Tls::None,
        SmtpTls::Starttls => Tls::Required(tls()?),
        SmtpTls::Tls => Tls::Wrapper(tls()?),
    };
    let mut builder = AsyncSmtpTransport::<Tokio1Executor>::builder_dangerous(host)
        .port(smtp.port)
        .tls(tls);
    if let (Some(user), Some(password)) = (&smtp.username, &smtp.password) {
        builder = builder.credentials(Credentials::new(user.clone(), password.clone()));
    }
    Ok(builder.build())
}
