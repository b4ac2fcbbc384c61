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

/// Look at the helper installed at `path` (inside the host root): reads its ELF header only.
pub fn helper_facts(host: &crate::fs::host::HostRoot, path: &str) -> HelperFacts {
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
            Ok(info) if info.machine != THIS_MACHINE => Some(format!(
                "{path} is not a working binary: an ELF program for machine {}, not this one's {THIS_MACHINE}",
                info.machine
            )),
            Ok(_) => None,
        }
    };
    facts
}

/// This build's ELF `e_machine`.
const THIS_MACHINE: u16 = if cfg!(target_arch = "aarch64") {
    crate::discovery::parse::EM_AARCH64
} else {
    crate::discovery::parse::EM_X86_64
};
