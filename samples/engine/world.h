// The sample engine's world: entities in a scene, meshes by name, and a job system of two
// worker threads.
#pragma once

#include "aligned_allocator.h"

#include <k15/memory.h>

#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace engine {

struct Vec3 {
    float x = 0, y = 0, z = 0;
};

struct Mesh {
    std::string name;
    std::vector<Vec3> vertices;
};

struct Entity {
    int id = 0;
    char tag[16] = {};
    Vec3 position;
    Vec3 velocity;
    const Mesh* mesh = nullptr;  // owned by the world
};

class World {
public:
    World();
    ~World();

    Entity* spawn(int id, const char* tag);
    void despawn(int id);
    void load_sky();
    void step(float dt);
    float run_jobs(int job_count);
    std::size_t entity_count() const { return entities_.size(); }

private:
    std::map<int, Entity*> entities_;
    std::unordered_map<std::string, std::shared_ptr<Mesh>> meshes_;
    Vec3* sky_colors_ = nullptr;
};

}  // namespace engine
