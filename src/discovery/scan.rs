//! Walks the host tree (through a `HostRoot`) and builds an `Inventory`.

use super::Inventory;
use crate::host::HostRoot;
use anyhow::Result;

/// Discover the host's NVIDIA state.
pub fn discover(host: &HostRoot) -> Result<Inventory> {
    anyhow::bail!("discovery under {} is not built yet", host.root().display())
}
