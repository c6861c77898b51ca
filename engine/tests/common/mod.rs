//! Helpers shared by the engine's integration tests.
#![allow(dead_code)]

use ferrohub_engine::c2d::{Ack, C2dMessage, QueueSettings};
use ferrohub_engine::model::{IdentitySpec, Status, UnixMillis};
use ferrohub_engine::{Store, StoreConfig};
use std::path::Path;

pub const T0: UnixMillis = UnixMillis(1_700_000_000_000);

pub fn open(dir: &Path) -> Store {
    Store::open(dir, StoreConfig::default()).expect("open store")
}

/// `T0` plus `ms`.
pub fn at(ms: i64) -> UnixMillis {
    UnixMillis(T0.0 + ms)
}

/// A store in `dir` with one registered device, `d`.
pub fn store_with_device(dir: &Path) -> Store {
    let store = open(dir);
    store
        .create_device("d", &IdentitySpec::default(), T0)
        .expect("create device");
    store
}

/// A C2D message whose id and body are `id`, asking for `ack`.
pub fn c2d_message(id: &str, ack: Ack) -> C2dMessage {
    C2dMessage {
        message_id: Some(id.into()),
        ack,
        body: id.as_bytes().to_vec(),
        ..C2dMessage::default()
    }
}

/// C2D queue settings of `max_depth` messages, a minute of TTL and lock, three deliveries.
pub fn queue_settings(max_depth: u32) -> QueueSettings {
    QueueSettings {
        max_depth,
        default_ttl_ms: 60_000,
        max_delivery_count: 3,
        lock_timeout_ms: 60_000,
        feedback_ttl_ms: 60_000,
        feedback_max_delivery_count: 2,
        feedback_batch: 100,
    }
}

pub fn disabled(reason: &str) -> IdentitySpec {
    IdentitySpec {
        status: Status::Disabled,
        status_reason: Some(reason.into()),
        ..IdentitySpec::default()
    }
}

/// Opens the raw RocksDB database with every column family, for tests that must bypass the
/// engine (fixtures, deliberate damage).
pub fn raw_db(dir: &Path) -> rocksdb::DB {
    let mut opts = rocksdb::Options::default();
    opts.create_if_missing(true);
    let cfs = rocksdb::DB::list_cf(&opts, dir).expect("list column families");
    let descriptors = cfs.iter().map(|n| {
        let mut o = rocksdb::Options::default();
        if n == "counters" {
            // Reads of merged counters are not needed by these tests; a no-op keeps RocksDB happy.
            o.set_merge_operator_associative("ferrohub_add_counters", |_, e, _| {
                e.map(|v| v.to_vec())
            });
        }
        rocksdb::ColumnFamilyDescriptor::new(n, o)
    });
    rocksdb::DB::open_cf_descriptors(&opts, dir, descriptors).expect("open raw db")
}

/// Cases for a property test: `default`, or `PROPTEST_CASES` when set (longer runs outside CI).
pub fn proptest_cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}
