//! Driver root, links, CDI spec and no-GPU cleanup against a temporary directory standing in for
//! a Debian-like machine root. Exact trees are pinned by `tests/golden/tree-*.txt`
//! (rewritten only with `UPDATE_GOLDEN=1`).

#![allow(clippy::unwrap_used)] // helpers outside #[test] fns; a panic is the failure report

mod rewire_support;

mod common;

use nspawn_lifecycle::fs::machine_root::MachineRoot;
use nspawn_lifecycle::model::driver_root;
use rewire_support::*;
use std::collections::BTreeMap;
use std::os::unix::fs::symlink;
use std::path::Path;

fn machine() -> (tempfile::TempDir, MachineRoot) {
    let dir = tempfile::tempdir().unwrap();
    debian_machine(dir.path());
    let root = MachineRoot::open(dir.path()).unwrap();
    (dir, root)
}

fn read(dir: &Path, p: &str) -> String {
    std::fs::read_to_string(dir.join(p)).unwrap()
}

fn target(dir: &Path, p: &str) -> String {
    std::fs::read_link(dir.join(p))
        .unwrap()
        .to_string_lossy()
        .into_owned()
}

#[test]
fn fresh_machine_gets_driver_root_links_and_spec() {
    let (dir, root) = machine();
    let before = snapshot(dir.path(), &[]);
    let reports = gpu_pass(&root, &inventory(NEW));
    golden("fresh", &listing(dir.path()));

    let d = dir.path();
    assert_eq!(
        target(d, "usr/lib/x86_64-linux-gnu/libcuda.so.1"),
        format!("libcuda.so.{NEW}")
    );
    assert_eq!(
        target(d, &format!("usr/lib/x86_64-linux-gnu/libcuda.so.{NEW}")),
        format!("/run/nvidia/driver/usr/lib/x86_64-linux-gnu/libcuda.so.{NEW}")
    );
    // Issue 16 item 7: the driver's tools on the machine's PATH, into the driver root.
    assert_eq!(
        target(d, "usr/bin/nvidia-smi"),
        "/run/nvidia/driver/usr/bin/nvidia-smi"
    );
    assert_eq!(
        target(d, "usr/bin/nvidia-persistenced"),
        "/run/nvidia/driver/usr/bin/nvidia-persistenced"
    );
    // The driver root is nspawn's binds: post-start writes nothing there.
    assert!(!d.join("run/nvidia").exists());
    assert_eq!(target(d, "dev/char/195:0"), "/dev/nvidia0");
    assert_eq!(target(d, "dev/char/226:128"), "/dev/dri/renderD128");
    assert_eq!(read(d, "run/cdi/nvidia.com-gpu.json").as_bytes(), spec(NEW));

    // Unrelated entries are exactly as they were (same inode, mtime, ctime, content).
    let after = snapshot(dir.path(), &[]);
    for p in [
        "etc/passwd",
        "etc/cdi/vendor.json",
        "usr/lib/x86_64-linux-gnu/libfoo.so.1.2.3",
        "usr/lib/x86_64-linux-gnu/libfoo.so.1",
        "usr/lib/x86_64-linux-gnu/libfoo.so",
        "usr/lib/x86_64-linux-gnu/vdpau/libvdpau_va_gl.so.1",
        "dev/char/1:3",
        "dev/char/226:0",
        "var/run",
    ] {
        assert_eq!(before.get(p), after.get(p), "{p} was touched");
    }
    // No foreign-architecture dir was created, and the reports say so.
    assert!(!d.join("usr/lib/i386-linux-gnu").exists());
    let lines: Vec<String> = reports.iter().map(ToString::to_string).collect();
    assert_eq!(
        lines[0],
        "links: 15 created, 1 replaced, 3 removed; skipped /usr/lib/i386-linux-gnu (not in the machine)"
    );
    assert_eq!(lines[1], "CDI spec: 1 created, 0 replaced, 2 removed");
    assert_eq!(
        reports[1].removed,
        ["/etc/cdi/nvidia.yaml", "/var/run/cdi/nvidia.json"]
    );
}

#[test]
fn second_run_changes_nothing() {
    let (dir, root) = machine();
    let inv = inventory(NEW);
    gpu_pass(&root, &inv);
    let before = snapshot(dir.path(), &[]);
    for r in gpu_pass(&root, &inv) {
        assert!(!r.changed(), "second run changed something: {r}");
    }
    assert_eq!(before, snapshot(dir.path(), &[]));

    rewire_support::cleanup(&root, CDI_DIR, CDI_FILE).unwrap();
    let before = snapshot(dir.path(), &[]);
    let r = rewire_support::cleanup(&root, CDI_DIR, CDI_FILE).unwrap();
    assert!(!r.changed(), "second cleanup changed something: {r}");
    assert_eq!(before, snapshot(dir.path(), &[]));
}

#[test]
fn driver_upgrade_replaces_every_old_name() {
    let (dir, root) = machine();
    gpu_pass(&root, &inventory(OLD));
    gpu_pass(&root, &inventory(NEW));
    let tree = listing(dir.path());
    golden("upgrade", &tree);
    assert!(
        !tree.contains(OLD),
        "something of {OLD} survived the upgrade:\n{tree}"
    );
}

#[test]
fn cleanup_removes_ours_and_nothing_else() {
    let (dir, root) = machine();
    let pristine = snapshot(dir.path(), &[]);
    gpu_pass(&root, &inventory(NEW));
    let r = rewire_support::cleanup(&root, CDI_DIR, CDI_FILE).unwrap();
    golden("cleanup", &listing(dir.path()));
    for tool in ["/usr/bin/nvidia-smi", "/usr/bin/nvidia-persistenced"] {
        assert!(r.removed.contains(&tool.to_owned()), "{r}");
    }
    assert!(
        r.removed
            .contains(&"/var/run/cdi/nvidia.com-gpu.json".to_owned()),
        "{r}"
    );

    // Whatever remains from the pristine machine is untouched; what is gone was ours (the
    // stale driver links and stale NVIDIA /dev/char link) or a conflicting spec of our kind.
    let after = snapshot(dir.path(), &[]);
    let mut gone = Vec::new();
    for (p, meta) in &pristine {
        match after.get(p) {
            // Directories gain and lose entries; everything else must be byte-for-byte intact.
            Some(m) if !meta.starts_with("mode=40") => assert_eq!(m, meta, "{p} was touched"),
            Some(_) => {}
            None => gone.push(p.as_str()),
        }
    }
    assert_eq!(
        gone,
        [
            "dev/char/195:254",
            "etc/cdi/nvidia.yaml",
            "run/cdi/nvidia.json",
            "usr/lib/x86_64-linux-gnu/libcuda.so.1",
            "usr/lib/x86_64-linux-gnu/libcuda.so.570.124.06",
            "usr/lib/x86_64-linux-gnu/vdpau/libvdpau_nvidia.so.570.124.06",
        ]
    );
}

#[test]
fn cleanup_of_a_machine_that_never_had_gpus() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("usr/lib/x86_64-linux-gnu")).unwrap();
    let root = MachineRoot::open(dir.path()).unwrap();
    let before = snapshot(dir.path(), &[]);
    let r = rewire_support::cleanup(&root, CDI_DIR, CDI_FILE).unwrap();
    assert!(!r.changed(), "{r}");
    assert_eq!(before, snapshot(dir.path(), &[]));
}

#[test]
fn leftovers_of_a_crashed_run_are_removed() {
    let (dir, root) = machine();
    let d = dir.path();
    // A run killed mid-write: a temp spec and temp links.
    std::fs::write(d.join("run/cdi/.nvidia.com-gpu.json.tmp"), "{\"half").unwrap();
    symlink(
        format!("/run/nvidia/driver/usr/lib/x86_64-linux-gnu/libcuda.so.{NEW}"),
        d.join("usr/lib/x86_64-linux-gnu/.libcuda.so.1.tmp"),
    )
    .unwrap();
    symlink("/dev/nvidia0", d.join("dev/char/.195:0.tmp")).unwrap();
    gpu_pass(&root, &inventory(NEW));
    golden("fresh", &listing(d));
}

/// A host root with the driver files of `inv`, a machine root, and nspawn's driver binds from
/// one into the other (unmounted when the last value drops, before the tempdirs go).
fn machine_with_driver_root(
    inv: &nspawn_lifecycle::discovery::Inventory,
) -> (
    DriverRootBinds,
    tempfile::TempDir,
    tempfile::TempDir,
    MachineRoot,
) {
    assert!(
        nix::unistd::geteuid().is_root(),
        "privileged: nspawn's driver binds are bind mounts, which need root"
    );
    let host = tempfile::tempdir().unwrap();
    host_driver_files(host.path(), inv.driver.as_ref().unwrap());
    let (dir, root) = machine();
    let binds = DriverRootBinds::mount(dir.path(), host.path(), inv.driver.as_ref().unwrap());
    (binds, host, dir, root)
}

/// Issue 11: the driver root is nspawn's binds, checked against the host inode by inode.
#[test]
fn privileged_driver_root_of_binds_matches_the_host() {
    let inv = inventory(NEW);
    let driver = inv.driver.as_ref().unwrap();
    let (_binds, host, dir, root) = machine_with_driver_root(&inv);
    let hr = nspawn_lifecycle::fs::host::HostRoot::new(host.path());
    let n = driver_root::verify(&root, &hr, driver).unwrap();
    // 4 x86_64 files + 3 SONAMEs, 1 i386 file + 1 SONAME, 2 tools, firmware, 1 socket dir.
    assert_eq!(n, 13);
    // Every entry is a file or directory inside the tree, or a SONAME link to the file beside
    // it (issue 12: links of the host tree, not binds), none a link out of its directory.
    let mut links = 0;
    for line in listing(&dir.path().join("run/nvidia/driver")).lines() {
        if let Some((_, t)) = line.split_once(" l -> ") {
            links += 1;
            assert!(!t.contains('/'), "a link out of its directory: {line}");
        }
    }
    assert_eq!(links, 4);
    // Read-only in the machine: its root cannot plant or replace anything there.
    let e = std::fs::write(
        dir.path()
            .join("run/nvidia/driver/usr/lib/x86_64-linux-gnu/planted"),
        "x",
    )
    .unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{e}");
    let so1 = dir
        .path()
        .join("run/nvidia/driver/usr/lib/x86_64-linux-gnu/libcuda.so.1");
    let so = dir.path().join(format!(
        "run/nvidia/driver/usr/lib/x86_64-linux-gnu/libcuda.so.{NEW}"
    ));
    assert_eq!(std::fs::read(so1).unwrap(), std::fs::read(so).unwrap());
}

/// The driver changed on the host after pre-start rendered the binds: post-start must refuse the
/// machine's driver root rather than link the machine to it.
#[test]
fn privileged_a_driver_root_of_another_version_is_refused_by_name() {
    let inv = inventory(OLD);
    let (_binds, host, _dir, root) = machine_with_driver_root(&inv);
    let newer = inventory(NEW);
    host_driver_files(host.path(), newer.driver.as_ref().unwrap());
    let hr = nspawn_lifecycle::fs::host::HostRoot::new(host.path());
    let e = format!(
        "{:#}",
        driver_root::verify(&root, &hr, newer.driver.as_ref().unwrap()).unwrap_err()
    );
    assert!(
        e.contains(&format!("does not match the host's NVIDIA driver {NEW}")),
        "{e}"
    );
    assert!(
        e.contains(&format!(
            "missing: /run/nvidia/driver/lib/firmware/nvidia/{NEW}"
        )),
        "{e}"
    );
    assert!(
        e.contains(&format!(
            "not the host's driver: /run/nvidia/driver/lib/firmware/nvidia/{OLD}"
        )) || e.contains(&format!("/run/nvidia/driver/lib/firmware/nvidia/{OLD}")),
        "{e}"
    );
}

/// A host file replaced after the boot (same name, new inode: a reinstall of the same version),
/// or a file the machine's root dropped into the tree: both named.
#[test]
fn privileged_a_replaced_host_file_or_a_planted_entry_is_refused() {
    let inv = inventory(NEW);
    let driver = inv.driver.as_ref().unwrap();
    let (_binds, host, _dir, root) = machine_with_driver_root(&inv);
    let hr = nspawn_lifecycle::fs::host::HostRoot::new(host.path());
    // The tree is read-only in the machine; planted on the host side, it shows there.
    let tree = host
        .path()
        .join("var/lib/nspawn-lifecycle/driver-root/kube1/usr/lib/x86_64-linux-gnu/libcuda.so");
    std::fs::write(&tree, "planted").unwrap();
    let e = format!("{:#}", driver_root::verify(&root, &hr, driver).unwrap_err());
    assert!(
        e.contains(
            "1 not the host's driver: /run/nvidia/driver/usr/lib/x86_64-linux-gnu/libcuda.so"
        ),
        "{e}"
    );
    std::fs::remove_file(&tree).unwrap();
    let smi = host.path().join("usr/bin/nvidia-smi");
    std::fs::remove_file(&smi).unwrap();
    std::fs::write(&smi, "reinstalled").unwrap();
    let e = format!("{:#}", driver_root::verify(&root, &hr, driver).unwrap_err());
    assert!(
        e.contains("1 not the host's file: /run/nvidia/driver/usr/bin/nvidia-smi"),
        "{e}"
    );
}

/// No driver root (a machine started without our pre-start), or one the machine's root replaced
/// with a symlink: refused, nothing followed.
#[test]
fn a_missing_or_planted_driver_root_is_refused_not_followed() {
    let inv = inventory(NEW);
    let host = tempfile::tempdir().unwrap();
    host_driver_files(host.path(), inv.driver.as_ref().unwrap());
    let hr = nspawn_lifecycle::fs::host::HostRoot::new(host.path());
    let (dir, root) = machine();
    let e = format!(
        "{:#}",
        driver_root::verify(&root, &hr, inv.driver.as_ref().unwrap()).unwrap_err()
    );
    assert!(e.contains("is not in the machine"), "{e}");
    std::fs::create_dir_all(dir.path().join("run/nvidia")).unwrap();
    symlink(host.path(), dir.path().join("run/nvidia/driver")).unwrap();
    let e = format!(
        "{:#}",
        driver_root::verify(&root, &hr, inv.driver.as_ref().unwrap()).unwrap_err()
    );
    assert!(e.contains("is a symlink, not the driver root"), "{e}");
    // A writable directory there (a machine started without pre-start's tree bind): refused
    // before anything in it is trusted.
    std::fs::remove_file(dir.path().join("run/nvidia/driver")).unwrap();
    std::fs::create_dir_all(dir.path().join("run/nvidia/driver")).unwrap();
    let e = format!(
        "{:#}",
        driver_root::verify(&root, &hr, inv.driver.as_ref().unwrap()).unwrap_err()
    );
    assert!(
        e.contains("/run/nvidia/driver in the machine is writable"),
        "{e}"
    );
}

#[test]
fn a_real_tool_in_the_image_is_left_alone_and_reported() {
    let (dir, root) = machine();
    let p = dir.path().join("usr/bin/nvidia-smi");
    std::fs::write(&p, "the image's own").unwrap();
    let r = rebuild_links(&root, &inventory(NEW)).unwrap();
    assert_eq!(std::fs::read_to_string(&p).unwrap(), "the image's own");
    assert!(
        r.to_string()
            .contains("left /usr/bin/nvidia-smi alone (a regular file)"),
        "{r}"
    );
    let r = rewire_support::cleanup(&root, CDI_DIR, CDI_FILE).unwrap();
    assert!(
        !r.removed.contains(&"/usr/bin/nvidia-smi".to_owned()),
        "{r}"
    );
    assert_eq!(std::fs::read_to_string(&p).unwrap(), "the image's own");
}

#[test]
fn regular_files_in_the_way_are_reported_not_replaced() {
    let (dir, root) = machine();
    let p = dir
        .path()
        .join("usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1");
    std::fs::write(&p, "machine's own").unwrap();
    let r = rebuild_links(&root, &inventory(NEW)).unwrap();
    assert_eq!(std::fs::read_to_string(&p).unwrap(), "machine's own");
    assert!(
        r.to_string()
            .contains("left /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1 alone (a regular file)"),
        "{r}"
    );
}

#[test]
fn spec_file_name_is_checked() {
    let (_dir, root) = machine();
    for bad in ["../x.json", "a/b.json", "x.txt", ".x.json", ""] {
        assert!(
            write_cdi(&root, CDI_DIR, bad, b"{}", |_, _| false).is_err(),
            "{bad:?} accepted"
        );
    }
}

/// Against the real `ldconfig` (run chrooted into the machine, so root only): the cache check
/// that lets post-start skip `ldconfig` sees a cache that lists the driver, and one that does
/// not (no cache yet; one written while a library was missing). Privileged: it fails, never
/// skips, without root or without `ldconfig` (the README's rule; CI runs as root on Debian).
#[test]
fn privileged_ld_cache_check_agrees_with_real_ldconfig() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "privileged: runs the real ldconfig chrooted into a machine root and must run as root"
    );
    let ldconfig = ["/sbin/ldconfig", "/usr/sbin/ldconfig"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("no ldconfig in /sbin or /usr/sbin (Debian's libc-bin provides it)");
    let (dir, root) = machine();
    let d = dir.path();
    let inv = inventory(OLD);
    let driver = inv.driver.as_ref().unwrap();
    gpu_pass(&root, &inv);
    // The driver root's files (nspawn's binds of the host's files in a real machine).
    let host = d.join("run/nvidia/driver/usr/lib/x86_64-linux-gnu");
    std::fs::create_dir_all(host.join("vdpau")).unwrap();
    for f in &driver.lib_dirs[0].files {
        let elf = nspawn_lifecycle::fixture::elf_shared_object(
            nspawn_lifecycle::fixture::Arch::X86_64,
            f.soname.as_deref(),
        );
        std::fs::write(host.join(&f.name), elf).unwrap();
    }
    std::fs::write(d.join("etc/ld.so.conf"), "/usr/lib/x86_64-linux-gnu\n").unwrap();
    let run_ldconfig = || {
        let st = std::process::Command::new(ldconfig)
            .arg("-r")
            .arg(d)
            .status()
            .unwrap();
        assert!(st.success());
    };
    assert!(!nspawn_lifecycle::model::ld_cache::lists_driver(&root, driver).unwrap());
    run_ldconfig();
    assert!(nspawn_lifecycle::model::ld_cache::lists_driver(&root, driver).unwrap());
    // A library that was not there when ldconfig ran (its link dangled) is missing from the cache.
    std::fs::remove_file(host.join(format!("libnvidia-ml.so.{OLD}"))).unwrap();
    run_ldconfig();
    assert!(!nspawn_lifecycle::model::ld_cache::lists_driver(&root, driver).unwrap());
}

/// A stand-in driver library: nvidia-ctk calls NVML first and goes on without it when it fails,
/// as it does on a host without the kernel module (9 is NVML_ERROR_DRIVER_NOT_LOADED).
const NVML_STUB: &[u8] = b"int nvmlInit(void) { return 9; }\n\
int nvmlInit_v2(void) { return 9; }\n\
int nvmlInitWithFlags(unsigned f) { return 9; }\n\
int nvmlShutdown(void) { return 0; }\n\
const char *nvmlErrorString(int r) { return \"driver not loaded (stub)\"; }\n";

/// NVIDIA's own tool as the oracle (issue 11): `nvidia-ctk cdi generate --mode=management`
/// lists every x86_64 library, every binary and the firmware of the driver root nspawn's binds
/// make, at their standard paths with their host paths inside the tree, both where it is
/// (`--driver-root=<machine>/run/nvidia/driver`) and rbound at another path with the original
/// gone from view (a pod's `/driver-root`). nvidia-ctk is found by `common::nvidia_tool`;
/// privileged (bind mounts): it fails, never skips, without root or the tool.
#[test]
fn privileged_nvidia_ctk_lists_every_driver_file_in_both_views() {
    let ctk = common::nvidia_tool("nvidia-ctk").display().to_string();
    let inv = inventory(NEW);
    let driver = inv.driver.as_ref().unwrap();
    assert!(
        nix::unistd::geteuid().is_root(),
        "privileged: nspawn's driver binds are bind mounts, which need root"
    );
    let host = tempfile::tempdir().unwrap();
    host_driver_files(host.path(), driver);
    // nvidia-ctk dlopen()s libnvidia-ml from the tree: the 64-bit libraries must be loadable
    // shared objects (linker-made, as the e2e rig's stubs), not just ELF headers.
    for f in &driver.lib_dirs[0].files {
        let p = host.path().join("usr/lib/x86_64-linux-gnu").join(&f.name);
        let mut cc = std::process::Command::new("gcc");
        cc.args(["-shared", "-fPIC", "-x", "c", "-o"]).arg(&p);
        if let Some(so) = &f.soname {
            cc.arg(format!("-Wl,-soname,{so}"));
        }
        let mut child = cc
            .arg("-")
            .stdin(std::process::Stdio::piped())
            .spawn()
            .expect("gcc (Debian's gcc package) builds the stand-in libraries");
        use std::io::Write as _;
        child.stdin.take().unwrap().write_all(NVML_STUB).unwrap();
        assert!(child.wait().unwrap().success(), "gcc for {}", f.name);
    }
    let (dir, _root) = machine();
    let binds = DriverRootBinds::mount(dir.path(), host.path(), driver);
    let tree = dir.path().join("run/nvidia/driver");
    // Management mode lists the device nodes under --dev-root: real character devices.
    let dev = tempfile::tempdir().unwrap();
    std::fs::create_dir(dev.path().join("dev")).unwrap();
    for (name, minor) in [("nvidia0", 0), ("nvidiactl", 255)] {
        nix::sys::stat::mknod(
            &dev.path().join("dev").join(name),
            nix::sys::stat::SFlag::S_IFCHR,
            nix::sys::stat::Mode::from_bits_truncate(0o666),
            nix::sys::stat::makedev(195, minor),
        )
        .unwrap();
    }
    let mut want: Vec<String> = driver.lib_dirs[0]
        .files
        .iter()
        .map(|f| format!("/usr/lib/x86_64-linux-gnu/{}", f.name))
        .collect();
    want.extend(
        driver
            .binaries
            .iter()
            .map(|b| format!("/usr/bin/{}", b.rsplit('/').next().unwrap())),
    );
    want.push(format!("/lib/firmware/nvidia/{NEW}/gsp_ga10x.bin"));
    let generate = |root: &Path| -> BTreeMap<String, String> {
        let out = std::process::Command::new(&ctk)
            .args([
                "--quiet",
                "cdi",
                "generate",
                "--mode=management",
                "--format=json",
            ])
            .arg(format!("--driver-root={}", root.display()))
            .arg(format!("--dev-root={}", dev.path().display()))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "nvidia-ctk --driver-root={}: {}",
            root.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        let spec: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let mut mounts = BTreeMap::new();
        for m in spec["containerEdits"]["mounts"]
            .as_array()
            .into_iter()
            .flatten()
        {
            mounts.insert(
                m["containerPath"].as_str().unwrap().to_owned(),
                m["hostPath"].as_str().unwrap().to_owned(),
            );
        }
        mounts
    };
    let check = |view: &str, root: &Path, mounts: &BTreeMap<String, String>| {
        let missing: Vec<&String> = want.iter().filter(|w| !mounts.contains_key(*w)).collect();
        assert!(
            missing.is_empty(),
            "{view}: nvidia-ctk did not list {missing:?}; it listed {mounts:#?}"
        );
        for w in &want {
            assert!(
                Path::new(&mounts[w]).starts_with(root),
                "{view}: {w} found outside the tree at {}",
                mounts[w]
            );
        }
    };
    check("in the machine", &tree, &generate(&tree));

    // A pod's view: the tree rbound at another path, the original covered by an empty tmpfs.
    let pod = tempfile::tempdir().unwrap();
    let at = pod.path().join("driver-root");
    std::fs::create_dir(&at).unwrap();
    use nix::mount::{MntFlags, MsFlags, mount, umount2};
    mount(
        Some(&tree),
        &at,
        None::<&str>,
        MsFlags::MS_BIND | MsFlags::MS_REC,
        None::<&str>,
    )
    .unwrap();
    let cover = dir.path().join("run/nvidia");
    mount(
        Some("tmpfs"),
        &cover,
        Some("tmpfs"),
        MsFlags::empty(),
        None::<&str>,
    )
    .unwrap();
    let mounts = generate(&at);
    let _ = umount2(&cover, MntFlags::MNT_DETACH);
    let _ = umount2(&at, MntFlags::MNT_DETACH);
    drop(binds);
    check("at /driver-root", &at, &mounts);
}
