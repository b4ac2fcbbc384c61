//! Real OCI runtimes (Debian 12's runc 1.1.5 and crun 1.8.1, installed here if missing) run real
//! containers whose config was injected by the official CDI crate from our spec, hooks included
//! (this test binary's helper stands in for the copy pre-start binds into the machine). Three
//! images, each a glibc rootfs built at test time:
//! (a) Debian layout (the loader searches /usr/lib/x86_64-linux-gnu);
//! (b) /usr/lib64 layout: Debian's libc6-amd64:i386 glibc, whose loader searches only /lib64,
//!     /usr/lib64, /lib and /usr/lib (tests/cdihooks/fetch-lib64-glibc.sh);
//! (c) Debian layout with a stale `libcuda.so.1 -> libcuda.so.470.57.02` and an absolute link
//!     at `libnvidia-ml.so.1` pointing at another file of the image.
//! In each, a probe built with gcc (dynamically linked against the image's glibc) dlopens
//! `libcuda.so.1` and `libnvidia-ml.so.1` by SONAME and calls into them, checks `libcuda.so` and
//! `/dev/nvidia0`, then execs `ldconfig -p`. The driver libraries are gcc-built stand-ins with the
//! real SONAMEs whose `cuInit` / `nvmlInit_v2` return 4242 / 4343, so a line proves which file
//! was loaded. Privileged: CI runs as root.

#![allow(clippy::unwrap_used)] // helpers outside #[test] fns; a panic is the failure report

mod common;

use container_device_interface as cdi_lib;
use nspawn_lifecycle::discovery::{
    DeviceNode, DeviceRole, DriverFile, Gpu, Inventory, LibDir, UserspaceDriver, Verdict,
};
use nspawn_lifecycle::model::cdi;
use oci_spec::runtime as oci;
use std::collections::HashMap;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_nspawn-lifecycle-helper");
const VER: &str = "550.163.01";
const ML: &str = "usr/lib/x86_64-linux-gnu";

const PROBE_C: &str = r#"
#include <dlfcn.h>
#include <stdio.h>
#include <unistd.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
int main(void) {
    const char *libs[3] = {"libcuda.so.1", "libnvidia-ml.so.1", "libcuda.so"};
    const char *syms[3] = {"cuInit", "nvmlInit_v2", "cuInit"};
    for (int i = 0; i < 3; i++) {
        void *h = dlopen(libs[i], RTLD_NOW);
        if (!h) { printf("DLOPEN-FAIL %s %s\n", libs[i], dlerror()); continue; }
        int (*f)(unsigned) = (int (*)(unsigned))dlsym(h, syms[i]);
        printf("DLOPEN-OK %s %d\n", libs[i], f ? f(0) : -1);
    }
    printf("LIBCUDA-SO %s\n", access("/usr/lib/x86_64-linux-gnu/libcuda.so", F_OK) == 0 ? "yes" : "no");
    struct stat st;
    if (stat("/dev/nvidia0", &st) == 0 && S_ISCHR(st.st_mode))
        printf("NODE /dev/nvidia0 %u:%u\n", major(st.st_rdev), minor(st.st_rdev));
    FILE *v = fopen("/victim", "r");
    char buf[64] = {0};
    if (v) { fgets(buf, sizeof buf, v); printf("VICTIM %s\n", buf); }
    fflush(stdout);
    execl("/sbin/ldconfig", "ldconfig", "-p", (char *)0);
    printf("EXEC-FAIL ldconfig\n");
    return 1;
}
"#;

fn sh(cmd: &mut Command) {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn have(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// crun and runc from Debian, installed with the machine's own apt sources when missing.
fn ensure_runtimes() {
    if have("crun") && have("runc") {
        return;
    }
    sh(Command::new("apt-get")
        .args([
            "install",
            "-y",
            "-q",
            "-o",
            "DPkg::Lock::Timeout=600",
            "crun",
            "runc",
        ])
        .env("DEBIAN_FRONTEND", "noninteractive"));
}

/// The gcc-built driver stand-ins in `dir`, as the machine sees them in its driver root (`/run/nvidia/driver/usr/lib/<triplet>`).
fn build_driver(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    for (file, soname, body) in [
        (
            format!("libcuda.so.{VER}"),
            "libcuda.so.1",
            "int cuInit(unsigned f) { (void)f; return 4242; }",
        ),
        (
            format!("libnvidia-ml.so.{VER}"),
            "libnvidia-ml.so.1",
            "int nvmlInit_v2(void) { return 4343; }",
        ),
    ] {
        let src = dir.join(format!("{soname}.c"));
        std::fs::write(&src, body).unwrap();
        sh(Command::new("gcc")
            .args(["-shared", "-fPIC", &format!("-Wl,-soname,{soname}"), "-o"])
            .arg(dir.join(&file))
            .arg(&src));
        std::fs::remove_file(src).unwrap();
    }
}

fn inventory() -> Inventory {
    let node = |path: &str, major, minor, role| DeviceNode {
        path: path.parse().unwrap(),
        major,
        minor,
        role,
    };
    Inventory {
        devices: vec![
            node("/dev/nvidia-uvm", 509, 0, DeviceRole::Uvm),
            node("/dev/nvidia0", 195, 0, DeviceRole::Gpu),
            node("/dev/nvidiactl", 195, 255, DeviceRole::Control),
        ],
        kvm: None,
        host_devices: Vec::new(),
        disks: Vec::new(),
        gpus: vec![Gpu {
            index: 0,
            minor: 0,
            uuid: "GPU-00000000-11c1-52b8-0517-92f30e7fac00".into(),
            bus_id: "0000:10:00.0".into(),
            model: "NVIDIA H100 80GB HBM3".into(),
            device: Some("/dev/nvidia0".into()),
            dri: Vec::new(),
            mig_caps: Vec::new(),
        }],
        kernel_module: Some(VER.into()),
        driver: Some(UserspaceDriver {
            version: VER.into(),
            lib_dirs: vec![LibDir {
                path: "/usr/lib/x86_64-linux-gnu".parse().unwrap(),
                triplet: "x86_64-linux-gnu".into(),
                files: vec![
                    DriverFile {
                        name: format!("libcuda.so.{VER}"),
                        soname: Some("libcuda.so.1".into()),
                    },
                    DriverFile {
                        name: format!("libnvidia-ml.so.{VER}"),
                        soname: Some("libnvidia-ml.so.1".into()),
                    },
                ],
            }],
            binaries: Vec::new(),
            firmware: None,
            sockets: Vec::new(),
            runtime: Vec::new(),
        }),
        verdict: Verdict::Complete,
    }
}

/// Our spec with the machine's paths moved under `machine` (this host has no machine) and the
/// hooks pointed at this build's helper.
fn spec_json(machine: &Path) -> String {
    let spec = cdi::spec(&inventory(), cdi::DEFAULT_KIND).unwrap();
    let text = cdi::render(&spec);
    let hook = nspawn_lifecycle::model::layout::HOOK_BINARY;
    text.replace(
        "\"/run/nvidia/driver/",
        &format!("\"{}/run/nvidia/driver/", machine.display()),
    )
    .replace(&format!("\"{hook}\""), &format!("\"{BIN}\""))
}

/// `runc spec`'s default config, running the probe, injected with every GPU of our spec by the
/// official CDI crate.
fn config(spec_dir: &Path) -> oci::Spec {
    let tmp = tempfile::tempdir().unwrap();
    sh(Command::new("runc").arg("spec").current_dir(tmp.path()));
    let mut v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(tmp.path().join("config.json")).unwrap()).unwrap();
    v["process"]["terminal"] = false.into();
    v["process"]["args"] = serde_json::json!(["/probe"]);
    v["root"]["readonly"] = false.into();
    v["root"]["path"] = "rootfs".into();
    let mut spec: oci::Spec = serde_json::from_value(v).unwrap();
    let mut cache = cdi_lib::cache::Cache::new(
        vec![spec_dir.display().to_string()],
        HashMap::new(),
        HashMap::new(),
    );
    cache.refresh().unwrap();
    cache
        .inject_devices(Some(&mut spec), vec!["nvidia.com/gpu=all".to_owned()])
        .unwrap();
    spec
}

/// A glibc rootfs of `layout` with the probe and a cache the image's way.
fn rootfs(root: &Path, layout: &str, probe: &Path, lib64_glibc: &Path) {
    for d in [
        "etc/ld.so.conf.d",
        "sbin",
        "proc",
        "dev",
        "sys",
        "tmp",
        "usr/lib64",
    ] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    match layout {
        "debian" | "stale" => {
            std::fs::create_dir_all(root.join(ML)).unwrap();
            // libcuda's DT_NEEDED besides libc (stubs since glibc 2.34, still loaded by name).
            for f in [
                "libc.so.6",
                "ld-linux-x86-64.so.2",
                "libm.so.6",
                "libdl.so.2",
                "libpthread.so.0",
                "librt.so.1",
            ] {
                std::fs::copy(
                    Path::new("/usr/lib/x86_64-linux-gnu").join(f),
                    root.join(ML).join(f),
                )
                .unwrap();
            }
            symlink("usr/lib", root.join("lib")).unwrap();
            std::fs::create_dir_all(root.join("lib64")).unwrap();
            symlink(
                "/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2",
                root.join("lib64/ld-linux-x86-64.so.2"),
            )
            .unwrap();
            std::fs::write(
                root.join("etc/ld.so.conf.d/x86_64-linux-gnu.conf"),
                "/usr/lib/x86_64-linux-gnu\n",
            )
            .unwrap();
        }
        "lib64" => {
            sh(Command::new("cp")
                .arg("-a")
                .arg(lib64_glibc.join("lib64"))
                .arg(root));
            // What RHEL's ldconfig has built in.
            std::fs::write(
                root.join("etc/ld.so.conf.d/lib64.conf"),
                "/lib64\n/usr/lib64\n",
            )
            .unwrap();
        }
        _ => unreachable!(),
    }
    std::fs::write(
        root.join("etc/ld.so.conf"),
        "include /etc/ld.so.conf.d/*.conf\n",
    )
    .unwrap();
    std::fs::copy("/sbin/ldconfig", root.join("sbin/ldconfig")).unwrap();
    std::fs::copy(probe, root.join("probe")).unwrap();
    if layout == "stale" {
        // An image built against an older driver, and an absolute link at a SONAME path.
        symlink("libcuda.so.470.57.02", root.join(ML).join("libcuda.so.1")).unwrap();
        std::fs::write(root.join("victim"), "image file\n").unwrap();
        symlink("/victim", root.join(ML).join("libnvidia-ml.so.1")).unwrap();
    }
    // The image's own cache, as its build would have left it.
    sh(Command::new("ldconfig").arg("-r").arg(root));
}

fn run(
    runtime: &str,
    layout: &str,
    work: &Path,
    probe: &Path,
    lib64: &Path,
    cfg: &oci::Spec,
) -> String {
    let bundle = work.join(format!("{runtime}-{layout}"));
    rootfs(&bundle.join("rootfs"), layout, probe, lib64);
    std::fs::write(
        bundle.join("config.json"),
        serde_json::to_vec_pretty(cfg).unwrap(),
    )
    .unwrap();
    let state = work.join(format!("state-{runtime}"));
    let id = format!(
        "nspawn-lifecycle-cdi-{runtime}-{layout}-{}",
        std::process::id()
    );
    let mut cmd = if runtime == "crun" {
        // crun 1.8 refuses this VM's hybrid cgroup layout ("cgroups in hybrid mode not
        // supported"): run it where the empty cgroup2 mount is gone, without cgroup setup (its
        // device eBPF filter needs an RLIMIT_MEMLOCK this rig cannot raise). Devices still come
        // from mknod as the spec says. A rig limit, not one of the spec.
        let mut c = Command::new("unshare");
        c.args(["-m", "--propagation", "private", "sh", "-c"]).arg(
            "umount /sys/fs/cgroup/unified 2>/dev/null; exec crun --cgroup-manager=disabled \"$@\"",
        );
        c.arg("crun");
        c
    } else {
        Command::new(runtime)
    };
    cmd.arg("--root").arg(&state);
    let out = cmd
        .args(["run", "--bundle"])
        .arg(&bundle)
        .arg(&id)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{runtime} {layout}: {text}");
    text
}

/// Stand-ins built here, or NVIDIA's real 550.163.01 files from Debian (tests/realdriver/fetch.sh).
enum Driver {
    Stubs,
    Real,
}

fn fetch_lib64_glibc() -> PathBuf {
    common::fetched("cdihooks/fetch-lib64-glibc.sh")
}

/// The machine's library directory: the stand-ins, or the real files of a `.run`-style install.
fn driver_files(driver: &Driver, dir: &Path, work: &Path) {
    match driver {
        Driver::Stubs => build_driver(dir),
        Driver::Real => {
            let fetch = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/realdriver/fetch.sh");
            let out = Command::new(fetch).arg("version").output().unwrap();
            assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), VER, "{out:?}");
            let tree = work.join("real-host");
            sh(Command::new(fetch).args(["install", "run"]).arg(&tree));
            std::fs::create_dir_all(dir).unwrap();
            for f in [
                format!("libcuda.so.{VER}"),
                format!("libnvidia-ml.so.{VER}"),
            ] {
                std::fs::copy(tree.join(ML).join(&f), dir.join(&f)).unwrap();
            }
        }
    }
}

/// Every runtime × image for `driver`; returns the failures.
fn run_all(driver: &Driver, runtimes: &[&str]) -> Vec<String> {
    let lib64 = fetch_lib64_glibc();
    let work = tempfile::tempdir().unwrap();
    let machine = work.path().join("machine");
    driver_files(
        driver,
        &machine.join(format!("run/nvidia/driver/{ML}")),
        work.path(),
    );
    let probe = work.path().join("probe");
    std::fs::write(work.path().join("probe.c"), PROBE_C).unwrap();
    sh(Command::new("gcc")
        .arg("-o")
        .arg(&probe)
        .arg(work.path().join("probe.c")));
    let spec_dir = work.path().join("cdi");
    std::fs::create_dir(&spec_dir).unwrap();
    std::fs::write(spec_dir.join(cdi::DEFAULT_SPEC_FILE), spec_json(&machine)).unwrap();
    let cfg = config(&spec_dir);

    let mut failures = Vec::new();
    for runtime in runtimes {
        for layout in ["debian", "lib64", "stale"] {
            let text = run(runtime, layout, work.path(), &probe, &lib64, &cfg);
            let mut want = vec![
                "LIBCUDA-SO yes".to_owned(),
                "NODE /dev/nvidia0 195:0".to_owned(),
                "libcuda.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so.1".to_owned(),
                "libnvidia-ml.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"
                    .to_owned(),
                // The image's own libc stays in its cache.
                "libc.so.6 (libc6,x86-64) =>".to_owned(),
            ];
            match driver {
                Driver::Stubs => {
                    want.push("DLOPEN-OK libcuda.so.1 4242".to_owned());
                    want.push("DLOPEN-OK libnvidia-ml.so.1 4343".to_owned());
                    want.push("DLOPEN-OK libcuda.so 4242".to_owned());
                }
                Driver::Real => {
                    // No kernel driver here: both calls must return an error code (observed:
                    // 100 CUDA_ERROR_NO_DEVICE, 9 NVML_ERROR_DRIVER_NOT_LOADED), never the
                    // stand-ins' 4242/4343, which proves the real library was loaded and ran.
                    for lib in ["libcuda.so.1", "libnvidia-ml.so.1", "libcuda.so"] {
                        let code = text
                            .lines()
                            .find_map(|l| l.strip_prefix(&format!("DLOPEN-OK {lib} ")))
                            .and_then(|c| c.trim().parse::<i64>().ok());
                        if code.is_none_or(|c| [0, -1, 4242, 4343].contains(&c)) {
                            failures.push(format!(
                                "{runtime} {layout}: {lib} not loaded or no error code:\n{text}"
                            ));
                        }
                    }
                }
            }
            for w in &want {
                if !text.contains(w.as_str()) {
                    failures.push(format!("{runtime} {layout}: no {w:?} in\n{text}"));
                }
            }
            if layout == "stale" && !text.contains("VICTIM image file") {
                failures.push(format!(
                    "{runtime} {layout}: the image file behind the absolute link changed:\n{text}"
                ));
            }
            eprintln!("---- {runtime} {layout}\n{text}");
        }
    }
    failures
}

#[test]
fn privileged_real_runtimes_load_the_driver_in_every_image_layout() {
    ensure_runtimes();
    let failures = run_all(&Driver::Stubs, &["runc", "crun"]);
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// NVIDIA's real libcuda and libnvidia-ml (550.163.01, Debian trixie non-free) load in every
/// image layout under runc; `cuInit` and `nvmlInit_v2` return an error code without a kernel
/// driver, which proves the load.
#[test]
fn privileged_real_runtimes_load_nvidias_real_libraries() {
    ensure_runtimes();
    let failures = run_all(&Driver::Real, &["runc"]);
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
