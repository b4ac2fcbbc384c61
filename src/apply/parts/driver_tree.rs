//! The machine's driver tree on the host (`/var/lib/nspawn-lifecycle/trees/<machine>`), which
//! the `.nspawn` file binds as its driver root: built (or checked) from the plan, or removed
//! without a driver so that it holds no old driver's files.

use super::{Applied, NextStart, Owner, Part};
use crate::apply::boot::Boot;
use crate::apply::driver_tree::{self, TreeSeen, TreeState};
use crate::model::layout::{self, Tree};
use crate::model::{Action, Change, Check};
use anyhow::Result;

pub struct DriverTree;

/// The tree as found.
#[derive(Debug)]
pub enum Seen {
    /// Against its plan.
    Tree(TreeSeen),
    /// No driver: what is left of a tree (host paths).
    Remains(Vec<String>),
}

impl Part for DriverTree {
    type Hook = NextStart;
    type Seen = Seen;
    const NAME: &'static str = "driver tree";
    const KEY: &'static str = "driver-tree";
    const CHECK: Check = Check::DriverRoot;
    const OWNER: Owner = Owner::PreStart;

    fn observe(&self, b: &Boot) -> Result<Seen> {
        let host = &b.ctx.host;
        Ok(match &b.rendered.borrow().start().tree {
            Some(plan) => Seen::Tree(driver_tree::observe(host, b.machine, plan)?),
            None => Seen::Remains(driver_tree::remains(host, b.machine)?),
        })
    }

    fn diff(&self, b: &Boot, seen: &Seen, _: &[Change]) -> Result<Vec<Change>> {
        let seen = match seen {
            Seen::Tree(seen) => seen,
            Seen::Remains(left) => return Ok(removals(left, "no NVIDIA driver for this machine")),
        };
        let mut out = removals(&seen.leftovers, "left by a pre-start that was killed");
        let entries = b
            .rendered
            .borrow()
            .start()
            .tree
            .as_ref()
            .map_or(0, |p| p.tree.len());
        let (action, detail) = match seen.state {
            TreeState::Stamped => return Ok(out),
            TreeState::Unstamped => (
                Action::Write,
                "found exactly as planned, without a stamp saying so: stamped".to_owned(),
            ),
            TreeState::Differs => (
                Action::Replace,
                format!("differs from the host's driver: built afresh ({entries} entries)"),
            ),
            TreeState::Missing => (Action::Create, format!("built ({entries} entries)")),
        };
        out.push(Change::new(
            Self::CHECK,
            action,
            layout::tree_host_path(b.machine),
            detail,
        ));
        Ok(out)
    }

    /// Build (or check) the tree the file binds; without a driver, remove the machine's tree so
    /// it holds no old driver's files. The plan links every file the tree's filesystem can hold
    /// ([`crate::model::tree::plan`]); when the kernel still refuses a link the plan could not
    /// foresee, the file is bound instead and its bind added to the `.nspawn` file: the one way
    /// the file written differs from what `plan` showed, said in a warning.
    fn apply(&self, b: &Boot, _: bool) -> Result<Applied> {
        let machine = b.machine;
        let dir = layout::tree_host_path(machine);
        let mut r = b.rendered.borrow_mut();
        let start = r.start_mut();
        let Some(plan) = &mut start.tree else {
            return Ok(Applied::line(
                if driver_tree::remove(&b.ctx.host, machine)? {
                    format!("driver tree {dir} removed: no NVIDIA driver for this machine")
                } else {
                    NO_TREE.to_owned()
                },
            ));
        };
        let built = driver_tree::ensure(&b.ctx.host, machine, plan)?;
        if !built.unlinked.is_empty() {
            let named: Vec<String> = built
                .unlinked
                .iter()
                .map(|(p, e)| format!("{p} ({e})"))
                .collect();
            tracing::warn!(
                %machine, %dir,
                "{} driver files could not be hard-linked into the tree and are bound instead \
                 (the .nspawn file written binds them, which `plan` could not foresee): {}",
                named.len(),
                named.join(", ")
            );
            let tree: Tree = built
                .unlinked
                .iter()
                .filter_map(|(p, _)| plan.tree.get_key_value(p))
                .map(|(p, n)| (p.clone(), n.clone()))
                .collect();
            start.file.bind_driver_files(layout::file_binds(&tree)?);
        }
        Ok(Applied::line(tree_line(
            &dir,
            if built.changed { "built" } else { "as planned" },
            plan,
        )?))
    }

    fn unchanged(&self, b: &Boot) -> Result<String> {
        match &b.rendered.borrow().start().tree {
            Some(plan) => tree_line(&layout::tree_host_path(b.machine), "as planned", plan),
            None => Ok(NO_TREE.to_owned()),
        }
    }
}

/// A removal of each of `paths`, for `why`.
fn removals(paths: &[String], why: &str) -> Vec<Change> {
    paths
        .iter()
        .map(|p| Change::new(DriverTree::CHECK, Action::Remove, p.clone(), why))
        .collect()
}

/// The part's line: `how` (built, as planned) and what the tree holds.
fn tree_line(dir: &str, how: &str, plan: &crate::model::tree::Plan) -> Result<String> {
    let bound = layout::file_binds(&plan.tree)?.len();
    Ok(format!(
        "driver tree {dir} {how}: {} entries, {bound} bound",
        plan.tree.len()
    ))
}

const NO_TREE: &str = "driver tree: none, no NVIDIA driver for this machine";
