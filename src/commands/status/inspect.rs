//! What `status` reads: the target's NVIDIA state through its root (the CDI spec, the driver
//! root, our links) with the wiring model's pending changes, and the last post-start run from
//! its unit's properties. Reads only.

use super::{MachineFacts, PostStartRun, SpecFacts};
use crate::apply::parts::{self, At};
use crate::config::MachineConfig;
use crate::discovery::parse::is_version;
use crate::fs::host::HostRoot;
use crate::fs::machine_root::{FileKind, Lookup, MachineRoot};
use crate::model::cdi;
use crate::model::layout::DRIVER_ROOT;
use crate::model::{self, Check, Desired, links};
use crate::systemd::ExecRun;
use anyhow::{Context as _, Result};

/// Largest CDI spec read.
pub(super) const MAX_SPEC_BYTES: usize = 16 << 20;
/// Most entries read from the driver root.
pub(super) const MAX_DRIVER_ROOT_ENTRIES: usize = 100_000;
/// The version in a driver library file name `libcuda.so.<version>`.
pub(super) fn libcuda_version(file_name: &str) -> Option<&str> {
    file_name
        .strip_prefix("libcuda.so.")
        .filter(|v| is_version(v))
}

pub(super) fn push_unique(v: &mut Vec<String>, s: &str) {
    if !v.iter().any(|x| x == s) {
        v.push(s.to_owned());
    }
}

/// Read the machine's NVIDIA state through its root (the CDI spec, the driver root, our links)
/// and what would change there to make it `desired` (every part's diff, as
/// [`parts::pending`]). `judged` false (the host's driver is incomplete: post-start refuses,
/// changing nothing) lists only the unit files' changes (`install`'s). Reads only.
pub fn inspect_machine(
    root: &MachineRoot,
    host: &HostRoot,
    mc: &MachineConfig,
    desired: &Desired,
    judged: bool,
) -> Result<MachineFacts> {
    let cdi_spec = inspect_spec(root, mc, desired.spec.bytes.as_deref())?;
    let mut dangling = Vec::new();
    let driver_root_versions = inspect_driver_root(root, &mut dangling)?;
    let link_versions = inspect_lib_links(root, &mut dangling)?;
    inspect_dev_char(root, &mut dangling)?;
    // Read once: the changes are judged from it, the gate and the bound helper quoted from it.
    let at = At {
        target: root,
        host,
        desired,
    };
    let seen = parts::observe(&at);
    let (gated, gate_released) = parts::gate::summary_of(&seen)?;
    let hook_binary = parts::helper::bound(&seen)?;
    let pending_changes = judged_changes(&seen, &at, judged);
    Ok(MachineFacts {
        cdi_spec,
        driver_root_versions,
        link_versions,
        dangling_links: dangling,
        gated,
        gate_released,
        driver_root_mismatch: pending_changes
            .iter()
            .find(|c| c.check == Check::DriverRoot)
            .map(|c| c.detail.clone()),
        hook_binary,
        pending_changes,
    })
}

/// The changes of `seen` ([`parts::Observation::diff`]); only the unit files' when the host's
/// driver is incomplete (`judged` false: post-start would refuse, changing nothing).
pub(super) fn judged_changes(
    seen: &parts::Observation,
    at: &At,
    judged: bool,
) -> Vec<model::Change> {
    if judged {
        seen.diff(at)
    } else {
        seen.diff_of::<parts::UnitFiles>(at)
    }
}

/// The machine's CDI spec: missing, invalid or valid, and whether it is what post-start would
/// write now (`expected_spec`).
pub(super) fn inspect_spec(
    root: &MachineRoot,
    mc: &MachineConfig,
    expected_spec: Option<&[u8]>,
) -> Result<SpecFacts> {
    let path = format!(
        "{}/{}",
        mc.cdi_dir.as_str().trim_end_matches('/'),
        cdi::spec_file_name(&mc.cdi_kind)
    );
    let bytes = root
        .read_file(&path, MAX_SPEC_BYTES)
        .with_context(|| format!("reading the CDI spec {path} in the machine"))?;
    Ok(match bytes {
        None => SpecFacts::missing(path),
        Some(bytes) => {
            let current = expected_spec.is_some_and(|e| e == bytes.as_slice());
            match cdi::check(&mc.cdi_kind, &bytes) {
                Err(e) => SpecFacts {
                    state: "invalid",
                    error: Some(e),
                    current,
                    ..SpecFacts::missing(path)
                },
                Ok(c) => {
                    let mut versions = Vec::new();
                    for p in &c.container_paths {
                        let name = p.rsplit('/').next().unwrap_or(p);
                        if let Some(v) = libcuda_version(name) {
                            push_unique(&mut versions, v);
                        }
                    }
                    SpecFacts {
                        path,
                        state: "valid",
                        error: None,
                        cdi_version: Some(c.cdi_version.clone()),
                        driver_versions: versions,
                        devices: c.devices.iter().map(|(n, _)| n.clone()).collect(),
                        current,
                        checked: Some(c),
                    }
                }
            }
        }
    })
}

/// The driver versions the machine's driver root holds; its dangling links into `dangling`.
pub(super) fn inspect_driver_root(
    root: &MachineRoot,
    dangling: &mut Vec<String>,
) -> Result<Vec<String>> {
    let mut versions = Vec::new();
    if let Lookup::Dir(dr) = root.lookup_dir(DRIVER_ROOT)? {
        let entries = dr.walk(MAX_DRIVER_ROOT_ENTRIES)?.with_context(|| {
            format!("{DRIVER_ROOT} in the machine has more than {MAX_DRIVER_ROOT_ENTRIES} entries")
        })?;
        for e in entries {
            let name = e.path.rsplit('/').next().unwrap_or(&e.path);
            if let Some(v) = libcuda_version(name) {
                push_unique(&mut versions, v);
            }
            if e.kind == FileKind::Symlink {
                let p = format!("{DRIVER_ROOT}/{}", e.path);
                if !root.resolves(&p)? {
                    dangling.push(format!("{p} -> {}", e.target.unwrap_or_default()));
                }
            }
        }
    }
    Ok(versions)
}

/// The driver versions our library links name ([`links::ours`]); the dangling ones into
/// `dangling`.
pub(super) fn inspect_lib_links(
    root: &MachineRoot,
    dangling: &mut Vec<String>,
) -> Result<Vec<String>> {
    let mut versions = Vec::new();
    for dir_path in links::machine_lib_dirs(root)? {
        let Lookup::Dir(dir) = root.lookup_dir(&dir_path)? else {
            continue;
        };
        let seen = links::observe_dir(&dir, &links::DirLinks::new())?;
        for (name, target) in links::ours(&seen) {
            if let Some(v) = libcuda_version(name) {
                push_unique(&mut versions, v);
            }
            let p = dir.child(name);
            if !root.resolves(&p)? {
                dangling.push(format!("{p} -> {target}"));
            }
        }
    }
    Ok(versions)
}

/// Our `/dev/char` links to NVIDIA nodes that dangle, into `dangling`.
pub(super) fn inspect_dev_char(root: &MachineRoot, dangling: &mut Vec<String>) -> Result<()> {
    if let Lookup::Dir(dev_char) = root.lookup_dir(links::DEV_CHAR)? {
        let seen = links::observe_dir(&dev_char, &links::DirLinks::new())?;
        for (name, target) in links::ours_dev_char(&seen) {
            let p = dev_char.child(name);
            if !root.resolves(&p)? {
                dangling.push(format!("{p} -> {target}"));
            }
        }
    }
    Ok(())
}

/// The last run of `command` (our post-start) among the unit's `ExecStartPost=` (or, for host
/// mode's oneshot, `ExecStart=`) commands.
pub(super) fn last_post_start(runs: &[ExecRun], command: &str) -> Option<PostStartRun> {
    let run = runs.iter().find(|r| r.command.contains(command))?;
    if run.started_usec == 0 {
        return None;
    }
    // si_code: 1 CLD_EXITED, 2 CLD_KILLED, 3 CLD_DUMPED; 0 while it runs.
    let exited = run.exited_usec != 0 && run.code != 0;
    Some(PostStartRun {
        started_at: utc(run.started_usec),
        exited_at: exited.then(|| utc(run.exited_usec)),
        exit_status: (exited && run.code == 1).then_some(run.status),
        signal: (exited && run.code != 1).then_some(run.status),
        succeeded: exited && run.code == 1 && run.status == 0,
        started_usec: run.started_usec,
        exited_usec: if exited { run.exited_usec } else { 0 },
    })
}

/// µs since the epoch as `YYYY-MM-DDTHH:MM:SSZ`.
pub fn utc(usec: u64) -> String {
    let at = std::time::UNIX_EPOCH + std::time::Duration::from_micros(usec);
    humantime::format_rfc3339_seconds(at).to_string()
}
