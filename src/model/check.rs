//! What `status` compares, by name: each [`Check`] is one finding's `check` and one change's
//! part. The names are the JSON's and the metrics' `check` label (`status --json`,
//! `nspawn_lifecycle_check_failed{check}`); inside the crate a check is only ever this enum.

use serde::{Serialize, Serializer};

/// One thing `status` compares. Its name ([`Check::as_str`]) appears only at the edges.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Check {
    // The wiring's parts (src/apply/parts/): each change of the model names one.
    DriverRoot,
    StaleNvidiaState,
    Helper,
    Links,
    DevChar,
    LdCache,
    CdiSpec,
    Gate,
    HostDevices,
    Dropin,
    // Judged by `status` from what it read beside the parts.
    HostDriver,
    PostStart,
    Unit,
    Gpus,
    Services,
    DriverVersion,
    DanglingLinks,
    NextStart,
}

impl Check {
    /// Every check, in the order above.
    pub const ALL: [Check; 18] = [
        Check::DriverRoot,
        Check::StaleNvidiaState,
        Check::Helper,
        Check::Links,
        Check::DevChar,
        Check::LdCache,
        Check::CdiSpec,
        Check::Gate,
        Check::HostDevices,
        Check::Dropin,
        Check::HostDriver,
        Check::PostStart,
        Check::Unit,
        Check::Gpus,
        Check::Services,
        Check::DriverVersion,
        Check::DanglingLinks,
        Check::NextStart,
    ];

    /// The name of the JSON and the metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Check::DriverRoot => "driver-root",
            Check::StaleNvidiaState => "stale-nvidia-state",
            Check::Helper => "helper",
            Check::Links => "links",
            Check::DevChar => "dev-char",
            Check::LdCache => "ld-cache",
            Check::CdiSpec => "cdi-spec",
            Check::Gate => "gate",
            Check::HostDevices => "host-devices",
            Check::Dropin => "dropin",
            Check::HostDriver => "host-driver",
            Check::PostStart => "post-start",
            Check::Unit => "unit",
            Check::Gpus => "gpus",
            Check::Services => "services",
            Check::DriverVersion => "driver-version",
            Check::DanglingLinks => "dangling-links",
            Check::NextStart => "next-start",
        }
    }
}

impl std::fmt::Display for Check {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for Check {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn every_check_has_its_own_name() {
        let mut names: Vec<&str> = Check::ALL.iter().map(|c| c.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), Check::ALL.len());
        assert_eq!(
            serde_json::to_string(&Check::StaleNvidiaState).unwrap(),
            "\"stale-nvidia-state\""
        );
    }
}
