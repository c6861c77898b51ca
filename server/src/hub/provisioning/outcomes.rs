//! Outcomes of registrations that wrote nothing (a disabled enrollment, a refused
//! assignment), kept in memory so the device's poll can read them.
//!
//! # Invariants
//! - An outcome is returned only to a poll naming its registration id.
//! - At most [`MAX_OUTCOMES`] are kept; the oldest go first, and none is older than
//!   [`super::OUTCOME_TTL`].

use std::collections::VecDeque;

use ferrohub_engine::UnixMillis;
use parking_lot::Mutex;

use super::{OperationState, OUTCOME_TTL};

const MAX_OUTCOMES: usize = 10_000;

struct Entry {
    operation_id: String,
    registration_id: String,
    state: OperationState,
    at: UnixMillis,
}

#[derive(Default)]
pub struct Outcomes(Mutex<VecDeque<Entry>>);

impl Outcomes {
    pub fn put(
        &self,
        operation_id: String,
        registration_id: String,
        state: OperationState,
        now: UnixMillis,
    ) {
        let mut entries = self.0.lock();
        Self::expire(&mut entries, now);
        if entries.len() == MAX_OUTCOMES {
            entries.pop_front();
        }
        entries.push_back(Entry {
            operation_id,
            registration_id,
            state,
            at: now,
        });
    }

    pub fn get(
        &self,
        operation_id: &str,
        registration_id: &str,
        now: UnixMillis,
    ) -> Option<OperationState> {
        let mut entries = self.0.lock();
        Self::expire(&mut entries, now);
        entries
            .iter()
            .find(|e| e.operation_id == operation_id && e.registration_id == registration_id)
            .map(|e| e.state.clone())
    }

    fn expire(entries: &mut VecDeque<Entry>, now: UnixMillis) {
        let ttl = i64::try_from(OUTCOME_TTL.as_millis()).unwrap_or(i64::MAX);
        while entries.front().is_some_and(|e| now.0 - e.at.0 > ttl) {
            entries.pop_front();
        }
    }
}
