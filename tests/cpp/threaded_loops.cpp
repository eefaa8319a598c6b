// For the whole GoogleTest suite: the core's loops over a batch split every batch of two or more problems between
// torch's threads (at least two), not only batches with work enough to be worth a thread (core/parallel.h), so
// that the tests' batches of two run the threaded paths. tests/python/conftest.py does the same for pytest.
#include <gtest/gtest.h>

#include <ATen/Parallel.h>

#include <algorithm>

#include "diffsoft/core/parallel.h"

namespace {

class ThreadedLoops : public ::testing::Environment {
 public:
  void SetUp() override {
    diffsoft::set_min_chunk_ns(0);
    at::set_num_threads(std::max(2, at::get_num_threads()));
  }
};

const ::testing::Environment* const kThreadedLoops = ::testing::AddGlobalTestEnvironment(new ThreadedLoops);

}  // namespace
