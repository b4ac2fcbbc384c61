//! The `mounts` key: extra host directories bound into a machine, and the targets they may not
//! take (the helper's own).

use super::{ExtraMount, MachineConfig, Mount, checked_path};
use crate::error::bad_input;
use crate::types::paths::{HostPath, MachinePath};
use anyhow::Result;

/// Where the driver root is bound in every machine (`model::layout::DRIVER_ROOT`, which a test
/// there ties to this one: the configuration sits below the model).
pub const DRIVER_ROOT: &str = "/run/nvidia/driver";

/// `mounts` checked: absolute paths, `target` filled in from `source`, no target `/` and none
/// twice.
pub(super) fn checked_mounts(key: &str, mounts: &[Mount]) -> Result<Vec<ExtraMount>> {
    let mut out = Vec::new();
    let mut targets = std::collections::BTreeSet::new();
    for (i, m) in mounts.iter().enumerate() {
        let source: HostPath = checked_path(&format!("{key}.mounts[{i}].source"), &m.source)?;
        let target: MachinePath = checked_path(
            &format!("{key}.mounts[{i}].target"),
            m.target.as_deref().unwrap_or(&m.source),
        )?;
        if target == "/" {
            return Err(bad_input(format!(
                "{key}.mounts[{i}].target: \"/\" would cover the whole machine"
            )));
        }
        if !targets.insert(target.clone()) {
            return Err(bad_input(format!(
                "{key}.mounts[{i}].target: \"{target}\" is bound twice"
            )));
        }
        out.push(ExtraMount {
            source,
            target,
            read_only: m.read_only,
        });
    }
    Ok(out)
}

/// Where the helper itself binds or writes in every machine: the driver root, its own directory
/// (the CDI hooks' binary, the gate's marker), the gate's drop-ins, the machine's bpffs, the
/// kernel modules, the NVIDIA, DRM, InfiniBand and other device nodes, and the CDI spec's
/// directory. A configured mount on one of them, above one or inside one would be rendered
/// after the helper's own bind and win.
fn own_targets(mc: &MachineConfig) -> Vec<String> {
    let mut out: Vec<String> = [
        DRIVER_ROOT,
        "/run/nspawn-lifecycle",
        "/run/systemd/system",
        "/sys/fs/bpf",
        "/lib/modules",
        "/dev/nvidia-caps",
        "/dev/nvidia-caps-imex-channels",
        "/dev/dri",
        "/dev/infiniband",
        "/dev/kvm",
        "/dev/net",
    ]
    .map(str::to_owned)
    .to_vec();
    out.push(mc.cdi_dir.to_string());
    out
}

/// No `mounts` target covers, equals or sits inside one of the helper's own targets (exit 2
/// naming the key and the target); nor is it a node of NVIDIA's under `/dev`.
pub(super) fn check_mount_targets(key: &str, mc: &MachineConfig) -> Result<()> {
    let own = own_targets(mc);
    for (i, m) in mc.mounts.iter().enumerate() {
        let t = m.target.as_str();
        let hit = own.iter().find(|o| {
            t == o.as_str()
                || o.strip_prefix(t).is_some_and(|r| r.starts_with('/'))
                || t.strip_prefix(o.as_str())
                    .is_some_and(|r| r.starts_with('/'))
        });
        let hit = hit.cloned().or_else(|| {
            t.strip_prefix("/dev/")
                .filter(|n| n.starts_with("nvidia"))
                .map(|_| t.to_owned())
        });
        if let Some(o) = hit {
            return Err(bad_input(format!(
                "{key}.mounts[{i}].target: \"{t}\" would cover the helper's own {o} in the \
                 machine (the driver root, the unit gate, the CDI spec, device nodes); mount it \
                 elsewhere"
            )));
        }
    }
    Ok(())
}
