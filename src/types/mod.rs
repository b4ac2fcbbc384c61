//! Value types that import nothing else of this crate: machine names, host and machine paths,
//! unit names and paths, GPU selectors, capabilities, the hook command line, byte readers.

pub(crate) mod bytes;
pub(crate) mod capabilities;
pub(crate) mod gpus;
pub(crate) mod hook;
pub mod machine_name;
pub mod paths;
pub mod units;
