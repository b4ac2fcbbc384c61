//! The unit gate's markers: containerd and kubelet released. post-start releases them as it
//! starts the services (src/apply/gate.rs writes them); a gated unit whose marker is missing
//! waits until then.

use super::{At, Owner, Part, Running};
use crate::model::{Action, Change, Check, Target, gate};
use crate::types::paths::UnitName;
use anyhow::Result;

pub struct Gate;

/// One gated unit: whether the gate holds it this boot, and whether its marker is there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub unit: UnitName,
    pub gated: bool,
    pub released: bool,
}

impl Part for Gate {
    type Hook = Running;
    type Seen = Vec<Seen>;
    const NAME: &'static str = "unit gate";
    const KEY: &'static str = "gate";
    const CHECK: Check = Check::Gate;
    const OWNER: Owner = Owner::PostStartServices;

    fn observe(&self, at: &At) -> Result<Vec<Seen>> {
        let d = at.desired;
        let root = at.target;
        d.gate
            .iter()
            .map(|unit| {
                let gated = match d.target {
                    Target::Machine => gate::is_gated(root, unit)?,
                    // The host's own markers are at their path in the host's root.
                    Target::Host => gate::is_gated_on_host(root, unit)?,
                };
                Ok(Seen {
                    unit: unit.clone(),
                    gated,
                    released: gate::is_released(root, unit)?,
                })
            })
            .collect()
    }

    fn diff(&self, _: &At, units: &Vec<Seen>, _: &[Change]) -> Result<Vec<Change>> {
        Ok(units
            .iter()
            .filter(|u| u.gated && !u.released)
            .map(|u| {
                Change::new(
                    Check::Gate,
                    Action::Release,
                    u.unit.to_string(),
                    format!("its marker in {} is missing", gate::MARKER_DIR),
                )
            })
            .collect())
    }
}

/// Whether the gate holds any unit, and whether every unit's marker is there.
pub fn summary(units: &[Seen]) -> (bool, bool) {
    (
        units.iter().any(|u| u.gated),
        units.iter().all(|u| u.released),
    )
}

/// [`summary`] of the gate as `seen` read it; (false, true) for a target without one.
pub fn summary_of(seen: &super::Observation) -> Result<(bool, bool)> {
    match seen.get::<Gate>() {
        Some(Ok(units)) => Ok(summary(units)),
        Some(Err(e)) => Err(anyhow::anyhow!("{e:#}")),
        None => Ok((false, true)),
    }
}
