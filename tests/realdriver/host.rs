//! The real-driver fixture hosts (issue 11): [`BASE`] materialized, then NVIDIA's real
//! 550.163.01 userspace laid in by `tests/realdriver/fetch.sh` in one of its two layouts (`run`,
//! `deb`). Shared by `tests/realdriver.rs` and the hooks benchmark (`tests/bench/hooks/`), so
//! both measure the same host; included there with `#[path]`.

use anyhow::{Context as _, Result, bail};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Everything of the host but the driver's userspace files, which fetch.sh lays in: two GPUs of
/// the driver's version, their nodes, and nvidia-persistenced's socket. No merged-/usr links: the
/// `deb` layout makes them (trixie), the `run` layout keeps a real /lib. No ld.so.cache: fetch.sh
/// builds it with `ldconfig -r` over whatever the host's library directories hold.
pub const BASE: &str = "\
# Two GPUs with a real 550.163.01 userspace driver (tests/realdriver/fetch.sh)
dir /usr/lib/x86_64-linux-gnu
dir /usr/bin
elf /usr/lib/x86_64-linux-gnu/libc.so.6 x86_64 libc.so.6
dir /etc
dir /run/lock
dir /var/lib/machines/kube1
chr /dev/null 1:3
file /proc/devices <<END
Character devices:
  1 mem
195 nvidia
226 drm
508 nvidia-uvm

Block devices:
  7 loop
END
nvidia-kernel 550.163.01 x86_64
nvidia-gpu 0000:3b:00.0 0 GPU-2f6d1c8e-0b7a-4e39-8c51-d4a7e9b3f120 NVIDIA L4
nvidia-gpu 0000:86:00.0 1 GPU-a91e4b37-5c2d-4f08-b6e3-17c9d0f8a254 NVIDIA L4
chr /dev/nvidia0 195:0
chr /dev/nvidia1 195:1
chr /dev/nvidiactl 195:255
chr /dev/nvidia-uvm 508:0
chr /dev/nvidia-uvm-tools 508:1
dir /run/nvidia-persistenced
sock /run/nvidia-persistenced/socket
";

/// `tests/realdriver/fetch.sh`, which downloads (once, into its cache) and lays out the driver.
pub fn fetch_sh() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/realdriver/fetch.sh")
}

/// Lay the real driver into the host tree at `root` (BASE materialized there first) in `layout`
/// (`run` or `deb`), by `fetch.sh install`, which downloads the packages first if they are not
/// cached yet.
pub fn install(layout: &str, root: &Path) -> Result<()> {
    let out = Command::new(fetch_sh())
        .args(["install", layout])
        .arg(root)
        .output()
        .with_context(|| format!("running {}", fetch_sh().display()))?;
    if !out.status.success() {
        bail!(
            "tests/realdriver/fetch.sh install {layout} {} failed ({}):\n{}{}",
            root.display(),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    install_c_runtime(root)
}

/// The C runtime NVIDIA's tools need (what their `DT_NEEDED` and `PT_INTERP` name), copied
/// from the machine the tests run on: the driver's own files come from the packages, the C
/// library from a real host, as on a node. The loader is reached as on Debian, through the
/// absolute link `/lib64/ld-linux-x86-64.so.2`, which discovery must resolve inside the host root.
pub const C_RUNTIME: &[&str] = &[
    "ld-linux-x86-64.so.2",
    "libc.so.6",
    "libm.so.6",
    "libdl.so.2",
    "libpthread.so.0",
    "librt.so.1",
];

fn install_c_runtime(root: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = root.join("usr/lib/x86_64-linux-gnu");
    for name in C_RUNTIME {
        let from = Path::new("/lib/x86_64-linux-gnu").join(name);
        let to = dir.join(name);
        let bytes = std::fs::read(&from).with_context(|| format!("reading {}", from.display()))?;
        let _ = std::fs::remove_file(&to);
        std::fs::write(&to, bytes).with_context(|| format!("writing {}", to.display()))?;
        std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o755))?;
    }
    let lib64 = root.join("lib64");
    let lib64 = if std::fs::symlink_metadata(&lib64).is_ok_and(|m| m.file_type().is_symlink()) {
        root.join("usr/lib64")
    } else {
        lib64
    };
    std::fs::create_dir_all(&lib64)?;
    let link = lib64.join("ld-linux-x86-64.so.2");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink("/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2", &link)?;
    Ok(())
}
