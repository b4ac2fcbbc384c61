//! The unit gate as a value: in a GPU machine, containerd and kubelet wait at boot for their
//! preconditions.
//!
//! Without it a restart boots the machine's containerd and kubelet, post-start stops both to
//! rewire the driver and starts them again: two starts and two stops per restart, and a kubelet
//! that can begin starting pods against the previous boot's dangling library links before
//! post-start stops it. With it, pre-start binds one read-only drop-in (`assets/unit-gate.conf`,
//! `ConditionPathExists=/run/nspawn-lifecycle/released/%n`) into the machine's runtime unit
//! directory for both units, so each unit has a marker of its own ([`marker`]): a start of the
//! unit before its marker exists is skipped by systemd ("unmet condition").
//!
//! The markers are host files ([`machine_marker_dir`], bound read-only at [`MARKER_DIR`] in the
//! machine): only the helper creates or removes one, and nothing of it is written into the
//! machine's rootfs. Each is created exactly when that unit's precondition holds
//! (docs/wiring.md, "The unit gate"): containerd's by pre-start, once the driver tree the
//! `.nspawn` file binds is built
//! and checked ([`crate::apply::gate::prepare_boot`], `containerdAtBoot`, the default), so the boot starts containerd
//! as a bare boot would; or, with `containerdAtBoot: false`, by post-start once the driver is
//! wired (driver root checked, links, `ldconfig`, CDI spec). kubelet's always by post-start,
//! once the staged images are imported too. A boot that reaches a unit before its marker skips
//! it; one that reaches it after finds it allowed, which is safe by construction. One marker for
//! both would let a boot that reaches kubelet after the wiring start it before the images are
//! imported.
//!
//! The drop-ins live in the machine's `/run` (a tmpfs nspawn creates at each start) and vanish
//! with the bind when the `.nspawn` file no longer names them (uninstall, or a host without
//! NVIDIA GPUs). pre-start empties the markers before every start, so every boot is gated afresh.
//!
//! Here: the gate's files and markers, where each lives, and whether a root has them. Their
//! writes are src/apply/gate.rs's.

use crate::fs::machine_root::MachineRoot;
use crate::types::machine_name::MachineName;
use crate::types::paths::{HostPath, MachinePath, UnitName};
use anyhow::Result;

/// Host file pre-start writes and the `.nspawn` file binds into the machine.
pub const HOST_FILE: &str = "/run/nspawn-lifecycle/unit-gate.conf";

/// The drop-in's bytes.
pub const CONTENT: &str = include_str!("../../assets/unit-gate.conf");

/// The directory, in the machine, of the markers whose existence lets each gated unit start
/// (the drop-in's `%n`: one file per unit, named after it).
pub const MARKER_DIR: &str = "/run/nspawn-lifecycle/released";

/// The marker that lets `unit` start: [`MARKER_DIR`]`/<unit>`, what the drop-in's
/// `ConditionPathExists=` names for it once systemd expands `%n` to the unit's name.
pub fn marker(unit: &UnitName) -> MachinePath {
    format!("{MARKER_DIR}/{unit}")
        .parse()
        .expect("a unit name holds no '/', control character or space, so the path is valid")
}

/// [`HOST_FILE`] as the `.nspawn` renderer takes it.
pub(crate) fn host_file() -> HostPath {
    HOST_FILE.parse().expect("HOST_FILE is a valid host path")
}

/// Where the drop-in appears in the machine for `unit`. A unit name's escapes are part of the
/// directory name (`kube\x2dlet.service.d`), which is what systemd in the machine reads.
pub fn dropin(unit: &UnitName) -> MachinePath {
    format!("/run/systemd/system/{unit}.d/50-nspawn-lifecycle-gate.conf")
        .parse()
        .expect("a unit name holds no '/', control character or space, so the path is valid")
}

/// Host mode: where `install --host` puts the same drop-in ([`CONTENT`]) for the
/// host's own `unit`, persistent in the host's unit directory. Its markers are the host's
/// [`marker`]s, in the host's `/run` (a tmpfs): after every reboot the host's containerd and
/// kubelet wait for `host post-start` again, so neither starts against the spec of a driver
/// that was replaced before the reboot.
pub(crate) fn host_dropin(unit: &UnitName) -> MachinePath {
    format!(
        "{}/{unit}.d/50-nspawn-lifecycle-gate.conf",
        crate::types::units::UNIT_DIR
    )
    .parse()
    .expect("a unit name holds no '/', control character or space, so the path is valid")
}

/// Whether this boot of the machine is gated (the drop-in for `unit` is in place).
pub(crate) fn is_gated(root: &MachineRoot, unit: &UnitName) -> Result<bool> {
    Ok(root.kind_of(&dropin(unit))?.is_some())
}

/// [`is_gated`] for host mode: whether `install --host` put the drop-in ([`host_dropin`]) on
/// the host's own `unit` (`root` is the host's).
pub(crate) fn is_gated_on_host(root: &MachineRoot, unit: &UnitName) -> Result<bool> {
    Ok(root.kind_of(&host_dropin(unit))?.is_some())
}

/// Whether `unit` may start this boot as the tree at `root` sees it (its marker exists at
/// [`marker`]): a machine's view (status), or the host's own (host plan).
pub(crate) fn is_released(root: &MachineRoot, unit: &UnitName) -> Result<bool> {
    Ok(root.kind_of(&marker(unit))?.is_some())
}

/// Where the host keeps a machine's markers. The `.nspawn` file binds this directory read-only at
/// [`MARKER_DIR`] in the machine, so what the drop-in's `ConditionPathExists=` looks at is the
/// host's: pre-start can release containerd before the machine boots ([`crate::apply::gate::prepare_boot`]), and
/// only the helper (on the host) ever creates or removes a marker. pre-start empties it at every
/// start, so every boot is gated afresh.
pub(crate) fn machine_marker_dir(machine: &MachineName) -> String {
    format!("{MACHINES_DIR}/{machine}/released")
}

/// The host directory of per-machine runtime state (under `/run`: gone with a host reboot).
pub(crate) const MACHINES_DIR: &str = "/run/nspawn-lifecycle/machines";

/// [`machine_marker_dir`] as the `.nspawn` renderer takes it.
pub(crate) fn machine_marker_source(machine: &MachineName) -> HostPath {
    machine_marker_dir(machine)
        .parse()
        .expect("a machine name holds no '/', control character or space, so the path is valid")
}

/// [`MARKER_DIR`] as the `.nspawn` renderer takes it.
pub(crate) fn marker_target() -> MachinePath {
    MARKER_DIR.parse().expect("MARKER_DIR is a valid path")
}

/// How a marker post-start created begins (`install --host`'s uninstall removes only those).
pub(crate) const RELEASED_BY_POST_START: &str = "nspawn-lifecycle post-start released";
