// Where a step's time goes: cumulative wall-clock timers over the solver's phases, off unless switched on
// (benchmarks/step_speed.py prints them as a per-step breakdown). Process-wide; thread-safe.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>

namespace diffsoft {

// The phases. Each is timed inclusively where it runs: `kernels` (energy values, gradients, Hessian blocks
// and Hessian-vector products of an analytic energy), `assembly` (a Hessian's sparse matrix from its blocks),
// `analysis` (symbolic: ordering, supernodes), `factorization` (numeric), `solves` (back-substitutions),
// `newton` (the whole forward solve in C++) and `adjoint` (the whole backward in C++). A phase timed inside a
// batch's loop (assembly, factorization) adds up the time of every thread that ran it (core/parallel.h).
enum class Phase { kernels, assembly, analysis, factorization, solves, newton, adjoint, count };
constexpr const char* kPhaseNames[] = {"kernels", "assembly", "analysis", "factorization", "solves", "newton",
                                       "adjoint"};

struct PhaseTimers {
  std::atomic<bool> on{false};
  std::array<std::atomic<int64_t>, static_cast<size_t>(Phase::count)> ns{};
  std::array<std::atomic<int64_t>, static_cast<size_t>(Phase::count)> calls{};
};
PhaseTimers& phase_timers();

// Adds the scope's wall-clock time to `phase` while the timers are on; costs one atomic load when off.
class PhaseTimer {
 public:
  explicit PhaseTimer(Phase phase) : phase_(phase), on_(phase_timers().on.load(std::memory_order_relaxed)) {
    if (on_) start_ = std::chrono::steady_clock::now();
  }
  ~PhaseTimer() {
    if (!on_) return;
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start_);
    const auto k = static_cast<size_t>(phase_);
    phase_timers().ns[k].fetch_add(ns.count(), std::memory_order_relaxed);
    phase_timers().calls[k].fetch_add(1, std::memory_order_relaxed);
  }
  PhaseTimer(const PhaseTimer&) = delete;
  PhaseTimer& operator=(const PhaseTimer&) = delete;

 private:
  Phase phase_;
  bool on_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace diffsoft
