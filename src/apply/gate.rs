//! The unit gate's writes (see src/model/gate.rs for the gate itself): the drop-in's host file,
//! each target's markers, and their reset before every boot.

use crate::failpoint::Point;
use crate::fs::host::HostRoot;
use crate::fs::host_dir;
use crate::fs::machine_root::FileKind;
use crate::model::gate::{
    CONTENT, HOST_FILE, MARKER_DIR, RELEASED_BY_POST_START, machine_marker_dir,
};
use crate::model::{Action, Change, Check};
use crate::types::machine_name::MachineName;
use crate::types::paths::UnitName;
use anyhow::{Context as _, Result, bail};
use std::ffi::OsString;
use std::path::Path;

/// The directory of [`HOST_FILE`]: ours, root-owned and writable by root alone (shared with the
/// lock directory), verified, so the drop-in nspawn binds into the machine cannot have been
/// swapped by another user.
fn host_file_dir() -> Result<String> {
    Ok(Path::new(HOST_FILE)
        .parent()
        .context("gate file has a parent")?
        .to_string_lossy()
        .into_owned())
}

/// Whether [`HOST_FILE`] under `host` holds [`CONTENT`] in its verified directory: what
/// [`write_host_file`] leaves alone. Reads only.
pub(crate) fn host_file_current(host: &HostRoot) -> Result<bool> {
    Ok(
        host_dir::check(host, &host_file_dir()?, host_dir::PARENT_MODE)?.is_some()
            && host.holds(HOST_FILE, CONTENT.as_bytes(), 0o644)?,
    )
}

/// Write [`HOST_FILE`] under `host` unless it already holds [`CONTENT`]. Returns whether it wrote.
pub(crate) fn write_host_file(host: &HostRoot) -> Result<bool> {
    host_dir::open(host, &host_file_dir()?, host_dir::PARENT_MODE)?;
    host.write_if_changed(
        HOST_FILE,
        CONTENT.as_bytes(),
        0o644,
        Point::PreStartMidGateWrite,
    )
}

/// One target's markers, as host paths: a machine's ([`machine_marker_dir`], what its `/run`
/// shows at [`MARKER_DIR`]) or the host's own ([`MARKER_DIR`], host mode).
pub struct Markers<'a> {
    host: &'a HostRoot,
    dir: String,
}

impl<'a> Markers<'a> {
    /// The markers of `machine`, kept on the host.
    pub(crate) fn of_machine(host: &'a HostRoot, machine: &MachineName) -> Self {
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
    pub(crate) fn is_released(&self, unit: &UnitName) -> Result<bool> {
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
        // Released is released: pre-start's marker for the boot ahead is kept as it is (status
        // judges the marker's presence, as systemd's ConditionPathExists= does).
        if self.is_released(unit)? {
            return Ok(false);
        }
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

/// A machine's marker directory as found before its boot ([`observe_boot`]): its entries
/// (`None`: no directory), and whether the marker the boot ahead releases holds its text.
#[derive(Debug)]
pub struct BootMarkers {
    dir: String,
    entries: Option<Vec<(OsString, FileKind)>>,
    released_holds: bool,
}

/// Read `machine`'s marker directory for the boot ahead, which releases `containerd` when
/// given. Reads only: the directory verified as ours ([`host_dir::check`]), not created.
pub(crate) fn observe_boot(
    host: &HostRoot,
    machine: &MachineName,
    containerd: Option<&UnitName>,
) -> Result<BootMarkers> {
    let dir = machine_marker_dir(machine);
    let entries = match host_dir::check(host, &dir, host_dir::PARENT_MODE)? {
        None => None,
        Some(_) => Some(
            host.read_dir(&dir)
                .with_context(|| format!("listing {}", host.path(&dir).display()))?,
        ),
    };
    let released_holds = match containerd {
        Some(unit) if entries.is_some() => {
            host.holds(format!("{dir}/{unit}"), boot_marker(unit).as_bytes(), 0o644)?
        }
        _ => false,
    };
    Ok(BootMarkers {
        dir,
        entries,
        released_holds,
    })
}

impl BootMarkers {
    /// What the boot ahead changes here, in order: the directory made, each marker of the last
    /// boot removed (but `containerd`'s, rewritten only if its bytes differ), `containerd`
    /// released; a directory among them, which nspawn-lifecycle never puts there, a change that
    /// fails. Pure.
    pub fn changes(&self, containerd: Option<&UnitName>) -> Vec<Change> {
        let dir = &self.dir;
        let change = |action, path: String, why: &str| Change::new(Check::Gate, action, path, why);
        let mut out = Vec::new();
        match &self.entries {
            None => out.push(change(Action::Create, dir.clone(), "the boot's markers")),
            Some(entries) => {
                for (name, kind) in entries {
                    let path = format!("{dir}/{}", name.to_string_lossy());
                    if *kind == FileKind::Dir {
                        out.push(change(
                            Action::Fails,
                            path,
                            "a directory, which nspawn-lifecycle never puts there; remove it",
                        ));
                    } else if containerd.is_none_or(|u| name.as_os_str() != u.as_str()) {
                        out.push(change(
                            Action::Remove,
                            path,
                            "a marker of the last boot: the boot ahead is gated afresh",
                        ));
                    }
                }
            }
        }
        if let Some(unit) = containerd
            && !self.released_holds
        {
            out.push(change(
                Action::Release,
                format!("{dir}/{unit}"),
                "released for the boot ahead",
            ));
        }
        out
    }
}

/// pre-start, before every start of `machine` whose `.nspawn` file binds the gate: empty the
/// machine's marker directory (a new boot is gated afresh) and, with `containerd`, release that
/// unit for the boot ahead: pre-start has just built or checked the driver root the file binds,
/// so containerd may start as early as a bare boot would start it. kubelet's marker
/// stays post-start's: kubelet waits for the staged images, which need the running machine.
/// Makes exactly [`BootMarkers::changes`] of what it reads; a directory among the markers is
/// refused before anything is removed. Returns the markers' directory.
pub(crate) fn prepare_boot(
    host: &HostRoot,
    machine: &MachineName,
    containerd: Option<&UnitName>,
) -> Result<String> {
    let changes = observe_boot(host, machine, containerd)?.changes(containerd);
    if let Some(c) = changes.iter().find(|c| c.action == Action::Fails) {
        bail!("{} is {}", c.path, c.detail);
    }
    let markers = Markers::of_machine(host, machine);
    for c in &changes {
        match (c.action, containerd) {
            // Ours, root-owned and writable by root alone, like the unit gate's drop-in.
            (Action::Create, _) => {
                host_dir::open(host, &markers.dir, host_dir::PARENT_MODE)?;
            }
            (Action::Remove, _) => {
                host.remove_file(&c.path)?;
            }
            (Action::Release, Some(unit)) => {
                markers.write(unit, &boot_marker(unit), Point::PreStartMidGateRelease)?;
            }
            _ => {}
        }
    }
    Ok(markers.dir)
}

/// The text of the marker [`prepare_boot`] writes for `unit`.
pub(crate) fn boot_marker(unit: &UnitName) -> String {
    format!("nspawn-lifecycle pre-start released {unit} for the next boot\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::machine_root::MachineRoot;
    use crate::model::gate::{dropin, is_gated, is_released, marker};

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
                Markers::of_machine(&host, &"kube1".parse().unwrap()),
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
        let markers = Markers::of_machine(&host, &"kube1".parse().unwrap());
        let p = Point::PostStartMidGateRelease;
        markers.release(&containerd, p).unwrap();
        markers.release(&kubelet, p).unwrap();
        let there = dir
            .path()
            .join("run/nspawn-lifecycle/machines/kube1/released");
        std::os::unix::fs::symlink("/etc/passwd", there.join("planted")).unwrap();
        assert_eq!(
            prepare_boot(&host, &"kube1".parse().unwrap(), Some(&containerd)).unwrap(),
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
        prepare_boot(&host, &"kube1".parse().unwrap(), None).unwrap();
        assert_eq!(std::fs::read_dir(&there).unwrap().count(), 0);
        // A directory there is nobody's doing of ours: named, never removed.
        std::fs::create_dir(there.join("odd")).unwrap();
        let err = format!(
            "{:#}",
            prepare_boot(&host, &"kube1".parse().unwrap(), None).unwrap_err()
        );
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
