//! D2C store benches (PRF-1, issue 3's storage choice): durable append throughput with 1 and 64
//! concurrent appenders through the engine (RocksDB, group commit) and through the append-only
//! segment-file prototype (`ferrohub_bench::segment`, group commit with `fdatasync`), same
//! 256-byte events; and reading a partition back from the engine.
//!
//! Run: `cargo bench --workspace --bench d2c`

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use ferrohub_bench::run_concurrently;
use ferrohub_bench::segment::SegmentLog;
use ferrohub_engine::d2c::{NewEvent, ReadPosition};
use ferrohub_engine::model::UnixMillis;
use ferrohub_engine::{Store, StoreConfig};

fn event(device: u64) -> NewEvent {
    NewEvent {
        device_id: format!("dev-{device}"),
        endpoints: None,
        system_properties: vec![
            ("message-id".into(), format!("m-{device}").into()),
            (
                "iothub-connection-device-id".into(),
                format!("dev-{device}").into(),
            ),
        ],
        application_properties: vec![("k".into(), "v".into())],
        body: vec![b'x'; 256],
    }
}

fn append(c: &mut Criterion) {
    let mut g = c.benchmark_group("d2c_append");
    g.sample_size(10)
        .measurement_time(Duration::from_secs(6))
        .throughput(Throughput::Elements(1));
    for writers in [1u64, 64] {
        let dir = tempfile::tempdir().expect("dir");
        let store = Arc::new(Store::open(dir.path(), StoreConfig::default()).expect("store"));
        let s = Arc::clone(&store);
        let op: Arc<dyn Fn(u64) + Send + Sync> = Arc::new(move |w| {
            s.append_events(vec![event(w)], UnixMillis(1))
                .expect("append");
        });
        g.bench_with_input(
            BenchmarkId::new("rocksdb/writers", writers),
            &writers,
            |b, &w| b.iter_custom(|iters| run_concurrently(w, iters, Arc::clone(&op))),
        );

        let dir = tempfile::tempdir().expect("dir");
        let log = Arc::new(SegmentLog::create(&dir.path().join("segment-0")).expect("segment"));
        let encoded = rmp_like_payload();
        let op: Arc<dyn Fn(u64) + Send + Sync> =
            Arc::new(move |_| log.append(&encoded).expect("append"));
        g.bench_with_input(
            BenchmarkId::new("segment_file/writers", writers),
            &writers,
            |b, &w| b.iter_custom(|iters| run_concurrently(w, iters, Arc::clone(&op))),
        );
    }
    g.finish();
}

/// A payload the size of an encoded engine event (body, properties, header fields).
fn rmp_like_payload() -> Vec<u8> {
    vec![0x5a; 256 + 120]
}

fn read(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("dir");
    let store = Store::open(dir.path(), StoreConfig::default()).expect("store");
    let batch: Vec<NewEvent> = (0..10_000).map(|_| event(7)).collect();
    let appended = store.append_events(batch, UnixMillis(1)).expect("append");
    let partition = appended[0].partition;
    let next = AtomicU64::new(0);
    let mut g = c.benchmark_group("d2c_read");
    g.throughput(Throughput::Elements(1000));
    g.bench_function("rocksdb/1000_events", |b| {
        b.iter(|| {
            let from = next.fetch_add(1000, Ordering::Relaxed) % 9_000;
            store
                .read_events(partition, ReadPosition::Sequence(from), 1000)
                .expect("read")
        })
    });
    g.finish();
}

criterion_group!(benches, append, read);
criterion_main!(benches);
