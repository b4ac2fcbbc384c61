use super::*;
use crate::error::exit_code;

fn name(s: &str) -> MachineName {
    s.parse().unwrap()
}

/// The documented settings are exactly the keys the file takes, each with the default the
/// page states: a machine with every key set to its documented default is the machine with
/// none set.
#[test]
fn the_documented_settings_are_the_keys_and_defaults() {
    let err = Config::parse(br#"{"defaults": {"noSuchKey": 1}}"#).unwrap_err();
    let said = format!("{err:#}");
    let expected: Vec<&str> = said
        .split("expected one of ")
        .nth(1)
        .unwrap_or_else(|| panic!("{said}"))
        .split(", ")
        .map(|k| k.trim_matches(|c: char| c == '`' || !c.is_ascii_alphanumeric()))
        .collect();
    let documented: Vec<&str> = SETTINGS.iter().map(|d| d.key).collect();
    assert_eq!(documented, expected, "{said}");
    let all: Vec<String> = SETTINGS
        .iter()
        .map(|d| {
            let v = d.default.replace("<machine>", "kube1");
            format!("{:?}: {v}", d.key)
        })
        .collect();
    let text = format!("{{\"machines\": {{\"kube1\": {{{}}}}}}}", all.join(", "));
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("var/lib/machines/kube1")).unwrap();
    let host = HostRoot::new(dir.path());
    let set = Config::parse(text.as_bytes())
        .unwrap_or_else(|e| panic!("{text}: {e:#}"))
        .machine(&host, &name("kube1"))
        .unwrap();
    let unset = Config::parse(b"{}")
        .unwrap()
        .machine(&host, &name("kube1"))
        .unwrap();
    assert_eq!(set, unset, "{text}");
}

#[test]
fn no_file_means_defaults() {
    let dir = tempfile::tempdir().unwrap();
    let host = HostRoot::new(dir.path());
    let cfg = Config::load(&host, None).unwrap();
    let mc = cfg.machine(&host, &name("kube1")).unwrap();
    assert_eq!(mc.directory, "/var/lib/machines/kube1");
    assert_eq!(mc.kubelet_unit, "kubelet.service");
    assert_eq!(mc.cdi_dir, "/var/run/cdi");
    assert_eq!(mc.cdi_kind, "nvidia.com/gpu");
    assert!(mc.mounts.is_empty());
    assert_eq!(cfg.helper_path(), DEFAULT_HELPER_PATH);
    assert_eq!(mc.import_max_images, 20);
    assert_eq!(mc.import_budget, Duration::from_secs(600));
}

/// Host mode reads its own `host` section, never the machines' `defaults`, and
/// refuses a machine-only key at load time, naming it.
#[test]
fn host_mode_has_a_section_of_its_own() {
    let cfg = Config::parse(
        br#"{"defaults": {"kubeletUnit": "k3s.service", "gpus": "none"},
             "host": {"stagedImagesDir": "/srv/images", "jobTimeoutSeconds": 7}}"#,
    )
    .unwrap();
    let hc = cfg.host().unwrap();
    assert_eq!(hc.kubelet_unit, "kubelet.service");
    assert_eq!(hc.staged_images_dir, "/srv/images");
    assert_eq!(hc.cdi_dir, "/var/run/cdi");
    assert_eq!(hc.job_timeout, Duration::from_secs(7));
    assert_eq!(hc.gpus, Gpus::All);
    assert_eq!(
        Config::default().host().unwrap().staged_images_dir,
        "/var/lib/nspawn-lifecycle/images"
    );
    for key in [
        r#""gpus": "none""#,
        r#""directory": "/x""#,
        r#""mounts": []"#,
    ] {
        let text = format!(r#"{{"host": {{{key}}}}}"#);
        let err = Config::parse(text.as_bytes()).unwrap_err();
        assert_eq!(exit_code(&err), 2, "{key}");
        let name = key.split('"').nth(1).unwrap();
        assert!(format!("{err:#}").contains(&format!("host.{name}: a machine setting")));
    }
    let err = Config::parse(br#"{"host": {"cdiDir": "relative"}}"#).unwrap_err();
    assert!(format!("{err:#}").contains("host.cdiDir"), "{err:#}");
}

/// The import bounds: defaults keep a start inside the drop-in's `TimeoutStartSec=30min`
/// (lock, boot, six service jobs and the whole import budget), and both keys override.
#[test]
fn import_bounds_default_inside_the_start_timeout_and_override() {
    let dir = tempfile::tempdir().unwrap();
    let host = HostRoot::new(dir.path());
    let mc = Config::default().machine(&host, &name("kube1")).unwrap();
    let worst = mc.lock_timeout + mc.boot_timeout + 6 * mc.job_timeout + mc.import_budget;
    assert!(worst <= Duration::from_secs(25 * 60), "{worst:?}");
    let cfg = Config::parse(
        br#"{"defaults": {"importMaxImages": 3},
             "machines": {"kube1": {"importBudgetSeconds": 90, "importMaxImages": 0}}}"#,
    )
    .unwrap();
    let mc = cfg.machine(&host, &name("kube1")).unwrap();
    assert_eq!((mc.import_max_images, mc.import_budget.as_secs()), (0, 90));
    let mc = cfg.machine(&host, &name("kube2")).unwrap();
    assert_eq!((mc.import_max_images, mc.import_budget.as_secs()), (3, 600));
}

#[test]
fn drop_capabilities_are_checked_and_machines_override_defaults() {
    let dir = tempfile::tempdir().unwrap();
    let host = HostRoot::new(dir.path());
    let cfg = Config::parse(
        br#"{"defaults": {"dropCapabilities": ["CAP_SYS_MODULE"]},
             "machines": {"k2": {"dropCapabilities": []}}}"#,
    )
    .unwrap();
    assert_eq!(
        cfg.machine(&host, &name("kube1"))
            .unwrap()
            .drop_capabilities,
        ["CAP_SYS_MODULE"]
    );
    assert!(
        cfg.machine(&host, &name("k2"))
            .unwrap()
            .drop_capabilities
            .is_empty()
    );
    assert!(
        Config::default()
            .machine(&host, &name("kube1"))
            .unwrap()
            .drop_capabilities
            .is_empty()
    );
    for (bad, culprit) in [
        (
            r#"{"defaults": {"dropCapabilities": ["CAP_SYS_MODULE", "cap_bpf"]}}"#,
            "defaults.dropCapabilities[1]: \"cap_bpf\" is not a Linux capability name",
        ),
        (
            r#"{"machines": {"k": {"dropCapabilities": ["CAP_BPF", "CAP_BPF"]}}}"#,
            "machines.k.dropCapabilities[1]: \"CAP_BPF\" is listed twice",
        ),
        (
            r#"{"defaults": {"dropCapabilities": ["CAP_BPF\nPrivateUsers=pick"]}}"#,
            "CAP_BPF\\nPrivateUsers=pick",
        ),
    ] {
        let err = Config::parse(bad.as_bytes()).unwrap_err();
        assert_eq!(exit_code(&err), 2, "{bad}");
        assert!(format!("{err:#}").contains(culprit), "{bad}: {err:#}");
    }
}

/// `gpus` is "all" by default, "none", or a list of UUIDs, bus ids and indices;
/// anything else, an empty list or an entry twice is exit 2 naming the key.
#[test]
fn gpus_setting_parses_and_bad_values_name_their_key() {
    let dir = tempfile::tempdir().unwrap();
    let host = HostRoot::new(dir.path());
    let cfg = Config::parse(
        br#"{"defaults": {"gpus": "none"},
             "machines": {"kube1": {"gpus": ["GPU-0D1C5E2A-7b41-4c6f-9e83-5a2f1b7c9d01",
                                               "00000000:2A:00.0", 3], "require": true},
                          "kube2": {"gpus": "all"}}}"#,
    )
    .unwrap();
    let mc = cfg.machine(&host, &name("kube1")).unwrap();
    assert_eq!(
        mc.gpus,
        Gpus::List(vec![
            GpuSelector::Uuid("GPU-0d1c5e2a-7b41-4c6f-9e83-5a2f1b7c9d01".into()),
            GpuSelector::BusId("0000:2a:00.0".into()),
            GpuSelector::Index(3),
        ])
    );
    assert!(mc.require);
    assert_eq!(cfg.machine(&host, &name("kube2")).unwrap().gpus, Gpus::All);
    assert_eq!(cfg.machine(&host, &name("kube3")).unwrap().gpus, Gpus::None);
    assert!(!cfg.machine(&host, &name("kube3")).unwrap().require);
    let d = Config::default().machine(&host, &name("kube1")).unwrap();
    assert_eq!((d.gpus, d.require), (Gpus::All, false));
    for (bad, needle) in [
        (
            r#"{"defaults": {"gpus": "some"}}"#,
            "defaults.gpus: \"some\" is neither",
        ),
        (
            r#"{"machines": {"k": {"gpus": []}}}"#,
            "machines.k.gpus: an empty list",
        ),
        (
            r#"{"machines": {"k": {"gpus": ["GPU-1234"]}}}"#,
            "machines.k.gpus[0]: \"GPU-1234\" is neither a GPU UUID",
        ),
        (
            r#"{"machines": {"k": {"gpus": ["0000:06:00.0", "06:00.0"]}}}"#,
            "machines.k.gpus[1]: 0000:06:00.0 is listed twice",
        ),
        (
            r#"{"machines": {"k": {"gpus": [-1]}}}"#,
            "machines.k.gpus[0]: -1 is not a GPU index",
        ),
        (
            r#"{"machines": {"k": {"gpus": true}}}"#,
            "machines.k.gpus: true is neither",
        ),
        (
            r#"{"machines": {"k": {"require": "yes"}}}"#,
            "expected a boolean",
        ),
    ] {
        let err = Config::parse(bad.as_bytes()).unwrap_err();
        assert_eq!(exit_code(&err), 2, "{bad}");
        assert!(format!("{err:#}").contains(needle), "{bad}: {err:#}");
    }
}

/// Two machines' lists naming the same GPU are exit 2 naming both machines;
/// `all` shares explicitly and overlaps nothing.
#[test]
fn overlapping_gpu_lists_name_both_machines() {
    let err = Config::parse(
        br#"{"machines": {"kube1": {"gpus": ["GPU-0d1c5e2a-7b41-4c6f-9e83-5a2f1b7c9d01"]},
                          "kube2": {"gpus": ["GPU-0D1C5E2A-7B41-4C6F-9E83-5A2F1B7C9D01"]}}}"#,
    )
    .unwrap_err();
    assert_eq!(exit_code(&err), 2);
    let msg = format!("{err:#}");
    assert!(
        msg.contains("GPU GPU-0d1c5e2a-7b41-4c6f-9e83-5a2f1b7c9d01 is assigned to both machines kube1 and kube2"),
        "{msg}"
    );
    // A list in `defaults` is every machine's: two machines inherit it, they overlap.
    let err = Config::parse(br#"{"defaults": {"gpus": [0]}, "machines": {"a": {}, "b": {}}}"#)
        .unwrap_err();
    assert!(
        format!("{err:#}").contains("both machines a and b"),
        "{err:#}"
    );
    // A machine the config does not name gets the defaults, and is compared too.
    let cfg = Config::parse(br#"{"defaults": {"gpus": [0]}, "machines": {"a": {}}}"#).unwrap();
    let lists = cfg.gpu_assignments(&name("z")).unwrap();
    assert!(check_lists_disjoint(&lists, |_, s| Some(s.clone())).is_err());
    Config::parse(
        br#"{"machines": {"a": {"gpus": [0, 1]}, "b": {"gpus": [2]}, "c": {"gpus": "all"}}}"#,
    )
    .unwrap();
}

/// serde reads an array in place of a struct by position, past the unknown-key check: every
/// set of keys must be a JSON object, and the error names where it was not.
#[test]
fn a_config_that_is_not_an_object_where_keys_belong_is_refused_naming_the_place() {
    let cases = [
        (
            r#"["/opt/evil/helper"]"#,
            "the top level: want a JSON object, found an array",
        ),
        ("[]", "the top level: want a JSON object, found an array"),
        ("7", "the top level: want a JSON object, found a number"),
        (
            r#"{"defaults": [null, null, null, null, null, null, null, null, null, null, null, null, null, null, null, null, null, "none"]}"#,
            "defaults: want a JSON object, found an array",
        ),
        (
            r#"{"host": []}"#,
            "host: want a JSON object, found an array",
        ),
        (
            r#"{"machines": [{}]}"#,
            "machines: want a JSON object, found an array",
        ),
        (
            r#"{"machines": {"kube1": ["/srv/kube1"]}}"#,
            "machines.kube1: want a JSON object, found an array",
        ),
        (
            r#"{"machines": {"kube1": {"mounts": [["/data"]]}}}"#,
            "machines.kube1.mounts[0]: want a JSON object, found an array",
        ),
    ];
    for (text, want) in cases {
        let err = Config::parse(text.as_bytes()).unwrap_err();
        assert_eq!(exit_code(&err), 2, "{text}");
        assert_eq!(format!("{err:#}"), want, "{text}");
    }
}

/// Only a config file that is not there at all means the defaults.
#[test]
fn a_dangling_or_unreadable_default_config_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let host = HostRoot::new(dir.path());
    std::fs::create_dir_all(dir.path().join("etc/nspawn-lifecycle")).unwrap();
    assert!(Config::load(&host, None).is_ok(), "no file: defaults");
    let file = dir.path().join(DEFAULT_PATH.trim_start_matches('/'));
    std::os::unix::fs::symlink("/etc/nspawn-lifecycle/gone.json", &file).unwrap();
    let err = Config::load(&host, None).unwrap_err();
    assert_eq!(exit_code(&err), 2);
    let msg = format!("{err:#}");
    assert!(
        msg.contains("config.json is a symbolic link to /etc/nspawn-lifecycle/gone.json"),
        "{msg}"
    );
    std::fs::remove_file(&file).unwrap();
    std::fs::create_dir(&file).unwrap();
    let err = Config::load(&host, None).unwrap_err();
    assert_eq!(exit_code(&err), 2);
    assert!(format!("{err:#}").contains("config.json"), "{err:#}");
}

#[test]
fn missing_explicit_file_is_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    let host = HostRoot::new(dir.path());
    let err = Config::load(&host, Some(&dir.path().join("nope.json"))).unwrap_err();
    assert_eq!(exit_code(&err), 2);
    assert!(format!("{err:#}").contains("nope.json"));
}

#[test]
fn machine_overrides_defaults_and_mounts_are_checked_on_the_host() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("data/models")).unwrap();
    let host = HostRoot::new(dir.path());
    let cfg = Config::parse(
        br#"{"defaults": {"kubeletUnit": "k.service"},
             "machines": {"kube1": {"directory": "/srv/kube1",
               "mounts": [{"source": "/data/models", "readOnly": false},
                          {"source": "/data/models", "target": "/models"}]}}}"#,
    )
    .unwrap();
    let mc = cfg.machine(&host, &name("kube1")).unwrap();
    assert_eq!(mc.directory, "/srv/kube1");
    assert_eq!(mc.kubelet_unit, "k.service");
    assert_eq!(
        mc.mounts,
        vec![
            ExtraMount {
                source: "/data/models".parse().unwrap(),
                target: "/data/models".parse().unwrap(),
                read_only: false
            },
            ExtraMount {
                source: "/data/models".parse().unwrap(),
                target: "/models".parse().unwrap(),
                read_only: true
            },
        ]
    );
    assert_eq!(
        cfg.machine(&host, &name("other")).unwrap().kubelet_unit,
        "k.service"
    );
}

#[test]
fn bad_values_name_their_key() {
    let cases: &[(&str, &str)] = &[
        (r#"{"bogus": 1}"#, "bogus"),
        (r#"{"machines": {"kube1": {"mount": []}}}"#, "mount"),
        (r#"{"machines": {"../etc": {}}}"#, "machines.../etc"),
        (
            r#"{"machines": {"k": {"mounts": [{"source": "data"}]}}}"#,
            "machines.k.mounts[0].source",
        ),
        (
            r#"{"machines": {"k": {"mounts": [{"source": "/d", "target": "/../etc"}]}}}"#,
            "machines.k.mounts[0].target",
        ),
        (
            r#"{"machines": {"k": {"mounts": [{"source": "/d", "target": "/a\nPrivateUsers=pick"}]}}}"#,
            "machines.k.mounts[0].target: \"/a\\nPrivateUsers=pick\" contains the control character",
        ),
        (
            r#"{"machines": {"k": {"mounts": [{"source": "/d\u007f"}]}}}"#,
            "machines.k.mounts[0].source: \"/d\\u{7f}\"",
        ),
        (
            r#"{"machines": {"k": {"mounts": [{"source": "/d "}]}}}"#,
            "machines.k.mounts[0].source: \"/d \" ends in a space",
        ),
        (
            r#"{"defaults": {"kubeletUnit": "kube\nlet.service"}}"#,
            "defaults.kubeletUnit: \"kube\\nlet.service\" is not a unit name",
        ),
        (
            r#"{"defaults": {"containerdUnit": "containerd@.service"}}"#,
            "defaults.containerdUnit",
        ),
        (
            r#"{"helperPath": "/opt/my helper"}"#,
            "helperPath: \"/opt/my helper\" contains ' ', which an Exec line",
        ),
        (
            r#"{"defaults": {"mounts": [{"source": "/d", "target": "/"}]}}"#,
            "defaults.mounts[0].target",
        ),
        (
            r#"{"defaults": {"kubeletUnit": "kubelet"}}"#,
            "defaults.kubeletUnit",
        ),
        (
            r#"{"defaults": {"cdiKind": "nvidia.com/g.pu"}}"#,
            "defaults.cdiKind",
        ),
        (
            r#"{"defaults": {"jobTimeoutSeconds": 0}}"#,
            "jobTimeoutSeconds",
        ),
        (
            r#"{"machines": {"k": {"importBudgetSeconds": 0}}}"#,
            "machines.k.importBudgetSeconds",
        ),
        (
            r#"{"defaults": {"cdiDir": "var/run/cdi"}}"#,
            "defaults.cdiDir",
        ),
        (r#"{"machines":"#, "EOF"),
        ("[1]", "want a JSON object, found an array"),
        ("\u{0}\u{ff}", "expected value"),
    ];
    for (text, needle) in cases {
        let err = Config::parse(text.as_bytes()).unwrap_err();
        assert_eq!(exit_code(&err), 2, "{text}");
        let msg = format!("{err:#}");
        assert!(msg.contains(needle), "{text}: {msg} should name {needle}");
    }
}

/// What the `.nspawn` renderer escapes is accepted (it used to be refused).
#[test]
fn paths_with_spaces_colons_backslashes_and_non_ascii_are_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let odd = "/data/a b:c\\d ü";
    std::fs::create_dir_all(dir.path().join(&odd[1..])).unwrap();
    let host = HostRoot::new(dir.path());
    let json = serde_json::json!({"machines": {"kube1": {
        "kubeletUnit": "kube:let.service",
        "containerdUnit": "contain\\x2derd.service",
        "mounts": [{"source": odd, "target": "/mnt/日本:x"}]}}});
    let cfg = Config::parse(json.to_string().as_bytes()).unwrap();
    let mc = cfg.machine(&host, &name("kube1")).unwrap();
    assert_eq!(mc.mounts[0].source, odd);
    assert_eq!(mc.mounts[0].target, "/mnt/日本:x");
    assert_eq!(mc.kubelet_unit, "kube:let.service");
    assert_eq!(mc.containerd_unit, "contain\\x2derd.service");
}

/// Found by tests/oversized.rs: a 1 GiB config file was read whole (1 GB RSS), and a FIFO
/// in its place blocked the helper forever.
/// The checked settings are types of their own: parsed once, then carried as values that a
/// consumer cannot confuse with a free string.
#[test]
fn cdi_kind_and_ctr_namespace_are_types_that_check_their_value() {
    let kind: CdiKind = "example.com/device_1".parse().unwrap();
    assert_eq!(kind, "example.com/device_1");
    assert_eq!(kind.as_str(), "example.com/device_1");
    for bad in [
        "",
        "nvidia.com",
        "nvidia.com/",
        "/gpu",
        "1vendor/gpu",
        "v/g.pu",
        "v-/gpu",
    ] {
        assert!(bad.parse::<CdiKind>().is_err(), "{bad}");
    }
    let ns: CtrNamespace = "k8s.io".parse().unwrap();
    assert_eq!(ns.to_string(), "k8s.io");
    for bad in ["", "k8s io", "ns/1", "n\\s"] {
        assert!(bad.parse::<CtrNamespace>().is_err(), "{bad}");
    }
}

/// Every message a checked setting gives, byte for byte (the typed parsing must not change
/// what an operator reads), each exit 2.
#[test]
fn settings_errors_are_pinned_byte_for_byte() {
    let cases: &[(&str, &str)] = &[
        (
            r#"{"defaults": {"lockTimeoutSeconds": 0}}"#,
            "defaults.lockTimeoutSeconds: must be at least 1",
        ),
        (
            r#"{"machines": {"k": {"bootTimeoutSeconds": 0}}}"#,
            "machines.k.bootTimeoutSeconds: must be at least 1",
        ),
        (
            r#"{"defaults": {"importTimeoutSeconds": 0}}"#,
            "defaults.importTimeoutSeconds: must be at least 1",
        ),
        (
            r#"{"defaults": {"directory": "machines"}}"#,
            "defaults.directory: \"machines\" is not an absolute path",
        ),
        (
            r#"{"defaults": {"mounts": [{"source": "/d", "target": "/"}]}}"#,
            "defaults.mounts[0].target: \"/\" would cover the whole machine",
        ),
        (
            r#"{"defaults": {"mounts": [{"source": "/d"}, {"source": "/e", "target": "/d"}]}}"#,
            "defaults.mounts[1].target: \"/d\" is bound twice",
        ),
        (
            r#"{"defaults": {"mounts": [{"source": "/d", "target": "/run/nvidia/driver"}]}}"#,
            "defaults.mounts[0].target: \"/run/nvidia/driver\" would cover the helper's own /run/nvidia/driver in the machine (the driver root, the unit gate, the CDI spec, device nodes); mount it elsewhere",
        ),
        (
            r#"{"defaults": {"mounts": [{"source": "/d", "target": "/run"}]}}"#,
            "defaults.mounts[0].target: \"/run\" would cover the helper's own /run/nvidia/driver in the machine (the driver root, the unit gate, the CDI spec, device nodes); mount it elsewhere",
        ),
        (
            r#"{"defaults": {"mounts": [{"source": "/d", "target": "/run/nspawn-lifecycle/released"}]}}"#,
            "defaults.mounts[0].target: \"/run/nspawn-lifecycle/released\" would cover the helper's own /run/nspawn-lifecycle in the machine (the driver root, the unit gate, the CDI spec, device nodes); mount it elsewhere",
        ),
        (
            r#"{"machines": {"k": {"mounts": [{"source": "/d", "target": "/sys/fs/bpf"}]}}}"#,
            "machines.k.mounts[0].target: \"/sys/fs/bpf\" would cover the helper's own /sys/fs/bpf in the machine (the driver root, the unit gate, the CDI spec, device nodes); mount it elsewhere",
        ),
        (
            r#"{"defaults": {"mounts": [{"source": "/d", "target": "/dev/nvidia-caps/x"}]}}"#,
            "defaults.mounts[0].target: \"/dev/nvidia-caps/x\" would cover the helper's own /dev/nvidia-caps in the machine (the driver root, the unit gate, the CDI spec, device nodes); mount it elsewhere",
        ),
        (
            r#"{"defaults": {"mounts": [{"source": "/d", "target": "/dev/nvidia0"}]}}"#,
            "defaults.mounts[0].target: \"/dev/nvidia0\" would cover the helper's own /dev/nvidia0 in the machine (the driver root, the unit gate, the CDI spec, device nodes); mount it elsewhere",
        ),
        (
            r#"{"defaults": {"mounts": [{"source": "/d", "target": "/var"}]}}"#,
            "defaults.mounts[0].target: \"/var\" would cover the helper's own /var/run/cdi in the machine (the driver root, the unit gate, the CDI spec, device nodes); mount it elsewhere",
        ),
        (
            r#"{"defaults": {"cdiDir": "/etc/cdi", "mounts": [{"source": "/d", "target": "/etc/cdi"}]}}"#,
            "defaults.mounts[0].target: \"/etc/cdi\" would cover the helper's own /etc/cdi in the machine (the driver root, the unit gate, the CDI spec, device nodes); mount it elsewhere",
        ),
        (
            r#"{"defaults": {"mounts": [{"source": "/d", "target": "/run/systemd/system/kubelet.service.d"}]}}"#,
            "defaults.mounts[0].target: \"/run/systemd/system/kubelet.service.d\" would cover the helper's own /run/systemd/system in the machine (the driver root, the unit gate, the CDI spec, device nodes); mount it elsewhere",
        ),
        (
            r#"{"defaults": {"kubeletUnit": "kubelet"}}"#,
            "defaults.kubeletUnit: \"kubelet\" is not a unit name: it has no type suffix such as \".service\"",
        ),
        (
            r#"{"machines": {"k": {"containerdUnit": "a b.service"}}}"#,
            "machines.k.containerdUnit: \"a b.service\" is not a unit name: it contains ' '; only A-Z a-z 0-9 : - _ . \\ and one '@' are allowed",
        ),
        (
            r#"{"defaults": {"stagedImagesDir": "images"}}"#,
            "defaults.stagedImagesDir: \"images\" is not an absolute path",
        ),
        (
            r#"{"defaults": {"ctrPath": "ctr"}}"#,
            "defaults.ctrPath: \"ctr\" is not an absolute path",
        ),
        (
            r#"{"defaults": {"ctrNamespace": "k8s io"}}"#,
            "defaults.ctrNamespace: \"k8s io\" is not a containerd namespace",
        ),
        (
            r#"{"defaults": {"ctrNamespace": ""}}"#,
            "defaults.ctrNamespace: \"\" is not a containerd namespace",
        ),
        (
            r#"{"defaults": {"cdiKind": "nvidia.com/g.pu"}}"#,
            "defaults.cdiKind: \"nvidia.com/g.pu\" is not a CDI kind like \"nvidia.com/gpu\"",
        ),
        (
            r#"{"machines": {"k": {"cdiKind": "gpu\n"}}}"#,
            "machines.k.cdiKind: \"gpu\\n\" is not a CDI kind like \"nvidia.com/gpu\"",
        ),
        (
            r#"{"defaults": {"dropCapabilities": ["CAP_SYS_ADMIN", "CAP_SYS_ADMIN"]}}"#,
            "defaults.dropCapabilities[1]: \"CAP_SYS_ADMIN\" is listed twice",
        ),
    ];
    for (text, want) in cases {
        let err = Config::parse(text.as_bytes()).unwrap_err();
        assert_eq!(exit_code(&err), 2, "{text}");
        assert_eq!(format!("{err:#}"), *want, "{text}");
    }
}

#[test]
fn huge_or_endless_config_files_are_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    let host = HostRoot::new(dir.path());
    let huge = dir.path().join("huge.json");
    std::fs::File::create(&huge)
        .unwrap()
        .set_len(1 << 30)
        .unwrap();
    let fifo = dir.path().join("fifo.json");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    for (path, needle) in [
        (huge, "huge.json: larger than 1048576 bytes"),
        (fifo, "fifo.json: not a regular file"),
    ] {
        let err = Config::load(&host, Some(&path)).unwrap_err();
        assert_eq!(exit_code(&err), 2);
        assert!(format!("{err:#}").contains(needle), "{err:#}");
    }
}

#[test]
fn missing_mount_source_names_key_and_value() {
    let dir = tempfile::tempdir().unwrap();
    let host = HostRoot::new(dir.path());
    let cfg =
        Config::parse(br#"{"machines": {"kube1": {"mounts": [{"source": "/nope"}]}}}"#).unwrap();
    let err = cfg.machine(&host, &name("kube1")).unwrap_err();
    assert_eq!(exit_code(&err), 2);
    assert!(format!("{err:#}").contains("machines.kube1.mounts[0].source: \"/nope\""));
}

/// A key given twice is refused naming it (JSON keeps the last silently: `"gpus": "none"` then
/// `"gpus": "all"` would give the machine every GPU), and a value of the wrong type names its
/// key path and the value: exit 2 both.
#[test]
fn duplicate_keys_and_wrong_types_are_named_by_their_path() {
    let err = Config::parse(br#"{"machines":{"kube1":{"gpus":"none","gpus":"all"}}}"#).unwrap_err();
    assert_eq!(exit_code(&err), 2);
    assert!(
        format!("{err:#}").contains("machines.kube1.gpus: the key is given twice"),
        "{err:#}"
    );
    for (text, path, value) in [
        (
            r#"{"defaults":{"jobTimeoutSeconds":"120"}}"#,
            "defaults.jobTimeoutSeconds",
            "\"120\"",
        ),
        (
            r#"{"defaults":{"require":"yes"}}"#,
            "defaults.require",
            "\"yes\"",
        ),
        (
            r#"{"machines":{"kube1":{"mounts":[{"source":"/srv","readOnly":"false"}]}}}"#,
            "machines.kube1.mounts[0].readOnly",
            "\"false\"",
        ),
    ] {
        let err = Config::parse(text.as_bytes()).unwrap_err();
        let said = format!("{err:#}");
        assert_eq!(exit_code(&err), 2, "{said}");
        assert!(
            said.contains(&format!("{path}: invalid type")),
            "{text}: {said}"
        );
        assert!(said.contains(value), "{text}: {said}");
    }
}

/// An import budget the unit's start timeout cannot hold is refused naming both: the drop-in
/// says TimeoutStartSec=30min, and systemd would kill post-start mid-import.
#[test]
fn a_start_that_cannot_fit_the_units_timeout_is_refused_naming_both() {
    assert_eq!(START_TIMEOUT_TEXT, "30min");
    assert_eq!(START_TIMEOUT.as_secs(), 30 * 60);
    let err =
        Config::parse(br#"{"machines": {"kube1": {"importBudgetSeconds": 7200}}}"#).unwrap_err();
    let said = format!("{err:#}");
    assert_eq!(exit_code(&err), 2, "{said}");
    assert!(
        said.contains("machines.kube1: lockTimeoutSeconds (120) + bootTimeoutSeconds (60)")
            && said.contains("importBudgetSeconds (7200) is 7920 s")
            && said.contains("TimeoutStartSec=30min (1800 s)"),
        "{said}"
    );
    // The largest budget the defaults leave room for still loads.
    Config::parse(br#"{"defaults": {"importBudgetSeconds": 1080}}"#).unwrap();
    assert!(Config::parse(br#"{"defaults": {"importBudgetSeconds": 1081}}"#).is_err());
}

/// A value of the wrong type is named in JSON's terms (a whole number, a list, a JSON object),
/// never Rust's (`u64`, `sequence`, `struct DevicesSetting`).
#[test]
fn wrong_types_are_named_in_json_terms() {
    for (json, says) in [
        (
            r#"{"machines": {"kube1": {"bootTimeoutSeconds": -1}}}"#,
            "machines.kube1.bootTimeoutSeconds: invalid value: integer `-1`, expected a whole number of 0 or more",
        ),
        (
            r#"{"machines": {"kube1": {"mounts": {}}}}"#,
            "machines.kube1.mounts: invalid type: a JSON object, expected a list",
        ),
        (
            r#"{"machines": {"kube1": {"devices": "x"}}}"#,
            "machines.kube1.devices: invalid type: string \"x\", expected a JSON object",
        ),
        (
            r#"{"defaults": {"dropCapabilities": 1}}"#,
            "defaults.dropCapabilities: invalid type: integer `1`, expected a list",
        ),
    ] {
        let err = format!("{:#}", Config::parse(json.as_bytes()).unwrap_err());
        assert_eq!(err, says, "{json}");
    }
}

/// docs/configuration.md is the configuration file in full: every key of the settings table the
/// man page is rendered from, the top-level keys and each `devices` key are on it, and its
/// example is a configuration this build accepts.
#[test]
fn the_configuration_page_has_every_key_and_a_valid_example() {
    let page = include_str!("../../docs/configuration.md");
    let devices = SETTINGS
        .iter()
        .find(|s| s.key == "devices")
        .expect("the devices setting");
    let inner = devices
        .kind
        .split_once('{')
        .and_then(|(_, rest)| rest.split_once('}'))
        .expect("devices' kind lists its keys in braces")
        .0;
    let device_keys: Vec<&str> = inner
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty() && !["boolean", "array", "of", "paths"].contains(w))
        .collect();
    assert!(device_keys.contains(&"disks"), "{device_keys:?}");
    let keys = SETTINGS
        .iter()
        .map(|s| s.key)
        .chain(["helperPath", "defaults", "machines", "host"])
        .chain(device_keys);
    // Its table of every machine key is the settings table itself, row for row.
    let mut table = String::from("| key | type | default | meaning |\n|---|---|---|---|\n");
    for s in SETTINGS {
        table.push_str(&format!(
            "| `{}` | {} | `{}` | {} |\n",
            s.key,
            s.kind.replace('|', "\\|"),
            s.default,
            s.meaning.replace('|', "\\|")
        ));
    }
    assert!(
        page.contains(&table),
        "docs/configuration.md's table of keys is not the settings table; it should read:\n{table}"
    );
    let missing: Vec<&str> = keys.filter(|k| !page.contains(&format!("`{k}`"))).collect();
    assert!(
        missing.is_empty(),
        "docs/configuration.md lacks {missing:?}"
    );
    let example = page
        .split("```json\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("the page's JSON example");
    Config::parse(example.as_bytes()).unwrap();
}
