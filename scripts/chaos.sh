#!/usr/bin/env bash
# Fault injection on a real cluster (accountant, coordinator, two workers on 127.0.0.1):
# RUNS jobs (default 50); in each, 1-3 random components are SIGKILLed at random points and
# restarted; then the ledger, job store and final checkpoint are checked (no step charged twice,
# charged = applied + discarded, epsilon <= target, SUCCEEDED). Prints one CHAOS summary line.
# Usage: scripts/chaos.sh [RUNS] [SEED]
set -euo pipefail
cd "$(dirname "$0")/.."
export CHAOS_RUNS="${1:-50}" CHAOS_SEED="${2:-24301}"
cargo test --workspace --test chaos -- --ignored --nocapture chaos_campaign 2>&1 | grep -E '^(CHAOS|VIOLATION|chaos:|test result)'
