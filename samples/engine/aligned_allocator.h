// A templated, aligned container allocator in the style of Bullet's btAlignedAllocator.h.
// Every allocation made through it reports this header's file and line, which is why the
// leak log also carries the call stack that reached it.
#pragma once

#include <k15/memory.h>

#include <cstddef>
#include <new>
#include <utility>

namespace engine {

template <typename T, std::size_t Alignment = 16>
struct AlignedAllocator {
    static T* allocate(std::size_t count) {
#if defined(K15_MEMORY_DISABLED)
        return static_cast<T*>(::operator new(count * sizeof(T), std::align_val_t{Alignment}));
#else
        return static_cast<T*>(::operator new(count * sizeof(T), std::align_val_t{Alignment}, __FILE__, __LINE__));
#endif
    }
    static void deallocate(T* block) { ::operator delete(block, std::align_val_t{Alignment}); }
};

// A growable array of trivially copyable values, like btAlignedObjectArray.
template <typename T, std::size_t Alignment = 16>
class AlignedArray {
public:
    AlignedArray() = default;
    AlignedArray(const AlignedArray&) = delete;
    AlignedArray& operator=(const AlignedArray&) = delete;
    ~AlignedArray() { AlignedAllocator<T, Alignment>::deallocate(data_); }

    void push_back(const T& value) {
        if (size_ == capacity_) grow(capacity_ == 0 ? 4 : capacity_ * 2);
        data_[size_++] = value;
    }
    std::size_t size() const { return size_; }
    T& operator[](std::size_t i) { return data_[i]; }
    const T& operator[](std::size_t i) const { return data_[i]; }

    // Hands the buffer to the caller, who must give it back to AlignedAllocator.
    T* release() { return std::exchange(data_, nullptr); }

private:
    void grow(std::size_t capacity) {
        T* bigger = AlignedAllocator<T, Alignment>::allocate(capacity);
        for (std::size_t i = 0; i < size_; ++i) bigger[i] = data_[i];
        AlignedAllocator<T, Alignment>::deallocate(data_);
        data_ = bigger;
        capacity_ = capacity;
    }

    T* data_ = nullptr;
    std::size_t size_ = 0;
    std::size_t capacity_ = 0;
};

}  // namespace engine
