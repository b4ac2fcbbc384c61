//! Machine names, validated as systemd validates them (`machine_name_is_valid`, that is
//! `hostname_is_valid` of systemd 252): what `systemd-nspawn --machine=` and machined accept, so a
//! name that would make every start fail is refused at the command line.

use std::fmt;
use std::str::FromStr;

/// A validated machine name: at most 64 bytes of dot-separated labels, each of letters, digits
/// and `-`, none empty, none starting or ending with `-`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MachineName(String);

impl MachineName {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for MachineName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Whom a hook wires: a machine, or the host itself (host mode's kubelet and containerd). What
/// its log lines' `machine` field and its errors name: `post-start of kube1`, `post-start of the
/// host`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subject<'a> {
    Machine(&'a MachineName),
    Host,
}

/// How log lines and errors name the host in host mode.
pub(crate) const HOST_LABEL: &str = "the host";

impl<'a> Subject<'a> {
    /// The machine's name; none for the host.
    pub fn machine(self) -> Option<&'a MachineName> {
        match self {
            Subject::Machine(m) => Some(m),
            Subject::Host => None,
        }
    }
}

impl fmt::Display for Subject<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Subject::Machine(m) => f.write_str(m.as_str()),
            Subject::Host => f.write_str(HOST_LABEL),
        }
    }
}

impl FromStr for MachineName {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let shown = s.escape_debug();
        if s.is_empty() {
            return Err("machine name is empty".into());
        }
        if s.len() > 64 {
            return Err(format!(
                "machine name \"{shown}\" is {} bytes long; at most 64 are allowed",
                s.len()
            ));
        }
        if let Some(bad) = s
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '-')))
        {
            return Err(format!(
                "machine name \"{shown}\" contains {bad:?}; only A-Z a-z 0-9 . - are allowed \
                 (systemd-nspawn and machined refuse anything else)"
            ));
        }
        for label in s.split('.') {
            if label.is_empty() {
                return Err(format!(
                    "machine name \"{shown}\" has an empty label (a leading, trailing or double \
                     '.'); systemd-nspawn refuses it"
                ));
            }
            if label.starts_with('-') || label.ends_with('-') {
                return Err(format!(
                    "machine name \"{shown}\" has a label starting or ending with '-'; \
                     systemd-nspawn refuses it"
                ));
            }
        }
        Ok(MachineName(s.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_systemd_style_names() {
        for ok in [
            "kube1",
            "a",
            "gpu-node-01.example",
            &"x".repeat(64),
            "0node",
        ] {
            assert_eq!(ok.parse::<MachineName>().unwrap().as_str(), ok);
        }
    }

    #[test]
    fn rejects_names_that_could_escape_or_confuse() {
        for bad in [
            "",
            ".",
            "..",
            "../etc",
            "a/b",
            ".hidden",
            "ümlaut",
            "with space",
            "a\nb",
            "a:b",
            "a..b",
            "a.",
            "-x",
            "x-",
            "a.-b",
            "gpu_node",
        ] {
            let err = bad.parse::<MachineName>().unwrap_err();
            if !bad.is_empty() {
                assert!(
                    err.contains(&bad.escape_debug().to_string()),
                    "{err} must name {bad:?}"
                );
            }
        }
        let long = "x".repeat(65);
        assert!(
            long.parse::<MachineName>()
                .unwrap_err()
                .contains("65 bytes")
        );
    }
}
