// The engine allocators' C++ face (include/k15/engine.h) over the bridge's TrackedAllocator. Every
// entry point passes its own frame address, so the call stack starts at the user's function.

#include "k15/engine.h"
#include "k15-memory/rust/ffi.rs.h"

#include <cxxabi.h>

#include <cstdlib>
#include <string>

namespace k15::memory {

namespace {

inline std::size_t frame_of(void* frame_address) { return reinterpret_cast<std::size_t>(frame_address); }

#define K15_FRAME frame_of(__builtin_frame_address(0))

detail::TrackedAllocator* owned(rust::Box<detail::TrackedAllocator> allocator) {
    return allocator.into_raw();
}

// `typeid(T).name()` demangled ("engine::Particle"), or as given if it does not demangle.
std::string demangled(const char* mangled) {
    int status = 0;
    char* name = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
    std::string result = status == 0 && name != nullptr ? name : mangled;
    std::free(name);
    return result;
}

}  // namespace

EngineAllocator::~EngineAllocator() { rust::Box<detail::TrackedAllocator>::from_raw(impl_); }

void* EngineAllocator::allocate(std::size_t size, std::size_t align) noexcept {
    return detail::engine_allocate(*impl_, size, align, K15_FRAME);
}

void EngineAllocator::deallocate(void* ptr) noexcept {
    detail::engine_deallocate(*impl_, static_cast<std::uint8_t*>(ptr), K15_FRAME);
}

AllocatorStats EngineAllocator::stats() const noexcept {
    const detail::EngineStats s = detail::engine_stats(*impl_);
    return AllocatorStats{s.name, s.capacity, s.live_blocks, s.live_bytes, s.peak_bytes,
                          s.allocations, s.frees, s.failures};
}

const char* EngineAllocator::name() const noexcept { return detail::engine_stats(*impl_).name; }

namespace {
rust::Box<detail::TrackedAllocator> new_pool(const char* name, const ClassSpec* classes, std::size_t count) {
    std::vector<detail::EngineClassSpec> specs;
    for (std::size_t i = 0; classes != nullptr && i < count; ++i) {
        specs.push_back(detail::EngineClassSpec{classes[i].block_size, classes[i].block_count});
    }
    return detail::engine_new_pool(name, rust::Slice<const detail::EngineClassSpec>(specs.data(), specs.size()));
}
}  // namespace

PoolAllocator::PoolAllocator(const char* name, const ClassSpec* classes, std::size_t class_count)
    : EngineAllocator(owned(new_pool(name, classes, class_count))) {}

StackAllocator::StackAllocator(const char* name, std::size_t capacity)
    : EngineAllocator(owned(detail::engine_new_stack(name, capacity))) {}

Marker StackAllocator::marker() const noexcept {
    const detail::EngineMarker m = detail::engine_marker(*impl_);
    return Marker{m.allocator, m.top_allocation, m.top_serial};
}

void StackAllocator::rewind(Marker marker) noexcept {
    detail::engine_rewind(*impl_, detail::EngineMarker{marker.allocator, marker.top_allocation, marker.top_serial},
                          K15_FRAME);
}

BlockAllocator::BlockAllocator(const char* name, std::size_t capacity)
    : EngineAllocator(owned(detail::engine_new_block(name, capacity))) {}

namespace detail {

namespace {
rust::Box<TrackedAllocator> new_typed_pool(const char* name, const char* mangled_type, std::size_t size,
                                           std::size_t align, std::size_t first_batch) {
    const std::string type = demangled(mangled_type);
    return engine_new_typed_pool(name != nullptr ? name : type.c_str(), type.c_str(), size, align, first_batch);
}
}  // namespace

TypedPoolBase::TypedPoolBase(const char* name, const char* mangled_type, std::size_t size, std::size_t align,
                             std::size_t first_batch)
    : EngineAllocator(owned(new_typed_pool(name, mangled_type, size, align, first_batch))) {}

// `frame` is the frame of TypedPool<T>::create/destroy, so the stack starts at their caller.
void* TypedPoolBase::allocate_object(void* frame) noexcept {
    return engine_allocate(*impl_, 0, 1, frame_of(frame));
}

void TypedPoolBase::release_object(void* object, void* frame) noexcept {
    engine_deallocate(*impl_, static_cast<std::uint8_t*>(object), frame_of(frame));
}

bool TypedPoolBase::holds_live_object(const void* object) const noexcept {
    return engine_holds_live_object(*impl_, reinterpret_cast<std::size_t>(object));
}

}  // namespace detail

AllocatorIdentity allocator_of(const void* ptr) noexcept {
    const detail::EngineIdentity id = detail::engine_allocator_of(reinterpret_cast<std::size_t>(ptr));
    return AllocatorIdentity{id.name, static_cast<AllocatorKind>(id.kind), id.element_type};
}

const char* type_of(const void* ptr) noexcept {
    const char* type = detail::engine_allocator_of(reinterpret_cast<std::size_t>(ptr)).element_type;
    return type != nullptr ? type : "unknown";
}

Checkpoint checkpoint() noexcept { return Checkpoint{detail::engine_checkpoint()}; }

LeakSummary leaks_since(Checkpoint since) {
    LeakSummary summary;
    for (const detail::EngineLeaks& leaks : detail::engine_leaks_since(since.epoch)) {
        summary.blocks += leaks.blocks;
        summary.bytes += leaks.bytes;
        summary.allocators.push_back(AllocatorLeaks{leaks.name, leaks.blocks, leaks.bytes});
    }
    return summary;
}

MemStats memstats(bool reset) noexcept {
    const detail::EngineMemStats s = detail::engine_memstats(reset);
    return MemStats{s.allocations, s.frees, s.failures, s.live_blocks, s.live_bytes};
}

}  // namespace k15::memory
