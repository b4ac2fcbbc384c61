//! The host's unit gate drop-in, which the `.nspawn` file binds into the machine (when it binds
//! the gate).

use super::{Applied, NextStart, Owner, Part, When};
use crate::apply::boot::Boot;
use crate::apply::gate;
use crate::model::gate as gates;
use crate::model::{Action, Change, Check};
use anyhow::Result;

pub struct GateFile;

impl Part for GateFile {
    type Hook = NextStart;
    /// Whether the drop-in holds exactly what it must.
    type Seen = bool;
    const NAME: &'static str = "unit gate file";
    const KEY: &'static str = "gate-file";
    const CHECK: Check = Check::Gate;
    const OWNER: Owner = Owner::PreStart;
    const WHEN: When = When::FileBindsGate;

    fn observe(&self, b: &Boot) -> Result<bool> {
        gate::host_file_current(&b.ctx.host)
    }

    fn diff(&self, _: &Boot, current: &bool, _: &[Change]) -> Result<Vec<Change>> {
        Ok(if *current {
            Vec::new()
        } else {
            vec![Change::new(
                Self::CHECK,
                Action::Write,
                gates::HOST_FILE.to_owned(),
                "the unit gate's drop-in",
            )]
        })
    }

    fn apply(&self, b: &Boot, _: bool) -> Result<Applied> {
        Ok(Applied::line(if gate::write_host_file(&b.ctx.host)? {
            format!("unit gate written: {}", gates::HOST_FILE)
        } else {
            self.unchanged(b)?
        }))
    }

    fn unchanged(&self, _: &Boot) -> Result<String> {
        Ok(format!("unit gate: {} as it must be", gates::HOST_FILE))
    }
}
