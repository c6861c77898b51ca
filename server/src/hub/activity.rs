//! `lastActivityTime` moved by a device's traffic (telemetry, twin and method messages, C2D
//! settlements), on every transport, as IoT Hub moves it; not only on connect and disconnect.
//!
//! Each move is a registry write, so a device's traffic moves it at most once per
//! `[hub] last_activity_interval` (default a minute): a connection keeps its own
//! [`ActivityGate`] (no lock on the message path), requests without a connection (HTTPS
//! devices) share one per identity here.
//!
//! # Invariants
//! - The write never waits for its sync and never holds up the message that caused it: it is
//!   spawned, and a failure is only logged (the time is a debugging aid that may lag).
//! - A gate opens at most once per interval; the map of gates is pruned of gates that would
//!   open anyway, so it holds at most the identities active within one interval (plus
//!   [`PRUNE_AT`] before a prune).

use std::collections::HashMap;
use std::time::Duration;

use ferrohub_engine::UnixMillis;
use parking_lot::Mutex;

use super::HubContext;
use crate::ids::{ClientId, Identity};

/// Gates kept before the map drops those that would open anyway.
const PRUNE_AT: usize = 65_536;

/// When an identity's traffic last moved its `lastActivityTime`.
#[derive(Debug, Default, Clone, Copy)]
pub struct ActivityGate {
    last: Option<UnixMillis>,
}

impl ActivityGate {
    /// Whether traffic at `now` would move the time.
    fn due(&self, now: UnixMillis, interval: Duration) -> bool {
        self.last
            .is_none_or(|t| now.0.saturating_sub(t.0) >= interval.as_millis() as i64)
    }

    /// Whether traffic at `now` moves the time (and notes that it did).
    pub fn opens(&mut self, now: UnixMillis, interval: Duration) -> bool {
        let due = self.due(now, interval);
        if due {
            self.last = Some(now);
        }
        due
    }
}

/// The hub's side: the interval, and the gates of identities that have no connection.
#[derive(Debug)]
pub struct Activity {
    interval: Duration,
    gates: Mutex<HashMap<ClientId, ActivityGate>>,
}

impl Activity {
    pub fn new(interval: Duration) -> Self {
        Activity {
            interval,
            gates: Mutex::new(HashMap::new()),
        }
    }

    pub fn interval(&self) -> Duration {
        self.interval
    }

    fn opens_for(&self, who: &Identity, now: UnixMillis) -> bool {
        let interval = self.interval;
        let mut gates = self.gates.lock();
        if gates.len() >= PRUNE_AT {
            // Keep a gate only while it is shut: one that would open holds nothing.
            gates.retain(|_, g| !g.due(now, interval));
        }
        gates
            .entry(who.client_id())
            .or_default()
            .opens(now, interval)
    }
}

impl HubContext {
    /// Traffic of `who` on a connection holding `gate`: moves its `lastActivityTime` when the
    /// gate opens.
    pub fn note_activity(&self, who: &Identity, gate: &mut ActivityGate) {
        let now = self.clock.now();
        if gate.opens(now, self.activity.interval()) {
            self.record_activity(who, now);
        }
    }

    /// Traffic of `who` without a connection (an HTTPS request): as [`Self::note_activity`]
    /// with the hub's shared gate for the identity.
    pub fn note_request_activity(&self, who: &Identity) {
        let now = self.clock.now();
        if self.activity.opens_for(who, now) {
            self.record_activity(who, now);
        }
    }

    fn record_activity(&self, who: &Identity, now: UnixMillis) {
        let ctx = self.clone();
        let call = super::calls::RecordActivity {
            who: who.clone(),
            now,
        };
        tokio::spawn(async move {
            if let Err(e) = ctx.write(call).await {
                tracing::debug!(error = %e, "last activity time not recorded");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gate_opens_once_per_interval() {
        let mut gate = ActivityGate::default();
        let minute = Duration::from_secs(60);
        assert!(gate.opens(UnixMillis(1_000), minute));
        assert!(!gate.opens(UnixMillis(30_000), minute));
        assert!(!gate.opens(UnixMillis(60_999), minute));
        assert!(gate.opens(UnixMillis(61_000), minute));
        assert!(!gate.opens(UnixMillis(61_001), minute));
    }
}
