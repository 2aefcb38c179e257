//! The task that puts simulated jobs' events into the event log when they are due. Every
//! `svcgate serve` runs one; the store hands each due event to exactly one of them, and the
//! schedule lives in the store, so a restart loses nothing that was scheduled.

use std::sync::Arc;
use std::time::Duration;

use super::store::SandboxStore;
use crate::ids::unix_millis;
use crate::metrics;

/// How often the schedule is looked at: an event goes out at most this late.
const TICK: Duration = Duration::from_millis(250);
/// Events moved per store call.
const BATCH: usize = 100;

/// Releases due events until `stop` says so.
pub async fn run(store: Arc<dyn SandboxStore>, mut stop: tokio::sync::watch::Receiver<bool>) {
    let mut failing = false;
    loop {
        let wait = match store.release_due_events(unix_millis(), BATCH).await {
            Ok(types) => {
                if failing {
                    tracing::info!("simulated job events flow again");
                    failing = false;
                }
                for t in &types {
                    metrics::record_simulated_event(t);
                }
                // A full batch: more may be due at once.
                if types.len() == BATCH {
                    Duration::ZERO
                } else {
                    TICK
                }
            }
            Err(e) => {
                if !failing {
                    tracing::warn!(error = %e, "simulated job events not released; retrying");
                    failing = true;
                }
                TICK * 4
            }
        };
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stop.changed() => return,
        }
    }
}
