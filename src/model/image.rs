//! The machine's image as systemd-nspawn finds it for `--machine=<m>`, and whether its files are
//! still owned by the host's root.
//!
//! pre-start, `plan` and `install` look the image up before anything else: a mistyped machine
//! name (`pre-start kbue1`) must not render `/etc/systemd/nspawn/kbue1.nspawn` with GPU binds, and
//! a rootfs an earlier `-U` start shifted to a private UID range must not be started with
//! `PrivateUsers=no`, where root in the machine would own none of its files.

use crate::config::MachineConfig;
use crate::error::bad_input;
use crate::fs::host::HostRoot;
use crate::types::machine_name::MachineName;
use anyhow::{Context as _, Result};
use std::os::unix::fs::MetadataExt as _;

/// Where systemd-nspawn and machined look for an image named on `--machine=` (systemd-nspawn(1),
/// machinectl(1) "Files and directories"), in their order.
pub const SEARCH_DIRS: [&str; 5] = [
    "/etc/machines",
    "/run/machines",
    "/var/lib/machines",
    "/usr/local/lib/machines",
    "/usr/lib/machines",
];

/// What kind of image was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageKind {
    /// A directory (or btrfs subvolume) holding the rootfs.
    Directory,
    /// A disk image `<m>.raw`.
    Raw,
}

/// A machine image on the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Image {
    /// Host path (as the host sees it, not under `--host-root`).
    pub path: String,
    pub kind: ImageKind,
}

/// The paths looked at for `machine`, in order: the configured `directory` when it is not one of
/// the standard places, then `<dir>/<m>` and `<dir>/<m>.raw` for each of [`SEARCH_DIRS`].
pub fn candidates(machine: &MachineName, mc: &MachineConfig) -> Vec<(String, ImageKind)> {
    let mut out = Vec::new();
    for dir in SEARCH_DIRS {
        out.push((format!("{dir}/{machine}"), ImageKind::Directory));
        out.push((format!("{dir}/{machine}.raw"), ImageKind::Raw));
    }
    if !out.iter().any(|(p, _)| mc.directory == *p) {
        out.insert(0, (mc.directory.to_string(), ImageKind::Directory));
    }
    out
}

/// Find `machine`'s image; none is bad input (exit 2) naming every place looked at. Symlinks are
/// followed, as systemd follows them (the host is trusted).
pub fn find(host: &HostRoot, machine: &MachineName, mc: &MachineConfig) -> Result<Image> {
    let all = candidates(machine, mc);
    for (path, kind) in &all {
        let Ok(md) = host.metadata(path) else {
            continue;
        };
        let fits = match kind {
            ImageKind::Directory => md.is_dir(),
            ImageKind::Raw => md.is_file(),
        };
        if fits {
            return Ok(Image {
                path: path.clone(),
                kind: *kind,
            });
        }
    }
    let configured = if all.len() > 2 * SEARCH_DIRS.len() {
        format!(" (nor {}, the configured directory)", mc.directory)
    } else {
        String::new()
    };
    Err(bad_input(format!(
        "machine {machine}: no machine image found: no directory {machine} or image \
         {machine}.raw in {}{configured}. Check the machine name, or create the image first \
         (machinectl import-tar/pull-tar, or set machines.{machine}.directory in {}); \
         nothing was written",
        SEARCH_DIRS.join(", "),
        mc.config_file,
    )))
}

/// Refuse a directory image whose root is not owned by UID 0 and GID 0: a start with user
/// namespacing (the stock unit's `-U`, `PrivateUsers=pick`) chowned it to a private range, and
/// with the `PrivateUsers=no` we render root in the machine would own none of its files (its
/// setuid `mount` fails). The message gives the command that shifts it back. A `.raw` image is
/// not checked: its files are only visible once mounted.
pub fn check_not_shifted(host: &HostRoot, machine: &MachineName, image: &Image) -> Result<()> {
    if image.kind != ImageKind::Directory {
        return Ok(());
    }
    let md = host
        .metadata(&image.path)
        .with_context(|| format!("stat {}", image.path))?;
    if md.uid() == 0 && md.gid() == 0 {
        return Ok(());
    }
    Err(bad_input(format!(
        "machine {machine}: its root directory {path} is owned by UID {uid} GID {gid}, not by \
         root: an earlier start with user namespacing (the stock unit's -U, or \
         PrivateUsers=pick) shifted every file in it to a private UID range, and with \
         PrivateUsers=no root in the machine would own none of its files (setuid programs such \
         as mount fail). With the machine stopped, shift it back once with \
         `{cmd}`, then start it again; nothing was written",
        path = image.path,
        uid = md.uid(),
        gid = md.gid(),
        cmd = shift_back_command(&image.path),
    )))
}

/// The command that chowns a shifted rootfs back to UIDs 0–65535: nspawn with a user namespace
/// of base 0 and `chown` ownership rewrites every file from the range the root is owned by,
/// then runs `/bin/true`. `--settings=no` keeps the machine's `.nspawn` file (binds,
/// `PrivateUsers=no`) out of that one run.
pub fn shift_back_command(path: &str) -> String {
    format!(
        "systemd-nspawn --directory={path} --settings=no --private-users=0 \
         --private-users-ownership=chown /bin/true"
    )
}

/// [`find`] then [`check_not_shifted`]: what pre-start, `plan` and `install` require.
pub fn require(host: &HostRoot, machine: &MachineName, mc: &MachineConfig) -> Result<Image> {
    let image = find(host, machine, mc)?;
    check_not_shifted(host, machine, &image)?;
    Ok(image)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::error::exit_code;

    fn setup() -> (tempfile::TempDir, HostRoot) {
        let dir = tempfile::tempdir().unwrap();
        let host = HostRoot::new(dir.path());
        (dir, host)
    }

    fn mc(host: &HostRoot, m: &MachineName, config: &str) -> MachineConfig {
        Config::parse(config.as_bytes())
            .unwrap()
            .machine(host, m)
            .unwrap()
    }

    #[test]
    fn a_missing_image_names_every_place_looked_at() {
        let (_d, host) = setup();
        let m: MachineName = "kbue1".parse().unwrap();
        let err = find(&host, &m, &mc(&host, &m, "{}")).unwrap_err();
        assert_eq!(exit_code(&err), 2);
        let msg = format!("{err:#}");
        for dir in SEARCH_DIRS {
            assert!(msg.contains(dir), "{msg}");
        }
        assert!(
            msg.contains("no directory kbue1 or image kbue1.raw"),
            "{msg}"
        );
        assert!(!msg.contains("configured directory"), "{msg}");

        let conf = r#"{"machines": {"kbue1": {"directory": "/srv/kbue1"}}}"#;
        let err = find(&host, &m, &mc(&host, &m, conf)).unwrap_err();
        assert!(
            format!("{err:#}").contains("nor /srv/kbue1, the configured directory"),
            "{err:#}"
        );
    }

    #[test]
    fn images_are_found_where_nspawn_looks() {
        let (d, host) = setup();
        let m: MachineName = "kube1".parse().unwrap();
        let cfg = mc(&host, &m, "{}");
        // A regular file named like a directory image is not one; a .raw file is.
        std::fs::create_dir_all(d.path().join("etc/machines")).unwrap();
        std::fs::write(d.path().join("etc/machines/kube1"), "").unwrap();
        std::fs::create_dir_all(d.path().join("usr/lib/machines")).unwrap();
        std::fs::write(d.path().join("usr/lib/machines/kube1.raw"), "").unwrap();
        assert_eq!(
            find(&host, &m, &cfg).unwrap(),
            Image {
                path: "/usr/lib/machines/kube1.raw".into(),
                kind: ImageKind::Raw
            }
        );
        // The standard directory comes first in nspawn's order.
        std::fs::create_dir_all(d.path().join("var/lib/machines/kube1")).unwrap();
        assert_eq!(
            find(&host, &m, &cfg).unwrap().path,
            "/var/lib/machines/kube1"
        );
        // A configured directory elsewhere is looked at first.
        std::fs::create_dir_all(d.path().join("srv/k")).unwrap();
        let cfg = mc(&host, &m, r#"{"defaults": {"directory": "/srv/k"}}"#);
        assert_eq!(find(&host, &m, &cfg).unwrap().path, "/srv/k");
    }

    #[test]
    fn privileged_a_shifted_root_is_refused_with_the_command_that_shifts_it_back() {
        assert!(
            nix::unistd::geteuid().is_root(),
            "this test chowns a directory and needs root"
        );
        let (d, host) = setup();
        let m: MachineName = "kube1".parse().unwrap();
        let root = d.path().join("var/lib/machines/kube1");
        std::fs::create_dir_all(&root).unwrap();
        let cfg = mc(&host, &m, "{}");
        require(&host, &m, &cfg).unwrap();
        std::os::unix::fs::chown(&root, Some(468_254_720), Some(468_254_720)).unwrap();
        let err = require(&host, &m, &cfg).unwrap_err();
        assert_eq!(exit_code(&err), 2);
        let msg = format!("{err:#}");
        assert!(
            msg.contains("/var/lib/machines/kube1 is owned by UID 468254720 GID 468254720"),
            "{msg}"
        );
        assert!(
            msg.contains(
                "`systemd-nspawn --directory=/var/lib/machines/kube1 --settings=no \
                 --private-users=0 --private-users-ownership=chown /bin/true`"
            ),
            "{msg}"
        );
        // A group-only shift is a shift too.
        std::os::unix::fs::chown(&root, Some(0), Some(468_254_720)).unwrap();
        assert!(require(&host, &m, &cfg).is_err());
    }
}
