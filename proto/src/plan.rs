//! What a plan's readers derive from it. The plan keeps no copy of the contract's terms (q, σ,
//! C, δ, the ε target, the mode, the unit, the dataset, the planned steps), so every reader
//! takes them from `Plan.contract` here: one conversion, checked, for the coordinator's
//! sampler, the workers' clipping, `dpctl` and the tests alike.

use dpcap_privacy::contract::{ContractError, PrivacyContract};

use crate::contract::contract_from_proto;
use crate::v1::Plan;

/// The plan's contract, typed and checked.
pub fn contract(plan: &Plan) -> Result<PrivacyContract, ContractError> {
    let wire =
        plan.contract.clone().ok_or_else(|| ContractError { field: "contract", reason: "is required".into() })?;
    contract_from_proto(wire)
}

/// The accounting N: the clients of a user-level job, else the examples.
pub fn units(plan: &Plan) -> u64 {
    if plan.clients > 0 { plan.clients } else { plan.examples }
}

/// L = q·N, the expected batch size every update divides by (never the realised one).
pub fn expected_batch_size(plan: &Plan, contract: &PrivacyContract) -> f64 {
    contract.mechanism.sample_rate * units(plan) as f64
}

/// The condition message of a plan without a guarantee (None for DP): its mode's label, and
/// for a simulation the recipe it stands for, whose ε it reports.
pub fn notice(plan: &Plan, contract: &PrivacyContract) -> Option<String> {
    let mode = contract.mode;
    if mode.is_private() {
        return None;
    }
    Some(match mode.simulated() {
        Some(target) => format!(
            "{}: target batch {:.0} at sigma {:.4} simulated at batch {:.1} with sigma' = {:.6}; \
             epsilon {:.4} is the target recipe's (RDP), not this job's",
            mode.label(),
            target.sample_rate * units(plan) as f64,
            target.noise_multiplier,
            expected_batch_size(plan, contract),
            contract.mechanism.noise_multiplier,
            plan.epsilon_planned
        ),
        None => format!("{}: sigma = 0, no epsilon", mode.label()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v1;

    #[test]
    fn a_user_level_plan_counts_clients_and_l_is_q_times_n() {
        let wire = v1::PrivacyContract {
            mechanism: Some(v1::Mechanism { sample_rate: 0.25, noise_multiplier: 1.0, clipping_norm: 1.0 }),
            delta: 1e-5,
            epsilon_target: 8.0,
            planned_steps: 3,
            ..Default::default()
        };
        let mut plan = Plan { examples: 1000, contract: Some(wire), ..Default::default() };
        let c = contract(&plan).unwrap();
        assert_eq!(expected_batch_size(&plan, &c), 250.0);
        plan.clients = 40;
        assert_eq!((units(&plan), expected_batch_size(&plan, &c)), (40, 10.0));
        plan.contract = None;
        assert_eq!(contract(&plan).unwrap_err().field, "contract");
    }
}
