//! Memory for the engine allocators' own data, taken from the tracker's own heap
//! (`sys::own_heap::OwnAlloc`): never from the global allocator nor the process's `malloc` (the
//! tracker's).

use crate::sys::own_heap::OwnAlloc as System;
use std::alloc::{GlobalAlloc, Layout};
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

/// A zero-filled byte region from `System`, released on drop.
pub(crate) struct SystemChunk {
    base: NonNull<u8>,
    layout: Layout,
}

impl SystemChunk {
    /// `None` when `size` is 0, the layout is invalid or `System` is out of memory.
    pub(crate) fn zeroed(size: usize, align: usize) -> Option<Self> {
        let layout = Layout::from_size_align(size, align).ok()?;
        if size == 0 {
            return None;
        }
        // SAFETY: the layout has a non-zero size.
        let base = NonNull::new(unsafe { System.alloc_zeroed(layout) })?;
        Some(Self { base, layout })
    }

    pub(crate) fn base(&self) -> *mut u8 {
        self.base.as_ptr()
    }

    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.layout.size()
    }

    /// Offset of `addr` from the start of the region, if it lies inside.
    #[inline]
    pub(crate) fn offset_of(&self, addr: usize) -> Option<usize> {
        let offset = addr.checked_sub(self.base.as_ptr() as usize)?;
        (offset < self.len()).then_some(offset)
    }
}

impl Drop for SystemChunk {
    fn drop(&mut self) {
        // SAFETY: `base` came from `System.alloc_zeroed` with this same layout.
        unsafe { System.dealloc(self.base.as_ptr(), self.layout) }
    }
}

// SAFETY: the region is plain bytes owned by this value; its owners synchronise access to it.
unsafe impl Send for SystemChunk {}
// SAFETY: as above; `&SystemChunk` only exposes the address and the length.
unsafe impl Sync for SystemChunk {}

/// A fixed-length array in `System` memory (a `Box<[T]>` that bypasses the global allocator).
pub(crate) struct SystemSlice<T> {
    items: NonNull<T>,
    len: usize,
}

impl<T> SystemSlice<T> {
    /// Builds `len` items with `make(index)`; `None` when `len` is 0, `System` is out of memory or `make` fails.
    pub(crate) fn try_from_fn(
        len: usize,
        mut make: impl FnMut(usize) -> Option<T>,
    ) -> Option<Self> {
        let layout = Layout::array::<T>(len).ok()?;
        if layout.size() == 0 {
            return None;
        }
        // SAFETY: the layout has a non-zero size.
        let items = NonNull::new(unsafe { System.alloc(layout) }.cast::<T>())?;
        for index in 0..len {
            let Some(item) = make(index) else {
                // SAFETY: items `0..index` were initialised just above; the layout matches the allocation.
                unsafe {
                    std::ptr::drop_in_place(std::ptr::slice_from_raw_parts_mut(
                        items.as_ptr(),
                        index,
                    ));
                    System.dealloc(items.as_ptr().cast(), layout);
                }
                return None;
            };
            // SAFETY: `index < len` lies inside the allocation, which is aligned for `T`.
            unsafe { items.as_ptr().add(index).write(item) };
        }
        Some(Self { items, len })
    }
}

impl<T> Deref for SystemSlice<T> {
    type Target = [T];
    #[inline]
    fn deref(&self) -> &[T] {
        // SAFETY: `len` items were initialised in `from_fn` and live until drop.
        unsafe { std::slice::from_raw_parts(self.items.as_ptr(), self.len) }
    }
}

impl<T> DerefMut for SystemSlice<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as in `deref`, and `&mut self` makes the access unique.
        unsafe { std::slice::from_raw_parts_mut(self.items.as_ptr(), self.len) }
    }
}

impl<T> Drop for SystemSlice<T> {
    fn drop(&mut self) {
        // SAFETY: the items are initialised and dropped exactly once; the layout matches `from_fn`.
        unsafe {
            std::ptr::drop_in_place(std::ptr::slice_from_raw_parts_mut(
                self.items.as_ptr(),
                self.len,
            ));
            let layout = Layout::array::<T>(self.len).unwrap_unchecked();
            System.dealloc(self.items.as_ptr().cast(), layout);
        }
    }
}

// SAFETY: `SystemSlice<T>` owns its items like `Box<[T]>` does.
unsafe impl<T: Send> Send for SystemSlice<T> {}
// SAFETY: as above.
unsafe impl<T: Sync> Sync for SystemSlice<T> {}

/// One value at a stable address in `System` memory (a `Box<T>` that bypasses the global allocator).
pub(crate) struct SystemBox<T>(SystemSlice<T>);

impl<T> SystemBox<T> {
    pub(crate) fn new(value: T) -> Option<Self> {
        let mut value = Some(value);
        SystemSlice::try_from_fn(1, |_| value.take()).map(Self)
    }
}

impl<T> Deref for SystemBox<T> {
    type Target = T;
    #[inline]
    fn deref(&self) -> &T {
        // SAFETY: a `SystemBox` holds exactly one initialised item (`new`), so no bounds check is needed.
        unsafe { &*self.0.items.as_ptr() }
    }
}

impl<T> DerefMut for SystemBox<T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.0[0]
    }
}
