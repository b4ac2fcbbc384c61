//! Oversized hosts (issue 7, hostile input): a 1 GiB /proc stand-in, 100 000 device nodes, a
//! 10 000-deep directory, a huge ld.so.cache. `discover` and `pre-start` must give the correct
//! result or a clear error naming what was too big, in bounded memory (peak RSS of the helper,
//! from wait4) and bounded time (a hang detector, not a performance target).
//!
//! Privileged (mknod): these tests fail, not skip, when not run as root. Trees live on tmpfs
//! (/dev/shm) so 100 000 nodes take seconds, and the 1 GiB files are sparse so they cost nothing.

#![allow(clippy::unwrap_used)] // helpers outside #[test] fns; a panic is the failure report

use nspawn_lifecycle::fixture;
use std::fs::File;
use std::os::unix::process::ExitStatusExt as _;
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_nspawn-lifecycle-helper");
/// Peak RSS the helper may reach on any of these hosts. A generous bound: it reads at most one
/// capped file at a time (ld.so.cache: 16 MiB) and keeps names, never contents, of directories.
const MAX_RSS_KIB: i64 = 64 * 1024;
/// Any run longer than this is a hang, not a slow machine.
const MAX_TIME: Duration = Duration::from_secs(20);
/// A run still going after this is killed so the test can report it.
const KILL_AFTER: Duration = Duration::from_secs(60);
/// Address-space limit for the helper, so a regression fails the test instead of eating the
/// (shared) machine's memory.
const MAX_ADDRESS_SPACE: u64 = 2 << 30;

fn require_root() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "privileged tests build host trees with mknod and must run as root"
    );
}

/// The one-gpu example host (complete verdict) on tmpfs.
fn host() -> tempfile::TempDir {
    require_root();
    let shm = Path::new("/dev/shm");
    let dir = if shm.is_dir() {
        tempfile::Builder::new()
            .prefix("oversized.")
            .tempdir_in(shm)
            .unwrap()
    } else {
        tempfile::tempdir().unwrap()
    };
    fixture::materialize(fixture::example("one-gpu").unwrap(), dir.path()).unwrap();
    dir
}

struct Run {
    status: ExitStatus,
    stdout: String,
    stderr: String,
    max_rss_kib: i64,
    elapsed: Duration,
}

impl Run {
    /// The helper's exit code (`time` passes it on; a signal becomes 128 + N).
    fn code(&self) -> i32 {
        let code = self.status.code().unwrap_or_else(|| {
            panic!(
                "killed by signal {:?}:\n{}",
                self.status.signal(),
                self.stderr
            )
        });
        assert!(
            code < 128,
            "helper died of signal {}:\n{}",
            code - 128,
            self.stderr
        );
        code
    }
}

/// Run the helper against `root`, measuring its peak RSS and wall time; asserts both bounds and
/// that it did not panic.
///
/// The peak RSS comes from GNU time (wait4 on its own fork of the helper). A wait4 here would
/// not do: Linux carries the exec'ing process's high-water mark into the child's `ru_maxrss`,
/// so a child spawned from this test process (over 100 MB while fixtures are built) reports
/// at least that much; `time` is a small process whose fork starts clean.
fn run(root: &Path, args: &[&str]) -> Run {
    use std::os::unix::process::CommandExt as _;
    let out = tempfile::tempfile().unwrap();
    let err = tempfile::tempfile().unwrap();
    let rss = tempfile::NamedTempFile::new().unwrap();
    let start = Instant::now();
    let mut child = Command::new("/usr/bin/time")
        .arg("-o")
        .arg(rss.path())
        .args(["-f", "%M", "prlimit"])
        .arg(format!("--as={MAX_ADDRESS_SPACE}"))
        .arg("--")
        .arg(BIN)
        .arg("--host-root")
        .arg(root)
        .args(args)
        .env_remove("NSPAWN_LIFECYCLE_LOG")
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(err.try_clone().unwrap())
        .process_group(0)
        .spawn()
        .unwrap();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > KILL_AFTER {
            // The whole group: `time` and the helper it forked.
            let group = nix::unistd::Pid::from_raw(-(child.id() as i32));
            let _ = nix::sys::signal::kill(group, nix::sys::signal::Signal::SIGKILL);
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let elapsed = start.elapsed();
    let read = |mut f: File| {
        use std::io::{Read as _, Seek as _};
        f.rewind().unwrap();
        let mut s = String::new();
        f.read_to_string(&mut s).unwrap();
        s
    };
    let stderr = read(err);
    assert!(
        elapsed < MAX_TIME,
        "{args:?} took {elapsed:?} (hang?); stderr:\n{}",
        shorten(&stderr)
    );
    let rss_text = std::fs::read_to_string(rss.path()).unwrap();
    // On a signal, GNU time writes "Command terminated by signal N" before the number.
    let max_rss_kib = rss_text
        .lines()
        .last()
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or_else(|| panic!("{args:?}: no RSS from time: {rss_text:?}; {stderr}"));
    let r = Run {
        status,
        stdout: read(out),
        stderr,
        max_rss_kib,
        elapsed,
    };
    assert!(
        !r.stderr.contains("panicked"),
        "{args:?} panicked:\n{}",
        r.stderr
    );
    assert!(
        r.max_rss_kib < MAX_RSS_KIB,
        "{args:?} peaked at {} KiB RSS; stderr:\n{}",
        r.max_rss_kib,
        shorten(&r.stderr)
    );
    eprintln!(
        "{args:?}: exit {:?}, {:?}, peak RSS {} KiB",
        r.status.code(),
        r.elapsed,
        r.max_rss_kib
    );
    r
}

fn shorten(s: &str) -> String {
    let mut end = s.len().min(2000);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_owned()
}

/// A refused run prints no result: nothing, or with `--json` the one error object
/// (`command-error.schema.json`) with the exit code and the error that stderr has too.
fn no_result(args: &[&str], r: &Run) {
    if !args.contains(&"--json") {
        assert_eq!(r.stdout, "", "{args:?}: a refused run prints no result");
        return;
    }
    let v: serde_json::Value = serde_json::from_str(&r.stdout)
        .unwrap_or_else(|e| panic!("{args:?}: one JSON error object, not {:?}: {e}", r.stdout));
    assert_eq!(v["kind"], "DiscoverError", "{v}");
    assert_eq!(v["exitCode"], r.code(), "{v}");
    assert!(
        r.stderr.contains(v["error"].as_str().unwrap()),
        "{v} / {}",
        r.stderr
    );
}

/// discover and pre-start both fail with exit 1 and an error naming `file` as too large.
fn assert_refused(root: &Path, file: &str, limit: u64) {
    for args in [
        &["discover", "--json"][..],
        &["nspawn-lifecycle", "pre-start", "kube1"],
    ] {
        let r = run(root, args);
        assert_eq!(r.code(), 1, "{args:?}: {}", r.stderr);
        no_result(args, &r);
        let want = format!("{file}: larger than {limit} bytes");
        assert!(r.stderr.contains(&want), "{args:?}: {}", r.stderr);
        assert!(
            r.stderr.lines().count() <= 3,
            "{args:?}: error not short: {}",
            r.stderr
        );
    }
    assert!(
        !root.join("etc/systemd/nspawn/kube1.nspawn").exists(),
        "a refused pre-start wrote the .nspawn file"
    );
}

/// Replace `rel` (under `root`) by a sparse file of `len` bytes.
fn sparse(root: &Path, rel: &str, len: u64) {
    let p = root.join(rel);
    let _ = std::fs::remove_file(&p);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    let f = File::create(&p).unwrap();
    f.set_len(len).unwrap();
    assert!(
        std::fs::metadata(&p).unwrap().len() == len,
        "{}",
        p.display()
    );
}

const GIB: u64 = 1 << 30;

#[test]
fn privileged_gib_proc_and_sys_files_are_refused_by_name() {
    for (rel, limit) in [
        ("proc/driver/nvidia/version", 1 << 20),
        ("proc/devices", 1 << 20),
        ("proc/driver/nvidia/gpus/0000:06:00.0/information", 1 << 20),
        ("sys/bus/pci/devices/0000:06:00.0/vendor", 1 << 20),
        ("proc/partitions", 4 << 20),
        ("proc/1/mountinfo", 16 << 20),
        ("proc/swaps", 1 << 20),
    ] {
        let dir = host();
        with_a_disk(dir.path());
        sparse(dir.path(), rel, GIB);
        assert_refused(dir.path(), rel, limit);
    }
}

/// A disk in the host's `/proc/partitions` (and `/dev`), so the disk scan reads on to the
/// mounts and swaps.
fn with_a_disk(root: &Path) {
    use nix::sys::stat::{Mode, SFlag, makedev, mknod};
    std::fs::create_dir_all(root.join("proc")).unwrap();
    std::fs::write(
        root.join("proc/partitions"),
        "major minor  #blocks  name\n\n   8        0    1048576 sda\n",
    )
    .unwrap();
    let _ = mknod(
        &root.join("dev/sda"),
        SFlag::S_IFBLK,
        Mode::from_bits_truncate(0o660),
        makedev(8, 0),
    );
}

#[test]
fn privileged_gib_ld_so_cache_is_refused_by_name() {
    let dir = host();
    sparse(dir.path(), "etc/ld.so.cache", GIB);
    assert_refused(dir.path(), "etc/ld.so.cache", 16 << 20);
}

#[test]
fn privileged_gib_config_file_is_refused_by_name() {
    let dir = host();
    std::fs::create_dir_all(dir.path().join("etc/nspawn-lifecycle")).unwrap();
    sparse(dir.path(), "etc/nspawn-lifecycle/config.json", GIB);
    let r = run(dir.path(), &["nspawn-lifecycle", "pre-start", "kube1"]);
    assert_eq!(r.code(), 2, "{}", r.stderr);
    assert!(
        r.stderr
            .contains("nspawn-lifecycle/config.json: larger than 1048576 bytes"),
        "{}",
        r.stderr
    );
}

/// A FIFO (endless wait) or a device like /dev/zero (endless bytes) where a host file belongs:
/// refused at once, by name.
#[test]
fn privileged_fifos_and_devices_in_place_of_host_files_are_refused_by_name() {
    use nix::sys::stat::{Mode, SFlag, makedev, mknod};
    for (rel, code) in [
        ("proc/driver/nvidia/version", 1),
        ("proc/devices", 1),
        ("sys/bus/pci/devices/0000:06:00.0/vendor", 1),
        ("etc/ld.so.cache", 1),
        ("etc/nspawn-lifecycle/config.json", 2),
        ("proc/partitions", 1),
        ("proc/1/mountinfo", 1),
        ("proc/swaps", 1),
    ] {
        for fifo in [true, false] {
            let dir = host();
            with_a_disk(dir.path());
            let p = dir.path().join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            let _ = std::fs::remove_file(&p);
            let mode = Mode::from_bits_truncate(0o644);
            if fifo {
                nix::unistd::mkfifo(&p, mode).unwrap();
            } else {
                mknod(&p, SFlag::S_IFCHR, mode, makedev(1, 5)).unwrap();
            }
            let r = run(dir.path(), &["nspawn-lifecycle", "pre-start", "kube1"]);
            assert_eq!(r.code(), code, "{rel}: {}", r.stderr);
            assert!(r.stderr.contains(rel), "{rel}: {}", r.stderr);
            assert!(
                r.stderr.contains("not a regular file"),
                "{rel}: {}",
                r.stderr
            );
        }
    }
}

/// The baseline: the untouched host discovers complete, in bounds; what the other tests compare
/// their results with.
fn baseline(root: &Path) -> String {
    let r = run(root, &["discover", "--json"]);
    assert_eq!(r.code(), 0, "{}", r.stderr);
    assert!(r.stdout.contains("\"state\": \"complete\""), "{}", r.stdout);
    r.stdout
}

#[test]
fn privileged_ld_so_cache_at_the_size_limit_with_every_entry_a_long_libcuda_path() {
    // At the 16 MiB limit with as many entries as the parser takes (65 536), every one keyed
    // libcuda.so.1 and naming a long path that walks the tree (`/usr/../usr/../…`, 570 different
    // ones) spread over 16 MiB of strings: built to make each entry cost as much memory and as
    // many lookups as possible. The cache is not believed; the standard directories still are.
    let dir = host();
    let expected = baseline(dir.path());
    let limit = 16usize << 20;
    let entries = 1usize << 16;
    let key = b"libcuda.so.1\0";
    let walk = "/usr/..".repeat(570);
    let path = format!("{walk}/lib/x86_64-linux-gnu/libcuda.so.580.95.05\0");
    let strings_at = 48 + entries * 24;
    let copies = (limit - strings_at - key.len()) / path.len();
    let mut cache = Vec::with_capacity(limit);
    cache.extend_from_slice(b"glibc-ld.so.cache1.1");
    cache.extend_from_slice(&(entries as u32).to_le_bytes());
    cache.extend_from_slice(&((limit - strings_at) as u32).to_le_bytes());
    cache.extend_from_slice(&[2, 0, 0, 0]);
    cache.extend_from_slice(&[0; 16]);
    let paths_at = strings_at + key.len();
    for i in 0..entries {
        let at = paths_at + (i % copies) * path.len() + 7 * (i % 570);
        cache.extend_from_slice(&0x0303u32.to_le_bytes());
        cache.extend_from_slice(&(strings_at as u32).to_le_bytes());
        cache.extend_from_slice(&(at as u32).to_le_bytes());
        cache.extend_from_slice(&[0; 12]);
    }
    cache.extend_from_slice(key);
    for _ in 0..copies {
        cache.extend_from_slice(path.as_bytes());
    }
    assert!(cache.len() <= limit && cache.len() > limit - path.len());
    std::fs::write(dir.path().join("etc/ld.so.cache"), &cache).unwrap();

    let r = run(dir.path(), &["discover", "--json"]);
    assert_eq!(r.code(), 0, "{}", r.stderr);
    assert_eq!(
        r.stdout, expected,
        "the same driver, from the standard directories"
    );
    assert!(
        r.stderr.contains("more than 64 different libcuda paths"),
        "{}",
        r.stderr
    );
    let r = run(dir.path(), &["nspawn-lifecycle", "pre-start", "kube1"]);
    assert_eq!(r.code(), 0, "{}", r.stderr);
}

/// `count` character devices named `name(i)` under `dir` (relative to `root`).
fn many_nodes(root: &Path, dir: &str, count: u32, name: impl Fn(u32) -> String, major: u64) {
    use nix::sys::stat::{Mode, SFlag, makedev, mknod};
    let d = root.join(dir);
    std::fs::create_dir_all(&d).unwrap();
    for i in 0..count {
        mknod(
            &d.join(name(i)),
            SFlag::S_IFCHR,
            Mode::from_bits_truncate(0o666),
            makedev(major, u64::from(i)),
        )
        .unwrap();
    }
}

/// discover and pre-start both refuse with exit 1 and a one-line error naming `dir`.
fn assert_too_many_nodes(root: &Path, dir: &str) {
    for args in [
        &["discover", "--json"][..],
        &["nspawn-lifecycle", "pre-start", "kube1"],
    ] {
        let r = run(root, args);
        assert_eq!(r.code(), 1, "{args:?}: {}", r.stderr);
        no_result(args, &r);
        let want = format!("{dir} holds more than 16384 NVIDIA device nodes");
        assert!(r.stderr.contains(&want), "{args:?}: {}", shorten(&r.stderr));
        assert!(r.stderr.len() < 1024, "{args:?}: {}", shorten(&r.stderr));
    }
    assert!(!root.join("etc/systemd/nspawn/kube1.nspawn").exists());
}

/// `/dev/nvidia-caps` is bound writable into every machine with all GPUs: 100,000 nodes a
/// machine made there never refuse the host. Discovery takes the first 16,384 (the cap no driver
/// reaches), says so once, drops those of a major no NVIDIA driver has, and pre-start starts,
/// in bounded time and memory (`run` checks both).
#[test]
fn privileged_100k_mig_capability_nodes_are_skipped_never_refused() {
    let dir = host();
    let caps = |i| format!("nvidia-cap{}", i + 1);
    many_nodes(dir.path(), "dev/nvidia-caps", 100_000, caps, 509);
    for args in [
        &["discover", "--json"][..],
        &["nspawn-lifecycle", "pre-start", "kube1"],
    ] {
        let r = run(dir.path(), args);
        assert_eq!(r.code(), 0, "{args:?}: {}", shorten(&r.stderr));
        assert!(
            r.stderr
                .contains("/dev/nvidia-caps holds more than 16384 device nodes, which no driver makes; taking the first 16384"),
            "{args:?}: {}",
            shorten(&r.stderr)
        );
        assert!(r.stderr.len() < 1024, "{args:?}: {}", shorten(&r.stderr));
    }
    let file = std::fs::read_to_string(dir.path().join("etc/systemd/nspawn/kube1.nspawn")).unwrap();
    assert!(!file.contains("nvidia-cap1"), "{file}");
}

#[test]
fn privileged_100k_gpu_nodes_are_refused_by_name() {
    let dir = host();
    many_nodes(
        dir.path(),
        "dev",
        100_000,
        |i| format!("nvidia{}", i + 1),
        195,
    );
    assert_too_many_nodes(dir.path(), "/dev");
}

/// Just under the node limit, every GPU node with a major the driver does not list (stale nodes
/// of an earlier driver in the host's own `/dev`): one reason per node in `discover --json`,
/// but pre-start's one-line error names ten and counts the rest.
#[test]
fn privileged_16k_stale_nodes_make_a_short_error() {
    let dir = host();
    let gpus = |i| format!("nvidia{}", i + 1);
    many_nodes(dir.path(), "dev", 16_000, gpus, 509);
    let r = run(dir.path(), &["discover", "--json"]);
    assert_eq!(r.code(), 0, "{}", r.stderr);
    assert!(r.stdout.contains("/dev/nvidia16000 is 509:15999 but"));
    let r = run(dir.path(), &["nspawn-lifecycle", "pre-start", "kube1"]);
    assert_eq!(r.code(), 3, "{}", shorten(&r.stderr));
    assert!(r.stderr.len() < 2048, "{} bytes", r.stderr.len());
    assert!(
        r.stderr
            .contains("; and 15990 more (`discover` lists every one)"),
        "{}",
        r.stderr
    );
}

/// As many nodes as a driver can make: every MIG capability of 32 GPUs and every IMEX channel
/// (6 370 nodes). They are all found, and a machine with every GPU binds their two directories.
#[test]
fn privileged_the_most_nodes_a_driver_makes_are_all_bound() {
    let dir = host();
    let devices = dir.path().join("proc/devices");
    let table = std::fs::read_to_string(&devices).unwrap().replace(
        "508 nvidia-uvm\n",
        "508 nvidia-uvm\n509 nvidia-caps\n510 nvidia-caps-imex-channels\n",
    );
    std::fs::write(&devices, table).unwrap();
    let caps = |i| format!("nvidia-cap{}", i + 1);
    many_nodes(dir.path(), "dev/nvidia-caps", 4_322, caps, 509);
    let channels = |i| format!("channel{i}");
    many_nodes(
        dir.path(),
        "dev/nvidia-caps-imex-channels",
        2_048,
        channels,
        510,
    );
    let r = run(dir.path(), &["discover", "--json"]);
    assert_eq!(r.code(), 0, "{}", r.stderr);
    assert!(r.stdout.contains("\"state\": \"complete\""));
    assert!(r.stdout.contains("/dev/nvidia-caps/nvidia-cap4322\""));
    assert!(
        r.stdout
            .contains("/dev/nvidia-caps-imex-channels/channel2047\"")
    );
    let r = run(dir.path(), &["nspawn-lifecycle", "pre-start", "kube1"]);
    assert_eq!(r.code(), 0, "{}", r.stderr);
    let nspawn =
        std::fs::read_to_string(dir.path().join("etc/systemd/nspawn/kube1.nspawn")).unwrap();
    let binds: Vec<&str> = nspawn
        .lines()
        .filter(|l| l.contains("/dev/nvidia-caps"))
        .collect();
    assert_eq!(
        binds,
        [
            "Bind=/dev/nvidia-caps",
            "Bind=/dev/nvidia-caps-imex-channels"
        ]
    );
}

/// A chain of `depth` directories named `d` under `root/rel`, made one level at a time relative
/// to the previous (the whole path is far beyond PATH_MAX).
#[must_use = "the chain is removed when its guard drops"]
fn deep(root: &Path, rel: &str, depth: usize) -> Chain {
    use nix::fcntl::{OFlag, openat};
    use nix::sys::stat::{Mode, mkdirat};
    let base = root.join(rel);
    std::fs::create_dir_all(&base).unwrap();
    let mut fd = std::os::fd::OwnedFd::from(File::open(&base).unwrap());
    for _ in 0..depth {
        mkdirat(&fd, "d", Mode::from_bits_truncate(0o755)).unwrap();
        fd = openat(
            &fd,
            "d",
            OFlag::O_DIRECTORY | OFlag::O_RDONLY,
            Mode::empty(),
        )
        .unwrap();
    }
    Chain(base)
}

/// A chain [`deep`] made, removed one level at a time from the top (its second level renamed
/// over the first) when dropped: the temporary directory's own removal recurses once per level,
/// which overflows a test thread's stack on 10 000 levels where frames are large (aarch64).
struct Chain(std::path::PathBuf);

impl Drop for Chain {
    fn drop(&mut self) {
        let (top, spare) = (self.0.join("d"), self.0.join(".d"));
        while top.is_dir() {
            if top.join("d").is_dir() {
                std::fs::rename(top.join("d"), &spare).unwrap();
                std::fs::remove_dir(&top).unwrap();
                std::fs::rename(&spare, &top).unwrap();
            } else {
                std::fs::remove_dir_all(&top).unwrap();
            }
        }
    }
}

#[test]
fn privileged_10k_deep_directories_where_discovery_looks() {
    let dir = host();
    let expected = baseline(dir.path());
    // In the library directory and in /run/nvidia-persistenced: not driver files, ignored.
    let _lib = deep(dir.path(), "usr/lib/x86_64-linux-gnu", 10_000);
    let _run = deep(dir.path(), "run/nvidia-persistenced", 10_000);
    let r = run(dir.path(), &["discover", "--json"]);
    assert_eq!(r.code(), 0, "{}", r.stderr);
    assert_eq!(r.stdout, expected);
    // A standard library directory that is a link 2 047 levels down: longer than PATH_MAX once
    // joined to the host root, so not a directory anyone can bind; the driver is still found.
    let target = "d/".repeat(2_047);
    std::fs::remove_dir(dir.path().join("usr/lib64")).unwrap();
    let _usr = deep(dir.path(), "usr", 2_100);
    std::os::unix::fs::symlink(target.trim_end_matches('/'), dir.path().join("usr/lib64")).unwrap();
    let r = run(dir.path(), &["discover", "--json"]);
    assert_eq!(r.code(), 0, "{}", r.stderr);
    assert_eq!(r.stdout, expected);
    // In /dev/nvidia-caps, bound writable into every machine with all GPUs: what a machine
    // left there is skipped with one short warning, never a refusal of the host, never walked.
    let _caps = deep(dir.path(), "dev/nvidia-caps", 10_000);
    let r = run(dir.path(), &["nspawn-lifecycle", "pre-start", "kube1"]);
    assert_eq!(r.code(), 0, "{}", r.stderr);
    assert!(
        r.stderr.contains(
            "/dev/nvidia-caps: skipping 1 entries that are not character devices a .nspawn file can bind"
        ),
        "{}",
        r.stderr
    );
    assert!(r.stderr.len() < 2048, "{} bytes", r.stderr.len());
}
