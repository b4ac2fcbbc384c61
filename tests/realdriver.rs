//! Discovery against a REAL NVIDIA driver's files, checked by NVIDIA's own tool (issue 11).
//!
//! The hosts are built from Debian trixie's nvidia-graphics-drivers 550.163.01 packages by
//! tests/realdriver/fetch.sh, in both layouts found on hosts: NVIDIA's `.run` installer (`run`)
//! and Debian's packages with their alternatives links (`deb`). On each, the file list of our
//! `discover --json` is compared with what `nvidia-ctk cdi generate --mode=management` mounts
//! (libraries, binaries, firmware, IPC sockets); every intended difference is named here and in
//! the table in tests/README.md. The `.nspawn` file and the CDI spec of each host are pinned by golden files.
//!
//! Privileged (mknod) and needs the cached packages (fetch.sh downloads them once) and
//! `../shared/tools/nvidia-container-toolkit/nvidia-ctk` (or `$NVIDIA_CTK`): missing any of them
//! FAILS the test; nothing here is skipped.

#![allow(clippy::unwrap_used)]

mod common;
#[path = "realdriver/host.rs"]
mod realdriver_host;
use common::run_helper as run;
use nspawn_lifecycle::discovery::{self, Verdict};
use nspawn_lifecycle::fixture;
use nspawn_lifecycle::fs::host::HostRoot;
use nspawn_lifecycle::model::cdi;
use serde_json::Value;
use std::collections::BTreeSet;
use std::os::unix::fs::DirBuilderExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const VERSION: &str = "550.163.01";
const NSPAWN: &str = "etc/systemd/nspawn/kube1.nspawn";

fn manifest() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8(bytes.to_vec()).unwrap()
}

fn ok(what: &str, out: &Output) {
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}{}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
}

/// The host: `realdriver/host.rs`'s BASE materialized, then the real driver laid in by fetch.sh in
/// `layout`.
fn real_host(layout: &str) -> tempfile::TempDir {
    assert!(
        nix::unistd::geteuid().is_root(),
        "privileged tests build host trees with mknod and must run as root"
    );
    let dir = tempfile::Builder::new()
        .prefix(&format!("realdriver-{layout}."))
        .tempdir()
        .unwrap();
    fixture::materialize(realdriver_host::BASE, dir.path()).unwrap();
    realdriver_host::install(layout, dir.path()).unwrap();
    std::fs::create_dir_all(dir.path().join("run/nspawn-lifecycle")).unwrap();
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(dir.path().join("run/nspawn-lifecycle/locks"))
        .unwrap();
    dir
}

/// Compare with tests/golden/<name>; UPDATE_GOLDEN=1 rewrites it instead.
fn golden(name: &str, actual: &str) {
    let path = manifest().join("tests/golden").join(name);
    if std::env::var_os("UPDATE_GOLDEN").is_some_and(|v| v == "1") {
        std::fs::write(&path, actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (UPDATE_GOLDEN=1 writes it)", path.display()));
    assert!(
        expected == actual,
        "{name} differs from the golden file (UPDATE_GOLDEN=1 rewrites it):\n{actual}"
    );
}

/// What a driver install provides, by kind, as names comparable across tools: a library by its
/// path relative to its library directory (`libcuda.so.550.163.01`, `vdpau/libvdpau_nvidia.so.…`),
/// binaries, firmware files and sockets by file name.
#[derive(Debug, Default, PartialEq, Eq)]
struct FileSet {
    libraries: BTreeSet<String>,
    binaries: BTreeSet<String>,
    firmware: BTreeSet<String>,
    sockets: BTreeSet<String>,
}

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|s| (*s).to_owned()).collect()
}

fn basename(p: &str) -> String {
    p.rsplit('/').next().unwrap().to_owned()
}

/// Our file set, from `discover --json` (the binary, as operators run it), and that JSON with the
/// host root replaced.
fn ours(root: &Path) -> (FileSet, String) {
    let out = run(root, &["discover", "--json"]);
    ok("discover --json", &out);
    let shown = text(&out.stdout).replace(
        &format!(
            "\"hostRoot\": {}",
            serde_json::to_string(&root.display().to_string()).unwrap()
        ),
        "\"hostRoot\": \"<host-root>\"",
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["verdict"]["state"], "complete", "{shown}");
    let d = &v["driver"];
    assert_eq!(d["version"], VERSION);
    let mut s = FileSet::default();
    for dir in d["libDirs"].as_array().unwrap() {
        assert_eq!(dir["triplet"], "x86_64-linux-gnu");
        for f in dir["files"].as_array().unwrap() {
            let name = f["name"].as_str().unwrap().to_owned();
            assert!(s.libraries.insert(name.clone()), "{name} listed twice");
        }
    }
    for b in d["binaries"].as_array().unwrap() {
        s.binaries.insert(basename(b.as_str().unwrap()));
    }
    let fw = d["firmware"].as_str().expect("firmware directory found");
    assert_eq!(fw, format!("/lib/firmware/nvidia/{VERSION}"));
    for e in std::fs::read_dir(root.join(fw.trim_start_matches('/'))).unwrap() {
        s.firmware
            .insert(e.unwrap().file_name().into_string().unwrap());
    }
    for dir in d["sockets"].as_array().unwrap() {
        s.sockets
            .insert(format!("{}/socket", dir.as_str().unwrap()));
    }
    (s, shown)
}

fn nvidia_ctk() -> PathBuf {
    common::nvidia_tool("nvidia-ctk")
}

/// What `nvidia-ctk cdi generate --mode=management` mounts from the same host tree.
fn theirs(root: &Path) -> FileSet {
    theirs_in(root, root)
}

/// The same with the driver's files under `root` and the device nodes under `dev_root`.
fn theirs_in(root: &Path, dev_root: &Path) -> FileSet {
    let v = ctk_spec(root, dev_root);
    let driver_root = root.display().to_string();
    let driver_root = driver_root.trim_end_matches('/').to_owned();
    let mut s = FileSet::default();
    let mounts = v["containerEdits"]["mounts"].as_array().unwrap();
    assert!(!mounts.is_empty(), "nvidia-ctk mounted nothing: {v}");
    for m in mounts {
        let host = m["hostPath"].as_str().unwrap();
        let rel = host
            .strip_prefix(&driver_root)
            .unwrap_or_else(|| panic!("nvidia-ctk mounts {host} from outside the driver root"));
        let dir = rel.rsplit_once('/').unwrap().0;
        if rel.starts_with("/lib/firmware/") || rel.starts_with("/usr/lib/firmware/") {
            s.firmware.insert(basename(rel));
        } else if ["/usr/bin", "/usr/sbin", "/bin", "/sbin"].contains(&dir) {
            s.binaries.insert(basename(rel));
        } else if rel.ends_with("/socket") {
            s.sockets.insert(rel.to_owned());
        } else {
            let name = [
                "/usr/lib/x86_64-linux-gnu/nvidia/current/",
                "/usr/lib/x86_64-linux-gnu/",
            ]
            .iter()
            .find_map(|d| rel.strip_prefix(d))
            .unwrap_or_else(|| panic!("nvidia-ctk mounts {rel}: not a known library dir"));
            s.libraries.insert(name.to_owned());
        }
    }
    s
}

/// nvidia-ctk's management-mode spec of the driver under `root`, device nodes under `dev_root`.
fn ctk_spec(root: &Path, dev_root: &Path) -> Value {
    let out_dir = tempfile::tempdir().unwrap();
    let spec = out_dir.path().join("ctk.json");
    let driver_root = root.display().to_string();
    // In a private mount namespace over an empty /dev: NVIDIA's real libraries, loaded by
    // nvidia-ctk, create /dev/nvidiactl (195:255, 0666) when it is missing, and this test must
    // leave the machine it runs on as it found it.
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg(r#"mount -t tmpfs tmpfs /dev && exec "$0" "$@""#)
        .arg(nvidia_ctk())
        .args(["cdi", "generate", "--mode=management", "--format=json"])
        .arg(format!("--driver-root={driver_root}"))
        .arg(format!("--dev-root={}", dev_root.display()))
        .arg(format!("--output={}", spec.display()))
        .output()
        .unwrap();
    ok("nvidia-ctk cdi generate", &out);
    serde_json::from_slice(&std::fs::read(&spec).unwrap()).unwrap()
}

/// Ours minus theirs and theirs minus ours, per kind.
fn differences(ours: &FileSet, theirs: &FileSet) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    for (kind, a, b) in [
        ("library", &ours.libraries, &theirs.libraries),
        ("binary", &ours.binaries, &theirs.binaries),
        ("firmware", &ours.firmware, &theirs.firmware),
        ("socket", &ours.sockets, &theirs.sockets),
    ] {
        for n in a.difference(b) {
            out.push((kind.to_owned(), "only ours".to_owned(), n.clone()));
        }
        for n in b.difference(a) {
            out.push((kind.to_owned(), "only nvidia-ctk".to_owned(), n.clone()));
        }
    }
    out
}

fn diff(kind: &str, side: &str, name: &str) -> (String, String, String) {
    (kind.to_owned(), side.to_owned(), name.to_owned())
}

/// The differences the table in tests/README.md explains. Libraries: nvidia-ctk's management mode leaves
/// out `libnvidia-api.so.1` (in its optional, feature-flagged list only) and the EGL platform
/// libraries (listed by its graphics discovery, not mounted in this mode); we carry every driver
/// library, as the issue asks.
fn intended_library_extras() -> Vec<(String, String, String)> {
    vec![
        diff("library", "only ours", "libnvidia-api.so.1"),
        diff("library", "only ours", "libnvidia-egl-gbm.so.1.1.2"),
        diff("library", "only ours", "libnvidia-egl-wayland.so.1.1.18"),
    ]
}

/// Both tools agree on the real driver's files beyond `extra` differences, which are named.
fn compare(layout: &str, extra: Vec<(String, String, String)>) -> tempfile::TempDir {
    let dir = real_host(layout);
    let root = dir.path();
    let (ours, shown) = ours(root);
    let theirs = theirs(root);
    // What the real packages ship and NVIDIA's tool mounts, spelled out so a silent loss on both
    // sides is caught too.
    for lib in [
        format!("libcuda.so.{VERSION}"),
        format!("libnvidia-ml.so.{VERSION}"),
        format!("libnvidia-nvvm.so.{VERSION}"),
        format!("libnvidia-ptxjitcompiler.so.{VERSION}"),
        format!("libnvidia-gpucomp.so.{VERSION}"),
        format!("libnvidia-eglcore.so.{VERSION}"),
        format!("libnvidia-rtcore.so.{VERSION}"),
    ] {
        assert!(theirs.libraries.contains(&lib), "nvidia-ctk lacks {lib}");
        assert!(ours.libraries.contains(&lib), "we lack {lib}");
    }
    assert_eq!(ours.firmware, set(&["gsp_ga10x.bin", "gsp_tu10x.bin"]));
    assert_eq!(
        ours.sockets,
        set(&["/run/nvidia-persistenced/socket"]),
        "{ours:?}"
    );
    let mut want = intended_library_extras();
    want.extend(extra);
    want.sort();
    let mut got = differences(&ours, &theirs);
    got.sort();
    assert_eq!(
        got, want,
        "ours vs nvidia-ctk on the {layout} layout:\nours {ours:#?}\nnvidia-ctk {theirs:#?}"
    );
    golden(&format!("realdriver-{layout}.discover.json"), &shown);
    dir
}

/// The `.nspawn` file pre-start writes and the CDI spec, pinned.
fn goldens(root: &Path, layout: &str) {
    let out = run(root, &["nspawn-lifecycle", "pre-start", "kube1"]);
    ok("pre-start", &out);
    let file = std::fs::read_to_string(root.join(NSPAWN)).unwrap();
    assert!(!file.contains(&root.display().to_string()), "{file}");
    golden(&format!("realdriver-{layout}.nspawn"), &file);
    tree_is_the_host_files(root, &file);
    gpu_operator_checks(root);
    let inv = discovery::discover(&HostRoot::new(root)).unwrap();
    assert_eq!(inv.verdict, Verdict::Complete);
    let spec = cdi::spec(&inv, "nvidia.com/gpu").expect("a spec for a complete driver");
    golden(
        &format!("cdi-realdriver-{layout}.json"),
        &cdi::render(&spec),
    );
}

/// `abs` under `root` with its links followed inside `root` (absolute targets start again at it).
fn in_root(root: &Path, abs: &str) -> PathBuf {
    let mut p = root.join(abs.trim_start_matches('/'));
    for _ in 0..40 {
        match std::fs::read_link(&p) {
            Ok(t) if t.is_absolute() => p = root.join(t.strip_prefix("/").unwrap()),
            Ok(t) => p = p.parent().unwrap().join(t),
            Err(_) => return p,
        }
    }
    panic!("{abs}: too many links");
}

/// Issue 12: pre-start's tree (the driver root the machine sees, before the directory binds) holds
/// every library and tool discovery lists as the host's very file (same device and inode: a hard
/// link), so the `.nspawn` file binds none of them; and NVIDIA's nvidia-ctk, run on the bare
/// tree, finds every one of them, tools included (in the deb layout too: they are real files in
/// the tree, not `/etc/alternatives` links).
fn tree_is_the_host_files(root: &Path, nspawn: &str) {
    use std::os::unix::fs::MetadataExt as _;
    let tree = root.join("var/lib/nspawn-lifecycle/driver-root/kube1");
    let inv = discovery::discover(&HostRoot::new(root)).unwrap();
    let d = inv.driver.as_ref().unwrap();
    let mut files = Vec::new();
    for dir in &d.lib_dirs {
        for f in &dir.files {
            let host = format!("{}/{}", dir.path, f.name);
            let at = format!("usr/lib/{}/{}", dir.triplet, f.name);
            files.push((host, at));
        }
    }
    for b in &d.binaries {
        files.push((b.to_string(), format!("usr/bin/{}", basename(b))));
    }
    for (host, at) in &files {
        let h = std::fs::metadata(in_root(root, host)).unwrap();
        let t = std::fs::symlink_metadata(tree.join(at))
            .unwrap_or_else(|e| panic!("{at} not in the tree: {e}"));
        assert!(t.is_file(), "{at} is not a file in the tree");
        assert_eq!(
            (t.dev(), t.ino()),
            (h.dev(), h.ino()),
            "{at} is not the host's {host}"
        );
        assert!(
            !nspawn.contains(&format!("{host}:")),
            "{host} is still bound"
        );
    }
    let theirs = theirs_in(&tree, root);
    let (ours, _) = ours(root);
    let lost: Vec<_> = differences(&ours, &theirs)
        .into_iter()
        .filter(|(kind, side, _)| (kind == "library" || kind == "binary") && side == "only ours")
        .filter(|d| !intended_library_extras().contains(d))
        .collect();
    assert!(lost.is_empty(), "nvidia-ctk on the tree misses {lost:?}");
}

/// What NVIDIA's GPU Operator runs on a driver root, in the sequence its code runs it, on
/// pre-start's tree as it is (`<root>`), and as a pod sees it: bound read-only at another path
/// (`/driver-root`). The validator and MIG manager `chroot <root> nvidia-smi`; NVIDIA's real
/// `nvidia-smi` must then start (the loader, the C library and NVML resolve inside the tree) and
/// fail only for want of the kernel driver. The dev root is the host's (the tree holds no `dev/`,
/// which is how the validator's `GetDevRoot` tells), so the control nodes are made there. Run in
/// a private mount namespace with NVIDIA's majors in `/proc/devices` (the fixture host's), the
/// nodes on a tmpfs: nothing of this machine changes. One shim: `cdi transform root` sets each
/// device node's `hostPath` (a CDI 0.5.0 field) but keeps the generated `cdiVersion: 0.3.0`, and
/// then refuses its own output ("the spec version must be at least v0.5.0") whenever `--from`
/// and `--to` differ, whatever the driver root; the version is raised between the two commands.
const GPU_OPERATOR_SEQUENCE: &str = r#"
set -u
tree=$1 ctk=$2 devices=$3 out=$4
mount -t tmpfs tmpfs /mnt
mount -t tmpfs tmpfs /dev
mkdir /mnt/driver-root
mount --bind "$tree" /mnt/driver-root && mount -o remount,bind,ro /mnt/driver-root
mount --bind "$devices" /proc/devices
for r in "$tree" /mnt/driver-root; do
    v=$(basename "$r")
    chroot "$r" nvidia-smi >"$out/$v.smi" 2>&1; echo $? >"$out/$v.smi.rc"
    chroot "$r" nvidia-smi -L >"$out/$v.smi-L" 2>&1; echo $? >"$out/$v.smi-L.rc"
    "$ctk" system create-device-nodes --control-devices --driver-root="$r" --dev-root=/ \
        >"$out/$v.nodes" 2>&1; echo $? >"$out/$v.nodes.rc"
    ls -l /dev >>"$out/$v.nodes"
    set -o pipefail
    "$ctk" cdi generate --mode=management --driver-root="$r" --dev-root=/ --format=json \
        --vendor=management.nvidia.com --class=gpu 2>"$out/$v.gen.err" \
        | sed 's/^{"cdiVersion":"0\.3\.0"/{"cdiVersion":"0.5.0"/' \
        | "$ctk" cdi transform root --from="$r" --to="$tree" >"$out/$v.json" 2>>"$out/$v.gen.err"
    echo $? >"$out/$v.json.rc"
    set +o pipefail
    rm -f /dev/nvidia*
done
"#;

fn gpu_operator_checks(root: &Path) {
    let tree = root.join("var/lib/nspawn-lifecycle/driver-root/kube1");
    let out = tempfile::tempdir().unwrap();
    let run = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "bash", "-c"])
        .arg(GPU_OPERATOR_SEQUENCE)
        .arg("bash")
        .arg(&tree)
        .arg(nvidia_ctk())
        .arg(root.join("proc/devices"))
        .arg(out.path())
        .output()
        .unwrap();
    ok("the GPU Operator's sequence", &run);
    let read = |name: &str| std::fs::read_to_string(out.path().join(name)).unwrap();
    for view in [tree.file_name().unwrap().to_str().unwrap(), "driver-root"] {
        for smi in ["smi", "smi-L"] {
            let said = read(&format!("{view}.{smi}"));
            assert!(
                said.contains("couldn't communicate with the NVIDIA driver"),
                "chroot {view} nvidia-smi ({smi}) did not run NVIDIA's nvidia-smi to its driver \
                 check (exit {}): {said}",
                read(&format!("{view}.{smi}.rc")).trim()
            );
        }
        assert_eq!(
            read(&format!("{view}.nodes.rc")).trim(),
            "0",
            "{}",
            read(&format!("{view}.nodes"))
        );
        assert!(
            read(&format!("{view}.nodes")).contains("nvidiactl"),
            "{}",
            read(&format!("{view}.nodes"))
        );
        assert_eq!(
            read(&format!("{view}.json.rc")).trim(),
            "0",
            "{}",
            read(&format!("{view}.gen.err"))
        );
        // The pipeline writes YAML, as the validator reads it: every `hostPath:` outside /dev
        // (device nodes were on the namespace's tmpfs) must be in the tree and exist.
        let spec = read(&format!("{view}.json"));
        let paths: Vec<&str> = spec
            .lines()
            .filter_map(|l| l.trim_start_matches([' ', '-']).strip_prefix("hostPath: "))
            .filter(|p| !p.starts_with("/dev/"))
            .collect();
        assert!(paths.len() > 10, "{view}: {spec}");
        for p in paths {
            assert!(
                p.starts_with(tree.to_str().unwrap()),
                "{view}: {p} is outside the tree"
            );
            assert!(
                Path::new(p).exists(),
                "{view}: the spec names {p}, which does not exist"
            );
        }
    }
}

#[test]
fn privileged_run_installer_layout_matches_nvidia_ctk() {
    let dir = compare("run", Vec::new());
    goldens(dir.path(), "run");
}

/// Debian's layout. nvidia-ctk does not find `nvidia-smi` and `nvidia-debugdump`: /usr/bin holds
/// links to `/etc/alternatives/…`, absolute, which it resolves against this machine's / rather
/// than the driver root ("Could not locate nvidia-smi"); on the host itself (driver root /) the
/// same links resolve. We resolve every link inside the host root and carry both.
#[test]
fn privileged_debian_package_layout_matches_nvidia_ctk() {
    let dir = compare(
        "deb",
        vec![
            diff("binary", "only ours", "nvidia-debugdump"),
            diff("binary", "only ours", "nvidia-smi"),
        ],
    );
    goldens(dir.path(), "deb");
}

/// `nvidia-smi -q` as the driver prints it (the lines tests/gpu/compare.py reads), for the GPUs
/// of a `discover --json`.
fn smi_q(discover: &Value, minor_of_second: Option<u64>) -> String {
    let mut t = format!("Driver Version                            : {VERSION}\n");
    let gpus = discover["gpus"].as_array().unwrap();
    t += &format!(
        "Attached GPUs                             : {}\n",
        gpus.len()
    );
    for (i, g) in gpus.iter().enumerate() {
        let minor = match (i, minor_of_second) {
            (1, Some(m)) => m,
            _ => g["minor"].as_u64().unwrap(),
        };
        let bus = g["busId"].as_str().unwrap().to_uppercase();
        t += &format!(
            "GPU 0000{bus}\n    Product Name                          : {}\n    \
             GPU UUID                              : {}\n    Minor Number                          : {minor}\n",
            g["model"].as_str().unwrap(),
            g["uuid"].as_str().unwrap()
        );
    }
    t
}

/// tests/gpu/compare.py, the GPU proof's check 1, on a real driver's files against nvidia-ctk's
/// own spec of them (management mode: there is no GPU here for nvml mode): it passes with every
/// difference explained, and fails when discovery misses a library nvidia-ctk mounts or
/// disagrees with nvidia-smi about a GPU.
#[test]
fn privileged_gpu_proof_compare_explains_every_difference_and_catches_a_gap() {
    let dir = real_host("run");
    let root = dir.path();
    let out = run(root, &["discover", "--json"]);
    ok("discover --json", &out);
    let discover: Value = serde_json::from_slice(&out.stdout).unwrap();
    let work = tempfile::tempdir().unwrap();
    let w = |name: &str, text: &str| {
        let p = work.path().join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    let spec = w("ctk.json", &ctk_spec(root, root).to_string());
    let compare = |d: &Value, smi: &str| {
        let out = Command::new("python3")
            .arg(manifest().join("tests/gpu/compare.py"))
            .arg(w("discover.json", &d.to_string()))
            .arg(w("smi.txt", smi))
            .arg(&spec)
            .arg("--driver-root")
            .arg(root)
            .output()
            .unwrap();
        (out.status.code(), text(&out.stdout) + &text(&out.stderr))
    };
    let (rc, said) = compare(&discover, &smi_q(&discover, None));
    assert_eq!(rc, Some(0), "{said}");
    for line in [
        "PASS discover finds the GPUs nvidia-smi lists: 2 vs 2",
        "PASS every difference from nvidia-ctk is explained (0 unexplained)",
        "DIFF library only ours: libnvidia-api.so.1: explained:",
    ] {
        assert!(said.contains(line), "{line}\n{said}");
    }
    assert!(
        !said.contains("UNEXPLAINED") && !said.contains("FAIL"),
        "{said}"
    );

    // Discovery that misses libcuda: unexplained, exit 1.
    let mut missing = discover.clone();
    for d in missing["driver"]["libDirs"].as_array_mut().unwrap() {
        d["files"]
            .as_array_mut()
            .unwrap()
            .retain(|f| !f["name"].as_str().unwrap().starts_with("libcuda.so."));
    }
    let (rc, said) = compare(&missing, &smi_q(&discover, None));
    assert_eq!(rc, Some(1), "{said}");
    assert!(
        said.contains(&format!(
            "DIFF library only nvidia-ctk: libcuda.so.{VERSION}: UNEXPLAINED"
        )),
        "{said}"
    );
    // nvidia-smi names another minor for the second GPU: that GPU's check fails.
    let (rc, said) = compare(&discover, &smi_q(&discover, Some(7)));
    assert_eq!(rc, Some(1), "{said}");
    assert!(said.contains("FAIL GPU-a91e4b37"), "{said}");
}

/// The IMEX daemon and its control tool, which NVIDIA's data-center packages install beside
/// `nvidia-smi` and the ComputeDomain daemon pods run from the driver root (stand-ins here:
/// Debian's 550 packages ship neither): discovery lists them, pre-start puts them in the driver
/// root, and NVIDIA's nvidia-ctk finds them both on the host and in that bare tree.
#[test]
fn privileged_imex_tools_are_in_the_driver_root_and_nvidia_ctk_finds_them() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = real_host("run");
    let root = dir.path();
    let tools = ["nvidia-imex", "nvidia-imex-ctl"];
    for tool in tools {
        let p = root.join("usr/bin").join(tool);
        std::fs::write(&p, "#!/bin/sh\nexit 0\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let (ours, _) = ours(root);
    let theirs = theirs(root);
    let out = run(root, &["nspawn-lifecycle", "pre-start", "kube1"]);
    ok("pre-start", &out);
    let tree = root.join("var/lib/nspawn-lifecycle/driver-root/kube1");
    let in_tree = theirs_in(&tree, root);
    for tool in tools {
        assert!(ours.binaries.contains(tool), "discovery lacks {tool}");
        assert!(theirs.binaries.contains(tool), "nvidia-ctk lacks {tool}");
        assert!(
            tree.join("usr/bin").join(tool).is_file(),
            "{tool} not in the driver root"
        );
        assert!(
            in_tree.binaries.contains(tool),
            "nvidia-ctk does not find {tool} in the driver root: {in_tree:#?}"
        );
    }
}
