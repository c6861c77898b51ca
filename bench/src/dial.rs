//! Where connections go: the host a client names (its certificate name and token audience), or
//! one address every connection is sent to instead, set once per process. A cluster benchmark
//! aims at one node this way while the clients still speak to the hub's host name.

use std::sync::OnceLock;

static CONNECT_TO: OnceLock<String> = OnceLock::new();

/// Sends every later connection to `address` (a host or IP) instead of the host it names.
pub fn connect_everything_to(address: String) {
    let _ = CONNECT_TO.set(address);
}

/// The host to open a TCP connection to for a client that names `host`.
pub fn address_for(host: &str) -> &str {
    CONNECT_TO.get().map_or(host, String::as_str)
}
