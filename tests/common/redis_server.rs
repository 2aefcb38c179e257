//! A `redis-server` process of a test's own, to stop, freeze and restart.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A `redis-server` of the test's own, so a test can stop and restart it. It listens on a Unix
/// socket in a directory of its own: a TCP port freed by a stop could be taken by another test
/// before the restart.
pub struct RedisServer {
    child: Option<Child>,
    dir: tempfile::TempDir,
}

impl RedisServer {
    pub async fn start() -> Self {
        let mut server = Self {
            child: None,
            dir: tempfile::tempdir().unwrap(),
        };
        server.resume().await;
        server
    }

    pub fn url(&self) -> String {
        format!(
            "redis+unix://{}",
            self.dir.path().join("redis.sock").display()
        )
    }

    /// Sets up (or changes) the ACL user `user`, password `pw`, with `rules` (`ACL SETUSER`);
    /// the URL that connects as it.
    pub async fn set_user(&self, user: &str, rules: &[&str]) -> String {
        let client = redis::Client::open(self.url()).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        redis::cmd("ACL")
            .arg(&["SETUSER", user, "on", ">pw"])
            .arg(rules)
            .query_async::<()>(&mut conn)
            .await
            .unwrap();
        format!("{}?user={user}&pass=pw", self.url())
    }

    /// How many times it has run `command` (lower case), from `INFO commandstats`: every
    /// client's, the commands scripts run included.
    pub async fn command_calls(&self, command: &str) -> usize {
        let client = redis::Client::open(self.url()).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        let stats: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut conn)
            .await
            .unwrap();
        stats
            .lines()
            .find_map(|l| l.strip_prefix(&format!("cmdstat_{command}:calls=")))
            .and_then(|rest| rest.split(',').next())
            .map_or(0, |n| n.parse().unwrap())
    }

    /// Freezes it (`SIGSTOP`): connections stay open and nothing answers, as on a network that
    /// drops packets. [`RedisServer::thaw`] lets it go on.
    pub fn freeze(&self) {
        self.signal("STOP");
    }

    pub fn thaw(&self) {
        self.signal("CONT");
    }

    fn signal(&self, name: &str) {
        let pid = self.child.as_ref().expect("running").id();
        let status = Command::new("kill")
            .args([format!("-{name}"), pid.to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// Starts it (again), with the data it had (an RDB dump is kept).
    pub async fn resume(&mut self) {
        assert!(self.child.is_none());
        let child = Command::new("redis-server")
            .args(["--port", "0", "--unixsocket"])
            .arg(self.dir.path().join("redis.sock"))
            .args([
                "--save",
                "",
                "--appendonly",
                "no",
                "--dbfilename",
                "dump.rdb",
            ])
            .arg("--dir")
            .arg(self.dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server is installed (.ci/install)");
        self.child = Some(child);
        let client = redis::Client::open(self.url()).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(mut conn) = client.get_multiplexed_async_connection().await {
                if redis::cmd("PING")
                    .query_async::<String>(&mut conn)
                    .await
                    .is_ok()
                {
                    return;
                }
            }
            assert!(Instant::now() < deadline, "redis-server did not start");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Saves its data and stops it (`SHUTDOWN SAVE`: the data is on disk before it exits).
    pub async fn stop(&mut self) {
        let client = redis::Client::open(self.url()).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(mut conn) = client.get_multiplexed_async_connection().await {
                // The connection closes as the server exits, so the reply is an error either way.
                let _: redis::RedisResult<()> = redis::cmd("SHUTDOWN")
                    .arg("SAVE")
                    .query_async(&mut conn)
                    .await;
            }
            let exited = self
                .child
                .as_mut()
                .is_none_or(|c| c.try_wait().ok().flatten().is_some());
            if exited {
                break;
            }
            assert!(Instant::now() < deadline, "redis-server did not shut down");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.child = None;
        assert!(
            self.dir.path().join("dump.rdb").exists(),
            "redis-server saved its data"
        );
        let _ = std::fs::remove_file(self.dir.path().join("redis.sock"));
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
