//! nspawn-lifecycle: keeps systemd-nspawn machines that hold Kubernetes GPU nodes in step with
//! their host, around every start. See README.md for the operator's view, and its repository
//! map for how the modules below depend on one another (each only on those listed before it).

pub mod types;

pub mod build_info;
pub mod error;
pub mod failpoint;

pub mod fs;
pub mod systemd;

pub mod config;
pub mod ctx;
pub mod discovery;

pub mod model;

pub mod apply;

pub mod logging;
pub mod output;

pub mod cli;
pub mod commands;

#[cfg(any(test, feature = "testkit"))]
pub mod fixture;

pub use ctx::Ctx;
