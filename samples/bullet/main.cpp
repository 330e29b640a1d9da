// A real Bullet world (Debian's libbullet-dev): a static ground box and a falling sphere,
// stepped for two seconds and then torn down completely, except for one deliberately leaked
// collision shape. Bullet's allocations are tracked through install_bullet_hooks().
//
//   g++ -std=c++17 -g -I include -I /usr/include/bullet samples/bullet/main.cpp
//       target/release/libk15_memory.a -lBulletDynamics -lBulletCollision -lLinearMath
//       -lpthread -ldl -o bullet_world
#include <k15/bullet.h>
#include <k15/memory.h>

#include <btBulletDynamicsCommon.h>

#include <cstdio>

namespace {

// LEAK (deliberate): a debris shape made for a body that is never created; nobody deletes it.
[[gnu::noinline]] btCollisionShape* make_debris_shape() {
    return new btSphereShape(0.25f);  // the leaked shape
}

btRigidBody* make_body(btCollisionShape* shape, btScalar mass, const btVector3& origin) {
    btVector3 inertia(0, 0, 0);
    if (mass != 0) shape->calculateLocalInertia(mass, inertia);
    btTransform transform;
    transform.setIdentity();
    transform.setOrigin(origin);
    auto* motion = new btDefaultMotionState(transform);
    return new btRigidBody(btRigidBody::btRigidBodyConstructionInfo(mass, motion, shape, inertia));
}

}  // namespace

int main() {
    k15::memory::install_bullet_hooks();

    auto* configuration = new btDefaultCollisionConfiguration();
    auto* dispatcher = new btCollisionDispatcher(configuration);
    auto* broadphase = new btDbvtBroadphase();
    auto* solver = new btSequentialImpulseConstraintSolver();
    auto* world = new btDiscreteDynamicsWorld(dispatcher, broadphase, solver, configuration);
    world->setGravity(btVector3(0, -10, 0));

    btCollisionShape* ground_shape = new btBoxShape(btVector3(50, 1, 50));
    btCollisionShape* ball_shape = new btSphereShape(1);
    btRigidBody* ground = make_body(ground_shape, 0, btVector3(0, -1, 0));
    btRigidBody* ball = make_body(ball_shape, 1, btVector3(0, 10, 0));
    world->addRigidBody(ground);
    world->addRigidBody(ball);
    btCollisionShape* debris = make_debris_shape();
    static_cast<void>(debris);

    for (int i = 0; i < 120; ++i) world->stepSimulation(1.0f / 60.0f, 10);
    btTransform resting;
    ball->getMotionState()->getWorldTransform(resting);
    std::printf("bullet: ball rests at y=%.2f\n", static_cast<double>(resting.getOrigin().getY()));

    for (btRigidBody* body : {ball, ground}) {
        world->removeRigidBody(body);
        delete body->getMotionState();
        delete body;
    }
    delete ball_shape;
    delete ground_shape;
    delete world;
    delete solver;
    delete broadphase;
    delete dispatcher;
    delete configuration;
    return 0;
}
