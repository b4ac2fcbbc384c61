//! What every command gets: the host tree and the configuration loaded from it.

use crate::cli::Cli;
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
    /// The host tree `--host-root` names and the configuration loaded from it.
    pub(crate) fn load(cli: &Cli) -> Result<Ctx> {
        // A mistyped --host-root must not become an empty host with verdict "none" and new files.
        let host = HostRoot::open(&cli.host_root).map_err(|e| {
            crate::error::bad_input(format!(
                "--host-root {}: not a directory that can be opened ({})",
                cli.host_root.display(),
                e.root_cause()
            ))
        })?;
        let config = Config::load(&host, cli.config.as_deref())?;
        Ok(Ctx { host, config })
    }
}
