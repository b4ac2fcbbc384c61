//! `/dev/char/<major>:<minor>` links to the NVIDIA nodes: with a driver the directory is made
//! and holds a link for each node; without one, ours are removed where it is. (`refresh-devices`
//! makes this part alone.)

use super::links::link_changes;
use super::{Applied, At, Owner, Part, Running, Wiring};
use crate::apply::rewire;
use crate::fs::host::HostRoot;
use crate::fs::machine_root::{Lookup, MachineRoot};
use crate::model::links::{self, DirSeen};
use crate::model::{Change, Check, Desired, Target};
use anyhow::Result;
use std::collections::BTreeMap;

pub struct DevChar;

/// `/dev/char` as found.
#[derive(Debug)]
pub enum Seen {
    Dir(DirSeen),
    Missing,
    NotDir,
}

impl Part for DevChar {
    type Hook = Running;
    type Seen = Seen;
    const NAME: &'static str = "/dev/char links";
    const KEY: &'static str = "dev-char";
    const CHECK: Check = Check::DevChar;
    const OWNER: Owner = Owner::PostStart;

    fn observe(&self, at: &At) -> Result<Seen> {
        let d = at.desired;
        Ok(match at.target.lookup_dir(links::DEV_CHAR)? {
            Lookup::Dir(dir) => Seen::Dir(links::observe_dir(&dir, &d.dev_char)?),
            Lookup::Missing => Seen::Missing,
            Lookup::NotDir => Seen::NotDir,
        })
    }

    /// Wired, made if missing; without a driver, only ours removed where it is.
    fn diff(&self, at: &At, seen: &Seen, _: &[Change]) -> Result<Vec<Change>> {
        let d = at.desired;
        let empty;
        let seen = match seen {
            Seen::Dir(s) => s,
            Seen::Missing => {
                empty = DirSeen {
                    path: links::DEV_CHAR.into(),
                    links: BTreeMap::new(),
                    others: BTreeMap::new(),
                };
                &empty
            }
            Seen::NotDir if d.driver.is_none() => return Ok(Vec::new()),
            Seen::NotDir => anyhow::bail!(
                "{} is not a directory (or one of its parents is not)",
                links::DEV_CHAR
            ),
        };
        let diff = links::diff_dev_char(seen, &d.dev_char);
        Ok(link_changes(Check::DevChar, &diff).collect())
    }

    fn apply(&self, w: &Wiring, _: bool) -> Result<Applied> {
        Ok(Applied::line(write(w.root, w.desired, w.host)?))
    }
}

/// Make the part in `root`. A machine's links are never written into the host's `/dev`
/// filesystem (the real host's devtmpfs, where the directories bound into machines live; a host
/// tree under `--host-root` and a rootfs on disk share one filesystem by construction and have
/// no such directories). Returns the log line.
pub fn write(root: &MachineRoot, d: &Desired, host: &HostRoot) -> Result<String> {
    let host_dev = match d.target {
        Target::Machine if host.is_real_root() => host
            .metadata("/dev")
            .ok()
            .map(|m| std::os::unix::fs::MetadataExt::dev(&m)),
        Target::Machine | Target::Host => None,
    };
    Ok(rewire::dev_char(root, &d.dev_char, d.driver.is_some(), host_dev)?.to_string())
}
