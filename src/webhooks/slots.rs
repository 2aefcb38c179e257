//! A worker's attempt slots, shared out between endpoints.
//!
//! A worker runs at most `max_in_flight` attempts, at most `max_in_flight_per_endpoint` of them
//! to one endpoint. Those two caps alone let endpoints that hang take every slot between them
//! (32 of them at the defaults) and hold up deliveries to every other endpoint until their
//! attempts time out. So an endpoint whose last attempt failed gets one slot at a time (the
//! store holds it back for every worker, see [`super::store::AfterAttempt`]; this is the
//! worker's own view, which also covers attempts of its that were in flight together), and the
//! endpoints whose last attempt failed or was slow (over half the timeout) share at most half
//! of the slots (the one slot of a worker that has only one): the other half stays free for
//! endpoints that answer. The share is enforced as deliveries are claimed, so struggling
//! endpoints with nothing due take none of it. An endpoint new to the worker counts as
//! answering until an attempt says otherwise; one that struggled and then had nothing to send
//! for [`FORGET_AFTER`] is forgotten, as if new.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How long an endpoint that struggled is remembered with nothing in flight.
pub const FORGET_AFTER: Duration = Duration::from_secs(15 * 60);

/// How an attempt to an endpoint ended, for the share of slots it gets next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// A 2xx in good time.
    Answered,
    /// A 2xx, after more than half the timeout.
    Slow,
    /// Anything else: an error status, a timeout, no connection.
    Failed,
    /// Nothing was sent: the endpoint was deleted or is paused. It is forgotten.
    Gone,
    /// The attempt went to a URL the endpoint no longer has: it says nothing of it.
    Superseded,
}

#[derive(Debug)]
struct Load {
    in_flight: usize,
    failing: bool,
    slow: bool,
    /// When the last attempt to it ended (or the first began).
    since: Instant,
}

impl Load {
    fn struggling(&self) -> bool {
        self.failing || self.slow
    }
}

/// What one claim may take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimLimits {
    /// Deliveries in all.
    pub room: usize,
    /// Per endpoint, the slots to count as taken against the per-endpoint cap (an endpoint
    /// counted at the cap gets nothing). Endpoints not listed may take the whole cap.
    pub busy: Vec<(String, usize)>,
    /// Endpoints whose last attempt failed or was slow: together they take at most
    /// `struggling_room`.
    pub struggling: Vec<String>,
    /// What is left of the struggling endpoints' half.
    pub struggling_room: usize,
}

/// The slots of one worker, and the endpoints it has attempts in flight to or that struggle.
#[derive(Debug)]
pub struct Slots {
    total: usize,
    per_endpoint: usize,
    loads: HashMap<String, Load>,
}

impl Slots {
    /// `total` slots, at most `per_endpoint` of them to one endpoint.
    pub fn new(total: usize, per_endpoint: usize) -> Self {
        Self {
            total,
            per_endpoint,
            loads: HashMap::new(),
        }
    }

    /// Attempts in flight.
    pub fn in_flight(&self) -> usize {
        self.loads.values().map(|l| l.in_flight).sum()
    }

    /// What the next claim may take (see [`ClaimLimits`]); forgets endpoints that struggled
    /// and have had nothing in flight for [`FORGET_AFTER`].
    pub fn claim_limits(&mut self) -> ClaimLimits {
        self.claim_limits_at(Instant::now())
    }

    fn claim_limits_at(&mut self, now: Instant) -> ClaimLimits {
        self.loads
            .retain(|_, l| l.in_flight > 0 || now - l.since < FORGET_AFTER);
        let mut struggling_in_flight = 0;
        let mut busy = Vec::new();
        let mut struggling = Vec::new();
        for (endpoint, load) in &self.loads {
            let room = match load.failing {
                true => usize::from(load.in_flight == 0),
                false => self.per_endpoint.saturating_sub(load.in_flight),
            };
            if room < self.per_endpoint {
                busy.push((endpoint.clone(), self.per_endpoint - room));
            }
            if load.struggling() {
                struggling.push(endpoint.clone());
                struggling_in_flight += load.in_flight;
            }
        }
        // A worker with a single slot has no half to keep free: its one slot must still retry.
        let share = (self.total / 2).max(1);
        ClaimLimits {
            room: self.total.saturating_sub(self.in_flight()),
            busy,
            struggling,
            struggling_room: share.saturating_sub(struggling_in_flight),
        }
    }

    /// A delivery to `endpoint` was claimed (not held back by the store).
    #[cfg(test)]
    fn take(&mut self, endpoint: &str) {
        self.take_marked(endpoint, false);
    }

    /// A delivery to `endpoint` was claimed; `failing`: the store holds the endpoint back after
    /// a failure (this is its retry), so it counts as failing here too, whatever this worker
    /// saw of it: another worker saw the failure, or this one forgot it.
    pub fn take_marked(&mut self, endpoint: &str, failing: bool) {
        match self.loads.get_mut(endpoint) {
            Some(load) => {
                load.in_flight += 1;
                load.failing |= failing;
            }
            None => {
                self.loads.insert(
                    endpoint.to_string(),
                    Load {
                        in_flight: 1,
                        failing,
                        slow: false,
                        since: Instant::now(),
                    },
                );
            }
        }
    }

    /// An attempt to `endpoint` ended with `outcome`.
    pub fn free(&mut self, endpoint: &str, outcome: Outcome) {
        let Some(load) = self.loads.get_mut(endpoint) else {
            return;
        };
        load.in_flight = load.in_flight.saturating_sub(1);
        load.since = Instant::now();
        (load.failing, load.slow) = match outcome {
            Outcome::Answered | Outcome::Gone => (false, false),
            Outcome::Slow => (false, true),
            Outcome::Failed => (true, load.slow),
            Outcome::Superseded => (load.failing, load.slow),
        };
        if load.in_flight == 0 && !load.struggling() {
            self.loads.remove(endpoint);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counted(slots: &mut Slots, endpoint: &str) -> usize {
        slots
            .claim_limits()
            .busy
            .iter()
            .find(|(e, _)| *e == endpoint)
            .map_or(0, |(_, n)| *n)
    }

    /// What a store's claim takes under `limits` when each of `due` has plenty due, in order.
    fn claim(slots: &mut Slots, due: &[String]) -> Vec<String> {
        let limits = slots.claim_limits();
        let mut struggling_room = limits.struggling_room;
        let mut taken = Vec::new();
        for e in due {
            let busy = limits
                .busy
                .iter()
                .find(|(b, _)| b == e)
                .map_or(0, |(_, n)| *n);
            let mut room = (slots.per_endpoint - busy).min(limits.room - taken.len());
            if limits.struggling.contains(e) {
                room = room.min(struggling_room);
                struggling_room -= room;
            }
            taken.extend(std::iter::repeat_n(e.clone(), room));
        }
        for e in &taken {
            slots.take(e);
        }
        taken
    }

    fn mark(slots: &mut Slots, endpoint: &str, outcome: Outcome) {
        slots.take(endpoint);
        slots.free(endpoint, outcome);
    }

    #[test]
    fn a_worker_with_one_slot_still_retries_a_failing_endpoint() {
        let mut slots = Slots::new(1, 1);
        mark(&mut slots, "a", Outcome::Failed);
        assert_eq!(
            counted(&mut slots, "a"),
            0,
            "its slot is free for the retry"
        );
        assert_eq!(slots.claim_limits().struggling_room, 1);
        slots.take("a");
        assert_eq!(counted(&mut slots, "a"), 1);
        assert_eq!(slots.claim_limits().room, 0);
    }

    #[test]
    fn a_failing_endpoint_gets_one_slot_at_a_time_until_it_answers() {
        let mut slots = Slots::new(8, 4);
        slots.take("a");
        slots.take("a");
        assert_eq!(counted(&mut slots, "a"), 2, "healthy: its own count");
        slots.free("a", Outcome::Failed);
        assert_eq!(counted(&mut slots, "a"), 4, "failing with one out: no more");
        slots.free("a", Outcome::Failed);
        assert_eq!(
            counted(&mut slots, "a"),
            3,
            "failing, none out: room for one"
        );
        slots.take("a");
        slots.free("a", Outcome::Answered);
        assert_eq!(counted(&mut slots, "a"), 0);
        assert!(
            slots.loads.is_empty(),
            "a healthy idle endpoint is forgotten"
        );
    }

    #[test]
    fn struggling_endpoints_share_half_the_slots() {
        let mut slots = Slots::new(8, 4);
        for e in ["slow1", "slow2"] {
            slots.take(e);
            slots.take(e);
            slots.free(e, Outcome::Slow);
            slots.take(e);
        }
        // Four slots out to struggling endpoints: their half is spent.
        let limits = slots.claim_limits();
        assert_eq!(limits.struggling_room, 0);
        assert_eq!(limits.struggling.len(), 2);
        slots.take("fast");
        assert_eq!(slots.claim_limits().room, 3);
        let due = ["slow1", "slow2", "fast"].map(String::from);
        assert_eq!(claim(&mut slots, &due), ["fast", "fast", "fast"]);
        // One slot back: one more for the slow endpoints between them, however much room each
        // has under its own cap.
        slots.free("slow1", Outcome::Slow);
        assert_eq!(claim(&mut slots, &due).len(), 1);
    }

    #[test]
    fn struggling_endpoints_with_nothing_due_take_none_of_the_share() {
        // Endpoints that were slow once and then had nothing to send: their share is the
        // failing endpoint's to retry with, however they come out of the map.
        let mut slots = Slots::new(8, 4);
        for i in 0..20 {
            mark(&mut slots, &format!("idle{i}"), Outcome::Slow);
        }
        mark(&mut slots, "f", Outcome::Failed);
        let limits = slots.claim_limits();
        assert_eq!(limits.struggling_room, 4);
        assert_eq!(counted(&mut slots, "f"), 3, "room for its one retry");
        assert_eq!(claim(&mut slots, &["f".to_string()]), ["f"]);
    }

    #[test]
    fn an_endpoint_that_struggled_is_forgotten_after_a_quiet_while() {
        let mut slots = Slots::new(8, 4);
        mark(&mut slots, "quiet", Outcome::Failed);
        mark(&mut slots, "busy", Outcome::Slow);
        slots.take("busy");
        let later = Instant::now() + FORGET_AFTER + Duration::from_secs(1);
        let limits = slots.claim_limits_at(later);
        assert_eq!(limits.struggling, ["busy"], "one in flight is kept");
        assert!(!slots.loads.contains_key("quiet"));
    }

    #[test]
    fn thirty_two_hanging_endpoints_no_longer_hold_every_slot() {
        // The defaults, and endpoints that never answer: once each has failed, each holds one
        // slot, and all of them together at most half.
        let mut slots = Slots::new(512, 16);
        let dead: Vec<String> = (0..600).map(|i| format!("dead{i}")).collect();
        for e in &dead {
            mark(&mut slots, e, Outcome::Failed);
        }
        let mut taken = 0;
        loop {
            let claimed = claim(&mut slots, &dead).len();
            if claimed == 0 {
                break;
            }
            taken += claimed;
        }
        assert_eq!(taken, 256);
        assert_eq!(
            slots.claim_limits().room,
            256,
            "half of the slots stay free for endpoints that answer"
        );
    }

    #[test]
    fn a_retry_the_store_holds_counts_against_the_share_though_this_worker_never_saw_it_fail() {
        let mut slots = Slots::new(8, 4);
        slots.take_marked("held", true);
        let limits = slots.claim_limits();
        assert_eq!(limits.struggling, ["held"]);
        assert_eq!(limits.struggling_room, 3);
        slots.free("held", Outcome::Answered);
        assert!(slots.loads.is_empty());
    }

    #[test]
    fn gone_endpoints_are_forgotten() {
        let mut slots = Slots::new(8, 4);
        mark(&mut slots, "a", Outcome::Failed);
        assert_eq!(slots.loads.len(), 1);
        mark(&mut slots, "a", Outcome::Gone);
        assert!(slots.loads.is_empty());
        slots.free("never-seen", Outcome::Answered);
    }
}
