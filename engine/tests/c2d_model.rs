//! The C2D queue against a model (issue 18, ENG-2): random sequences of send, receive,
//! complete / reject / abandon (with current, stale and malformed lock tokens), time passing,
//! lock and TTL sweeps, and reopening the store, each checked step by step against a plain
//! in-memory queue that states seed 002's rules directly.
//!
//! Times move in steps of 0 to 3 ms against a 3 ms lock and TTLs of a few ms, so operations
//! land exactly on a lock's or a message's deadline often: an off-by-one in either is found.

mod common;

use std::collections::BTreeMap;

use ferrohub_engine::c2d::{Ack, C2dError, C2dMessage, QueueSettings, Settle, Settled};
use ferrohub_engine::model::{IdentitySpec, UnixMillis};
use ferrohub_engine::Store;
use proptest::prelude::*;

const DEVICE: &str = "model-device";
const LOCK_MS: i64 = 3;
const DEFAULT_TTL_MS: i64 = 9;
const MAX_DELIVERIES: u32 = 2;
const MAX_DEPTH: u32 = 4;

fn settings() -> QueueSettings {
    QueueSettings {
        max_depth: MAX_DEPTH,
        default_ttl_ms: DEFAULT_TTL_MS,
        max_delivery_count: MAX_DELIVERIES,
        lock_timeout_ms: LOCK_MS,
        feedback_ttl_ms: 1_000_000_000,
        feedback_max_delivery_count: 10,
        feedback_batch: 100,
    }
}

#[derive(Debug, Clone)]
enum Op {
    /// `ttl`: the message's own expiry, in ms from now (`None`: the hub's default TTL).
    Send {
        ttl: Option<i64>,
        ack: Ack,
    },
    Receive {
        max: usize,
    },
    /// Settles with the `token`-th lock token handed out so far (modulo their number).
    Settle {
        token: usize,
        action: Settle,
    },
    SettleMalformed,
    Advance {
        ms: i64,
    },
    SweepLocks,
    SweepExpired,
    Reopen,
}

fn op() -> impl Strategy<Value = Op> {
    let ack = prop_oneof![
        Just(Ack::None),
        Just(Ack::Positive),
        Just(Ack::Negative),
        Just(Ack::Full)
    ];
    let action = prop_oneof![
        Just(Settle::Complete),
        Just(Settle::Reject),
        Just(Settle::Abandon)
    ];
    prop_oneof![
        4 => (proptest::option::of(0i64..12), ack).prop_map(|(ttl, ack)| Op::Send { ttl, ack }),
        4 => (1usize..4).prop_map(|max| Op::Receive { max }),
        5 => (0usize..16, action).prop_map(|(token, action)| Op::Settle { token, action }),
        1 => Just(Op::SettleMalformed),
        5 => (0i64..4).prop_map(|ms| Op::Advance { ms }),
        2 => Just(Op::SweepLocks),
        2 => Just(Op::SweepExpired),
        1 => Just(Op::Reopen),
    ]
}

/// One message as the model keeps it.
#[derive(Debug, Clone)]
struct Msg {
    expiry: i64,
    ack: Ack,
    deliveries: u32,
    /// The lock: which handed-out token holds it, and until when.
    lock: Option<(usize, i64)>,
}

/// Seed 002's queue, stated plainly.
#[derive(Debug, Default)]
struct Model {
    now: i64,
    next_sequence: u64,
    messages: BTreeMap<u64, Msg>,
    /// Tokens handed out, in order: (sequence, the engine's token string).
    tokens: Vec<(u64, String)>,
    feedback: usize,
}

impl Model {
    fn feedback_on_success(&mut self, ack: Ack) {
        if matches!(ack, Ack::Positive | Ack::Full) {
            self.feedback += 1;
        }
    }

    fn kill(&mut self, sequence: u64) {
        let m = self.messages.remove(&sequence).expect("present");
        if matches!(m.ack, Ack::Negative | Ack::Full) {
            self.feedback += 1;
        }
    }

    /// Abandon or lock expiry: back to the queue, or dead after its last delivery.
    fn release(&mut self, sequence: u64) -> Settled {
        let m = self.messages.get_mut(&sequence).expect("present");
        if m.deliveries >= MAX_DELIVERIES {
            self.kill(sequence);
            Settled::Dead
        } else {
            m.lock = None;
            Settled::Requeued
        }
    }

    /// The message `token` locks, if that lock is current and neither it nor the message
    /// has expired.
    fn locked_by(&self, token: usize) -> Option<u64> {
        let (sequence, _) = self.tokens[token];
        let m = self.messages.get(&sequence)?;
        let (holder, until) = m.lock?;
        (holder == token && until > self.now && m.expiry > self.now).then_some(sequence)
    }
}

fn message(ttl: Option<i64>, ack: Ack, now: i64) -> C2dMessage {
    C2dMessage {
        ack,
        expiry: ttl.map(|t| UnixMillis(now + t)),
        body: b"x".to_vec(),
        ..C2dMessage::default()
    }
}

fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let dir = tempfile::tempdir().unwrap();
    let mut store: Store = common::open(dir.path());
    store
        .create_device(DEVICE, &IdentitySpec::default(), common::T0)
        .unwrap();
    let s = settings();
    let mut model = Model {
        now: common::T0.0,
        ..Model::default()
    };
    for (step, op) in ops.into_iter().enumerate() {
        let now = UnixMillis(model.now);
        match op {
            Op::Send { ttl, ack } => {
                let got = store.send_c2d(DEVICE, message(ttl, ack, model.now), now, &s);
                if model.messages.len() as u32 >= MAX_DEPTH {
                    prop_assert!(
                        matches!(got, Err(C2dError::QueueFull { .. })),
                        "step {step}: send to a full queue gave {got:?}"
                    );
                } else {
                    let sent = got.map_err(|e| TestCaseError::fail(format!("step {step}: {e}")))?;
                    let expiry = (model.now + ttl.unwrap_or(DEFAULT_TTL_MS)).max(0);
                    prop_assert_eq!(sent.sequence, model.next_sequence, "step {}", step);
                    prop_assert_eq!(sent.expiry.0, expiry, "step {}", step);
                    model.messages.insert(
                        model.next_sequence,
                        Msg {
                            expiry,
                            ack,
                            deliveries: 0,
                            lock: None,
                        },
                    );
                    model.next_sequence += 1;
                    prop_assert_eq!(sent.depth as usize, model.messages.len(), "step {}", step);
                }
            }
            Op::Receive { max } => {
                let got = store.receive_c2d(DEVICE, max, now, &s).unwrap();
                let deliverable: Vec<u64> = model
                    .messages
                    .iter()
                    .filter(|(_, m)| m.lock.is_none() && m.expiry > model.now)
                    .map(|(q, _)| *q)
                    .take(max)
                    .collect();
                let sequences: Vec<u64> = got.iter().map(|d| d.sequence).collect();
                prop_assert_eq!(&sequences, &deliverable, "step {}: receive({})", step, max);
                for d in got {
                    let token = model.tokens.len();
                    let m = model.messages.get_mut(&d.sequence).expect("deliverable");
                    m.deliveries += 1;
                    m.lock = Some((token, model.now + LOCK_MS));
                    prop_assert_eq!(d.delivery_count, m.deliveries, "step {}", step);
                    prop_assert_eq!(d.expiry.0, m.expiry, "step {}", step);
                    model.tokens.push((d.sequence, d.lock_token));
                }
            }
            Op::Settle { token, action } => {
                if model.tokens.is_empty() {
                    continue;
                }
                let token = token % model.tokens.len();
                let text = model.tokens[token].1.clone();
                let got = store.settle_c2d(DEVICE, &text, action, now, &s);
                match model.locked_by(token) {
                    None => prop_assert!(
                        matches!(got, Err(C2dError::LockLost(_))),
                        "step {step}: settle {action:?} with a lost lock gave {got:?}"
                    ),
                    Some(sequence) => {
                        let expected = match action {
                            Settle::Complete => {
                                let m = model.messages.remove(&sequence).expect("locked");
                                model.feedback_on_success(m.ack);
                                Settled::Removed
                            }
                            Settle::Reject => {
                                model.kill(sequence);
                                Settled::Removed
                            }
                            Settle::Abandon => model.release(sequence),
                        };
                        let got =
                            got.map_err(|e| TestCaseError::fail(format!("step {step}: {e}")))?;
                        prop_assert_eq!(got, expected, "step {}: settle {:?}", step, action);
                    }
                }
            }
            Op::SettleMalformed => {
                let got = store.settle_c2d(DEVICE, "not-a-token", Settle::Complete, now, &s);
                prop_assert!(
                    matches!(got, Err(C2dError::BadLockToken(_))),
                    "step {step}: {got:?}"
                );
            }
            Op::Advance { ms } => model.now += ms,
            Op::SweepLocks => {
                let report = store.expire_c2d_locks(now, &s, 1_000).unwrap();
                let due: Vec<u64> = model
                    .messages
                    .iter()
                    .filter(|(_, m)| m.lock.is_some_and(|(_, until)| until <= model.now))
                    .map(|(q, _)| *q)
                    .collect();
                let dead = due
                    .into_iter()
                    .filter(|q| model.release(*q) == Settled::Dead)
                    .count();
                prop_assert_eq!(report.dead, dead, "step {}: lock sweep", step);
            }
            Op::SweepExpired => {
                let report = store.expire_c2d_messages(now, &s, 1_000).unwrap();
                let due: Vec<u64> = model
                    .messages
                    .iter()
                    .filter(|(_, m)| m.expiry <= model.now)
                    .map(|(q, _)| *q)
                    .collect();
                let dead = due.len();
                for q in due {
                    model.kill(q);
                }
                prop_assert_eq!(report.dead, dead, "step {}: TTL sweep", step);
            }
            Op::Reopen => {
                drop(store);
                store = common::open(dir.path());
            }
        }
        prop_assert_eq!(
            store.c2d_depth(DEVICE).unwrap() as usize,
            model.messages.len(),
            "step {}: depth",
            step
        );
        prop_assert_eq!(
            store.pending_feedback_records().unwrap(),
            model.feedback,
            "step {}: feedback records",
            step
        );
    }
    Ok(())
}

proptest! {
    // Each case opens a store; 300 cases of up to 60 steps take a few seconds here.
    #![proptest_config(ProptestConfig::with_cases(common::proptest_cases(300)))]
    #[test]
    fn c2d_queue_matches_its_model(ops in proptest::collection::vec(op(), 1..60)) {
        run(ops)?;
    }
}
