//! A running gateway process: readiness, upgrade, worker, logs, exit.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::builder::GatewayBuilder;
use super::cli::{svcgate_command, Worker};
use super::ports::free_port;

/// A running gateway process, killed on drop.
pub struct Gateway {
    pub(super) child: Option<Child>,
    /// Gateway base URL.
    pub base: String,
    /// Admin API base URL.
    pub admin: String,
    /// Metrics base URL.
    pub metrics: String,
    pub http: reqwest::Client,
    pub(super) log_path: PathBuf,
    /// Where this gateway spools spend and audit records.
    pub spool_dir: PathBuf,
    pub(super) config_path: PathBuf,
    pub(super) _dir: tempfile::TempDir,
}

impl Gateway {
    pub fn builder() -> GatewayBuilder {
        GatewayBuilder::default()
    }

    /// Waits until both listeners answer; `false` if the process exited because a port was
    /// taken.
    pub(super) async fn wait_ready(&mut self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(child) = self.child.as_mut() {
                if child.try_wait().ok().flatten().is_some() {
                    let log = self.logs();
                    assert!(log.contains("cannot listen"), "gateway exited; log:\n{log}");
                    self.child = None;
                    return false;
                }
            }
            let admin_up = self
                .http
                .get(format!("{}/healthz", self.admin))
                .send()
                .await;
            let gw_up = self.http.get(format!("{}/healthz", self.base)).send().await;
            // The metrics listener is Pingora's service too, and may come up last.
            let metrics_up = self
                .http
                .get(format!("{}/metrics", self.metrics))
                .send()
                .await;
            let up = |r: &reqwest::Result<reqwest::Response>| {
                r.as_ref().is_ok_and(|r| r.status() == 200)
            };
            if up(&admin_up) && up(&gw_up) && up(&metrics_up) {
                return true;
            }
            assert!(
                Instant::now() < deadline,
                "gateway did not start; log:\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// A graceful upgrade: starts a new process with `serve -u` on the same config, tells the
    /// old one to hand over its listeners (SIGQUIT), and waits for the old one to exit.
    pub fn upgrade(&mut self) {
        let log = std::fs::OpenOptions::new()
            .append(true)
            .open(&self.log_path)
            .unwrap();
        let new = svcgate_command()
            .args(["serve", "-u", "--config"])
            .arg(&self.config_path)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("svcgate starts");
        // The old process hands over once the new one waits for the listeners (a SIGQUIT
        // before that is refused, and it serves on): ask until it goes.
        let mut old = self.child.replace(new).unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut asked = Instant::now() - Duration::from_secs(1);
        while old.try_wait().unwrap().is_none() {
            assert!(Instant::now() < deadline, "the old process did not exit");
            if asked.elapsed() >= Duration::from_millis(500) {
                Command::new("kill")
                    .args(["-QUIT", &old.id().to_string()])
                    .status()
                    .unwrap();
                asked = Instant::now();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The config file this gateway runs on.
    pub fn config_path(&self) -> &std::path::Path {
        &self.config_path
    }

    /// Starts `svcgate worker` on this gateway's config (its metrics on a port of its own).
    pub fn start_worker(&self) -> Worker {
        let log_path = self._dir.path().join(format!("worker-{}.log", free_port()));
        let child = svcgate_command()
            .env(
                "SVCGATE_SERVER_METRICS_LISTEN",
                format!("127.0.0.1:{}", free_port()),
            )
            .args(["worker", "--config"])
            .arg(&self.config_path)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log_path).unwrap())
            .spawn()
            .expect("svcgate worker starts");
        Worker { child, log_path }
    }

    /// The Prometheus text on the metrics listener now.
    pub async fn metrics_text(&self) -> String {
        self.http
            .get(format!("{}/metrics", self.metrics))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    /// The process's log output so far.
    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// The child process, for signals.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    /// Waits for the process to exit and returns how long that took.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<(std::process::ExitStatus, Duration)> {
        let started = Instant::now();
        let child = self.child.as_mut().unwrap();
        while started.elapsed() < limit {
            if let Some(status) = child.try_wait().unwrap() {
                return Some((status, started.elapsed()));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        // A failing test shows what the gateway said (the test harness prints a failing test's
        // output only).
        if std::thread::panicking() {
            let log = std::fs::read_to_string(&self.log_path).unwrap_or_default();
            let lines: Vec<&str> = log.lines().collect();
            let tail = &lines[lines.len().saturating_sub(60)..];
            eprintln!(
                "--- last lines of the gateway's log ---\n{}",
                tail.join("\n")
            );
        }
    }
}
