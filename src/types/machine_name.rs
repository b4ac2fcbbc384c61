//! Machine names, validated the way systemd validates machine names (hostname rules, loosely).

use std::fmt;
use std::str::FromStr;

/// A validated machine name: 1–64 characters of `[A-Za-z0-9._-]`, not starting with `.`.
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
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
        {
            return Err(format!(
                "machine name \"{shown}\" contains {:?}; only A-Z a-z 0-9 . _ - are allowed",
                bad
            ));
        }
        if s.starts_with('.') {
            return Err(format!("machine name \"{shown}\" must not start with '.'"));
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
            "gpu-node_01.example",
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
