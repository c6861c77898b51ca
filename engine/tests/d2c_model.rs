//! D2C partitions against a model (issue 18, ENG-2): random appends from several devices (one
//! or many events per call), a clock that may step back, reads from every kind of position,
//! retention trims and reopening the store, checked against per-partition lists.
//!
//! The model takes offsets from the engine's answers (an offset counts stored bytes, which the
//! model does not compute) and checks that they only grow and that reads by offset agree.

mod common;

use ferrohub_engine::d2c::{partition_of, NewEvent, ReadPosition};
use ferrohub_engine::model::UnixMillis;
use ferrohub_engine::Store;
use proptest::prelude::*;

const DEVICES: [&str; 5] = ["d0", "d1", "d2", "d3", "d4"];

#[derive(Debug, Clone)]
enum From {
    Start,
    End,
    /// The `k`-th sequence number from the partition's first (may lie before or beyond it).
    Sequence(i64),
    /// The offset of the `k`-th retained event, or one past the last offset.
    Offset(usize),
    /// Milliseconds relative to now.
    Time(i64),
}

#[derive(Debug, Clone)]
enum Op {
    Append(Vec<(usize, u8)>),
    Advance(i64),
    Read {
        partition: u16,
        from: From,
        max: usize,
    },
    /// Trims events enqueued before now minus this many ms.
    Trim(i64),
    Reopen,
}

fn op() -> impl Strategy<Value = Op> {
    let from = prop_oneof![
        Just(From::Start),
        Just(From::End),
        (-2i64..8).prop_map(From::Sequence),
        (0usize..8).prop_map(From::Offset),
        (-12i64..2).prop_map(From::Time),
    ];
    prop_oneof![
        6 => proptest::collection::vec((0usize..DEVICES.len(), any::<u8>()), 1..4).prop_map(Op::Append),
        3 => (-2i64..4).prop_map(Op::Advance),
        4 => (0u16..4, from, 0usize..6).prop_map(|(partition, from, max)| Op::Read { partition, from, max }),
        1 => (0i64..10).prop_map(Op::Trim),
        1 => Just(Op::Reopen),
    ]
}

#[derive(Debug, Clone, PartialEq)]
struct Event {
    sequence: u64,
    offset: u64,
    enqueued: i64,
    body: Vec<u8>,
}

#[derive(Debug, Default, Clone)]
struct Partition {
    events: Vec<Event>,
    next_sequence: u64,
    last: Option<Event>,
}

/// Small segments, so the model's few events span many of them (and retention drops some).
fn open(dir: &std::path::Path) -> Store {
    let store = common::open(dir);
    store.set_d2c_segment_bytes(300);
    store
}

fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let dir = tempfile::tempdir().unwrap();
    let mut store: Store = open(dir.path());
    let count = store.partition_count();
    let mut parts = vec![Partition::default(); count as usize];
    let mut now = common::T0.0;
    for (step, op) in ops.into_iter().enumerate() {
        match op {
            Op::Append(items) => {
                let events = items
                    .iter()
                    .map(|(d, b)| NewEvent {
                        device_id: DEVICES[*d].to_string(),
                        body: vec![*b; 1 + *b as usize % 7],
                        ..NewEvent::default()
                    })
                    .collect::<Vec<_>>();
                let appended = store
                    .append_events(events.clone(), UnixMillis(now))
                    .unwrap();
                prop_assert_eq!(appended.len(), events.len());
                for (e, a) in events.into_iter().zip(appended) {
                    let p = &mut parts[partition_of(&e.device_id, count) as usize];
                    prop_assert_eq!(a.partition, partition_of(&e.device_id, count));
                    prop_assert_eq!(a.sequence_number, p.next_sequence, "step {}", step);
                    let enqueued = p.last.as_ref().map_or(now, |l| l.enqueued.max(now));
                    prop_assert_eq!(a.enqueued_time.0, enqueued, "step {}: enqueued time", step);
                    if let Some(last) = &p.last {
                        prop_assert!(a.offset > last.offset, "step {step}: offsets must grow");
                    }
                    let event = Event {
                        sequence: a.sequence_number,
                        offset: a.offset,
                        enqueued,
                        body: e.body,
                    };
                    p.next_sequence += 1;
                    p.last = Some(event.clone());
                    p.events.push(event);
                }
            }
            Op::Advance(ms) => now += ms,
            Op::Read {
                partition,
                from,
                max,
            } => {
                let p = &parts[partition as usize];
                let begin = p.events.first().map_or(p.next_sequence, |e| e.sequence) as i64;
                let (position, expected): (ReadPosition, Vec<&Event>) = match from {
                    From::Start => (ReadPosition::Start, p.events.iter().collect()),
                    From::End => (ReadPosition::End, Vec::new()),
                    From::Sequence(k) => {
                        let s = (begin + k).max(0) as u64;
                        (
                            ReadPosition::Sequence(s),
                            p.events.iter().filter(|e| e.sequence >= s).collect(),
                        )
                    }
                    From::Offset(k) => {
                        let o = p.events.get(k).map_or_else(
                            || p.last.as_ref().map_or(0, |l| l.offset + 1),
                            |e| e.offset,
                        );
                        (
                            ReadPosition::Offset(o),
                            p.events.iter().filter(|e| e.offset >= o).collect(),
                        )
                    }
                    From::Time(d) => {
                        let t = now + d;
                        (
                            ReadPosition::EnqueuedTime(UnixMillis(t)),
                            p.events.iter().filter(|e| e.enqueued >= t).collect(),
                        )
                    }
                };
                let got = store.read_events(partition, position, max).unwrap();
                let got: Vec<Event> = got
                    .into_iter()
                    .map(|e| Event {
                        sequence: e.sequence_number,
                        offset: e.offset,
                        enqueued: e.enqueued_time.0,
                        body: e.body,
                    })
                    .collect();
                let expected: Vec<Event> = expected.into_iter().take(max).cloned().collect();
                prop_assert_eq!(
                    got,
                    expected,
                    "step {}: read {} from {:?}",
                    step,
                    partition,
                    position
                );
            }
            Op::Trim(back) => {
                let cutoff = now - back;
                let removed = store.trim_events_before(UnixMillis(cutoff)).unwrap();
                let mut expected = 0;
                for p in &mut parts {
                    let before = p.events.len();
                    // Enqueued times never decrease, so what goes is a prefix.
                    p.events.retain(|e| e.enqueued >= cutoff);
                    expected += (before - p.events.len()) as u64;
                }
                prop_assert_eq!(removed, expected, "step {}: trimmed", step);
            }
            Op::Reopen => {
                drop(store);
                store = open(dir.path());
            }
        }
        for (i, p) in parts.iter().enumerate() {
            let info = store.partition_info(i as u16).unwrap();
            prop_assert_eq!(
                info.begin_sequence_number,
                p.events.first().map_or(p.next_sequence, |e| e.sequence),
                "step {}: begin of {}",
                step,
                i
            );
            prop_assert_eq!(
                info.last_enqueued_sequence_number,
                p.last.as_ref().map(|l| l.sequence)
            );
            prop_assert_eq!(info.last_enqueued_offset, p.last.as_ref().map(|l| l.offset));
            prop_assert_eq!(
                info.last_enqueued_time.map(|t| t.0),
                p.last.as_ref().map(|l| l.enqueued)
            );
            prop_assert_eq!(
                info.is_empty,
                p.events.is_empty(),
                "step {}: is_empty of {}",
                step,
                i
            );
            prop_assert_eq!(
                store.next_sequence_number(i as u16).unwrap(),
                p.next_sequence
            );
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(common::proptest_cases(200)))]
    #[test]
    fn partitions_match_their_model(ops in proptest::collection::vec(op(), 1..50)) {
        run(ops)?;
    }
}
