//! Fuzz target: see `ichor_fuzz_checks::talosconfig`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ichor_fuzz_checks::talosconfig(data));
