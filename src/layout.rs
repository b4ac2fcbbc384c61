//! Where host driver files appear inside the machine, and where they belong in a driver install.
//!
//! One mapping shared by the `.nspawn` renderer (which binds host paths under
//! `/run/host-nvidia`), the driver-root builder and the CDI spec (which point at those binds).

use crate::discovery::UserspaceDriver;
use crate::paths::{HostPath, MachinePath};

/// Where the machine sees host driver files (bound read-only by the `.nspawn` file).
pub const HOST_NVIDIA: &str = "/run/host-nvidia";
/// The driver root built inside the machine: shaped like a host driver install.
pub const DRIVER_ROOT: &str = "/run/nvidia/driver";

/// Where the machine sees this helper, bound read-only from its stable host path at every start:
/// the CDI spec names it as the OCI hook binary (`cdi-hook …`), since the machine has no
/// `nvidia-cdi-hook`. Outside [`HOST_NVIDIA`] so the driver binds never touch it.
pub const HOOK_BINARY: &str = "/run/nspawn-lifecycle/nspawn-lifecycle-helper";

/// The bind of the helper at `helper` (its stable host path) to [`HOOK_BINARY`].
pub fn hook_bind(helper: &HostPath) -> Bind {
    Bind {
        source: helper.clone(),
        target: HOOK_BINARY
            .parse()
            .expect("HOOK_BINARY is a valid machine path"),
        read_only: true,
    }
}

/// A host path bound into the machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bind {
    pub source: HostPath,
    pub target: MachinePath,
    pub read_only: bool,
}

/// A path under [`HOST_NVIDIA`] built from checked parts: a number, a driver version
/// (`parse::is_version`) or the file name of a checked host path.
fn under_host_nvidia(rel: &str) -> MachinePath {
    format!("{HOST_NVIDIA}/{rel}")
        .parse()
        .expect("numbers, versions and file names of checked paths make valid machine paths")
}

/// The binds that carry the userspace driver into the machine, in a stable order:
/// library directories (numbered in discovery order), binaries, firmware, IPC socket directories.
pub fn driver_binds(driver: &UserspaceDriver) -> Vec<Bind> {
    let mut binds = Vec::new();
    for (i, dir) in driver.lib_dirs.iter().enumerate() {
        binds.push(Bind {
            source: dir.path.clone(),
            target: under_host_nvidia(&format!("lib/{i}")),
            read_only: true,
        });
    }
    for bin in &driver.binaries {
        binds.push(Bind {
            source: bin.clone(),
            target: under_host_nvidia(&format!("bin/{}", basename(bin))),
            read_only: true,
        });
    }
    if let Some(fw) = &driver.firmware {
        binds.push(Bind {
            source: fw.clone(),
            target: under_host_nvidia(&format!("firmware/{}", driver.version)),
            read_only: true,
        });
    }
    // Whole socket directories, not the sockets: a daemon restart replaces the socket inode,
    // which would leave a bind of the old socket dead. Read-only: connect(2) to a unix socket
    // needs write permission on the socket, not a writable mount, so clients still connect, while
    // the machine can no longer create, replace or remove files in the host daemons' directories.
    for dir in &driver.sockets {
        binds.push(Bind {
            source: dir.clone(),
            target: under_host_nvidia(&format!("run/{}", basename(dir))),
            read_only: true,
        });
    }
    binds
}

/// What a driver entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    /// A library file (`source` is its path under [`HOST_NVIDIA`]).
    Library,
    /// A SONAME link: `source` is the file name it points at, in the same directory.
    SonameLink,
    /// An executable (`source` under [`HOST_NVIDIA`]).
    Binary,
    /// The firmware directory (`source` under [`HOST_NVIDIA`]).
    Firmware,
    /// An IPC socket (`source` under [`HOST_NVIDIA`]).
    Socket,
}

/// One piece of a driver install, at its standard path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub kind: EntryKind,
    /// Standard absolute path in a driver install or container: `/usr/lib/x86_64-linux-gnu/libcuda.so.1`.
    pub path: String,
    /// See [`EntryKind`].
    pub source: String,
}

/// The socket file name each IPC directory holds.
const SOCKET_NAME: &str = "socket";

/// Every piece of the driver at its standard path, in a stable order: per library directory its
/// files then their SONAME links, then binaries, firmware and sockets.
pub fn driver_entries(driver: &UserspaceDriver) -> Vec<Entry> {
    let mut out = Vec::new();
    for (i, dir) in driver.lib_dirs.iter().enumerate() {
        let std_dir = format!("/usr/lib/{}", dir.triplet);
        for f in &dir.files {
            out.push(Entry {
                kind: EntryKind::Library,
                path: format!("{std_dir}/{}", f.name),
                source: format!("{HOST_NVIDIA}/lib/{i}/{}", f.name),
            });
        }
        for f in &dir.files {
            if let Some(soname) = &f.soname {
                let (sub, file) = split_dir(&f.name);
                out.push(Entry {
                    kind: EntryKind::SonameLink,
                    path: format!("{std_dir}/{sub}{soname}"),
                    source: file.to_owned(),
                });
            }
        }
    }
    for bin in &driver.binaries {
        let name = basename(bin);
        out.push(Entry {
            kind: EntryKind::Binary,
            path: format!("/usr/bin/{name}"),
            source: format!("{HOST_NVIDIA}/bin/{name}"),
        });
    }
    if driver.firmware.is_some() {
        out.push(Entry {
            kind: EntryKind::Firmware,
            path: format!("/lib/firmware/nvidia/{}", driver.version),
            source: format!("{HOST_NVIDIA}/firmware/{}", driver.version),
        });
    }
    for dir in &driver.sockets {
        let name = basename(dir);
        out.push(Entry {
            kind: EntryKind::Socket,
            path: format!("/run/{name}/{SOCKET_NAME}"),
            source: format!("{HOST_NVIDIA}/run/{name}/{SOCKET_NAME}"),
        });
    }
    out
}

fn basename(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// `vdpau/libx.so.1` → (`vdpau/`, `libx.so.1`); `libx.so.1` → (``, `libx.so.1`).
fn split_dir(name: &str) -> (&str, &str) {
    match name.rfind('/') {
        Some(i) => (&name[..=i], &name[i + 1..]),
        None => ("", name),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discovery::{DriverFile, LibDir};

    fn driver() -> UserspaceDriver {
        UserspaceDriver {
            version: "580.82.07".into(),
            lib_dirs: vec![LibDir {
                path: "/usr/lib/x86_64-linux-gnu".parse().unwrap(),
                triplet: "x86_64-linux-gnu".into(),
                files: vec![
                    DriverFile {
                        name: "libcuda.so.580.82.07".into(),
                        soname: Some("libcuda.so.1".into()),
                    },
                    DriverFile {
                        name: "vdpau/libvdpau_nvidia.so.580.82.07".into(),
                        soname: Some("libvdpau_nvidia.so.1".into()),
                    },
                ],
            }],
            binaries: vec!["/usr/bin/nvidia-smi".parse().unwrap()],
            firmware: Some("/lib/firmware/nvidia/580.82.07".parse().unwrap()),
            sockets: vec!["/run/nvidia-persistenced".parse().unwrap()],
        }
    }

    #[test]
    fn no_driver_bind_is_writable() {
        // The machine's root must not write into the host daemons' socket directories (or any
        // other driver path): every driver bind is read-only, sockets included.
        let mut d = driver();
        d.sockets.push("/run/nvidia-fabricmanager".parse().unwrap());
        let writable: Vec<_> = driver_binds(&d)
            .into_iter()
            .filter(|b| !b.read_only)
            .map(|b| b.source)
            .collect();
        assert!(writable.is_empty(), "writable driver binds: {writable:?}");
    }

    #[test]
    fn binds_and_entries_agree() {
        let d = driver();
        let binds = driver_binds(&d);
        let targets: Vec<_> = binds.iter().map(|b| b.target.as_str()).collect();
        assert_eq!(
            targets,
            [
                "/run/host-nvidia/lib/0",
                "/run/host-nvidia/bin/nvidia-smi",
                "/run/host-nvidia/firmware/580.82.07",
                "/run/host-nvidia/run/nvidia-persistenced"
            ]
        );
        let entries = driver_entries(&d);
        let got: Vec<_> = entries
            .iter()
            .map(|e| (e.path.as_str(), e.source.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                (
                    "/usr/lib/x86_64-linux-gnu/libcuda.so.580.82.07",
                    "/run/host-nvidia/lib/0/libcuda.so.580.82.07"
                ),
                (
                    "/usr/lib/x86_64-linux-gnu/vdpau/libvdpau_nvidia.so.580.82.07",
                    "/run/host-nvidia/lib/0/vdpau/libvdpau_nvidia.so.580.82.07"
                ),
                (
                    "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
                    "libcuda.so.580.82.07"
                ),
                (
                    "/usr/lib/x86_64-linux-gnu/vdpau/libvdpau_nvidia.so.1",
                    "libvdpau_nvidia.so.580.82.07"
                ),
                ("/usr/bin/nvidia-smi", "/run/host-nvidia/bin/nvidia-smi"),
                (
                    "/lib/firmware/nvidia/580.82.07",
                    "/run/host-nvidia/firmware/580.82.07"
                ),
                (
                    "/run/nvidia-persistenced/socket",
                    "/run/host-nvidia/run/nvidia-persistenced/socket"
                ),
            ]
        );
    }
}
