//! A machine's library and tool links in its library directories, to the driver root.

use super::{Applied, At, Owner, Part, Running, Wiring};
use crate::apply::rewire;
use crate::model::links::{self, DirLinks, DirSeen};
use crate::model::{Action, Change, Check, Target};
use anyhow::Result;

pub struct Links;

impl Part for Links {
    type Hook = Running;
    /// Each library and tool directory, with the links wanted there; none without a driver's
    /// links to make.
    type Seen = Option<Vec<(DirSeen, DirLinks)>>;
    const NAME: &'static str = "library links";
    const KEY: &'static str = "links";
    const CHECK: Check = Check::Links;
    const OWNER: Owner = Owner::PostStart;

    /// The host's libraries are its driver installer's and ldconfig's.
    fn on(&self, target: Target) -> bool {
        target == Target::Machine
    }

    fn observe(&self, at: &At) -> Result<Self::Seen> {
        let d = at.desired;
        let Some(wanted) = &d.lib_links else {
            return Ok(None);
        };
        let mut out = Vec::new();
        links::each_lib_dir(at.target, wanted, |dir, want| {
            out.push((links::observe_dir(dir, want)?, want.clone()));
            Ok(())
        })?;
        Ok(Some(out))
    }

    fn diff(&self, _: &At, dirs: &Self::Seen, _: &[Change]) -> Result<Vec<Change>> {
        Ok(dirs
            .iter()
            .flatten()
            .flat_map(|(seen, want)| {
                let diff = links::diff_lib_dir(seen, want);
                link_changes(Check::Links, &diff).collect::<Vec<_>>()
            })
            .collect())
    }

    fn apply(&self, w: &Wiring, _: bool) -> Result<Applied> {
        let report = match &w.desired.lib_links {
            Some(lib) => rewire::lib_links(w.root, lib)?,
            None => rewire::Report::default(),
        };
        Ok(Applied {
            line: report.to_string(),
            library_links_changed: report.changed(),
        })
    }
}

/// A directory's link changes as [`Change`]s of `check`.
pub(super) fn link_changes(
    check: Check,
    diff: &links::DirDiff,
) -> impl Iterator<Item = Change> + '_ {
    diff.ops.iter().map(move |(name, op)| {
        let path = diff.child(name);
        match op {
            links::LinkOp::Create { target } => {
                Change::new(check, Action::Create, path, format!("-> {target}"))
            }
            links::LinkOp::Replace { from, to } => Change::new(
                check,
                Action::Replace,
                path,
                format!(
                    "-> {to}, was -> {}",
                    from.as_deref().unwrap_or("(not UTF-8)")
                ),
            ),
            links::LinkOp::Remove { target } => {
                Change::new(check, Action::Remove, path, format!("-> {target}"))
            }
        }
    })
}
