// Whether the core's loops over a batch run on torch's threads; see parallel.h.
#include "diffsoft/core/parallel.h"

#include <pthread.h>

#include <atomic>
#include <stdexcept>
#include <string>

namespace diffsoft {

bool has_openmp() {
#ifdef _OPENMP
  return true;
#else
  return false;
#endif
}

namespace {
std::atomic<double> chunk_ns{kMinChunkNs};
std::atomic<bool> in_child{false};
const int kAtFork = pthread_atfork(nullptr, nullptr, [] { in_child.store(true); });
}  // namespace

bool forked() { return in_child.load(std::memory_order_relaxed); }

double min_chunk_ns() { return chunk_ns.load(std::memory_order_relaxed); }

void set_min_chunk_ns(double ns) {
  if (!(ns >= 0.0)) throw std::invalid_argument("min_chunk_ns must be >= 0, got " + std::to_string(ns));
  chunk_ns.store(ns, std::memory_order_relaxed);
}

}  // namespace diffsoft
