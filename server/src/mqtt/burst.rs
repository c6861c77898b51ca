//! The telemetry of one read burst, gathered to be appended as one write.
//!
//! A device with a window of messages in flight sends them back to back, and one socket read
//! often brings several. Appending them one by one cost a lane admission, an engine staging
//! (locks, a write batch, a commit-queue slot) and a commit callback per message; gathered,
//! the burst costs each once, and each message still has its own ticket and PUBACK.
//!
//! # Invariants
//! - Messages keep the order they came in; the burst is appended before the connection
//!   handles any packet that is not telemetry, and before it waits for more bytes, so PUBACKs
//!   and other answers still leave in the order of the packets that asked for them.
//! - A burst never holds more than the connection's in-flight limit.

use ferrohub_engine::d2c::NewEvent;
use ferrohub_engine::UnixMillis;
use tokio::time::Instant;

/// Telemetry read but not yet appended.
#[derive(Default)]
pub(super) struct TelemetryBurst {
    events: Vec<NewEvent>,
    /// The packet id of each message (none at QoS 0), in order.
    owed: Vec<Option<u16>>,
    /// When the first message was taken: the burst's arrival, in monotonic and wall time.
    arrived: Option<(Instant, UnixMillis)>,
    /// Payload bytes of the messages, counted once per burst (a shared counter).
    bytes: u64,
}

/// A burst taken for its append.
pub(super) struct Taken {
    pub events: Vec<NewEvent>,
    pub received: Instant,
    pub now: UnixMillis,
    /// Payload bytes of the burst's messages.
    pub bytes: u64,
}

impl TelemetryBurst {
    pub(super) fn len(&self) -> usize {
        self.owed.len()
    }

    /// Adds a message of `bytes` payload bytes; `wall_now` is read only for a burst's first
    /// message.
    pub(super) fn push(
        &mut self,
        pkid: Option<u16>,
        event: NewEvent,
        bytes: usize,
        wall_now: impl FnOnce() -> UnixMillis,
    ) {
        if self.arrived.is_none() {
            self.arrived = Some((Instant::now(), wall_now()));
        }
        self.bytes += bytes as u64;
        self.events.push(event);
        self.owed.push(pkid);
    }

    /// The events to append, if any; their packet ids stay until [`TelemetryBurst::owed`]
    /// hands them out.
    pub(super) fn take(&mut self) -> Option<Taken> {
        let (received, now) = self.arrived.take()?;
        Some(Taken {
            events: std::mem::take(&mut self.events),
            received,
            now,
            bytes: std::mem::take(&mut self.bytes),
        })
    }

    /// The packet ids of the taken burst, in order; the burst is empty afterwards.
    pub(super) fn owed(&mut self) -> std::vec::Drain<'_, Option<u16>> {
        self.owed.drain(..)
    }

    /// Frees the burst's memory (an idle connection).
    pub(super) fn release(&mut self) {
        debug_assert!(self.owed.is_empty());
        self.owed = Vec::new();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(body: &str) -> NewEvent {
        NewEvent {
            device_id: "d".into(),
            system_properties: Vec::new(),
            application_properties: Vec::new(),
            body: body.as_bytes().to_vec(),
            endpoints: None,
        }
    }

    #[test]
    fn a_burst_keeps_its_messages_in_order_and_reads_the_wall_clock_once() {
        let mut burst = TelemetryBurst::default();
        assert!(burst.take().is_none(), "nothing to append");
        let mut reads = 0;
        for (i, body) in ["a", "b", "c"].into_iter().enumerate() {
            burst.push(Some(i as u16 + 1), event(body), body.len(), || {
                reads += 1;
                UnixMillis(7)
            });
        }
        burst.push(None, event("dd"), 2, || UnixMillis(8));
        assert_eq!((burst.len(), reads), (4, 1));
        let taken = burst.take().expect("four messages");
        assert_eq!((taken.now, taken.bytes), (UnixMillis(7), 5));
        let bodies: Vec<_> = taken.events.iter().map(|e| e.body.clone()).collect();
        let expected: [&[u8]; 4] = [b"a", b"b", b"c", b"dd"];
        assert_eq!(bodies, expected.map(|b| b.to_vec()));
        let owed: Vec<_> = burst.owed().collect();
        assert_eq!(owed, [Some(1), Some(2), Some(3), None]);
        assert_eq!(burst.len(), 0);
        assert!(burst.take().is_none());
        burst.push(Some(9), event("e"), 1, || UnixMillis(9));
        assert_eq!(
            burst.take().map(|t| (t.now, t.bytes)),
            Some((UnixMillis(9), 1))
        );
    }
}
