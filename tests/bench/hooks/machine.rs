//! A machine root for the rewiring measurement, and the rewiring pass itself: post-start's file
//! steps (links, CDI spec) through the library, without systemd and `ldconfig`. The driver root
//! is systemd-nspawn's binds, made at boot, and post-start only checks it (a stat per bind on
//! each side), which needs those mounts: not measured here.

use anyhow::{Context as _, Result};
use nspawn_lifecycle::apply::rewire::{self, Report};
use nspawn_lifecycle::config::MachineConfig;
use nspawn_lifecycle::discovery::Inventory;
use nspawn_lifecycle::fs::machine_root::MachineRoot;
use nspawn_lifecycle::model::cdi;
use nspawn_lifecycle::model::{links, spec};
use std::os::unix::fs::symlink;
use std::path::Path;

/// Unrelated libraries in the machine's multiarch dir (each a file plus its SONAME link): the
/// link step lists that directory, so an empty one would flatter it. A Debian 12 node rootfs
/// with containerd and kubelet holds a few hundred entries there.
pub const OTHER_LIBS: usize = 150;

/// Build a Debian-like machine root at `root`: merged /usr, `var/run → ../run`, the multiarch
/// dir with [`OTHER_LIBS`] unrelated libraries, the loader's config naming it, empty `/etc/cdi`
/// and `/dev/char`.
pub fn skeleton(root: &Path) -> Result<()> {
    let at = |p: &str| root.join(p);
    for d in [
        "usr/lib/x86_64-linux-gnu/vdpau",
        "usr/bin",
        "etc/cdi",
        "run",
        "var/lib",
        "dev/char",
    ] {
        fs_err::create_dir_all(at(d))?;
    }
    symlink("usr/lib", at("lib")).context("lib link")?;
    symlink("usr/bin", at("bin")).context("bin link")?;
    symlink("../run", at("var/run")).context("var/run link")?;
    fs_err::write(at("etc/ld.so.conf"), "/usr/lib/x86_64-linux-gnu\n")?;
    for k in 0..OTHER_LIBS {
        let file = format!("libother{k:03}.so.1.2.3");
        fs_err::write(at(&format!("usr/lib/x86_64-linux-gnu/{file}")), b"ELF")?;
        symlink(
            &file,
            at(&format!("usr/lib/x86_64-linux-gnu/libother{k:03}.so.1")),
        )
        .context("library link")?;
    }
    Ok(())
}

/// The writes of post-start's parts for `inv` in the machine, in post-start's order: with a
/// complete driver, the library links, `/dev/char` and the CDI spec (rendered here, as
/// post-start renders it); otherwise each part against nothing of ours.
pub fn rewire_pass(root: &MachineRoot, inv: &Inventory, mc: &MachineConfig) -> Result<Vec<Report>> {
    let file_name = cdi::spec_file_name(&mc.cdi_kind);
    if inv.complete_driver().is_none() {
        // Each part against nothing of ours, in the parts' order (src/apply/part.rs).
        return Ok(vec![
            rewire::remove_driver_root(root)?,
            rewire::lib_links(root, &Default::default())?,
            rewire::dev_char(root, &Default::default(), false, None)?,
            rewire::remove_spec(root, &mc.cdi_dir, &file_name)?,
        ]);
    }
    let mut reports = vec![
        rewire::lib_links(root, &links::lib_links(inv.driver.as_ref()))?,
        rewire::dev_char(root, &links::dev_char_links(inv), true, None)?,
    ];
    let spec = cdi::spec(inv, &mc.cdi_kind).context("a complete host has a CDI spec")?;
    let want = spec::Want {
        dir: mc.cdi_dir.to_string(),
        file: file_name,
        kind: mc.cdi_kind.to_string(),
        bytes: Some(cdi::render(&spec).into_bytes()),
    };
    reports.push(rewire::write_cdi(root, &want, |n, b| want.conflicts(n, b))?);
    Ok(reports)
}
