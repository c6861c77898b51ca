//! Engine benches (PRF-1): identity put and get, and synced commit throughput with 1, 8 and 64
//! concurrent writers (ENG-2 group commit). Every store lives in a temporary directory on the
//! same disk as the hub's data would (not tmpfs), with synced durability, so fsync is real.
//!
//! Run: `cargo bench -p ferrohub-bench --bench engine`

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use ferrohub_bench::run_concurrently;
use ferrohub_engine::model::{IdentitySpec, UnixMillis};
use ferrohub_engine::{Store, StoreConfig};

const NOW: UnixMillis = UnixMillis(1_700_000_000_000);

fn store() -> (tempfile::TempDir, Arc<Store>) {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = Store::open(dir.path(), StoreConfig::default()).expect("open store");
    (dir, Arc::new(store))
}

fn identity(c: &mut Criterion) {
    let mut g = c.benchmark_group("identity");
    g.sample_size(20).measurement_time(Duration::from_secs(5));
    let (_dir, s) = store();
    let next = AtomicU64::new(0);
    g.throughput(Throughput::Elements(1));
    g.bench_function("put_synced", |b| {
        b.iter(|| {
            let n = next.fetch_add(1, Ordering::Relaxed);
            s.create_device(&format!("put-{n}"), &IdentitySpec::default(), NOW)
                .expect("create")
        })
    });
    for i in 0..2_000 {
        s.create_device(&format!("get-{i}"), &IdentitySpec::default(), NOW)
            .expect("create");
    }
    let mut i = 0u64;
    g.bench_function("get", |b| {
        b.iter(|| {
            i = (i + 7919) % 2_000;
            s.get_device(&format!("get-{i}")).expect("get")
        })
    });
    g.finish();
}

fn group_commit(c: &mut Criterion) {
    let mut g = c.benchmark_group("synced_commit");
    g.sample_size(10).measurement_time(Duration::from_secs(8));
    g.throughput(Throughput::Elements(1));
    for writers in [1u64, 8, 64] {
        let (_dir, s) = store();
        let next = Arc::new(AtomicU64::new(0));
        let store = Arc::clone(&s);
        let op: Arc<dyn Fn(u64) + Send + Sync> = Arc::new(move |_| {
            let n = next.fetch_add(1, Ordering::Relaxed);
            store
                .create_device(&format!("gc-{n}"), &IdentitySpec::default(), NOW)
                .expect("create");
        });
        g.bench_with_input(BenchmarkId::new("writers", writers), &writers, |b, &w| {
            b.iter_custom(|iters| run_concurrently(w, iters, Arc::clone(&op)))
        });
        let stats = s.commit_stats();
        eprintln!(
            "synced_commit/writers/{writers}: {} commits in {} synced writes (mean group {:.1})",
            stats.commits,
            stats.writes,
            stats.commits as f64 / stats.writes.max(1) as f64
        );
    }
    g.finish();
}

fn twin_patch(c: &mut Criterion) {
    let mut g = c.benchmark_group("twin");
    g.sample_size(20)
        .measurement_time(Duration::from_secs(5))
        .throughput(Throughput::Elements(1));
    let (_dir, s) = store();
    for i in 0..64 {
        s.create_device(&format!("tw-{i}"), &IdentitySpec::default(), NOW)
            .expect("create");
    }
    let patch = serde_json::json!({"fw": "1.2.3", "telemetry": {"interval": 30, "enabled": true}});
    let patch = patch.as_object().cloned().expect("object");
    let mut n = 0u64;
    g.bench_function("patch_reported_synced", |b| {
        b.iter(|| {
            n += 1;
            s.patch_reported(&format!("tw-{}", n % 64), None, &patch, NOW)
                .expect("patch")
        })
    });
    let next = Arc::new(AtomicU64::new(0));
    let store = Arc::clone(&s);
    let shared = patch.clone();
    let op: Arc<dyn Fn(u64) + Send + Sync> = Arc::new(move |w| {
        let i = next.fetch_add(1, Ordering::Relaxed);
        store
            .patch_reported(&format!("tw-{w}"), None, &shared, UnixMillis(i as i64))
            .expect("patch");
    });
    g.bench_function("patch_reported_synced_64_writers", |b| {
        b.iter_custom(|iters| run_concurrently(64, iters, Arc::clone(&op)))
    });
    g.finish();
}

/// C2D queue operations: one send, one receive (lock) and one complete per iteration, each a
/// synced commit; alone and with 64 devices' cycles running at once.
fn c2d_queue(c: &mut Criterion) {
    use ferrohub_engine::c2d::{C2dMessage, QueueSettings, Settle};
    let mut g = c.benchmark_group("c2d");
    g.sample_size(20)
        .measurement_time(Duration::from_secs(5))
        .throughput(Throughput::Elements(1));
    let (_dir, s) = store();
    for i in 0..64 {
        s.create_device(&format!("q-{i}"), &IdentitySpec::default(), NOW)
            .expect("create");
    }
    let settings = QueueSettings::default();
    let message = C2dMessage {
        message_id: Some("m".into()),
        properties: vec![("k".into(), "v".into())],
        body: vec![7u8; 200],
        ..C2dMessage::default()
    };
    let cycle = {
        let (s, message) = (Arc::clone(&s), message.clone());
        move |device: &str| {
            s.send_c2d(device, message.clone(), NOW, &settings)
                .expect("send");
            let got = s.receive_c2d(device, 1, NOW, &settings).expect("receive");
            s.settle_c2d(device, &got[0].lock_token, Settle::Complete, NOW, &settings)
                .expect("complete");
        }
    };
    g.bench_function("send_receive_complete_synced", |b| b.iter(|| cycle("q-0")));
    let op: Arc<dyn Fn(u64) + Send + Sync> = Arc::new(move |w| cycle(&format!("q-{w}")));
    g.bench_function("send_receive_complete_synced_64_devices", |b| {
        b.iter_custom(|iters| run_concurrently(64, iters, Arc::clone(&op)))
    });
    g.finish();
}

criterion_group!(benches, identity, group_commit, twin_patch, c2d_queue);
criterion_main!(benches);
