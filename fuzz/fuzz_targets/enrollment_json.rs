#![no_main]
//! See `ferrohub_server::fuzz::enrollment_json`: what it drives and what it checks.
libfuzzer_sys::fuzz_target!(|data: &[u8]| ferrohub_server::fuzz::enrollment_json(data));
