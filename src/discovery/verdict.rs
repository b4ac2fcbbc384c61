//! The completeness verdict as the hooks act on it: an incomplete NVIDIA state stops the start.

use super::{Inventory, Verdict};
use crate::error::{Kind, classified};
use anyhow::Result;
use std::fmt::Write as _;

/// Most reasons one error names; the rest are counted. A real host has a handful, but a /dev
/// full of stale nodes has one per node, and the error is one journal line.
const MAX_REASONS_SHOWN: usize = 10;

/// Fail with exit code 3 when the verdict is incomplete.
pub fn check_complete(inv: &Inventory) -> Result<()> {
    match &inv.verdict {
        Verdict::Incomplete { reasons } => {
            let mut shown = reasons
                .iter()
                .take(MAX_REASONS_SHOWN)
                .map(String::as_str)
                .collect::<Vec<_>>()
                .join("; ");
            if let Some(more) = reasons.len().checked_sub(MAX_REASONS_SHOWN)
                && more > 0
            {
                let _ = write!(shown, "; and {more} more (`discover` lists every one)");
            }
            Err(classified(
                Kind::DriverIncomplete,
                format!(
                    "NVIDIA state on the host is incomplete, refusing to start until it is: {shown}"
                ),
            ))
        }
        _ => Ok(()),
    }
}
