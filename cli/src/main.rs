//! `dpctl`: dpcap's operator CLI. Offline privacy calculators, model configurations and
//! benchmarks today; job control and the embedded demo arrive with the coordinator.

mod bench;
mod bench_clip;
mod dataset;
mod model;
mod privacy;

use clap::{Parser, Subcommand};

/// Operate dpcap: privacy calculators and benchmarks.
#[derive(Debug, Parser)]
#[command(name = "dpctl", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Offline privacy accounting: epsilon, noise multiplier or steps for a DP-SGD run.
    #[command(subcommand)]
    Privacy(privacy::PrivacyCommand),
    /// Datasets: synthetic shards and indexes.
    #[command(subcommand)]
    Dataset(dataset::DatasetCommand),
    /// Model configurations.
    #[command(subcommand)]
    Model(model::ModelCommand),
    /// Benchmarks (ratios measured side by side in one run).
    #[command(subcommand)]
    Bench(bench::BenchCommand),
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Privacy(command) => privacy::run(command),
        Command::Bench(command) => bench::run(command),
        Command::Model(command) => model::run(command),
        Command::Dataset(command) => dataset::run(command),
    };
    if let Err(e) = result {
        eprintln!("error: {e:#}");
        std::process::exit(2);
    }
}
