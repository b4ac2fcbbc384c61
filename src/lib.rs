//! nspawn-lifecycle: keeps systemd-nspawn machines that hold Kubernetes GPU nodes in step with
//! their host, around every start. See README.md for the operator's view and DESIGN notes there.

pub mod atomic;
pub mod build_info;
pub mod cdi;
pub mod cdi_hook;
pub mod cli;
pub mod commands;
pub mod config;
pub mod ctx;
pub mod device_cgroup;
pub mod discovery;
pub mod driver_tree;
pub mod dropin;
pub mod error;
pub mod failpoint;
pub mod fd_mount;
#[cfg(any(test, feature = "testkit"))]
pub mod fixture;
pub mod gate;
pub mod host;
pub mod host_dir;
pub mod host_unit;
pub mod image;
pub mod layout;
pub mod ldcache;
pub mod legacy;
pub mod lock;
pub mod logging;
pub mod machine_name;
pub mod machine_root;
pub mod model;
pub mod nspawn;
pub mod output;
pub mod paths;
pub mod render;
pub mod rewire;
pub mod systemd;
pub mod units;

pub use ctx::Ctx;
