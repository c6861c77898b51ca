//! ferrohub load generation: a small MQTT 3.1.1 client over TLS, QUIC or WebSocket
//! ([`client`], [`ws`]), AMQP connections
//! over TLS ([`amqp`]), one small
//! HTTP/1.1 client for the REST API ([`http`]), device registration through it ([`registry`]),
//! and latency statistics. The `loadgen` binary drives them; criterion benches
//! live in `benches/`.
//!
//! Every run is bounded: a fixed number of messages per device and an overall time limit.

pub mod amqp;
pub mod client;
pub mod dial;
pub mod http;
pub mod registry;
pub mod segment;
pub mod stats;
pub mod ws;

/// Runs `iters` calls of `op` spread evenly over `writers` threads (each call gets its thread's
/// index) and returns the wall time scaled to exactly `iters` calls: the measurement for
/// criterion's `iter_custom` when a bench is about concurrency.
pub fn run_concurrently(
    writers: u64,
    iters: u64,
    op: std::sync::Arc<dyn Fn(u64) + Send + Sync>,
) -> std::time::Duration {
    let per = iters.div_ceil(writers.max(1));
    let start = std::time::Instant::now();
    let handles: Vec<_> = (0..writers)
        .map(|w| {
            let op = std::sync::Arc::clone(&op);
            std::thread::spawn(move || (0..per).for_each(|_| op(w)))
        })
        .collect();
    for h in handles {
        h.join().expect("bench thread");
    }
    // Rounding may add a few calls; report per requested call.
    start
        .elapsed()
        .mul_f64(iters as f64 / (per * writers.max(1)) as f64)
}
