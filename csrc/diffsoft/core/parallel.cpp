// Whether the core's loops over a batch run on torch's threads; see parallel.h.
#include "diffsoft/core/parallel.h"

#include <atomic>

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
}  // namespace

double min_chunk_ns() { return chunk_ns.load(std::memory_order_relaxed); }

void set_min_chunk_ns(double ns) { chunk_ns.store(std::max(ns, 0.0), std::memory_order_relaxed); }

}  // namespace diffsoft
