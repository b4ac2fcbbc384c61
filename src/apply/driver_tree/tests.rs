use super::*;
use crate::discovery::UserspaceDriver;
use crate::discovery::{DriverFile, LibDir};
use crate::model::tree::plan;
use std::os::unix::fs::MetadataExt as _;
use std::path::Path;

const LIB: &str = "usr/lib/x86_64-linux-gnu";

/// A host with one library and one tool; the driver discovery would report for it.
fn host() -> (tempfile::TempDir, HostRoot, UserspaceDriver) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join(LIB)).unwrap();
    std::fs::create_dir_all(dir.path().join("usr/bin")).unwrap();
    std::fs::write(dir.path().join(LIB).join("libcuda.so.9.1"), b"ELF cuda 9.1").unwrap();
    std::fs::write(dir.path().join("usr/bin/nvidia-smi"), b"smi").unwrap();
    let host = HostRoot::new(dir.path());
    let driver = UserspaceDriver {
        version: "9.1".into(),
        lib_dirs: vec![LibDir {
            path: format!("/{LIB}").parse().unwrap(),
            triplet: "x86_64-linux-gnu".into(),
            files: vec![DriverFile {
                name: "libcuda.so.9.1".into(),
                soname: Some("libcuda.so.1".into()),
            }],
        }],
        binaries: vec!["/usr/bin/nvidia-smi".parse().unwrap()],
        firmware: None,
        sockets: vec![],
        runtime: vec![],
    };
    (dir, host, driver)
}

fn tree_dir(dir: &Path) -> std::path::PathBuf {
    dir.join("var/lib/nspawn-lifecycle/driver-root/kube1")
}

/// Past a coarse timestamp's tick before an edit of a stamped tree, so its ctime moves
/// (kernels before 6.13 stamp at most once per jiffy; later ones give a ctime read since its
/// last change a fine-grained one).
fn tick() {
    std::thread::sleep(std::time::Duration::from_millis(20));
}

fn ino(p: &Path) -> u64 {
    std::fs::symlink_metadata(p).unwrap().ino()
}

/// Every driver file in the tree is a hard link of the host file (its inode), so
/// the `.nspawn` file binds none of them; the SONAME is the link beside it.
#[test]
fn driver_files_are_hard_links_of_the_host_files_and_need_no_bind() {
    let (dir, host, driver) = host();
    let mut plan = plan(&host, &driver).unwrap();
    let built = ensure(&host, &kube1(), &mut plan).unwrap();
    assert_eq!(
        built,
        Built {
            changed: true,
            unlinked: vec![]
        }
    );
    let t = tree_dir(dir.path());
    let lib = t.join(LIB).join("libcuda.so.9.1");
    assert_eq!(ino(&lib), ino(&dir.path().join(LIB).join("libcuda.so.9.1")));
    assert_eq!(std::fs::read(&lib).unwrap(), b"ELF cuda 9.1");
    assert_eq!(
        ino(&t.join("usr/bin/nvidia-smi")),
        ino(&dir.path().join("usr/bin/nvidia-smi"))
    );
    assert_eq!(
        std::fs::read_link(t.join(LIB).join("libcuda.so.1")).unwrap(),
        Path::new("libcuda.so.9.1")
    );
    assert!(layout::file_binds(&plan.tree).unwrap().is_empty());
}

/// The tree carries the tools' C runtime as host inodes and a loader cache naming the tree's
/// libraries at their paths in it; an edit of the cache (same size, new bytes) is found and
/// undone at the next start, and a host C library replaced (an upgrade) is linked anew.
#[test]
fn the_c_runtime_and_the_trees_loader_cache_are_kept_exact() {
    let (dir, host, mut driver) = host();
    std::fs::create_dir_all(dir.path().join("lib64")).unwrap();
    std::fs::write(dir.path().join(LIB).join("libc.so.6"), b"libc 1").unwrap();
    std::fs::write(dir.path().join("lib64/ld.so"), b"loader").unwrap();
    driver.runtime = vec![
        crate::discovery::RuntimeFile {
            path: "/lib64/ld.so".into(),
            source: "/lib64/ld.so".parse().unwrap(),
        },
        crate::discovery::RuntimeFile {
            path: format!("/{LIB}/libc.so.6"),
            source: format!("/{LIB}/libc.so.6").parse().unwrap(),
        },
    ];
    assert!(
        ensure(&host, &kube1(), &mut plan(&host, &driver).unwrap())
            .unwrap()
            .changed
    );
    let t = tree_dir(dir.path());
    assert_eq!(
        ino(&t.join("lib64/ld.so")),
        ino(&dir.path().join("lib64/ld.so"))
    );
    let libc = t.join(LIB).join("libc.so.6");
    assert_eq!(ino(&libc), ino(&dir.path().join(LIB).join("libc.so.6")));
    let cache = std::fs::read(t.join("etc/ld.so.cache")).unwrap();
    let names: Vec<(String, String)> = crate::discovery::ldcache::parse(&cache)
        .unwrap()
        .into_iter()
        .map(|e| (e.soname, e.path))
        .collect();
    assert_eq!(
        names,
        [
            ("libcuda.so.1".to_owned(), format!("/{LIB}/libcuda.so.1")),
            ("libc.so.6".to_owned(), format!("/{LIB}/libc.so.6")),
        ]
    );
    assert!(
        !ensure(&host, &kube1(), &mut plan(&host, &driver).unwrap())
            .unwrap()
            .changed
    );
    tick();
    let mut edited = cache.clone();
    edited[cache.len() - 2] ^= 0xff;
    std::fs::write(t.join("etc/ld.so.cache"), &edited).unwrap();
    assert!(
        ensure(&host, &kube1(), &mut plan(&host, &driver).unwrap())
            .unwrap()
            .changed
    );
    assert_eq!(std::fs::read(t.join("etc/ld.so.cache")).unwrap(), cache);
    let upgraded = dir.path().join(LIB).join("libc.so.6.new");
    std::fs::write(&upgraded, b"libc 2").unwrap();
    std::fs::rename(&upgraded, dir.path().join(LIB).join("libc.so.6")).unwrap();
    assert!(
        ensure(&host, &kube1(), &mut plan(&host, &driver).unwrap())
            .unwrap()
            .changed
    );
    assert_eq!(std::fs::read(&libc).unwrap(), b"libc 2");
}

#[test]
fn built_once_then_left_alone_then_swapped_when_it_changes() {
    let (dir, host, driver) = host();
    let t = tree_dir(dir.path());
    assert!(
        ensure(&host, &kube1(), &mut plan(&host, &driver).unwrap())
            .unwrap()
            .changed
    );
    let top = ino(&t);
    assert!(
        !ensure(&host, &kube1(), &mut plan(&host, &driver).unwrap())
            .unwrap()
            .changed
    );
    assert_eq!(ino(&t), top);
    // An upgrade as dpkg does it: a new file renamed over the old name. The tree still
    // holds the old inode until the next pre-start, which sees it and relinks.
    let host_lib = dir.path().join(LIB).join("libcuda.so.9.1");
    std::fs::write(dir.path().join(LIB).join(".new"), b"ELF cuda 9.1 rebuilt").unwrap();
    std::fs::rename(dir.path().join(LIB).join(".new"), &host_lib).unwrap();
    assert_ne!(ino(&t.join(LIB).join("libcuda.so.9.1")), ino(&host_lib));
    assert!(
        ensure(&host, &kube1(), &mut plan(&host, &driver).unwrap())
            .unwrap()
            .changed
    );
    assert_eq!(ino(&t.join(LIB).join("libcuda.so.9.1")), ino(&host_lib));
    assert!(
        !dir.path()
            .join("var/lib/nspawn-lifecycle/driver-root/.kube1.new")
            .exists()
    );
    // Something else put in the tree makes it differ: rebuilt without it.
    tick();
    std::fs::write(t.join(LIB).join("extra"), b"x").unwrap();
    assert!(
        ensure(&host, &kube1(), &mut plan(&host, &driver).unwrap())
            .unwrap()
            .changed
    );
    assert!(!t.join(LIB).join("extra").exists());
    // A copy of the right content is not the host's file: rebuilt.
    tick();
    let lib = t.join(LIB).join("libcuda.so.9.1");
    std::fs::remove_file(&lib).unwrap();
    std::fs::write(&lib, b"ELF cuda 9.1 rebuilt").unwrap();
    assert!(
        ensure(&host, &kube1(), &mut plan(&host, &driver).unwrap())
            .unwrap()
            .changed
    );
    assert_eq!(ino(&lib), ino(&host_lib));
    // A link to a copy where a directory belongs, a file where a SONAME link belongs: both
    // rebuilt, the copy never followed into.
    let changed = |host: &HostRoot| {
        ensure(host, &kube1(), &mut plan(host, &driver).unwrap())
            .unwrap()
            .changed
    };
    let bin = t.join("usr/bin");
    tick();
    let copy = dir.path().join("copy");
    std::fs::rename(&bin, &copy).unwrap();
    std::os::unix::fs::symlink(&copy, &bin).unwrap();
    assert!(changed(&host));
    assert!(std::fs::symlink_metadata(&bin).unwrap().is_dir());
    assert!(copy.join("nvidia-smi").is_file());
    let soname = t.join(LIB).join("libcuda.so.1");
    tick();
    std::fs::remove_file(&soname).unwrap();
    std::fs::write(&soname, b"").unwrap();
    assert!(changed(&host));
    assert!(std::fs::symlink_metadata(&soname).unwrap().is_symlink());
    assert!(!changed(&host));
}

fn top_dir(dir: &Path) -> std::path::PathBuf {
    dir.join("var/lib/nspawn-lifecycle/driver-root")
}

fn stamp_path(dir: &Path) -> std::path::PathBuf {
    top_dir(dir).join(".kube1.stamp")
}

/// What the stamp says for the tree as it is now.
fn stamp_now(dir: &Path, host: &HostRoot, driver: &UserspaceDriver) -> String {
    let top = nix::fcntl::open(&top_dir(dir), dir_flags(), Mode::empty()).unwrap();
    stamp_text(&top, &kube1(), &plan(host, driver).unwrap()).unwrap()
}

fn changed(host: &HostRoot, driver: &UserspaceDriver) -> bool {
    ensure(host, &kube1(), &mut plan(host, driver).unwrap())
        .unwrap()
        .changed
}

/// A stamp that matches is trusted: the tree is not walked. Here a stamp forged for a tree
/// edited by hand hides the edit (which only a walk would see); without it the walk sees the
/// edit and the tree is rebuilt.
#[test]
fn a_matching_stamp_is_trusted_without_walking_the_tree() {
    let (dir, host, driver) = host();
    assert!(changed(&host, &driver));
    let stamp = stamp_path(dir.path());
    assert_eq!(
        std::fs::read_to_string(&stamp).unwrap(),
        stamp_now(dir.path(), &host, &driver)
    );
    let extra = tree_dir(dir.path()).join(LIB).join("extra");
    std::fs::write(&extra, b"x").unwrap();
    std::fs::write(&stamp, stamp_now(dir.path(), &host, &driver)).unwrap();
    assert!(!changed(&host, &driver));
    assert!(extra.exists());
    std::fs::remove_file(&stamp).unwrap();
    assert!(changed(&host, &driver));
    assert!(!extra.exists());
    assert!(stamp.is_file());
}

/// Each edit of the tree by hand changes its directory's ctime (or a directory's inode): the
/// stamp no longer matches, the walk sees the edit and the tree is rebuilt and stamped again.
#[test]
fn a_tree_edited_by_hand_is_rebuilt_despite_its_stamp() {
    let (dir, host, driver) = host();
    let t = tree_dir(dir.path());
    let lib = t.join(LIB);
    type Edit = Box<dyn Fn()>;
    let edits: Vec<(&str, Edit)> = vec![
        ("entry removed", {
            let p = t.join("usr/bin/nvidia-smi");
            Box::new(move || std::fs::remove_file(&p).unwrap())
        }),
        ("entry added", {
            let p = lib.join("extra");
            Box::new(move || std::fs::write(&p, b"x").unwrap())
        }),
        ("entry added at the top", {
            let p = t.join("extra");
            Box::new(move || std::fs::create_dir(&p).unwrap())
        }),
        ("link retargeted", {
            let p = lib.join("libcuda.so.1");
            Box::new(move || {
                std::fs::remove_file(&p).unwrap();
                std::os::unix::fs::symlink("libcuda.so.9.2", &p).unwrap();
            })
        }),
        ("hard link replaced by a copy", {
            let p = lib.join("libcuda.so.9.1");
            Box::new(move || {
                std::fs::remove_file(&p).unwrap();
                std::fs::write(&p, b"ELF cuda 9.1").unwrap();
            })
        }),
        ("directory replaced by a copy", {
            let (bin, copy) = (t.join("usr/bin"), t.join("usr/bin.copy"));
            Box::new(move || {
                std::fs::create_dir(&copy).unwrap();
                std::fs::write(copy.join("nvidia-smi"), b"smi").unwrap();
                std::fs::remove_file(bin.join("nvidia-smi")).unwrap();
                std::fs::remove_dir(&bin).unwrap();
                std::fs::rename(&copy, &bin).unwrap();
            })
        }),
    ];
    assert!(changed(&host, &driver));
    for (what, edit) in edits {
        assert!(!changed(&host, &driver), "{what}: before");
        tick();
        edit();
        assert!(changed(&host, &driver), "{what}: not seen");
        assert_eq!(
            std::fs::read_to_string(stamp_path(dir.path())).unwrap(),
            stamp_now(dir.path(), &host, &driver),
            "{what}"
        );
    }
    assert!(!t.join("extra").exists() && !lib.join("extra").exists());
    assert_eq!(
        std::fs::read_link(lib.join("libcuda.so.1")).unwrap(),
        Path::new("libcuda.so.9.1")
    );
    assert_eq!(
        ino(&lib.join("libcuda.so.9.1")),
        ino(&dir.path().join(LIB).join("libcuda.so.9.1"))
    );
}

/// A stamp that is garbage, cut short, too long, empty or not a file is no error: the tree
/// is walked (left alone when right, rebuilt when not) and stamped again.
#[test]
fn a_corrupt_stamp_means_a_walk_not_an_error() {
    let (dir, host, driver) = host();
    assert!(changed(&host, &driver));
    let stamp = stamp_path(dir.path());
    let good = std::fs::read(&stamp).unwrap();
    let garbage: Vec<Vec<u8>> = vec![
        b"".to_vec(),
        b"\xff\x00 not a stamp".to_vec(),
        good[..good.len() / 2].to_vec(),
        [good.as_slice(), b"x"].concat(),
    ];
    for bytes in garbage {
        std::fs::write(&stamp, &bytes).unwrap();
        assert!(!changed(&host, &driver));
        assert_eq!(std::fs::read(&stamp).unwrap(), good);
    }
    std::fs::remove_file(&stamp).unwrap();
    std::fs::create_dir_all(stamp.join("sub")).unwrap();
    assert!(!changed(&host, &driver));
    assert_eq!(std::fs::read(&stamp).unwrap(), good);
    std::fs::remove_file(&stamp).unwrap();
    nix::unistd::mkfifo(&stamp, Mode::from_bits_truncate(0o600)).unwrap();
    assert!(!changed(&host, &driver));
    assert_eq!(std::fs::read(&stamp).unwrap(), good);
    // Garbage and an edited tree: rebuilt.
    std::fs::write(&stamp, b"garbage").unwrap();
    std::fs::remove_file(tree_dir(dir.path()).join("usr/bin/nvidia-smi")).unwrap();
    assert!(changed(&host, &driver));
    assert!(tree_dir(dir.path()).join("usr/bin/nvidia-smi").is_file());
}

/// What a pre-start killed at any point leaves is repaired by the next: the stamp goes
/// before the tree changes and is written last, so a tree without its stamp is walked.
#[test]
fn a_kill_while_building_or_stamping_is_repaired_by_the_next_start() {
    let (dir, host, driver) = host();
    let top = top_dir(dir.path());
    let stamp = stamp_path(dir.path());
    assert!(changed(&host, &driver));
    let first = std::fs::read(&stamp).unwrap();
    // Killed mid-build after a driver upgrade: half a new tree, a temp stamp, the old tree
    // unstamped (the stamp went first).
    let host_lib = dir.path().join(LIB).join("libcuda.so.9.1");
    std::fs::write(dir.path().join(LIB).join(".new"), b"ELF cuda 9.1 rebuilt").unwrap();
    std::fs::rename(dir.path().join(LIB).join(".new"), &host_lib).unwrap();
    std::fs::create_dir_all(top.join(".kube1.new/usr")).unwrap();
    std::fs::write(top.join(".kube1.stamp.tmp"), &first[..10]).unwrap();
    std::fs::remove_file(&stamp).unwrap();
    assert!(changed(&host, &driver));
    assert!(!top.join(".kube1.new").exists() && !top.join(".kube1.stamp.tmp").exists());
    assert_eq!(
        ino(&tree_dir(dir.path()).join(LIB).join("libcuda.so.9.1")),
        ino(&host_lib)
    );
    let second = std::fs::read(&stamp).unwrap();
    assert_ne!(first, second);
    assert_eq!(
        String::from_utf8(second.clone()).unwrap(),
        stamp_now(dir.path(), &host, &driver)
    );
    // Killed after the swap, before the stamp: the new tree is walked, found right, stamped.
    std::fs::remove_file(&stamp).unwrap();
    assert!(!changed(&host, &driver));
    assert_eq!(std::fs::read(&stamp).unwrap(), second);
    // A stamp of an earlier tree at the same plan (its top was another directory): walked.
    tick();
    std::fs::remove_file(tree_dir(dir.path()).join("usr/bin/nvidia-smi")).unwrap();
    assert!(changed(&host, &driver));
    std::fs::write(&stamp, &second).unwrap();
    assert!(!changed(&host, &driver));
    assert_ne!(std::fs::read(&stamp).unwrap(), second);
}

/// post-start's verification of the driver root failed: the stamp goes (the error is
/// returned as it was), so the next pre-start walks the tree; no tree directory is fine.
#[test]
fn distrust_removes_the_stamp_and_keeps_the_error() {
    let (dir, host, driver) = host();
    let e = distrust(&host, &kube1(), anyhow::anyhow!("driver root wrong"));
    assert_eq!(format!("{e:#}"), "driver root wrong");
    assert!(!top_dir(dir.path()).exists());
    assert!(changed(&host, &driver));
    let stamp = stamp_path(dir.path());
    assert!(stamp.is_file());
    let e = distrust(&host, &kube1(), anyhow::anyhow!("driver root wrong"));
    assert_eq!(format!("{e:#}"), "driver root wrong");
    assert!(!stamp.exists());
    assert!(!changed(&host, &driver));
    assert!(stamp.is_file());
}

#[test]
fn a_link_in_place_of_the_tree_is_replaced_not_followed() {
    let (dir, host, driver) = host();
    let elsewhere = dir.path().join("elsewhere");
    std::fs::create_dir_all(elsewhere.join("keep")).unwrap();
    let top = dir.path().join("var/lib/nspawn-lifecycle/driver-root");
    std::fs::create_dir_all(&top).unwrap();
    std::os::unix::fs::symlink(&elsewhere, top.join("kube1")).unwrap();
    std::os::unix::fs::symlink(&elsewhere, top.join(".kube1.new")).unwrap();
    assert!(
        ensure(&host, &kube1(), &mut plan(&host, &driver).unwrap())
            .unwrap()
            .changed
    );
    assert!(elsewhere.join("keep").is_dir());
    assert!(top.join("kube1").symlink_metadata().unwrap().is_dir());
}

/// A driver file that is a link on the host (Debian's `/usr/bin/nvidia-smi` →
/// `/etc/alternatives/…`, absolute) resolves inside the host root: the tree links the file it
/// names there; one whose target is missing in the host root is refused by name, and the
/// real `/etc/shadow` it names is never reached.
#[test]
fn a_host_driver_file_that_is_a_link_resolves_inside_the_host_root() {
    let (dir, host, driver) = host();
    let smi = dir.path().join("usr/bin/nvidia-smi");
    std::fs::remove_file(&smi).unwrap();
    std::fs::create_dir_all(dir.path().join("etc/alternatives")).unwrap();
    std::fs::create_dir_all(dir.path().join("usr/lib/nvidia")).unwrap();
    let real = dir.path().join("usr/lib/nvidia/nvidia-smi");
    std::fs::write(&real, b"real smi").unwrap();
    std::os::unix::fs::symlink(
        "/usr/lib/nvidia/nvidia-smi",
        dir.path().join("etc/alternatives/nvidia-smi"),
    )
    .unwrap();
    std::os::unix::fs::symlink("/etc/alternatives/nvidia-smi", &smi).unwrap();
    ensure(&host, &kube1(), &mut plan(&host, &driver).unwrap()).unwrap();
    assert_eq!(
        ino(&tree_dir(dir.path()).join("usr/bin/nvidia-smi")),
        ino(&real)
    );
    std::fs::remove_file(&smi).unwrap();
    std::os::unix::fs::symlink("/etc/shadow", &smi).unwrap();
    let e = format!("{:#}", plan(&host, &driver).unwrap_err());
    assert!(
        e.contains("host driver file /usr/bin/nvidia-smi (resolving it)"),
        "{e}"
    );
}

/// No driver: the tree (and one older versions left on /run) goes, with the old driver's
/// inodes it held; nothing is created on a host that never had one.
#[test]
fn remove_takes_the_tree_and_the_legacy_one_and_creates_nothing() {
    let (dir, host, driver) = host();
    assert!(!remove(&host, &kube1()).unwrap());
    assert!(!dir.path().join("var/lib/nspawn-lifecycle").exists());
    ensure(&host, &kube1(), &mut plan(&host, &driver).unwrap()).unwrap();
    let legacy = dir
        .path()
        .join("run/nspawn-lifecycle/driver-root/kube1/usr");
    std::fs::create_dir_all(&legacy).unwrap();
    std::fs::write(legacy.join("f"), b"").unwrap();
    assert!(stamp_path(dir.path()).is_file());
    assert!(remove(&host, &kube1()).unwrap());
    assert!(!tree_dir(dir.path()).exists());
    assert!(!stamp_path(dir.path()).exists());
    assert!(!legacy.exists());
    assert!(dir.path().join(LIB).join("libcuda.so.9.1").is_file());
}

/// `uninstall`'s removal takes the stamp beside the tree too.
#[test]
fn remove_path_takes_the_stamp_too() {
    let (dir, host, driver) = host();
    assert!(changed(&host, &driver));
    assert!(stamp_path(dir.path()).is_file());
    let tree = "/var/lib/nspawn-lifecycle/driver-root/kube1";
    assert!(remove_path(&host, tree).unwrap());
    assert!(!stamp_path(dir.path()).exists() && !tree_dir(dir.path()).exists());
    assert!(!remove_path(&host, tree).unwrap());
}

/// Root only: a driver file on another filesystem than the tree (here a tmpfs mounted on the
/// host's /usr/bin) cannot be hard-linked (EXDEV): it is a mount point with a read-only bind.
#[test]
fn privileged_a_file_on_another_filesystem_is_bound_instead() {
    assert!(nix::unistd::geteuid().is_root(), "this test mounts a tmpfs");
    let (dir, host, driver) = host();
    let bin = dir.path().join("usr/bin");
    nix::mount::mount(
        Some("tmpfs"),
        &bin,
        Some("tmpfs"),
        nix::mount::MsFlags::empty(),
        None::<&str>,
    )
    .unwrap();
    struct Umount<'a>(&'a Path);
    impl Drop for Umount<'_> {
        fn drop(&mut self) {
            let _ = nix::mount::umount2(self.0, nix::mount::MntFlags::MNT_DETACH);
        }
    }
    let _u = Umount(&bin);
    std::fs::write(bin.join("nvidia-smi"), b"smi").unwrap();
    let mut plan = plan(&host, &driver).unwrap();
    assert_eq!(
        plan.tree.get("usr/bin/nvidia-smi"),
        Some(&TreeNode::Bound("/usr/bin/nvidia-smi".into()))
    );
    assert!(ensure(&host, &kube1(), &mut plan).unwrap().changed);
    let mp = tree_dir(dir.path()).join("usr/bin/nvidia-smi");
    let st = std::fs::symlink_metadata(&mp).unwrap();
    assert!(st.is_file() && st.len() == 0 && st.ino() != ino(&bin.join("nvidia-smi")));
    let binds: Vec<_> = layout::file_binds(&plan.tree)
        .unwrap()
        .into_iter()
        .map(|b| (b.source.to_string(), b.target.to_string()))
        .collect();
    assert_eq!(
        binds,
        [(
            "/usr/bin/nvidia-smi".to_owned(),
            "/run/nvidia/driver/usr/bin/nvidia-smi".to_owned()
        )]
    );
    // Unchanged next time: the mount point is not taken for a missing link.
    assert!(
        !ensure(
            &host,
            &kube1(),
            &mut crate::model::tree::plan(&host, &driver).unwrap()
        )
        .unwrap()
        .changed
    );
}

/// `chattr flag path`, as root.
fn chattr(flag: &str, path: &std::path::Path) {
    let ok = std::process::Command::new("chattr")
        .arg(flag)
        .arg(path)
        .status()
        .unwrap()
        .success();
    assert!(ok, "chattr {flag} {} failed", path.display());
}

/// Root only: a file the kernel would refuse to link (immutable or append-only: EPERM) is
/// planned as a bind, so the tree is built as planned (and stamped) with nothing left to bind
/// behind the plan's back.
#[test]
fn privileged_the_plan_binds_a_file_the_kernel_would_refuse_to_link() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test sets the immutable flag"
    );
    for flag in ["i", "a"] {
        let (dir, host, driver) = host();
        let smi = dir.path().join("usr/bin/nvidia-smi");
        chattr(&format!("+{flag}"), &smi);
        let mut plan = plan(&host, &driver).unwrap();
        let built = ensure(&host, &kube1(), &mut plan);
        chattr(&format!("-{flag}"), &smi);
        assert_eq!(
            plan.tree.get("usr/bin/nvidia-smi"),
            Some(&TreeNode::Bound("/usr/bin/nvidia-smi".into())),
            "+{flag}"
        );
        assert_eq!(built.unwrap().unlinked, [], "+{flag}");
        assert!(stamp_path(dir.path()).exists(), "+{flag}");
    }
}

/// Root only: a file the kernel refuses to link when the plan did not foresee it (made
/// immutable after the plan: EPERM) is bound instead, named with its errno in
/// [`Built::unlinked`].
#[test]
fn privileged_a_file_the_kernel_refuses_to_link_is_bound_and_named() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test sets the immutable flag"
    );
    let (dir, host, driver) = host();
    let smi = dir.path().join("usr/bin/nvidia-smi");
    let mut plan = plan(&host, &driver).unwrap();
    chattr("+i", &smi);
    let built = ensure(&host, &kube1(), &mut plan);
    chattr("-i", &smi);
    let built = built.unwrap();
    // Not stamped: its plan says a hard link where it holds a mount point.
    assert!(!stamp_path(dir.path()).exists());
    assert_eq!(
        built.unlinked,
        [("usr/bin/nvidia-smi".to_owned(), Errno::EPERM)]
    );
    assert_eq!(
        plan.tree.get("usr/bin/nvidia-smi"),
        Some(&TreeNode::Bound("/usr/bin/nvidia-smi".into()))
    );
    let mp = tree_dir(dir.path()).join("usr/bin/nvidia-smi");
    assert_eq!(std::fs::symlink_metadata(&mp).unwrap().len(), 0);
    // The library beside it is still a link.
    let lib = tree_dir(dir.path()).join(LIB).join("libcuda.so.9.1");
    assert_eq!(ino(&lib), ino(&dir.path().join(LIB).join("libcuda.so.9.1")));
}

/// The machine these tests build trees for.
fn kube1() -> MachineName {
    "kube1".parse().unwrap()
}
