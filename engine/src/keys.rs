//! Every key the engine stores, built in one place.
//!
//! Device ids are length-prefixed (one byte; ids are at most 128 bytes) so that a prefix scan
//! for the modules of `dev1` can never match `dev10`.

/// Key of a device identity in `devices`: the raw id (ids are unique, no prefix scan needed).
pub fn device(device_id: &str) -> Vec<u8> {
    device_id.as_bytes().to_vec()
}

/// Prefix of all modules of one device in `modules`.
pub fn modules_of(device_id: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(1 + device_id.len());
    push_len_prefixed(&mut k, device_id);
    k
}

/// Key of one module identity in `modules`.
pub fn module(device_id: &str, module_id: &str) -> Vec<u8> {
    let mut k = modules_of(device_id);
    push_len_prefixed(&mut k, module_id);
    k
}

fn push_len_prefixed(k: &mut Vec<u8>, s: &str) {
    // Ids are validated to at most 128 ASCII bytes before any key is built.
    debug_assert!(s.len() <= u8::MAX as usize);
    k.push(s.len() as u8);
    k.extend_from_slice(s.as_bytes());
}

/// Upper bound for an iteration over everything starting with `prefix`.
pub fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < u8::MAX {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

/// Keys in `meta`.
pub mod meta {
    pub const HUB_SETTINGS: &[u8] = b"hub_settings";
    /// Registered certificate authorities: `ca/{name}`.
    pub const CA_PREFIX: &[u8] = b"ca/";
    /// Import/export jobs: `job/{id}`.
    pub const JOB_PREFIX: &[u8] = b"job/";
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn module_keys_round_trip_and_do_not_collide() {
        let k = module("dev1", "m");
        assert_eq!(k, b"\x04dev1\x01m".to_vec());
        assert!(!module("dev10", "m").starts_with(&modules_of("dev1")));
        assert!(k.starts_with(&modules_of("dev1")));
    }

    #[test]
    fn prefix_end_is_exclusive_upper_bound() {
        assert_eq!(prefix_end(&[1, 2]), Some(vec![1, 3]));
        assert_eq!(prefix_end(&[1, 0xff]), Some(vec![2]));
        assert_eq!(prefix_end(&[0xff]), None);
    }
}

/// Keys of the D2C column families.
pub mod d2c {
    pub use ferrohub_migrations::m0007_d2c_segments::{
        event_key as event, parse_segment_index_key, segment_index_key, CURRENT_SEGMENT_KEY,
        SEGMENT_INDEX_PREFIX,
    };

    /// Exclusive end of a partition's events within one segment of `d2c_log`.
    pub fn segment_partition_end(segment: u32, partition: u16) -> Vec<u8> {
        match partition.checked_add(1) {
            Some(next) => event(segment, next, 0),
            None => segment_start(segment.saturating_add(1)),
        }
    }

    /// First key of a segment in `d2c_log`.
    pub fn segment_start(segment: u32) -> Vec<u8> {
        segment.to_be_bytes().to_vec()
    }

    /// The head (next sequence number and offset) of a partition in `d2c_state`.
    pub fn head(partition: u16) -> Vec<u8> {
        let mut k = b"head/".to_vec();
        k.extend_from_slice(&partition.to_be_bytes());
        k
    }

    /// A consumer group in `d2c_state`.
    pub fn group(name: &str) -> Vec<u8> {
        let mut k = b"group/".to_vec();
        k.extend_from_slice(name.as_bytes());
        k
    }

    pub const GROUP_PREFIX: &[u8] = b"group/";

    /// The partition count, fixed when the hub is created.
    pub const PARTITION_COUNT: &[u8] = b"partition_count";

    /// A checkpoint in `d2c_state`: `checkpoint/ ‖ len(group):u8 ‖ group ‖ partition:u16be`.
    pub fn checkpoint(group: &str, partition: u16) -> Vec<u8> {
        let mut k = b"checkpoint/".to_vec();
        super::push_len_prefixed(&mut k, group);
        k.extend_from_slice(&partition.to_be_bytes());
        k
    }

    /// Prefix of every checkpoint of a group.
    pub fn checkpoints_of(group: &str) -> Vec<u8> {
        let mut k = b"checkpoint/".to_vec();
        super::push_len_prefixed(&mut k, group);
        k
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn a_partition_in_a_segment_does_not_overlap_the_next() {
            assert!(event(0, 0, u64::MAX) < segment_partition_end(0, 0));
            assert_eq!(segment_partition_end(0, 0), event(0, 1, 0));
            assert_eq!(segment_partition_end(3, u16::MAX), segment_start(4));
            assert!(event(3, u16::MAX, u64::MAX) < segment_start(4));
            assert!(event(1, 0, 0) > event(0, 9, 9));
        }
    }
}

/// Key of a twin in `twins`: `d ‖ deviceId` for a device, `m ‖ len ‖ deviceId ‖ len ‖ moduleId`
/// for a module. The kind byte keeps the two key shapes from ever meeting.
pub fn twin(device_id: &str, module_id: Option<&str>) -> Vec<u8> {
    match module_id {
        None => {
            let mut k = vec![b'd'];
            k.extend_from_slice(device_id.as_bytes());
            k
        }
        Some(m) => {
            let mut k = vec![b'm'];
            k.extend_from_slice(&module(device_id, m));
            k
        }
    }
}

/// The device and module ids of a twin key (the inverse of [`twin`]).
pub fn parse_twin(key: &[u8]) -> Option<(String, Option<String>)> {
    let (kind, rest) = key.split_first()?;
    let text = |b: &[u8]| std::str::from_utf8(b).ok().map(str::to_string);
    match kind {
        b'd' => Some((text(rest)?, None)),
        b'm' => {
            let (&n, rest) = rest.split_first()?;
            let (device, rest) = rest.split_at_checked(n as usize)?;
            let (&m, module) = rest.split_first()?;
            (module.len() == m as usize).then_some(())?;
            Some((text(device)?, Some(text(module)?)))
        }
        _ => None,
    }
}

/// Keys of the C2D column families.
///
/// A queue key is `d ‖ len ‖ deviceId` for a device queue and `f` for the feedback queue; a
/// message key is `queue ‖ sequence:u64be`, so one queue is one contiguous range in order.
/// A timer key is `kind ‖ deadline:u64be ‖ queue ‖ sequence:u64be`: each sweeper walks its own
/// kind from the earliest deadline and stops at the first one still in the future.
pub mod c2d {
    /// The feedback queue.
    pub const FEEDBACK_QUEUE: &[u8] = b"f";
    /// The file-upload notification queue (it has no timers; see `c2d::file_notifications`).
    pub const FILE_NOTIFICATION_QUEUE: &[u8] = b"u";

    pub fn device_queue(device_id: &str) -> Vec<u8> {
        let mut k = vec![b'd'];
        super::push_len_prefixed(&mut k, device_id);
        k
    }

    /// The device id of a device queue key.
    pub fn queue_device(queue: &[u8]) -> Option<&str> {
        match queue {
            [b'd', len, rest @ ..] if rest.len() == *len as usize => std::str::from_utf8(rest).ok(),
            _ => None,
        }
    }

    pub fn message(queue: &[u8], sequence: u64) -> Vec<u8> {
        let mut k = Vec::with_capacity(queue.len() + 8);
        k.extend_from_slice(queue);
        k.extend_from_slice(&sequence.to_be_bytes());
        k
    }

    /// Lock (visibility) deadlines.
    pub const TIMER_LOCK: u8 = 1;
    /// Time-to-live deadlines.
    pub const TIMER_EXPIRY: u8 = 2;

    pub fn timer(kind: u8, deadline: i64, queue: &[u8], sequence: u64) -> Vec<u8> {
        let mut k = Vec::with_capacity(1 + 8 + queue.len() + 8);
        k.push(kind);
        k.extend_from_slice(&(deadline.max(0) as u64).to_be_bytes());
        k.extend_from_slice(queue);
        k.extend_from_slice(&sequence.to_be_bytes());
        k
    }

    /// `(deadline, queue, sequence)` of a timer key.
    pub fn parse_timer(key: &[u8]) -> Option<(i64, &[u8], u64)> {
        if key.len() < 1 + 8 + 1 + 8 {
            return None;
        }
        let deadline = u64::from_be_bytes(key[1..9].try_into().ok()?) as i64;
        let (queue, seq) = key[9..].split_at(key.len() - 9 - 8);
        Some((deadline, queue, u64::from_be_bytes(seq.try_into().ok()?)))
    }

    /// Timers of `kind` due at or before `now`: `[kind ‖ 0, kind ‖ now+1)`.
    pub fn timers_due(kind: u8, now: i64) -> (Vec<u8>, Vec<u8>) {
        let mut end = vec![kind];
        end.extend_from_slice(&((now.max(0) as u64).saturating_add(1)).to_be_bytes());
        (vec![kind], end)
    }

    pub fn feedback_record(sequence: u64) -> Vec<u8> {
        sequence.to_be_bytes().to_vec()
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn timer_keys_round_trip_and_sort_by_deadline() {
            let q = device_queue("dev1");
            let k = timer(TIMER_LOCK, 1_000, &q, 7);
            assert_eq!(parse_timer(&k), Some((1_000, q.as_slice(), 7)));
            assert!(k < timer(TIMER_LOCK, 1_001, &device_queue("a"), 0));
            assert!(timer(TIMER_LOCK, i64::MAX, &q, 0) < timer(TIMER_EXPIRY, 0, &q, 0));
            let (from, to) = timers_due(TIMER_LOCK, 1_000);
            assert!(k >= from && k < to);
            assert!(timer(TIMER_LOCK, 1_001, &q, 0) >= to);
            assert_eq!(queue_device(&q), Some("dev1"));
            assert_eq!(queue_device(FEEDBACK_QUEUE), None);
        }

        #[test]
        fn device_queues_do_not_prefix_each_other() {
            assert!(!message(&device_queue("dev10"), 0).starts_with(&device_queue("dev1")));
        }
    }
}
