//! `dpctl`: dpcap's operator CLI. Job control over the coordinator's JobService, the embedded
//! demo cluster, evaluation of checkpoints, offline privacy calculators, datasets, model
//! configurations and benchmarks. The binary is [`main`]; the only other public module is
//! [`eval`], whose parts its suite tests directly.
//!
//! It owns no service logic: it calls the services over gRPC, or embeds them whole (`demo`).

/// `println!` for the commands' output: once stdout is a closed pipe (`dpctl … | head`) the
/// rest of the output is dropped, without a panic, and the command still ends with its own
/// exit code (`dpctl audit`'s 6, `dpctl wait`'s outcome).
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::write_line(format_args!($($arg)*))
    };
}

mod audit;
mod bench;
mod bench_budget;
mod bench_clip;
mod bench_images;
mod bench_scale;
mod bench_share;
mod budget;
mod checkpoint;
mod context;
mod dataset;
mod demo;
pub mod eval;
mod export;
mod jobs;
mod model;
mod privacy;

use std::path::PathBuf;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

/// Operate dpcap: jobs, the local demo, privacy calculators, datasets and benchmarks.
#[derive(Debug, Parser)]
#[command(name = "dpctl", version, about)]
struct Cli {
    #[command(flatten)]
    server: jobs::Server,
    /// The dpctl config context to use for this command (`dpctl config get-contexts`).
    #[arg(long, global = true, env = "DPCAP_CONTEXT")]
    context: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Submit a job spec (YAML or JSON); prints the plan with the calibrated sigma.
    Submit {
        /// The spec file.
        file: PathBuf,
        /// A repeat with the same key returns the original job.
        #[arg(long)]
        idempotency_key: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show one job.
    Get {
        job_id: String,
        #[arg(long)]
        json: bool,
    },
    /// List jobs.
    List {
        #[arg(long)]
        json: bool,
    },
    /// Follow a job with a progress bar until it ends; the exit code tells the outcome.
    Watch { job_id: String },
    /// Cancel a pending or running job (it can be resumed later).
    Cancel { job_id: String },
    /// Resume a FAILED or CANCELLED job from its checkpoint at the ledger's next step.
    Resume { job_id: String },
    /// Wait for a job to end: exit 0 succeeded, 3 failed, 4 cancelled, 5 budget exhausted (or
    /// refused at resume by its budget).
    Wait { job_id: String },
    /// Run the whole product locally: dataset, embedded cluster, a DP-Cap job, a report.
    Demo(demo::DemoArgs),
    /// Score a job's checkpoint on held-out synthetic scenes: zero-shot, ARO, layout, caption
    /// slots, linear and few-shot probes.
    Eval(eval::EvalArgs),
    /// The one-run privacy audit of an ended job submitted with canaries: the epsilon lower
    /// bound they prove beside the claimed epsilon (exit 6 if it passes the claim).
    Audit(audit::AuditArgs),
    /// Write a checkpoint's image encoder for other tools (our layout, or a timm ViT state dict).
    Export(export::ExportArgs),
    /// Offline privacy accounting: epsilon, noise multiplier or steps for a DP-SGD run.
    #[command(subcommand)]
    Privacy(privacy::PrivacyCommand),
    /// Datasets: synthetic shards, indexes, and each dataset's lifetime privacy budget (set, show).
    #[command(subcommand)]
    Dataset(dataset::DatasetCommand),
    /// Model configurations.
    #[command(subcommand)]
    Model(model::ModelCommand),
    /// Benchmarks (ratios measured side by side in one run).
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// Named clusters (endpoints, CA, domain, token file) in one file, like kubeconfig.
    #[command(subcommand)]
    Config(context::ConfigCommand),
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread().enable_all().build()?)
}

fn run(cli: Cli) -> anyhow::Result<i32> {
    let server = cli.server;
    match cli.command {
        Command::Privacy(command) => privacy::run(command)?,
        Command::Bench(command) => {
            // Warnings only unless RUST_LOG says more (the GPU check asks cubecl-cuda for each
            // kernel it compiles).
            dpcap_serve::process::init_tracing_at(false, "warn");
            bench::run(command)?;
        }
        Command::Model(command) => model::run(command)?,
        Command::Config(command) => context::run(command)?,
        Command::Dataset(command) => dataset::run(command, &server)?,
        Command::Submit { file, idempotency_key, json } => {
            runtime()?.block_on(jobs::submit(&server, &file, idempotency_key, json))?;
        }
        Command::Get { job_id, json } => runtime()?.block_on(jobs::get(&server, &job_id, json))?,
        Command::List { json } => runtime()?.block_on(jobs::list(&server, json))?,
        Command::Cancel { job_id } => runtime()?.block_on(jobs::cancel_or_resume(&server, &job_id, false))?,
        Command::Resume { job_id } => runtime()?.block_on(jobs::cancel_or_resume(&server, &job_id, true))?,
        Command::Watch { job_id } => return runtime()?.block_on(jobs::wait(&server, &job_id, true)),
        Command::Wait { job_id } => return runtime()?.block_on(jobs::wait(&server, &job_id, false)),
        Command::Eval(args) => runtime()?.block_on(eval::run(args))?,
        Command::Export(args) => runtime()?.block_on(export::run(args))?,
        Command::Audit(args) => return runtime()?.block_on(audit::run(args, &server)),
        Command::Demo(args) => {
            dpcap_serve::process::init_tracing_at(false, "warn");
            runtime()?.block_on(demo::run(args))?;
        }
    }
    Ok(0)
}

/// The commands that never reach a cluster: their help leaves the cluster's flags out.
const OFFLINE: [&str; 9] =
    ["bench", "demo", "eval", "export", "privacy", "dataset synth", "dataset index", "model", "config"];

/// The command line, with the cluster's global flags hidden from the offline commands' help
/// and, when a dpctl config context is in use, its values as their defaults.
fn command(context: Option<&context::Context>, args: &[String]) -> clap::Command {
    let mut command = Cli::command();
    // An offline command reaches no cluster: the context (and its token file) is not read.
    if let Some(context) = context.filter(|_| !offline(args)) {
        command = context::apply(command, context, args);
    }
    command.build(); // propagates the global flags to every subcommand
    let cluster: Vec<clap::Id> =
        command.get_arguments().filter(|a| a.is_global_set()).map(|a| a.get_id().clone()).collect();
    // In place (`mut_args`): `mut_arg` re-orders the arguments of a built command, whose
    // parser index then points at the wrong ones.
    let hide = |sub: clap::Command| sub.mut_args(|a| if cluster.contains(a.get_id()) { a.hide(true) } else { a });
    for path in OFFLINE {
        command = match path.split_once(' ') {
            Some((parent, child)) => command.mut_subcommand(parent, |p| p.mut_subcommand(child, hide)),
            None => command.mut_subcommand(path, |s| hide_all(s, &hide)),
        };
    }
    command
}

/// The global flags that take a value as the next word.
const VALUE_FLAGS: [&str; 7] =
    ["--coordinator", "--token", "--context", "--tls-ca", "--tls-domain", "--tls-client-cert", "--tls-client-key"];

/// Whether `args` (the whole command line) run one of the [`OFFLINE`] commands.
fn offline(args: &[String]) -> bool {
    let mut words = Vec::new();
    let mut rest = args.iter().skip(1);
    while let Some(arg) = rest.next() {
        if VALUE_FLAGS.contains(&arg.as_str()) {
            rest.next();
        } else if !arg.starts_with('-') {
            words.push(arg.as_str());
            if words.len() == 2 {
                break;
            }
        }
    }
    let one = words.first().copied().unwrap_or_default();
    let two = words.join(" ");
    OFFLINE.iter().any(|path| *path == one || *path == two)
}

/// `hide` applied to `command` and every command under it.
fn hide_all(command: clap::Command, hide: &impl Fn(clap::Command) -> clap::Command) -> clap::Command {
    let names: Vec<String> = command.get_subcommands().map(|s| s.get_name().to_owned()).collect();
    let mut command = hide(command);
    for name in names {
        command = command.mut_subcommand(name, |s| hide_all(s, hide));
    }
    command
}

/// Set once stdout turned out to be a closed pipe.
static STDOUT_CLOSED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Writes one line to stdout; see `outln!`. Any other write error ends the process with exit 2.
fn write_line(line: std::fmt::Arguments<'_>) {
    use std::io::Write;
    use std::sync::atomic::Ordering;
    if STDOUT_CLOSED.load(Ordering::Relaxed) {
        return;
    }
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_fmt(line).and_then(|()| out.write_all(b"\n")) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            STDOUT_CLOSED.store(true, Ordering::Relaxed);
            return;
        }
        eprintln!("error: writing to stdout: {e}");
        std::process::exit(2);
    }
}

/// Runs `dpctl` on the process's arguments and exits with its code (2 on an error).
pub fn main() {
    // Before any thread: the demo's ranks and `bench clip` run training steps here.
    dpcap_ml::alloc::keep_step_buffers();
    let fail = |e: anyhow::Error| -> ! {
        eprintln!("error: {e:#}");
        std::process::exit(2);
    };
    let args: Vec<String> = std::env::args().collect();
    let config = context::Config::load().unwrap_or_else(|e| fail(e));
    let active = config.active(context::chosen(&args).as_deref()).unwrap_or_else(|e| fail(e));
    let command = command(active.map(|(_, c)| c), &args);
    let cli = Cli::from_arg_matches(&command.get_matches_from(args)).unwrap_or_else(|e| e.exit());
    match run(cli) {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::exit(error_exit_code(&e));
        }
    }
}

/// 5 for a refusal by a budget (a submit or resume the budget cannot cover), as `dpctl wait`
/// exits for a budget's end; 2 for every other error.
fn error_exit_code(error: &anyhow::Error) -> i32 {
    let budget = error
        .chain()
        .filter_map(|e| e.downcast_ref::<dpcap_proto::client::ClientError>())
        .any(|e| e.code == Some(dpcap_proto::ErrorCode::BudgetExhausted));
    if budget { 5 } else { 2 }
}

#[cfg(test)]
mod structure;
#[cfg(test)]
mod tests;
