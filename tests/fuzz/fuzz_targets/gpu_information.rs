#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| nspawn_lifecycle_fuzz::gpu_information(data));
