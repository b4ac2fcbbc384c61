//! The unit gate: in a GPU machine, containerd and kubelet wait at boot for post-start.
//!
//! Without it a restart boots the machine's containerd and kubelet, post-start stops both to
//! rewire the driver and starts them again: two starts and two stops per restart, and a kubelet
//! that can begin starting pods against the previous boot's dangling library links before
//! post-start stops it. With it, pre-start binds one read-only drop-in (`assets/unit-gate.conf`,
//! `ConditionPathExists=`[`WIRED`]) into the machine's runtime unit directory for both units, so
//! the boot skips them; post-start wires the driver, creates [`WIRED`] in the machine and starts
//! them once, in the order DESIGN §5 gives. The stops post-start still issues find nothing
//! running at boot and cost one D-Bus round trip each.
//!
//! Nothing in the machine rootfs changes: the drop-ins live in the machine's `/run` (a tmpfs
//! nspawn creates at each start) and vanish with the bind when the `.nspawn` file no longer
//! names them (uninstall, or a host without NVIDIA GPUs). The marker lives in the same tmpfs, so
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

/// The marker, in the machine, whose existence lets the gated units start.
pub const WIRED: &str = "/run/nspawn-lifecycle/wired";

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

/// Write [`HOST_FILE`] under `host` unless it already holds [`CONTENT`]. Returns whether it wrote.
pub fn write_host_file(host: &crate::host::HostRoot) -> Result<bool> {
    let path = host.path(HOST_FILE);
    let dir = Path::new(HOST_FILE)
        .parent()
        .context("gate file has a parent")?;
    // Ours, root-owned and writable by root alone (shared with the lock directory): verified, so
    // the drop-in nspawn binds into the machine cannot have been swapped by another user.
    crate::host_dir::open(host, &dir.to_string_lossy(), crate::host_dir::PARENT_MODE)?;
    crate::atomic::write_if_changed(
        &path,
        CONTENT.as_bytes(),
        0o644,
        Point::PreStartMidGateWrite,
    )
}

/// Whether this boot of the machine is gated (the drop-in for `unit` is in place).
pub fn is_gated(root: &MachineRoot, unit: &UnitName) -> Result<bool> {
    Ok(root.kind_of(&dropin(unit))?.is_some())
}

/// Create [`WIRED`] in the machine (a no-op when it is there). Returns whether it wrote.
pub fn release(root: &MachineRoot) -> Result<bool> {
    let (dir, name) = split_parent(WIRED)?;
    root.create_dir_all(&dir, 0o755)?
        .write_file(
            name,
            b"nspawn-lifecycle post-start wired this boot's NVIDIA state\n",
            0o644,
            Point::PostStartMidGateRelease,
        )
        .with_context(|| format!("releasing the unit gate ({WIRED} in the machine)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dropin_conditions_on_the_marker() {
        assert!(CONTENT.contains(&format!("\n[Unit]\nConditionPathExists={WIRED}\n")));
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
    fn release_creates_the_marker_once() {
        let dir = tempfile::tempdir().unwrap();
        let root = MachineRoot::open(dir.path()).unwrap();
        let kubelet: UnitName = "kubelet.service".parse().unwrap();
        assert!(!is_gated(&root, &kubelet).unwrap());
        assert!(release(&root).unwrap());
        assert!(!release(&root).unwrap(), "second release writes nothing");
        assert!(dir.path().join("run/nspawn-lifecycle/wired").is_file());
        let d = dir.path().join("run/systemd/system/kubelet.service.d");
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("50-nspawn-lifecycle-gate.conf"), CONTENT).unwrap();
        assert!(is_gated(&root, &kubelet).unwrap());
    }
}
