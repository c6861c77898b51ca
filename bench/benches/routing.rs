//! Route evaluation benches (EVT-5): one `Router::route` call for a device message with 0, 1
//! and 10 routes, against a real store in a temporary directory (custom endpoints created for
//! the routes). Two condition kinds:
//! - `properties`: application and system properties
//!   (`level = 'high' AND $connectionDeviceId = 'dev1'`);
//! - `body`: fields of the JSON body (content type `application/json`, encoding `utf-8`), which
//!   the view parses once per message, lazily, on the first `$body` a condition reads.
//!
//! In both, one route matches and, in the ten-route case, nine more never do (so every route's
//! condition is evaluated and each message goes to one endpoint). With no route the message
//! goes to the built-in endpoint through the fallback route. No condition names `$twin`, so the
//! store is not read while routing. The measured call includes building the routed copies, not
//! cloning the input event (done in criterion's untimed setup).
//!
//! Run: `cargo bench --workspace --bench routing`

use std::time::Duration;

use criterion::{criterion_group, criterion_main, BatchSize, BenchmarkId, Criterion};
use ferrohub_engine::d2c::NewEvent;
use ferrohub_engine::model::UnixMillis;
use ferrohub_engine::notifications::EventSource;
use ferrohub_engine::routing::Route;
use ferrohub_engine::{StorageError, Store, StoreConfig};
use ferrohub_server::hub::routes::{load_router, StoreTwins};
use ferrohub_server::routing::Router;

const NOW: UnixMillis = UnixMillis(1_700_000_000_000);
const ENQUEUED: UnixMillis = UnixMillis(1_700_000_000_000);

/// A telemetry message as the MQTT path builds it: system properties, one application
/// property and a JSON body of about 256 bytes.
fn message() -> NewEvent {
    let body = serde_json::json!({
        "temp": 25.5,
        "seq": 7,
        "status": "ok",
        "site": {"building": "b1", "floor": 3},
        "pad": "x".repeat(160),
    });
    NewEvent {
        device_id: "dev1".into(),
        endpoints: None,
        system_properties: vec![
            ("message-id".into(), "m-1".into()),
            ("content-type".into(), "application/json".into()),
            ("content-encoding".into(), "utf-8".into()),
            ("iothub-connection-device-id".into(), "dev1".into()),
            (
                "iothub-connection-auth-method".into(),
                "{\"scope\":\"device\"}".into(),
            ),
        ],
        application_properties: vec![("level".into(), "high".into())],
        body: serde_json::to_vec(&body).expect("body"),
    }
}

/// The conditions of `n` routes: the first matches [`message`], the others never do.
fn conditions(kind: &str, n: usize) -> Vec<String> {
    (0..n)
        .map(|k| match (kind, k) {
            ("properties", 0) => "level = 'high' AND $connectionDeviceId = 'dev1'".to_string(),
            ("properties", k) => {
                format!(
                    "level = 'level{k}' AND $connectionDeviceId = 'dev1' OR $messageId = 'm-{k}0'"
                )
            }
            ("body", 0) => "$body.temp > 20 AND $body.status = 'ok'".to_string(),
            ("body", k) => format!(
                "$body.temp > {} OR ($body.site.floor = {} AND $body.seq = {k})",
                100 + k,
                10 + k
            ),
            _ => unreachable!("unknown condition kind {kind}"),
        })
        .collect()
}

/// A store in a temporary directory whose routing configuration has `n` routes of `kind`,
/// route `k` sending to custom endpoint `ep{k}`, and the router loaded from it.
fn routed_store(kind: &str, n: usize) -> (tempfile::TempDir, Store, Router) {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = Store::open(dir.path(), StoreConfig::default()).expect("open store");
    let conditions = conditions(kind, n);
    for k in 0..n {
        store
            .create_endpoint(&format!("ep{k}"), 4, NOW)
            .expect("create endpoint");
    }
    store
        .update_routing_config(|cfg| {
            cfg.routes = conditions
                .iter()
                .enumerate()
                .map(|(k, condition)| Route {
                    name: format!("r{k}"),
                    source: EventSource::DeviceMessages,
                    condition: condition.clone(),
                    endpoints: vec![format!("ep{k}")],
                    enabled: true,
                })
                .collect();
            Ok::<_, StorageError>(())
        })
        .expect("store routes");
    let router = load_router(&store, "bench-hub").expect("load router");
    (dir, store, router)
}

fn route(c: &mut Criterion) {
    let mut g = c.benchmark_group("route");
    g.sample_size(50).measurement_time(Duration::from_secs(4));
    for kind in ["properties", "body"] {
        for n in [0usize, 1, 10] {
            let (_dir, store, router) = routed_store(kind, n);
            // Sanity: the message goes to exactly one endpoint in every case.
            let routed = router.route(
                &StoreTwins(&store),
                message(),
                None,
                EventSource::DeviceMessages,
                ENQUEUED,
            );
            assert_eq!(routed.len(), 1, "{kind}/{n}");
            assert_eq!(
                routed[0].endpoints.as_ref().map(Vec::len),
                Some(1),
                "{kind}/{n}"
            );
            let input = message();
            g.bench_with_input(BenchmarkId::new(kind, n), &n, |b, _| {
                b.iter_batched(
                    || (input.clone(), ENQUEUED),
                    |(event, enqueued)| {
                        router.route(
                            &StoreTwins(&store),
                            event,
                            None,
                            EventSource::DeviceMessages,
                            enqueued,
                        )
                    },
                    BatchSize::SmallInput,
                )
            });
        }
    }
    g.finish();
}

criterion_group!(benches, route);
criterion_main!(benches);
