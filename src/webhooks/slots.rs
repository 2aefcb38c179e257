//! A worker's attempt slots, shared out between endpoints.
//!
//! A worker runs at most `max_in_flight` attempts, at most `max_in_flight_per_endpoint` of them
//! to one endpoint. Those two caps alone let endpoints that hang take every slot between them
//! (32 of them at the defaults) and hold up deliveries to every other endpoint until their
//! attempts time out. So an endpoint whose last attempt failed gets one slot at a time, and the
//! endpoints whose last attempt failed or was slow (over half the timeout) share at most half
//! of the slots (the one slot of a worker that has only one): the other half stays free for
//! endpoints that answer. An endpoint new to the
//! worker counts as answering until an attempt says otherwise.

use std::collections::HashMap;

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
}

#[derive(Debug, Default)]
struct Load {
    in_flight: usize,
    failing: bool,
    slow: bool,
}

impl Load {
    fn struggling(&self) -> bool {
        self.failing || self.slow
    }
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

    /// What the next claim may take: how many deliveries at most, and per endpoint the number
    /// of slots to count as taken against `per_endpoint` (an endpoint counted at
    /// `per_endpoint` gets nothing). Endpoints this worker has no attempt out to and no trouble
    /// with are not listed: they may take `per_endpoint`.
    pub fn claim_limits(&self) -> (usize, Vec<(String, usize)>) {
        let struggling: usize = self
            .loads
            .values()
            .filter(|l| l.struggling())
            .map(|l| l.in_flight)
            .sum();
        // Handed out endpoint by endpoint, so one claim cannot overshoot it. A worker with a
        // single slot has no half to keep free: its one slot must still retry.
        let mut share_left = (self.total / 2).max(1).saturating_sub(struggling);
        let counted = self
            .loads
            .iter()
            .map(|(endpoint, load)| {
                let mut room = match load.failing {
                    true => usize::from(load.in_flight == 0),
                    false => self.per_endpoint.saturating_sub(load.in_flight),
                };
                if load.struggling() {
                    room = room.min(share_left);
                    share_left -= room;
                }
                (endpoint.clone(), self.per_endpoint - room)
            })
            .collect();
        (self.total.saturating_sub(self.in_flight()), counted)
    }

    /// A delivery to `endpoint` was claimed.
    pub fn take(&mut self, endpoint: &str) {
        match self.loads.get_mut(endpoint) {
            Some(load) => load.in_flight += 1,
            None => {
                self.loads.insert(
                    endpoint.to_string(),
                    Load {
                        in_flight: 1,
                        ..Load::default()
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
        (load.failing, load.slow) = match outcome {
            Outcome::Answered | Outcome::Gone => (false, false),
            Outcome::Slow => (false, true),
            Outcome::Failed => (true, load.slow),
        };
        if load.in_flight == 0 && !load.struggling() {
            self.loads.remove(endpoint);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counted(slots: &Slots, endpoint: &str) -> usize {
        let (_, counted) = slots.claim_limits();
        counted
            .iter()
            .find(|(e, _)| *e == endpoint)
            .map_or(0, |(_, n)| *n)
    }

    #[test]
    fn a_worker_with_one_slot_still_retries_a_failing_endpoint() {
        let mut slots = Slots::new(1, 1);
        slots.take("a");
        slots.free("a", Outcome::Failed);
        assert_eq!(counted(&slots, "a"), 0, "its slot is free for the retry");
        slots.take("a");
        assert_eq!(counted(&slots, "a"), 1);
        assert_eq!(slots.claim_limits().0, 0);
    }

    #[test]
    fn a_failing_endpoint_gets_one_slot_at_a_time_until_it_answers() {
        let mut slots = Slots::new(8, 4);
        slots.take("a");
        slots.take("a");
        assert_eq!(counted(&slots, "a"), 2, "healthy: its own count");
        slots.free("a", Outcome::Failed);
        assert_eq!(counted(&slots, "a"), 4, "failing with one out: no more");
        slots.free("a", Outcome::Failed);
        assert_eq!(counted(&slots, "a"), 3, "failing, none out: room for one");
        slots.take("a");
        slots.free("a", Outcome::Answered);
        assert_eq!(counted(&slots, "a"), 0);
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
        assert_eq!(counted(&slots, "slow1"), 4);
        assert_eq!(counted(&slots, "slow2"), 4);
        slots.take("fast");
        assert_eq!(counted(&slots, "fast"), 1);
        let (room, _) = slots.claim_limits();
        assert_eq!(room, 3);
        // One slot back: one more for the slow endpoints between them, however much room each
        // has under its own cap.
        slots.free("slow1", Outcome::Slow);
        let offered = (4 - counted(&slots, "slow1")) + (4 - counted(&slots, "slow2"));
        assert_eq!(offered, 1);
    }

    #[test]
    fn thirty_two_hanging_endpoints_no_longer_hold_every_slot() {
        // The defaults, and endpoints that never answer: once each has failed, each holds one
        // slot, and all of them together at most half.
        let mut slots = Slots::new(512, 16);
        let dead: Vec<String> = (0..600).map(|i| format!("dead{i}")).collect();
        for e in &dead {
            slots.take(e);
            slots.free(e, Outcome::Failed);
        }
        let mut taken = 0;
        loop {
            let (room, counted) = slots.claim_limits();
            let open: Vec<String> = counted
                .iter()
                .filter(|(_, n)| *n < 16)
                .map(|(e, _)| e.to_string())
                .collect();
            if room == 0 || open.is_empty() {
                break;
            }
            for e in open.iter().take(room) {
                slots.take(e);
                taken += 1;
            }
        }
        assert_eq!(taken, 256);
        let (room, _) = slots.claim_limits();
        assert_eq!(
            room, 256,
            "half of the slots stay free for endpoints that answer"
        );
    }

    #[test]
    fn gone_endpoints_are_forgotten() {
        let mut slots = Slots::new(8, 4);
        slots.take("a");
        slots.free("a", Outcome::Failed);
        assert_eq!(slots.loads.len(), 1);
        slots.take("a");
        slots.free("a", Outcome::Gone);
        assert!(slots.loads.is_empty());
        slots.free("never-seen", Outcome::Answered);
    }
}
