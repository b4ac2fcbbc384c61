//! The wiring's parts, one file each, on one list ([`ALL`]). A part is one [`Part`]: its name,
//! the check its changes name, which targets have it and who makes it ([`Owner`]); how it reads
//! what a target holds of it ([`Part::observe`]: reads only, bounded, through the target's root);
//! what would change there to make it [`Desired`] ([`Part::diff`]: pure); and, for the parts
//! post-start writes, the write itself ([`Part::apply`]: re-reading with the same `observe`).
//!
//! Every command walks [`ALL`]: `status` and `plan` list the changes of a target's parts
//! ([`pending`]), post-start applies the ones it owns in this order (the file steps of
//! [`crate::apply::executor::plan`]), the wiring model and its negative controls go part by
//! part. The order is the order of a start (docs/wiring.md): the loader cache follows the
//! library links, the spec the links it names. A target without a driver walks the same list
//! against a [`Desired`] holding nothing of ours: the parts remove what is left.
//!
//! A new part is a file here and a line in [`ALL`].

use crate::apply::gate::Markers;
use crate::config::MachineConfig;
use crate::fs::host::HostRoot;
use crate::fs::machine_root::MachineRoot;
use crate::model::{Change, Check, Desired, Target};
use crate::systemd::services::Services;
use crate::types::machine_name::Subject;
use anyhow::Result;
use std::any::{Any, TypeId};

pub mod cdi_spec;
pub mod dev_char;
pub mod driver_root;
pub mod gate;
pub mod helper;
pub mod host_devices;
pub mod ld_cache;
pub mod links;
pub mod unit_files;

pub use cdi_spec::CdiSpec;
pub use dev_char::DevChar;
pub use driver_root::DriverRoot;
pub use gate::Gate;
pub use helper::Helper;
pub use host_devices::HostDevices;
pub use ld_cache::LdCache;
pub use links::Links;
pub use unit_files::UnitFiles;

/// Every part, in the order post-start makes them (docs/wiring.md, "The order of a start").
pub static ALL: [&dyn AnyPart; 9] = [
    &DriverRoot,
    &Helper,
    &Links,
    &DevChar,
    &LdCache,
    &CdiSpec,
    &Gate,
    &HostDevices,
    &UnitFiles,
];

/// The parts a target of this kind has, in [`ALL`]'s order.
pub fn list(target: Target) -> impl Iterator<Item = &'static dyn AnyPart> {
    ALL.iter().copied().filter(move |p| p.on(target))
}

/// Who makes a part.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    /// post-start, in its file steps (the services stopped): the running target's.
    PostStart,
    /// post-start, as it starts the services (the gate's markers).
    PostStartServices,
    /// Only a new start (nspawn's binds of the machine's next boot).
    NextStart,
    /// `install`, then a restart.
    Install,
}

/// Where the parts are: the target's root (the machine's, by its leader; the host's `/` in host
/// mode) and the host's (its unit files).
pub struct Roots<'a> {
    pub target: &'a MachineRoot,
    pub host: &'a HostRoot,
}

/// A target as post-start writes it: its rootfs, the host, its [`Desired`] state and its
/// systemd.
pub struct Wiring<'a> {
    pub who: Subject<'a>,
    pub mc: &'a MachineConfig,
    pub host: &'a HostRoot,
    pub markers: &'a Markers<'a>,
    pub root: &'a MachineRoot,
    pub desired: &'a Desired,
    pub services: &'a dyn Services,
}

/// What applying a part did.
pub struct Applied {
    /// The step's log line.
    pub line: String,
    /// Whether a library link changed (the links part; `ldconfig` hears it).
    pub library_links_changed: bool,
}

impl Applied {
    /// A step that changed no library link, and its log line.
    pub fn line(line: String) -> Applied {
        Applied {
            line,
            library_links_changed: false,
        }
    }
}

/// One part of the wiring: what its file implements.
pub trait Part: Sync + 'static {
    /// What [`Part::observe`] reads.
    type Seen: 'static;
    /// Its name in post-start's plan, log lines and errors.
    const NAME: &'static str;
    /// The `step` field of its log line (`journalctl STEP=cdi`).
    const KEY: &'static str;
    /// The check its changes name (`status`), unless a change says otherwise.
    const CHECK: Check;
    /// Who makes it.
    const OWNER: Owner;

    /// Whether a target of this kind has the part.
    fn on(&self, target: Target) -> bool {
        let _ = target;
        true
    }

    /// Read the part in the target: reads only, through `at`.
    fn observe(&self, at: &Roots, d: &Desired) -> Result<Self::Seen>;

    /// What would change to make the part as `seen` holds it `d`'s, in order; `earlier`: the
    /// changes of the parts before it on the list. An error: what the part holds cannot be
    /// made `d`'s (post-start would fail there). Pure.
    fn diff(&self, d: &Desired, seen: &Self::Seen, earlier: &[Change]) -> Result<Vec<Change>>;

    /// Make the part `w.desired`'s (post-start's file step, [`Owner::PostStart`] parts only);
    /// `library_links_changed`: whether the links part changed a link in this run.
    fn apply(&self, w: &Wiring, library_links_changed: bool) -> Result<Applied> {
        let _ = (w, library_links_changed);
        anyhow::bail!("{} is not written by post-start: a bug", Self::NAME)
    }
}

/// A [`Part`] as the list holds it (every part is one, by the impl below): its reads kept
/// opaque, so that one list holds parts that read different things.
pub trait AnyPart: Sync {
    fn name(&self) -> &'static str;
    fn key(&self) -> &'static str;
    fn check(&self) -> Check;
    fn owner(&self) -> Owner;
    fn on(&self, target: Target) -> bool;
    /// [`Part::observe`], its result kept opaque.
    fn observe_opaque(&self, at: &Roots, d: &Desired) -> Opaque;
    /// [`Part::diff`] of what [`AnyPart::observe_opaque`] read; a part that could not be read,
    /// or whose diff fails, is one change that fails ([`Change::unreadable`]), as post-start
    /// would.
    fn diff_opaque(&self, d: &Desired, seen: &Opaque, earlier: &[Change]) -> Vec<Change>;
    /// [`Part::apply`].
    fn apply(&self, w: &Wiring, library_links_changed: bool) -> Result<Applied>;
    /// Which part type it is ([`Observation::get`]).
    fn part_type(&self) -> TypeId;
}

impl<P: Part> AnyPart for P {
    fn name(&self) -> &'static str {
        P::NAME
    }
    fn key(&self) -> &'static str {
        P::KEY
    }
    fn check(&self) -> Check {
        P::CHECK
    }
    fn owner(&self) -> Owner {
        P::OWNER
    }
    fn on(&self, target: Target) -> bool {
        Part::on(self, target)
    }
    fn observe_opaque(&self, at: &Roots, d: &Desired) -> Opaque {
        Ok(Box::new(self.observe(at, d)?))
    }
    fn diff_opaque(&self, d: &Desired, seen: &Opaque, earlier: &[Change]) -> Vec<Change> {
        let out = match seen {
            Err(e) => Err(anyhow::anyhow!("{e:#}")),
            Ok(seen) => match seen.downcast_ref::<P::Seen>() {
                Some(seen) => self.diff(d, seen, earlier),
                None => Err(anyhow::anyhow!(
                    "{} judged on what another part read: a bug",
                    P::NAME
                )),
            },
        };
        out.unwrap_or_else(|e| vec![Change::unreadable(P::CHECK, &e)])
    }
    fn apply(&self, w: &Wiring, library_links_changed: bool) -> Result<Applied> {
        Part::apply(self, w, library_links_changed)
    }
    fn part_type(&self) -> TypeId {
        TypeId::of::<P>()
    }
}

impl dyn AnyPart {
    /// Whether this is part `P`.
    pub fn is<P: Part>(&self) -> bool {
        self.part_type() == TypeId::of::<P>()
    }
}

/// Parts are equal when they are the same part (post-start's plan compares its steps).
impl PartialEq for dyn AnyPart {
    fn eq(&self, other: &Self) -> bool {
        self.part_type() == other.part_type()
    }
}

impl Eq for dyn AnyPart {}

impl std::fmt::Debug for dyn AnyPart {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What a part's [`AnyPart::observe_opaque`] read.
type Opaque = Result<Box<dyn Any>>;

/// Every part of a target as read at once ([`observe`]), in [`ALL`]'s order.
pub struct Observation(Vec<(&'static dyn AnyPart, Opaque)>);

impl Observation {
    /// What part `P` read, if the target has it: the value, or why it could not be read.
    pub fn get<P: Part>(&self) -> Option<Result<&P::Seen, &anyhow::Error>> {
        let (_, seen) = self
            .0
            .iter()
            .find(|(p, _)| p.part_type() == TypeId::of::<P>())?;
        Some(match seen {
            Ok(b) => Ok(b.downcast_ref::<P::Seen>()?),
            Err(e) => Err(e),
        })
    }

    /// What part `P` read, to change in a test of the pure diff.
    #[cfg(test)]
    pub(crate) fn get_mut<P: Part>(&mut self) -> Option<&mut P::Seen> {
        let (_, seen) = self
            .0
            .iter_mut()
            .find(|(p, _)| p.part_type() == TypeId::of::<P>())?;
        seen.as_mut().ok()?.downcast_mut::<P::Seen>()
    }

    /// What would change, part by part in order ([`Part::diff`]). Pure.
    pub fn diff(&self, d: &Desired) -> Vec<Change> {
        let mut out = Vec::new();
        for (part, seen) in &self.0 {
            let changes = part.diff_opaque(d, seen, &out);
            out.extend(changes);
        }
        out
    }

    /// [`Observation::diff`] of part `P` alone (`status` of a host whose driver is incomplete
    /// judges only the unit files: post-start would refuse, changing nothing). Pure.
    pub fn diff_of<P: Part>(&self, d: &Desired) -> Vec<Change> {
        self.0
            .iter()
            .filter(|(p, _)| p.part_type() == TypeId::of::<P>())
            .flat_map(|(p, seen)| p.diff_opaque(d, seen, &[]))
            .collect()
    }
}

/// Read every part of `d`'s target ([`list`]). Reads only.
pub fn observe(at: &Roots, d: &Desired) -> Observation {
    Observation(
        list(d.target)
            .map(|p| (p, p.observe_opaque(at, d)))
            .collect(),
    )
}

/// Everything that would change in the target to make it `d`: the diff of what [`observe`]
/// reads. Reads only.
pub fn pending(at: &Roots, d: &Desired) -> Vec<Change> {
    observe(at, d).diff(d)
}
