//! The host tree every read and write goes through: `/` in production, a fixture under `--host-root`.
//!
//! The host is trusted (it is root's own filesystem), so paths under it are joined as strings; the
//! untrusted machine rootfs never is (see `machine_root`).

use std::path::{Path, PathBuf};

/// Handle on the host tree; build it once at the edge and pass it down.
#[derive(Debug, Clone)]
pub struct HostRoot {
    root: PathBuf,
}

impl HostRoot {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        HostRoot { root: root.into() }
    }

    /// The directory that stands for `/`.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Whether this is the real `/` (some steps, like talking to systemd, only make sense then).
    pub fn is_real_root(&self) -> bool {
        self.root == Path::new("/")
    }

    /// Map an absolute host path (`/dev/nvidia0`) to where it lives under this root.
    pub fn path(&self, abs: impl AsRef<Path>) -> PathBuf {
        let abs = abs.as_ref();
        let rel = abs.strip_prefix("/").unwrap_or(abs);
        self.root.join(rel)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_absolute_paths_under_the_root() {
        let h = HostRoot::new("/tmp/fx");
        assert_eq!(h.path("/dev/nvidia0"), PathBuf::from("/tmp/fx/dev/nvidia0"));
        assert_eq!(HostRoot::new("/").path("/etc"), PathBuf::from("/etc"));
        assert!(HostRoot::new("/").is_real_root());
        assert!(!h.is_real_root());
    }
}
