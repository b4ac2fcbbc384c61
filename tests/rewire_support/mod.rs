//! Fixtures shared by the rewire and hostile-rootfs tests: a Debian-like machine root described
//! here and built at test time, inventories built directly, listings and checksums of trees.
#![allow(dead_code, clippy::unwrap_used)] // test fixtures: a panic is the failure report

use nspawn_lifecycle::apply::rewire::{self, Report};
use nspawn_lifecycle::discovery::{
    DeviceNode, DeviceRole, DriverFile, Gpu, Inventory, LibDir, UserspaceDriver, Verdict,
};
use nspawn_lifecycle::fs::machine_root::MachineRoot;
use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt as _, symlink};
use std::path::{Path, PathBuf};

pub const OLD: &str = "580.82.07";
pub const NEW: &str = "580.95.05";
pub const CDI_DIR: &str = "/var/run/cdi";
pub const CDI_FILE: &str = "nvidia.com-gpu.json";

/// A host with one GPU and driver `version`: x86_64 libraries (with a `vdpau/` one), i386
/// libraries the machine has no dir for, two binaries, firmware and the persistenced socket.
pub fn inventory(version: &str) -> Inventory {
    let lib = |name: &str, soname: Option<&str>| DriverFile {
        name: format!("{name}.so.{version}"),
        soname: soname.map(str::to_owned),
    };
    let dev = |path: &str, major, minor, role| DeviceNode {
        path: path.parse().unwrap(),
        major,
        minor,
        role,
    };
    Inventory {
        devices: vec![
            dev("/dev/dri/card1", 226, 1, DeviceRole::Dri),
            dev("/dev/dri/renderD128", 226, 128, DeviceRole::Dri),
            dev("/dev/nvidia-caps/nvidia-cap1", 511, 1, DeviceRole::Cap),
            dev("/dev/nvidia-uvm", 508, 0, DeviceRole::Uvm),
            dev("/dev/nvidia-uvm-tools", 508, 1, DeviceRole::UvmTools),
            dev("/dev/nvidia0", 195, 0, DeviceRole::Gpu),
            dev("/dev/nvidiactl", 195, 255, DeviceRole::Control),
        ],
        kvm: None,
        host_devices: Vec::new(),
        disks: Vec::new(),
        gpus: vec![Gpu {
            index: 0,
            minor: 0,
            uuid: "GPU-edfee158-11c1-52b8-0517-92f30e7fac88".into(),
            bus_id: "0000:06:00.0".into(),
            model: "NVIDIA A10".into(),
            device: Some("/dev/nvidia0".into()),
            dri: vec!["/dev/dri/card1".into(), "/dev/dri/renderD128".into()],
            mig_caps: Vec::new(),
        }],
        kernel_module: Some(version.into()),
        driver: Some(UserspaceDriver {
            version: version.into(),
            lib_dirs: vec![
                LibDir {
                    path: "/usr/lib/x86_64-linux-gnu".parse().unwrap(),
                    triplet: "x86_64-linux-gnu".into(),
                    files: vec![
                        lib("libcuda", Some("libcuda.so.1")),
                        lib("libnvidia-glcore", None),
                        lib("libnvidia-ml", Some("libnvidia-ml.so.1")),
                        lib("vdpau/libvdpau_nvidia", Some("libvdpau_nvidia.so.1")),
                    ],
                },
                LibDir {
                    path: "/usr/lib/i386-linux-gnu".parse().unwrap(),
                    triplet: "i386-linux-gnu".into(),
                    files: vec![lib("libcuda", Some("libcuda.so.1"))],
                },
            ],
            binaries: vec![
                "/usr/bin/nvidia-persistenced".parse().unwrap(),
                "/usr/bin/nvidia-smi".parse().unwrap(),
            ],
            firmware: Some(
                format!("/lib/firmware/nvidia/{version}")
                    .try_into()
                    .unwrap(),
            ),
            sockets: vec!["/run/nvidia-persistenced".parse().unwrap()],
            runtime: Vec::new(),
        }),
        verdict: Verdict::Complete,
    }
}

/// What a CDI spec of ours looks like to these tests (the CDI module renders the real one).
pub fn spec(version: &str) -> Vec<u8> {
    format!("{{\"cdiVersion\":\"0.5.0\",\"kind\":\"nvidia.com/gpu\",\"driver\":\"{version}\"}}\n")
        .into_bytes()
}

/// The conflict predicate the CDI module would supply: another spec of our kind.
pub fn conflicts(_name: &str, bytes: &[u8]) -> bool {
    String::from_utf8_lossy(bytes).contains("\"nvidia.com/gpu\"")
}

/// Build a Debian-like machine root at `root`: merged /usr, `var/run → ../run`, an unrelated
/// library with its SONAME link, links left by a start with an older driver, unrelated and stale
/// CDI specs, a udev-style `/dev/char` and one stale NVIDIA `/dev/char` link of ours.
pub fn debian_machine(root: &Path) {
    let mkdir = |p: &str| std::fs::create_dir_all(root.join(p)).unwrap();
    let write = |p: &str, c: &str| std::fs::write(root.join(p), c).unwrap();
    let link = |t: &str, p: &str| symlink(t, root.join(p)).unwrap();
    for d in [
        "usr/lib/x86_64-linux-gnu/vdpau",
        "usr/bin",
        "etc/cdi",
        "run/cdi",
        "var/lib",
        "dev/char",
        "dev/dri",
    ] {
        mkdir(d);
    }
    link("usr/lib", "lib");
    link("usr/bin", "bin");
    link("../run", "var/run");
    write("etc/passwd", "root:x:0:0:root:/root:/bin/bash\n");
    write("usr/lib/x86_64-linux-gnu/libfoo.so.1.2.3", "ELF foo\n");
    link("libfoo.so.1.2.3", "usr/lib/x86_64-linux-gnu/libfoo.so.1");
    link(
        "/usr/lib/x86_64-linux-gnu/libfoo.so.1.2.3",
        "usr/lib/x86_64-linux-gnu/libfoo.so",
    );
    // Left by a start with driver 570.124.06, before the driver root existed.
    link(
        "/run/host-nvidia/lib/0/libcuda.so.570.124.06",
        "usr/lib/x86_64-linux-gnu/libcuda.so.1",
    );
    link(
        "/run/host-nvidia/lib/0/libcuda.so.570.124.06",
        "usr/lib/x86_64-linux-gnu/libcuda.so.570.124.06",
    );
    link(
        "../../../../run/host-nvidia/lib/0/vdpau/libvdpau_nvidia.so.570.124.06",
        "usr/lib/x86_64-linux-gnu/vdpau/libvdpau_nvidia.so.570.124.06",
    );
    write(
        "usr/lib/x86_64-linux-gnu/vdpau/libvdpau_va_gl.so.1",
        "ELF va_gl\n",
    );
    write(
        "etc/cdi/vendor.json",
        "{\"cdiVersion\":\"0.5.0\",\"kind\":\"vendor.com/device\"}\n",
    );
    write(
        "etc/cdi/nvidia.yaml",
        "cdiVersion: 0.5.0\nkind: \"nvidia.com/gpu\"\n",
    );
    write(
        "run/cdi/nvidia.json",
        "{\"cdiVersion\":\"0.3.0\",\"kind\":\"nvidia.com/gpu\"}\n",
    );
    link("../null", "dev/char/1:3");
    link("../dri/card0", "dev/char/226:0");
    link("/dev/nvidia-modeset", "dev/char/195:254");
}

/// Reports of several parts as one (`step` named anew).
pub fn merged(step: &'static str, reports: Vec<Report>) -> Report {
    let mut out = Report {
        step,
        ..Report::default()
    };
    for r in reports {
        out.created.extend(r.created);
        out.replaced.extend(r.replaced);
        out.removed.extend(r.removed);
        out.kept.extend(r.kept);
        out.skipped.extend(r.skipped);
    }
    out
}

/// post-start's library link and `/dev/char` parts for `inv` (the model's wanted links of its
/// driver and devices), as one report.
pub fn rebuild_links(root: &MachineRoot, inv: &Inventory) -> anyhow::Result<Report> {
    use nspawn_lifecycle::model::links;
    Ok(merged(
        "links",
        vec![
            rewire::lib_links(root, &links::lib_links(inv.driver.as_ref()))?,
            rewire::dev_char(root, &links::dev_char_links(inv), true, None)?,
        ],
    ))
}

/// What post-start's parts write in a machine without a driver (each part against "nothing of
/// ours", in the parts' order: the driver root, the links, `/dev/char`, the spec), as one
/// report.
pub fn cleanup(root: &MachineRoot, cdi_dir: &str, cdi_file: &str) -> anyhow::Result<Report> {
    Ok(merged(
        "cleanup",
        vec![
            rewire::remove_driver_root(root)?,
            rewire::lib_links(root, &Default::default())?,
            rewire::dev_char(root, &Default::default(), false, None)?,
            rewire::remove_spec(root, cdi_dir, cdi_file)?,
        ],
    ))
}

/// [`cleanup`] of host mode: its parts are `/dev/char` and the spec.
pub fn cleanup_host(root: &MachineRoot, cdi_dir: &str, cdi_file: &str) -> anyhow::Result<Report> {
    Ok(merged(
        "cleanup",
        vec![
            rewire::dev_char(root, &Default::default(), false, None)?,
            rewire::remove_spec(root, cdi_dir, cdi_file)?,
        ],
    ))
}

/// post-start's CDI step writing `bytes` as `dir/file`, with `conflicts` deciding which other
/// specs go.
pub fn write_cdi(
    root: &MachineRoot,
    dir: &str,
    file: &str,
    bytes: &[u8],
    conflicts: impl Fn(&str, &[u8]) -> bool,
) -> anyhow::Result<Report> {
    let want = nspawn_lifecycle::model::spec::Want {
        dir: dir.into(),
        file: file.into(),
        kind: "nvidia.com/gpu".into(),
        bytes: Some(bytes.to_vec()),
    };
    rewire::write_cdi(root, &want, conflicts)
}

/// Everything `post-start` writes inside the machine for a host with GPUs, in order (the driver
/// root is nspawn's binds, which post-start only checks: see [`DriverRootBinds`]).
pub fn gpu_pass(root: &MachineRoot, inv: &Inventory) -> Vec<Report> {
    let driver = inv.driver.as_ref().unwrap();
    vec![
        rebuild_links(root, inv).unwrap(),
        write_cdi(root, CDI_DIR, CDI_FILE, &spec(&driver.version), conflicts).unwrap(),
    ]
}

/// One line per entry under `root` (never following symlinks), sorted:
/// `<path> <type> <mode|-> [-> target | <size> bytes]`.
pub fn listing(root: &Path) -> String {
    let mut lines = Vec::new();
    walk(root, root, &mut |rel, meta, path| {
        let ft = meta.file_type();
        let line = if ft.is_symlink() {
            let t = std::fs::read_link(path).unwrap();
            format!("{rel} l -> {}", t.display())
        } else if ft.is_dir() {
            format!("{rel} d {:04o}", meta.mode() & 0o7777)
        } else if ft.is_file() {
            format!("{rel} f {:04o} {} bytes", meta.mode() & 0o7777, meta.len())
        } else {
            format!("{rel} other {:o}", meta.mode())
        };
        lines.push(line);
    });
    lines.sort();
    lines.join("\n") + "\n"
}

/// Compare `actual` with `tests/golden/tree-<case>.txt`; rewrite it only with `UPDATE_GOLDEN=1`.
pub fn golden(case: &str, actual: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/golden/tree-{case}.txt"));
    if std::env::var_os("UPDATE_GOLDEN").is_some_and(|v| v == "1") {
        std::fs::write(&path, actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (run with UPDATE_GOLDEN=1)", path.display()));
    assert_eq!(
        actual,
        expected,
        "tree differs from {} (UPDATE_GOLDEN=1 rewrites it)",
        path.display()
    );
}

/// Everything observable about each entry under `root` except atime: type, mode, owner, inode,
/// mtime, ctime, link target, content. Used to prove a tree was not touched at all.
pub type Snapshot = BTreeMap<String, String>;

pub fn snapshot(root: &Path, skip: &[&Path]) -> Snapshot {
    let mut out = BTreeMap::new();
    walk_skipping(root, root, skip, &mut |rel, meta, path| {
        let ft = meta.file_type();
        let detail = if ft.is_symlink() {
            format!("-> {}", std::fs::read_link(path).unwrap().display())
        } else if ft.is_file() {
            format!("{:?}", std::fs::read(path).unwrap())
        } else {
            String::new()
        };
        out.insert(
            rel.to_owned(),
            format!(
                "mode={:o} uid={} gid={} ino={} rdev={} mtime={}.{} ctime={}.{} {detail}",
                meta.mode(),
                meta.uid(),
                meta.gid(),
                meta.ino(),
                meta.rdev(),
                meta.mtime(),
                meta.mtime_nsec(),
                meta.ctime(),
                meta.ctime_nsec()
            ),
        );
    });
    out
}

fn walk(root: &Path, dir: &Path, f: &mut dyn FnMut(&str, &std::fs::Metadata, &Path)) {
    walk_skipping(root, dir, &[], f);
}

fn walk_skipping(
    root: &Path,
    dir: &Path,
    skip: &[&Path],
    f: &mut dyn FnMut(&str, &std::fs::Metadata, &Path),
) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        if skip.contains(&path.as_path()) {
            continue;
        }
        let meta = std::fs::symlink_metadata(&path).unwrap();
        let rel = path
            .strip_prefix(root)
            .unwrap()
            .to_string_lossy()
            .into_owned();
        f(&rel, &meta, &path);
        if meta.file_type().is_dir() {
            walk_skipping(root, &path, skip, f);
        }
    }
}

/// Host driver files for `driver` under the host root `host`: each library an ELF with its
/// SONAME, binaries, the firmware directory with one file, the socket directories.
pub fn host_driver_files(host: &Path, driver: &UserspaceDriver) {
    use nspawn_lifecycle::fixture::{Arch, elf_shared_object};
    for dir in &driver.lib_dirs {
        let arch = if dir.triplet == "i386-linux-gnu" {
            Arch::I386
        } else {
            Arch::X86_64
        };
        for f in &dir.files {
            let p = host.join(dir.path.trim_start_matches('/')).join(&f.name);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, elf_shared_object(arch, f.soname.as_deref())).unwrap();
        }
    }
    for b in &driver.binaries {
        let p = host.join(b.trim_start_matches('/'));
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    }
    if let Some(fw) = &driver.firmware {
        let p = host.join(fw.trim_start_matches('/'));
        std::fs::create_dir_all(&p).unwrap();
        std::fs::write(p.join("gsp_ga10x.bin"), "fw").unwrap();
    }
    for s in &driver.sockets {
        std::fs::create_dir_all(host.join(s.trim_start_matches('/'))).unwrap();
    }
}

/// What pre-start and systemd-nspawn make of the driver root at boot: pre-start's host tree (hard
/// links of the driver files) and the `.nspawn` file's binds (the tree, its directory binds and
/// any file it could not link) mounted read-only at their targets under the machine root `machine`,
/// from the host root `host`. Unmounted when dropped (declare it after the tempdirs it uses).
/// Root only (mount).
pub struct DriverRootBinds {
    mounts: Vec<PathBuf>,
}

impl DriverRootBinds {
    pub fn mount(machine: &Path, host: &Path, driver: &UserspaceDriver) -> DriverRootBinds {
        use nix::mount::{MsFlags, mount};
        use nspawn_lifecycle::model::layout;
        let mut out = DriverRootBinds { mounts: Vec::new() };
        // As pre-start and nspawn do: the host tree, then its bind and the binds on its mount
        // points, in nspawn's order (by target).
        let hr = nspawn_lifecycle::fs::host::HostRoot::new(host);
        let mut plan = nspawn_lifecycle::model::tree::plan(&hr, driver).unwrap();
        let kube1 = "kube1".parse().unwrap();
        nspawn_lifecycle::apply::driver_tree::ensure(&hr, &kube1, &mut plan).unwrap();
        let mut binds = vec![layout::tree_bind(&kube1).unwrap()];
        binds.extend(layout::dir_binds(driver).unwrap());
        binds.extend(layout::file_binds(&plan.tree).unwrap());
        binds.sort_by(|a, b| a.target.as_str().cmp(b.target.as_str()));
        for b in binds {
            let target = machine.join(b.target.trim_start_matches('/'));
            if !target.exists() {
                std::fs::create_dir_all(&target).unwrap();
            }
            let source = host.join(b.source.trim_start_matches('/'));
            mount(
                Some(&source),
                &target,
                None::<&str>,
                MsFlags::MS_BIND,
                None::<&str>,
            )
            .unwrap_or_else(|e| panic!("bind {} at {}: {e}", source.display(), target.display()));
            out.mounts.push(target.clone());
            mount(
                None::<&str>,
                &target,
                None::<&str>,
                MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY,
                None::<&str>,
            )
            .unwrap();
        }
        out
    }
}

impl Drop for DriverRootBinds {
    fn drop(&mut self) {
        for m in self.mounts.iter().rev() {
            let _ = nix::mount::umount2(m, nix::mount::MntFlags::MNT_DETACH);
        }
    }
}
