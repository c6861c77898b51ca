//! A cluster follower's partitions: after each log entry is applied, the in-memory state that
//! reads depend on (partition heads, the segment index, the endpoint list, the built-in
//! partition count) is brought to what the entry wrote.
//!
//! # Invariants
//! - The state is updated only after the entry's write, so a reader bounded by a head sees a
//!   prefix of what is stored, as on the writer.
//! - A head is refreshed the way an opening store recovers it (`heads::recover`): the stored
//!   head brought forward to the partition's newest logged event, after the entry's segment
//!   index entries are in place. So a follower's heads are exactly those a store opened on its
//!   database now would load.

use std::collections::BTreeSet;

use ferrohub_migrations::cf;

use super::{heads, PartitionHead, Partitions};
use crate::error::StorageError;
use crate::keys;
use crate::raw::{Raw, Touched};

/// The partition of a `d2c_log` event key (`segment ‖ partition ‖ sequence`).
fn partition_of_event_key(key: &[u8]) -> Option<u16> {
    let p = key.get(4..6)?;
    (key.len() == 14).then(|| u16::from_be_bytes([p[0], p[1]]))
}

impl Partitions {
    /// Follows an applied entry; returns the partitions whose last sequence number it
    /// advanced, with that number.
    pub(crate) fn follow(
        &self,
        raw: &Raw,
        touched: &Touched,
    ) -> Result<Vec<(u16, u64)>, StorageError> {
        let mut heads_to_reload = BTreeSet::new();
        let mut endpoints_changed = false;
        for key in &touched.d2c_state {
            if let Some(entry) = keys::d2c::parse_segment_index_key(key) {
                match raw.get_record::<u32>(cf::D2C_STATE, key)? {
                    Some(segment) => self.segments.record(entry, segment),
                    None => self.segments.forget(&[entry]),
                }
            } else if let Some(p) = parse_head_key(key) {
                heads_to_reload.insert(p);
            } else if key.starts_with(crate::endpoints::ENDPOINT_PREFIX) {
                endpoints_changed = true;
            } else if key == keys::d2c::PARTITION_COUNT {
                if let Some(n) = raw.get_record::<u16>(cf::D2C_STATE, key)? {
                    self.set_count(n);
                }
            }
        }
        if endpoints_changed {
            *self.custom.write() = crate::endpoints::load(raw)?;
        }
        let mut refresh: BTreeSet<u16> = touched
            .d2c_events
            .iter()
            .filter_map(|k| partition_of_event_key(k))
            .collect();
        refresh.extend(heads_to_reload.iter().copied());
        let mut advanced = Vec::new();
        for p in refresh {
            let Some(slot) = self.heads.get(usize::from(p)) else {
                continue;
            };
            let base = if heads_to_reload.contains(&p) {
                raw.get_record::<PartitionHead>(cf::D2C_STATE, &keys::d2c::head(p))?
                    .unwrap_or_default()
            } else {
                *slot.lock()
            };
            let recovered = heads::recover(raw, &self.segments, p, base)?;
            let mut head = slot.lock();
            let before = head.last_sequence;
            *head = recovered;
            if let Some(last) = head.last_sequence.filter(|l| Some(*l) != before) {
                advanced.push((p, last));
            }
        }
        Ok(advanced)
    }
}

/// The partition of a `head/` key in `d2c_state`.
fn parse_head_key(key: &[u8]) -> Option<u16> {
    let rest = key.strip_prefix(b"head/")?;
    (rest.len() == 2).then(|| u16::from_be_bytes([rest[0], rest[1]]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_parse_back() {
        assert_eq!(partition_of_event_key(&keys::d2c::event(7, 3, 99)), Some(3));
        assert_eq!(partition_of_event_key(b"short"), None);
        assert_eq!(parse_head_key(&keys::d2c::head(31)), Some(31));
        assert_eq!(parse_head_key(b"head/x"), None);
    }
}
