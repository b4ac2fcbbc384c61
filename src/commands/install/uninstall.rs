//! `uninstall`: what install added for a machine, planned for removal.

use super::*;

/// `uninstall`'s plan: our drop-in away, the `.nspawn` file without GPU binds, the helper away
/// when no machine uses it any more. Files install did not write are left alone with a warning.
pub(super) fn plan_uninstall(ctx: &Ctx, machine: &MachineName) -> Result<Plan> {
    let mut plan = Plan::new("uninstall", machine.as_str());
    // A name that was never installed (a typo of one that was) is said so, not "nothing changed";
    // after an uninstall its `.nspawn` file stays, so uninstalling twice still changes nothing.
    if !ctx.host.exists(dropin_path(machine)) && !ctx.host.exists(nspawn_path(machine)) {
        return Err(crate::error::bad_input(format!(
            "machine {machine} is not installed: neither {} nor {} is on the host",
            dropin_path(machine),
            nspawn_path(machine)
        )));
    }
    let installed = dropin_removal(&ctx.host, machine, &mut plan)?;
    uninstalled_nspawn(ctx, machine, installed, &mut plan)?;
    helper_removal(ctx, machine, &mut plan)?;
    tree_removal(&ctx.host, machine, &mut plan);
    Ok(plan)
}

/// pre-start's driver tree of the machine: hard links of the host's driver files, which would
/// keep an old driver's files on disk after an upgrade (and the legacy layout's tree on `/run`);
/// and the machine's unit-gate markers on the host (pre-start's and post-start's).
pub(super) fn tree_removal(host: &HostRoot, machine: &MachineName, plan: &mut Plan) {
    for (dir, what) in [
        (
            crate::model::layout::TREE_HOST_DIR,
            "pre-start's driver tree",
        ),
        (
            crate::model::layout::LEGACY_TREE_HOST_DIR,
            "pre-start's driver tree",
        ),
        (crate::model::gate::MACHINES_DIR, "the unit gate's markers"),
    ] {
        let shown = format!("{dir}/{machine}");
        if host.symlink_metadata(&shown).is_ok() {
            plan.files.push(FileLine {
                op: Some(Op::RemoveTree),
                ..FileLine::new(&shown, Verb::Remove, what.into())
            });
        }
    }
}

/// Our drop-in, and its directory when nothing else is in it; whether our drop-in was there.
pub(super) fn dropin_removal(
    host: &HostRoot,
    machine: &MachineName,
    plan: &mut Plan,
) -> Result<bool> {
    let shown = dropin_path(machine);
    match read_optional(host, &shown)? {
        Some(b) if b.starts_with(DROPIN_HEADER.as_bytes()) => {
            plan.files.push(FileLine {
                unit_file: true,
                ..FileLine::removing(&shown, "")
            });
            let only = std::ffi::OsStr::new(DROPIN_NAME);
            plan.files
                .extend(remove_dir_if_only(host, &dropin_dir(machine), only));
            Ok(true)
        }
        Some(_) => {
            plan.warnings
                .push(format!("{shown} was not written by install; left alone"));
            Ok(false)
        }
        None => Ok(false),
    }
}

/// Removing the .nspawn file would hand the next start to the stock unit's `-U`, and
/// systemd-nspawn would chown the whole rootfs to a private UID range. It is replaced by the
/// same settings without GPUs instead (see `NspawnFile::uninstalled`), when it is ours or there
/// is none while the machine is `installed`.
pub(super) fn uninstalled_nspawn(
    ctx: &Ctx,
    machine: &MachineName,
    installed: bool,
    plan: &mut Plan,
) -> Result<()> {
    let host = &ctx.host;
    let shown = nspawn_path(machine);
    let ours = match read_optional(host, &shown)? {
        Some(b) if is_ours_nspawn(&b) => true,
        Some(_) => {
            plan.warnings.push(format!(
                "{shown} was not written by nspawn-lifecycle; left alone"
            ));
            false
        }
        None => installed,
    };
    if !ours {
        return Ok(());
    }
    let mc = ctx.config.machine(host, machine)?;
    let has_lib_modules = host.is_dir("/lib/modules");
    let text = NspawnFile::uninstalled(machine, &mc, has_lib_modules).to_string();
    plan.files.push(write_line(
        host,
        &shown,
        text.into_bytes(),
        0o644,
        false,
        Point::InstallMidNspawnWrite,
        |_| {
            "settings without GPU binds, PrivateUsers=no: a start of the stock unit keeps \
             the rootfs owned by root"
                .to_owned()
        },
    )?);
    Ok(())
}

/// The helper and the directory install made for it, unless another machine's hooks call it.
pub(super) fn helper_removal(ctx: &Ctx, machine: &MachineName, plan: &mut Plan) -> Result<()> {
    helper_removal_except(ctx, &dropin_path(machine), plan)
}

/// [`helper_removal`] once the unit file `except` (being removed) no longer calls it.
pub(super) fn helper_removal_except(ctx: &Ctx, except: &str, plan: &mut Plan) -> Result<()> {
    let host = &ctx.host;
    let helper = ctx.config.helper_path().to_string();
    if !host.exists(&helper) {
        return Ok(());
    }
    let users = helper_users(ctx, &helper, except)?;
    if !users.is_empty() {
        let detail = format!("still used by {}", users.join(", "));
        plan.files.push(FileLine::new(&helper, Verb::Keep, detail));
        return Ok(());
    }
    // The templates every machine's drop-in wants, which call the helper too.
    for f in crate::model::host_devices::devices_unit_files(ctx.config.helper_path()) {
        let ours = host.read(&f.path).is_ok_and(|t| {
            t.starts_with(crate::model::host_devices::DEVICES_UNIT_HEADER.as_bytes())
        });
        if ours {
            plan.files.push(FileLine {
                unit_file: true,
                ..FileLine::removing(&f.path, "no machine uses it any more")
            });
        }
    }
    plan.files
        .push(FileLine::removing(&helper, "no machine uses it any more"));
    let parent = Path::new(&helper)
        .parent()
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default();
    let helper_name = Path::new(&helper).file_name().unwrap_or_default();
    // Only the directory install made for it, and only when nothing else is in it.
    if parent.ends_with("/nspawn-lifecycle") {
        plan.files
            .extend(remove_dir_if_only(host, &parent, helper_name));
    }
    Ok(())
}

/// A line removing the directory `dir` when nothing but `only` is in it; none when anything
/// else is, or it cannot be listed.
pub(super) fn remove_dir_if_only(
    host: &HostRoot,
    dir: &str,
    only: &std::ffi::OsStr,
) -> Option<FileLine> {
    let alone = host
        .read_dir(dir)
        .map(|d| d.iter().all(|(name, _)| name == only))
        .unwrap_or(false);
    alone.then(|| FileLine {
        op: Some(Op::RemoveDir),
        ..FileLine::new(dir, Verb::Remove, "empty".into())
    })
}

/// Units (other than `machine`'s drop-in being removed) whose drop-ins call the helper.
pub(super) fn helper_users(ctx: &Ctx, helper: &str, except: &str) -> Result<Vec<String>> {
    let needle = exec_escape(helper);
    let host = &ctx.host;
    let mut users = Vec::new();
    let entries = match host.read_dir(UNIT_DIR) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(users),
        Err(e) => {
            return Err(e).with_context(|| format!("listing {}", host.path(UNIT_DIR).display()));
        }
    };
    // Host mode's unit calls it too.
    let host_unit = crate::model::host_unit::unit_path();
    if host_unit != except
        && host
            .read(&host_unit)
            .is_ok_and(|t| String::from_utf8_lossy(&t).contains(&needle))
    {
        users.push(crate::model::host_unit::UNIT.to_owned());
    }
    let mut dirs: Vec<_> = entries
        .into_iter()
        .map(|(name, _)| name.to_string_lossy().into_owned())
        .filter(|n| dropin_dir_machine(n).is_some())
        .collect();
    dirs.sort();
    for d in dirs {
        let Ok(files) = host.read_dir(format!("{UNIT_DIR}/{d}")) else {
            continue;
        };
        for (name, _) in files {
            let shown = format!("{UNIT_DIR}/{d}/{}", name.to_string_lossy());
            if shown == except || !shown.ends_with(".conf") {
                continue;
            }
            let text = host.read(&shown).unwrap_or_default();
            if String::from_utf8_lossy(&text).contains(&needle) {
                users.push(d.trim_end_matches(".d").to_owned());
                break;
            }
        }
    }
    Ok(users)
}
