//! The unit gate's markers for the boot ahead ([`gate::prepare_boot`]): the driver root the file
//! binds is built and checked, so containerd may start with the boot (unless the config keeps it
//! for post-start); kubelet waits for post-start. Only in the unit's own start
//! ([`Boot::in_its_start`]): otherwise the part reads nothing and is left as it is.

use super::{Applied, NextStart, Owner, Part, When};
use crate::apply::boot::Boot;
use crate::apply::gate;
use crate::model::gate as gates;
use crate::model::{Change, Check};
use crate::types::paths::UnitName;
use crate::types::units::unit_name;
use anyhow::Result;

pub struct BootGate;

impl Part for BootGate {
    type Hook = NextStart;
    /// The boot's markers; none read outside the unit's own start.
    type Seen = Option<gate::BootMarkers>;
    const NAME: &'static str = "unit gate for the boot";
    const KEY: &'static str = "gate";
    const CHECK: Check = Check::Gate;
    const OWNER: Owner = Owner::PreStart;
    const WHEN: When = When::FileBindsGate;

    fn observe(&self, b: &Boot) -> Result<Self::Seen> {
        if !b.in_its_start {
            return Ok(None);
        }
        Ok(Some(gate::observe_boot(
            &b.ctx.host,
            b.machine,
            containerd_at_boot(b),
        )?))
    }

    fn diff(&self, b: &Boot, seen: &Self::Seen, _: &[Change]) -> Result<Vec<Change>> {
        Ok(match seen {
            None => Vec::new(),
            Some(m) => m.changes(containerd_at_boot(b)),
        })
    }

    fn apply(&self, b: &Boot, _: bool) -> Result<Applied> {
        if !b.in_its_start {
            return Ok(Applied::line(self.unchanged(b)?));
        }
        gate::prepare_boot(&b.ctx.host, b.machine, containerd_at_boot(b))?;
        Ok(Applied::line(made_line(b)))
    }

    fn unchanged(&self, b: &Boot) -> Result<String> {
        Ok(if b.in_its_start {
            made_line(b)
        } else {
            format!(
                "unit gate: markers left alone (pre-start run outside {}'s start; a running \
                 boot keeps its own)",
                unit_name(b.machine)
            )
        })
    }
}

/// What the boot's markers say once made: containerd released for the boot ahead, or both
/// services waiting for post-start.
fn made_line(b: &Boot) -> String {
    let dir = gates::machine_marker_dir(b.machine);
    match containerd_at_boot(b) {
        Some(unit) => format!(
            "unit gate: released {unit} for the boot ahead ({dir}/{unit}): the driver tree it \
             binds is checked complete"
        ),
        None => format!("unit gate: {dir} emptied; containerd and kubelet wait for post-start"),
    }
}

/// The unit the boot ahead releases at once: containerd, unless the config keeps it for
/// post-start.
fn containerd_at_boot<'a>(b: &Boot<'a>) -> Option<&'a UnitName> {
    b.mc.containerd_at_boot.then_some(&b.mc.containerd_unit)
}
