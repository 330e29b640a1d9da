//! Size classes: the pool's class table and smallest-fitting-class lookup, and the slot rounding shared with typed pools.

/// Most classes a pool may have.
pub const MAX_CLASSES: usize = 64;

/// One size class of a pool: `block_count` blocks of `block_size` bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClassSpec {
    pub block_size: usize,
    pub block_count: usize,
}

/// The note's table: powers of two from 8 bytes to 1 MiB, 256 KiB of blocks per class (at least 2 blocks).
pub const DEFAULT_CLASSES: [ClassSpec; 18] = default_classes();

const fn default_classes() -> [ClassSpec; 18] {
    let mut classes = [ClassSpec {
        block_size: 0,
        block_count: 0,
    }; 18];
    let mut index = 0;
    while index < classes.len() {
        let block_size = 8 << index;
        let per_class = (256 << 10) / block_size;
        classes[index] = ClassSpec {
            block_size,
            block_count: if per_class < 2 { 2 } else { per_class },
        };
        index += 1;
    }
    classes
}

/// Smallest size that holds the free-list link a free slot stores in itself.
pub(crate) const MIN_SLOT: usize = 8;

/// Slot size for objects of `size` bytes aligned to `align`: a multiple of `align`, at least [`MIN_SLOT`].
pub(crate) fn slot_size(size: usize, align: usize) -> usize {
    size.max(MIN_SLOT).next_multiple_of(align.max(MIN_SLOT))
}

/// Largest power of two dividing `slot_size`: the alignment every slot of a suitably aligned array has.
pub(crate) fn natural_alignment(slot_size: usize) -> usize {
    1 << slot_size.trailing_zeros()
}

const SMALL_LIMIT: usize = 1024;
const NO_CLASS: u8 = u8::MAX;

/// Maps a request size to the smallest class that holds it: a table for small sizes, binary search above.
pub(crate) struct SizeClassMap {
    small: [u8; SMALL_LIMIT / MIN_SLOT + 1],
    sizes: [usize; MAX_CLASSES],
    len: usize,
}

impl SizeClassMap {
    /// `block_sizes` must be strictly ascending and at most [`MAX_CLASSES`] long.
    pub(crate) fn new(block_sizes: impl Iterator<Item = usize>) -> Self {
        let mut map = Self {
            small: [NO_CLASS; SMALL_LIMIT / MIN_SLOT + 1],
            sizes: [0; MAX_CLASSES],
            len: 0,
        };
        for size in block_sizes {
            map.sizes[map.len] = size;
            map.len += 1;
        }
        for slot in 0..map.small.len() {
            if let Some(found) = map.search(slot * MIN_SLOT) {
                map.small[slot] = found as u8;
            }
        }
        map
    }

    fn search(&self, size: usize) -> Option<usize> {
        let index = self.sizes[..self.len].partition_point(|&block_size| block_size < size);
        (index < self.len).then_some(index)
    }

    /// The smallest class that holds `size`, from the table; `None` above [`SMALL_LIMIT`] or when no class
    /// holds it.
    #[inline]
    pub(crate) fn small_class(&self, size: usize) -> Option<usize> {
        let class = *self.small.get(size.div_ceil(MIN_SLOT))?;
        (class != NO_CLASS).then_some(class as usize)
    }

    pub(crate) fn class_of(&self, size: usize) -> Option<usize> {
        if size <= SMALL_LIMIT {
            self.small_class(size)
        } else {
            self.search(size)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smallest_fitting_class() {
        let map = SizeClassMap::new([8, 24, 64, 2048].into_iter());
        assert_eq!(map.class_of(0), Some(0));
        assert_eq!(map.class_of(8), Some(0));
        assert_eq!(map.class_of(9), Some(1));
        assert_eq!(map.class_of(64), Some(2));
        assert_eq!(map.class_of(65), Some(3));
        assert_eq!(map.class_of(1024), Some(3));
        assert_eq!(map.class_of(2048), Some(3));
        assert_eq!(map.class_of(2049), None);
    }

    #[test]
    fn default_table_spans_8_bytes_to_1_mib() {
        assert_eq!(
            DEFAULT_CLASSES[0],
            ClassSpec {
                block_size: 8,
                block_count: 32768
            }
        );
        assert_eq!(
            DEFAULT_CLASSES[17],
            ClassSpec {
                block_size: 1 << 20,
                block_count: 2
            }
        );
    }

    #[test]
    fn slots_hold_a_link_and_keep_alignment() {
        assert_eq!(slot_size(1, 1), 8);
        assert_eq!(slot_size(12, 4), 16);
        assert_eq!(slot_size(40, 32), 64);
        assert_eq!(natural_alignment(48), 16);
    }
}
