//! Every part of the wiring, one file each, on one list ([`ALL`]). A part is one [`Part`]: its
//! name, the check its changes name, who makes it ([`Owner`]) and for which hook ([`Hook`]:
//! pre-start's parts make the machine's next start on the host, [`NextStart`]; the others are
//! a running target's, [`Running`]); how it reads what is there ([`Part::observe`]: reads only,
//! bounded, through a root); what would change to make it as desired ([`Part::diff`]: pure);
//! and the write itself for the parts a hook makes ([`Part::apply`], re-reading with the same
//! `observe`).
//!
//! Every command walks [`ALL`]: pre-start makes its parts in this order (each applied only
//! where its diff is not empty, [`crate::apply::executor::execute_boot`]), `plan` lists them;
//! post-start applies the running target's parts it owns (the file steps of
//! [`crate::apply::executor::plan`]), `status` and `plan` list their changes ([`pending`]), the
//! wiring model and its negative controls go part by part. The order is the order of a start
//! (docs/wiring.md): the `.nspawn` file last of pre-start's, as it binds what the others make;
//! the loader cache after the library links, the spec after the links it names. A target
//! without a driver walks the same list against a desired state holding nothing of ours: the
//! parts remove what is left.
//!
//! A new part is a file here and a line in [`ALL`].

use crate::apply::boot::Boot;
use crate::apply::gate::Markers;
use crate::config::MachineConfig;
use crate::fs::host::HostRoot;
use crate::fs::machine_root::MachineRoot;
use crate::model::{Change, Check, Desired, Target};
use crate::systemd::services::Services;
use crate::types::machine_name::Subject;
use anyhow::Result;
use std::any::{Any, TypeId};

pub(crate) mod boot_gate;
pub(crate) mod cdi_spec;
pub(crate) mod dev_char;
pub(crate) mod device_cgroup;
pub(crate) mod driver_root;
pub(crate) mod driver_tree;
pub(crate) mod gate;
pub(crate) mod gate_file;
pub(crate) mod helper;
pub(crate) mod host_devices;
pub(crate) mod host_nodes;
pub(crate) mod ld_cache;
pub(crate) mod links;
pub(crate) mod nspawn_file;
pub(crate) mod unit_files;

pub use boot_gate::BootGate;
pub use cdi_spec::CdiSpec;
pub use dev_char::DevChar;
pub use device_cgroup::DeviceCgroup;
pub use driver_root::DriverRoot;
pub use driver_tree::DriverTree;
pub use gate::Gate;
pub use gate_file::GateFile;
pub use helper::Helper;
pub use host_devices::HostDevices;
pub use host_nodes::HostNodes;
pub use ld_cache::LdCache;
pub use links::Links;
pub use nspawn_file::NspawnFile;
pub use unit_files::UnitFiles;

/// Every part, in the order of a start (docs/wiring.md, "The order of a start"): pre-start's,
/// then the running target's in the order post-start makes them.
pub static ALL: [Listed; 15] = [
    Listed::NextStart(&HostNodes),
    Listed::NextStart(&DeviceCgroup),
    Listed::NextStart(&GateFile),
    Listed::NextStart(&DriverTree),
    Listed::NextStart(&BootGate),
    Listed::NextStart(&NspawnFile),
    Listed::Running(&DriverRoot),
    Listed::Running(&Helper),
    Listed::Running(&Links),
    Listed::Running(&DevChar),
    Listed::Running(&LdCache),
    Listed::Running(&CdiSpec),
    Listed::Running(&Gate),
    Listed::Running(&HostDevices),
    Listed::Running(&UnitFiles),
];

/// A part on the list, by its hook.
#[derive(Clone, Copy)]
pub enum Listed {
    NextStart(&'static dyn AnyPart<NextStart>),
    Running(&'static dyn AnyPart<Running>),
}

impl Listed {
    /// Its name ([`Part::NAME`]).
    pub fn name(self) -> &'static str {
        match self {
            Listed::NextStart(p) => p.name(),
            Listed::Running(p) => p.name(),
        }
    }

    /// The check its changes name ([`Part::CHECK`]).
    pub fn check(self) -> Check {
        match self {
            Listed::NextStart(p) => p.check(),
            Listed::Running(p) => p.check(),
        }
    }

    /// Who makes it ([`Part::OWNER`]).
    pub fn owner(self) -> Owner {
        match self {
            Listed::NextStart(p) => p.owner(),
            Listed::Running(p) => p.owner(),
        }
    }
}

/// pre-start's parts, in [`ALL`]'s order.
pub(crate) fn next_start() -> impl Iterator<Item = &'static dyn AnyPart<NextStart>> {
    ALL.iter().filter_map(|p| match p {
        Listed::NextStart(p) => Some(*p),
        Listed::Running(_) => None,
    })
}

/// The parts a running target of this kind has, in [`ALL`]'s order.
pub fn running(target: Target) -> impl Iterator<Item = &'static dyn AnyPart<Running>> {
    ALL.iter().filter_map(move |p| match p {
        Listed::Running(p) if p.on(target) => Some(*p),
        _ => None,
    })
}

/// A hook's parts: what they read ([`Hook::Scene`]) and write through ([`Hook::Writer`]).
pub trait Hook: 'static {
    type Scene<'a>;
    type Writer<'a>;
}

/// pre-start's parts: the machine's next start, made on the host ([`Boot`]: the rendered
/// `.nspawn` file and what it binds).
pub enum NextStart {}

impl Hook for NextStart {
    type Scene<'a> = Boot<'a>;
    type Writer<'a> = Boot<'a>;
}

/// A running target's parts: read through its root ([`At`]), written by post-start
/// ([`Wiring`]).
pub enum Running {}

impl Hook for Running {
    type Scene<'a> = At<'a>;
    type Writer<'a> = Wiring<'a>;
}

/// Who makes a part.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    /// pre-start, on the host, for the machine's next boot.
    PreStart,
    /// post-start, in its file steps (the services stopped): the running target's.
    PostStart,
    /// post-start, as it starts the services (the gate's markers).
    PostStartServices,
    /// Only a new start of the running machine (nspawn's binds at its boot); not to be taken
    /// for [`NextStart`], pre-start's hook.
    NewStart,
    /// `install`, then a restart.
    Install,
}

/// When pre-start's plan holds a part ([`crate::apply::executor::pre_start`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum When {
    Always,
    /// Under the real root only: the host's systemd holds it (no unit under `--host-root`).
    RealRoot,
    /// When the `.nspawn` file binds the unit gate.
    FileBindsGate,
}

/// A running target as its parts read it: its root (the machine's, by its leader; the host's `/`
/// in host mode), the host's (its unit files), and what it must hold.
pub struct At<'a> {
    pub target: &'a MachineRoot,
    pub host: &'a HostRoot,
    pub desired: &'a Desired,
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
    /// Whose part it is: what it reads and writes through.
    type Hook: Hook;
    /// What [`Part::observe`] reads.
    type Seen: 'static;
    /// Its name in plans, log lines and errors.
    const NAME: &'static str;
    /// The `step` field of its log line (`journalctl STEP=cdi`).
    const KEY: &'static str;
    /// The check its changes name (`status`, `plan`), unless a change says otherwise.
    const CHECK: Check;
    /// Who makes it.
    const OWNER: Owner;
    /// When pre-start's plan holds it (pre-start's parts).
    const WHEN: When = When::Always;

    /// Whether a running target of this kind has the part ([`running`]; pre-start's parts are
    /// a machine's by their hook, and nothing asks them).
    fn on(&self, target: Target) -> bool {
        let _ = target;
        true
    }

    /// Read the part: reads only.
    fn observe(&self, at: &<Self::Hook as Hook>::Scene<'_>) -> Result<Self::Seen>;

    /// What would change to make the part as `seen` holds it what `at` wants, in order;
    /// `earlier`: the changes of the parts before it on the list. An error: what the part holds
    /// cannot be made so (its hook would fail there). Pure.
    fn diff(
        &self,
        at: &<Self::Hook as Hook>::Scene<'_>,
        seen: &Self::Seen,
        earlier: &[Change],
    ) -> Result<Vec<Change>>;

    /// Make the part ([`Owner::PreStart`] and [`Owner::PostStart`] parts);
    /// `library_links_changed`: whether the links part changed a link in this run. Returns
    /// what it did and its log line.
    fn apply(
        &self,
        w: &<Self::Hook as Hook>::Writer<'_>,
        library_links_changed: bool,
    ) -> Result<Applied> {
        let _ = (w, library_links_changed);
        anyhow::bail!("{} is not written by a hook: a bug", Self::NAME)
    }

    /// The log line of the part found as it must be (pre-start logs one for every part).
    fn unchanged(&self, at: &<Self::Hook as Hook>::Scene<'_>) -> Result<String> {
        let _ = at;
        Ok(format!("{}: unchanged", Self::NAME))
    }
}

/// A [`Part`] as the list holds it (every part is one, by the impl below): its reads kept
/// opaque, so that one list holds parts that read different things.
pub trait AnyPart<H: Hook>: Sync {
    fn name(&self) -> &'static str;
    fn key(&self) -> &'static str;
    fn check(&self) -> Check;
    fn owner(&self) -> Owner;
    fn when(&self) -> When;
    fn on(&self, target: Target) -> bool;
    /// [`Part::observe`], its result kept opaque.
    fn observe_opaque(&self, at: &H::Scene<'_>) -> Opaque;
    /// [`Part::diff`] of what [`AnyPart::observe_opaque`] read; a part that could not be read,
    /// or whose diff fails, is one change that fails ([`Change::unreadable`]), as its hook
    /// would.
    fn diff_opaque(&self, at: &H::Scene<'_>, seen: &Opaque, earlier: &[Change]) -> Vec<Change>;
    /// [`Part::observe`] then [`Part::diff`]; an error: what could not be read, or made so.
    fn changes(&self, at: &H::Scene<'_>) -> Result<Vec<Change>>;
    /// [`Part::apply`].
    fn apply(&self, w: &H::Writer<'_>, library_links_changed: bool) -> Result<Applied>;
    /// [`Part::unchanged`].
    fn unchanged(&self, at: &H::Scene<'_>) -> Result<String>;
    /// Which part type it is ([`Observation::get`]).
    fn part_type(&self) -> TypeId;
}

impl<P: Part> AnyPart<P::Hook> for P {
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
    fn when(&self) -> When {
        P::WHEN
    }
    fn on(&self, target: Target) -> bool {
        Part::on(self, target)
    }
    fn observe_opaque(&self, at: &<P::Hook as Hook>::Scene<'_>) -> Opaque {
        Ok(Box::new(self.observe(at)?))
    }
    fn diff_opaque(
        &self,
        at: &<P::Hook as Hook>::Scene<'_>,
        seen: &Opaque,
        earlier: &[Change],
    ) -> Vec<Change> {
        let out = match seen {
            Err(e) => Err(anyhow::anyhow!("{e:#}")),
            Ok(seen) => match seen.downcast_ref::<P::Seen>() {
                Some(seen) => self.diff(at, seen, earlier),
                None => Err(anyhow::anyhow!(
                    "{} judged on what another part read: a bug",
                    P::NAME
                )),
            },
        };
        out.unwrap_or_else(|e| vec![Change::unreadable(P::CHECK, &e)])
    }
    fn changes(&self, at: &<P::Hook as Hook>::Scene<'_>) -> Result<Vec<Change>> {
        self.diff(at, &self.observe(at)?, &[])
    }
    fn apply(
        &self,
        w: &<P::Hook as Hook>::Writer<'_>,
        library_links_changed: bool,
    ) -> Result<Applied> {
        Part::apply(self, w, library_links_changed)
    }
    fn unchanged(&self, at: &<P::Hook as Hook>::Scene<'_>) -> Result<String> {
        Part::unchanged(self, at)
    }
    fn part_type(&self) -> TypeId {
        TypeId::of::<P>()
    }
}

impl<H: Hook> dyn AnyPart<H> {
    /// Whether this is part `P`.
    pub fn is<P: Part>(&self) -> bool {
        self.part_type() == TypeId::of::<P>()
    }
}

/// Parts are equal when they are the same part (the hooks' plans compare their steps).
impl<H: Hook> PartialEq for dyn AnyPart<H> {
    fn eq(&self, other: &Self) -> bool {
        self.part_type() == other.part_type()
    }
}

impl<H: Hook> Eq for dyn AnyPart<H> {}

impl<H: Hook> std::fmt::Debug for dyn AnyPart<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl<H: Hook> std::fmt::Display for dyn AnyPart<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What a part's [`AnyPart::observe_opaque`] read.
pub(crate) type Opaque = Result<Box<dyn Any>>;

/// Every part of a running target as read at once ([`observe`]), in [`ALL`]'s order.
pub struct Observation(Vec<(&'static dyn AnyPart<Running>, Opaque)>);

impl Observation {
    /// What part `P` read, if the target has it: the value, or why it could not be read.
    pub fn get<P: Part<Hook = Running>>(&self) -> Option<Result<&P::Seen, &anyhow::Error>> {
        let (_, seen) = self.0.iter().find(|(p, _)| p.is::<P>())?;
        Some(match seen {
            Ok(b) => Ok(b.downcast_ref::<P::Seen>()?),
            Err(e) => Err(e),
        })
    }

    /// What part `P` read, to change in a test of the pure diff.
    #[cfg(test)]
    pub(crate) fn get_mut<P: Part<Hook = Running>>(&mut self) -> Option<&mut P::Seen> {
        let (_, seen) = self.0.iter_mut().find(|(p, _)| p.is::<P>())?;
        seen.as_mut().ok()?.downcast_mut::<P::Seen>()
    }

    /// What would change, part by part in order ([`Part::diff`]). Pure.
    pub fn diff(&self, at: &At) -> Vec<Change> {
        let mut out = Vec::new();
        for (part, seen) in &self.0 {
            let changes = part.diff_opaque(at, seen, &out);
            out.extend(changes);
        }
        out
    }

    /// [`Observation::diff`] of part `P` alone (`status` of a host whose driver is incomplete
    /// judges only the unit files: post-start would refuse, changing nothing). Pure.
    pub(crate) fn diff_of<P: Part<Hook = Running>>(&self, at: &At) -> Vec<Change> {
        self.0
            .iter()
            .filter(|(p, _)| p.is::<P>())
            .flat_map(|(p, seen)| p.diff_opaque(at, seen, &[]))
            .collect()
    }
}

/// Read every part of the running target ([`running`]). Reads only.
pub fn observe(at: &At) -> Observation {
    Observation(
        running(at.desired.target)
            .map(|p| (p, p.observe_opaque(at)))
            .collect(),
    )
}

/// Everything that would change in the running target to make it `at.desired`: the diff of
/// what [`observe`] reads. Reads only.
pub fn pending(at: &At) -> Vec<Change> {
    observe(at).diff(at)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The list holds each part once, pre-start's first and only theirs owned by pre-start, and
    /// every name and log key tells one part of a hook from the others.
    #[test]
    fn the_list_holds_each_part_once_in_the_order_of_a_start() {
        let names: Vec<&str> = ALL.iter().map(|p| p.name()).collect();
        let mut unique = names.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), ALL.len(), "{names:?}");
        let first_running = ALL
            .iter()
            .position(|p| matches!(p, Listed::Running(_)))
            .unwrap();
        for (i, p) in ALL.iter().enumerate() {
            let pre = matches!(p, Listed::NextStart(_));
            assert_eq!(pre, i < first_running, "{} out of order", p.name());
            assert_eq!(pre, p.owner() == Owner::PreStart, "{}", p.name());
        }
        let keys = |v: Vec<&str>| {
            let n = v.len();
            let mut k = v;
            k.sort_unstable();
            k.dedup();
            assert_eq!(k.len(), n, "{k:?}");
        };
        keys(next_start().map(|p| p.key()).collect());
        keys(running(Target::Machine).map(|p| p.key()).collect());
        assert_eq!(
            next_start().last().map(|p| p.name()),
            Some(".nspawn file"),
            "the file binds what the parts before it make"
        );
        assert!(ALL.iter().any(|p| p.check() == Check::NextStart));
    }
}
