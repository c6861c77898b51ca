//! ferrohub load generation: a small MQTT 3.1.1 client over TLS, device registration through
//! the REST API, and latency statistics. The `loadgen` binary drives them; criterion benches
//! live in `benches/`.
//!
//! Every run is bounded: a fixed number of messages per device and an overall time limit.

pub mod client;
pub mod registry;
pub mod segment;
pub mod stats;
