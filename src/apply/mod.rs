//! What changes the world: the driver tree pre-start builds on the host, post-start's rewiring
//! of a target from the model's differences, the unit gate's markers, and the CDI hooks that
//! wire a container.

pub mod cdi_hook;
pub mod driver_tree;
pub mod executor;
pub mod gate;
pub mod images;
pub mod rewire;
