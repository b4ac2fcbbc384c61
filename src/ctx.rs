//! What every command gets: the host tree and the configuration loaded from it.

use crate::config::Config;
use crate::fs::host::HostRoot;
use anyhow::Result;

/// What every command gets: the host tree and the loaded configuration.
#[derive(Debug, Clone)]
pub struct Ctx {
    pub host: HostRoot,
    pub config: Config,
}

impl Ctx {
    /// The host tree `--host-root` names (`host_root`) and the configuration loaded from it
    /// (`--config`, or the default path in the host tree).
    pub fn load(host_root: &std::path::Path, config: Option<&std::path::Path>) -> Result<Ctx> {
        // A mistyped --host-root must not become an empty host with verdict "none" and new files.
        let host = HostRoot::open(host_root).map_err(|e| {
            crate::error::bad_input(format!(
                "--host-root {}: not a directory that can be opened ({})",
                host_root.display(),
                e.root_cause()
            ))
        })?;
        let config = Config::load(&host, config)?;
        Ok(Ctx { host, config })
    }
}
