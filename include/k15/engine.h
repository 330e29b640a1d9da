// k15-memory engine allocators: pool, stack, block and typed pools in preallocated memory, all
// reporting into the same leak log (under the allocator's own name, with the allocating call
// stack) and the same memory errors (bad frees are reported on stderr and survived).
//
// Link libk15_memory.a as for memory.h. The allocators are not copyable or movable; keep them
// alive as long as their blocks (blocks still live when an allocator is destroyed are reported as
// leaks). Allocation failure (pool class or arena exhausted) returns nullptr.
//
// -DK15_MEMORY_DISABLED (also implied by sanitizer builds): the same classes over plain
// posix_memalign/free and new/delete, no library needed, so engine code still builds and runs (and
// a sanitizer or valgrind sees every block).
#pragma once

#include "k15/memory.h"

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <typeinfo>
#include <utility>
#include <vector>

namespace k15 {
namespace memory {

// Counters of one allocator; bytes are the sizes callers asked for.
struct AllocatorStats {
    const char* name = "";
    std::uint64_t capacity = 0;  // bytes of memory the allocator manages
    std::uint64_t live_blocks = 0;
    std::uint64_t live_bytes = 0;
    std::uint64_t peak_bytes = 0;
    std::uint64_t allocations = 0;
    std::uint64_t frees = 0;
    std::uint64_t failures = 0;  // allocations that returned nullptr
};

// One pool size class: block_count blocks of block_size bytes (a multiple of 8).
struct ClassSpec {
    std::size_t block_size;
    std::size_t block_count;
};

// A position of a StackAllocator to rewind to.
struct Marker {
    std::uint32_t allocator;
    std::uint32_t top_allocation;
    std::uint32_t top_serial;
};

enum class AllocatorKind : std::uint8_t { unknown, pool, stack, block, typed_pool };

// Which engine allocator holds `ptr` (any address inside its memory).
struct AllocatorIdentity {
    const char* name;  // "unknown" when none does
    AllocatorKind kind;
    const char* type;  // the element type of a typed pool, else nullptr
};

// The start of an epoch for leaks_since().
struct Checkpoint {
    std::uint32_t epoch;
};

struct AllocatorLeaks {
    const char* name;
    std::uint64_t blocks;
    std::uint64_t bytes;
};

// Blocks allocated since `since` and still live, in all and per allocator: each engine allocator by
// its name, and the tracked blocks (new, malloc, ... of the program and its libraries) by their
// allocation function ("new", "new[]", "malloc", ...).
struct LeakSummary {
    std::uint64_t blocks = 0;
    std::uint64_t bytes = 0;
    std::vector<AllocatorLeaks> allocators;
};

// Engine allocation events since the last memstats(true), and what is live now: reset, run a frame
// loop, and expect allocations == 0 for a steady state.
struct MemStats {
    std::uint64_t allocations = 0;
    std::uint64_t frees = 0;
    std::uint64_t failures = 0;
    std::uint64_t live_blocks = 0;
    std::uint64_t live_bytes = 0;
};

}  // namespace memory
}  // namespace k15

#if !defined(K15_MEMORY_DISABLED)

namespace k15 {
namespace memory {

namespace detail {
struct TrackedAllocator;  // the Rust object behind each allocator
}  // namespace detail


// What every allocator offers. deallocate(nullptr) does nothing; a pointer the allocator does not
// own, a pointer inside a block, a double free and (stack) a free out of LIFO order are reported
// as memory errors and change nothing.
class EngineAllocator {
public:
    EngineAllocator(const EngineAllocator&) = delete;
    EngineAllocator& operator=(const EngineAllocator&) = delete;
    ~EngineAllocator();

    void* allocate(std::size_t size, std::size_t align = alignof(std::max_align_t)) noexcept;
    void deallocate(void* ptr) noexcept;
    AllocatorStats stats() const noexcept;
    const char* name() const noexcept;

protected:
    explicit EngineAllocator(detail::TrackedAllocator* impl) noexcept : impl_(impl) {}
    detail::TrackedAllocator* impl_;
};


// Size classes carved from one chunk allocated up front; thread-safe. No classes: the default
// table (8 bytes to 1 MiB). Throws std::exception if the table is invalid or memory is short.
class PoolAllocator : public EngineAllocator {
public:
    explicit PoolAllocator(const char* name, const ClassSpec* classes = nullptr, std::size_t class_count = 0);
};


// A bump allocator in one block of `capacity` bytes: free the top block only, or rewind to a marker.
class StackAllocator : public EngineAllocator {
public:
    StackAllocator(const char* name, std::size_t capacity);
    Marker marker() const noexcept;
    // Frees everything allocated after `marker`; a stale or foreign marker is reported.
    void rewind(Marker marker) noexcept;
};

// Any sizes in any order in one arena of `capacity` bytes (TLSF: O(1), coalescing); thread-safe.
class BlockAllocator : public EngineAllocator {
public:
    BlockAllocator(const char* name, std::size_t capacity);
};

namespace detail {
// The untyped part of TypedPool<T>: slots of one size and alignment.
class TypedPoolBase : EngineAllocator {
public:
    TypedPoolBase(const char* name, const char* mangled_type, std::size_t size, std::size_t align,
                  std::size_t first_batch);
    void* allocate_object(void* frame) noexcept;
    void release_object(void* object, void* frame) noexcept;
    bool holds_live_object(const void* object) const noexcept;
    using EngineAllocator::name;
    using EngineAllocator::stats;
};
}  // namespace detail

// Objects of one type reused from free lists that grow in doubling batches; thread-safe. The pool
// is named `name`, or the demangled type name when that is null; type_of() gives the type name.
template <class T>
class TypedPool {
public:
    explicit TypedPool(const char* name = nullptr, std::size_t first_batch = 64)
        : base_(name, typeid(T).name(), sizeof(T), alignof(T), first_batch) {}

    // A new T(args...) in a recycled slot; throws std::bad_alloc if the pool cannot grow.
    template <class... Args>
    [[gnu::noinline]] T* create(Args&&... args) {
        void* slot = base_.allocate_object(__builtin_frame_address(0));
        if (slot == nullptr) throw std::bad_alloc();
        try {
            return ::new (slot) T(std::forward<Args>(args)...);
        } catch (...) {
            base_.release_object(slot, __builtin_frame_address(0));
            throw;
        }
    }

    // Destroys and recycles an object of this pool; any other pointer is reported, not destroyed.
    [[gnu::noinline]] void destroy(T* object) noexcept {
        if (object != nullptr && base_.holds_live_object(object)) object->~T();
        base_.release_object(object, __builtin_frame_address(0));
    }

    AllocatorStats stats() const noexcept { return base_.stats(); }
    const char* name() const noexcept { return base_.name(); }

private:
    detail::TypedPoolBase base_;
};



AllocatorIdentity allocator_of(const void* ptr) noexcept;

// The element type of the typed pool holding `ptr`, or "unknown".
const char* type_of(const void* ptr) noexcept;

// A checkpoint over every block: the engine allocators' and every tracked block. It walks the live
// blocks once with the threads stopped (the heap checked on the way, as check_heap() does).
Checkpoint checkpoint() noexcept;

// What was allocated after `since` (from checkpoint()) and is still live. Checkpoint{0} (not from
// checkpoint()) covers the engine allocators' live blocks only.
LeakSummary leaks_since(Checkpoint since);


MemStats memstats(bool reset = false) noexcept;

}  // namespace memory
}  // namespace k15

#else  // K15_MEMORY_DISABLED: the same interface over the C++ runtime's own allocation

namespace k15 {
namespace memory {

// Zeros under a name (C++11 has no aggregate initialization of a struct with member defaults).
inline AllocatorStats stats_named(const char* name) noexcept {
    AllocatorStats stats;
    stats.name = name;
    return stats;
}

class EngineAllocator {
public:
    EngineAllocator(const EngineAllocator&) = delete;
    EngineAllocator& operator=(const EngineAllocator&) = delete;
    void* allocate(std::size_t size, std::size_t align = alignof(std::max_align_t)) noexcept {
        align = align < alignof(std::max_align_t) ? alignof(std::max_align_t) : align;
        void* block = nullptr;
        return posix_memalign(&block, align, size) == 0 ? block : nullptr;  // C++11: no std::aligned_alloc
    }
    void deallocate(void* ptr) noexcept { std::free(ptr); }
    AllocatorStats stats() const noexcept { return stats_named(name_); }
    const char* name() const noexcept { return name_; }

protected:
    explicit EngineAllocator(const char* name) noexcept : name_(name) {}
    const char* name_;
};

class PoolAllocator : public EngineAllocator {
public:
    explicit PoolAllocator(const char* name, const ClassSpec* = nullptr, std::size_t = 0) : EngineAllocator(name) {}
};

class StackAllocator : public EngineAllocator {
public:
    StackAllocator(const char* name, std::size_t) : EngineAllocator(name) {}
    ~StackAllocator() { rewind(Marker{0, 0, 0}); }
    void* allocate(std::size_t size, std::size_t align = alignof(std::max_align_t)) noexcept {
        void* block = EngineAllocator::allocate(size, align);
        if (block != nullptr) blocks_.push_back(block);
        return block;
    }
    void deallocate(void* ptr) noexcept {
        if (!blocks_.empty() && blocks_.back() == ptr) {
            blocks_.pop_back();
            EngineAllocator::deallocate(ptr);
        }
    }
    Marker marker() const noexcept { return Marker{0, static_cast<std::uint32_t>(blocks_.size()), 0}; }
    void rewind(Marker marker) noexcept {
        while (blocks_.size() > marker.top_allocation) {
            EngineAllocator::deallocate(blocks_.back());
            blocks_.pop_back();
        }
    }

private:
    std::vector<void*> blocks_;
};


class BlockAllocator : public EngineAllocator {
public:
    BlockAllocator(const char* name, std::size_t) : EngineAllocator(name) {}
};

template <class T>
class TypedPool {
public:
    explicit TypedPool(const char* name = nullptr, std::size_t = 64) : name_(name ? name : typeid(T).name()) {}
    template <class... Args>
    T* create(Args&&... args) {
        return new T(std::forward<Args>(args)...);
    }
    void destroy(T* object) noexcept { delete object; }
    AllocatorStats stats() const noexcept { return stats_named(name_); }
    const char* name() const noexcept { return name_; }

private:
    const char* name_;
};

inline AllocatorIdentity allocator_of(const void*) noexcept { return AllocatorIdentity{"unknown", AllocatorKind::unknown, nullptr}; }
inline const char* type_of(const void*) noexcept { return "unknown"; }
inline Checkpoint checkpoint() noexcept { return Checkpoint{0}; }
inline LeakSummary leaks_since(Checkpoint) { return LeakSummary{}; }
inline MemStats memstats(bool = false) noexcept { return MemStats{}; }

}  // namespace memory
}  // namespace k15

#endif

namespace k15 {
namespace memory {

// Rewinds its StackAllocator to where it was at construction.
class StackScope {
public:
    explicit StackScope(StackAllocator& stack) noexcept : stack_(stack), marker_(stack.marker()) {}
    StackScope(const StackScope&) = delete;
    StackScope& operator=(const StackScope&) = delete;
    ~StackScope() { stack_.rewind(marker_); }

private:
    StackAllocator& stack_;
    Marker marker_;
};

}  // namespace memory
}  // namespace k15
