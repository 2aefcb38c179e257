//! What a browser does not show: the headers of every page, the session cookie's flags, forms
//! refused without their CSRF token, sign-in links that work once, the same answer for known
//! and unknown addresses, and sign-in attempts limited.

use reqwest::header::{CONTENT_SECURITY_POLICY, LOCATION, SET_COOKIE};
use reqwest::redirect::Policy;
use reqwest::{Client, Response};

use super::*;

/// A form body on a request.
trait FormOf {
    fn form_of<V: AsRef<str>>(self, pairs: &[(&str, V)]) -> Self;
}

impl FormOf for reqwest::RequestBuilder {
    fn form_of<V: AsRef<str>>(self, pairs: &[(&str, V)]) -> Self {
        let mut body = url::form_urlencoded::Serializer::new(String::new());
        for (k, v) in pairs {
            body.append_pair(k, v.as_ref());
        }
        self.header("content-type", "application/x-www-form-urlencoded")
            .body(body.finish())
    }
}

/// An HTTP client that shows redirects instead of following them.
fn client() -> Client {
    Client::builder().redirect(Policy::none()).build().unwrap()
}

/// The `name=value` of the session cookie a response sets.
fn session_cookie(resp: &Response) -> String {
    let set = resp.headers()[SET_COOKIE].to_str().unwrap();
    set.split(';').next().unwrap().to_string()
}

/// Signs in as an operator with the admin token; the cookie.
async fn operator(gw: &Gateway) -> String {
    let resp = client()
        .post(format!("{}/dashboard/sign-in/token", gw.base))
        .form_of(&[("token", ADMIN_TOKEN)])
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 303);
    session_cookie(&resp)
}

/// The CSRF token in a page's forms.
fn csrf_of(page: &str) -> String {
    let at = page.find("name=\"_csrf\" value=\"").unwrap() + 20;
    page[at..at + 64].to_string()
}

async fn get(gw: &Gateway, cookie: &str, path: &str) -> Response {
    client()
        .get(format!("{}{path}", gw.base))
        .header("cookie", cookie)
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn pages_carry_a_csp_without_inline_script_and_are_not_cached() {
    let gw = Gateway::builder().start().await;
    let resp = client()
        .get(format!("{}/dashboard/sign-in", gw.base))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let csp = resp.headers()[CONTENT_SECURITY_POLICY]
        .to_str()
        .unwrap()
        .to_string();
    assert!(
        csp.contains("script-src 'self'") && !csp.contains("unsafe-inline"),
        "{csp}"
    );
    assert!(csp.contains("frame-ancestors 'none'"));
    assert_eq!(resp.headers()["cache-control"], "no-store");
    assert_eq!(resp.headers()["referrer-policy"], "no-referrer");
    let page = resp.text().await.unwrap();
    assert!(
        !page.contains("<script>") && !page.contains("style="),
        "{page}"
    );
    assert!(page.contains("<script src=\"/dashboard/assets/app.js\""));
    let js = client()
        .get(format!("{}/dashboard/assets/app.js", gw.base))
        .send()
        .await
        .unwrap();
    assert_eq!(js.status(), 200);
    assert!(js.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/javascript"));
    // Not signed in: on to the sign-in page.
    let resp = get(&gw, "", "/dashboard/w/ws_demo/keys").await;
    assert_eq!(resp.status(), 303);
    assert_eq!(resp.headers()[LOCATION], "/dashboard/sign-in");
}

#[tokio::test]
async fn the_session_cookie_is_http_only_strict_and_secure_behind_tls() {
    let gw = Gateway::builder()
        .config(|c| c.server.trusted_proxies = vec!["127.0.0.1".into()])
        .start()
        .await;
    let sign_in = |proto: Option<&'static str>| {
        let mut req = client()
            .post(format!("{}/dashboard/sign-in/token", gw.base))
            .form_of(&[("token", ADMIN_TOKEN)]);
        if let Some(proto) = proto {
            req = req.header("x-forwarded-proto", proto);
        }
        req.send()
    };
    let plain = sign_in(None).await.unwrap();
    let set = plain.headers()[SET_COOKIE].to_str().unwrap().to_string();
    assert!(
        set.contains("HttpOnly") && set.contains("SameSite=Strict"),
        "{set}"
    );
    assert!(!set.contains("Secure"), "{set}");
    let tls = sign_in(Some("https")).await.unwrap();
    let set = tls.headers()[SET_COOKIE].to_str().unwrap();
    assert!(set.ends_with("; Secure"), "{set}");
    // A wrong token starts no session.
    let wrong = client()
        .post(format!("{}/dashboard/sign-in/token", gw.base))
        .form_of(&[("token", "not-the-token")])
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status(), 401);
    assert!(wrong.headers().get(SET_COOKIE).is_none());
}

#[tokio::test]
async fn a_form_without_the_session_csrf_token_changes_nothing() {
    let gw = Gateway::builder().start().await;
    let cookie = operator(&gw).await;
    let page = get(&gw, &cookie, "/dashboard/w/ws_demo/keys").await;
    assert_eq!(page.status(), 200);
    let csrf = csrf_of(&page.text().await.unwrap());
    let create = |token: String| {
        client()
            .post(format!("{}/dashboard/w/ws_demo/keys", gw.base))
            .header("cookie", &cookie)
            .form_of(&[
                ("_csrf", token),
                ("name", "k".into()),
                ("environment", "test".into()),
                ("scopes", "models:read".into()),
            ])
            .send()
    };
    for bad in [String::new(), "0".repeat(64), csrf[..63].to_string()] {
        assert_eq!(create(bad).await.unwrap().status(), 403);
    }
    assert!(gw.list_keys("ws_demo").await.is_empty());
    let made = create(csrf).await.unwrap();
    assert_eq!(made.status(), 200);
    assert!(made.text().await.unwrap().contains("svc_test_"));
    assert_eq!(gw.list_keys("ws_demo").await.len(), 1);
    // Signing out ends the session: the cookie opens nothing more.
    let out = client()
        .post(format!("{}/dashboard/sign-out", gw.base))
        .header("cookie", &cookie)
        .form_of(&[(
            "_csrf",
            csrf_of(
                &get(&gw, &cookie, "/dashboard/w/ws_demo/keys")
                    .await
                    .text()
                    .await
                    .unwrap(),
            ),
        )])
        .send()
        .await
        .unwrap();
    assert_eq!(out.status(), 303);
    assert_eq!(
        get(&gw, &cookie, "/dashboard/w/ws_demo/keys")
            .await
            .status(),
        303
    );
}

#[tokio::test]
async fn a_link_works_once_and_unknown_addresses_get_the_same_answer() {
    let ns = TestNamespace::new();
    let sink = SmtpSink::start();
    let gw = Gateway::builder()
        .redis(&redis_url(), &ns.name)
        .config(mail_and_hooks(sink.port))
        .start()
        .await;
    let ws = gw.create_workspace().await;
    let ask = |email: &'static str| {
        client()
            .post(format!("{}/dashboard/sign-in", gw.base))
            .form_of(&[("email", email)])
            .send()
    };
    let known = ask(ADMIN_EMAIL).await.unwrap();
    let unknown = ask("nobody@example.com").await.unwrap();
    assert_eq!(known.status(), unknown.status());
    assert_eq!(known.text().await.unwrap(), unknown.text().await.unwrap());
    let link = mailed_link(&sink, ADMIN_EMAIL).await;
    let token = link.split("token=").nth(1).unwrap().to_string();
    let use_link = || {
        client()
            .post(format!("{}/dashboard/sign-in/link", gw.base))
            .form_of(&[("token", token.as_str())])
            .send()
    };
    let first = use_link().await.unwrap();
    assert_eq!(first.status(), 303);
    let cookie = session_cookie(&first);
    let again = use_link().await.unwrap();
    assert_eq!(again.status(), 400, "a link works once");
    assert!(again.headers().get(SET_COOKIE).is_none());
    assert!(sink
        .mails()
        .iter()
        .all(|m| !m.to.iter().any(|t| t.contains("nobody"))));
    // The admin opens their workspace, and no other.
    assert_eq!(
        get(&gw, &cookie, &format!("/dashboard/w/{ws}/keys"))
            .await
            .status(),
        200
    );
    assert_eq!(
        get(&gw, &cookie, "/dashboard/w/ws_other/keys")
            .await
            .status(),
        404
    );
    // Removing the address from the workspace ends its access at once.
    let patched = gw
        .admin_request(
            reqwest::Method::PATCH,
            &format!("/admin/v1/workspaces/{ws}"),
        )
        .json(&serde_json::json!({"admin_emails": ["someone@example.com"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(patched.status(), 200);
    assert_eq!(
        get(&gw, &cookie, &format!("/dashboard/w/{ws}/keys"))
            .await
            .status(),
        404
    );
}

#[tokio::test]
async fn sign_in_attempts_are_limited_per_address_and_per_email() {
    let gw = Gateway::builder()
        .config(|c| {
            c.dashboard.sign_in_per_email_per_hour = 2;
            c.dashboard.sign_in_per_address_per_hour = 5;
        })
        .start()
        .await;
    let ask = |email: &'static str| {
        client()
            .post(format!("{}/dashboard/sign-in", gw.base))
            .form_of(&[("email", email)])
            .send()
    };
    assert_eq!(ask("a@example.com").await.unwrap().status(), 200);
    assert_eq!(ask("a@example.com").await.unwrap().status(), 200);
    assert_eq!(
        ask("a@example.com").await.unwrap().status(),
        429,
        "per e-mail"
    );
    assert_eq!(ask("b@example.com").await.unwrap().status(), 200);
    assert_eq!(ask("c@example.com").await.unwrap().status(), 200);
    assert_eq!(
        ask("d@example.com").await.unwrap().status(),
        429,
        "per address"
    );
    let token = client()
        .post(format!("{}/dashboard/sign-in/token", gw.base))
        .form_of(&[("token", ADMIN_TOKEN)])
        .send()
        .await
        .unwrap();
    assert_eq!(
        token.status(),
        429,
        "the admin token too, from that address"
    );
}

#[tokio::test]
async fn the_audit_log_names_who_acted_and_exports_as_csv() {
    let gw = Gateway::builder().start().await;
    let cookie = operator(&gw).await;
    let page = get(&gw, &cookie, "/dashboard/w/ws_demo/keys").await;
    let csrf = csrf_of(&page.text().await.unwrap());
    let made = client()
        .post(format!("{}/dashboard/w/ws_demo/keys", gw.base))
        .header("cookie", &cookie)
        .form_of(&[
            ("_csrf", csrf.as_str()),
            ("environment", "test"),
            ("scopes", "models:read"),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(made.status(), 200);
    let found = eventually(Duration::from_secs(5), || async {
        let page = get(&gw, &cookie, "/dashboard/w/ws_demo/audit?status=2xx").await;
        page.text().await.unwrap().contains("dashboard:root")
    })
    .await;
    assert!(found.is_some(), "the creation is on the audit page");
    let none = get(&gw, &cookie, "/dashboard/w/ws_demo/audit?status=5xx").await;
    assert!(!none.text().await.unwrap().contains("dashboard:root"));
    let csv = get(&gw, &cookie, "/dashboard/w/ws_demo/audit?format=csv").await;
    assert_eq!(csv.status(), 200);
    assert!(csv.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/csv"));
    let text = csv.text().await.unwrap();
    let mut lines = text.lines();
    assert!(lines
        .next()
        .unwrap()
        .starts_with("time_ms,request_id,actor,"));
    let row = lines.next().unwrap();
    assert!(
        row.contains(",dashboard:root,") && row.contains(",POST,/dashboard/w/ws_demo/keys,"),
        "{row}"
    );
}
