//! A machine's driver root: nspawn's binds of the host's driver, checked against it (only a new
//! start mends them: a mismatch fails post-start and makes the next pre-start rebuild the tree,
//! [`crate::apply::driver_tree::distrust`]); without a driver, what is left of one removed.
//! Host mode's driver root is the host's own install: not a part of the host.

use super::{Applied, At, Owner, Part, Running, Wiring};
use crate::apply::rewire;
use crate::fs::machine_root::{FileKind, Lookup, Subdir};
use crate::model::layout::DRIVER_ROOT;
use crate::model::{Action, Change, Check, STAGING, Target, driver_root};
use anyhow::Result;

pub struct DriverRoot;

/// The driver root as found: against the expected tree (a wired machine), or what is left of
/// one without a driver (each name, and whether it is a read-only directory: this boot's binds).
#[derive(Debug)]
pub enum Seen {
    Expected(driver_root::Seen),
    Leftovers(Vec<(String, bool)>),
}

impl Part for DriverRoot {
    type Hook = Running;
    type Seen = Seen;
    const NAME: &'static str = "driver root";
    const KEY: &'static str = "driver-root";
    const CHECK: Check = Check::DriverRoot;
    const OWNER: Owner = Owner::PostStart;

    fn on(&self, target: Target) -> bool {
        target == Target::Machine
    }

    fn observe(&self, at: &At) -> Result<Seen> {
        let d = at.desired;
        let root = at.target;
        if let Some(want) = &d.driver_root {
            return Ok(Seen::Expected(driver_root::observe(root, want)?));
        }
        let (parent, name) = DRIVER_ROOT.rsplit_once('/').unwrap_or(("/", DRIVER_ROOT));
        let mut left = Vec::new();
        if let Lookup::Dir(dir) = root.lookup_dir(parent)? {
            for n in [STAGING, name] {
                let Some(kind) = dir.kind(n)? else { continue };
                let bound = kind == FileKind::Dir
                    && matches!(dir.open_subdir(n)?, Subdir::Dir(sub) if sub.read_only()?);
                left.push((dir.child(n), bound));
            }
        }
        Ok(Seen::Leftovers(left))
    }

    /// Wired, it must be the host's driver as [`driver_root::Expected`] says (only a new start
    /// mends it); without a driver, it and a staging leftover go (a bind made at this boot only
    /// with the next start).
    fn diff(&self, at: &At, seen: &Seen, _: &[Change]) -> Result<Vec<Change>> {
        let d = at.desired;
        Ok(match (seen, &d.driver_root) {
            (Seen::Expected(s), Some(want)) => driver_root::diff(want, s)
                .message(want)
                .map(|why| Change::new(Check::DriverRoot, Action::Restart, DRIVER_ROOT.into(), why))
                .into_iter()
                .collect(),
            (Seen::Leftovers(left), _) => left
                .iter()
                .map(|(path, bound)| {
                    if *bound {
                        Change::new(
                            Check::StaleNvidiaState,
                            Action::Restart,
                            path.clone(),
                            "this boot's driver binds, gone at the next start",
                        )
                    } else {
                        Change::new(
                            Check::StaleNvidiaState,
                            Action::Remove,
                            path.clone(),
                            "no NVIDIA driver for this machine",
                        )
                    }
                })
                .collect(),
            (Seen::Expected(_), None) => Vec::new(),
        })
    }

    /// The binds checked file by file against the host's driver; without a driver, what is
    /// left of one removed.
    fn apply(&self, w: &Wiring, _: bool) -> Result<Applied> {
        let d = w.desired;
        let Some(want) = &d.driver_root else {
            return Ok(Applied::line(
                rewire::remove_driver_root(w.root)?.to_string(),
            ));
        };
        let seen = driver_root::observe(w.root, want)?;
        if let Some(why) = driver_root::diff(want, &seen).message(want) {
            let Some(machine) = w.who.machine() else {
                anyhow::bail!("{why} (the host has no driver root of ours: a bug)");
            };
            return Err(crate::apply::driver_tree::distrust(
                w.host,
                machine,
                anyhow::anyhow!(why),
            ));
        }
        Ok(Applied::line(format!(
            "driver root: {} binds of driver {} checked against the host",
            want.len(),
            d.driver.as_ref().map_or("?", |v| v.version.as_str())
        )))
    }
}
