//! E-mail to workspace admins: over SMTP when a relay is configured, else as `.eml` files in
//! the outbox directory (development, tests, or a mail pickup directory).

use lettre::message::Mailbox;
use lettre::transport::smtp::authentication::Credentials;
use lettre::transport::smtp::client::{Certificate, Tls, TlsParameters};
use lettre::{AsyncFileTransport, AsyncSmtpTransport, AsyncTransport, Message, Tokio1Executor};
use std::path::PathBuf;

use super::config::{SmtpConfig, SmtpTls, WebhooksConfig};
use crate::webhooks::endpoint::Endpoint;

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
            Self::NoRecipients => f.write_str("no admin e-mail address that can be mailed"),
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
    /// From the `[smtp]` and `[webhooks]` settings (already validated).
    pub fn new(smtp: &SmtpConfig, webhooks: &WebhooksConfig) -> Result<Self, String> {
        let from = smtp
            .from
            .parse()
            .unwrap_or_else(|_| Mailbox::new(None, "svcgate@example.com".parse().expect("valid")));
        let transport = match &smtp.host {
            Some(host) => Transport::Smtp(smtp_transport(host, smtp)?),
            None => Transport::Outbox(PathBuf::from(&webhooks.outbox_dir)),
        };
        Ok(Self { from, transport })
    }

    /// Tells `admins` that `endpoint` was paused after its last retry failed, or, `disabled`,
    /// that it was disabled after its receiver answered 410 Gone; addresses that do not parse
    /// are skipped.
    pub async fn endpoint_paused(
        &self,
        admins: &[String],
        endpoint: &Endpoint,
        last_error: &str,
        disabled: bool,
    ) -> Result<(), MailError> {
        let (state, why) = match disabled {
            true => (
                "disabled",
                "Your webhook endpoint answered 410 Gone, so it is disabled and gets no events \
                 until it is resumed.",
            ),
            false => (
                "paused",
                "Every delivery attempt to your webhook endpoint failed, so it is paused and gets \
                 no events until it is resumed.",
            ),
        };
        let body = format!(
            "{why}\n\n\
             Endpoint: {id}\nURL: {url}\nEnvironment: {env}\nLast error: {last_error}\n\n\
             Fix the endpoint, then resume it with POST /v1/webhooks/{id}/resume and replay \
             the events it missed with POST /v1/webhooks/{id}/replay {{\"since\": <unix time>}}.\n",
            id = endpoint.id,
            url = endpoint.url,
            env = endpoint.environment.as_str(),
        );
        let subject = format!("Webhook endpoint {} {state}", endpoint.id);
        self.send(admins, &endpoint.workspace, subject, body).await
    }

    /// Tells `admins` that one of their keys was found where it must not be (`seen`: where and
    /// by what), and whether it was revoked. The key appears as its prefix and last four.
    pub async fn key_leaked(
        &self,
        admins: &[String],
        leak: &LeakNotice<'_>,
    ) -> Result<(), MailError> {
        let done = match leak.revoked {
            true => "It has been revoked: requests with it are refused. Create a new key, put it \
                     where the old one was used, and keep it out of code, pages and prompts."
                .to_string(),
            false => "It was not revoked. If it should not be where it was found, rotate or \
                      revoke it now."
                .to_string(),
        };
        let body = format!(
            "A key of your workspace was found where it must not be.\n\n\
             Key: {masked} ({key_id})\nFound by: {scanner}\nWhere: {url}\n\n{done}\n",
            masked = leak.masked,
            key_id = leak.key_id,
            scanner = leak.scanner,
            url = leak.url.unwrap_or("(not given)"),
        );
        let subject = match leak.revoked {
            true => format!("Key {} revoked: found leaked", leak.masked),
            false => format!("Key {} found where it must not be", leak.masked),
        };
        self.send(admins, leak.workspace, subject, body).await
    }

    /// Sends `body` to every address of `admins` that can be mailed.
    async fn send(
        &self,
        admins: &[String],
        workspace: &str,
        subject: String,
        body: String,
    ) -> Result<(), MailError> {
        let mut message = Message::builder().from(self.from.clone()).subject(subject);
        let mut recipients = 0;
        for admin in admins {
            match admin.parse::<lettre::Address>() {
                Ok(to) if can_mail(admin) => {
                    message = message.to(Mailbox::new(None, to));
                    recipients += 1;
                }
                _ => {
                    tracing::warn!(workspace, "skipping an admin address that cannot be mailed")
                }
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

/// What [`Mailer::key_leaked`] tells a workspace's admins.
#[derive(Debug, Clone, Copy)]
pub struct LeakNotice<'a> {
    /// The key's workspace.
    pub workspace: &'a str,
    /// `key_…`
    pub key_id: &'a str,
    /// Prefix and last four.
    pub masked: &'a str,
    /// What found it (`github`, `browser`, …).
    pub scanner: &'a str,
    /// Where it was seen, if known.
    pub url: Option<&'a str>,
    /// Whether it was revoked.
    pub revoked: bool,
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
