//! The machine rootfs is hostile (DESIGN §5, issues 3 and 7): for every path the rewiring steps
//! touch, a rootfs where that path is a symlink out of the machine (absolute, relative to the
//! sibling host tree, or `../` × 32), a FIFO, a device node, a file where a directory belongs, a
//! directory where a file belongs, read-only, or a bind mount of a host directory. Every step
//! must succeed inside the machine or fail with an error naming the path, and a checksum of the
//! host tree beside the machine root (decoys at every path a redirected step would hit) must not
//! change by a single inode, mtime or byte. Each case's outcome, step by step, is pinned in
//! `tests/golden/hostile-outcomes.txt` (rewritten only with `UPDATE_GOLDEN=1`; review the diff).

#![allow(clippy::unwrap_used)] // helpers outside #[test] fns; a panic is the failure report

mod rewire_support;

use nix::mount::{MntFlags, MsFlags};
use nix::sys::stat::{Mode, SFlag};
use nspawn_lifecycle::config::{Config, MachineConfig};
use nspawn_lifecycle::fs::host::HostRoot;
use nspawn_lifecycle::fs::machine_root::MachineRoot;
use nspawn_lifecycle::systemd::services::Services;
use nspawn_lifecycle::systemd::{ExitStatus, TransientOutcome};
use rewire_support::*;
use std::cell::RefCell;
use std::os::fd::BorrowedFd;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The staged-images directory (the default `stagedImagesDir`), without its leading `/`.
const STAGED: &str = "var/lib/nspawn-lifecycle/images";

/// A temp dir holding `machine/` (a Debian-like machine root) and `host/` (decoys laid out like
/// the paths the helper touches, so any escape lands on one).
struct World {
    tmp: tempfile::TempDir,
    machine: PathBuf,
    host: PathBuf,
}

/// Held for writing by the racing attacker, for reading by every other test. Its renames make the
/// kernel refuse any racing `..` resolution anywhere in the system (`openat2` answers `EAGAIN`,
/// which `machine_root` retries a bounded number of times), so the outcomes the other tests pin
/// (`ELOOP` for a `..` loop) hold only while it is not running beside them.
static RENAMES: std::sync::RwLock<()> = std::sync::RwLock::new(());

fn world() -> World {
    // On tmpfs, like the machine's /run where most of these paths live: the hundreds of worlds
    // below would otherwise spend half a minute in ext4 fsyncs.
    let shm = Path::new("/dev/shm");
    let tmp = if shm.is_dir() {
        tempfile::tempdir_in(shm).unwrap()
    } else {
        tempfile::tempdir().unwrap()
    };
    let machine = tmp.path().join("machine");
    let host = tmp.path().join("host");
    debian_machine(&machine);
    let h = |p: &str| host.join(p);
    for d in [
        "etc/cdi",
        "run/cdi",
        "run/nvidia/driver/usr/lib/x86_64-linux-gnu",
        "run/nvidia/.driver.new",
        "run/nvidia-persistenced",
        "var/run/cdi",
        "usr/lib/x86_64-linux-gnu/vdpau",
        "usr/bin",
        "dev/char",
        "run/nspawn-lifecycle",
        "var/lib/nspawn-lifecycle/images/failed",
    ] {
        std::fs::create_dir_all(h(d)).unwrap();
    }
    // Tarballs: the machine's own (one good, one bad, one set aside by an earlier start), and
    // host decoys whose bytes say "host" should an import ever read one.
    let m = |p: &str| machine.join(p);
    std::fs::create_dir_all(m(&format!("{STAGED}/failed"))).unwrap();
    std::fs::write(m(&format!("{STAGED}/app.tar")), "machine good\n").unwrap();
    std::fs::write(m(&format!("{STAGED}/bad.tar")), "machine bad\n").unwrap();
    std::fs::write(
        m(&format!("{STAGED}/failed/bad.tar")),
        "machine bad, older\n",
    )
    .unwrap();
    for p in ["app.tar", "bad.tar", "failed/bad.tar", "failed/bad.tar.1"] {
        std::fs::write(h(&format!("{STAGED}/{p}")), "host\n").unwrap();
    }
    std::fs::create_dir_all(h("run/nspawn-lifecycle/released")).unwrap();
    for unit in ["containerd.service", "kubelet.service"] {
        let decoy = h(&format!("run/nspawn-lifecycle/released/{unit}"));
        std::fs::write(decoy, "host\n").unwrap();
    }
    std::fs::write(h("etc/passwd"), "root:x:0:0::/root:/bin/sh\n").unwrap();
    for p in [
        "etc/cdi/nvidia.yaml",
        "etc/cdi/nvidia.com-gpu.json",
        "run/cdi/nvidia.com-gpu.json",
        "var/run/cdi/nvidia.com-gpu.json",
        "var/run/cdi/other.json",
    ] {
        std::fs::write(h(p), "{\"kind\":\"nvidia.com/gpu\",\"host\":true}\n").unwrap();
    }
    std::fs::write(
        h("run/nvidia/driver/usr/lib/x86_64-linux-gnu/libcuda.so.1"),
        "host lib\n",
    )
    .unwrap();
    std::fs::write(h("run/nvidia/.driver.new/keep"), "host\n").unwrap();
    std::fs::write(h("run/nvidia-persistenced/socket"), "").unwrap();
    // Links that the helper would take for stale ones of its own, were it to look here.
    for (t, p) in [
        (
            "/run/host-nvidia/lib/0/libcuda.so.1",
            "usr/lib/x86_64-linux-gnu/libcuda.so.1",
        ),
        (
            "/run/nvidia/driver/usr/lib/x86_64-linux-gnu/libcuda.so.570.1",
            "usr/lib/x86_64-linux-gnu/libcuda.so.570.1",
        ),
        (
            "/run/host-nvidia/lib/0/vdpau/libvdpau_nvidia.so.570.1",
            "usr/lib/x86_64-linux-gnu/vdpau/libvdpau_nvidia.so.570.1",
        ),
        (
            "/run/nvidia/driver/usr/bin/nvidia-debugdump",
            "usr/bin/nvidia-debugdump",
        ),
        ("/dev/nvidia0", "dev/char/195:0"),
        ("/dev/nvidia-modeset", "dev/char/195:254"),
        ("/dev/dri/card9", "dev/char/226:9"),
    ] {
        symlink(t, h(p)).unwrap();
    }
    World { tmp, machine, host }
}

impl World {
    /// Checksum of everything in the temp dir except the machine root.
    fn host_snapshot(&self) -> Snapshot {
        snapshot(self.tmp.path(), &[self.machine.as_path()])
    }

    fn in_machine(&self, p: &str) -> PathBuf {
        self.machine.join(p.trim_start_matches('/'))
    }

    fn in_host(&self, p: &str) -> PathBuf {
        self.host.join(p.trim_start_matches('/'))
    }

    /// Clear whatever the machine has at `p` (never following it) and make sure its parent exists.
    fn clear(&self, p: &str) -> PathBuf {
        let at = self.in_machine(p);
        std::fs::create_dir_all(at.parent().unwrap()).unwrap();
        match std::fs::symlink_metadata(&at) {
            Ok(m) if m.is_dir() => std::fs::remove_dir_all(&at).unwrap(),
            Ok(_) => std::fs::remove_file(&at).unwrap(),
            Err(_) => {}
        }
        at
    }
}

/// Whether a path is a directory or a file in a healthy machine; decides which plants apply.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Expect {
    Dir,
    File,
}

/// Every path the rewiring steps create, replace, read or delete, or resolve through.
const TARGETS: &[(&str, Expect)] = &[
    ("/run", Expect::Dir),
    ("/run/nvidia", Expect::Dir),
    ("/run/nvidia/driver", Expect::Dir),
    ("/run/nvidia/.driver.new", Expect::Dir),
    ("/run/cdi", Expect::Dir),
    ("/var", Expect::Dir),
    ("/var/run", Expect::Dir),
    ("/var/run/cdi", Expect::Dir),
    ("/etc", Expect::Dir),
    ("/etc/cdi", Expect::Dir),
    ("/usr", Expect::Dir),
    ("/usr/lib", Expect::Dir),
    ("/usr/lib/x86_64-linux-gnu", Expect::Dir),
    ("/usr/lib/x86_64-linux-gnu/vdpau", Expect::Dir),
    ("/usr/bin", Expect::Dir),
    ("/dev", Expect::Dir),
    ("/dev/char", Expect::Dir),
    ("/run/nspawn-lifecycle", Expect::Dir),
    ("/var/run/cdi/nvidia.com-gpu.json", Expect::File),
    ("/var/run/cdi/.nvidia.com-gpu.json.tmp", Expect::File),
    ("/etc/cdi/nvidia.yaml", Expect::File),
    ("/usr/lib/x86_64-linux-gnu/libcuda.so.1", Expect::File),
    (
        "/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05",
        Expect::File,
    ),
    ("/usr/lib/x86_64-linux-gnu/.libcuda.so.1.tmp", Expect::File),
    ("/usr/bin/nvidia-smi", Expect::File),
    ("/dev/char/195:0", Expect::File),
    ("/dev/char/195:254", Expect::File),
    ("/var/lib", Expect::Dir),
    ("/var/lib/nspawn-lifecycle", Expect::Dir),
    ("/var/lib/nspawn-lifecycle/images", Expect::Dir),
    ("/var/lib/nspawn-lifecycle/images/failed", Expect::Dir),
    ("/var/lib/nspawn-lifecycle/images/app.tar", Expect::File),
    (
        "/var/lib/nspawn-lifecycle/images/failed/bad.tar",
        Expect::File,
    ),
];

#[derive(Clone, Copy, Debug)]
enum Plant {
    /// Absolute symlink to the same path in the host tree.
    SymlinkAbsolute,
    /// Relative symlink from the machine to the same path in the sibling host tree.
    SymlinkSibling,
    /// `../` × 32 then the host tree's absolute path.
    SymlinkDotDot,
    Fifo,
    CharDevice,
    /// A regular file where a directory belongs.
    File,
    /// A directory (with a file in it) where a file belongs.
    Dir,
}

const UNPRIVILEGED: &[Plant] = &[
    Plant::SymlinkAbsolute,
    Plant::SymlinkSibling,
    Plant::SymlinkDotDot,
    Plant::Fifo,
    Plant::File,
    Plant::Dir,
];

fn plant(w: &World, p: &str, how: Plant) {
    let at = w.clear(p);
    let host_abs = w.in_host(p);
    match how {
        Plant::SymlinkAbsolute => symlink(&host_abs, &at).unwrap(),
        Plant::SymlinkSibling => {
            // From the link's real directory (which may sit behind `var/run → ../run`).
            let dir = std::fs::canonicalize(at.parent().unwrap()).unwrap();
            let depth = dir
                .strip_prefix(w.tmp.path().canonicalize().unwrap())
                .unwrap()
                .components()
                .count();
            let rel = format!("{}host/{}", "../".repeat(depth), p.trim_start_matches('/'));
            symlink(rel, &at).unwrap();
        }
        Plant::SymlinkDotDot => {
            let rel = format!(
                "{}{}",
                "../".repeat(32),
                host_abs.to_str().unwrap().trim_start_matches('/')
            );
            symlink(rel, &at).unwrap();
        }
        Plant::Fifo => nix::unistd::mkfifo(&at, Mode::from_bits_truncate(0o644)).unwrap(),
        Plant::CharDevice => nix::sys::stat::mknod(
            &at,
            SFlag::S_IFCHR,
            Mode::from_bits_truncate(0o666),
            nix::sys::stat::makedev(1, 3),
        )
        .unwrap_or_else(|e| panic!("mknod {}: {e} (privileged test: run as root)", at.display())),
        Plant::File => std::fs::write(&at, "planted\n").unwrap(),
        Plant::Dir => {
            std::fs::create_dir(&at).unwrap();
            std::fs::write(at.join("inside"), "planted\n").unwrap();
        }
    }
}

/// The machine's systemd as the import step uses it: `run` reads what `ctr` would read (its
/// stdin) and fails an import whose bytes say "bad"; nothing else is called.
#[derive(Default)]
struct Ctr {
    /// The bytes of every tarball an import was handed.
    read: RefCell<Vec<String>>,
}

impl Services for Ctr {
    fn stop(&self, unit: &str) -> anyhow::Result<()> {
        panic!("import step stopped {unit}")
    }
    fn start(&self, unit: &str) -> anyhow::Result<()> {
        panic!("import step started {unit}")
    }
    fn is_active(&self, unit: &str) -> anyhow::Result<bool> {
        panic!("import step asked about {unit}")
    }
    fn run(
        &self,
        prefix: &str,
        argv: &[&str],
        stdin: Option<BorrowedFd<'_>>,
        _: Duration,
    ) -> anyhow::Result<TransientOutcome> {
        assert_eq!(argv.last(), Some(&"-"), "{argv:?}");
        let fd = stdin.expect("an import reads its tarball from stdin");
        let mut buf = vec![0u8; 4096];
        let n = nix::sys::uio::pread(fd, &mut buf, 0).unwrap();
        let bytes = String::from_utf8_lossy(&buf[..n]).into_owned();
        let bad = bytes.contains("bad");
        self.read.borrow_mut().push(bytes);
        Ok(TransientOutcome {
            unit: format!("{prefix}-1.service"),
            exit_status: ExitStatus::Exited(i32::from(bad)),
            result: if bad { "exit-code" } else { "success" }.into(),
            output: String::new(),
            output_dropped: 0,
            elapsed: Duration::ZERO,
        })
    }
}

/// The default machine settings (staged images in [`STAGED`]).
fn machine_config() -> MachineConfig {
    let dir = tempfile::tempdir().unwrap();
    Config::default()
        .machine(&HostRoot::new(dir.path()), &"kube1".parse().unwrap())
        .unwrap()
}

/// post-start's import step against `root`; every tarball it handed to `ctr` must be one of
/// the machine's own (its bytes start with "machine"), never a host decoy.
fn import_step(root: &MachineRoot, mc: &MachineConfig) -> anyhow::Result<(usize, usize)> {
    let ctr = Ctr::default();
    let kube1 = "kube1".parse().unwrap();
    let who = nspawn_lifecycle::types::machine_name::Subject::Machine(&kube1);
    let r = nspawn_lifecycle::apply::images::import_images(who, root, mc, &ctr);
    for bytes in ctr.read.borrow().iter() {
        assert!(bytes.starts_with("machine"), "ctr read {bytes:?}");
    }
    r
}

/// How one step ended.
#[derive(Debug)]
enum Outcome {
    /// Succeeded; what it did, where that tells cases apart.
    Ok(String),
    Failed(String),
}

/// Run every rewiring step (GPU host, then no-GPU cleanup) against the machine, checking each
/// success landed inside the machine and each failure names one of `names`.
fn run_steps(root: &MachineRoot, names: &[&str]) -> Vec<(&'static str, Outcome)> {
    let inv = inventory(NEW);
    let driver = inv.driver.as_ref().unwrap();
    let mut out = Vec::new();
    let mut record = |step: &'static str, r: anyhow::Result<String>| {
        let o = match r {
            Ok(what) => Outcome::Ok(what),
            Err(e) => {
                let msg = format!("{e:#}");
                assert!(
                    names.iter().any(|p| msg.contains(p)),
                    "{step} failed without naming any of {names:?}: {msg}"
                );
                Outcome::Failed(msg)
            }
        };
        out.push((step, o));
    };
    // The driver root is nspawn's binds: post-start only reads it (tests/rewire.rs checks it
    // against planted trees); the steps below are the ones that write.
    let r = rebuild_links(root, &inv);
    // A success put the versioned links into the machine's multiarch dir (when it has one; a case
    // plants at most one of the two names).
    if r.is_ok()
        && let Ok(Some(d)) = root.open_dir("/usr/lib/x86_64-linux-gnu")
    {
        let ours = ["libcuda", "libnvidia-ml"].iter().any(|n| {
            let versioned = format!("{n}.so.{NEW}");
            d.read_link(&versioned).ok().flatten().is_some_and(|t| {
                t.to_string_lossy()
                    .starts_with("/run/nvidia/driver/usr/lib/x86_64-linux-gnu/")
            })
        });
        assert!(ours, "library links not visible inside the machine");
    }
    record("links", r.map(|_| String::new()));
    // Every other spec "conflicts", so an escaped step would delete host decoys.
    let r = write_cdi(root, CDI_DIR, CDI_FILE, &spec(NEW), |_, _| true);
    if r.is_ok() {
        let got = root
            .read_file(&format!("{CDI_DIR}/{CDI_FILE}"), 1 << 20)
            .unwrap();
        assert_eq!(
            got.as_deref(),
            Some(spec(NEW).as_slice()),
            "spec not where the machine reads it"
        );
    }
    record("CDI spec", r.map(|_| String::new()));
    // The unit gate's markers are host files (src/apply/gate.rs): no step writes them in the machine.
    let r = import_step(root, &machine_config());
    record(
        "images",
        r.map(|(ok, bad)| format!("{ok} imported, {bad} set aside")),
    );
    // What cleanup left alone (a bind mount it would not cross) tells cases apart.
    record(
        "cleanup",
        cleanup(root, CDI_DIR, CDI_FILE).map(|r| {
            r.kept
                .iter()
                .map(|(p, _)| format!("kept {p}"))
                .collect::<Vec<_>>()
                .join(", ")
        }),
    );
    let _ = driver;
    out
}

/// Run every (target, plant) pair, assert the host is untouched, and return the outcome table.
fn run_table(plants: &[Plant]) -> Vec<String> {
    let mut table = Vec::new();
    for &(path, expect) in TARGETS {
        for &how in plants {
            match (expect, how) {
                (Expect::Dir, Plant::Dir) | (Expect::File, Plant::File) => continue,
                _ => {}
            }
            let w = world();
            plant(&w, path, how);
            let before = w.host_snapshot();
            let root = MachineRoot::open(&w.machine).unwrap();
            let steps = run_steps(&root, &[path]);
            assert_eq!(
                before,
                w.host_snapshot(),
                "host tree changed with {path} planted as {how:?}"
            );
            let summary: Vec<String> = steps
                .iter()
                .map(|(s, o)| match o {
                    Outcome::Ok(w) if w.is_empty() => format!("{s}: ok"),
                    Outcome::Ok(w) => format!("{s}: ok ({w})"),
                    Outcome::Failed(m) => format!("{s}: FAILED ({m})"),
                })
                .collect();
            let line = format!("{path} as {how:?}: {}", summary.join("; "));
            table.push(line.replace(w.tmp.path().to_str().unwrap(), "<tmp>"));
        }
    }
    table
}

/// Compare the outcome table with its golden file `tests/golden/hostile-outcomes-<case>.txt`:
/// every case's outcome is pinned, step by step. `UPDATE_GOLDEN=1` rewrites it.
fn golden_outcomes(case: &str, table: &[String]) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(format!("tests/golden/hostile-outcomes-{case}.txt"));
    let actual = table.join("\n") + "\n";
    if std::env::var_os("UPDATE_GOLDEN").is_some_and(|v| v == "1") {
        std::fs::write(&path, &actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (run with UPDATE_GOLDEN=1)", path.display()));
    let (want, got): (Vec<&str>, Vec<&str>) =
        (expected.lines().collect(), actual.lines().collect());
    for (w, g) in want.iter().zip(&got) {
        assert_eq!(w, g, "outcome changed (golden {})", path.display());
    }
    assert_eq!(
        want.len(),
        got.len(),
        "case count changed (golden {})",
        path.display()
    );
}

#[test]
fn planted_symlinks_fifos_files_and_dirs_never_reach_the_host() {
    let _shared = RENAMES.read().unwrap_or_else(|e| e.into_inner());
    let table = run_table(UNPRIVILEGED);
    // tests/README.md quotes these counts: 33 paths, each with the 6 plants that apply to it
    // (a file where a file belongs, a directory where a directory belongs, are no plants).
    assert_eq!(TARGETS.len(), 33, "tests/README.md quotes 33 paths");
    assert_eq!(UNPRIVILEGED.len(), 6);
    assert_eq!(table.len(), 165);
    golden_outcomes("unprivileged", &table);
}

/// Names the helper owns outright (the spec and temp names) are replaced whatever was planted
/// there; link names it shares with the machine's packages
/// and udev are left alone when they hold something other than a symlink. Either way the step
/// succeeds: nothing planted at a leaf can stop the node from starting.
#[test]
fn planted_leaves_never_fail_a_step() {
    let _shared = RENAMES.read().unwrap_or_else(|e| e.into_inner());
    for path in [
        "/var/run/cdi/nvidia.com-gpu.json",
        "/var/run/cdi/.nvidia.com-gpu.json.tmp",
        "/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05",
        "/usr/lib/x86_64-linux-gnu/.libcuda.so.1.tmp",
        "/usr/bin/nvidia-smi",
        "/dev/char/195:0",
    ] {
        for how in [
            Plant::SymlinkAbsolute,
            Plant::SymlinkSibling,
            Plant::SymlinkDotDot,
            Plant::Fifo,
            Plant::File,
        ] {
            let w = world();
            plant(&w, path, how);
            let root = MachineRoot::open(&w.machine).unwrap();
            let inv = inventory(NEW);
            rebuild_links(&root, &inv).unwrap_or_else(|e| panic!("{path} as {how:?}: {e:#}"));
            write_cdi(&root, CDI_DIR, CDI_FILE, &spec(NEW), conflicts)
                .unwrap_or_else(|e| panic!("{path} as {how:?}: {e:#}"));
            let at = w.in_machine(path);
            let kind = std::fs::symlink_metadata(&at).map(|m| m.file_type());
            match path {
                "/var/run/cdi/nvidia.com-gpu.json" => {
                    assert_eq!(std::fs::read(&at).unwrap(), spec(NEW), "{path} as {how:?}")
                }
                p if p.contains("/.") => assert!(kind.is_err(), "{path} as {how:?} left behind"),
                _ if matches!(how, Plant::Fifo | Plant::File) => {
                    assert!(!kind.unwrap().is_symlink(), "{path} as {how:?} replaced")
                }
                _ => assert!(
                    std::fs::read_link(&at).unwrap().starts_with("/"),
                    "{path} as {how:?} not put right"
                ),
            }
        }
    }
}

#[test]
fn machine_root_reached_through_a_symlink() {
    let _shared = RENAMES.read().unwrap_or_else(|e| e.into_inner());
    let w = world();
    let link = w.tmp.path().join("machine-link");
    symlink(&w.machine, &link).unwrap();
    let before = snapshot(w.tmp.path(), &[w.machine.as_path()]);
    let root = MachineRoot::open(&link).unwrap();
    for (step, o) in run_steps(&root, &[]) {
        assert!(matches!(o, Outcome::Ok(_)), "{step}: {o:?}");
    }
    assert_eq!(before, snapshot(w.tmp.path(), &[w.machine.as_path()]));
    // And the machine ended up clean (the last step was the no-GPU cleanup).
    assert!(!w.in_machine("run/nvidia/driver").exists());
}

/// Privileged tests are part of the suite: without root they fail, never skip.
fn privileged() -> bool {
    assert!(
        nix::unistd::geteuid().is_root(),
        "privileged test needs root (mknod, mounts); run the suite as root"
    );
    true
}

#[test]
fn privileged_device_nodes_are_never_opened_or_followed() {
    let _shared = RENAMES.read().unwrap_or_else(|e| e.into_inner());
    if !privileged() {
        return;
    }
    let table = run_table(&[Plant::CharDevice]);
    assert_eq!(table.len(), 33);
    golden_outcomes("char-device", &table);
}

/// Unmounts on drop, so a failing assertion does not leave mounts behind.
struct Mount(PathBuf);

impl Mount {
    fn bind(src: &Path, dst: &Path, read_only: bool) -> Mount {
        nix::mount::mount(Some(src), dst, None::<&str>, MsFlags::MS_BIND, None::<&str>)
            .unwrap_or_else(|e| panic!("bind {} on {}: {e}", src.display(), dst.display()));
        let m = Mount(dst.to_path_buf());
        if read_only {
            nix::mount::mount(
                None::<&str>,
                dst,
                None::<&str>,
                MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY,
                None::<&str>,
            )
            .unwrap();
        }
        m
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.0, MntFlags::MNT_DETACH);
    }
}

#[test]
fn privileged_read_only_dirs_fail_cleanly() {
    let _shared = RENAMES.read().unwrap_or_else(|e| e.into_inner());
    if !privileged() {
        return;
    }
    for path in [
        "/run",
        "/usr/bin",
        "/var/run/cdi",
        "/etc/cdi",
        "/usr/lib/x86_64-linux-gnu",
        "/dev/char",
    ] {
        let w = world();
        let at = w.in_machine(path);
        std::fs::create_dir_all(&at).unwrap();
        let _ro = Mount::bind(&at, &at, true);
        let before = w.host_snapshot();
        let root = MachineRoot::open(&w.machine).unwrap();
        let steps = run_steps(&root, &[path]);
        assert!(
            steps.iter().any(|(_, o)| matches!(o, Outcome::Failed(_))),
            "{path} read-only: nothing failed"
        );
        assert_eq!(before, w.host_snapshot(), "{path} read-only");
    }
}

/// A bind mount in a tree cleanup deletes (nspawn's driver binds of this boot, or what the
/// machine bound there itself, e.g. a host socket dir it sees): removal must not cross into it,
/// and it must not keep the machine from starting either: it is left alone and reported.
#[test]
fn privileged_bind_mounts_in_our_trees_are_not_descended() {
    let _shared = RENAMES.read().unwrap_or_else(|e| e.into_inner());
    if !privileged() {
        return;
    }
    for path in [
        "/run/nvidia/driver",
        "/run/nvidia/.driver.new",
        "/run/nvidia/driver/usr/lib",
    ] {
        let w = world();
        let root = MachineRoot::open(&w.machine).unwrap();
        gpu_pass(&root, &inventory(OLD));
        let at = w.in_machine(path);
        std::fs::create_dir_all(&at).unwrap();
        let _m = Mount::bind(&w.in_host("run/nvidia-persistenced"), &at, false);
        let before = w.host_snapshot();
        let steps = run_steps(&root, &[path]);
        for (s, o) in &steps {
            println!("{path} bind mount: {s}: {o:?}");
        }
        let tree = if path.contains(".driver.new") {
            "/run/nvidia/.driver.new"
        } else {
            "/run/nvidia/driver"
        };
        assert!(
            steps.iter().any(|(s, o)| *s == "cleanup"
                && matches!(o, Outcome::Ok(k) if k.contains(&format!("kept {tree}")))),
            "{path} bind mount: cleanup did not report it kept: {steps:?}"
        );
        assert_eq!(before, w.host_snapshot(), "{path} bind mount");
        assert!(w.in_host("run/nvidia-persistenced/socket").exists());
    }
}

/// The host directories bound whole and writable into a machine (`/dev/nvidia-caps`) sit in
/// its `/dev`, beside `/dev/char`. Root in the machine points `/dev/char` at one (a link), or
/// binds one there: post-start's and refresh-devices' `/dev/char` links must never land in the
/// host's directory. The machine's `/dev` is a tmpfs of its own, as nspawn mounts it.
#[test]
fn privileged_dev_char_links_never_land_in_a_host_directory_bound_into_the_machine() {
    if !privileged() {
        return;
    }
    let wanted: std::collections::BTreeMap<String, String> =
        [("195:0".to_owned(), "/dev/nvidia0".to_owned())].into();
    for attack in ["link", "bind"] {
        let w = world();
        let dev = w.in_machine("/dev");
        std::fs::create_dir_all(&dev).unwrap();
        nix::mount::mount(
            Some("tmpfs"),
            &dev,
            Some("tmpfs"),
            MsFlags::empty(),
            None::<&str>,
        )
        .unwrap();
        let _dev = Mount(dev.clone());
        let caps = w.in_host("/dev/nvidia-caps");
        std::fs::create_dir_all(&caps).unwrap();
        std::fs::create_dir_all(dev.join("nvidia-caps")).unwrap();
        let _caps = Mount::bind(&caps, &dev.join("nvidia-caps"), false);
        let host_dev =
            std::os::unix::fs::MetadataExt::dev(&std::fs::metadata(w.in_host("/dev")).unwrap());
        let root = MachineRoot::open(&w.machine).unwrap();
        // Unattacked, the links are made in the machine's own /dev.
        let made = nspawn_lifecycle::apply::rewire::dev_char(&root, &wanted, true, Some(host_dev));
        assert!(made.is_ok(), "{made:?}");
        assert!(dev.join("char/195:0").symlink_metadata().is_ok());
        std::fs::remove_dir_all(dev.join("char")).unwrap();
        let _char = match attack {
            "link" => {
                symlink("nvidia-caps", dev.join("char")).unwrap();
                None
            }
            _ => {
                std::fs::create_dir_all(dev.join("char")).unwrap();
                Some(Mount::bind(&caps, &dev.join("char"), false))
            }
        };
        let err = nspawn_lifecycle::apply::rewire::dev_char(&root, &wanted, true, Some(host_dev))
            .expect_err(attack);
        println!("{attack}: {err:#}");
        let left: Vec<_> = std::fs::read_dir(&caps).unwrap().collect();
        assert!(
            left.is_empty(),
            "{attack}: links written into the host's directory: {left:?}"
        );
    }
}

/// Paths a racing attacker swaps: the directories post-start's file steps and the import step
/// create, write into, list or resolve through, and the files they replace or read.
const RACED: &[&str] = &[
    "/run",
    "/run/cdi",
    "/etc/cdi",
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu/vdpau",
    "/dev/char",
    "/var/lib/nspawn-lifecycle/images",
    "/var/lib/nspawn-lifecycle/images/failed",
    "/run/cdi/nvidia.com-gpu.json",
    "/etc/cdi/nvidia.yaml",
    "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
    "/var/lib/nspawn-lifecycle/images/app.tar",
    "/var/lib/nspawn-lifecycle/images/bad.tar",
];

/// One swap site: the real entry's parent (held open, so the attacker itself never resolves a
/// path and never follows what it planted), the entry's name, and the sibling symlink that
/// points out of the machine, at the same path in the host tree.
struct Site {
    parent: std::os::fd::OwnedFd,
    name: String,
    swap: String,
}

/// "Root in the machine": exchanges each raced entry with its symlink out of the machine
/// (`renameat2(RENAME_EXCHANGE)`, so the path is always one or the other), over and over, until
/// told to stop. Returns how many exchanges took effect.
fn attack(sites: &[Site], stop: &std::sync::atomic::AtomicBool) -> u64 {
    use nix::fcntl::{RenameFlags, renameat2};
    let mut swaps = 0;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        for s in sites {
            // Missing while the helper replaces it (or it was never created): nothing to swap.
            if renameat2(
                &s.parent,
                s.name.as_str(),
                &s.parent,
                s.swap.as_str(),
                RenameFlags::RENAME_EXCHANGE,
            )
            .is_ok()
            {
                swaps += 1;
            }
        }
    }
    swaps
}

/// Every regular file under `dir` (never following a symlink) named `name`, with its bytes.
fn files_named(dir: &Path, name: &str, out: &mut Vec<Vec<u8>>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let Ok(ft) = e.file_type() else { continue };
        if ft.is_dir() {
            files_named(&e.path(), name, out);
        } else if ft.is_file()
            && e.file_name() == name
            && let Ok(b) = std::fs::read(e.path())
        {
            out.push(b);
        }
    }
}

/// A racing attacker (issue 10): while post-start's file steps and its import step run, a
/// thread "in the machine" swaps a directory or file and a symlink out of the machine at every
/// path they touch, in a loop. Over many runs (bounded in count and time) the host tree never
/// changes by an inode, mtime or byte; each step either succeeds inside the machine or fails
/// naming a raced path; `ctr` is only ever handed the machine's own tarballs (`import_step`).
#[test]
fn a_racing_attacker_never_reaches_the_host() {
    let _alone = RENAMES.write().unwrap_or_else(|e| e.into_inner());
    use std::sync::atomic::{AtomicBool, Ordering};
    const RUNS: usize = 2000;
    const TIME: Duration = Duration::from_secs(40);
    let w = world();
    let root = MachineRoot::open(&w.machine).unwrap();
    let inv = inventory(NEW);
    let mc = machine_config();
    // A first start, so every raced entry exists: the spec, the marker.
    gpu_pass(&root, &inv);
    std::fs::write(
        w.in_machine("etc/cdi/nvidia.yaml"),
        "kind: nvidia.com/gpu\n",
    )
    .unwrap();
    std::fs::write(w.in_host("etc/cdi/nvidia.yaml"), "host\n").unwrap();
    let mut sites = Vec::new();
    for p in RACED {
        let at = w.in_machine(p);
        assert!(std::fs::symlink_metadata(&at).is_ok(), "{p} missing");
        let name = at.file_name().unwrap().to_str().unwrap().to_owned();
        let swap = format!(".{name}.swap");
        let parent = nix::fcntl::open(
            at.parent().unwrap(),
            nix::fcntl::OFlag::O_DIRECTORY | nix::fcntl::OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .unwrap();
        symlink(w.in_host(p), at.parent().unwrap().join(&swap)).unwrap();
        sites.push(Site { parent, name, swap });
    }
    let before = w.host_snapshot();
    let stop = AtomicBool::new(false);
    let started = std::time::Instant::now();
    let (mut runs, mut ok_steps, mut failed_steps) = (0, 0, 0);
    let swaps = std::thread::scope(|s| {
        let attacker = s.spawn(|| attack(&sites, &stop));
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            while runs < RUNS && started.elapsed() < TIME {
                runs += 1;
                let steps: [(&str, anyhow::Result<()>); 3] = [
                    ("links", rebuild_links(&root, &inv).map(drop)),
                    (
                        "CDI spec",
                        write_cdi(&root, CDI_DIR, CDI_FILE, &spec(NEW), conflicts).map(drop),
                    ),
                    ("images", import_step(&root, &mc).map(drop)),
                ];
                for (step, r) in steps {
                    match r {
                        Ok(()) => ok_steps += 1,
                        Err(e) => {
                            failed_steps += 1;
                            let msg = format!("{e:#}");
                            assert!(
                                RACED.iter().any(|p| msg.contains(p)) || msg.contains("/var/run"),
                                "run {runs}: {step} failed without naming a raced path: {msg}"
                            );
                        }
                    }
                }
                let after = w.host_snapshot();
                if after != before {
                    let changed: Vec<&String> = before
                        .keys()
                        .chain(after.keys())
                        .filter(|k| before.get(*k) != after.get(*k))
                        .collect();
                    panic!("run {runs}: the host tree changed at {changed:?}");
                }
            }
        }));
        stop.store(true, Ordering::Relaxed);
        let swaps = attacker.join().unwrap();
        if let Err(p) = result {
            std::panic::resume_unwind(p);
        }
        swaps
    });
    println!(
        "{runs} runs in {:.1}s, {swaps} swaps: {ok_steps} steps succeeded, {failed_steps} failed",
        started.elapsed().as_secs_f64()
    );
    assert!(runs >= 20, "only {runs} runs");
    assert!(swaps > 1000, "the attacker swapped only {swaps} times");
    assert!(
        ok_steps > 0 && failed_steps > 0,
        "{ok_steps} ok, {failed_steps} failed: no race"
    );
    // Successes landed inside the machine: a spec with our bytes exists in the machine's tree.
    let mut specs = Vec::new();
    files_named(&w.machine, CDI_FILE, &mut specs);
    assert!(specs.contains(&spec(NEW)), "no CDI spec inside the machine");
}
