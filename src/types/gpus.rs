//! Which GPUs: a machine's `gpus` setting, its selectors, PCI addresses.

use std::fmt;

/// Which of the host's GPUs a machine gets (`gpus`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Gpus {
    /// Every GPU the host has (the default; what every machine got before the setting).
    #[default]
    All,
    /// No GPU and no NVIDIA state at all: a CPU machine on a GPU host.
    None,
    /// Exactly these GPUs, in the config's order; never empty, no entry twice.
    List(Vec<GpuSelector>),
}

/// One entry of a `gpus` list.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum GpuSelector {
    /// `GPU-<uuid>`, lower case (stable across reboots and renumbering).
    Uuid(String),
    /// PCI bus id in the kernel's form `0000:06:00.0` (stable while the card stays in its slot).
    BusId(String),
    /// Host index in PCI bus order (not stable: allowed with a warning).
    Index(u32),
}

impl fmt::Display for GpuSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GpuSelector::Uuid(u) => f.write_str(u),
            GpuSelector::BusId(b) => f.write_str(b),
            GpuSelector::Index(i) => write!(f, "index {i}"),
        }
    }
}

impl fmt::Display for Gpus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Gpus::All => f.write_str("all"),
            Gpus::None => f.write_str("none"),
            Gpus::List(l) => {
                let names: Vec<String> = l.iter().map(ToString::to_string).collect();
                write!(f, "[{}]", names.join(", "))
            }
        }
    }
}

/// A PCI address `domain:bus:device.function`, ordered like the PCI bus enumerates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct PciAddress {
    pub domain: u32,
    pub bus: u8,
    pub device: u8,
    pub function: u8,
}

impl PciAddress {
    /// Parse `0000:06:00.0` (hex, case-insensitive; the kernel writes lower case).
    pub fn parse(s: &str) -> Option<PciAddress> {
        let (domain, rest) = s.split_once(':')?;
        let (bus, rest) = rest.split_once(':')?;
        let (device, function) = rest.split_once('.')?;
        let hex = |t: &str, max_len: usize| {
            (!t.is_empty() && t.len() <= max_len && t.bytes().all(|b| b.is_ascii_hexdigit()))
                .then(|| u32::from_str_radix(t, 16).ok())
                .flatten()
        };
        let addr = PciAddress {
            domain: hex(domain, 8)?,
            bus: u8::try_from(hex(bus, 2)?).ok()?,
            device: u8::try_from(hex(device, 2)?).ok()?,
            function: u8::try_from(hex(function, 1)?).ok()?,
        };
        (addr.device < 32 && addr.function < 8).then_some(addr)
    }
}

impl fmt::Display for PciAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:04x}:{:02x}:{:02x}.{:x}",
            self.domain, self.bus, self.device, self.function
        )
    }
}
