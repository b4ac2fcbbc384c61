//! Our CDI spec in the target's CDI directory, and no other spec of our kind; without a driver,
//! ours removed.

use super::{Applied, Owner, Part, Roots, Wiring};
use crate::apply::rewire;
use crate::model::{Change, Check, Desired, spec};
use anyhow::Result;

pub struct CdiSpec;

impl Part for CdiSpec {
    type Seen = spec::Seen;
    const NAME: &'static str = "CDI spec";
    const KEY: &'static str = "cdi";
    const CHECK: Check = Check::CdiSpec;
    const OWNER: Owner = Owner::PostStart;

    fn observe(&self, at: &Roots, d: &Desired) -> Result<spec::Seen> {
        spec::observe(at.target, &d.spec)
    }

    fn diff(&self, d: &Desired, seen: &spec::Seen, _: &[Change]) -> Result<Vec<Change>> {
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
