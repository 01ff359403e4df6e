//! Every integration test of this crate in one binary: each file below is a module, so the
//! workspace links one test executable here instead of one per file. Run one file's tests
//! with `cargo test -p CRATE --test suite FILE::`.

mod bench_clip_cli;
mod bench_scale_cli;
mod dataset_cli;
mod eval_cli;
mod eval_units;
mod privacy_cli;
mod usage_cli;
