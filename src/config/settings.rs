//! Every key of the configuration file, documented: the source of `nspawn-lifecycle.json(5)` and
//! of the checks that its defaults are the real ones.

/// One setting of `defaults`, `machines.<name>` or `host`, documented: the
/// `nspawn-lifecycle.json(5)` page is rendered from [`SETTINGS`], and a test proves each key is
/// read with exactly the default written here.
pub struct SettingDoc {
    pub key: &'static str,
    pub kind: &'static str,
    /// The default as JSON (`directory`'s depends on the machine's name).
    pub default: &'static str,
    pub meaning: &'static str,
}

/// Every machine setting, in the order the page lists them.
pub const SETTINGS: &[SettingDoc] = &[
    SettingDoc {
        key: "directory",
        kind: "absolute path",
        default: "\"/var/lib/machines/<machine>\"",
        meaning: "The machine's rootfs on the host; must exist and be owned by root.",
    },
    SettingDoc {
        key: "mounts",
        kind: "array of {source, target, readOnly}",
        default: "[]",
        meaning: "Extra host paths bound into the machine: source (absolute, must exist on the host), target (absolute in the machine, default the source), readOnly (default true).",
    },
    SettingDoc {
        key: "kubeletUnit",
        kind: "unit name",
        default: "\"kubelet.service\"",
        meaning: "kubelet's unit in the machine: held by the unit gate until post-start has wired the driver.",
    },
    SettingDoc {
        key: "containerdUnit",
        kind: "unit name",
        default: "\"containerd.service\"",
        meaning: "containerd's unit in the machine.",
    },
    SettingDoc {
        key: "stagedImagesDir",
        kind: "absolute path in the machine",
        default: "\"/var/lib/nspawn-lifecycle/images\"",
        meaning: "Image tarballs post-start imports with ctr at every start (kept, so images \
                  survive a wiped containerd store; a failed import is moved to failed/).",
    },
    SettingDoc {
        key: "ctrPath",
        kind: "absolute path in the machine",
        default: "\"/usr/bin/ctr\"",
        meaning: "The ctr binary post-start imports images with.",
    },
    SettingDoc {
        key: "ctrNamespace",
        kind: "containerd namespace",
        default: "\"k8s.io\"",
        meaning: "The containerd namespace images are imported into.",
    },
    SettingDoc {
        key: "cdiDir",
        kind: "absolute path in the machine",
        default: "\"/var/run/cdi\"",
        meaning: "Where post-start writes the CDI spec.",
    },
    SettingDoc {
        key: "cdiKind",
        kind: "vendor/class",
        default: "\"nvidia.com/gpu\"",
        meaning: "The CDI kind of the spec's devices.",
    },
    SettingDoc {
        key: "lockTimeoutSeconds",
        kind: "seconds (1 or more)",
        default: "120",
        meaning: "How long a hook waits for the machine's lock (then exit 4).",
    },
    SettingDoc {
        key: "bootTimeoutSeconds",
        kind: "seconds (1 or more)",
        default: "60",
        meaning: "How long post-start waits for the machine's manager to be running.",
    },
    SettingDoc {
        key: "jobTimeoutSeconds",
        kind: "seconds (1 or more)",
        default: "90",
        meaning: "How long each systemd job (a stop, a start, a transient unit) may take.",
    },
    SettingDoc {
        key: "importTimeoutSeconds",
        kind: "seconds (1 or more)",
        default: "300",
        meaning: "How long one image import may take.",
    },
    SettingDoc {
        key: "importMaxImages",
        kind: "count (0 or more)",
        default: "20",
        meaning: "Most staged tarballs one post-start imports; the rest wait for the next start.",
    },
    SettingDoc {
        key: "importBudgetSeconds",
        kind: "seconds (1 or more)",
        default: "600",
        meaning: "How long all imports of one post-start may take together.",
    },
    SettingDoc {
        key: "dropCapabilities",
        kind: "array of capability names",
        default: "[]",
        meaning: "Capabilities the machine's bounding set loses (DropCapability= of the .nspawn file).",
    },
    SettingDoc {
        key: "gpus",
        kind: "\"all\", \"none\" or an array of GPU UUIDs, PCI bus ids or indices",
        default: "\"all\"",
        meaning: "Which of the host's NVIDIA GPUs the machine gets; two machines' lists may not name one GPU.",
    },
    SettingDoc {
        key: "require",
        kind: "boolean",
        default: "false",
        meaning: "A listed GPU missing on the host holds the start back (exit 3) instead of a start without it.",
    },
    SettingDoc {
        key: "containerdAtBoot",
        kind: "boolean",
        default: "true",
        meaning: "containerd starts with the machine's boot; false: it waits for post-start, as kubelet does.",
    },
    SettingDoc {
        key: "devices",
        kind: "object {kvm, network, infiniband, block, gpudirect: boolean; disks, extra: array of paths}",
        default: "{\"kvm\": true, \"network\": true, \"infiniband\": true, \"block\": true, \"gpudirect\": true, \"extra\": []}",
        meaning: "Host devices the machine gets beside its GPUs, found at every start: kvm (/dev/kvm), network (tun, vhost-net, vhost-vsock, macvtap/ipvtap taps), infiniband (/dev/infiniband whole and read-only, rdma_cm made when missing), block (disks and partitions the host does not use: never one mounted, swap, held by LVM/dm/md/bcache, a btrfs or ZFS member, or on such a disk; not loop, ram, zram, fd, sr), gpudirect (gdrdrv, nvidia-fs*); false switches one off. disks: this machine's disks by /dev name or stable /dev/disk/by-* name, resolved at every start; without it the host's only machine gets every free disk and a machine beside others none; a disk named for two machines, or one the host uses, is exit 2. extra: more character or block nodes under /dev, each bound and allowed; NVIDIA and DRM nodes are refused by device number. A machine's devices override the defaults' key by key.",
    },
];
