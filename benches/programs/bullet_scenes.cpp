// Bullet physics scenes loaded, stepped and unloaded as a game changes levels: the second real
// suite of benches/real_code.rs. Debian's source package of Bullet leaves out upstream's
// examples/ (BenchmarkDemo among them), so this program plays their part: box towers, ragdolls,
// convex hulls, primitives and rays over a triangle-mesh terrain, cloth and pressure soft bodies,
// Featherstone chains, and bodies spawned and removed while the world runs. Every allocation is
// Bullet's own (btAlignedAlloc over malloc, new of its objects) or this driver's, from many sites
// in many layers of the library.
//
// Usage: bullet_scenes [rounds]  (each round runs every scene once; prints a checksum so that
// the work cannot be optimized away and every variant can be seen to compute the same).
#include <btBulletDynamicsCommon.h>

#include <BulletCollision/CollisionShapes/btShapeHull.h>
#include <BulletDynamics/Featherstone/btMultiBody.h>
#include <BulletDynamics/Featherstone/btMultiBodyConstraintSolver.h>
#include <BulletDynamics/Featherstone/btMultiBodyDynamicsWorld.h>
#include <BulletDynamics/Featherstone/btMultiBodyLinkCollider.h>
#include <BulletSoftBody/btSoftBodyHelpers.h>
#include <BulletSoftBody/btSoftBodyRigidBodyCollisionConfiguration.h>
#include <BulletSoftBody/btSoftRigidDynamicsWorld.h>

#include <cstdio>
#include <cstdlib>
#include <deque>
#include <vector>

namespace {

// The same numbers in every run, so that every variant simulates the same scenes.
struct Random {
  unsigned state = 12345;
  btScalar next(btScalar lo, btScalar hi) {
    state = state * 1664525u + 1013904223u;
    return lo + (hi - lo) * btScalar(state >> 8) / btScalar(1u << 24);
  }
};

enum class WorldKind { Rigid, Soft, MultiBody };

const btScalar kStep = btScalar(1.0 / 60.0);

// One level: a world and everything in it, all deleted when the level ends.
class Level {
 public:
  explicit Level(WorldKind kind) {
    if (kind == WorldKind::Soft) {
      config_ = new btSoftBodyRigidBodyCollisionConfiguration();
    } else {
      config_ = new btDefaultCollisionConfiguration();
    }
    dispatcher_ = new btCollisionDispatcher(config_);
    broadphase_ = new btDbvtBroadphase();
    switch (kind) {
      case WorldKind::Rigid:
        solver_ = new btSequentialImpulseConstraintSolver();
        world_ = new btDiscreteDynamicsWorld(dispatcher_, broadphase_, solver_, config_);
        break;
      case WorldKind::Soft:
        solver_ = new btSequentialImpulseConstraintSolver();
        soft_world_ =
            new btSoftRigidDynamicsWorld(dispatcher_, broadphase_, solver_, config_, nullptr);
        world_ = soft_world_;
        break;
      case WorldKind::MultiBody: {
        auto* solver = new btMultiBodyConstraintSolver();
        solver_ = solver;
        multi_world_ = new btMultiBodyDynamicsWorld(dispatcher_, broadphase_, solver, config_);
        world_ = multi_world_;
        break;
      }
    }
    world_->setGravity(btVector3(0, -10, 0));
  }

  ~Level() {
    for (int i = world_->getNumConstraints() - 1; i >= 0; --i) {
      btTypedConstraint* constraint = world_->getConstraint(i);
      world_->removeConstraint(constraint);
      delete constraint;
    }
    for (btMultiBody* body : multi_bodies_) {
      multi_world_->removeMultiBody(body);
    }
    btCollisionObjectArray& objects = world_->getCollisionObjectArray();
    for (int i = objects.size() - 1; i >= 0; --i) {
      btCollisionObject* object = objects[i];
      if (btRigidBody* body = btRigidBody::upcast(object)) {
        delete body->getMotionState();
        world_->removeRigidBody(body);
      } else if (btSoftBody* soft = btSoftBody::upcast(object)) {
        soft_world_->removeSoftBody(soft);
      } else {
        world_->removeCollisionObject(object);
      }
      delete object;
    }
    for (btMultiBody* body : multi_bodies_) delete body;
    for (btCollisionShape* shape : shapes_) delete shape;
    for (btTriangleMesh* mesh : meshes_) delete mesh;
    delete world_;
    delete solver_;
    delete broadphase_;
    delete dispatcher_;
    delete config_;
  }

  Level(const Level&) = delete;
  Level& operator=(const Level&) = delete;

  btDiscreteDynamicsWorld* world() { return world_; }
  btSoftRigidDynamicsWorld* soft_world() { return soft_world_; }
  btMultiBodyDynamicsWorld* multi_world() { return multi_world_; }

  // The level owns `shape` from now on.
  template <class Shape>
  Shape* own(Shape* shape) {
    shapes_.push_back(shape);
    return shape;
  }
  btTriangleMesh* own_mesh(btTriangleMesh* mesh) {
    meshes_.push_back(mesh);
    return mesh;
  }
  void own_multi_body(btMultiBody* body) { multi_bodies_.push_back(body); }

  btRigidBody* add_body(btCollisionShape* shape, btScalar mass, const btVector3& at) {
    btVector3 inertia(0, 0, 0);
    if (mass != 0) shape->calculateLocalInertia(mass, inertia);
    btTransform transform;
    transform.setIdentity();
    transform.setOrigin(at);
    auto* motion = new btDefaultMotionState(transform);
    btRigidBody::btRigidBodyConstructionInfo info(mass, motion, shape, inertia);
    auto* body = new btRigidBody(info);
    world_->addRigidBody(body);
    return body;
  }

  void add_ground() { add_body(own(new btBoxShape(btVector3(60, 1, 60))), 0, btVector3(0, -1, 0)); }

  void step(int frames) {
    for (int i = 0; i < frames; ++i) world_->stepSimulation(kStep, 1, kStep);
  }

  // The sum of every dynamic body's height: the scene's result.
  double heights() {
    double sum = 0;
    btCollisionObjectArray& objects = world_->getCollisionObjectArray();
    for (int i = 0; i < objects.size(); ++i) sum += objects[i]->getWorldTransform().getOrigin().y();
    return sum;
  }

 private:
  btCollisionConfiguration* config_;
  btCollisionDispatcher* dispatcher_;
  btBroadphaseInterface* broadphase_;
  btConstraintSolver* solver_;
  btDiscreteDynamicsWorld* world_;
  btSoftRigidDynamicsWorld* soft_world_ = nullptr;
  btMultiBodyDynamicsWorld* multi_world_ = nullptr;
  std::vector<btCollisionShape*> shapes_;
  std::vector<btTriangleMesh*> meshes_;
  std::vector<btMultiBody*> multi_bodies_;
};

double box_tower() {
  Level level(WorldKind::Rigid);
  level.add_ground();
  btBoxShape* box = level.own(new btBoxShape(btVector3(0.5, 0.5, 0.5)));
  for (int y = 0; y < 8; ++y)
    for (int x = 0; x < 7; ++x)
      for (int z = 0; z < 7; ++z)
        level.add_body(box, 1,
                       btVector3(x * 1.02f - 3.5f + y * 0.05f, 0.5f + y * 1.01f, z * 1.02f - 3.5f));
  level.step(30);
  return level.heights();
}

// A person of eleven capsules held by cone-twist joints (hips, shoulders, neck, waist) and
// hinges (knees, elbows).
void add_ragdoll(Level& level, const btVector3& at) {
  struct Part {
    btVector3 centre;
    btScalar radius, height;
  };
  const Part parts[] = {
      {{0, 1.0, 0}, 0.15, 0.20},     {{0, 1.4, 0}, 0.15, 0.28},      {{0, 1.8, 0}, 0.10, 0.05},
      {{-0.18, 0.65, 0}, 0.07, 0.3}, {{-0.18, 0.2, 0}, 0.05, 0.3},   {{0.18, 0.65, 0}, 0.07, 0.3},
      {{0.18, 0.2, 0}, 0.05, 0.3},   {{-0.35, 1.45, 0}, 0.05, 0.25}, {{-0.35, 1.05, 0}, 0.04, 0.25},
      {{0.35, 1.45, 0}, 0.05, 0.25}, {{0.35, 1.05, 0}, 0.04, 0.25},
  };
  btRigidBody* bodies[11];
  for (int i = 0; i < 11; ++i) {
    btCollisionShape* shape = level.own(new btCapsuleShape(parts[i].radius, parts[i].height));
    bodies[i] = level.add_body(shape, 1, at + parts[i].centre);
    bodies[i]->setDamping(0.05f, 0.85f);
  }
  struct Joint {
    int a, b;
    btVector3 pivot;
    bool hinge;
  };
  const Joint joints[] = {
      {0, 1, {0, 1.2, 0}, false},       {1, 2, {0, 1.65, 0}, false},
      {0, 3, {-0.18, 0.9, 0}, false},   {3, 4, {-0.18, 0.42, 0}, true},
      {0, 5, {0.18, 0.9, 0}, false},    {5, 6, {0.18, 0.42, 0}, true},
      {1, 7, {-0.35, 1.65, 0}, false},  {7, 8, {-0.35, 1.25, 0}, true},
      {1, 9, {0.35, 1.65, 0}, false},   {9, 10, {0.35, 1.25, 0}, true},
  };
  for (const Joint& joint : joints) {
    btVector3 in_a = joint.pivot - parts[joint.a].centre;
    btVector3 in_b = joint.pivot - parts[joint.b].centre;
    btTypedConstraint* constraint;
    if (joint.hinge) {
      auto* hinge = new btHingeConstraint(*bodies[joint.a], *bodies[joint.b], in_a, in_b,
                                          btVector3(1, 0, 0), btVector3(1, 0, 0));
      hinge->setLimit(0, SIMD_HALF_PI);
      constraint = hinge;
    } else {
      btTransform frame_a, frame_b;
      frame_a.setIdentity();
      frame_a.setOrigin(in_a);
      frame_b.setIdentity();
      frame_b.setOrigin(in_b);
      auto* cone = new btConeTwistConstraint(*bodies[joint.a], *bodies[joint.b], frame_a, frame_b);
      cone->setLimit(SIMD_HALF_PI * 0.5f, SIMD_HALF_PI * 0.5f, SIMD_HALF_PI);
      constraint = cone;
    }
    level.world()->addConstraint(constraint, true);
  }
}

double ragdolls() {
  Level level(WorldKind::Rigid);
  level.add_ground();
  for (int i = 0; i < 24; ++i)
    add_ragdoll(level, btVector3((i % 6) * 1.5f - 4, 1 + (i / 6) * 2.2f, (i % 3) * 0.3f));
  level.step(40);
  return level.heights();
}

// Rocks: hulls of random points, their faces computed (btConvexHullComputer), a third of them
// simplified through btShapeHull first.
double convex_hulls(Random& random) {
  Level level(WorldKind::Rigid);
  level.add_ground();
  for (int i = 0; i < 120; ++i) {
    auto* hull = new btConvexHullShape();
    for (int p = 0; p < 28; ++p)
      hull->addPoint(
          btVector3(random.next(-0.6, 0.6), random.next(-0.5, 0.5), random.next(-0.6, 0.6)), false);
    hull->recalcLocalAabb();
    btConvexHullShape* shape = hull;
    if (i % 3 == 0) {
      btShapeHull simplified(hull);
      simplified.buildHull(hull->getMargin());
      shape = new btConvexHullShape(&simplified.getVertexPointer()->getX(),
                                    simplified.numVertices());
      delete hull;
    }
    shape->optimizeConvexHull();
    shape->initializePolyhedralFeatures();
    level.own(shape);
    level.add_body(shape, 1, btVector3((i % 10) * 1.4f - 7, 1 + (i / 10) * 1.3f, (i % 7) * 0.2f));
  }
  level.step(30);
  return level.heights();
}

// A triangle-mesh terrain (a BVH over it) under primitives of every kind and compounds, and rays
// cast down onto it every frame as a game's line-of-sight and foot placement queries do.
double terrain(Random& random) {
  Level level(WorldKind::Rigid);
  btTriangleMesh* mesh = level.own_mesh(new btTriangleMesh());
  const int cells = 40;
  auto height = [](int x, int z) { return btScalar(0.6 * std::sin(x * 0.4) * std::cos(z * 0.3)); };
  for (int x = 0; x < cells; ++x)
    for (int z = 0; z < cells; ++z) {
      btVector3 v00(x - cells / 2, height(x, z), z - cells / 2);
      btVector3 v10(x + 1 - cells / 2, height(x + 1, z), z - cells / 2);
      btVector3 v01(x - cells / 2, height(x, z + 1), z + 1 - cells / 2);
      btVector3 v11(x + 1 - cells / 2, height(x + 1, z + 1), z + 1 - cells / 2);
      mesh->addTriangle(v00, v10, v11);
      mesh->addTriangle(v00, v11, v01);
    }
  level.add_body(level.own(new btBvhTriangleMeshShape(mesh, true)), 0, btVector3(0, 0, 0));
  for (int i = 0; i < 160; ++i) {
    btCollisionShape* shape;
    switch (i % 6) {
      case 0: shape = new btSphereShape(random.next(0.2, 0.5)); break;
      case 1: shape = new btBoxShape(btVector3(random.next(0.2, 0.5), 0.3, 0.4)); break;
      case 2: shape = new btCapsuleShape(0.25, random.next(0.3, 0.8)); break;
      case 3: shape = new btCylinderShape(btVector3(0.3, random.next(0.2, 0.5), 0.3)); break;
      case 4: shape = new btConeShape(0.35, random.next(0.4, 0.9)); break;
      default: {
        auto* compound = new btCompoundShape();
        btTransform part;
        part.setIdentity();
        for (int k = 0; k < 3; ++k) {
          part.setOrigin(btVector3(k * 0.4f - 0.4f, 0, 0));
          compound->addChildShape(part, level.own(new btBoxShape(btVector3(0.2, 0.2, 0.2))));
        }
        shape = compound;
      }
    }
    level.own(shape);
    level.add_body(shape, 1,
                   btVector3(random.next(-15, 15), 2 + (i / 20) * 1.2f, random.next(-15, 15)));
  }
  double hits = 0;
  for (int frame = 0; frame < 30; ++frame) {
    level.step(1);
    for (int ray = 0; ray < 60; ++ray) {
      btVector3 from(random.next(-18, 18), 20, random.next(-18, 18));
      btVector3 to = from - btVector3(0, 40, 0);
      btCollisionWorld::ClosestRayResultCallback hit(from, to);
      level.world()->rayTest(from, to, hit);
      if (hit.hasHit()) hits += hit.m_hitPointWorld.y();
    }
  }
  return level.heights() + hits;
}

// Flags of cloth pinned at two corners, and pressurized balls, falling on boxes.
double soft_bodies() {
  Level level(WorldKind::Soft);
  level.add_ground();
  btSoftBodyWorldInfo& info = level.soft_world()->getWorldInfo();
  btBoxShape* box = level.own(new btBoxShape(btVector3(0.5, 0.5, 0.5)));
  for (int i = 0; i < 4; ++i) level.add_body(box, 2, btVector3(i * 3.0f - 4.5f, 0.5, 0));
  for (int i = 0; i < 4; ++i) {
    btScalar x = i * 3.0f - 4.5f;
    btSoftBody* cloth = btSoftBodyHelpers::CreatePatch(
        info, btVector3(x - 1, 3, -1), btVector3(x + 1, 3, -1), btVector3(x - 1, 3, 1),
        btVector3(x + 1, 3, 1), 12, 12, 1 + 2, true);
    cloth->getCollisionShape()->setMargin(0.05f);
    cloth->generateBendingConstraints(2);
    cloth->setTotalMass(1);
    level.soft_world()->addSoftBody(cloth);
  }
  for (int i = 0; i < 3; ++i) {
    btSoftBody* ball =
        btSoftBodyHelpers::CreateEllipsoid(info, btVector3(i * 3.0f - 3, 5, 2),
                                           btVector3(0.6, 0.6, 0.6), 96);
    ball->m_cfg.kPR = 500;
    ball->setTotalMass(3, true);
    level.soft_world()->addSoftBody(ball);
  }
  level.step(30);
  info.m_sparsesdf.Reset();
  return level.heights();
}

// Chains of boxes hinged one to the next (Featherstone's reduced coordinates), each link with a
// collider, swinging down onto the ground.
double chains() {
  Level level(WorldKind::MultiBody);
  level.add_ground();
  const btVector3 half(0.05, 0.25, 0.05);
  btBoxShape* link_shape = level.own(new btBoxShape(half));
  btVector3 inertia;
  link_shape->calculateLocalInertia(1, inertia);
  for (int c = 0; c < 8; ++c) {
    const int links = 8;
    auto* body = new btMultiBody(links, 1, inertia, true, false);
    body->setBasePos(btVector3(c * 1.2f - 4, 5, 0));
    body->setWorldToBaseRot(btQuaternion(0, 0, 0, 1));
    for (int i = 0; i < links; ++i) {
      body->setupRevolute(i, 1, inertia, i - 1, btQuaternion(0, 0, 0, 1), btVector3(1, 0, 0),
                          btVector3(0, -half.y(), 0), btVector3(0, -half.y(), 0), true);
    }
    body->finalizeMultiDof();
    body->setJointPos(0, 0.3f + c * 0.1f);
    level.multi_world()->addMultiBody(body);
    level.own_multi_body(body);
    btAlignedObjectArray<btQuaternion> world_to_local;
    btAlignedObjectArray<btVector3> local_origin;
    world_to_local.resize(links + 1);
    local_origin.resize(links + 1);
    body->forwardKinematics(world_to_local, local_origin);
    for (int i = 0; i < links; ++i) {
      auto* collider = new btMultiBodyLinkCollider(body, i);
      collider->setCollisionShape(link_shape);
      level.world()->addCollisionObject(collider, btBroadphaseProxy::DefaultFilter,
                                        btBroadphaseProxy::AllFilter);
      body->getLink(i).m_collider = collider;
    }
    body->updateCollisionObjectWorldTransforms(world_to_local, local_origin);
  }
  level.step(40);
  return level.heights();
}

// Projectiles spawned every frame, each with its own shape, and removed once 150 are in flight,
// while the world keeps running: the churn of a game's short-lived objects.
double spawn_and_remove(Random& random) {
  Level level(WorldKind::Rigid);
  level.add_ground();
  std::deque<std::pair<btRigidBody*, btCollisionShape*>> live;
  double sum = 0;
  for (int frame = 0; frame < 90; ++frame) {
    for (int i = 0; i < 8; ++i) {
      btCollisionShape* shape =
          i % 2 ? static_cast<btCollisionShape*>(new btSphereShape(random.next(0.1, 0.3)))
                : new btBoxShape(btVector3(0.2, 0.1, random.next(0.1, 0.4)));
      btRigidBody* body =
          level.add_body(shape, 0.5, btVector3(random.next(-10, 10), random.next(1, 6), 0));
      body->setLinearVelocity(btVector3(random.next(-5, 5), random.next(0, 8), random.next(-5, 5)));
      live.emplace_back(body, shape);
    }
    while (live.size() > 150) {
      auto [body, shape] = live.front();
      live.pop_front();
      sum += body->getWorldTransform().getOrigin().y();
      level.world()->removeRigidBody(body);
      delete body->getMotionState();
      delete body;
      delete shape;
    }
    level.step(1);
  }
  for (auto [body, shape] : live) {
    level.world()->removeRigidBody(body);
    delete body->getMotionState();
    delete body;
    delete shape;
  }
  return sum;
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 1;
  Random random;
  double checksum = 0;
  for (int round = 0; round < rounds; ++round) {
    checksum += box_tower();
    checksum += ragdolls();
    checksum += convex_hulls(random);
    checksum += terrain(random);
    checksum += soft_bodies();
    checksum += chains();
    checksum += spawn_and_remove(random);
  }
  std::printf("checksum %.3f\n", checksum);
  return 0;
}
