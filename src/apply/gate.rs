//! The unit gate: in a GPU machine, containerd and kubelet wait at boot for their preconditions.
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
//! machine's rootfs. Each is created exactly when that unit's precondition holds (DESIGN §5):
//! containerd's by pre-start, once the driver tree the `.nspawn` file binds is built
//! and checked ([`prepare_boot`], `containerdAtBoot`, the default), so the boot starts containerd
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

use crate::failpoint::Point;
use crate::fs::host::HostRoot;
use crate::fs::machine_root::MachineRoot;
use crate::types::paths::{HostPath, MachinePath, UnitName};
use anyhow::{Context as _, Result, bail};
use std::path::Path;

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

/// Host mode: where `install --host` puts the same drop-in ([`CONTENT`]) for the
/// host's own `unit`, persistent in the host's unit directory. Its markers are the host's
/// [`marker`]s, in the host's `/run` (a tmpfs): after every reboot the host's containerd and
/// kubelet wait for `host post-start` again, so neither starts against the spec of a driver
/// that was replaced before the reboot.
pub fn host_dropin(unit: &UnitName) -> MachinePath {
    format!(
        "{}/{unit}.d/50-nspawn-lifecycle-gate.conf",
        crate::types::units::UNIT_DIR
    )
    .parse()
    .expect("a unit name holds no '/', control character or space, so the path is valid")
}

/// Write [`HOST_FILE`] under `host` unless it already holds [`CONTENT`]. Returns whether it wrote.
pub fn write_host_file(host: &crate::fs::host::HostRoot) -> Result<bool> {
    let dir = Path::new(HOST_FILE)
        .parent()
        .context("gate file has a parent")?;
    // Ours, root-owned and writable by root alone (shared with the lock directory): verified, so
    // the drop-in nspawn binds into the machine cannot have been swapped by another user.
    crate::fs::host_dir::open(
        host,
        &dir.to_string_lossy(),
        crate::fs::host_dir::PARENT_MODE,
    )?;
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

/// Whether `unit` may start this boot as the tree at `root` sees it (its marker exists at
/// [`marker`]): a machine's view (status), or the host's own (host plan).
pub fn is_released(root: &MachineRoot, unit: &UnitName) -> Result<bool> {
    Ok(root.kind_of(&marker(unit))?.is_some())
}

/// Where the host keeps a machine's markers. The `.nspawn` file binds this directory read-only at
/// [`MARKER_DIR`] in the machine, so what the drop-in's `ConditionPathExists=` looks at is the
/// host's: pre-start can release containerd before the machine boots ([`prepare_boot`]), and
/// only the helper (on the host) ever creates or removes a marker. pre-start empties it at every
/// start, so every boot is gated afresh, as the machine's own `/run` tmpfs used to make it.
pub fn machine_marker_dir(machine: &str) -> String {
    format!("{MACHINES_DIR}/{machine}/released")
}

/// The host directory of per-machine runtime state (under `/run`: gone with a host reboot).
pub const MACHINES_DIR: &str = "/run/nspawn-lifecycle/machines";

/// [`machine_marker_dir`] as the `.nspawn` renderer takes it.
pub fn machine_marker_source(machine: &str) -> HostPath {
    machine_marker_dir(machine)
        .parse()
        .expect("a machine name holds no '/', control character or space, so the path is valid")
}

/// [`MARKER_DIR`] as the `.nspawn` renderer takes it.
pub fn marker_target() -> MachinePath {
    MARKER_DIR.parse().expect("MARKER_DIR is a valid path")
}

/// One target's markers, as host paths: a machine's ([`machine_marker_dir`], what its `/run`
/// shows at [`MARKER_DIR`]) or the host's own ([`MARKER_DIR`], host mode).
pub struct Markers<'a> {
    host: &'a HostRoot,
    dir: String,
}

impl<'a> Markers<'a> {
    /// The markers of `machine`, kept on the host.
    pub fn of_machine(host: &'a HostRoot, machine: &str) -> Self {
        Markers {
            host,
            dir: machine_marker_dir(machine),
        }
    }

    /// The host's own markers (host mode).
    pub fn of_host(host: &'a HostRoot) -> Self {
        Markers {
            host,
            dir: MARKER_DIR.to_owned(),
        }
    }

    /// The host path of `unit`'s marker.
    pub fn path(&self, unit: &UnitName) -> String {
        format!("{}/{unit}", self.dir)
    }

    /// Whether `unit` may start this boot (its marker exists).
    pub fn is_released(&self, unit: &UnitName) -> Result<bool> {
        let path = self.path(unit);
        match self.host.symlink_metadata(&path) {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e).with_context(|| format!("reading the gate marker {path}")),
        }
    }

    /// Create `unit`'s marker (a no-op when it is there): from now on a start of `unit` is no
    /// longer skipped. `point` is the failpoint between its temp file and the rename. Returns
    /// whether it wrote.
    pub fn release(&self, unit: &UnitName, point: Point) -> Result<bool> {
        crate::fs::host_dir::open(self.host, &self.dir, crate::fs::host_dir::PARENT_MODE)?;
        self.write(
            unit,
            &format!("{RELEASED_BY_POST_START} {unit} this boot\n"),
            point,
        )
    }

    /// Write `unit`'s marker with `text` unless it already holds it (the directory verified).
    fn write(&self, unit: &UnitName, text: &str, point: Point) -> Result<bool> {
        let path = self.path(unit);
        self.host
            .write_if_changed(&path, text.as_bytes(), 0o644, point)
            .with_context(|| format!("releasing the unit gate of {unit} ({path})"))
    }
}

/// How a marker post-start created begins (`install --host`'s uninstall removes only those).
pub const RELEASED_BY_POST_START: &str = "nspawn-lifecycle post-start released";

/// pre-start, before every start of `machine` whose `.nspawn` file binds the gate: empty the
/// machine's marker directory (a new boot is gated afresh) and, with `containerd`, release that
/// unit for the boot ahead: pre-start has just built or checked the driver root the file binds,
/// so containerd may start as early as a bare boot would start it. kubelet's marker
/// stays post-start's: kubelet waits for the staged images, which need the running machine.
/// Returns the markers' directory.
pub fn prepare_boot(
    host: &HostRoot,
    machine: &str,
    containerd: Option<&UnitName>,
) -> Result<String> {
    let markers = Markers::of_machine(host, machine);
    let dir = &markers.dir;
    // Ours, root-owned and writable by root alone, like the unit gate's drop-in.
    crate::fs::host_dir::open(host, dir, crate::fs::host_dir::PARENT_MODE)?;
    let entries = host
        .read_dir(dir)
        .with_context(|| format!("listing {dir}"))?;
    // Checked before anything is removed: a refusal leaves the directory as it was.
    if let Some((name, _)) = entries
        .iter()
        .find(|(_, kind)| *kind == crate::fs::machine_root::FileKind::Dir)
    {
        bail!(
            "{dir}/{} is a directory, which nspawn-lifecycle never puts there; remove it",
            name.to_string_lossy()
        );
    }
    // containerd's marker, when it stays, is rewritten only if its bytes differ: a second
    // pre-start writes nothing.
    let kept = containerd.map(|u| std::ffi::OsString::from(u.as_str()));
    for (name, _) in entries.iter().filter(|(n, _)| Some(n) != kept.as_ref()) {
        host.remove_file(format!("{dir}/{}", name.to_string_lossy()))?;
    }
    if let Some(unit) = containerd {
        let text = format!("nspawn-lifecycle pre-start released {unit} for the next boot\n");
        markers.write(unit, &text, Point::PreStartMidGateRelease)?;
    }
    Ok(markers.dir)
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
        let host = crate::fs::host::HostRoot::new(t.path().join("host"));
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
    fn release_creates_each_units_marker_once_on_the_host() {
        let dir = tempfile::tempdir().unwrap();
        let host = HostRoot::new(dir.path());
        let root = MachineRoot::open(dir.path()).unwrap();
        let kubelet: UnitName = "kubelet.service".parse().unwrap();
        let containerd: UnitName = "containerd.service".parse().unwrap();
        assert!(!is_gated(&root, &kubelet).unwrap());
        let p = Point::PostStartMidGateRelease;
        for (markers, dir_there) in [
            (
                Markers::of_machine(&host, "kube1"),
                "run/nspawn-lifecycle/machines/kube1/released",
            ),
            (Markers::of_host(&host), "run/nspawn-lifecycle/released"),
        ] {
            assert!(markers.release(&containerd, p).unwrap());
            assert!(
                !markers.release(&containerd, p).unwrap(),
                "second release writes nothing"
            );
            assert!(markers.is_released(&containerd).unwrap());
            assert!(
                !markers.is_released(&kubelet).unwrap(),
                "containerd's marker is not kubelet's"
            );
            assert!(
                dir.path()
                    .join(dir_there)
                    .join("containerd.service")
                    .is_file()
            );
            assert!(markers.release(&kubelet, p).unwrap());
            assert!(dir.path().join(dir_there).join("kubelet.service").is_file());
        }
        // What a tree sees at MARKER_DIR: here the host's own markers.
        assert!(is_released(&root, &kubelet).unwrap());
        let d = dir.path().join("run/systemd/system/kubelet.service.d");
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("50-nspawn-lifecycle-gate.conf"), CONTENT).unwrap();
        assert!(is_gated(&root, &kubelet).unwrap());
    }

    /// Every start begins gated: pre-start empties the machine's markers, then releases
    /// containerd alone when asked; kubelet's marker of the last boot is gone.
    #[test]
    fn prepare_boot_empties_the_markers_and_releases_containerd_alone() {
        let dir = tempfile::tempdir().unwrap();
        let host = HostRoot::new(dir.path());
        let kubelet: UnitName = "kubelet.service".parse().unwrap();
        let containerd: UnitName = "containerd.service".parse().unwrap();
        let markers = Markers::of_machine(&host, "kube1");
        let p = Point::PostStartMidGateRelease;
        markers.release(&containerd, p).unwrap();
        markers.release(&kubelet, p).unwrap();
        let there = dir
            .path()
            .join("run/nspawn-lifecycle/machines/kube1/released");
        std::os::unix::fs::symlink("/etc/passwd", there.join("planted")).unwrap();
        assert_eq!(
            prepare_boot(&host, "kube1", Some(&containerd)).unwrap(),
            "/run/nspawn-lifecycle/machines/kube1/released"
        );
        assert!(markers.is_released(&containerd).unwrap());
        assert!(!markers.is_released(&kubelet).unwrap());
        assert!(!there.join("planted").exists() && std::fs::read_to_string("/etc/passwd").is_ok());
        assert!(
            std::fs::read_to_string(there.join("containerd.service"))
                .unwrap()
                .starts_with("nspawn-lifecycle pre-start released containerd.service")
        );
        prepare_boot(&host, "kube1", None).unwrap();
        assert_eq!(std::fs::read_dir(&there).unwrap().count(), 0);
        // A directory there is nobody's doing of ours: named, never removed.
        std::fs::create_dir(there.join("odd")).unwrap();
        let err = format!("{:#}", prepare_boot(&host, "kube1", None).unwrap_err());
        assert!(err.contains("kube1/released/odd is a directory"), "{err}");
        assert!(there.join("odd").is_dir());
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
