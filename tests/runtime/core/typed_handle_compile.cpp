// Compiled by ctest with LOCO_CASE = 0 (must compile) and 1..3 (must not).
#include "runtime/core/actor.hpp"

struct A {
  int add(int n) { return n; }
  int name(std::string s) { return int(s.size()); }
};
struct B {
  int add(int n) { return n; }
};

void use(loco::ActorHandle<A> a) {
#if LOCO_CASE == 0
  (void)a.call(&A::add, 1);
  (void)a.call(&A::name, std::string("x"));
  a.tell(&A::add, 2);
#elif LOCO_CASE == 1
  (void)a.call(&B::add, 1);  // a method of another class
#elif LOCO_CASE == 2
  (void)a.call(&A::add, std::string("one"));  // wrong argument type
#elif LOCO_CASE == 3
  (void)a.call(&A::add, 1, 2);  // wrong number of arguments
#endif
}
