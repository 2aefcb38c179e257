//! The e-mail that tells a workspace's admins an endpoint was paused.

use super::endpoint::Endpoint;
pub use crate::shared::mail::{can_mail, MailError, Mailer};

/// Tells `admins` that `endpoint` was paused after its last retry failed; addresses that do
/// not parse are skipped.
pub async fn endpoint_paused(
    mailer: &Mailer,
    admins: &[String],
    endpoint: &Endpoint,
    last_error: &str,
) -> Result<(), MailError> {
    let body = format!(
        "Every delivery attempt to your webhook endpoint failed, so it is paused and gets no \
         events until it is resumed.\n\n\
         Endpoint: {id}\nURL: {url}\nEnvironment: {env}\nLast error: {last_error}\n\n\
         Fix the endpoint, then resume it with POST /v1/webhooks/{id}/resume and replay \
         the events it missed with POST /v1/webhooks/{id}/replay {{\"since\": <unix time>}}.\n",
        id = endpoint.id,
        url = endpoint.url,
        env = endpoint.environment.as_str(),
    );
    let subject = format!("Webhook endpoint {} paused", endpoint.id);
    mailer.send(admins, &subject, body).await
}
