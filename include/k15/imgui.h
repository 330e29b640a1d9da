// k15-memory for Dear ImGui: route ImGui's allocations (ImGui::MemAlloc/MemFree: every vector,
// font atlas and window of its contexts) into the tracker, so they appear in the leak log as
// "language": "imgui" with the stack that allocated them.
//
// Call k15::memory::install_imgui_hooks() before ImGui::CreateContext(). Needs ImGui's headers
// (-I/usr/include/imgui with Debian's libimgui-dev); nothing else of k15-memory depends on ImGui.
#pragma once

#include <k15/memory.h>

#include <imgui.h>

#include <cstddef>

namespace k15::memory {

#if defined(K15_MEMORY_DISABLED)

inline void install_imgui_hooks() {}

#else

namespace detail {
inline void* imgui_allocate(std::size_t size, void*) { return allocate(size, 0, "imgui"); }
inline void imgui_free(void* block, void*) { deallocate(block); }
}  // namespace detail

inline void install_imgui_hooks() { ImGui::SetAllocatorFunctions(detail::imgui_allocate, detail::imgui_free); }

#endif

}  // namespace k15::memory
