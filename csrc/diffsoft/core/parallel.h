// Loops over a batch's independent problems on torch's intra-op threads (at::parallel_for: OpenMP in torch's
// builds, with which CMakeLists.txt compiles the core). Each problem's arithmetic is the same on any thread
// count: only which thread runs it changes.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace diffsoft {

// Whether the core was compiled with OpenMP, as torch's OpenMP builds need for at::parallel_for to run on more
// than one thread (without it, ATen's header runs every loop on the caller's thread).
bool has_openmp();

// The least work, in nanoseconds, worth a thread of its own. Waking threads that sleep between parallel regions
// (OMP_WAIT_POLICY=PASSIVE, which the training command sets) costs tens of microseconds a region, more on a
// loaded machine: with one problem a thread, 2 threads stepped 16-32 bipeds 1.2-1.3x slower than one, and with
// chunks of 100 us 32 bipeds (two chunks of factorizations) still 1.05-1.2x slower (2-core AMD EPYC).
constexpr double kMinChunkNs = 300e3;

// The chunks' least work now: kMinChunkNs, unless set (0 splits every batch of two or more problems between
// the threads: the test suite's setting, so that its small batches run the threaded paths too; a negative or
// NaN value is an invalid_argument). Thread-safe.
double min_chunk_ns();
void set_min_chunk_ns(double ns);

// True in a process made by fork(): GNU OpenMP's threads do not survive a fork, and a parallel region in the
// child of a process that had run one waits for them forever (torch's own OpenMP ops alike). A fork's child
// (multiprocessing's default start on Linux, DataLoader workers) runs the loops on its one thread.
bool forked();

// Calls f(b) for b in [0, batch), in chunks of at least min_chunk_ns() of work, for problems of about
// `ns_per_problem` nanoseconds each (an estimate: its order of magnitude is what counts).
template <typename F>
void for_each_in_batch(int64_t batch, double ns_per_problem, const F& f) {
  if (forked()) {
    for (int64_t b = 0; b < batch; ++b) f(b);
    return;
  }
  // (bounded by the batch before the cast: an infinite chunk or a huge estimate keeps the whole batch together)
  const double grain = std::min(std::ceil(min_chunk_ns() / std::max(ns_per_problem, 1.0)), double(batch));
  at::parallel_for(0, batch, std::max<int64_t>(static_cast<int64_t>(grain), 1), [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) f(b);
  });
}

}  // namespace diffsoft
