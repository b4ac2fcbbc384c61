//! The installed helper the units run, and the one a machine's CDI hooks run (bound at its
//! start): a new start's to change.

use super::{At, Owner, Part, Running};
use crate::model::layout::HOOK_BINARY;
use crate::model::{Action, Change, Check, Target};
use anyhow::Result;

pub struct Helper;

impl Part for Helper {
    type Hook = Running;
    /// The helper bound into a machine at its start (device and inode), when there; host mode
    /// binds none.
    type Seen = Option<(u64, u64)>;
    const NAME: &'static str = "helper";
    const KEY: &'static str = "helper";
    const CHECK: Check = Check::Helper;
    const OWNER: Owner = Owner::NewStart;

    fn observe(&self, at: &At) -> Result<Self::Seen> {
        let d = at.desired;
        if d.target == Target::Host {
            return Ok(None);
        }
        Ok(at
            .target
            .pin_no_symlinks(HOOK_BINARY)?
            .and_then(|fd| nix::sys::stat::fstat(&fd).ok())
            .map(|st| (st.st_dev, st.st_ino)))
    }

    /// The installed helper must be a working binary (the units run it: the next post-start,
    /// the next start). A machine's CDI hooks run the helper bound at its start: another than
    /// the installed one (upgraded since) is picked up only by a new start.
    fn diff(&self, at: &At, bound: &Self::Seen, _: &[Change]) -> Result<Vec<Change>> {
        let d = at.desired;
        let h = &d.helper;
        if let Some(problem) = &h.problem {
            return Ok(vec![Change::new(
                Check::Helper,
                Action::Fails,
                h.path.clone(),
                problem.clone(),
            )]);
        }
        Ok(match bound {
            Some(b) if Some(*b) != h.identity => vec![Change::new(
                Check::Helper,
                Action::Restart,
                HOOK_BINARY.into(),
                format!(
                    "the CDI hooks run the helper as it was at the machine's start, not the one \
                     installed now at {}",
                    h.path
                ),
            )],
            _ => Vec::new(),
        })
    }
}

/// The helper bound into the machine at its start as `seen` read it, when there.
pub fn bound(seen: &super::Observation) -> Result<Option<(u64, u64)>> {
    match seen.get::<Helper>() {
        Some(Ok(b)) => Ok(*b),
        Some(Err(e)) => Err(anyhow::anyhow!("{e:#}")),
        None => Ok(None),
    }
}
