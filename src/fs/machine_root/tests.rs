use super::*;
use std::os::unix::fs::MetadataExt as _;

const P: Point = Point::MidCdiWrite;

fn root() -> (tempfile::TempDir, MachineRoot) {
    let dir = tempfile::tempdir().unwrap();
    let root = MachineRoot::open(dir.path()).unwrap();
    (dir, root)
}

#[test]
fn create_dir_all_follows_machine_symlinks_inside_the_root_only() {
    let (dir, root) = root();
    std::fs::create_dir(dir.path().join("run")).unwrap();
    std::fs::create_dir(dir.path().join("var")).unwrap();
    // Absolute and escaping relative links both land inside the machine.
    std::os::unix::fs::symlink("/run", dir.path().join("var/run")).unwrap();
    std::os::unix::fs::symlink("../../../../../../../../x", dir.path().join("run/up")).unwrap();
    let d = root.create_dir_all("/var/run/cdi", 0o755).unwrap();
    assert_eq!(d.path(), "/var/run/cdi");
    assert!(dir.path().join("run/cdi").is_dir());
    let meta = std::fs::metadata(dir.path().join("run/cdi")).unwrap();
    assert_eq!(meta.mode() & 0o7777, 0o755);
    // `/run/up` dangles inside the machine: creating through it fails cleanly.
    let err = root.create_dir_all("/run/up/a", 0o755).unwrap_err();
    assert!(format!("{err:#}").contains("/run/up"), "{err:#}");
}

#[test]
fn write_file_is_atomic_and_skips_unchanged_bytes() {
    let (dir, root) = root();
    let d = root.create_dir_all("/etc/cdi", 0o755).unwrap();
    assert!(d.write_file("a.json", b"{}", 0o644, P).unwrap());
    let ino = std::fs::metadata(dir.path().join("etc/cdi/a.json"))
        .unwrap()
        .ino();
    assert!(!d.write_file("a.json", b"{}", 0o644, P).unwrap());
    assert_eq!(
        std::fs::metadata(dir.path().join("etc/cdi/a.json"))
            .unwrap()
            .ino(),
        ino
    );
    assert!(d.write_file("a.json", b"{ }", 0o644, P).unwrap());
    assert_eq!(d.read_regular("a.json", 10).unwrap().unwrap(), b"{ }");
    // Shorter and longer contents replace it too (never "file too large").
    assert!(
        d.write_file("a.json", b"{ \"kind\": \"x\" }", 0o644, P)
            .unwrap()
    );
    assert!(d.write_file("a.json", b"{ }", 0o644, P).unwrap());
    assert_eq!(d.read_regular("a.json", 10).unwrap().unwrap(), b"{ }");
    let names: Vec<_> = d.entries().unwrap().into_iter().map(|e| e.0).collect();
    assert_eq!(names, [OsString::from("a.json")]);
    // A symlink where the file goes is replaced, never written through.
    std::os::unix::fs::symlink("/etc/passwd", dir.path().join("etc/cdi/b.json")).unwrap();
    assert!(d.write_file("b.json", b"x", 0o644, P).unwrap());
    assert!(
        std::fs::symlink_metadata(dir.path().join("etc/cdi/b.json"))
            .unwrap()
            .is_file()
    );
}

#[test]
fn symlink_replaces_links_only() {
    let (dir, root) = root();
    let d = root.create_dir_all("/lib", 0o755).unwrap();
    assert_eq!(d.symlink("a", "/x").unwrap(), LinkOutcome::Created);
    assert_eq!(d.symlink("a", "/x").unwrap(), LinkOutcome::Unchanged);
    assert_eq!(d.symlink("a", "/y").unwrap(), LinkOutcome::Replaced);
    assert_eq!(d.read_link("a").unwrap().unwrap(), "/y");
    std::fs::write(dir.path().join("lib/b"), b"keep").unwrap();
    assert_eq!(
        d.symlink("b", "/y").unwrap(),
        LinkOutcome::Blocked(FileKind::File)
    );
    assert_eq!(std::fs::read(dir.path().join("lib/b")).unwrap(), b"keep");
}

#[test]
fn remove_tree_never_follows_symlinks() {
    let (dir, root) = root();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("precious"), b"x").unwrap();
    std::fs::create_dir_all(dir.path().join("t/a/b")).unwrap();
    std::os::unix::fs::symlink(outside.path(), dir.path().join("t/a/b/out")).unwrap();
    std::os::unix::fs::symlink(outside.path(), dir.path().join("t/a/out2")).unwrap();
    let top = root.root_dir().unwrap();
    assert!(top.remove_tree("t").unwrap());
    assert!(!dir.path().join("t").exists());
    assert!(outside.path().join("precious").exists());
    assert!(!top.remove_tree("t").unwrap());
}

#[test]
fn remove_tree_is_bounded() {
    let (dir, root) = root();
    let mut p = dir.path().join("deep");
    for _ in 0..(MAX_DEPTH + 2) {
        p.push("d");
    }
    std::fs::create_dir_all(&p).unwrap();
    let err = root.root_dir().unwrap().remove_tree("deep").unwrap_err();
    assert!(format!("{err:#}").contains("deeper"), "{err:#}");
}

#[test]
fn exchange_swaps_two_trees() {
    let (dir, root) = root();
    std::fs::create_dir_all(dir.path().join("a/x")).unwrap();
    std::fs::create_dir_all(dir.path().join("b/y")).unwrap();
    let top = root.root_dir().unwrap();
    top.exchange("a", "b").unwrap();
    assert!(dir.path().join("a/y").is_dir());
    assert!(dir.path().join("b/x").is_dir());
}

#[test]
fn in_root_resolution_survives_concurrent_renames() {
    // Renames anywhere in the system make the kernel refuse a racing `..` with EAGAIN.
    let (dir, root) = root();
    std::fs::create_dir_all(dir.path().join("run/cdi")).unwrap();
    std::fs::create_dir(dir.path().join("var")).unwrap();
    std::os::unix::fs::symlink("../run", dir.path().join("var/run")).unwrap();
    let other = tempfile::tempdir().unwrap();
    std::fs::create_dir(other.path().join("a")).unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let renamer = {
        let (stop, base) = (stop.clone(), other.path().to_owned());
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                std::fs::rename(base.join("a"), base.join("b")).unwrap();
                std::fs::rename(base.join("b"), base.join("a")).unwrap();
            }
        })
    };
    for _ in 0..20_000 {
        root.open_dir("/var/run/cdi").unwrap().unwrap();
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    renamer.join().unwrap();
}

#[test]
fn the_host_root_is_never_a_machine_root() {
    let pid = std::process::id();
    let proc_dir = nix::fcntl::open(
        format!("/proc/{pid}").as_str(),
        nix::fcntl::OFlag::O_PATH | nix::fcntl::OFlag::O_DIRECTORY,
        nix::sys::stat::Mode::empty(),
    )
    .unwrap();
    let err = MachineRoot::for_leader_dir(&proc_dir, pid).unwrap_err();
    assert!(format!("{err:#}").contains("host's root"), "{err:#}");
    let (dir, root) = root();
    root.refuse_host_root(Path::new("/")).unwrap();
    assert!(root.refuse_host_root(dir.path()).is_err());
}

#[test]
fn paths_must_be_plain_and_absolute() {
    let (_dir, root) = root();
    assert!(root.open_dir("run").is_err());
    assert!(root.open_dir("/run/../etc").is_err());
    assert!(root.root_dir().unwrap().symlink("a/b", "x").is_err());
    assert!(root.root_dir().unwrap().symlink("..", "x").is_err());
}

/// Only a regular file is ever opened, through the inode that was checked: a symlink or a
/// FIFO (which would block a plain open) gives `None` (device nodes: tests/hostile.rs), and
/// the descriptor returned is the checked file's.
#[test]
fn open_regular_opens_only_the_checked_regular_file() {
    let (dir, root) = root();
    let d = root.create_dir_all("/images", 0o755).unwrap();
    std::fs::write(dir.path().join("images/a.tar"), b"tar").unwrap();
    std::os::unix::fs::symlink("/etc/passwd", dir.path().join("images/link.tar")).unwrap();
    nix::unistd::mkfifo(&dir.path().join("images/fifo.tar"), Mode::S_IRWXU).unwrap();
    let (mut f, st) = d.open_regular("a.tar").unwrap().unwrap();
    let md = std::fs::metadata(dir.path().join("images/a.tar")).unwrap();
    assert_eq!((st.st_dev, st.st_ino), (md.dev(), md.ino()));
    let mut got = Vec::new();
    f.read_to_end(&mut got).unwrap();
    assert_eq!(got, b"tar");
    for name in ["link.tar", "fifo.tar", "missing.tar"] {
        assert!(d.open_regular(name).unwrap().is_none(), "{name}");
    }
}

#[test]
fn resolves_follows_links_inside_the_machine_only() {
    let t = tempfile::tempdir().unwrap();
    let m = t.path();
    std::fs::create_dir_all(m.join("usr/lib")).unwrap();
    std::fs::write(m.join("usr/lib/real"), b"").unwrap();
    let link = |target: &str, name: &str| {
        std::os::unix::fs::symlink(target, m.join("usr/lib").join(name)).unwrap();
    };
    link("/usr/lib/real", "abs");
    link("real", "rel");
    link("/etc/passwd", "host-only"); // exists on the host, not in the machine
    link("../../../../../../etc/passwd", "dotdot");
    link("/nowhere", "dangling");
    link("loop", "loop");
    let root = MachineRoot::open(m).unwrap();
    for (name, want) in [
        ("real", true),
        ("abs", true),
        ("rel", true),
        ("host-only", false),
        ("dotdot", false),
        ("dangling", false),
        ("loop", false),
        ("missing", false),
    ] {
        assert_eq!(
            root.resolves(&format!("/usr/lib/{name}")).unwrap(),
            want,
            "{name}"
        );
    }
    assert!(!root.resolves("/no/such/dir/x").unwrap());
}
