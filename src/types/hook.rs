//! The command line of the CDI hooks: what the CDI spec names (`cdi-hook <verb> <flags>`, written
//! by [`CdiHook::argv`]) and what the helper parses (the same type, a clap subcommand), so the two
//! are one spelling. This shape is what CDI specs written by earlier starts still name: keep it.

/// The host's driver parameters, which the driver reads `ModifyDeviceFiles` from.
pub const HOST_PARAMS: &str = "/proc/driver/nvidia/params";
/// The subcommand that runs a hook: `nspawn-lifecycle-helper cdi-hook <verb> …`.
pub const SUBCOMMAND: &str = "cdi-hook";

/// The hooks of `cdi-hook` (see src/apply/cdi_hook.rs).
#[derive(Debug, Clone, PartialEq, Eq, clap::Subcommand)]
pub enum CdiHook {
    /// Make each LINK in the container a symlink to TARGET.
    CreateSymlinks {
        #[arg(long = "link", value_name = "TARGET::LINK", required = true)]
        links: Vec<String>,
    },
    /// Add each library to the container's /etc/ld.so.cache (keeping the image's entries).
    UpdateLdcache {
        #[arg(long = "lib", value_name = "SONAME::PATH", required = true)]
        libs: Vec<String>,
    },
    /// Cover the container's /proc/driver/nvidia/params with a copy saying ModifyDeviceFiles: 0.
    DisableDeviceNodeModification {
        #[command(flatten)]
        testkit: HookTestkit,
    },
}

impl CdiHook {
    /// The hook's arguments after [`SUBCOMMAND`], as the helper parses them back.
    pub fn argv(&self) -> Vec<String> {
        let (verb, flag, pairs): (&str, &str, &[String]) = match self {
            CdiHook::CreateSymlinks { links } => ("create-symlinks", "--link", links),
            CdiHook::UpdateLdcache { libs } => ("update-ldcache", "--lib", libs),
            CdiHook::DisableDeviceNodeModification { .. } => {
                ("disable-device-node-modification", "", &[])
            }
        };
        std::iter::once(verb.to_owned())
            .chain(pairs.iter().flat_map(|p| [flag.to_owned(), p.clone()]))
            .collect()
    }
}

/// The device-node hook's flag for tests: only in builds with the test kit, never in the release
/// binary, whose hook reads the host's own parameters.
#[derive(Debug, Clone, Default, PartialEq, Eq, clap::Args)]
pub struct HookTestkit {
    /// (tests) The host's driver parameters to read instead of the host's own.
    #[cfg(feature = "testkit")]
    #[arg(long, value_name = "FILE", hide = true)]
    host_params: Option<std::path::PathBuf>,
}

impl HookTestkit {
    /// The host's driver parameters file the hook reads.
    pub fn host_params(&self) -> &std::path::Path {
        #[cfg(feature = "testkit")]
        if let Some(p) = &self.host_params {
            return p;
        }
        std::path::Path::new(HOST_PARAMS)
    }
}
