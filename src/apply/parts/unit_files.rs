//! The unit files `install` writes for the target, on the host: `install`'s to change.

use super::{At, Owner, Part, Running};
use crate::model::{Action, Change, Check};
use anyhow::Result;

pub struct UnitFiles;

/// A unit file as found, against what `install` writes now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    Same,
    Differs,
    Missing,
}

impl Part for UnitFiles {
    type Hook = Running;
    /// Each unit file of the target, in [`Desired::unit_files`]' order.
    type Seen = Vec<Seen>;
    const NAME: &'static str = "unit files";
    const KEY: &'static str = "unit-files";
    const CHECK: Check = Check::Dropin;
    const OWNER: Owner = Owner::Install;

    fn observe(&self, at: &At) -> Result<Vec<Seen>> {
        let d = at.desired;
        d.unit_files
            .iter()
            .map(|f| match at.host.read(&f.path) {
                Ok(have) if have == f.text.as_bytes() => Ok(Seen::Same),
                Ok(_) => Ok(Seen::Differs),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Seen::Missing),
                Err(e) => Err(anyhow::Error::new(e).context(format!("reading {}", f.path))),
            })
            .collect()
    }

    /// An [`Action::Install`] change for each unit file that differs, or is missing where that
    /// is a change ([`crate::model::UnitFile::required`]).
    fn diff(&self, at: &At, seen: &Vec<Seen>, _: &[Change]) -> Result<Vec<Change>> {
        let d = at.desired;
        Ok(d.unit_files
            .iter()
            .zip(seen)
            .filter_map(|(f, s)| {
                let why = match s {
                    Seen::Same => return None,
                    Seen::Missing if !f.required => return None,
                    Seen::Missing => "missing".to_owned(),
                    Seen::Differs => format!("differs from what {} writes now", f.by),
                };
                Some(Change::new(
                    Check::Dropin,
                    Action::Install,
                    f.path.clone(),
                    why,
                ))
            })
            .collect())
    }
}
