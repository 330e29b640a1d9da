// Dear ImGui (Debian's libimgui-dev) with its allocations routed into the tracker: one frame of
// a debug window is built and rendered, the context is destroyed, and one block the program took
// from ImGui's allocator is never given back (the deliberate leak, "language": "imgui").
//
//   g++ -std=c++17 -g -I include -I /usr/include/imgui samples/imgui/main.cpp
//       target/release/libk15_memory.a -limgui -lstb -lpthread -ldl -o imgui_sample   (one line)

#include <k15/imgui.h>

#include <cstdio>

namespace {

void draw_debug_window(int frame) {
    ImGui::Begin("Memory");
    ImGui::Text("frame %d", frame);
    const auto stats = k15::memory::stats();
    ImGui::Text("live blocks %llu", static_cast<unsigned long long>(stats.live_blocks));
    if (ImGui::TreeNode("details")) {
        ImGui::BulletText("peak bytes %llu", static_cast<unsigned long long>(stats.peak_bytes));
        ImGui::TreePop();
    }
    ImGui::End();
}

}  // namespace

int main() {
    k15::memory::install_imgui_hooks();
    ImGui::CreateContext();
    ImGuiIO& io = ImGui::GetIO();
    io.DisplaySize = ImVec2(1280, 720);
    unsigned char* pixels = nullptr;
    int width = 0, height = 0;
    io.Fonts->GetTexDataAsRGBA32(&pixels, &width, &height);
    for (int frame = 0; frame < 3; ++frame) {
        ImGui::NewFrame();
        draw_debug_window(frame);
        ImGui::Render();
    }
    const auto during = k15::memory::stats();
    k15::memory::write_leak_report("imgui_running.log");
    ImGui::DestroyContext();
    void* scratch = ImGui::MemAlloc(333);  // LEAK: taken from ImGui's allocator, never freed
    const auto after = k15::memory::stats();
    std::printf("font atlas %dx%d, live blocks while running %llu, after %llu (%p)\n", width, height,
                static_cast<unsigned long long>(during.live_blocks),
                static_cast<unsigned long long>(after.live_blocks), scratch);
}
