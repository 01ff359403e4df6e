//! Every integration test of this crate in one binary: each file below is a module, so the
//! workspace links one test executable here instead of one per file. Run one file's tests
//! with `cargo test -p CRATE --test suite FILE::`.

mod clip_vs_naive;
mod configs;
mod efficiency;
mod fedemb;
mod fused;
mod gram;
mod nonfinite;
mod optim_checkpoint;
mod precision;
mod reference;
mod tf32_bound;
mod timm_export;
