//! `install --host` and `uninstall --host`: host mode's oneshot unit and the gate drop-ins of
//! the host's own containerd and kubelet.

use super::*;

/// `install --host`'s plan: the helper, the gate drop-ins of the host's containerd
/// and kubelet, then the oneshot and its enabling link: a run killed in between leaves units
/// gated by a unit that exists or none, never a unit calling a helper that is not there. A file
/// at one of these paths that install did not write is bad input (exit 2): it is the
/// operator's, and ours would replace it.
pub(super) fn plan_install_host(ctx: &Ctx, exe: &[u8]) -> Result<Plan> {
    use crate::model::host_unit;
    let host = &ctx.host;
    let hc = ctx.config.host()?;
    let helper = ctx.config.helper_path();
    let mut plan = Plan::new("install", "--host");
    plan.files.push(helper_copy(host, helper, exe)?);
    let mut files = Vec::new();
    for unit in [&hc.containerd_unit, &hc.kubelet_unit] {
        let shown = crate::model::gate::host_dropin(unit).to_string();
        files.push((
            shown,
            host_unit::gate_dropin(unit),
            Point::InstallMidDropinWrite,
        ));
    }
    files.push((
        host_unit::unit_path(),
        host_unit::unit(helper),
        Point::InstallMidDropinWrite,
    ));
    for (shown, text, point) in files {
        if let Some(old) = read_optional(host, &shown)?
            && !old.starts_with(host_unit::HEADER.as_bytes())
        {
            return Err(bad_input(format!(
                "{shown} exists and was not written by install --host; move it away first"
            )));
        }
        plan.files.push(write_line(
            host,
            &shown,
            text.into_bytes(),
            0o644,
            true,
            point,
            |old| {
                if old.is_some() {
                    "rewritten".into()
                } else {
                    String::new()
                }
            },
        )?);
    }
    let link = host_unit::wants_link();
    let target = host_unit::unit_path();
    let current = host.read_link(&link).ok();
    let mut line = FileLine::new(&link, Verb::Unchanged, String::new());
    if current.as_deref() != Some(Path::new(&target)) {
        line.verb = if current.is_some() {
            Verb::Update
        } else {
            Verb::Create
        };
        line.detail = format!("enables {} in {}", host_unit::UNIT, host_unit::WANTED_BY);
        line.op = Some(Op::Symlink(target));
        line.unit_file = true;
    }
    plan.files.push(line);
    Ok(plan)
}

/// `uninstall --host`'s plan: the enabling link, the oneshot and the gate drop-ins that install
/// wrote (their directories when nothing else is in them), and the helper when no machine uses
/// it. A file there that install did not write is left alone with a warning.
pub(super) fn plan_uninstall_host(ctx: &Ctx) -> Result<Plan> {
    use crate::model::host_unit;
    let host = &ctx.host;
    let hc = ctx.config.host()?;
    let mut plan = Plan::new("uninstall", "--host");
    let link = host_unit::wants_link();
    if host
        .read_link(&link)
        .is_ok_and(|t| t == Path::new(&host_unit::unit_path()))
    {
        plan.files.push(FileLine {
            unit_file: true,
            ..FileLine::removing(&link, "")
        });
    }
    let mut shown = vec![host_unit::unit_path()];
    for unit in [&hc.containerd_unit, &hc.kubelet_unit] {
        shown.push(crate::model::gate::host_dropin(unit).to_string());
    }
    for file in shown {
        match read_optional(host, &file)? {
            Some(b) if b.starts_with(host_unit::HEADER.as_bytes()) => {
                plan.files.push(FileLine {
                    unit_file: true,
                    ..FileLine::removing(&file, "")
                });
                let (dir, name) = file.rsplit_once('/').unwrap_or(("/", &file));
                if dir != UNIT_DIR {
                    plan.files
                        .extend(remove_dir_if_only(host, dir, std::ffi::OsStr::new(name)));
                }
            }
            Some(_) => plan.warnings.push(format!(
                "{file} was not written by install --host; left alone"
            )),
            None => {}
        }
    }
    // The markers host post-start left in the host's /run (a tmpfs, so they outlive the gate until
    // the next reboot): a later install --host would otherwise let containerd and kubelet start
    // before host post-start wrote this boot's spec.
    for unit in [&hc.containerd_unit, &hc.kubelet_unit] {
        let marker = crate::model::gate::marker(unit).to_string();
        if read_optional(host, &marker)?
            .is_some_and(|b| b.starts_with(crate::model::gate::RELEASED_BY_POST_START.as_bytes()))
        {
            plan.files
                .push(FileLine::removing(&marker, "gate marker of this boot"));
        }
    }
    helper_removal_except(ctx, &host_unit::unit_path(), &mut plan)?;
    Ok(plan)
}

/// `install --host`: see [`plan_install_host`].
pub fn install_host(ctx: &Ctx, how: How, systemd: &HostSystemd<'_>) -> Result<()> {
    let exe =
        std::fs::read("/proc/self/exe").context("reading the running helper /proc/self/exe")?;
    execute(ctx, &Subject::Host, how, systemd, &|| {
        plan_install_host(ctx, &exe)
    })
    .context("install --host")
}

/// `uninstall --host`: see [`plan_uninstall_host`].
pub fn uninstall_host(ctx: &Ctx, how: How, systemd: &HostSystemd<'_>) -> Result<()> {
    execute(ctx, &Subject::Host, how, systemd, &|| {
        plan_uninstall_host(ctx)
    })
    .context("uninstall --host")
}
