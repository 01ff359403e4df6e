//! Every integration test of this crate in one binary: each file below is a module, so the
//! workspace links one test executable here instead of one per file. Run one file's tests
//! with `cargo test -p CRATE --test suite FILE::`.

mod accounting_history;
mod accounting_properties;
mod accounting_vectors;
mod audit;
mod epsilon_lower_bounds;
