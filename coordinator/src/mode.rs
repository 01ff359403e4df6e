//! A job's privacy mode where people read it: DP says nothing more, a non-private baseline
//! (σ = 0) and a TAN simulation carry no guarantee, and [`label`] and [`notice`] are what every
//! surface shows for them. The mode itself is resolved in `plan`.

use dpcap_privacy::contract::{Mode, PrivacyContract};
use dpcap_proto::v1::Plan;

/// The label of a mode where people read it: "" for DP, else "NOT PRIVATE (...)".
pub fn label(mode: &Mode) -> &'static str {
    match mode {
        Mode::NotPrivate => "NOT PRIVATE (non-private baseline, sigma = 0)",
        Mode::Simulation { .. } => "NOT PRIVATE (TAN simulation)",
        Mode::Dp => "",
    }
}

/// The condition message of a plan without a guarantee (None for DP).
pub fn notice(plan: &Plan, contract: &PrivacyContract) -> Option<String> {
    match contract.mode {
        Mode::NotPrivate => Some(format!("{}: sigma = 0, no epsilon", label(&contract.mode))),
        Mode::Simulation { target } => Some(format!(
            "{}: target batch {:.0} at sigma {:.4} simulated at batch {:.1} with sigma' = {:.6}; \
             epsilon {:.4} is the target recipe's (RDP), not this job's",
            label(&contract.mode),
            target.sample_rate * dpcap_proto::plan::units(plan) as f64,
            target.noise_multiplier,
            dpcap_proto::plan::expected_batch_size(plan, contract),
            contract.mechanism.noise_multiplier,
            plan.epsilon_planned
        )),
        Mode::Dp => None,
    }
}
