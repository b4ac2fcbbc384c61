//! The product's work for the hooks' executors: post-start's on a target ([`Wiring`]: its parts
//! written, the gate released, the staged images imported) and pre-start's on the host
//! ([`Boot`]: its parts made), each part by its own file in src/apply/parts/.

use crate::apply::boot::Boot;
use crate::apply::executor::{BootStep, BootWork, Work};
use crate::apply::images::import_images;
use crate::apply::parts::{AnyPart, Applied, Running, Wiring};
use crate::failpoint::Point;
use crate::model::Change;
use crate::types::paths::UnitName;
use anyhow::Result;

impl Work for Wiring<'_> {
    fn apply(
        &self,
        part: &'static dyn AnyPart<Running>,
        library_links_changed: bool,
    ) -> Result<Applied> {
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

impl BootWork for Boot<'_> {
    fn diff(&self, part: BootStep) -> Result<Vec<Change>> {
        part.changes(self)
    }

    fn unchanged(&self, part: BootStep) -> Result<String> {
        part.unchanged(self)
    }

    fn apply(&self, part: BootStep) -> Result<String> {
        Ok(part.apply(self, false)?.line)
    }
}
