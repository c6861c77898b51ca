//! The fuzz targets' entry points: each takes bytes from outside and runs them through a parser
//! the way the server does, then checks what the parser promises (round trips, limits, that an
//! accepted value can be used). A panic anywhere is a finding.
//!
//! `fuzz/` (cargo-fuzz, nightly, outside the workspace) calls these for coverage-guided runs;
//! the stable test `server/tests/fuzz_replay.rs` replays every seed and every saved finding
//! through them, plus a few seconds of mutations, in `.ci/run`. Keeping the bodies here means
//! both see the same code and a finding stays a regression test.
//!
//! # Invariants
//! - An entry point never panics on any input; only a bug in what it drives makes it panic.
//! - Entry points touch no files, sockets or clocks: what they drive must be pure given bytes.

mod amqp;
mod amqp_device;
mod json;
mod mqtt;
mod pnp;
mod provisioning;
mod query;
mod text;

pub use amqp::amqp_frames;
pub use amqp_device::amqp_device_link;
pub use json::{config_toml, dps_register, identity_json, twin_patch};
pub use mqtt::mqtt_stream;
pub use pnp::pnp_patch;
pub use provisioning::enrollment_json;
pub use query::query;
pub use text::{property_bag, sas_token, topics};

/// Every target by name, as `fuzz/fuzz_targets/` and the seed folders name them.
pub const TARGETS: &[(&str, fn(&[u8]))] = &[
    ("mqtt_stream", mqtt_stream),
    ("property_bag", property_bag),
    ("topics", topics),
    ("sas_token", sas_token),
    ("twin_patch", twin_patch),
    ("query", query),
    ("identity_json", identity_json),
    ("config_toml", config_toml),
    ("amqp_frames", amqp_frames),
    ("dps_register", dps_register),
    ("enrollment_json", enrollment_json),
    ("pnp_patch", pnp_patch),
    ("amqp_device_link", amqp_device_link),
];

/// The hub name the targets authenticate against.
const HOST: &str = "fuzz.azure-devices.net";
