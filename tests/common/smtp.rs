//! An SMTP server that keeps every message, for admin e-mails.

use std::net::TcpListener;
use std::sync::{Arc, Mutex};

use super::certs::Certificates;

/// One message an [`SmtpSink`] accepted.
#[derive(Debug, Clone)]
pub struct Mail {
    pub from: String,
    pub to: Vec<String>,
    pub data: String,
}

/// A real SMTP server on loopback (mailin) that keeps every message it accepts.
pub struct SmtpSink {
    pub port: u16,
    mails: Arc<Mutex<Vec<Mail>>>,
    logins: Arc<Mutex<Vec<(String, String)>>>,
}

#[derive(Clone)]
struct SinkHandler {
    mails: Arc<Mutex<Vec<Mail>>>,
    current: Option<Mail>,
    /// `(user, password)` a client must log in with; `None`: no AUTH.
    login: Option<(String, String)>,
    logins: Arc<Mutex<Vec<(String, String)>>>,
}

impl mailin_embedded::Handler for SinkHandler {
    fn auth_plain(
        &mut self,
        _authorization_id: &str,
        user: &str,
        password: &str,
    ) -> mailin_embedded::Response {
        self.logins
            .lock()
            .unwrap()
            .push((user.to_string(), password.to_string()));
        match &self.login {
            Some((u, p)) if u == user && p == password => mailin_embedded::response::AUTH_OK,
            _ => mailin_embedded::response::INVALID_CREDENTIALS,
        }
    }

    fn data_start(
        &mut self,
        _domain: &str,
        from: &str,
        _is8bit: bool,
        to: &[String],
    ) -> mailin_embedded::Response {
        self.current = Some(Mail {
            from: from.to_string(),
            to: to.to_vec(),
            data: String::new(),
        });
        mailin_embedded::response::OK
    }

    fn data(&mut self, buf: &[u8]) -> std::io::Result<()> {
        if let Some(mail) = self.current.as_mut() {
            mail.data.push_str(&String::from_utf8_lossy(buf));
        }
        Ok(())
    }

    fn data_end(&mut self) -> mailin_embedded::Response {
        if let Some(mail) = self.current.take() {
            self.mails.lock().unwrap().push(mail);
        }
        mailin_embedded::response::OK
    }
}

impl SmtpSink {
    /// Plain SMTP, no AUTH: a relay in the cluster.
    pub fn start() -> Self {
        Self::serve(None, None)
    }

    /// STARTTLS with the `server` certificate of `certs`, and AUTH PLAIN (offered only after
    /// STARTTLS) that takes `user` and `password` alone.
    pub fn start_tls(certs: &Certificates, user: &str, password: &str) -> Self {
        Self::serve(
            Some(mailin_embedded::SslConfig::SelfSigned {
                cert_path: certs.path("server.pem").display().to_string(),
                key_path: certs.path("server.key").display().to_string(),
            }),
            Some((user.to_string(), password.to_string())),
        )
    }

    fn serve(ssl: Option<mailin_embedded::SslConfig>, login: Option<(String, String)>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let mails: Arc<Mutex<Vec<Mail>>> = Arc::default();
        let logins: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
        let requires_login = login.is_some();
        let mut server = mailin_embedded::Server::new(SinkHandler {
            mails: mails.clone(),
            current: None,
            login,
            logins: logins.clone(),
        });
        server.with_num_threads(2).with_tcp_listener(listener);
        if let Some(ssl) = ssl {
            server.with_ssl(ssl).unwrap();
        }
        if requires_login {
            server.with_auth(mailin_embedded::AuthMechanism::Plain);
        }
        std::thread::spawn(move || {
            let _ = server.serve();
        });
        Self {
            port,
            mails,
            logins,
        }
    }

    /// Every `(user, password)` a client tried.
    pub fn logins(&self) -> Vec<(String, String)> {
        self.logins.lock().unwrap().clone()
    }

    pub fn mails(&self) -> Vec<Mail> {
        self.mails.lock().unwrap().clone()
    }
}
