//! Signing in and out: a one-time link mailed to a workspace admin, or the admin token for an
//! operator; the session that follows, its cookie and its CSRF token; and who may open which
//! workspace.

use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use http::header::SET_COOKIE;
use rand::RngCore;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::pages;
use super::store::{DashboardSession, SignInLink};
use super::web::{html, redirect, session_cookie, Ctx, Form, PageError, SESSION_COOKIE};
use super::{Dashboard, PREFIX};
use crate::ids::unix_now;
use crate::keys::Workspace;
use crate::shared::mail::can_mail;

/// How long a sign-in link works: 15 minutes.
pub const LINK_SECONDS: u64 = 15 * 60;
/// The window sign-in attempts are counted in: an hour.
const ATTEMPT_WINDOW_SECONDS: u64 = 3600;
/// Most workspaces read to find an address's: 100 pages of 100.
const WORKSPACE_PAGES: usize = 100;

/// A signed-in browser's session.
pub struct Signed {
    session: DashboardSession,
    digest: String,
}

impl Signed {
    /// Who acts, as the audit log names them: `dashboard:<email>` or `dashboard:root`.
    pub fn actor(&self) -> String {
        match &self.session.email {
            Some(email) => format!("dashboard:{email}"),
            None => "dashboard:root".to_string(),
        }
    }

    /// Who is signed in, as pages show it.
    pub fn who(&self) -> &str {
        self.session.email.as_deref().unwrap_or("operator")
    }

    /// The session's CSRF token, for its forms.
    pub fn csrf(&self) -> &str {
        &self.session.csrf
    }

    /// Refuses a form without this session's CSRF token (compared in constant time).
    pub fn check_csrf(&self, form: &Form) -> Result<(), PageError> {
        let sent = form.get("_csrf").unwrap_or_default();
        let expected = self.session.csrf.as_bytes();
        let same: bool = Sha256::digest(sent.as_bytes())
            .ct_eq(&Sha256::digest(expected))
            .into();
        match same {
            true => Ok(()),
            false => Err(PageError::forbidden(
                "This form has expired. Go back, reload the page and try again.",
            )),
        }
    }

    /// Whether workspace `ws` is this session's to open: any for an operator, for an admin
    /// those whose `admin_emails` hold their address (read on every request, so removing an
    /// address ends its access at once).
    pub fn may_open(&self, ws: &Workspace) -> bool {
        match &self.session.email {
            None => true,
            Some(email) => ws
                .admin_emails
                .iter()
                .any(|a| a.eq_ignore_ascii_case(email)),
        }
    }
}

/// A random token: 32 bytes, hex.
fn random_token() -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    hex::encode(bytes)
}

/// The SHA-256 of `token`, hex: what the store keeps instead of it.
fn digest(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// The session of `ctx`'s cookie, if one is live.
pub async fn current(d: &Dashboard, ctx: &Ctx) -> Result<Option<Signed>, PageError> {
    let Some(token) = ctx.cookie(SESSION_COOKIE).filter(|t| t.len() == 64) else {
        return Ok(None);
    };
    let digest = digest(token);
    let session = d
        .stores()
        .sessions
        .touch_session(&digest, d.config().session_idle_seconds)
        .await?;
    Ok(session.map(|session| Signed { session, digest }))
}

/// The session of `ctx`, or a redirect to the sign-in page.
pub async fn require(d: &Dashboard, ctx: &Ctx) -> Result<Signed, PageError> {
    current(d, ctx)
        .await?
        .ok_or_else(|| PageError::Redirect(format!("{PREFIX}/sign-in")))
}

/// The session of `ctx` and workspace `ws`, which it may open; else a redirect to sign in, or
/// a 404 (whether a workspace exists is not told to those who may not open it).
pub async fn require_workspace(
    d: &Dashboard,
    ctx: &Ctx,
    ws: &str,
) -> Result<(Signed, Workspace), PageError> {
    let signed = require(d, ctx).await?;
    match d.stores().keys.workspace(ws).await? {
        Some(workspace) if signed.may_open(&workspace) => Ok((signed, workspace)),
        _ => Err(PageError::not_found("There is no such workspace.")),
    }
}

/// The workspaces `signed` may open (at most [`WORKSPACE_PAGES`] pages of them are read).
pub async fn workspaces_of(d: &Dashboard, signed: &Signed) -> Result<Vec<Workspace>, PageError> {
    let mut found = Vec::new();
    let mut after: Option<String> = None;
    for _ in 0..WORKSPACE_PAGES {
        let (page, more) = d.stores().keys.workspaces(after.as_deref(), 100).await?;
        after = page.last().map(|w| w.id.clone());
        found.extend(page.into_iter().filter(|w| signed.may_open(w)));
        if !more || after.is_none() {
            break;
        }
    }
    Ok(found)
}

/// Counts a sign-in attempt in `bucket`; 429 past `most` within the hour.
/// Counts a sign-in attempt against the client's address.
async fn count_address_attempt(d: &Dashboard, ctx: &Ctx) -> Result<(), PageError> {
    let bucket = format!("ip:{}", ctx.client.ip);
    count_attempt(d, &bucket, d.config().sign_in_per_address_per_hour).await
}

async fn count_attempt(d: &Dashboard, bucket: &str, most: u64) -> Result<(), PageError> {
    let count = d
        .stores()
        .sessions
        .count_attempt(bucket, ATTEMPT_WINDOW_SECONDS)
        .await?;
    match count > most {
        true => Err(PageError::Status(
            http::StatusCode::TOO_MANY_REQUESTS,
            "Too many sign-in attempts. Wait an hour and try again.".into(),
        )),
        false => Ok(()),
    }
}

/// Starts a session for `email` (an admin) or `None` (an operator): the cookie, and on to the
/// workspaces.
async fn start_session(
    d: &Dashboard,
    ctx: &Ctx,
    email: Option<String>,
) -> Result<Response, PageError> {
    let token = random_token();
    let session = DashboardSession {
        email,
        csrf: random_token(),
        created_at: unix_now(),
    };
    d.stores()
        .sessions
        .save_session(&digest(&token), &session, d.config().session_idle_seconds)
        .await?;
    let mut resp = redirect(&format!("{PREFIX}/workspaces"));
    if let Ok(cookie) = session_cookie(&token, ctx.client.secure).parse() {
        resp.headers_mut().insert(SET_COOKIE, cookie);
    }
    Ok(resp)
}

/// `GET /dashboard/sign-in`: the two ways in.
pub async fn page(State(d): State<Dashboard>, ctx: Ctx) -> Result<Response, PageError> {
    if current(&d, &ctx).await?.is_some() {
        return Ok(redirect(&format!("{PREFIX}/workspaces")));
    }
    Ok(html(pages::sign_in(None)))
}

/// `POST /dashboard/sign-in` (`email`): mails a one-time link when the address is a workspace
/// admin's. The answer is the same either way, and comes before the mail is sent.
pub async fn request_link(
    State(d): State<Dashboard>,
    ctx: Ctx,
    body: Bytes,
) -> Result<Response, PageError> {
    let form = Form::parse(&body)?;
    let email = form
        .get("email")
        .filter(|e| e.len() <= 254 && can_mail(e))
        .ok_or_else(|| PageError::bad_request("Enter an e-mail address like you@example.com."))?
        .to_ascii_lowercase();
    let config = d.config();
    count_address_attempt(&d, &ctx).await?;
    count_attempt(
        &d,
        &format!("email:{}", digest(&email)),
        config.sign_in_per_email_per_hour,
    )
    .await?;
    let admin = Signed {
        session: DashboardSession {
            email: Some(email.clone()),
            csrf: String::new(),
            created_at: 0,
        },
        digest: String::new(),
    };
    if !workspaces_of(&d, &admin).await?.is_empty() {
        let token = random_token();
        let link = SignInLink {
            email: email.clone(),
            created_at: unix_now(),
        };
        d.stores()
            .sessions
            .save_sign_in_link(&digest(&token), &link, LINK_SECONDS)
            .await?;
        let url = format!(
            "{}sign-in/link?token={token}",
            config.link_base(ctx.host(), ctx.client.secure)
        );
        let mailer = d.0.mailer.clone();
        // Sent after the answer: the answer takes as long for an unknown address.
        d.0.background.spawn(async move {
            let body = format!(
                "Open this link to sign in to the svcgate dashboard:\n\n{url}\n\n\
                 It works once, within 15 minutes. If you did not ask to sign in, ignore this \
                 mail.\n"
            );
            let to = [email];
            if let Err(e) = mailer.send(&to, "Sign in to svcgate", body).await {
                tracing::warn!(error = %e, "sign-in link not mailed");
            }
        });
    }
    Ok(html(pages::check_mail()))
}

#[derive(serde::Deserialize)]
pub struct LinkQuery {
    #[serde(default)]
    token: String,
}

/// `GET /dashboard/sign-in/link?token=…`: a button that uses the link. Opening the link signs
/// no one in, so a mail scanner that fetches it does not use it up.
pub async fn link_page(Query(q): Query<LinkQuery>) -> Response {
    html(pages::use_link(&q.token))
}

/// `POST /dashboard/sign-in/link` (`token`): uses the link, once.
pub async fn with_link(
    State(d): State<Dashboard>,
    ctx: Ctx,
    body: Bytes,
) -> Result<Response, PageError> {
    let form = Form::parse(&body)?;
    count_address_attempt(&d, &ctx).await?;
    let token = form.get("token").unwrap_or_default();
    let link = d
        .stores()
        .sessions
        .take_sign_in_link(&digest(token))
        .await?
        .ok_or_else(|| {
            PageError::bad_request(
                "This sign-in link was used already or has expired. Ask for a new one.",
            )
        })?;
    start_session(&d, &ctx, Some(link.email)).await
}

/// `POST /dashboard/sign-in/token` (`token`): an operator signs in with the admin token.
pub async fn with_token(
    State(d): State<Dashboard>,
    ctx: Ctx,
    body: Bytes,
) -> Result<Response, PageError> {
    let form = Form::parse(&body)?;
    count_address_attempt(&d, &ctx).await?;
    let presented: [u8; 32] =
        Sha256::digest(form.get("token").unwrap_or_default().as_bytes()).into();
    let matches: bool = presented.ct_eq(&d.0.token_digest).into();
    // The demo token is everyone's: good only from this machine.
    let allowed = !d.0.settings.demo_token || ctx.client.ip.is_loopback();
    if !(matches && allowed) {
        let mut resp = html(pages::sign_in(Some("That is not the admin token.")));
        *resp.status_mut() = http::StatusCode::UNAUTHORIZED;
        return Ok(resp);
    }
    start_session(&d, &ctx, None).await
}

/// `POST /dashboard/sign-out`: ends the session on every replica.
pub async fn sign_out(
    State(d): State<Dashboard>,
    ctx: Ctx,
    body: Bytes,
) -> Result<Response, PageError> {
    let form = Form::parse(&body)?;
    if let Some(signed) = current(&d, &ctx).await? {
        signed.check_csrf(&form)?;
        d.stores().sessions.end_session(&signed.digest).await?;
    }
    let mut resp = redirect(&format!("{PREFIX}/sign-in"));
    if let Ok(cookie) = session_cookie("", ctx.client.secure).parse() {
        resp.headers_mut().insert(SET_COOKIE, cookie);
    }
    Ok(resp.into_response())
}
