//! The machine's `.nspawn` file, last of pre-start's parts: it binds what the parts before made
//! (nspawn refuses to start when a bind's source is missing).

use super::{Applied, NextStart, Owner, Part};
use crate::apply::boot::Boot;
use crate::failpoint::Point;
use crate::model::nspawn::describe_change;
use crate::model::{Action, Change, Check};
use crate::types::units::nspawn_path;
use anyhow::Result;

pub struct NspawnFile;

impl Part for NspawnFile {
    type Hook = NextStart;
    /// Whether the file on disk is exactly the one rendered.
    type Seen = bool;
    const NAME: &'static str = ".nspawn file";
    const KEY: &'static str = "nspawn";
    const CHECK: Check = Check::NextStart;
    const OWNER: Owner = Owner::PreStart;

    fn observe(&self, b: &Boot) -> Result<bool> {
        b.ctx.host.holds(
            nspawn_path(b.machine),
            b.rendered.borrow().text().as_bytes(),
            0o644,
        )
    }

    fn diff(&self, b: &Boot, holds: &bool, _: &[Change]) -> Result<Vec<Change>> {
        if *holds {
            return Ok(Vec::new());
        }
        let r = b.rendered.borrow();
        Ok(vec![Change::new(
            Self::CHECK,
            Action::Write,
            nspawn_path(b.machine),
            describe_change(r.old.as_deref(), &r.text()),
        )])
    }

    fn apply(&self, b: &Boot, _: bool) -> Result<Applied> {
        let r = b.rendered.borrow();
        let new = r.text();
        let shown = r.host_path.display();
        Ok(Applied::line(
            if b.ctx.host.write_if_changed(
                nspawn_path(b.machine),
                new.as_bytes(),
                0o644,
                Point::PreStartMidNspawnWrite,
            )? {
                format!("{shown}: {}", describe_change(r.old.as_deref(), &new))
            } else {
                format!("{shown}: unchanged")
            },
        ))
    }

    fn unchanged(&self, b: &Boot) -> Result<String> {
        Ok(format!(
            "{}: unchanged",
            b.rendered.borrow().host_path.display()
        ))
    }
}
