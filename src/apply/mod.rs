//! What changes the world: the hooks' plans and their one executor, pre-start's work on the host
//! (the driver tree, the gate, the device cgroup, the `.nspawn` file), the wiring's parts
//! (`parts/`, one file each, on one list) that post-start writes and every command walks, the unit gate's markers, and the CDI hooks that wire a
//! container.

pub mod boot;
pub mod cdi_hook;
pub mod driver_tree;
pub mod executor;
pub mod gate;
pub mod images;
pub mod part;
pub mod parts;
pub mod rewire;
