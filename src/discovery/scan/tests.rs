use super::*;
use crate::fixture::materialize;

/// A host whose module is loaded with one GPU but no device nodes (so no root is needed):
/// the verdict is incomplete and always names the two missing nodes.
const GPU: &str = "nvidia-kernel 580.95.05 x86_64\n\
    nvidia-gpu 0000:06:00.0 0 GPU-8c3f5a02-6f1e-4b1c-9d7e-2a4b6c8d0e1f NVIDIA L4\n";

fn scan(text: &str) -> (tempfile::TempDir, Inventory) {
    let dir = tempfile::tempdir().unwrap();
    materialize(text, dir.path()).unwrap();
    let inv = discover(&HostRoot::new(dir.path())).unwrap();
    (dir, inv)
}

fn reasons(inv: &Inventory) -> Vec<String> {
    match &inv.verdict {
        Verdict::Incomplete { reasons } => reasons.clone(),
        v => panic!("expected incomplete, got {v:?}"),
    }
}

fn files(dir: &LibDir) -> Vec<(&str, Option<&str>)> {
    dir.files
        .iter()
        .map(|f| (f.name.as_str(), f.soname.as_deref()))
        .collect()
}

#[test]
fn gpus_without_nodes_are_incomplete_not_none() {
    let (_d, inv) = scan(GPU);
    assert_eq!(
        reasons(&inv),
        [
            "/dev/nvidia0 missing for GPU 0 (0000:06:00.0)",
            "/dev/nvidiactl missing",
            "libcuda.so.580.95.05 not found through /etc/ld.so.cache or in the standard library directories"
        ]
    );
    assert_eq!(inv.kernel_module.as_deref(), Some("580.95.05"));
    assert_eq!(inv.gpus[0].bus_id, "0000:06:00.0");
}

#[test]
fn nothing_at_all_is_none() {
    let (_d, inv) = scan("dir /usr/lib/x86_64-linux-gnu\n");
    assert_eq!(inv.verdict, Verdict::None);
    assert_eq!(inv.driver, None);
    assert_eq!(inv.kvm, None);
    // A loaded module without GPUs or nodes is nothing to bind either.
    let (_d, inv) = scan("nvidia-kernel 580.95.05 x86_64\n");
    assert_eq!(inv.verdict, Verdict::None);
}

#[test]
fn side_by_side_versions_pick_the_kernel_modules() {
    let text = format!(
        "{GPU}nvidia-libs /usr/lib/x86_64-linux-gnu 580.82.07 x86_64\n\
         elf /usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05 x86_64 libcuda.so.1\n\
         elf /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.95.05 x86_64 libnvidia-ml.so.1\n\
         elf /usr/lib/x86_64-linux-gnu/libcuda.so.999.1.1 x86_64 libcuda.so.1\n"
    );
    let (_d, inv) = scan(&text);
    let d = inv.driver.as_ref().unwrap();
    assert_eq!(d.version, "580.95.05");
    // The unversioned EGL platform library cannot tell which driver it came with; it is
    // carried with the one in use.
    assert_eq!(
        files(&d.lib_dirs[0]),
        [
            ("libcuda.so.580.95.05", Some("libcuda.so.1")),
            (
                "libnvidia-egl-wayland.so.1.1.13",
                Some("libnvidia-egl-wayland.so.1")
            ),
            ("libnvidia-ml.so.580.95.05", Some("libnvidia-ml.so.1"))
        ]
    );
    assert!(!reasons(&inv).iter().any(|r| r.contains("kernel module")));
    // Without a match the newest is reported, and every version found is named.
    let text = text.replace("580.95.05 x86_64\n", "580.95.06 x86_64\n");
    let (_d, inv) = scan(&text);
    assert_eq!(inv.driver.as_ref().unwrap().version, "999.1.1");
    let r = reasons(&inv);
    let mismatch = r.iter().find(|r| r.starts_with("kernel module")).unwrap();
    assert_eq!(
        mismatch,
        "kernel module 580.95.06 but libcuda.so.580.82.07 (in /usr/lib/x86_64-linux-gnu), \
         libcuda.so.580.95.05 (in /usr/lib/x86_64-linux-gnu), libcuda.so.999.1.1 (in /usr/lib/x86_64-linux-gnu)"
    );
    assert!(
        r.contains(&"libnvidia-ml.so.999.1.1 missing from /usr/lib/x86_64-linux-gnu".to_owned())
    );
}

#[test]
fn merged_usr_and_the_cache_name_one_directory_once() {
    let text = format!(
        "{GPU}dir /usr/lib/x86_64-linux-gnu\nlink /lib usr/lib\n\
         nvidia-libs /usr/lib/x86_64-linux-gnu 580.95.05 x86_64\n\
         ldcache /usr/lib/x86_64-linux-gnu=/lib/x86_64-linux-gnu\n"
    );
    let (_d, inv) = scan(&text);
    let d = inv.driver.unwrap();
    assert_eq!(d.lib_dirs.len(), 1);
    assert_eq!(d.lib_dirs[0].path, "/usr/lib/x86_64-linux-gnu");
    assert_eq!(d.lib_dirs[0].triplet, "x86_64-linux-gnu");
    // The SONAME equal to the file name is not repeated; the EGL platform library, whose
    // version is its own, is a driver file all the same (nvidia-ctk mounts it).
    let names = files(&d.lib_dirs[0]);
    assert!(names.contains(&("libnvidia-glcore.so.580.95.05", None)));
    assert!(names.contains(&(
        "vdpau/libvdpau_nvidia.so.580.95.05",
        Some("libvdpau_nvidia.so.1")
    )));
    assert!(names.contains(&(
        "libnvidia-egl-wayland.so.1.1.13",
        Some("libnvidia-egl-wayland.so.1")
    )));
}

#[test]
fn the_cache_decides_between_two_copies_for_one_architecture() {
    let text = format!(
        "{GPU}nvidia-libs /usr/lib/x86_64-linux-gnu 580.95.05 x86_64\n\
         nvidia-libs /usr/lib/x86_64-linux-gnu/nvidia/current 580.95.05 x86_64\n"
    );
    let (_d, inv) = scan(&text);
    let d = inv.driver.unwrap();
    assert_eq!(d.lib_dirs.len(), 1);
    assert_eq!(d.lib_dirs[0].path, "/usr/lib/x86_64-linux-gnu");
    let (_d, inv) = scan(&format!(
        "{text}ldcache /usr/lib/x86_64-linux-gnu/nvidia/current\n"
    ));
    let d = inv.driver.unwrap();
    assert_eq!(d.lib_dirs.len(), 1);
    assert_eq!(
        d.lib_dirs[0].path,
        "/usr/lib/x86_64-linux-gnu/nvidia/current"
    );
}

#[test]
fn i386_libraries_come_after_the_native_ones_and_need_no_nvml() {
    let text = format!(
        "{GPU}nvidia-libs /usr/lib/x86_64-linux-gnu 580.95.05 x86_64\n\
         nvidia-libs /usr/lib/i386-linux-gnu 580.95.05 i386 -libnvidia-ml\n"
    );
    let (_d, inv) = scan(&text);
    let d = inv.driver.as_ref().unwrap();
    let dirs: Vec<_> = d
        .lib_dirs
        .iter()
        .map(|l| (l.path.as_str(), l.triplet.as_str()))
        .collect();
    assert_eq!(
        dirs,
        [
            ("/usr/lib/x86_64-linux-gnu", "x86_64-linux-gnu"),
            ("/usr/lib/i386-linux-gnu", "i386-linux-gnu")
        ]
    );
    assert!(!reasons(&inv).iter().any(|r| r.contains("libnvidia-ml")));
}

#[test]
fn driver_files_without_the_version_in_their_names_are_carried() {
    let dir = "/usr/lib/x86_64-linux-gnu";
    let text = format!(
        "{GPU}nvidia-libs {dir} 580.95.05 x86_64\n\
         elf {dir}/libnvidia-api.so.1 x86_64 libnvidia-api.so.1\n\
         elf {dir}/libnvidia-nvvm70.so.4 x86_64 libnvidia-nvvm70.so.4\n\
         elf {dir}/libnvidia-egl-gbm.so.1.1.2 x86_64 libnvidia-egl-gbm.so.1\n\
         link {dir}/libnvidia-egl-gbm.so.1 libnvidia-egl-gbm.so.1.1.2\n\
         elf {dir}/libnvidia-egl-xcb.so.1.0.1 x86_64 libnvidia-egl-xcb.so.1\n\
         elf {dir}/libnvidia-egl-xlib.so.1.0.1 x86_64 libnvidia-egl-xlib.so.1\n\
         elf {dir}/libnvidia-egl-wayland2.so.1.0.0 x86_64 libnvidia-egl-wayland2.so.1\n\
         elf {dir}/libnvidia-api.so.2 x86_64 libnvidia-api.so.2\n\
         elf {dir}/libnvidia-egl-wayland.so.1 x86_64 libnvidia-egl-wayland.so.1\n\
         elf {dir}/libnvidia-foo.so.1 x86_64 libnvidia-foo.so.1\n\
         elf {dir}/libEGL.so.1.1.0 x86_64 libEGL.so.1\n"
    );
    let (_d, inv) = scan(&text);
    let d = inv.driver.unwrap();
    let names = files(&d.lib_dirs[0]);
    for want in [
        ("libnvidia-api.so.1", None),
        ("libnvidia-nvvm70.so.4", None),
        ("libnvidia-egl-gbm.so.1.1.2", Some("libnvidia-egl-gbm.so.1")),
        ("libnvidia-egl-xcb.so.1.0.1", Some("libnvidia-egl-xcb.so.1")),
        (
            "libnvidia-egl-xlib.so.1.0.1",
            Some("libnvidia-egl-xlib.so.1"),
        ),
        (
            "libnvidia-egl-wayland2.so.1.0.0",
            Some("libnvidia-egl-wayland2.so.1"),
        ),
    ] {
        assert!(names.contains(&want), "{want:?} missing from {names:?}");
    }
    // Near misses are not driver files: another SONAME generation, a bare SONAME-named
    // file, a name we do not know, glvnd's own libraries.
    for not in [
        "libnvidia-api.so.2",
        "libnvidia-foo.so.1",
        "libEGL.so.1.1.0",
    ] {
        assert!(!names.iter().any(|(n, _)| *n == not), "{not} in {names:?}");
    }
    for not in ["libnvidia-egl-gbm.so.1", "libnvidia-egl-wayland.so.1"] {
        assert!(!names.iter().any(|(n, _)| *n == not), "{not} in {names:?}");
    }
}

/// Debian's packages: libcuda and most libraries in nvidia/current, reached through
/// /etc/alternatives links from the multiarch directory, which holds the rest as plain files.
#[test]
fn debian_layout_carries_the_files_beside_nvidia_current() {
    let multi = "/usr/lib/x86_64-linux-gnu";
    let cur = "/usr/lib/x86_64-linux-gnu/nvidia/current";
    let text = format!(
        "{GPU}dir /usr/lib/x86_64-linux-gnu\nlink /lib usr/lib\n\
         elf {cur}/libcuda.so.580.95.05 x86_64 libcuda.so.1\n\
         link {cur}/libcuda.so.1 libcuda.so.580.95.05\n\
         elf {cur}/libnvidia-ml.so.580.95.05 x86_64 libnvidia-ml.so.1\n\
         elf {cur}/libnvidia-api.so.1 x86_64 libnvidia-api.so.1\n\
         link /etc/alternatives/nvidia--libcuda.so.1-x86_64-linux-gnu {cur}/libcuda.so.1\n\
         link {multi}/libcuda.so.1 /etc/alternatives/nvidia--libcuda.so.1-x86_64-linux-gnu\n\
         elf {multi}/libnvidia-eglcore.so.580.95.05 x86_64 libnvidia-eglcore.so.580.95.05\n\
         elf {multi}/libnvidia-egl-gbm.so.1.1.2 x86_64 libnvidia-egl-gbm.so.1\n\
         elf {multi}/libc.so.6 x86_64 libc.so.6\n\
         elf /usr/lib/i386-linux-gnu/libnvidia-glcore.so.580.95.05 i386\n"
    );
    let (_d, inv) = scan(&text);
    let d = inv.driver.as_ref().unwrap();
    let dirs: Vec<_> = d
        .lib_dirs
        .iter()
        .map(|l| (l.path.as_str(), l.triplet.as_str(), files(l)))
        .collect();
    assert_eq!(
        dirs,
        [
            (
                cur,
                "x86_64-linux-gnu",
                vec![
                    ("libcuda.so.580.95.05", Some("libcuda.so.1")),
                    ("libnvidia-api.so.1", None),
                    ("libnvidia-ml.so.580.95.05", Some("libnvidia-ml.so.1")),
                ]
            ),
            (
                multi,
                "x86_64-linux-gnu",
                vec![
                    ("libnvidia-egl-gbm.so.1.1.2", Some("libnvidia-egl-gbm.so.1")),
                    ("libnvidia-eglcore.so.580.95.05", None),
                ]
            ),
        ]
    );
    // Only the missing device nodes: the driver itself is complete.
    assert!(
        reasons(&inv).iter().all(|r| r.starts_with("/dev/")),
        "{:?}",
        reasons(&inv)
    );
}

/// An older driver's directory beside the one in use is not a companion: its unversioned
/// files belong to that driver.
#[test]
fn a_directory_with_its_own_libcuda_is_no_companion() {
    let text = format!(
        "{GPU}nvidia-libs /usr/lib/x86_64-linux-gnu/nvidia/current 580.95.05 x86_64\n\
         nvidia-libs /usr/lib/x86_64-linux-gnu 570.1.2 x86_64\n\
         elf /usr/lib/x86_64-linux-gnu/libnvidia-api.so.1 x86_64 libnvidia-api.so.1\n\
         elf /usr/lib/x86_64-linux-gnu/libnvidia-tls.so.580.95.05 x86_64\n"
    );
    let (_d, inv) = scan(&text);
    let d = inv.driver.unwrap();
    assert_eq!(d.version, "580.95.05");
    let paths: Vec<_> = d.lib_dirs.iter().map(|l| l.path.as_str()).collect();
    assert_eq!(paths, ["/usr/lib/x86_64-linux-gnu/nvidia/current"]);
}

#[test]
fn soname_falls_back_to_a_link_in_the_same_directory() {
    let dir = "/usr/lib/x86_64-linux-gnu";
    let text = format!(
        "{GPU}elf {dir}/libcuda.so.580.95.05 x86_64 libcuda.so.1\n\
         elf {dir}/libnvidia-ml.so.580.95.05 x86_64\n\
         link {dir}/libnvidia-ml.so.1 libnvidia-ml.so.580.95.05\n\
         link {dir}/libnvidia-ml.so libnvidia-ml.so.1\n\
         file {dir}/libnvidia-cfg.so.580.95.05 not an ELF file\n\
         link {dir}/libnvidia-cfg.so.1 libnvidia-cfg.so.580.95.05\n\
         file {dir}/libnvidia-tls.so.580.95.05 not an ELF file either\n"
    );
    let (_d, inv) = scan(&text);
    assert_eq!(
        files(&inv.driver.unwrap().lib_dirs[0]),
        [
            ("libcuda.so.580.95.05", Some("libcuda.so.1")),
            ("libnvidia-cfg.so.580.95.05", Some("libnvidia-cfg.so.1")),
            ("libnvidia-ml.so.580.95.05", Some("libnvidia-ml.so.1")),
            ("libnvidia-tls.so.580.95.05", None),
        ]
    );
}

#[test]
fn a_libcuda_that_is_not_a_usable_elf_is_named() {
    let text = format!(
        "{GPU}file /usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05 garbage\n\
         elf /usr/lib/aarch64-linux-gnu/libcuda.so.580.95.05 i386 libcuda.so.1\n"
    );
    let (_d, inv) = scan(&text);
    let r = reasons(&inv);
    assert!(
        r.contains(&"/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05: not an ELF file".to_owned()),
        "{r:?}"
    );
    assert!(
        r.contains(
            &"only 32-bit libcuda.so.580.95.05 found; the 64-bit driver libraries are missing"
                .to_owned()
        ),
        "{r:?}"
    );
}

#[test]
fn links_resolve_inside_the_host_root_and_loops_end() {
    // Absolute link targets and `..` past the top stay inside the root, as on the host.
    let text = format!(
        "{GPU}nvidia-libs /opt/nv/lib 580.95.05 x86_64\n\
         dir /usr/lib\n\
         link /usr/lib/x86_64-linux-gnu /opt/nv/lib\n\
         link /usr/lib/aarch64-linux-gnu ../../../../../../opt/nv/lib\n\
         link /lib64 lib64\n"
    );
    let (_d, inv) = scan(&text);
    let d = inv.driver.unwrap();
    let dirs: Vec<_> = d.lib_dirs.iter().map(|l| l.path.as_str()).collect();
    assert_eq!(dirs, ["/opt/nv/lib"]);
}

#[test]
fn non_utf8_names_are_skipped() {
    use std::os::unix::ffi::OsStrExt as _;
    let text = format!("{GPU}nvidia-libs /usr/lib/x86_64-linux-gnu 580.95.05 x86_64\n");
    let dir = tempfile::tempdir().unwrap();
    materialize(&text, dir.path()).unwrap();
    let lib = dir.path().join("usr/lib/x86_64-linux-gnu");
    std::fs::write(
        lib.join(std::ffi::OsStr::from_bytes(b"libcuda.so.\xff")),
        "x",
    )
    .unwrap();
    std::fs::write(
        lib.join(std::ffi::OsStr::from_bytes(b"lib\xff.so.580.95.05")),
        "x",
    )
    .unwrap();
    std::fs::create_dir_all(dir.path().join("dev")).unwrap();
    std::fs::write(
        dir.path()
            .join("dev")
            .join(std::ffi::OsStr::from_bytes(b"nvidia\xff")),
        "",
    )
    .unwrap();
    let inv = discover(&HostRoot::new(dir.path())).unwrap();
    // nvidia-libs' 23 versioned libraries and its EGL platform library.
    assert_eq!(inv.driver.unwrap().lib_dirs[0].files.len(), 24);
}

/// Found by tests/oversized.rs: a cache of 700 000 distinct libcuda paths meant 700 000
/// walks through the tree (minutes). Past 64 the cache is not believed, as for garbage.
/// A library directory named by ld.so.cache becomes a `Bind=` source; one
/// whose name holds a newline is refused (exit 2) naming it, never rendered.
#[test]
fn a_library_directory_with_a_control_character_is_refused_by_name() {
    let text = format!("{GPU}dir /etc\nnvidia-libs /opt/nv/lib 580.95.05 x86_64\n");
    let dir = tempfile::tempdir().unwrap();
    materialize(&text, dir.path()).unwrap();
    let odd = "/opt/nv/lib\nPrivateUsers=pick";
    std::fs::rename(dir.path().join("opt/nv/lib"), dir.path().join(&odd[1..])).unwrap();
    let cuda = format!("{odd}/libcuda.so.1");
    let cache = crate::fixture::ld_so_cache(&[("libcuda.so.1", cuda.as_str(), 0x303)]);
    std::fs::write(dir.path().join("etc/ld.so.cache"), cache).unwrap();
    let err = discover(&HostRoot::new(dir.path())).unwrap_err();
    assert_eq!(crate::error::exit_code(&err), 2, "{err:#}");
    let msg = format!("{err:#}");
    assert!(
        msg.contains(
            "library directory \"/opt/nv/lib\\nPrivateUsers=pick\" contains the control character"
        ),
        "{msg}"
    );
}

#[test]
fn a_cache_with_too_many_libcuda_paths_is_not_used() {
    let text = format!("{GPU}dir /etc\nnvidia-libs /opt/nv/lib 580.95.05 x86_64\n");
    let with_cache = |n: usize| {
        let dir = tempfile::tempdir().unwrap();
        materialize(&text, dir.path()).unwrap();
        // The same library under n different spellings: /opt/nv/lib/././libcuda.so.1
        let paths: Vec<String> = (0..n)
            .map(|i| format!("/opt/nv/lib/{}libcuda.so.1", "./".repeat(i)))
            .collect();
        let entries: Vec<_> = paths
            .iter()
            .map(|p| ("libcuda.so.1", p.as_str(), 0x303))
            .collect();
        let cache = crate::fixture::ld_so_cache(&entries);
        std::fs::write(dir.path().join("etc/ld.so.cache"), cache).unwrap();
        let inv = discover(&HostRoot::new(dir.path())).unwrap();
        (dir, inv)
    };
    let (_d, inv) = with_cache(MAX_CACHED_LIBCUDA);
    assert_eq!(inv.driver.unwrap().lib_dirs[0].path, "/opt/nv/lib");
    let (_d, inv) = with_cache(MAX_CACHED_LIBCUDA + 1);
    assert_eq!(inv.driver, None);
    let r = reasons(&inv);
    assert!(
        r.iter()
            .any(|r| r.contains("more than 64 different libcuda paths")),
        "{r:?}"
    );
}

#[test]
fn oversized_proc_files_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    materialize(GPU, dir.path()).unwrap();
    let p = dir.path().join("proc/driver/nvidia/version");
    std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    std::fs::write(&p, vec![b'x'; MAX_PROC_FILE as usize + 1]).unwrap();
    let err = format!("{:#}", discover(&HostRoot::new(dir.path())).unwrap_err());
    assert!(
        err.contains("proc/driver/nvidia/version: larger than 1048576 bytes"),
        "{err}"
    );
}

#[test]
fn a_driver_under_usr_local_nvidia_outside_the_cache_is_found() {
    let text = format!(
        "{GPU}nvidia-libs /usr/local/nvidia/lib64 580.95.05 x86_64\n\
         exe /usr/local/nvidia/bin/nvidia-smi\n\
         dir /usr/lib/x86_64-linux-gnu\nldcache /usr/lib/x86_64-linux-gnu\n"
    );
    let (_d, inv) = scan(&text);
    let d = inv.driver.as_ref().unwrap();
    assert_eq!(d.version, "580.95.05");
    assert_eq!(d.lib_dirs.len(), 1, "{:?}", d.lib_dirs);
    assert_eq!(d.lib_dirs[0].path.as_str(), "/usr/local/nvidia/lib64");
    assert_eq!(d.lib_dirs[0].triplet, "x86_64-linux-gnu");
    assert!(files(&d.lib_dirs[0]).contains(&("libcuda.so.580.95.05", Some("libcuda.so.1"))));
    let bins: Vec<_> = d.binaries.iter().map(|b| b.as_str()).collect();
    assert_eq!(bins, ["/usr/local/nvidia/bin/nvidia-smi"]);
    assert!(
        !reasons(&inv).iter().any(|r| r.contains("libcuda")),
        "{:?}",
        reasons(&inv)
    );
}
