//! `dpctl model list`: the named model configurations and their trainable parameter counts.

use anyhow::Result;
use burn::tensor::backend::AutodiffBackend;
use clap::Subcommand;
use dpcap_ml::CpuBackend;
use dpcap_ml::model::{Captioner, CaptionerConfig, Mae, MaeConfig};
use dpcap_ml::params::ParamSet;
use serde_json::json;

type Inner = <CpuBackend as AutodiffBackend>::InnerBackend;

#[derive(Debug, Subcommand)]
pub enum ModelCommand {
    /// Every configuration with its shape and parameter counts (captioner and MAE).
    List {
        /// Print one JSON object per line.
        #[arg(long)]
        json: bool,
    },
}

/// Runs one `dpctl model` command.
pub fn run(command: ModelCommand) -> Result<()> {
    let ModelCommand::List { json } = command;
    if !json {
        outln!(
            "{:<7}{:>7}{:>7}{:>7}{:>10}{:>11}{:>16}{:>12}",
            "config",
            "image",
            "patch",
            "width",
            "enc/dec",
            "vocab/seq",
            "captioner",
            "mae"
        );
    }
    for name in dpcap_registry::NAMES {
        let (cap, mae) = (CaptionerConfig::named(name).expect("listed"), MaeConfig::named(name).expect("listed"));
        let count = |build: &dyn Fn(&mut ParamSet<Inner>)| {
            let mut ps = ParamSet::<Inner>::specs_only(&Default::default());
            build(&mut ps);
            ps.numel()
        };
        let captioner = count(&|ps| drop(Captioner::new(ps, cap)));
        let masked = count(&|ps| drop(Mae::new(ps, mae)));
        let e = cap.encoder;
        if json {
            outln!(
                "{}",
                json!({"config": name, "image": e.image, "patch": e.patch, "encoder_width": e.width, "encoder_depth": e.depth,
                "decoder_width": cap.dec_width, "decoder_depth": cap.dec_depth, "vocab": cap.vocab, "seq": cap.seq,
                "captioner_params": captioner, "mae_params": masked})
            );
        } else {
            let enc_dec = format!("{}/{}", e.depth, cap.dec_depth);
            let vocab_seq = format!("{}/{}", cap.vocab, cap.seq);
            outln!(
                "{name:<7}{:>7}{:>7}{:>7}{enc_dec:>10}{vocab_seq:>11}{captioner:>16}{masked:>12}",
                e.image,
                e.patch,
                e.width
            );
        }
    }
    Ok(())
}
