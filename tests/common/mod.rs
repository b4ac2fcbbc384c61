//! Helpers shared by the binary-level tests (`mod common;` in each test file that needs them).

#![allow(dead_code, clippy::unwrap_used)] // each test crate uses a subset; a panic is the report

use std::path::Path;

/// `install ARGS` on the host tree `root`, as an operator runs it. The helper it copies is this
/// test build's own binary, built for the architecture the tests run on; on a host tree of
/// another architecture (as `status` tells it: `model::helper::host_machine`, from the driver's
/// libraries; an aarch64 host under the x86_64 build, the x86_64 hosts under the aarch64 build
/// in qemu-user) `status` rightly judges that copy unable to run, so a minimal ELF program of
/// the host's architecture stands in for it (the helper's header and identity are read, never
/// run).
pub fn install(root: &Path, args: &[&str]) -> std::process::Output {
    use nspawn_lifecycle::discovery::parse::{EM_AARCH64, EM_X86_64};
    use nspawn_lifecycle::model::helper::{THIS_MACHINE, host_machine};
    let out = run_helper(root, &[&["install"], args].concat());
    if !out.status.success() || args.contains(&"--dry-run") {
        return out;
    }
    let host = nspawn_lifecycle::fs::host::HostRoot::open(root).unwrap();
    let inv = nspawn_lifecycle::discovery::discover(&host).unwrap();
    let arch = match host_machine(&host, &inv) {
        Some(m) if m == THIS_MACHINE => return out,
        Some(EM_AARCH64) => "aarch64",
        Some(EM_X86_64) => "x86_64",
        _ => return out,
    };
    let stand_in = tempfile::tempdir().unwrap();
    nspawn_lifecycle::fixture::materialize(&format!("elf /helper {arch}\n"), stand_in.path())
        .unwrap();
    let installed = root.join(&nspawn_lifecycle::config::DEFAULT_HELPER_PATH[1..]);
    std::fs::write(
        installed,
        std::fs::read(stand_in.path().join("helper")).unwrap(),
    )
    .unwrap();
    out
}

/// Copy a fixture directory tree (regular files and directories) into `to`.
pub fn copy_tree(from: &Path, to: &Path) {
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dst = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            std::fs::create_dir_all(&dst).unwrap();
            copy_tree(&e.path(), &dst);
        } else {
            std::fs::copy(e.path(), &dst).unwrap();
        }
    }
}

/// Run the helper with `--host-root root` and `args` (log filter from the environment removed);
/// a panic in it fails the test.
pub fn run_helper(root: &Path, args: &[&str]) -> std::process::Output {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_nspawn-lifecycle-helper"))
        .arg("--host-root")
        .arg(root)
        .args(args)
        .env_remove("NSPAWN_LIFECYCLE_LOG")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{args:?} panicked:\n{stderr}");
    out
}

/// The helper's stdout for `args` under the host tree `root`, which must exit with `code`
/// (stderr in the failure message).
pub fn stdout_of_exit(root: &Path, args: &[&str], code: i32) -> Vec<u8> {
    let out = run_helper(root, args);
    assert_eq!(
        out.status.code(),
        Some(code),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// Everything about a tree that a write would change: type, mode, owner, size, mtime, ctime,
/// inode, device numbers, link targets and file bytes (up to 64 KiB: a larger file, such as the
/// 100 MB test build of the installed helper, by its metadata alone, whose ctime any write
/// changes), for every entry and for `root` itself
/// (`"."`: its mtime and ctime). Paths under `skip` (relative) are left out.
pub fn snapshot(
    root: &Path,
    skip: &[&str],
) -> std::collections::BTreeMap<std::path::PathBuf, String> {
    use std::os::unix::fs::MetadataExt as _;
    type Tree = std::collections::BTreeMap<std::path::PathBuf, String>;
    fn describe(m: &std::fs::Metadata) -> String {
        format!(
            "mode={:o} uid={} gid={} size={} mtime={}.{} ctime={}.{} ino={} rdev={}",
            m.mode(),
            m.uid(),
            m.gid(),
            m.size(),
            m.mtime(),
            m.mtime_nsec(),
            m.ctime(),
            m.ctime_nsec(),
            m.ino(),
            m.rdev()
        )
    }
    fn walk(root: &Path, dir: &Path, skip: &[&str], out: &mut Tree) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            let rel = p.strip_prefix(root).unwrap().to_path_buf();
            if skip.iter().any(|s| rel.starts_with(s)) {
                continue;
            }
            let m = std::fs::symlink_metadata(&p).unwrap();
            let mut desc = describe(&m);
            if m.file_type().is_symlink() {
                desc += &format!(" -> {}", std::fs::read_link(&p).unwrap().display());
            } else if m.is_file() && m.len() <= 64 << 10 {
                desc += &format!(" bytes={:?}", std::fs::read(&p).unwrap());
            }
            out.insert(rel, desc);
            if m.is_dir() {
                walk(root, &p, skip, out);
            }
        }
    }
    let mut out = Tree::new();
    out.insert(".".into(), describe(&std::fs::metadata(root).unwrap()));
    walk(root, root, skip, &mut out);
    out
}

/// What a fetch script of the suite prints (a cached tree; it downloads on first use): `script`
/// relative to `tests/`. Its failure fails the test with the script's own message.
pub fn fetched(script: &str) -> std::path::PathBuf {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join(script);
    let out = std::process::Command::new(&path).output().unwrap();
    assert!(
        out.status.success(),
        "{}: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    std::path::PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

/// The unit drop-in `install` writes for a machine (`{}`: its name), relative to the host root.
pub const DROPIN: &str = "etc/systemd/system/systemd-nspawn@{}.service.d/50-nspawn-lifecycle.conf";

/// A host built from example `name`, with `machines` installed by `install` (their directory
/// under /var/lib/machines). Privileged (mknod).
pub fn installed_host(name: &str, machines: &[&str]) -> tempfile::TempDir {
    assert!(
        nix::unistd::geteuid().is_root(),
        "privileged tests build host trees with mknod and must run as root"
    );
    let dir = tempfile::tempdir().unwrap();
    nspawn_lifecycle::fixture::materialize(
        nspawn_lifecycle::fixture::example(name).unwrap(),
        dir.path(),
    )
    .unwrap();
    // Installed as an operator would: `install` copies the helper to its stable path and
    // writes the drop-in and the `.nspawn` file for the host as it is.
    for m in machines {
        std::fs::create_dir_all(dir.path().join("var/lib/machines").join(m)).unwrap();
        let out = install(dir.path(), &[m]);
        assert!(
            out.status.success(),
            "install {m}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    dir
}

/// An empty machine tree with `/var/run -> ../run`.
pub fn machine_tree() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for d in ["usr/lib/x86_64-linux-gnu", "etc", "run", "var", "dev"] {
        std::fs::create_dir_all(dir.path().join(d)).unwrap();
    }
    std::os::unix::fs::symlink("../run", dir.path().join("var/run")).unwrap();
    dir
}

/// The version of NVIDIA's container toolkit the oracle tests are pinned to (PROVENANCE.md of
/// `../shared/tools/nvidia-container-toolkit/`).
pub const NVIDIA_TOOLKIT_VERSION: &str = "1.20.0 (commit d34b3046758c)";

/// NVIDIA's `tool` (`nvidia-ctk`, `nvidia-cdi-hook`), the oracle of the tests: `$NVIDIA_CTK_DIR/
/// <tool>` (or `$NVIDIA_CTK` for nvidia-ctk itself), then `../shared/tools/nvidia-container-toolkit/`
/// beside this repository, then `PATH`; otherwise the test fails with one message naming the
/// three ways and the version to install. Never a skip: CI has it.
pub fn nvidia_tool(tool: &str) -> std::path::PathBuf {
    use std::path::PathBuf;
    let mut tried = Vec::new();
    let from_env = match tool {
        "nvidia-ctk" => std::env::var_os("NVIDIA_CTK").map(PathBuf::from),
        _ => None,
    }
    .or_else(|| std::env::var_os("NVIDIA_CTK_DIR").map(|d| PathBuf::from(d).join(tool)));
    let beside = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../shared/tools/nvidia-container-toolkit")
        .join(tool);
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join(tool));
    for candidate in from_env.into_iter().chain([beside]).chain(on_path) {
        if candidate.is_file() {
            return candidate;
        }
        tried.push(candidate.display().to_string());
    }
    panic!(
        "NVIDIA's {tool} is this test's oracle and was not found (tried {}). Set NVIDIA_CTK_DIR \
         (or NVIDIA_CTK) to where it is, put NVIDIA's container toolkit beside this repository at \
         ../shared/tools/nvidia-container-toolkit/, or install the nvidia-container-toolkit \
         package, version {NVIDIA_TOOLKIT_VERSION} or later, so it is on PATH.",
        tried.join(", ")
    );
}

/// Services that must not be reached: the host file steps never call systemd.
pub struct NoSystemd;

impl nspawn_lifecycle::systemd::services::Services for NoSystemd {
    fn stop(&self, unit: &str) -> anyhow::Result<()> {
        panic!("stop {unit}")
    }
    fn start(&self, unit: &str) -> anyhow::Result<()> {
        panic!("start {unit}")
    }
    fn is_active(&self, unit: &str) -> anyhow::Result<bool> {
        panic!("is-active {unit}")
    }
    fn run(
        &self,
        _: &str,
        argv: &[&str],
        _: Option<std::os::fd::BorrowedFd<'_>>,
        _: std::time::Duration,
    ) -> anyhow::Result<nspawn_lifecycle::systemd::TransientOutcome> {
        panic!("run {argv:?}")
    }
}

/// Host mode's wiring of the host tree `root` as `host post-start` builds it (the default host
/// settings, discovery, the host spec with the installed helper as hook, no systemd): `f` gets
/// it with the settings, the inventory and the spec's text.
pub fn with_host_wiring<T>(
    root: &Path,
    f: impl FnOnce(
        &nspawn_lifecycle::apply::parts::Wiring<'_>,
        &nspawn_lifecycle::config::MachineConfig,
        &nspawn_lifecycle::discovery::Inventory,
        &str,
    ) -> T,
) -> T {
    use nspawn_lifecycle::apply::gate;
    use nspawn_lifecycle::fs::{host, machine_root};
    use nspawn_lifecycle::model::cdi;
    use nspawn_lifecycle::{config, discovery, model};
    let hroot = host::HostRoot::new(root);
    let hc = config::Config::default().host().unwrap();
    let inv = discovery::discover(&hroot).unwrap();
    let spec = cdi::spec_on_host(&inv, &hc.cdi_kind, config::DEFAULT_HELPER_PATH)
        .unwrap()
        .unwrap();
    let json = cdi::render(&spec);
    let mroot = machine_root::MachineRoot::open(root).unwrap();
    let markers = gate::Markers::of_host(&hroot);
    let helper = config::DEFAULT_HELPER_PATH.parse().unwrap();
    let desired = model::Desired::host(&hroot, &inv, &hc, &helper).unwrap();
    let wiring = nspawn_lifecycle::apply::parts::Wiring {
        who: nspawn_lifecycle::types::machine_name::Subject::Host,
        mc: &hc,
        host: &hroot,
        markers: &markers,
        root: &mroot,
        desired: &desired,
        services: &NoSystemd,
    };
    f(&wiring, &hc, &inv, &json)
}
