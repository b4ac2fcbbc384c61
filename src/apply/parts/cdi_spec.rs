//! Our CDI spec in the target's CDI directory, and no other spec of our kind; without a driver,
//! ours removed.

use super::{Applied, At, Owner, Part, Running, Wiring};
use crate::apply::rewire;
use crate::model::{Change, Check, spec};
use anyhow::Result;

pub struct CdiSpec;

impl Part for CdiSpec {
    type Hook = Running;
    type Seen = spec::Seen;
    const NAME: &'static str = "CDI spec";
    const KEY: &'static str = "cdi";
    const CHECK: Check = Check::CdiSpec;
    const OWNER: Owner = Owner::PostStart;

    fn observe(&self, at: &At) -> Result<spec::Seen> {
        let d = at.desired;
        spec::observe(at.target, &d.spec)
    }

    fn diff(&self, at: &At, seen: &spec::Seen, _: &[Change]) -> Result<Vec<Change>> {
        let d = at.desired;
        spec::diff(&d.spec, seen)
    }

    fn apply(&self, w: &Wiring, _: bool) -> Result<Applied> {
        let d = w.desired;
        let report = match &d.spec.bytes {
            Some(_) => rewire::write_cdi(w.root, &d.spec, |n, b| d.spec.conflicts(n, b)),
            None => rewire::remove_spec(w.root, &d.spec.dir, &d.spec.file),
        }?;
        Ok(Applied::line(report.to_string()))
    }
}
