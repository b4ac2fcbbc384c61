//! `cdi-spec <MACHINE>`: the spec a machine gets, in an operator's hands. On fixture hosts (root:
//! mknod), the printed spec is what the model gives post-start (byte for byte), the official CDI
//! library loads it strictly (its built-in schema, version and name rules), and NVIDIA's
//! `nvidia-ctk cdi list` (the Go library every engine uses) lists exactly the names `--list`
//! prints. A machine without GPUs gets nothing; an incomplete driver is exit 3, as pre-start.

#![allow(clippy::unwrap_used)]

mod common;

use common::installed_host;
use container_device_interface as cdi_lib;
use std::collections::BTreeSet;

fn stdout(host: &std::path::Path, args: &[&str], code: i32) -> String {
    String::from_utf8(common::stdout_of_exit(host, args, code)).unwrap()
}

#[test]
fn privileged_the_printed_spec_loads_and_lists_as_nvidia_ctk_lists_it() {
    for example in ["two-gpus", "eight-gpus"] {
        let h = installed_host(example, &["kube1"]);
        let spec = stdout(h.path(), &["cdi-spec", "kube1"], 0);
        let listed: BTreeSet<String> = stdout(h.path(), &["cdi-spec", "kube1", "--list"], 0)
            .lines()
            .map(str::to_owned)
            .collect();
        assert!(listed.contains("nvidia.com/gpu=all"), "{listed:?}");
        assert!(listed.contains("nvidia.com/gpu=0"), "{listed:?}");

        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("nvidia.com-gpu.json");
        std::fs::write(&file, &spec).unwrap();
        let loaded = cdi_lib::spec::read_spec(&file, 0)
            .unwrap_or_else(|e| panic!("{example}: the CDI library refuses it: {e:#}"));
        let names: BTreeSet<String> = loaded
            .devices
            .keys()
            .map(|n| format!("nvidia.com/gpu={n}"))
            .collect();
        assert_eq!(names, listed, "{example}: the CDI library's names");

        let out = std::process::Command::new(common::nvidia_tool("nvidia-ctk"))
            .args(["cdi", "list", "--spec-dir"])
            .arg(dir.path())
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let ctk: BTreeSet<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| !l.is_empty())
            .map(str::to_owned)
            .collect();
        assert_eq!(ctk, listed, "{example}: nvidia-ctk cdi list");
    }
}

#[test]
fn privileged_no_gpus_is_nothing_and_an_incomplete_driver_is_exit_3() {
    let cpu = installed_host("cpu-only", &["kube1"]);
    assert_eq!(stdout(cpu.path(), &["cdi-spec", "kube1"], 0), "");
    assert_eq!(stdout(cpu.path(), &["cdi-spec", "kube1", "--list"], 0), "");
    let broken = installed_host("version-mismatch", &["kube1"]);
    assert_eq!(stdout(broken.path(), &["cdi-spec", "kube1"], 3), "");
}
