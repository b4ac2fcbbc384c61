//! post-start's [`Work`] on a target ([`Wiring`]): its parts written (src/apply/parts/), and the
//! gate releases and image imports its plan makes beside them.

use crate::apply::executor::Work;
use crate::apply::images::import_images;
use crate::apply::parts::{AnyPart, Applied, Wiring};
use crate::failpoint::Point;
use crate::types::paths::UnitName;
use anyhow::Result;

impl Work for Wiring<'_> {
    fn apply(&self, part: &'static dyn AnyPart, library_links_changed: bool) -> Result<Applied> {
        part.apply(self, library_links_changed)
    }

    fn release(&self, unit: &UnitName, point: Point) -> Result<String> {
        Ok(if self.markers.release(unit, point)? {
            format!("unit gate: released {unit} ({})", self.markers.path(unit))
        } else {
            format!("unit gate: {unit} already released")
        })
    }

    fn import(&self) -> Result<(usize, usize)> {
        import_images(self.who, self.root, self.mc, self.services)
    }
}
