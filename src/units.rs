//! Where systemd finds a machine's unit and files on the host: the unit name, its drop-in
//! directory and our drop-in there, and the machine's `.nspawn` file. install writes these
//! paths, uninstall removes them, reconcile and status look them up; none of them owns them.

use crate::machine_name::MachineName;

/// File name of our drop-in. `50-` sorts before `override.conf` (what `systemctl edit` writes),
/// so an operator's own edits still win.
pub const DROPIN_NAME: &str = "50-nspawn-lifecycle.conf";
/// Where unit drop-ins for the machine units live (under the host root).
pub const UNIT_DIR: &str = "/etc/systemd/system";

/// Name of the unit that runs `machine`.
pub fn unit_name(machine: &MachineName) -> String {
    format!("systemd-nspawn@{machine}.service")
}

/// Host path of the machine unit's drop-in directory.
pub fn dropin_dir(machine: &MachineName) -> String {
    format!("{UNIT_DIR}/{}.d", unit_name(machine))
}

/// Host path of our drop-in for `machine`.
pub fn dropin_path(machine: &MachineName) -> String {
    format!("{}/{DROPIN_NAME}", dropin_dir(machine))
}

/// The machine a drop-in directory under [`UNIT_DIR`] belongs to, from its name
/// (`systemd-nspawn@<m>.service.d`): `""` for the template's, `None` for another unit's.
pub fn dropin_dir_machine(name: &str) -> Option<&str> {
    name.strip_prefix("systemd-nspawn@")?
        .strip_suffix(".service.d")
}

/// Host path of the template unit's drop-in directory, which systemd merges with every
/// machine's by file name.
pub fn template_dropin_dir() -> String {
    format!("{UNIT_DIR}/systemd-nspawn@.service.d")
}

/// Directory of trusted `.nspawn` files (read by systemd-nspawn at every exec).
pub const NSPAWN_DIR: &str = "/etc/systemd/nspawn";

/// Host path of a machine's `.nspawn` file.
pub fn nspawn_path(machine: &MachineName) -> String {
    format!("{NSPAWN_DIR}/{machine}.nspawn")
}

#[cfg(test)]
mod tests {
    use super::*;

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
