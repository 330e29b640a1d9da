// Dear ImGui through include/k15/imgui.h with its context kept until exit (as most programs do):
// ImGui's global holds the context, which holds every other block, so nothing is lost.

#include <k15/imgui.h>

int main() {
    k15::memory::install_imgui_hooks();
    ImGui::CreateContext();
    ImGuiIO& io = ImGui::GetIO();
    io.DisplaySize = ImVec2(1280, 720);
    unsigned char* pixels = nullptr;
    int width = 0, height = 0;
    io.Fonts->GetTexDataAsRGBA32(&pixels, &width, &height);
    for (int frame = 0; frame < 2; ++frame) {
        ImGui::NewFrame();
        ImGui::Begin("Kept");
        ImGui::Text("frame %d", frame);
        ImGui::End();
        ImGui::Render();
    }
    return width > 0 ? 0 : 1;
}
