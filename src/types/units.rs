//! Where systemd finds a machine's unit and files on the host: the unit name, its drop-in
//! directory and our drop-in there, and the machine's `.nspawn` file. install writes these
//! paths, uninstall removes them, reconcile and status look them up; none of them owns them.

use crate::types::machine_name::MachineName;

/// File name of our drop-in. `50-` sorts before `override.conf` (what `systemctl edit` writes),
/// so an operator's own edits still win.
pub(crate) const DROPIN_NAME: &str = "50-nspawn-lifecycle.conf";
/// Where unit drop-ins for the machine units live (under the host root).
pub(crate) const UNIT_DIR: &str = "/etc/systemd/system";

/// Name of the unit that runs `machine`.
pub(crate) fn unit_name(machine: &MachineName) -> String {
    format!("systemd-nspawn@{machine}.service")
}

/// Host path of the machine unit's drop-in directory.
pub(crate) fn dropin_dir(machine: &MachineName) -> String {
    format!("{UNIT_DIR}/{}.d", unit_name(machine))
}

/// Host path of our drop-in for `machine`.
pub fn dropin_path(machine: &MachineName) -> String {
    format!("{}/{DROPIN_NAME}", dropin_dir(machine))
}

/// The machine a drop-in directory under [`UNIT_DIR`] belongs to, from its name
/// (`systemd-nspawn@<m>.service.d`): `""` for the template's, `None` for another unit's.
pub(crate) fn dropin_dir_machine(name: &str) -> Option<&str> {
    name.strip_prefix("systemd-nspawn@")?
        .strip_suffix(".service.d")
}

/// Host path of the template unit's drop-in directory, which systemd merges with every
/// machine's by file name.
pub(crate) fn template_dropin_dir() -> String {
    format!("{UNIT_DIR}/systemd-nspawn@.service.d")
}

/// Directory of trusted `.nspawn` files (read by systemd-nspawn at every exec).
pub(crate) const NSPAWN_DIR: &str = "/etc/systemd/nspawn";

/// Host path of a machine's `.nspawn` file.
pub fn nspawn_path(machine: &MachineName) -> String {
    format!("{NSPAWN_DIR}/{machine}.nspawn")
}

/// Whether this process is a hook of a start of `machine`'s unit (its `ExecStartPre=` or
/// `ExecStartPost=`), as opposed to a command run by hand. During the unit's start no earlier boot
/// of the machine runs, so the unit gate's markers are this boot's: pre-start resets them and
/// post-start takes containerd's release by pre-start as this boot's. Run by hand (from any other
/// cgroup) the machine may be running: pre-start leaves the markers alone and post-start takes the
/// gated order, stopping and restarting both services as it always did.
pub(crate) fn runs_in_its_start(machine: &MachineName) -> bool {
    // A /proc magic path, not a host-root one.
    match std::fs::read_to_string("/proc/self/cgroup") {
        Ok(text) => in_unit_cgroup(&text, &unit_name(machine)),
        Err(e) => {
            tracing::warn!(%machine, "reading /proc/self/cgroup: {e}; taken as run by hand");
            false
        }
    }
}

/// Whether `/proc/self/cgroup` (`text`) puts this process in `unit`'s cgroup: its own, or the
/// `.control` subgroup systemd runs the control processes of a delegated unit (nspawn's) in.
fn in_unit_cgroup(text: &str, unit: &str) -> bool {
    text.lines().any(|line| {
        let path = line.splitn(3, ':').nth(2).unwrap_or("");
        let comps: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
        matches!(comps.as_slice(), [.., last] if *last == unit)
            || matches!(comps.as_slice(), [.., u, ".control"] if *u == unit)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_machines_own_unit_is_its_start() {
        let unit = "systemd-nspawn@kube1.service";
        let slice = "0::/system.slice/system-systemd\\x2dnspawn.slice";
        assert!(in_unit_cgroup(&format!("{slice}/{unit}\n"), unit));
        assert!(in_unit_cgroup(&format!("{slice}/{unit}/.control\n"), unit));
        assert!(in_unit_cgroup(
            &format!("12:pids:/\n1:name=systemd:/system.slice/{unit}\n"),
            unit
        ));
        // By hand from a login session, another machine's start, the machine's own payload.
        assert!(!in_unit_cgroup(
            "0::/user.slice/user-0.slice/session-3.scope\n",
            unit
        ));
        assert!(!in_unit_cgroup(
            &format!("{slice}/systemd-nspawn@kube2.service\n"),
            unit
        ));
        assert!(!in_unit_cgroup(
            &format!("{slice}/{unit}/payload/system.slice/x.service\n"),
            unit
        ));
        assert!(!in_unit_cgroup("", unit));
    }

    #[test]
    fn paths_are_exact() {
        let m: MachineName = "kube1".parse().unwrap();
        assert_eq!(unit_name(&m), "systemd-nspawn@kube1.service");
        assert_eq!(
            dropin_dir(&m),
            "/etc/systemd/system/systemd-nspawn@kube1.service.d"
        );
        assert_eq!(
            dropin_path(&m),
            "/etc/systemd/system/systemd-nspawn@kube1.service.d/50-nspawn-lifecycle.conf"
        );
        assert_eq!(nspawn_path(&m), "/etc/systemd/nspawn/kube1.nspawn");
        let name = |dir: &str| dir.rsplit('/').next().unwrap().to_owned();
        assert_eq!(dropin_dir_machine(&name(&dropin_dir(&m))), Some("kube1"));
        assert_eq!(dropin_dir_machine(&name(&template_dropin_dir())), Some(""));
        assert_eq!(dropin_dir_machine("kubelet.service.d"), None);
        assert_eq!(dropin_dir_machine("systemd-nspawn@kube1.service"), None);
    }
}
