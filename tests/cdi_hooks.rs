//! The `cdi-hook` subcommands against fake container roots, the way a runtime calls them: the
//! binary, the OCI state on stdin, `bundle/config.json` naming `root.path`. The roots are
//! hostile: stale and absolute symlinks at every path we write, parents that lead out of the
//! root or onto another filesystem. Privileged (mounts, a mount namespace): CI runs as root.

#![allow(clippy::unwrap_used)] // helpers outside #[test] fns; a panic is the failure report

use std::io::Write as _;
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _, symlink};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// The helper whose hooks run: this build's, or another architecture's under a user-mode
/// emulator (`tests/aarch64/run.sh` sets `CDI_HOOK_HELPER` and `CDI_HOOK_RUNNER`: the aarch64
/// binary under qemu-user), so the same cases prove the hooks a Grace host runs.
fn helper() -> Vec<String> {
    match std::env::var("CDI_HOOK_HELPER") {
        Ok(h) => std::env::var("CDI_HOOK_RUNNER")
            .into_iter()
            .chain(std::iter::once(h))
            .collect(),
        Err(_) => vec![env!("CARGO_BIN_EXE_nspawn-lifecycle-helper").to_owned()],
    }
}

/// [`helper`] as a command, its arguments to follow.
fn hook_command() -> Command {
    let h = helper();
    let mut c = Command::new(&h[0]);
    c.args(&h[1..]);
    c
}

/// [`helper`] as words of a shell script.
fn bin() -> String {
    helper().join(" ")
}
const ML: &str = "/usr/lib/x86_64-linux-gnu";

/// A bundle with `config.json` naming `rootfs` (relative, as runtimes write it) and the root.
struct Bundle {
    dir: tempfile::TempDir,
}

impl Bundle {
    fn new() -> Bundle {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("rootfs")).unwrap();
        std::fs::write(
            dir.path().join("config.json"),
            r#"{"ociVersion": "1.0.2", "root": {"path": "rootfs"}, "process": {"args": ["x"]}}"#,
        )
        .unwrap();
        Bundle { dir }
    }

    fn root(&self) -> PathBuf {
        self.dir.path().join("rootfs")
    }

    /// `rel` inside the root (for setting up and checking only).
    fn at(&self, rel: &str) -> PathBuf {
        self.root().join(rel.trim_start_matches('/'))
    }

    fn state(&self) -> String {
        format!(
            r#"{{"ociVersion": "1.0.2", "id": "c1", "status": "creating", "pid": 1, "bundle": "{}"}}"#,
            self.dir.path().display()
        )
    }

    fn hook(&self, args: &[&str]) -> Output {
        run_hook(&self.state(), args)
    }
}

fn run_hook(state: &str, args: &[&str]) -> Output {
    let mut child = hook_command()
        .arg("cdi-hook")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // A hook that refuses its arguments exits before it reads the state: the pipe is then
    // closed under us, which is its answer, not the test's failure (the exit code says).
    match child.stdin.take().unwrap().write_all(state.as_bytes()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => panic!("writing the state: {e}"),
        _ => {}
    }
    child.wait_with_output().unwrap()
}

fn ok(out: &Output) {
    assert!(
        out.status.success(),
        "hook failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn failed(out: &Output, code: i32, needle: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "{err}");
    assert!(err.contains(needle), "{needle:?} not in {err}");
}

fn link_of(p: &Path) -> String {
    std::fs::read_link(p).unwrap().display().to_string()
}

fn mkdirs(b: &Bundle, rel: &str) {
    std::fs::create_dir_all(b.at(rel)).unwrap();
}

/// A tmpfs mounted for one test, unmounted when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn at(path: PathBuf) -> Tmpfs {
        std::fs::create_dir_all(&path).unwrap();
        let st = Command::new("mount")
            .args(["-t", "tmpfs", "tmpfs"])
            .arg(&path)
            .status()
            .unwrap();
        assert!(st.success());
        Tmpfs(path)
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

#[test]
fn privileged_create_symlinks_replaces_stale_and_absolute_links_without_following_them() {
    let b = Bundle::new();
    mkdirs(&b, ML);
    // An image built with an older driver: a dangling SONAME link (what made crun refuse).
    symlink("libcuda.so.470.57.02", b.at(&format!("{ML}/libcuda.so.1"))).unwrap();
    // An absolute link at a versioned path pointing at another file of the image.
    std::fs::write(b.at("/etc-victim"), "image file").unwrap();
    symlink("/etc-victim", b.at(&format!("{ML}/libcuda.so.550.1"))).unwrap();
    // A regular file of the image at the dev name.
    std::fs::write(b.at(&format!("{ML}/libcuda.so")), "stub").unwrap();
    let out = b.hook(&[
        "create-symlinks",
        "--link",
        &format!("/run/nspawn-lifecycle-driver{ML}/libcuda.so.550.1::{ML}/libcuda.so.550.1"),
        "--link",
        &format!("libcuda.so.550.1::{ML}/libcuda.so.1"),
        "--link",
        &format!("libcuda.so.1::{ML}/libcuda.so"),
    ]);
    ok(&out);
    assert_eq!(
        link_of(&b.at(&format!("{ML}/libcuda.so.550.1"))),
        format!("/run/nspawn-lifecycle-driver{ML}/libcuda.so.550.1")
    );
    assert_eq!(
        link_of(&b.at(&format!("{ML}/libcuda.so.1"))),
        "libcuda.so.550.1"
    );
    assert_eq!(link_of(&b.at(&format!("{ML}/libcuda.so"))), "libcuda.so.1");
    // The file the absolute link pointed at is untouched.
    assert_eq!(
        std::fs::read_to_string(b.at("/etc-victim")).unwrap(),
        "image file"
    );
    // Idempotent: a second run changes nothing (same inodes).
    let ino = std::fs::symlink_metadata(b.at(&format!("{ML}/libcuda.so.1")))
        .unwrap()
        .ino();
    ok(&b.hook(&[
        "create-symlinks",
        "--link",
        &format!("libcuda.so.550.1::{ML}/libcuda.so.1"),
    ]));
    assert_eq!(
        std::fs::symlink_metadata(b.at(&format!("{ML}/libcuda.so.1")))
            .unwrap()
            .ino(),
        ino
    );
}

#[test]
fn privileged_create_symlinks_creates_the_multiarch_dir_in_a_lib64_image() {
    let b = Bundle::new();
    mkdirs(&b, "/usr/lib64");
    ok(&b.hook(&[
        "create-symlinks",
        "--link",
        &format!("libcuda.so.550.1::{ML}/libcuda.so.1"),
    ]));
    let dir = std::fs::metadata(b.at(ML)).unwrap();
    assert!(dir.is_dir());
    assert_eq!(dir.permissions().mode() & 0o7777, 0o755);
}

#[test]
fn privileged_parents_that_lead_out_of_the_root_resolve_inside_it() {
    let b = Bundle::new();
    let outside = tempfile::tempdir().unwrap();
    mkdirs(&b, "/usr/lib");
    // An absolute link and a `../` escape: both must resolve inside the container root.
    symlink(outside.path(), b.at(ML)).unwrap();
    mkdirs(&b, "/etc");
    symlink("../../../../../../../..", b.at("/etc/up")).unwrap();
    // While the link's target does not exist inside the root, it dangles there: refused, and
    // nothing is created on the host where it would point outside.
    let out = b.hook(&[
        "create-symlinks",
        "--link",
        &format!("x::{ML}/libcuda.so.1"),
    ]);
    failed(
        &out,
        1,
        "does not resolve to a directory inside the container",
    );
    // With the same path inside the root, that is where the link lands.
    mkdirs(&b, &outside.path().display().to_string());
    ok(&b.hook(&[
        "create-symlinks",
        "--link",
        &format!("x::{ML}/libcuda.so.1"),
        "--link",
        "y::/etc/up/escaped",
    ]));
    assert_eq!(
        std::fs::read_dir(outside.path()).unwrap().count(),
        0,
        "nothing written outside the root"
    );
    let inside = b.at(&format!("{}/libcuda.so.1", outside.path().display()));
    assert_eq!(link_of(&inside), "x");
    assert_eq!(link_of(&b.at("/escaped")), "y");
}

#[test]
fn privileged_no_write_onto_another_filesystem_through_an_image_symlink() {
    let b = Bundle::new();
    mkdirs(&b, "/usr/lib");
    // A mount inside the root standing for /proc, /sys or a volume.
    let mnt = Tmpfs::at(b.at("/mnt/volume"));
    symlink("/mnt/volume", b.at(ML)).unwrap();
    let out = b.hook(&[
        "create-symlinks",
        "--link",
        &format!("x::{ML}/libcuda.so.1"),
    ]);
    failed(&out, 1, "another filesystem");
    assert_eq!(std::fs::read_dir(&mnt.0).unwrap().count(), 0);
    // /etc a link onto it: update-ldcache refuses too, writing nothing there.
    symlink("/mnt/volume", b.at("/etc")).unwrap();
    let out = b.hook(&[
        "update-ldcache",
        "--lib",
        &format!("libcuda.so.1::{ML}/libcuda.so.1"),
    ]);
    failed(&out, 1, "another filesystem");
    assert_eq!(std::fs::read_dir(&mnt.0).unwrap().count(), 0);
}

#[test]
fn privileged_a_directory_is_never_replaced() {
    let b = Bundle::new();
    mkdirs(&b, &format!("{ML}/libcuda.so.1/keep"));
    let out = b.hook(&[
        "create-symlinks",
        "--link",
        &format!("x::{ML}/libcuda.so.1"),
    ]);
    failed(&out, 1, "is a directory");
    assert!(b.at(&format!("{ML}/libcuda.so.1/keep")).is_dir());
}

fn ldconfig_p(cache: &Path) -> String {
    let out = Command::new("ldconfig")
        .arg("-p")
        .arg("-C")
        .arg(cache)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn privileged_update_ldcache_keeps_the_images_entries_and_replaces_stale_ones() {
    let b = Bundle::new();
    mkdirs(&b, "/etc/ld.so.conf.d");
    mkdirs(&b, "/usr/lib64");
    // The image's own cache, written by glibc's ldconfig, listing a stale libcuda.so.1.
    std::fs::copy(
        "/usr/lib/x86_64-linux-gnu/libc.so.6",
        b.at("/usr/lib64/libc.so.6"),
    )
    .unwrap();
    std::fs::copy(
        "/usr/lib/x86_64-linux-gnu/libz.so.1",
        b.at("/usr/lib64/libcuda.so.470.57.02"),
    )
    .unwrap_or_else(|_| {
        std::fs::copy(
            "/usr/lib/x86_64-linux-gnu/libc.so.6",
            b.at("/usr/lib64/libcuda.so.470.57.02"),
        )
        .unwrap()
    });
    std::fs::write(b.at("/etc/ld.so.conf"), "/usr/lib64\n").unwrap();
    let st = Command::new("ldconfig")
        .arg("-r")
        .arg(b.root())
        .status()
        .unwrap();
    assert!(st.success());
    let before = ldconfig_p(&b.at("/etc/ld.so.cache"));
    assert!(
        before.contains("libc.so.6 (libc6,x86-64) => /usr/lib64/libc.so.6"),
        "{before}"
    );

    let out = b.hook(&[
        "update-ldcache",
        "--lib",
        &format!("libcuda.so.1::{ML}/libcuda.so.1"),
        "--lib",
        &format!("libnvidia-ml.so.1::{ML}/libnvidia-ml.so.1"),
    ]);
    ok(&out);
    let after = ldconfig_p(&b.at("/etc/ld.so.cache"));
    assert!(
        after.contains(&format!("libcuda.so.1 (libc6,x86-64) => {ML}/libcuda.so.1")),
        "{after}"
    );
    assert!(
        after.contains(&format!(
            "libnvidia-ml.so.1 (libc6,x86-64) => {ML}/libnvidia-ml.so.1"
        )),
        "{after}"
    );
    assert!(
        after.contains("libc.so.6 (libc6,x86-64) => /usr/lib64/libc.so.6"),
        "{after}"
    );
    assert!(!after.contains("470.57.02"), "stale entry kept: {after}");
    let conf = std::fs::read_to_string(b.at("/etc/ld.so.conf.d/000-nspawn-lifecycle-nvidia.conf"))
        .unwrap();
    assert!(conf.lines().any(|l| l == ML), "{conf}");
    // Idempotent bytes, and nothing written again: the hook writes through the machine side's
    // one atomic writer, which leaves a file alone when its bytes and mode are in place.
    let bytes = std::fs::read(b.at("/etc/ld.so.cache")).unwrap();
    let conf_path = b.at("/etc/ld.so.conf.d/000-nspawn-lifecycle-nvidia.conf");
    let inodes = |p: &Path| std::fs::metadata(p).unwrap().ino();
    let (cache_ino, conf_ino) = (inodes(&b.at("/etc/ld.so.cache")), inodes(&conf_path));
    ok(&b.hook(&[
        "update-ldcache",
        "--lib",
        &format!("libcuda.so.1::{ML}/libcuda.so.1"),
        "--lib",
        &format!("libnvidia-ml.so.1::{ML}/libnvidia-ml.so.1"),
    ]));
    assert_eq!(std::fs::read(b.at("/etc/ld.so.cache")).unwrap(), bytes);
    assert_eq!(
        inodes(&b.at("/etc/ld.so.cache")),
        cache_ino,
        "unchanged cache rewritten"
    );
    assert_eq!(
        inodes(&conf_path),
        conf_ino,
        "unchanged conf entry rewritten"
    );
}

#[test]
fn privileged_update_ldcache_never_follows_or_opens_what_the_image_planted() {
    let b = Bundle::new();
    mkdirs(&b, "/etc");
    // The cache an absolute link to a file outside the root: read inside the root (missing
    // there), and the link replaced, never written through.
    let outside = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(outside.path(), "host file").unwrap();
    symlink(outside.path(), b.at("/etc/ld.so.cache")).unwrap();
    ok(&b.hook(&[
        "update-ldcache",
        "--lib",
        &format!("libcuda.so.1::{ML}/libcuda.so.1"),
    ]));
    assert_eq!(
        std::fs::read_to_string(outside.path()).unwrap(),
        "host file"
    );
    assert!(
        std::fs::symlink_metadata(b.at("/etc/ld.so.cache"))
            .unwrap()
            .is_file()
    );
    // A FIFO at the cache: never opened (the hook would hang), replaced.
    std::fs::remove_file(b.at("/etc/ld.so.cache")).unwrap();
    nix::unistd::mkfifo(
        &b.at("/etc/ld.so.cache"),
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .unwrap();
    ok(&b.hook(&[
        "update-ldcache",
        "--lib",
        &format!("libcuda.so.1::{ML}/libcuda.so.1"),
    ]));
    assert!(ldconfig_p(&b.at("/etc/ld.so.cache")).contains("libcuda.so.1"));
    // Garbage where the cache is: replaced by ours (the loader ignores garbage too).
    std::fs::write(b.at("/etc/ld.so.cache"), b"not a cache").unwrap();
    ok(&b.hook(&[
        "update-ldcache",
        "--lib",
        &format!("libcuda.so.1::{ML}/libcuda.so.1"),
    ]));
    assert!(ldconfig_p(&b.at("/etc/ld.so.cache")).contains("libcuda.so.1"));
}

#[test]
fn privileged_bad_arguments_and_states_write_nothing() {
    let b = Bundle::new();
    let out = b.hook(&["create-symlinks", "--link", "no-separator"]);
    failed(&out, 2, "no-separator");
    let out = b.hook(&["update-ldcache", "--lib", "libcuda.so.1::relative/path"]);
    failed(&out, 2, "relative/path");
    assert_eq!(std::fs::read_dir(b.root()).unwrap().count(), 0);
    let out = run_hook("{}", &["create-symlinks", "--link", "a::/b"]);
    failed(&out, 1, "bundle");
    // A bundle whose root is the runtime's own `/`.
    let slash = tempfile::tempdir().unwrap();
    std::fs::write(
        slash.path().join("config.json"),
        r#"{"root": {"path": "/"}}"#,
    )
    .unwrap();
    let state = format!(r#"{{"bundle": "{}"}}"#, slash.path().display());
    let out = run_hook(
        &state,
        &["create-symlinks", "--link", "a::/nspawn-lifecycle-test-b"],
    );
    failed(&out, 1, "own root");
    assert!(!Path::new("/nspawn-lifecycle-test-b").exists());
}

/// Run the hook in a private mount namespace and print the container's params after it.
fn params_in_namespace(b: &Bundle, host_params: &Path) -> Output {
    let bin = bin();
    let script = format!(
        "{bin} cdi-hook disable-device-node-modification --host-params {} <<'EOF' || exit 9\n{}\nEOF\n\
         cat {p}; echo; if echo x > {p} 2>/dev/null; then echo WRITABLE; fi; \
         grep -c nspawn-lifecycle-params /proc/self/mountinfo || true; ls /tmp | grep -c nspawn-lifecycle-params || true",
        host_params.display(),
        b.state(),
        p = b.at("/proc/driver/nvidia/params").display()
    );
    Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c", &script])
        .output()
        .unwrap()
}

#[test]
fn privileged_disable_device_node_modification_covers_params_read_only() {
    let b = Bundle::new();
    mkdirs(&b, "/proc/driver/nvidia");
    std::fs::write(
        b.at("/proc/driver/nvidia/params"),
        "ResmanDebugLevel: 4294967295\nModifyDeviceFiles: 1\nDeviceFileUID: 0\n",
    )
    .unwrap();
    let host = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        host.path(),
        "ResmanDebugLevel: 4294967295\nModifyDeviceFiles: 1\nDeviceFileUID: 0\n",
    )
    .unwrap();
    let out = params_in_namespace(&b, host.path());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("ModifyDeviceFiles: 0\n"), "{text}");
    assert!(text.contains("DeviceFileUID: 0\n"), "{text}");
    assert!(!text.contains("ModifyDeviceFiles: 1"), "{text}");
    assert!(!text.contains("WRITABLE"), "the copy is read-only: {text}");
    // No tmpfs and no temporary directory left behind.
    let tail: Vec<_> = text.lines().rev().take(2).collect();
    assert_eq!(tail, ["0", "0"], "{text}");
    // Outside the namespace the container's file is as it was.
    assert!(
        std::fs::read_to_string(b.at("/proc/driver/nvidia/params"))
            .unwrap()
            .contains("ModifyDeviceFiles: 1")
    );

    // No host params (no NVIDIA kernel driver): nothing to do.
    let out = params_in_namespace(&b, Path::new("/nonexistent/params"));
    assert!(String::from_utf8_lossy(&out.stdout).contains("ModifyDeviceFiles: 1"));

    // A symlink planted at the container's params (to a file the bind would then cover): refused.
    std::fs::remove_file(b.at("/proc/driver/nvidia/params")).unwrap();
    std::fs::write(b.at("/victim"), "image file").unwrap();
    symlink("/victim", b.at("/proc/driver/nvidia/params")).unwrap();
    let out = params_in_namespace(&b, host.path());
    assert_eq!(out.status.code(), Some(9), "{out:?}");
}

/// Every file under `dir` (not following links), with its kind, link target or bytes: what a
/// hook did to a tree, comparable between two trees.
fn tree_of(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let mut entries: Vec<_> = std::fs::read_dir(&d).unwrap().map(|e| e.unwrap()).collect();
        entries.sort_by_key(std::fs::DirEntry::file_name);
        for e in entries {
            let p = e.path();
            let rel = p.strip_prefix(dir).unwrap().display().to_string();
            let md = std::fs::symlink_metadata(&p).unwrap();
            let mode = md.permissions().mode() & 0o7777;
            if md.file_type().is_symlink() {
                out.push(format!("{rel} -> {}", link_of(&p)));
            } else if md.is_dir() {
                out.push(format!("{rel}/ {mode:o}"));
                stack.push(p);
            } else {
                out.push(format!("{rel} {mode:o} {:?}", std::fs::read(&p).unwrap()));
            }
        }
    }
    out.sort();
    out
}

/// A bundle whose image has a cache, a stale link and the params the runtime shows.
fn image_bundle() -> Bundle {
    let b = Bundle::new();
    mkdirs(&b, "/etc/ld.so.conf.d");
    mkdirs(&b, ML);
    mkdirs(&b, "/proc/driver/nvidia");
    std::fs::write(b.at("/proc/driver/nvidia/params"), "ModifyDeviceFiles: 1\n").unwrap();
    symlink("libcuda.so.470.57.02", b.at(&format!("{ML}/libcuda.so.1"))).unwrap();
    b
}

/// What the three hooks do to `b` run the way `env` and `cwd` say, in one private mount
/// namespace: exit codes, what they printed (the bundle's path made neutral), and the params the
/// container then sees.
fn run_all_hooks(b: &Bundle, host_params: &Path, env: &[(&str, String)], cwd: &Path) -> String {
    let state = b.state();
    let params = b.at("/proc/driver/nvidia/params");
    let bin = bin();
    let script = format!(
        "for h in 'create-symlinks --link libcuda.so.1::{ML}/libcuda.so' \
                  'update-ldcache --lib libcuda.so.1::{ML}/libcuda.so.1' \
                  'disable-device-node-modification --host-params {hp}'; do \
             echo '{state}' | {bin} cdi-hook $h 2>&1; echo \"rc=$?\"; done; cat {p}",
        hp = host_params.display(),
        p = params.display(),
    );
    let mut cmd = Command::new("unshare");
    cmd.args(["-m", "--propagation", "private", "sh", "-c", &script])
        .current_dir(cwd)
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout).replace(&b.dir.path().display().to_string(), "<bundle>")
}

/// A pod chooses the hooks' environment (its image's `ENV`) and working directory (its rootfs):
/// with `TMPDIR` relative into an image link out of the root, absolute onto a machine directory,
/// a log filter, a journal stream, `LD_PRELOAD`, each hook does exactly what it does with a
/// clean environment from `/`: same output, same tree, nothing made outside the root.
#[test]
fn privileged_hooks_take_nothing_from_the_environment_or_working_directory() {
    let host = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(host.path(), "ModifyDeviceFiles: 1\nDeviceFileUID: 0\n").unwrap();
    let clean = image_bundle();
    let clean_out = run_all_hooks(&clean, host.path(), &[], Path::new("/"));
    assert_eq!(clean_out.matches("rc=0").count(), 3, "{clean_out}");
    assert!(clean_out.contains("ModifyDeviceFiles: 0"), "{clean_out}");

    let canary = tempfile::tempdir().unwrap();
    let mtime = |p: &Path| {
        let m = std::fs::metadata(p).unwrap();
        (m.mtime(), m.mtime_nsec(), m.ctime(), m.ctime_nsec())
    };
    let cases: [(&str, Vec<(&str, String)>); 4] = [
        (
            "TMPDIR relative, into an image link out of the root",
            vec![("TMPDIR", "vol".to_owned())],
        ),
        (
            "TMPDIR absolute",
            vec![("TMPDIR", canary.path().display().to_string())],
        ),
        (
            "log filters and a journal stream",
            vec![
                ("NSPAWN_LIFECYCLE_LOG", "trace".to_owned()),
                ("RUST_LOG", "trace".to_owned()),
                ("JOURNAL_STREAM", "0:0".to_owned()),
                ("NO_COLOR", "1".to_owned()),
            ],
        ),
        (
            "the loader's variables",
            vec![
                ("LD_PRELOAD", "/vol/evil.so".to_owned()),
                ("LD_LIBRARY_PATH", "/vol".to_owned()),
            ],
        ),
    ];
    for (name, env) in cases {
        let hostile = image_bundle();
        symlink(canary.path(), hostile.at("/vol")).unwrap();
        let before = mtime(canary.path());
        let out = run_all_hooks(&hostile, host.path(), &env, &hostile.root());
        // A directory made and removed again still changes its parent's times.
        assert_eq!(
            mtime(canary.path()),
            before,
            "{name}: a hook made something in the directory TMPDIR named"
        );
        assert_eq!(
            std::fs::read_dir(canary.path()).unwrap().count(),
            0,
            "{name}"
        );
        let mut left = tree_of(&hostile.root());
        left.retain(|e| !e.starts_with("vol "));
        assert_eq!(left, tree_of(&clean.root()), "{name}");
        assert_eq!(out, clean_out, "{name}: the hooks behaved differently");
    }
}

/// What a case plants in an image.
type Plant = Box<dyn Fn(&Bundle)>;

/// Run `update-ldcache` in a mount namespace where the container's `/proc` is a fresh procfs
/// and its `/dev` a tmpfs with a real `zero` node, as a runtime has them before `pivot_root`.
fn ldcache_with_api_mounts(b: &Bundle) -> Output {
    let bin = bin();
    let script = format!(
        "set -e; mount -t proc proc {r}/proc; mount -t tmpfs dev {r}/dev; mknod {r}/dev/zero c 1 5; \
         echo '{s}' | timeout -s KILL 20 {bin} cdi-hook update-ldcache --lib libcuda.so.1::{ML}/libcuda.so.1",
        r = b.root().display(),
        s = b.state(),
    );
    Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c", &script])
        .output()
        .unwrap()
}

/// The image's `/etc/ld.so.cache` as a link into the container's fresh procfs (`/proc/kmsg`
/// blocks a reader forever and eats the kernel log), through `/proc/self` and `/proc/1/root`
/// magic links, onto `/dev/zero`, a link loop, a chain of 40 links, a FIFO and a 1 GiB sparse
/// file: never read, replaced by a cache of ours, in bounded time.
#[test]
fn privileged_update_ldcache_reads_no_hostile_cache() {
    let cases: Vec<(&str, Plant)> = vec![
        (
            "kmsg",
            Box::new(|b| symlink("/proc/kmsg", b.at("/etc/ld.so.cache")).unwrap()),
        ),
        (
            "self",
            Box::new(|b| symlink("/proc/self/environ", b.at("/etc/ld.so.cache")).unwrap()),
        ),
        (
            "pid1",
            Box::new(|b| {
                symlink("/proc/1/root/etc/ld.so.cache", b.at("/etc/ld.so.cache")).unwrap()
            }),
        ),
        (
            "zero",
            Box::new(|b| symlink("/dev/zero", b.at("/etc/ld.so.cache")).unwrap()),
        ),
        (
            "loop",
            Box::new(|b| {
                symlink("ld.so.cache.b", b.at("/etc/ld.so.cache")).unwrap();
                symlink("ld.so.cache", b.at("/etc/ld.so.cache.b")).unwrap();
            }),
        ),
        (
            "chain40",
            Box::new(|b| {
                for i in 0..40 {
                    symlink(format!("c{}", i + 1), b.at(&format!("/etc/c{i}"))).unwrap();
                }
                std::fs::write(b.at("/etc/c40"), b"not reached").unwrap();
                symlink("c0", b.at("/etc/ld.so.cache")).unwrap();
            }),
        ),
        (
            "fifo",
            Box::new(|b| {
                nix::unistd::mkfifo(
                    &b.at("/etc/ld.so.cache"),
                    nix::sys::stat::Mode::from_bits_truncate(0o644),
                )
                .unwrap();
            }),
        ),
        (
            "sparse",
            Box::new(|b| {
                let f = std::fs::File::create(b.at("/etc/ld.so.cache")).unwrap();
                f.set_len(1 << 30).unwrap();
            }),
        ),
    ];
    for (name, plant) in cases {
        let b = image_bundle();
        mkdirs(&b, "/dev");
        plant(&b);
        let start = std::time::Instant::now();
        let out = ldcache_with_api_mounts(&b);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{name}: {err}");
        assert!(
            start.elapsed() < std::time::Duration::from_secs(15),
            "{name}: {err}"
        );
        assert!(err.contains("not read") || name == "fifo", "{name}: {err}");
        let cache = b.at("/etc/ld.so.cache");
        assert!(
            std::fs::symlink_metadata(&cache).unwrap().is_file(),
            "{name}"
        );
        assert!(ldconfig_p(&cache).contains("libcuda.so.1"), "{name}");
    }
}

/// A hook that cannot finish (here: a runtime that never writes or closes the OCI state) fails on
/// its own deadline, naming the step it was in, instead of holding the container's start.
#[test]
fn a_hook_past_its_deadline_fails_naming_the_step() {
    let b = Bundle::new();
    let mut child = hook_command()
        .args(["cdi-hook", "create-symlinks", "--link", "a::/b"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let _held_open = child.stdin.take();
    let start = std::time::Instant::now();
    let out = child.wait_with_output().unwrap();
    let waited = start.elapsed();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(
        err,
        "error: cdi-hook: deadline passed while reading the OCI state and config.json\n"
    );
    let deadline = u64::from(nspawn_lifecycle::apply::cdi_hook::DEADLINE_SECONDS);
    assert!(
        waited >= std::time::Duration::from_secs(deadline - 1),
        "{waited:?}"
    );
    assert_eq!(std::fs::read_dir(b.root()).unwrap().count(), 0);
}

/// The usual container rootfs is an overlay (containerd's snapshotter): the image's cache lives
/// in a lower layer, and overlayfs with layers on different filesystems (here the upper one on a
/// tmpfs) reports such a file's layer device, not the root's. It is the image's own file on the
/// root's filesystem: read and kept, never "replaced by ours".
#[test]
fn privileged_update_ldcache_keeps_the_images_cache_on_an_overlay_rootfs() {
    let b = Bundle::new();
    let layers = tempfile::tempdir().unwrap();
    let lower = layers.path().join("lower");
    for d in ["etc", "usr/lib64"] {
        std::fs::create_dir_all(lower.join(d)).unwrap();
    }
    std::fs::create_dir_all(layers.path().join("rw")).unwrap();
    std::fs::copy(
        "/usr/lib/x86_64-linux-gnu/libc.so.6",
        lower.join("usr/lib64/libc.so.6"),
    )
    .unwrap();
    std::fs::write(lower.join("etc/ld.so.conf"), "/usr/lib64\n").unwrap();
    let st = Command::new("ldconfig")
        .arg("-r")
        .arg(&lower)
        .status()
        .unwrap();
    assert!(st.success());
    let bin = bin();
    let script = format!(
        "set -e; mount -t tmpfs rw {rw}; mkdir {u} {w}; \
         mount -t overlay overlay -o lowerdir={l},upperdir={u},workdir={w} {r}; \
         echo '{s}' | {bin} cdi-hook update-ldcache --lib libcuda.so.1::{ML}/libcuda.so.1; \
         ldconfig -p -C {r}/etc/ld.so.cache",
        l = lower.display(),
        rw = layers.path().join("rw").display(),
        u = layers.path().join("rw/upper").display(),
        w = layers.path().join("rw/work").display(),
        r = b.root().display(),
        s = b.state(),
    );
    let out = Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c", &script])
        .output()
        .unwrap();
    let (text, err) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{text}{err}");
    assert!(!err.contains("not read"), "{err}");
    assert!(
        text.contains("libc.so.6 (libc6,x86-64) => /usr/lib64/libc.so.6"),
        "{text}"
    );
    assert!(text.contains("libcuda.so.1 (libc6,x86-64) =>"), "{text}");
}
