//! [`BlockKind`]: which allocation function made a block, as the tracker keeps and reports it.

/// Which allocation function made a block; a free through another family is a mismatch.
/// The values are those of the cxx bridge's `BlockKind`, which C++ passes and `rust/ffi.rs`
/// maps to this one by name: with equal values, the mapping costs nothing.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockKind {
    New,
    NewArray,
    Rust,
    Bullet,
    /// The C family (`rust/tracker/malloc.rs`): one kind per allocating function, any of them
    /// released by `free` or `realloc`.
    Malloc,
    Calloc,
    Realloc,
    AlignedAlloc,
    PosixMemalign,
    Memalign,
    Valloc,
    Pvalloc,
    /// `k15::memory::allocate(size, align, name)`: the block's site holds the name.
    Named,
}

impl BlockKind {
    /// The kind stored as `byte` (`kind as u8`); a byte no kind has, which only a stray write
    /// can leave in a header, reads as `New` (the family a report then names, as before the
    /// tracker owned this type).
    #[inline]
    pub const fn from_byte(byte: u8) -> BlockKind {
        use BlockKind::*;
        match byte {
            1 => NewArray,
            2 => Rust,
            3 => Bullet,
            4 => Malloc,
            5 => Calloc,
            6 => Realloc,
            7 => AlignedAlloc,
            8 => PosixMemalign,
            9 => Memalign,
            10 => Valloc,
            11 => Pvalloc,
            12 => Named,
            _ => New,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::BlockKind;

    #[test]
    fn every_kind_reads_back_from_its_byte_and_other_bytes_read_as_new() {
        let kinds = (0..=u8::MAX).filter(|&byte| BlockKind::from_byte(byte) as u8 == byte);
        assert!(kinds.eq(0..=BlockKind::Named as u8));
        for byte in BlockKind::Named as u8 + 1..=u8::MAX {
            assert_eq!(BlockKind::from_byte(byte), BlockKind::New, "byte {byte}");
        }
    }
}
