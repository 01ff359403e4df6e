//! The privacy contract between its typed form ([`PrivacyContract`], defined once in
//! `dpcap-privacy`) and its wire form: the only place the two are converted, each field checked
//! and named on the way in.

use dpcap_privacy::AccountantKind;
use dpcap_privacy::contract::{
    Audit, ContractError, Mechanism, Mode, ModeKind, Placement, PrivacyContract, PrivacyUnit, Recipe,
};
use dpcap_registry::{Family, FedEmb, ServerOptimizer};

use crate::v1;

fn invalid(field: &'static str, reason: impl Into<String>) -> ContractError {
    ContractError { field, reason: reason.into() }
}

/// The wire form of an accountant kind.
pub fn kind_to_proto(kind: AccountantKind) -> v1::AccountantKind {
    match kind {
        AccountantKind::Pld => v1::AccountantKind::Pld,
        AccountantKind::Rdp => v1::AccountantKind::Rdp,
    }
}

/// An accountant kind from the wire (unspecified is PLD, the default).
pub fn kind_from_proto(value: i32) -> Result<AccountantKind, ContractError> {
    match v1::AccountantKind::try_from(value) {
        Ok(v1::AccountantKind::Unspecified | v1::AccountantKind::Pld) => Ok(AccountantKind::Pld),
        Ok(v1::AccountantKind::Rdp) => Ok(AccountantKind::Rdp),
        Err(_) => Err(invalid("accountant", format!("unknown accountant kind {value}"))),
    }
}

/// The objective from the wire (unspecified is caption, the default); an unknown one is
/// refused, never defaulted.
pub fn family_from_proto(value: i32) -> Result<Family, ContractError> {
    match v1::Objective::try_from(value) {
        Ok(v1::Objective::Unspecified | v1::Objective::Caption) => Ok(Family::Captioner),
        Ok(v1::Objective::Mae) => Ok(Family::Mae),
        Ok(v1::Objective::Fedemb) => Ok(Family::Embedder),
        Err(_) => Err(invalid("objective", format!("unknown objective {value}"))),
    }
}

/// The wire form of a mode's kind.
pub fn mode_to_proto(kind: ModeKind) -> v1::Privacy {
    match kind {
        ModeKind::Dp => v1::Privacy::Dp,
        ModeKind::NotPrivate => v1::Privacy::NotPrivate,
        ModeKind::Simulation => v1::Privacy::Simulation,
    }
}

/// A mode's kind from the wire; None for unspecified (which a contract reads as DP and a spec
/// as "not asked": see `JobSpec.privacy`). An unknown value is refused.
pub fn mode_from_proto(value: i32) -> Result<Option<ModeKind>, ContractError> {
    match v1::Privacy::try_from(value) {
        Ok(v1::Privacy::Unspecified) => Ok(None),
        Ok(v1::Privacy::Dp) => Ok(Some(ModeKind::Dp)),
        Ok(v1::Privacy::NotPrivate) => Ok(Some(ModeKind::NotPrivate)),
        Ok(v1::Privacy::Simulation) => Ok(Some(ModeKind::Simulation)),
        Err(_) => Err(invalid("privacy", format!("unknown privacy mode {value}"))),
    }
}

/// DP-FedEmb's settings from the wire, each unset field its default ([`FedEmb::DEFAULT`]); a
/// server optimizer other than "sgd" or "adam" ("" is sgd) is refused, never defaulted.
pub fn fedemb_from_proto(wire: Option<&v1::FedEmb>) -> Result<FedEmb, ContractError> {
    let d = FedEmb::DEFAULT;
    let Some(f) = wire else { return Ok(d) };
    let momentum = match d.server {
        ServerOptimizer::Sgd { momentum } => f.server_momentum.unwrap_or(momentum),
        ServerOptimizer::Adam => f.server_momentum.unwrap_or(0.0),
    };
    let server = match f.server_optimizer.as_str() {
        "" | "sgd" => ServerOptimizer::Sgd { momentum },
        "adam" => ServerOptimizer::Adam,
        other => return Err(invalid("fedemb.server_optimizer", format!("{other:?} is not sgd or adam"))),
    };
    let or = |value: u32, default: u32| if value == 0 { default } else { value };
    Ok(FedEmb {
        local_steps: f.local_steps,
        local_epochs: or(f.local_epochs, d.local_epochs),
        local_learning_rate: f.local_learning_rate.unwrap_or(d.local_learning_rate),
        local_batch: or(f.local_batch, d.local_batch),
        users_per_client: or(f.users_per_client, d.users_per_client),
        head_scale: f.head_scale.unwrap_or(d.head_scale),
        server,
    })
}

/// What a job spec chooses that is typed past the wire: its objective, its accountant kind,
/// the privacy mode it names, and (for a user-level objective) its DP-FedEmb settings with
/// every default filled in. The
/// spec's one decoding, made before any stage of planning reads the spec, so that no stage
/// comes back to the wire; an unknown value is refused naming its field.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SpecChoices {
    /// The objective.
    pub family: Family,
    /// The accountant kind.
    pub kind: AccountantKind,
    /// The mode `privacy` names; None when unspecified (the spec's other fields then say it).
    pub mode: Option<ModeKind>,
    /// DP-FedEmb's settings; None for an example-level objective.
    pub fedemb: Option<FedEmb>,
}

impl SpecChoices {
    /// Decodes `spec`'s choices ([`family_from_proto`], [`kind_from_proto`],
    /// [`mode_from_proto`], [`fedemb_from_proto`]).
    pub fn decode(spec: &v1::JobSpec) -> Result<Self, ContractError> {
        let family = family_from_proto(spec.objective)?;
        let kind = kind_from_proto(spec.accountant)?;
        let mode = mode_from_proto(spec.privacy)?;
        let fedemb = family.is_user_level().then(|| fedemb_from_proto(spec.fedemb.as_ref())).transpose()?;
        Ok(Self { family, kind, mode, fedemb })
    }
}

/// The wire form of an objective.
pub fn family_to_proto(family: Family) -> v1::Objective {
    match family {
        Family::Captioner => v1::Objective::Caption,
        Family::Mae => v1::Objective::Mae,
        Family::Embedder => v1::Objective::Fedemb,
    }
}

/// A privacy unit from the wire (unspecified is the example), without a user table's digest.
pub fn unit_is_user(value: i32) -> Result<bool, ContractError> {
    match v1::PrivacyUnit::try_from(value) {
        Ok(v1::PrivacyUnit::Unspecified | v1::PrivacyUnit::Example) => Ok(false),
        Ok(v1::PrivacyUnit::User) => Ok(true),
        Err(_) => Err(invalid("unit", format!("unknown privacy unit {value}"))),
    }
}

/// The wire form of a contract.
pub fn contract_to_proto(c: &PrivacyContract) -> v1::PrivacyContract {
    let mechanism =
        |q, sigma| v1::Mechanism { sample_rate: q, noise_multiplier: sigma, clipping_norm: c.mechanism.clipping_norm };
    let privacy = mode_to_proto(c.mode.kind());
    let simulated = c.mode.simulated().map(|target| mechanism(target.sample_rate, target.noise_multiplier));
    let (unit, users_digest) = match &c.unit {
        PrivacyUnit::Example => (v1::PrivacyUnit::Example, String::new()),
        PrivacyUnit::User { users_digest } => (v1::PrivacyUnit::User, users_digest.clone()),
    };
    v1::PrivacyContract {
        mechanism: Some(mechanism(c.mechanism.sample_rate, c.mechanism.noise_multiplier)),
        accountant: kind_to_proto(c.accountant) as i32,
        delta: c.delta,
        epsilon_target: c.epsilon_target.unwrap_or(0.0),
        privacy: privacy as i32,
        simulated,
        unit: unit as i32,
        users_digest,
        dataset_id: c.dataset_id.clone(),
        data_id: c.data_id.clone(),
        shards_id: c.shards_id.clone(),
        audit_canaries: c.audit.map_or(0, |a| a.canaries),
        audit_coordinates: match c.audit.map(|a| a.placement) {
            None => v1::AuditCoordinates::Unspecified,
            Some(Placement::Reserved) => v1::AuditCoordinates::Reserved,
            Some(Placement::Model) => v1::AuditCoordinates::Model,
        } as i32,
        init_from_job: c.init_from_job.clone().unwrap_or_default(),
        planned_steps: c.planned_steps,
    }
}

/// A contract from the wire, checked ([`PrivacyContract::check`]).
pub fn contract_from_proto(p: v1::PrivacyContract) -> Result<PrivacyContract, ContractError> {
    let m = p.mechanism.ok_or_else(|| invalid("mechanism", "is required"))?;
    let kind = mode_from_proto(p.privacy)?.unwrap_or(ModeKind::Dp);
    let target = p.simulated.map(|t| Recipe { sample_rate: t.sample_rate, noise_multiplier: t.noise_multiplier });
    let mode = Mode::from_kind(kind, target)?;
    if mode.simulated().is_none() && target.is_some() {
        return Err(invalid("simulated", "only a SIMULATION names a target mechanism"));
    }
    let unit = if unit_is_user(p.unit)? {
        PrivacyUnit::User { users_digest: p.users_digest }
    } else if p.users_digest.is_empty() {
        PrivacyUnit::Example
    } else {
        return Err(invalid("users_digest", "only a USER unit names a user table"));
    };
    let placement = match v1::AuditCoordinates::try_from(p.audit_coordinates) {
        Ok(v1::AuditCoordinates::Unspecified | v1::AuditCoordinates::Reserved) => Placement::Reserved,
        Ok(v1::AuditCoordinates::Model) => Placement::Model,
        Err(_) => return Err(invalid("audit_coordinates", format!("unknown value {}", p.audit_coordinates))),
    };
    let audit = (p.audit_canaries > 0).then_some(Audit { canaries: p.audit_canaries, placement });
    if audit.is_none() && p.audit_coordinates != 0 {
        return Err(invalid("audit_coordinates", "must be unset without audit_canaries"));
    }
    let contract = PrivacyContract {
        mechanism: Mechanism {
            sample_rate: m.sample_rate,
            noise_multiplier: m.noise_multiplier,
            clipping_norm: m.clipping_norm,
        },
        accountant: kind_from_proto(p.accountant)?,
        delta: p.delta,
        epsilon_target: (mode != Mode::NotPrivate || p.epsilon_target != 0.0).then_some(p.epsilon_target),
        mode,
        unit,
        dataset_id: p.dataset_id,
        data_id: p.data_id,
        shards_id: p.shards_id,
        audit,
        init_from_job: (!p.init_from_job.is_empty()).then_some(p.init_from_job),
        planned_steps: p.planned_steps,
    };
    contract.check()?;
    Ok(contract)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_mode_and_unit_round_trips_through_the_wire_unchanged() {
        let base = PrivacyContract {
            mechanism: Mechanism { sample_rate: 0.005606, noise_multiplier: 0.728, clipping_norm: 1.0 },
            accountant: AccountantKind::Rdp,
            delta: 1.0 / 233_804_767.0,
            epsilon_target: Some(8.0),
            mode: Mode::Dp,
            unit: PrivacyUnit::Example,
            dataset_id: format!("sha256:{}", "0f".repeat(32)),
            data_id: format!("sha256:{}", "1e".repeat(32)),
            shards_id: String::new(),
            audit: Some(Audit { canaries: 100_000, placement: Placement::Model }),
            init_from_job: Some("job-a".into()),
            planned_steps: 5708,
        };
        let simulation = PrivacyContract {
            mode: Mode::Simulation { target: Recipe { sample_rate: 0.2, noise_multiplier: 0.7 } },
            audit: None,
            unit: PrivacyUnit::User { users_digest: format!("sha256:{}", "1e".repeat(32)) },
            ..base.clone()
        };
        let baseline = PrivacyContract {
            mode: Mode::NotPrivate,
            epsilon_target: None,
            mechanism: Mechanism { noise_multiplier: 0.0, ..base.mechanism },
            audit: None,
            init_from_job: None,
            ..base.clone()
        };
        for c in [base, simulation, baseline] {
            assert_eq!(contract_from_proto(contract_to_proto(&c)), Ok(c));
        }
    }

    #[test]
    fn every_objective_round_trips_through_the_wire_and_an_unknown_one_is_refused() {
        for family in Family::ALL {
            assert_eq!(family_from_proto(family_to_proto(family) as i32), Ok(family));
            assert_eq!(family.name().parse::<Family>(), Ok(family));
        }
        assert_eq!(family_from_proto(0), Ok(Family::Captioner), "unspecified is the default");
        assert_eq!(family_from_proto(99).unwrap_err().field, "objective");
    }

    #[test]
    fn fedemb_settings_take_their_defaults_once_and_refuse_an_unknown_optimizer() {
        assert_eq!(fedemb_from_proto(None), Ok(FedEmb::DEFAULT));
        let unset = v1::FedEmb::default();
        assert_eq!(fedemb_from_proto(Some(&unset)), Ok(FedEmb::DEFAULT), "0 and unset are the defaults");
        let adam = v1::FedEmb { server_optimizer: "adam".into(), local_batch: 4, ..Default::default() };
        let adam = fedemb_from_proto(Some(&adam)).unwrap();
        assert_eq!((adam.server, adam.local_batch, adam.server_learning_rate()), (ServerOptimizer::Adam, 4, 1e-3));
        let sgd = v1::FedEmb { server_momentum: Some(0.5), ..Default::default() };
        assert_eq!(fedemb_from_proto(Some(&sgd)).unwrap().server, ServerOptimizer::Sgd { momentum: 0.5 });
        let typo = v1::FedEmb { server_optimizer: "adamw".into(), ..Default::default() };
        assert_eq!(fedemb_from_proto(Some(&typo)).unwrap_err().field, "fedemb.server_optimizer");
    }

    #[test]
    fn a_contract_from_the_wire_is_checked_and_the_field_named() {
        let mut p = v1::PrivacyContract {
            mechanism: Some(v1::Mechanism { sample_rate: 0.01, noise_multiplier: 0.01, clipping_norm: 1.0 }),
            delta: 1e-5,
            epsilon_target: 1e9,
            planned_steps: 10,
            ..Default::default()
        };
        assert!(contract_from_proto(p.clone()).is_ok(), "a weak contract is still a contract");
        p.epsilon_target = 0.0;
        assert_eq!(contract_from_proto(p.clone()).unwrap_err().field, "epsilon_target");
        p.epsilon_target = 8.0;
        p.mechanism = None;
        assert_eq!(contract_from_proto(p).unwrap_err().field, "mechanism");
    }
}
