//! `plan <MACHINE>`: what pre-start would write, and a unified diff against the file on disk.

use crate::Ctx;
use crate::config::Gpus;
use crate::device_cgroup;
use crate::image;
use crate::machine_name::MachineName;
use crate::output::print_all;
use crate::render::{Rendered, render};
use anyhow::Result;
use std::fmt::Write as _;

/// `plan`: print what pre-start would write and a unified diff against the file on disk.
pub fn plan(ctx: &Ctx, machine: &MachineName) -> Result<()> {
    let mc = ctx.config.machine(&ctx.host, machine)?;
    image::require(&ctx.host, machine, &mc)?;
    let r = render(ctx, machine, &mc)?;
    print_all(&plan_text(&r))
}

fn plan_text(r: &Rendered) -> String {
    let shown = r.host_path.display().to_string();
    // `all` (the default) shows nothing new: every GPU, as before the setting existed.
    let mut out = match r.assignment.setting {
        Gpus::All => String::new(),
        _ => format!(
            "# GPUs (the config's gpus): {}\n# Device cgroup (runtime DeviceAllow=, set by pre-start): {}\n",
            r.assignment.summary(),
            match device_cgroup::machine_entries(&r.assignment.view) {
                e if e.is_empty() => "no NVIDIA or DRM node".to_owned(),
                e => e
                    .iter()
                    .map(|(p, a)| format!("{p} {a}"))
                    .collect::<Vec<_>>()
                    .join(", "),
            }
        ),
    };
    let _ = write!(out, "# {shown} as pre-start would write it:\n{}\n", r.new);
    match &r.old {
        Some(old) if *old == r.new => out.push_str(&format!("# {shown} is up to date.\n")),
        old => {
            let old_text = old.as_deref().unwrap_or("");
            let from = if old.is_some() {
                format!("{shown} (on disk)")
            } else {
                format!("{shown} (missing)")
            };
            let diff = similar::TextDiff::from_lines(old_text, &r.new);
            let _ = write!(
                out,
                "{}",
                diff.unified_diff()
                    .header(&from, &format!("{shown} (pre-start)"))
            );
        }
    }
    out
}
