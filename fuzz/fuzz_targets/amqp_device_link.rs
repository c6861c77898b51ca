#![no_main]
//! See `ferrohub_server::fuzz::amqp_device_link`: what it drives and what it checks.
libfuzzer_sys::fuzz_target!(|data: &[u8]| ferrohub_server::fuzz::amqp_device_link(data));
