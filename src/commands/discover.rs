//! `discover [--json]`: what discovery sees on the host, and each machine's share of its GPUs.

use crate::Ctx;
use crate::config::Gpus;
use crate::discovery::{self, assign};
use crate::output::{discovery_text, print_all};
use anyhow::Result;
use std::fmt::Write as _;

/// `discover`: print what discovery sees; returns whether the verdict is not `incomplete`.
pub fn discover(ctx: &Ctx, json: bool) -> Result<bool> {
    let inv = discovery::discover(&ctx.host)?;
    let settings = ctx.config.gpu_settings()?;
    let lists: Vec<(String, Gpus)> = settings
        .iter()
        .map(|(m, g, _)| (m.clone(), g.clone()))
        .collect();
    assign::check_overlap(&inv, &lists)?;
    // `all` machines get the whole inventory above; the others are shown one by one.
    let assignments: Vec<_> = settings
        .iter()
        .filter(|(_, g, _)| *g != Gpus::All)
        .map(|(m, g, require)| (m, assign::assign(&inv, g), *require))
        .collect();
    if json {
        let mut report = discovery::Report::new(&ctx.host, &inv);
        report.assignments = assignments
            .iter()
            .map(|(m, a, require)| a.report(m, *require))
            .collect();
        print_all(&format!("{}\n", serde_json::to_string_pretty(&report)?))?;
    } else {
        let mut text = discovery_text(&inv);
        for (m, a, _) in &assignments {
            let _ = writeln!(text, "machine {m}: gpus {}", a.summary());
        }
        print_all(&text)?;
    }
    Ok(!matches!(
        inv.verdict,
        discovery::Verdict::Incomplete { .. }
    ))
}
