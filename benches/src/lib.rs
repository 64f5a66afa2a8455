//! Criterion benchmarks of the Ichor upgrade engine live in `benches/benches/`; this
//! library only gives the package a target. Run them with `cargo bench -p ichor-benches`.
#![forbid(unsafe_code)]
