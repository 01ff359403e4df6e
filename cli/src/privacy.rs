//! `dpctl privacy epsilon|noise|steps`: the accountant's math, offline. Prints a plain number,
//! or with `--json` one object holding the inputs and the result.

use anyhow::{Result, bail};
use clap::{Args, Subcommand};
use dpcap_privacy::{self as privacy, AccountantKind, EpsilonCurve, PrivacyError, Segment};
use serde_json::{Value, json};

#[derive(Debug, Subcommand)]
pub enum PrivacyCommand {
    /// Epsilon at delta after the given steps.
    Epsilon {
        #[command(flatten)]
        rate: Rate,
        /// Noise multiplier sigma (noise std = sigma * C).
        #[arg(long, value_name = "S", allow_negative_numbers = true)]
        noise_multiplier: f64,
        #[command(flatten)]
        length: Length,
        #[command(flatten)]
        common: Common,
    },
    /// The smallest noise multiplier that keeps the run within epsilon at delta.
    Noise {
        #[command(flatten)]
        rate: Rate,
        #[command(flatten)]
        length: Length,
        /// Target epsilon.
        #[arg(long, value_name = "E", allow_negative_numbers = true)]
        epsilon: f64,
        #[command(flatten)]
        common: Common,
    },
    /// The most steps that stay within epsilon at delta.
    Steps {
        #[command(flatten)]
        rate: Rate,
        /// Noise multiplier sigma.
        #[arg(long, value_name = "S", allow_negative_numbers = true)]
        noise_multiplier: f64,
        /// Target epsilon.
        #[arg(long, value_name = "E", allow_negative_numbers = true)]
        epsilon: f64,
        #[command(flatten)]
        common: Common,
    },
}

/// The Poisson sampling rate, given directly or as batch size over dataset size.
#[derive(Debug, Args)]
pub struct Rate {
    /// Sampling rate q in (0, 1].
    #[arg(long, value_name = "Q", allow_negative_numbers = true, required_unless_present_all = ["dataset_size", "batch_size"], conflicts_with_all = ["dataset_size", "batch_size"])]
    sample_rate: Option<f64>,
    /// Dataset size N (examples); with --batch-size sets q = B/N, and delta defaults to 1/N.
    #[arg(long, value_name = "N", requires = "batch_size")]
    dataset_size: Option<u64>,
    /// Expected batch size B.
    #[arg(long, value_name = "B", requires = "dataset_size")]
    batch_size: Option<u64>,
}

/// Run length in steps or epochs (steps = ceil(epochs / q)).
#[derive(Debug, Args)]
#[group(required = true, multiple = false)]
pub struct Length {
    /// Number of steps.
    #[arg(long, value_name = "T")]
    steps: Option<u64>,
    /// Number of epochs.
    #[arg(long, value_name = "EPOCHS", allow_negative_numbers = true)]
    epochs: Option<f64>,
}

#[derive(Debug, Args)]
pub struct Common {
    /// delta in (0, 1); defaults to 1/N when --dataset-size is given.
    #[arg(long, value_name = "D", allow_negative_numbers = true)]
    delta: Option<f64>,
    /// Accountant: pld (tight, default) or rdp.
    #[arg(long, default_value = "pld", value_parser = parse_kind)]
    accountant: AccountantKind,
    /// Print one JSON object with the inputs and the result.
    #[arg(long)]
    json: bool,
}

fn parse_kind(s: &str) -> Result<AccountantKind, String> {
    s.parse().map_err(|_| format!("'{s}' is not an accountant; use pld or rdp"))
}

/// Turns a privacy error into one that names the command-line flag.
fn flag_error(e: PrivacyError) -> anyhow::Error {
    match e {
        PrivacyError::Invalid { field, value, reason } => {
            anyhow::anyhow!("invalid --{} {value}: {reason}", field.replace('_', "-"))
        }
        other => other.into(),
    }
}

impl Rate {
    fn resolve(&self) -> Result<(f64, Option<u64>)> {
        let q = match (self.sample_rate, self.dataset_size, self.batch_size) {
            (Some(q), _, _) => (q, None),
            (None, Some(0), _) => bail!("invalid --dataset-size 0: must be at least 1"),
            (None, Some(n), Some(b)) if b == 0 || b > n => {
                bail!("invalid --batch-size {b}: must be in [1, --dataset-size {n}]")
            }
            (None, Some(n), Some(b)) => (b as f64 / n as f64, Some(n)),
            _ => bail!("give --sample-rate, or --dataset-size with --batch-size"),
        };
        privacy::check_sample_rate(q.0).map_err(flag_error)?;
        Ok(q)
    }
}

impl Length {
    fn steps(&self, q: f64) -> Result<u64> {
        match (self.steps, self.epochs) {
            (Some(0), _) => bail!("invalid --steps 0: must be at least 1"),
            (Some(t), _) => Ok(t),
            (None, Some(e)) if e > 0.0 && e.is_finite() => Ok((e / q).ceil() as u64),
            (None, Some(e)) => bail!("invalid --epochs {e}: must be a finite number > 0"),
            (None, None) => bail!("give --steps or --epochs"),
        }
    }
}

impl Common {
    fn delta(&self, dataset_size: Option<u64>) -> Result<f64> {
        let delta = match (self.delta, dataset_size) {
            (Some(d), _) => d,
            (None, Some(n)) => 1.0 / n as f64,
            (None, None) => bail!("--delta is required unless --dataset-size is given (then it defaults to 1/N)"),
        };
        privacy::check_delta(delta).map_err(flag_error)?;
        Ok(delta)
    }
}

fn emit(json: bool, inputs: Value, key: &str, result: Value) {
    if json {
        let mut object = inputs;
        object[key] = result;
        outln!("{object}");
    } else {
        outln!("{result}");
    }
}

/// Runs one `dpctl privacy` command.
pub fn run(command: PrivacyCommand) -> Result<()> {
    match command {
        PrivacyCommand::Epsilon { rate, noise_multiplier, length, common } => {
            let (q, n) = rate.resolve()?;
            let steps = length.steps(q)?;
            let delta = common.delta(n)?;
            let segment = Segment::new(q, noise_multiplier, steps).map_err(flag_error)?;
            let epsilon = privacy::epsilon(common.accountant, &[segment], delta).map_err(flag_error)?;
            let inputs = json!({"sample_rate": q, "noise_multiplier": noise_multiplier, "steps": steps, "delta": delta, "accountant": common.accountant.to_string()});
            emit(common.json, inputs, "epsilon", json!(epsilon));
        }
        PrivacyCommand::Noise { rate, length, epsilon, common } => {
            let (q, n) = rate.resolve()?;
            let steps = length.steps(q)?;
            let delta = common.delta(n)?;
            privacy::check_epsilon(epsilon).map_err(flag_error)?;
            let sigma = privacy::noise_multiplier(common.accountant, q, steps, epsilon, delta).map_err(flag_error)?;
            let inputs = json!({"sample_rate": q, "steps": steps, "epsilon": epsilon, "delta": delta, "accountant": common.accountant.to_string()});
            emit(common.json, inputs, "noise_multiplier", json!(sigma));
        }
        PrivacyCommand::Steps { rate, noise_multiplier, epsilon, common } => {
            let (q, n) = rate.resolve()?;
            let delta = common.delta(n)?;
            privacy::check_epsilon(epsilon).map_err(flag_error)?;
            let curve = EpsilonCurve::new(common.accountant, q, noise_multiplier, delta).map_err(flag_error)?;
            let steps = privacy::max_steps(&curve, epsilon).map_err(flag_error)?;
            if steps == 0 {
                let one = curve.epsilon_after(1);
                bail!(
                    "no step fits: one step already spends epsilon {one:.6} > --epsilon {epsilon} at delta {delta:e}; \
                     raise --epsilon or --noise-multiplier, or lower the sampling rate"
                );
            }
            let inputs = json!({"sample_rate": q, "noise_multiplier": noise_multiplier, "epsilon": epsilon, "delta": delta, "accountant": common.accountant.to_string()});
            emit(common.json, inputs, "steps", json!(steps));
        }
    }
    Ok(())
}
