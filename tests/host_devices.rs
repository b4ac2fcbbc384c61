//! The host devices a node gets beside its GPUs: discovery by category on a GB300-like host,
//! the `.nspawn` binds and the nodes pre-start makes, the config's `devices` key and its bad
//! input, and hostile host trees (names sysfs could not make, a linked `/dev/infiniband`, ten
//! thousand partitions). Device nodes need root (mknod).

// Helpers here are test code too (clippy's allow-unwrap-in-tests covers only #[test] fns).
#![allow(clippy::unwrap_used)]

mod common;

use common::{run_helper as run, snapshot};
use nspawn_lifecycle::fixture;
use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _};
use std::path::Path;

const NSPAWN: &str = "etc/systemd/nspawn/kube1.nspawn";
const CONFIG: &str = "etc/nspawn-lifecycle/config.json";

fn require_root() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "host-device tests make device nodes: run them as root (CI does)"
    );
}

fn host_from(text: &str) -> tempfile::TempDir {
    require_root();
    let dir = tempfile::Builder::new()
        .prefix("host-devices.")
        .tempdir()
        .unwrap();
    fixture::materialize(text, dir.path()).unwrap();
    dir
}

fn gb300() -> tempfile::TempDir {
    host_from(fixture::example("gb300").unwrap())
}

fn pre_start(root: &Path) -> (i32, String) {
    let out = run(root, &["nspawn-lifecycle", "pre-start", "kube1"]);
    (
        out.status.code().unwrap(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn binds(root: &Path) -> Vec<String> {
    std::fs::read_to_string(root.join(NSPAWN))
        .unwrap()
        .lines()
        .filter(|l| l.starts_with("Bind=") || l.starts_with("BindReadOnly="))
        .map(str::to_owned)
        .collect()
}

fn mknod(root: &Path, path: &str, kind: nix::sys::stat::SFlag, major: u64, minor: u64) {
    nix::sys::stat::mknod(
        &root.join(path),
        kind,
        nix::sys::stat::Mode::from_bits_truncate(0o666),
        nix::sys::stat::makedev(major, minor),
    )
    .unwrap();
}

fn config(root: &Path, json: &str) {
    std::fs::create_dir_all(root.join(CONFIG).parent().unwrap()).unwrap();
    std::fs::write(root.join(CONFIG), json).unwrap();
}

#[test]
fn privileged_gb300_node_gets_every_device_and_rdma_cm_is_made() {
    let dir = gb300();
    let root = dir.path();
    let (code, err) = pre_start(root);
    assert_eq!(code, 0, "{err}");
    let b = binds(root);
    for want in [
        "Bind=/dev/kvm",
        "Bind=/dev/net/tun",
        "Bind=/dev/vhost-net",
        "BindReadOnly=/dev/infiniband",
        "Bind=/dev/nvme1n1",
        "Bind=/dev/gdrdrv",
        "Bind=/dev/nvidia-fs0",
        "Bind=/dev/nvidia-fs1",
        "Bind=/dev/nvidia-caps",
        "Bind=/dev/nvidia-caps-imex-channels",
    ] {
        assert!(b.iter().any(|l| l == want), "no {want} in {b:#?}");
    }
    // The host's own disks: the system NVMe (EFI partition mounted, LVM volume under /), the
    // RAID at /data and its members, the swap disk, the btrfs member.
    for never in [
        "loop",
        "zram",
        "uverbs0",
        "nvidia-cap1",
        "channel0",
        "nvme0n1",
        "dm-0",
        "md0",
        "nvme2n1",
        "nvme3n1",
        "sda",
        "sdb",
    ] {
        assert!(
            !b.iter().any(|l| l.contains(never)),
            "{never} bound: {b:#?}"
        );
    }
    // rdma_cm was registered without a node: pre-start made it as udev's rule would.
    let m = std::fs::symlink_metadata(root.join("dev/infiniband/rdma_cm")).unwrap();
    assert!(m.file_type().is_char_device());
    assert_eq!(
        (
            nix::sys::stat::major(m.rdev()),
            nix::sys::stat::minor(m.rdev())
        ),
        (10, 58)
    );
    assert_eq!(m.mode() & 0o7777, 0o666);
    // The driver's IMEX tools are in the driver root.
    let tree = root.join("var/lib/nspawn-lifecycle/driver-root/kube1/usr/bin");
    for tool in ["nvidia-imex", "nvidia-imex-ctl"] {
        assert!(tree.join(tool).exists(), "{tool} not in the driver root");
    }
    // A second start finds the node and makes nothing.
    let before = snapshot(root, &["run/nspawn-lifecycle/locks"]);
    let (code, err) = pre_start(root);
    assert_eq!(code, 0, "{err}");
    assert!(!err.contains("host device nodes made"), "{err}");
    assert_eq!(before, snapshot(root, &["run/nspawn-lifecycle/locks"]));
}

#[test]
fn privileged_a_share_machine_gets_its_own_caps_not_the_directories() {
    let dir = gb300();
    let root = dir.path();
    config(root, r#"{"machines": {"kube1": {"gpus": [0]}}}"#);
    let (code, err) = pre_start(root);
    assert_eq!(code, 0, "{err}");
    let b = binds(root);
    // GPU 0's MIG instance (caps 12 and 13) and the IMEX channels of the start one by one; no
    // directory, so a cap made later for another GPU never appears in the machine.
    for want in [
        "Bind=/dev/nvidia-caps/nvidia-cap12",
        "Bind=/dev/nvidia-caps/nvidia-cap13",
        "Bind=/dev/nvidia-caps-imex-channels/channel0",
        "Bind=/dev/nvidia-caps-imex-channels/channel1",
    ] {
        assert!(b.iter().any(|l| l == want), "no {want} in {b:#?}");
    }
    for never in [
        "Bind=/dev/nvidia-caps",
        "Bind=/dev/nvidia-caps-imex-channels",
        "Bind=/dev/nvidia-caps/nvidia-cap1",
        "Bind=/dev/nvidia-caps/nvidia-cap2",
    ] {
        assert!(!b.iter().any(|l| l == never), "{never:?} bound: {b:#?}");
    }
    // The host devices are the node's, whatever its share of the GPUs.
    assert!(
        b.contains(&"BindReadOnly=/dev/infiniband".to_owned()),
        "{b:#?}"
    );
}

#[test]
fn privileged_devices_switch_categories_off_and_add_extra_nodes() {
    let dir = gb300();
    let root = dir.path();
    std::fs::create_dir_all(root.join("dev")).unwrap();
    nix::sys::stat::mknod(
        &root.join("dev/fuse"),
        nix::sys::stat::SFlag::S_IFCHR,
        nix::sys::stat::Mode::from_bits_truncate(0o666),
        nix::sys::stat::makedev(10, 229),
    )
    .unwrap();
    config(
        root,
        r#"{"defaults": {"devices": {"block": false, "infiniband": false, "extra": ["/dev/fuse"]}},
            "machines": {"kube1": {"devices": {"infiniband": true, "kvm": false}}}}"#,
    );
    let (code, err) = pre_start(root);
    assert_eq!(code, 0, "{err}");
    let b = binds(root);
    // kube1 overrides infiniband and kvm and keeps the defaults' block and extra.
    assert!(
        b.contains(&"BindReadOnly=/dev/infiniband".to_owned()),
        "{b:#?}"
    );
    assert!(b.contains(&"Bind=/dev/fuse".to_owned()), "{b:#?}");
    assert!(b.contains(&"Bind=/dev/vhost-net".to_owned()), "{b:#?}");
    for never in ["nvme", "dm-0", "md0", "/dev/kvm"] {
        assert!(
            !b.iter().any(|l| l.contains(never)),
            "{never} bound: {b:#?}"
        );
    }
}

/// Each bad `devices` value: exit 2 naming the key, nothing written.
#[test]
fn privileged_bad_devices_are_named_and_change_nothing() {
    let dir = gb300();
    let root = dir.path();
    std::fs::write(root.join("dev/not-a-node"), "x").unwrap();
    std::os::unix::fs::symlink("null", root.join("dev/null-link")).unwrap();
    mknod(
        root,
        "dev/gpu-alias",
        nix::sys::stat::SFlag::S_IFCHR,
        195,
        1,
    );
    std::fs::create_dir_all(root.join("dev/disk/by-id")).unwrap();
    std::os::unix::fs::symlink("../../nvme0n1", root.join("dev/disk/by-id/nvme-system")).unwrap();
    std::os::unix::fs::symlink(
        "../../../etc/ld.so.cache",
        root.join("dev/disk/by-id/nowhere"),
    )
    .unwrap();
    for (devices, says) in [
        (
            r#"{"extra": ["/etc/passwd"]}"#,
            "machines.kube1.devices.extra[0]: \"/etc/passwd\" is not under /dev",
        ),
        (
            r#"{"extra": ["/dev/null", "/dev/nvidia0"]}"#,
            "machines.kube1.devices.extra[1]: \"/dev/nvidia0\" is an NVIDIA or DRM node",
        ),
        // Another name for GPU 1's node: refused by its number, not its name.
        (
            r#"{"extra": ["/dev/gpu-alias"]}"#,
            "machines.kube1.devices.extra[0]: \"/dev/gpu-alias\" is an NVIDIA or DRM node (195:1, the major of /dev/nvidia",
        ),
        (
            r#"{"disks": ["/dev/nvme0n1p1"]}"#,
            "machines.kube1.devices.disks[0]: \"/dev/nvme0n1p1\" is the host's: mounted at /boot/efi",
        ),
        (
            r#"{"disks": ["/dev/disk/by-id/nvme-system"]}"#,
            "machines.kube1.devices.disks[0]: \"/dev/disk/by-id/nvme-system\" (/dev/nvme0n1) is the host's: /dev/nvme0n1p1 on the same disk is mounted at /boot/efi",
        ),
        (
            r#"{"disks": ["/dev/md0"]}"#,
            "machines.kube1.devices.disks[0]: \"/dev/md0\" is the host's: mounted at /data",
        ),
        (
            r#"{"disks": ["/dev/nvme2n1"]}"#,
            "\"/dev/nvme2n1\" is the host's: held by md0",
        ),
        (
            r#"{"disks": ["/dev/sda"]}"#,
            "\"/dev/sda\" is the host's: /dev/sda1 on the same disk is in use as swap",
        ),
        (
            r#"{"disks": ["/dev/sdb"]}"#,
            "\"/dev/sdb\" is the host's: a member of the btrfs filesystem",
        ),
        (
            r#"{"extra": ["/dev/dm-0"]}"#,
            "machines.kube1.devices.extra[0]: \"/dev/dm-0\" is the host's: mounted at /",
        ),
        (
            r#"{"disks": ["/dev/loop0"]}"#,
            "machines.kube1.devices.disks[0]: \"/dev/loop0\" is not a disk or partition of the host",
        ),
        (
            r#"{"disks": ["/dev/null"]}"#,
            "machines.kube1.devices.disks[0]: \"/dev/null\" is not a block device",
        ),
        (
            r#"{"disks": ["/dev/disk/by-id/nowhere"]}"#,
            "\"/dev/disk/by-id/nowhere\" points at \"/etc/ld.so.cache\", which is not a block device under /dev",
        ),
        (
            r#"{"extra": ["/dev/not-a-node"]}"#,
            "machines.kube1.devices.extra[0]: \"/dev/not-a-node\" is not a device node",
        ),
        (
            r#"{"extra": ["/dev/null-link"]}"#,
            "machines.kube1.devices.extra[0]: \"/dev/null-link\" is a symlink",
        ),
        (
            r#"{"extra": ["/dev/fuse"]}"#,
            "machines.kube1.devices.extra[0]: \"/dev/fuse\" does not exist on the host",
        ),
        (
            r#"{"extra": ["/dev/null", "/dev/null"]}"#,
            "machines.kube1.devices.extra[1]: \"/dev/null\" is listed twice",
        ),
        (
            r#"{"extra": ["/dev/../etc/shadow"]}"#,
            "machines.kube1.devices.extra[0]",
        ),
        (r#"{"disks": false}"#, "disks"),
        (r#"{"block": "no"}"#, "block"),
    ] {
        config(
            root,
            &format!(r#"{{"machines": {{"kube1": {{"devices": {devices}}}}}}}"#),
        );
        let before = snapshot(root, &[]);
        let (code, err) = pre_start(root);
        assert_eq!(code, 2, "{devices}: {err}");
        assert!(err.contains(says), "{devices}: {err} should say {says}");
        // Found against the host or not, the error names the file to change (at parse, as
        // found under the host root; against the host, as the host names it).
        assert!(
            err.contains("config file ") && err.contains("etc/nspawn-lifecycle/config.json: "),
            "{devices}: {err} names no config file"
        );
        assert_eq!(before, snapshot(root, &[]), "{devices} changed the tree");
    }
}

/// What a hostile or broken host shows never becomes a bind outside `/dev` or a line of its
/// own (a name leaving `/dev`, a character device, a link, loop devices and their partitions),
/// and a host with ten thousand partitions still starts.
#[test]
fn privileged_hostile_block_names_and_a_linked_infiniband_dir_are_skipped() {
    let mut text = String::from(fixture::example("cpu-only").unwrap());
    text.push_str(
        "file /proc/partitions <<END\n\
         major minor  #blocks  name\n\
         \n\
         \x20104        0       1000 cciss/c0d0\n\
         \x20  8        0       1000 sda\n\
         \x20  8        1       1000 ../../etc/passwd\n\
         \x20  8       16       1000 sdb\n\
         \x20  8       32       1000 sdc\n\
         garbage line\n\
         \x20  7        0       1000 loop0\n\
         \x20  7        1       1000 loop0p1\n\
         END\n\
         blk /dev/cciss/c0d0 104:0\n\
         blk /dev/sda 8:0\n\
         chr /dev/sdb 8:16\n\
         link /dev/sdc sda\n\
         blk /dev/loop0 7:0\n\
         blk /dev/loop0p1 7:1\n\
         dir /elsewhere/ib\n\
         chr /elsewhere/ib/uverbs0 231:192\n\
         link /dev/infiniband ../elsewhere/ib\n",
    );
    let dir = host_from(&text);
    let root = dir.path();
    let (code, err) = pre_start(root);
    assert_eq!(code, 0, "{err}");
    let b = binds(root);
    let devs: Vec<&String> = b.iter().filter(|l| l.contains("/dev/")).collect();
    assert_eq!(
        devs,
        ["Bind=/dev/cciss/c0d0", "Bind=/dev/sda"],
        "only real disks at their /dev path: {b:#?}"
    );
    assert!(!err.contains("panicked"), "{err}");

    let mut many = String::from(fixture::example("cpu-only").unwrap());
    many.push_str("blockdev nvme0n1 259:0\n");
    for p in 1..=10_000u32 {
        many.push_str(&format!("blockdev nvme0n1p{p} 259:{p}\n"));
    }
    let dir = host_from(&many);
    let root = dir.path();
    let (code, err) = pre_start(root);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        binds(root)
            .iter()
            .filter(|l| l.starts_with("Bind=/dev/nvme0n1"))
            .count(),
        10_001
    );
}

/// With a second machine on the host a machine gets only the disks its config names (by a
/// stable name too); a disk named for two machines is refused naming both; `extra` naming a
/// node a category binds already is one bind.
#[test]
fn privileged_two_machines_get_only_the_disks_named_for_them() {
    let dir = gb300();
    let root = dir.path();
    std::fs::create_dir_all(root.join("dev/disk/by-id")).unwrap();
    std::os::unix::fs::symlink("../../nvme1n1", root.join("dev/disk/by-id/nvme-data")).unwrap();
    // Alone on the host, kube1 gets the free disk.
    let (code, err) = pre_start(root);
    assert_eq!(code, 0, "{err}");
    assert!(binds(root).contains(&"Bind=/dev/nvme1n1".to_owned()));
    // A second machine installed: no disk without a list, and pre-start says why.
    let kube2 = root.join("etc/systemd/system/systemd-nspawn@kube2.service.d");
    std::fs::create_dir_all(&kube2).unwrap();
    std::fs::write(kube2.join("50-nspawn-lifecycle.conf"), "x").unwrap();
    let (code, err) = pre_start(root);
    assert_eq!(code, 0, "{err}");
    assert!(
        !binds(root).iter().any(|l| l.contains("nvme")),
        "{:#?}",
        binds(root)
    );
    assert!(
        err.contains("1 free disks not bound: several machines share this host"),
        "{err}"
    );
    // Named by its stable name: bound at its own path.
    config(
        root,
        r#"{"machines": {"kube1": {"devices": {"disks": ["/dev/disk/by-id/nvme-data"]}}}}"#,
    );
    let (code, err) = pre_start(root);
    assert_eq!(code, 0, "{err}");
    assert!(
        binds(root).contains(&"Bind=/dev/nvme1n1".to_owned()),
        "{err}"
    );
    // A named disk the host does not have now (a pulled drive): the machine starts without it.
    config(
        root,
        r#"{"machines": {"kube1": {"devices": {"disks": ["/dev/nvme1n1", "/dev/disk/by-id/gone"]}}}}"#,
    );
    let (code, err) = pre_start(root);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains(
            "machines.kube1.devices.disks[1]: \"/dev/disk/by-id/gone\" is not on the host now"
        ),
        "{err}"
    );
    assert!(
        binds(root).contains(&"Bind=/dev/nvme1n1".to_owned()),
        "{err}"
    );
    // Named for both: refused, naming both machines and how each named it.
    config(
        root,
        r#"{"machines": {"kube1": {"devices": {"disks": ["/dev/disk/by-id/nvme-data"]}},
                         "kube2": {"devices": {"disks": ["/dev/nvme1n1"]}}}}"#,
    );
    let before = snapshot(root, &[]);
    let (code, err) = pre_start(root);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains(
            "disk /dev/nvme1n1 is given to both machines kube1 (machines.kube1.devices.disks[0]: \"/dev/disk/by-id/nvme-data\") and kube2 (machines.kube2.devices.disks[0]: \"/dev/nvme1n1\")"
        ),
        "{err}"
    );
    assert_eq!(before, snapshot(root, &[]));
    // kvm named again in extra: one bind.
    config(
        root,
        r#"{"machines": {"kube1": {"devices": {"block": false, "extra": ["/dev/kvm"]}}}}"#,
    );
    let (code, err) = pre_start(root);
    assert_eq!(code, 0, "{err}");
    let b = binds(root);
    assert_eq!(
        b.iter().filter(|l| l.contains("/dev/kvm")).count(),
        1,
        "{b:#?}"
    );
}

/// What root in one machine leaves in a host directory bound into every machine never stops
/// another machine's start: a flood of files named like InfiniBand ports, a file, a link, an
/// odd name and another driver's node among the MIG capabilities and IMEX channels.
#[test]
fn privileged_junk_in_bound_directories_never_refuses_the_host() {
    let dir = gb300();
    let root = dir.path();
    let (code, err) = pre_start(root);
    assert_eq!(code, 0, "{err}");
    let clean = binds(root);
    for i in 0..16_385 {
        std::fs::write(root.join(format!("dev/infiniband/uverbs{}", 100 + i)), "").unwrap();
    }
    std::fs::write(root.join("dev/nvidia-caps/stray"), "x").unwrap();
    std::fs::write(root.join("dev/nvidia-caps/nvidia-cap\nBind=x"), "").unwrap();
    std::os::unix::fs::symlink("/etc/shadow", root.join("dev/nvidia-caps/nvidia-cap99")).unwrap();
    mknod(
        root,
        "dev/nvidia-caps-imex-channels/channel77",
        nix::sys::stat::SFlag::S_IFCHR,
        1,
        3,
    );
    std::fs::write(root.join("dev/nvidia-caps-imex-channels/channel\nx"), "").unwrap();
    let (code, err) = pre_start(root);
    assert_eq!(code, 0, "{err}");
    assert_eq!(binds(root), clean, "the junk changed what is bound");
    for says in [
        "/dev/infiniband: skipping 16385 entries that are not character devices",
        "/dev/nvidia-caps: skipping 3 entries",
        "/dev/nvidia-caps-imex-channels: skipping 1 entries",
        "skipping 1 nodes in the NVIDIA capability and IMEX channel directories whose major is no NVIDIA driver's",
    ] {
        assert!(err.contains(says), "no {says:?} in {err}");
    }
    // A share machine, whose caps are bound one by one, starts too.
    config(root, r#"{"machines": {"kube1": {"gpus": [0]}}}"#);
    let (code, err) = pre_start(root);
    assert_eq!(code, 0, "{err}");
}

/// The machine's bpf filesystem is mounted where pre-start makes its directory: a link planted
/// there, or a directory another user made, would decide where a mount goes. Each is refused,
/// naming it, and nothing is made through it.
#[test]
fn privileged_a_planted_bpffs_directory_is_refused() {
    for plant in ["link", "other-user", "group-writable"] {
        let dir = gb300();
        let root = dir.path();
        let ours = root.join("run/nspawn-lifecycle");
        std::fs::create_dir_all(&ours).unwrap();
        std::fs::create_dir_all(root.join("elsewhere")).unwrap();
        let at = ours.join("bpffs");
        let says = match plant {
            "link" => {
                std::os::unix::fs::symlink("../../elsewhere", &at).unwrap();
                "is a symbolic link, not a directory of ours"
            }
            "other-user" => {
                std::fs::create_dir(&at).unwrap();
                nix::unistd::chown(&at, Some(1000.into()), None).unwrap();
                "is owned by uid 1000"
            }
            _ => {
                std::fs::create_dir(&at).unwrap();
                std::fs::set_permissions(&at, std::os::unix::fs::PermissionsExt::from_mode(0o775))
                    .unwrap();
                "others than its owner can write to it"
            }
        };
        let (code, err) = pre_start(root);
        assert_eq!(code, 1, "{plant}: {err}");
        assert!(err.contains(says), "{plant}: {err} should say {says}");
        assert_eq!(
            std::fs::read_dir(root.join("elsewhere")).unwrap().count(),
            0,
            "{plant}: something was made through it"
        );
    }
}
