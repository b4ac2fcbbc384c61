//! Value types that import nothing else of this crate: machine names, host and machine paths,
//! unit names and paths, GPU selectors, capabilities, the hook command line, byte readers.

pub mod bytes;
pub mod capabilities;
pub mod gpus;
pub mod hook;
pub mod machine_name;
pub mod paths;
pub mod units;
