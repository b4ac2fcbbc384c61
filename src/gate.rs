//! The unit gate: in a GPU machine, containerd and kubelet wait at boot for post-start.
//!
//! Without it a restart boots the machine's containerd and kubelet, post-start stops both to
//! rewire the driver and starts them again: two starts and two stops per restart, and a kubelet
//! that can begin starting pods against the previous boot's dangling library links before
//! post-start stops it. With it, pre-start binds one read-only drop-in (`assets/unit-gate.conf`,
//! `ConditionPathExists=/run/nspawn-lifecycle/released/%n`) into the machine's runtime unit
//! directory for both units, so each unit has a marker of its own ([`marker`]): a start of the
//! unit before its marker exists is skipped by systemd ("unmet condition").
//!
//! post-start runs while the machine boots (the `.nspawn` file says `NotifyReady=no`), so each
//! marker is created exactly when that unit's precondition holds (DESIGN §5, issue 12):
//! containerd's once the driver is wired (driver root checked, links, `ldconfig`, CDI spec),
//! kubelet's once the staged images are imported too. A boot that reaches either unit before
//! then skips it; one that reaches it after finds it allowed, which is safe by construction. One
//! marker for both would let a boot that reaches kubelet after the wiring start it before the
//! images are imported.
//!
//! Nothing in the machine rootfs changes: the drop-ins live in the machine's `/run` (a tmpfs
//! nspawn creates at each start) and vanish with the bind when the `.nspawn` file no longer
//! names them (uninstall, or a host without NVIDIA GPUs). The markers live in the same tmpfs, so
//! every boot is gated afresh.

use crate::failpoint::Point;
use crate::machine_root::{MachineRoot, split_parent};
use crate::paths::{HostPath, MachinePath, UnitName};
use anyhow::{Context as _, Result};
use std::path::Path;

/// Host file pre-start writes and the `.nspawn` file binds into the machine.
pub const HOST_FILE: &str = "/run/nspawn-lifecycle/unit-gate.conf";

/// The drop-in's bytes.
pub const CONTENT: &str = include_str!("../assets/unit-gate.conf");

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
pub fn host_file() -> HostPath {
    HOST_FILE.parse().expect("HOST_FILE is a valid host path")
}

/// Where the drop-in appears in the machine for `unit`. A unit name's escapes are part of the
/// directory name (`kube\x2dlet.service.d`), which is what systemd in the machine reads.
pub fn dropin(unit: &UnitName) -> MachinePath {
    format!("/run/systemd/system/{unit}.d/50-nspawn-lifecycle-gate.conf")
        .parse()
        .expect("a unit name holds no '/', control character or space, so the path is valid")
}

/// Host mode (issue 15): where `install --host` puts the same drop-in ([`CONTENT`]) for the
/// host's own `unit`, persistent in the host's unit directory. Its markers are the host's
/// [`marker`]s, in the host's `/run` (a tmpfs): after every reboot the host's containerd and
/// kubelet wait for `host post-start` again, so neither starts against the spec of a driver
/// that was replaced before the reboot.
pub fn host_dropin(unit: &UnitName) -> MachinePath {
    format!(
        "{}/{unit}.d/50-nspawn-lifecycle-gate.conf",
        crate::units::UNIT_DIR
    )
    .parse()
    .expect("a unit name holds no '/', control character or space, so the path is valid")
}

/// Write [`HOST_FILE`] under `host` unless it already holds [`CONTENT`]. Returns whether it wrote.
pub fn write_host_file(host: &crate::host::HostRoot) -> Result<bool> {
    let dir = Path::new(HOST_FILE)
        .parent()
        .context("gate file has a parent")?;
    // Ours, root-owned and writable by root alone (shared with the lock directory): verified, so
    // the drop-in nspawn binds into the machine cannot have been swapped by another user.
    crate::host_dir::open(host, &dir.to_string_lossy(), crate::host_dir::PARENT_MODE)?;
    host.write_if_changed(
        HOST_FILE,
        CONTENT.as_bytes(),
        0o644,
        Point::PreStartMidGateWrite,
    )
}

/// Whether this boot of the machine is gated (the drop-in for `unit` is in place).
pub fn is_gated(root: &MachineRoot, unit: &UnitName) -> Result<bool> {
    Ok(root.kind_of(&dropin(unit))?.is_some())
}

/// [`is_gated`] for host mode: whether `install --host` put the drop-in ([`host_dropin`]) on
/// the host's own `unit` (`root` is the host's).
pub fn is_gated_on_host(root: &MachineRoot, unit: &UnitName) -> Result<bool> {
    Ok(root.kind_of(&host_dropin(unit))?.is_some())
}

/// Whether `unit` may start this boot (its marker exists).
pub fn is_released(root: &MachineRoot, unit: &UnitName) -> Result<bool> {
    Ok(root.kind_of(&marker(unit))?.is_some())
}

/// Create `unit`'s marker in the machine (a no-op when it is there): from now on a start of
/// `unit` is no longer skipped. `point` is the failpoint between its temp file and the rename.
/// Returns whether it wrote.
pub fn release(root: &MachineRoot, unit: &UnitName, point: Point) -> Result<bool> {
    let path = marker(unit);
    let (dir, name) = split_parent(path.as_str())?;
    root.create_dir_all(&dir, 0o755)?
        .write_file(
            name,
            format!("nspawn-lifecycle post-start released {unit} this boot\n").as_bytes(),
            0o644,
            point,
        )
        .with_context(|| format!("releasing the unit gate of {unit} ({path} in the machine)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dropin_conditions_on_the_marker() {
        assert!(CONTENT.contains(&format!("\n[Unit]\nConditionPathExists={MARKER_DIR}/%n\n")));
        assert!(
            CONTENT.lines().all(|l| l.is_empty()
                || l.starts_with('#')
                || l.starts_with('[')
                || l.contains('='))
        );
        assert_eq!(
            dropin(&"kubelet.service".parse().unwrap()),
            "/run/systemd/system/kubelet.service.d/50-nspawn-lifecycle-gate.conf"
        );
        assert_eq!(
            dropin(&"kube\\x2dlet.service".parse().unwrap()),
            "/run/systemd/system/kube\\x2dlet.service.d/50-nspawn-lifecycle-gate.conf"
        );
    }

    #[test]
    fn the_host_file_is_never_written_through_a_planted_directory() {
        let t = tempfile::tempdir().unwrap();
        let elsewhere = t.path().join("elsewhere");
        std::fs::create_dir_all(&elsewhere).unwrap();
        std::fs::create_dir_all(t.path().join("host/run")).unwrap();
        let link = t.path().join("host/run/nspawn-lifecycle");
        std::os::unix::fs::symlink(&elsewhere, &link).unwrap();
        let host = crate::host::HostRoot::new(t.path().join("host"));
        let err = format!("{:#}", write_host_file(&host).unwrap_err());
        assert!(
            err.contains(&format!("{} is a symbolic link", link.display())),
            "{err}"
        );
        assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0);
        std::fs::remove_file(&link).unwrap();
        assert!(write_host_file(&host).unwrap());
        assert_eq!(
            std::fs::read_to_string(host.path(HOST_FILE)).unwrap(),
            CONTENT
        );
    }

    #[test]
    fn release_creates_each_units_marker_once() {
        let dir = tempfile::tempdir().unwrap();
        let root = MachineRoot::open(dir.path()).unwrap();
        let kubelet: UnitName = "kubelet.service".parse().unwrap();
        let containerd: UnitName = "containerd.service".parse().unwrap();
        assert!(!is_gated(&root, &kubelet).unwrap());
        let p = Point::PostStartMidGateRelease;
        assert!(release(&root, &containerd, p).unwrap());
        assert!(
            !release(&root, &containerd, p).unwrap(),
            "second release writes nothing"
        );
        assert!(is_released(&root, &containerd).unwrap());
        assert!(
            !is_released(&root, &kubelet).unwrap(),
            "containerd's marker is not kubelet's"
        );
        assert!(
            dir.path()
                .join("run/nspawn-lifecycle/released/containerd.service")
                .is_file()
        );
        assert!(release(&root, &kubelet, p).unwrap());
        assert!(
            dir.path()
                .join("run/nspawn-lifecycle/released/kubelet.service")
                .is_file()
        );
        let d = dir.path().join("run/systemd/system/kubelet.service.d");
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("50-nspawn-lifecycle-gate.conf"), CONTENT).unwrap();
        assert!(is_gated(&root, &kubelet).unwrap());
    }

    /// The drop-in's `%n` is the unit's name as systemd spells it, escapes included.
    #[test]
    fn the_marker_is_the_units_name() {
        assert_eq!(
            marker(&"kube\\x2dlet.service".parse().unwrap()),
            "/run/nspawn-lifecycle/released/kube\\x2dlet.service"
        );
    }
}
