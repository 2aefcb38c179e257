//! The `svcgate` binary: a command without the developer's settings, and a worker process.

use std::path::PathBuf;
use std::process::{Child, Command};

/// `svcgate` with no `SVCGATE_*` variables inherited from the developer's shell.
pub fn svcgate_command() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_svcgate"));
    for (k, _) in std::env::vars() {
        if k.starts_with("SVCGATE_") {
            cmd.env_remove(k);
        }
    }
    cmd.env("RUST_LOG", "info");
    cmd
}

/// A `svcgate worker` process, killed on drop.
pub struct Worker {
    pub child: Child,
    pub(super) log_path: PathBuf,
}

impl Worker {
    /// SIGKILL: no chance to finish anything.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.kill();
    }
}
