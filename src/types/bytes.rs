//! Bounded reads of numbers out of bytes, for every binary format read here (ELF, `ld.so.cache`).

/// The u32 at `at` in the given byte order; `None` past the end (bounded reads for every parser).
pub fn read_u32(b: &[u8], at: usize, big_endian: bool) -> Option<u32> {
    let raw: [u8; 4] = b.get(at..at.checked_add(4)?)?.try_into().ok()?;
    Some(if big_endian {
        u32::from_be_bytes(raw)
    } else {
        u32::from_le_bytes(raw)
    })
}

/// [`read_u32`] for a u64.
pub fn read_u64(b: &[u8], at: usize, big_endian: bool) -> Option<u64> {
    let raw: [u8; 8] = b.get(at..at.checked_add(8)?)?.try_into().ok()?;
    Some(if big_endian {
        u64::from_be_bytes(raw)
    } else {
        u64::from_le_bytes(raw)
    })
}
