//! Driver root, links, CDI spec and no-GPU cleanup against a temporary directory standing in for
//! a Debian-like machine root. Exact trees are pinned by `tests/golden/tree-*.txt`
//! (rewritten only with `UPDATE_GOLDEN=1`).

#![allow(clippy::unwrap_used)] // helpers outside #[test] fns; a panic is the failure report

mod rewire_support;

use nspawn_lifecycle::machine_root::MachineRoot;
use nspawn_lifecycle::rewire;
use rewire_support::*;
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
    assert_eq!(
        target(
            d,
            &format!("run/nvidia/driver/usr/lib/x86_64-linux-gnu/libcuda.so.{NEW}")
        ),
        format!("/run/host-nvidia/lib/0/libcuda.so.{NEW}")
    );
    assert_eq!(
        target(d, "run/nvidia/driver/usr/lib/i386-linux-gnu/libcuda.so.1"),
        format!("libcuda.so.{NEW}")
    );
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
    assert_eq!(lines[0], "driver root: 1 created, 0 replaced, 0 removed");
    assert_eq!(
        lines[1],
        "links: 13 created, 1 replaced, 3 removed; skipped /usr/lib/i386-linux-gnu (not in the machine)"
    );
    assert_eq!(lines[2], "CDI spec: 1 created, 0 replaced, 2 removed");
    assert_eq!(
        reports[2].removed,
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

    rewire::cleanup(&root, CDI_DIR, CDI_FILE).unwrap();
    let before = snapshot(dir.path(), &[]);
    let r = rewire::cleanup(&root, CDI_DIR, CDI_FILE).unwrap();
    assert!(!r.changed(), "second cleanup changed something: {r}");
    assert_eq!(before, snapshot(dir.path(), &[]));
}

#[test]
fn driver_upgrade_replaces_every_old_name() {
    let (dir, root) = machine();
    gpu_pass(&root, &inventory(OLD));
    let reports = gpu_pass(&root, &inventory(NEW));
    assert_eq!(reports[0].replaced, ["/run/nvidia/driver"]);
    let tree = listing(dir.path());
    golden("upgrade", &tree);
    assert!(
        !tree.contains(OLD),
        "something of {OLD} survived the upgrade:\n{tree}"
    );
    assert!(!dir.path().join("run/nvidia/.driver.new").exists());
}

#[test]
fn cleanup_removes_ours_and_nothing_else() {
    let (dir, root) = machine();
    let pristine = snapshot(dir.path(), &[]);
    gpu_pass(&root, &inventory(NEW));
    let r = rewire::cleanup(&root, CDI_DIR, CDI_FILE).unwrap();
    golden("cleanup", &listing(dir.path()));
    assert!(r.removed.contains(&"/run/nvidia/driver".to_owned()), "{r}");
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
    let r = rewire::cleanup(&root, CDI_DIR, CDI_FILE).unwrap();
    assert!(!r.changed(), "{r}");
    assert_eq!(before, snapshot(dir.path(), &[]));
}

#[test]
fn leftovers_of_a_crashed_run_are_removed() {
    let (dir, root) = machine();
    let d = dir.path();
    // A run killed mid-build: a half-built staging tree (with a planted escape in it), a temp
    // spec and a temp link.
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("precious"), "x").unwrap();
    std::fs::create_dir_all(d.join("run/nvidia/.driver.new/usr/lib")).unwrap();
    symlink(outside.path(), d.join("run/nvidia/.driver.new/usr/lib/out")).unwrap();
    std::fs::write(d.join("run/cdi/.nvidia.com-gpu.json.tmp"), "{\"half").unwrap();
    symlink(
        format!("/run/nvidia/driver/usr/lib/x86_64-linux-gnu/libcuda.so.{NEW}"),
        d.join("usr/lib/x86_64-linux-gnu/.libcuda.so.1.tmp"),
    )
    .unwrap();
    symlink("/dev/nvidia0", d.join("dev/char/.195:0.tmp")).unwrap();
    gpu_pass(&root, &inventory(NEW));
    golden("fresh", &listing(d));
    assert!(outside.path().join("precious").exists());

    // A run killed between the swap and the old tree's removal: the old tree sits at the
    // staging name while the new one is in place.
    std::fs::create_dir_all(d.join(format!("run/nvidia/.driver.new/lib/firmware/nvidia/{OLD}")))
        .unwrap();
    let r = rewire::build_driver_root(&root, inventory(NEW).driver.as_ref().unwrap()).unwrap();
    assert_eq!(r.removed, ["/run/nvidia/.driver.new"]);
    assert!(r.created.is_empty() && r.replaced.is_empty(), "{r}");
    golden("fresh", &listing(d));
}

#[test]
fn a_planted_driver_root_is_swapped_out_not_followed() {
    let (dir, root) = machine();
    let outside = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("run/nvidia")).unwrap();
    symlink(outside.path(), dir.path().join("run/nvidia/driver")).unwrap();
    let r = rewire::build_driver_root(&root, inventory(NEW).driver.as_ref().unwrap()).unwrap();
    assert_eq!(r.replaced, ["/run/nvidia/driver"]);
    assert!(dir.path().join("run/nvidia/driver").is_dir());
    assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0);
}

#[test]
fn regular_files_in_the_way_are_reported_not_replaced() {
    let (dir, root) = machine();
    let p = dir
        .path()
        .join("usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1");
    std::fs::write(&p, "machine's own").unwrap();
    let r = rewire::rebuild_links(&root, &inventory(NEW)).unwrap();
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
            rewire::write_cdi(&root, CDI_DIR, bad, b"{}", |_, _| false).is_err(),
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
    // The host files the driver root points at (bound at /run/host-nvidia in a real machine).
    let host = d.join("run/host-nvidia/lib/0");
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
    assert!(!rewire::ld_cache_lists_driver(&root, driver).unwrap());
    run_ldconfig();
    assert!(rewire::ld_cache_lists_driver(&root, driver).unwrap());
    // A library that was not there when ldconfig ran (its link dangled) is missing from the cache.
    std::fs::remove_file(host.join(format!("libnvidia-ml.so.{OLD}"))).unwrap();
    run_ldconfig();
    assert!(!rewire::ld_cache_lists_driver(&root, driver).unwrap());
}
