//! The last warnings and errors the process logged, kept in memory for the console's overview
//! (`GET /console/api/errors`): a `tracing` layer beside the log writer.
//!
//! # Invariants
//! - At most [`KEPT`] entries; the oldest is dropped first. Only WARN and ERROR are kept, and
//!   only what the log filter lets through (the layer sits under the same filter).
//! - Recording never blocks on anything but a short mutex, and never allocates per event
//!   below WARN.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use parking_lot::Mutex;
use serde::Serialize;
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::Context;
use tracing_subscriber::Layer;

/// How many entries are kept.
pub const KEPT: usize = 100;

/// One logged warning or error.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Entry {
    pub time_utc: String,
    pub level: &'static str,
    pub target: String,
    pub message: String,
}

fn ring() -> &'static Mutex<VecDeque<Entry>> {
    static RING: OnceLock<Mutex<VecDeque<Entry>>> = OnceLock::new();
    RING.get_or_init(|| Mutex::new(VecDeque::with_capacity(KEPT)))
}

fn logged(error: bool) -> &'static AtomicU64 {
    static WARNINGS: AtomicU64 = AtomicU64::new(0);
    static ERRORS: AtomicU64 = AtomicU64::new(0);
    if error {
        &ERRORS
    } else {
        &WARNINGS
    }
}

/// How many warnings and errors the process logged since it started, whether kept or not.
pub fn logged_counts() -> (u64, u64) {
    (
        logged(false).load(Ordering::Relaxed),
        logged(true).load(Ordering::Relaxed),
    )
}

/// The kept entries, newest first.
pub fn newest_first() -> Vec<Entry> {
    ring().lock().iter().rev().cloned().collect()
}

fn keep(entry: Entry) {
    let mut ring = ring().lock();
    if ring.len() == KEPT {
        ring.pop_front();
    }
    ring.push_back(entry);
}

/// The layer that records into the ring; added to the subscriber by the binary.
pub struct RecentLog;

impl<S: Subscriber> Layer<S> for RecentLog {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let level = *event.metadata().level();
        let level = if level == Level::ERROR {
            "ERROR"
        } else if level == Level::WARN {
            "WARN"
        } else {
            return;
        };
        logged(level == "ERROR").fetch_add(1, Ordering::Relaxed);
        let mut text = Fields::default();
        event.record(&mut text);
        keep(Entry {
            time_utc: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            level,
            target: event.metadata().target().to_string(),
            message: text.finish(),
        });
    }
}

/// The event's message, then its other fields as `name=value`.
#[derive(Default)]
struct Fields {
    message: String,
    rest: String,
}

impl Fields {
    fn finish(self) -> String {
        match (self.message.is_empty(), self.rest.is_empty()) {
            (_, true) => self.message,
            (true, false) => self.rest,
            (false, false) => format!("{} {}", self.message, self.rest),
        }
    }
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.message, "{value:?}");
        } else {
            if !self.rest.is_empty() {
                self.rest.push(' ');
            }
            let _ = write!(self.rest, "{}={value:?}", field.name());
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message.push_str(value);
        } else {
            self.record_debug(field, &value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing_subscriber::layer::SubscriberExt;

    #[test]
    fn keeps_warnings_and_errors_with_their_fields_newest_first() {
        let subscriber = tracing_subscriber::registry().with(RecentLog);
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!("not kept");
            tracing::warn!(device = "d1", "first");
            tracing::error!(code = 7, "second");
        });
        let entries = newest_first();
        let ours: Vec<_> = entries
            .iter()
            .filter(|e| e.message.starts_with("first") || e.message.starts_with("second"))
            .collect();
        assert_eq!(ours.len(), 2);
        assert_eq!(ours[0].level, "ERROR");
        assert_eq!(ours[0].message, "second code=7");
        assert_eq!(ours[1].message, "first device=\"d1\"");
        assert!(entries.iter().all(|e| e.message != "not kept"));
    }
}
