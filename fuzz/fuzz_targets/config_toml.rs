#![no_main]
//! See `ferrohub_server::fuzz::config_toml`: what it drives and what it checks.
libfuzzer_sys::fuzz_target!(|data: &[u8]| ferrohub_server::fuzz::config_toml(data));
