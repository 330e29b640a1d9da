#include "world.h"

#include <cmath>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>

namespace engine {

World::World() {
    auto cube = std::make_shared<Mesh>();
    cube->name = "cube";
    for (int i = 0; i < 8; ++i) cube->vertices.push_back(Vec3{float(i & 1), float((i >> 1) & 1), float(i >> 2)});
    meshes_.emplace(cube->name, cube);
}

World::~World() {
    for (auto& [id, entity] : entities_) delete entity;
    // LEAK 1 (deliberate): the sky colour table from load_sky() is never delete[]d here.
}

Entity* World::spawn(int id, const char* tag) {
    Entity* entity = K15_NEW Entity;
    entity->id = id;
    std::strncpy(entity->tag, tag, sizeof entity->tag - 1);
    entity->mesh = meshes_.at("cube").get();
    entities_[id] = entity;
    return entity;
}

void World::despawn(int id) {
    auto found = entities_.find(id);
    if (found == entities_.end()) return;
    // LEAK 2 (deliberate): the entity is taken out of the scene but never deleted.
    entities_.erase(found);
}

void World::load_sky() { sky_colors_ = K15_NEW Vec3[64]; }

void World::step(float dt) {
    for (auto& [id, entity] : entities_) {
        entity->velocity.y -= 9.81f * dt;
        entity->position.y += entity->velocity.y * dt;
    }
}

float World::run_jobs(int job_count) {
    std::mutex results_lock;
    float total = 0;
    std::vector<std::function<float()>> jobs;
    for (int j = 0; j < job_count; ++j) {
        jobs.emplace_back([j] {
            AlignedArray<float> samples;
            for (int i = 0; i < 100; ++i) samples.push_back(std::sin(float(i + j)));
            float sum = 0;
            for (std::size_t i = 0; i < samples.size(); ++i) sum += samples[i];
            if (j == 3) {
                // LEAK 3 (deliberate): one job keeps its sample buffer and nobody frees it.
                static_cast<void>(samples.release());
            }
            return sum;
        });
    }
    auto worker = [&](int first) {
        for (int j = first; j < job_count; j += 2) {
            float value = jobs[j]();
            std::lock_guard<std::mutex> guard(results_lock);
            total += value;
        }
    };
    std::thread a(worker, 0), b(worker, 1);
    a.join();
    b.join();
    return total;
}

}  // namespace engine
