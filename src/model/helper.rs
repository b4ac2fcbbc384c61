//! The helper the units and a machine's CDI hooks run: installed at the configuration's stable
//! path, it must be a working binary, and a running machine's hooks must run that very file.

/// The helper binary installed at the configuration's stable path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HelperFacts {
    pub path: String,
    /// Device and inode, when it is there at all.
    pub identity: Option<(u64, u64)>,
    /// Why it cannot run, when it cannot: missing, not a regular executable file, not an ELF
    /// program for this machine.
    pub problem: Option<String>,
}

/// Look at the helper installed at `path` (inside the host root): reads its ELF header only. It
/// must be an ELF program for `machine` (the host's: [`host_machine`]), any when `None`.
pub(crate) fn helper_facts(
    host: &crate::fs::host::HostRoot,
    path: &str,
    machine: Option<u16>,
) -> HelperFacts {
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
    let mut facts = HelperFacts {
        path: path.to_owned(),
        identity: None,
        problem: None,
    };
    let meta = match host.metadata(path) {
        Ok(m) => m,
        Err(e) => {
            facts.problem = Some(format!("{path} cannot be read ({e})"));
            return facts;
        }
    };
    facts.identity = Some((meta.dev(), meta.ino()));
    let elf = host
        .open_read(path)
        .map_err(|e| e.to_string())
        .and_then(|f| crate::discovery::parse::elf_info(&f).map_err(|e| e.to_string()));
    facts.problem = if !meta.is_file() || meta.permissions().mode() & 0o111 == 0 {
        Some(format!("{path} is not an executable file"))
    } else {
        match elf {
            Err(e) => Some(format!("{path} is not a working binary: {e}")),
            Ok(info) if machine.is_some_and(|m| m != info.machine) => Some(format!(
                "{path} is not a working binary: an ELF program for machine {}, not the host's {}",
                info.machine,
                machine.unwrap_or_default()
            )),
            Ok(_) => None,
        }
    };
    facts
}

/// This build's ELF `e_machine`.
pub const THIS_MACHINE: u16 = if cfg!(target_arch = "aarch64") {
    crate::discovery::parse::EM_AARCH64
} else {
    crate::discovery::parse::EM_X86_64
};

/// The ELF machine the host's programs are for: on the real root, this build's (it runs there,
/// natively or through the host's own emulator); in a host tree (`--host-root`), what the
/// tree's NVIDIA libraries are built for, so an x86_64 helper judging an aarch64 host's tree
/// says what the aarch64 helper says; `None` when the tree has no driver to tell.
pub fn host_machine(
    host: &crate::fs::host::HostRoot,
    inv: &crate::discovery::Inventory,
) -> Option<u16> {
    use crate::discovery::parse::{EM_AARCH64, EM_X86_64};
    if host.is_real_root() {
        return Some(THIS_MACHINE);
    }
    inv.driver
        .as_ref()?
        .lib_dirs
        .iter()
        .find_map(|d| match d.triplet.as_str() {
            "x86_64-linux-gnu" => Some(EM_X86_64),
            "aarch64-linux-gnu" => Some(EM_AARCH64),
            _ => None,
        })
}
