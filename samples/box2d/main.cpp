// A Box2D world on Debian's libbox2d-dev, whose b2Alloc is malloc: a stack of boxes falls on the
// ground and the world is torn down properly; one piece of debris lives in a world of its own
// that is never destroyed (the deliberate leak: the world, and the Box2D blocks under it).
//
//   g++ -std=c++17 -g -I include samples/box2d/main.cpp target/release/libk15_memory.a
//       -lbox2d -lpthread -ldl -o box2d_sample   (one line)
//   K15_MEMORY_OPTIONS=malloc=1 ./box2d_sample && cat k15_leaks.log

#include <k15/memory.h>

#include <box2d/box2d.h>

#include <cstdio>

namespace {

b2Body* add_box(b2World& world, float x, float y, b2BodyType type, float half_width) {
    b2BodyDef body_def;
    body_def.type = type;
    body_def.position.Set(x, y);
    b2Body* body = world.CreateBody(&body_def);
    b2PolygonShape shape;
    shape.SetAsBox(half_width, 0.5f);
    body->CreateFixture(&shape, 1.0f);
    return body;
}

float settle_stack(int boxes) {
    b2World world(b2Vec2(0.0f, -10.0f));
    add_box(world, 0.0f, -0.5f, b2_staticBody, 50.0f);
    b2Body* top = nullptr;
    for (int i = 0; i < boxes; ++i) top = add_box(world, 0.0f, 1.0f + 1.1f * i, b2_dynamicBody, 0.5f);
    for (int step = 0; step < 120; ++step) world.Step(1.0f / 60.0f, 8, 3);
    return top->GetPosition().y;
}

b2World* spawn_debris() {
    auto* debris_world = new b2World(b2Vec2(0.0f, -10.0f));
    add_box(*debris_world, 3.0f, 4.0f, b2_dynamicBody, 0.25f);  // LEAK: the world is never deleted
    return debris_world;
}

}  // namespace

int main() {
    std::printf("top of the stack settled at %.2f\n", settle_stack(10));
    b2World* debris = spawn_debris();
    debris->Step(1.0f / 60.0f, 8, 3);
    std::printf("debris bodies: %d\n", debris->GetBodyCount());
}
