//! The hub's one source of wall-clock time, and IoT Hub's time formats.
//!
//! Every protocol adapter and hub task reads "now" from the [`Clock`] in the hub context, never
//! from the operating system directly, so tests can run the whole hub on a paused clock.
//!
//! # Invariants
//! - A [`Clock::system`] reads the system's UTC clock.
//! - A [`Clock::tokio`] starts at a given wall time and advances exactly as tokio's clock does:
//!   with `tokio::time::pause()` it stands still until `tokio::time::advance()` (or the
//!   runtime's auto-advance) moves it. Deadlines stored as wall times (C2D locks and TTLs) and
//!   timers slept on with `tokio::time` (keep-alive, method timeouts, sweeps) then agree.

use std::sync::Arc;

use ferrohub_engine::UnixMillis;
use tokio::time::Instant;

/// Where "now" comes from. Cheap to clone.
#[derive(Clone)]
pub struct Clock(Arc<Source>);

enum Source {
    System,
    Tokio {
        start_wall: UnixMillis,
        start: Instant,
    },
}

impl Clock {
    /// The system's UTC clock.
    pub fn system() -> Clock {
        Clock(Arc::new(Source::System))
    }

    /// A clock at `start_wall` now that follows tokio's (pausable) clock from here on.
    pub fn tokio(start_wall: UnixMillis) -> Clock {
        Clock(Arc::new(Source::Tokio {
            start_wall,
            start: Instant::now(),
        }))
    }

    /// Milliseconds since the Unix epoch.
    /// Whether this clock follows tokio's time (tests on the paused clock), which moves
    /// whenever no task and no blocking call is running.
    pub fn follows_tokio(&self) -> bool {
        matches!(&*self.0, Source::Tokio { .. })
    }

    pub fn now(&self) -> UnixMillis {
        match &*self.0 {
            // Straight from the system time: chrono's `Utc::now` builds a calendar date that
            // `timestamp_millis` then turns back into a count, per message.
            Source::System => UnixMillis(system_millis(std::time::SystemTime::now())),
            Source::Tokio { start_wall, start } => {
                UnixMillis(start_wall.0 + start.elapsed().as_millis() as i64)
            }
        }
    }

    /// Whole seconds since the Unix epoch (SAS token expiries are in seconds).
    pub fn now_secs(&self) -> u64 {
        (self.now().0 / 1000).max(0) as u64
    }

    /// The tokio instant at which the wall clock reads `at` (now, if `at` has passed).
    pub fn instant_at(&self, at: UnixMillis) -> Instant {
        let ahead = (at.0 - self.now().0).max(0) as u64;
        Instant::now() + std::time::Duration::from_millis(ahead)
    }
}

/// Milliseconds since the Unix epoch of a system time (negative before it), as chrono counts
/// them: rounded towards minus infinity.
fn system_millis(t: std::time::SystemTime) -> i64 {
    match t.duration_since(std::time::UNIX_EPOCH) {
        Ok(after) => after.as_millis() as i64,
        Err(before) => {
            let d = before.duration();
            -((d.as_millis() + u128::from(d.subsec_nanos() % 1_000_000 != 0)) as i64)
        }
    }
}

impl std::fmt::Debug for Clock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &*self.0 {
            Source::System => f.write_str("Clock::system"),
            Source::Tokio { .. } => f.write_str("Clock::tokio"),
        }
    }
}

/// ISO 8601 with seven fractional digits, as IoT Hub writes event times.
pub fn iso7(at: UnixMillis) -> String {
    use chrono::Timelike;
    let t = chrono::DateTime::from_timestamp_millis(at.0).unwrap_or_default();
    // chrono has no 7-digit fraction: seconds, then hundreds of nanoseconds.
    format!(
        "{}.{:07}Z",
        t.format("%Y-%m-%dT%H:%M:%S"),
        t.nanosecond() / 100
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_millis_counts_as_chrono_does() {
        use std::time::{Duration, UNIX_EPOCH};
        for t in [
            UNIX_EPOCH,
            UNIX_EPOCH + Duration::from_nanos(1_764_000_123_456_789_123),
            UNIX_EPOCH - Duration::from_micros(1_500),
            UNIX_EPOCH - Duration::from_millis(2),
            std::time::SystemTime::now(),
        ] {
            let chrono_ms = chrono::DateTime::<chrono::Utc>::from(t).timestamp_millis();
            assert_eq!(system_millis(t), chrono_ms, "{t:?}");
        }
    }

    #[test]
    fn iso7_has_seven_fraction_digits() {
        assert_eq!(
            iso7(UnixMillis(1_654_122_470_261)),
            "2022-06-01T22:27:50.2610000Z"
        );
        assert_eq!(iso7(UnixMillis(0)), "1970-01-01T00:00:00.0000000Z");
    }

    #[tokio::test(start_paused = true)]
    async fn a_tokio_clock_moves_only_with_tokio_time() {
        let clock = Clock::tokio(UnixMillis(1_000_000));
        assert_eq!(clock.now(), UnixMillis(1_000_000));
        tokio::time::advance(std::time::Duration::from_millis(1500)).await;
        assert_eq!(clock.now(), UnixMillis(1_001_500));
        assert_eq!(clock.now_secs(), 1001);
        let at = clock.instant_at(UnixMillis(1_002_000));
        assert_eq!(at - Instant::now(), std::time::Duration::from_millis(500));
    }
}
