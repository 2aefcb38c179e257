//! The e-mails that tell a workspace's admins an endpoint was paused or disabled, or that one
//! of their keys was found leaked.

use super::endpoint::Endpoint;
pub use crate::shared::mail::{can_mail, MailError, Mailer};

/// Tells `admins` that `endpoint` was paused after its last retry failed, or, `disabled`, that
/// it was disabled after its receiver answered 410 Gone; addresses that do not parse are
/// skipped.
pub async fn endpoint_paused(
    mailer: &Mailer,
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
    mailer.send(admins, &subject, body).await
}

/// Tells `admins` that one of their keys was found where it must not be, and whether it was
/// revoked. The key appears as its prefix and last four.
pub async fn key_leaked(
    mailer: &Mailer,
    admins: &[String],
    leak: &LeakNotice<'_>,
) -> Result<(), MailError> {
    let done = match leak.revoked {
        true => {
            "It has been revoked: requests with it are refused. Create a new key, put it \
                 where the old one was used, and keep it out of code, pages and prompts."
        }
        false => {
            "It was not revoked. If it should not be where it was found, rotate or \
                  revoke it now."
        }
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
    mailer.send(admins, &subject, body).await
}

/// What [`key_leaked`] tells a workspace's admins.
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
