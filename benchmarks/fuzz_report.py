"""The reliability table of docs/reliability.md: a larger seeded fuzz campaign over the same cases and checks
as tests/python/test_fuzz_{simulator,minimize}.py (from tests/python/fuzzing.py), counting instead of stopping at the first failure.

Each case is classified as: converged (every step met its gradient tolerance, confirmed on the reference
residual); reported failure correctly (some step did not converge and said so: info.converged False with a
RuntimeWarning, and ConvergenceError under on_failure="raise"); crashed or non-finite (anything else: an
exception, a non-finite value, an inverted neo-Hookean element, a convergence claim the residual contradicts,
a silent failure). The goal for the last column is zero; its cases are printed.

    .venv/bin/python benchmarks/fuzz_report.py [--cases 300] [--steps 3]
"""
import argparse
import collections
import os
import sys
import time
import traceback

import torch
from hypothesis import HealthCheck, Phase, given, settings

# The fuzz cases (tests/python/fuzzing.py) are test code: they live with the tests.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))

from fuzzing import (MISUSE_OUTCOMES, MISUSE_TARGETS, cases, check_misuse, check_solve, check_steps, make_case,  # noqa: E402
                     make_problem, misuse_cases, problems)

COLUMNS = ("tried", "converged", "reported failure correctly", "crashed or non-finite")


def campaign(name, strategy, run, n):
    """Runs ``run(case)`` on ``n`` seeded cases of ``strategy``; returns the row's counts and the bad cases."""
    counts, bad = collections.Counter(), []

    @settings(derandomize=True, deadline=None, database=None, max_examples=n, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(case=strategy)
    def one(case):
        counts["tried"] += 1
        try:
            outcomes = run(case)
        except Exception as e:  # noqa: BLE001 - every exception is a finding, counted and printed
            counts["crashed or non-finite"] += 1
            bad.append((case, "".join(traceback.format_exception_only(type(e), e)).strip()))
            return
        counts["converged" if all(o == "converged" for o in outcomes) else "reported failure correctly"] += 1

    t0 = time.perf_counter()
    one()
    print(f"{name}: {counts['tried']} cases in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return counts, bad


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", type=int, default=300, help="cases per row")
    ap.add_argument("--steps", type=int, default=3, help="steps per simulator case")
    ap.add_argument("--misuse-cases", type=int, default=10_000, help="cases of the misuse campaign")
    ap.add_argument("--misuse-only", action="store_true", help="run the misuse campaign alone")
    args = ap.parse_args()
    if args.misuse_only:
        misuse_report(args.misuse_cases)
        return
    rows = [
        ("Simulator.step, float64 (2D/3D, 1+ elements, E 1e1..1e7, dt 1e-4..1 s, impacts to 30 m/s)", cases(),
         lambda c: check_steps(*make_case(**c), steps=args.steps)),
        ("Simulator.step, float32 (impacts to 100 m/s)", cases(impact=100.0),
         lambda c: check_steps(*make_case(**c, dtype=torch.float32), steps=args.steps)),
        ("Simulator.step, stiff (E 1e5..1e7), dt 0.05..1 s, impacts to 100 m/s", cases((0.05, 1.0), (1e5, 1e7), 100.0),
         lambda c: check_steps(*make_case(**c), steps=args.steps)),
        ("minimize, float64 (convex, non-convex, unbounded, badly scaled; batched)", problems,
         lambda p: [check_solve(*make_problem(**p)[:3])]),
        ("minimize, float32", problems,
         lambda p: [check_solve(*make_problem(**p, dtype=torch.float32)[:3])]),
    ]
    results = [(name, *campaign(name, strategy, run, args.cases)) for name, strategy, run in rows]

    print(f"| case family | {' | '.join(COLUMNS)} |")
    print(f"|---|{'---:|' * len(COLUMNS)}")
    total = collections.Counter()
    for name, counts, _ in results:
        total.update(counts)
        print(f"| {name} | {' | '.join(str(counts[c]) for c in COLUMNS)} |")
    print(f"| **all** | {' | '.join(f'**{total[c]}**' for c in COLUMNS)} |")
    print(f"\nseeded (hypothesis derandomize), {args.cases} cases per row, {args.steps} steps per simulator case; "
          f"torch {torch.__version__}")
    for name, _, bad in results:
        for case, error in bad:
            print(f"\n{name}: {case}\n  {error}")
    misuse_report(args.misuse_cases)


def misuse_report(n):
    """The misuse campaign: ``n`` seeded cases of ``misuse_cases`` (tests/python/fuzzing.py), counted by entry point
    and outcome, then every case that was not a right answer or a clear error."""
    counts, findings = collections.defaultdict(collections.Counter), []

    @settings(derandomize=True, deadline=None, database=None, max_examples=n, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(case=misuse_cases)
    def one(case):
        entry = MISUSE_TARGETS[case["target"]][0]
        outcome, detail = check_misuse(**case)
        counts[entry][outcome] += 1
        if outcome not in ("right answer", "clear error"):
            findings.append(f"{outcome}: {detail}")

    t0 = time.perf_counter()
    one()
    print(f"misuse: {n} cases in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    print(f"\n| entry point | tried | {' | '.join(MISUSE_OUTCOMES)} |")
    print(f"|---|---:|{'---:|' * len(MISUSE_OUTCOMES)}")
    total = collections.Counter()
    for entry, c in counts.items():
        total.update(c)
        print(f"| {entry} | {sum(c.values())} | {' | '.join(str(c[o]) for o in MISUSE_OUTCOMES)} |")
    print(f"| **all** | **{sum(total.values())}** | {' | '.join(f'**{total[o]}**' for o in MISUSE_OUTCOMES)} |")
    for f in sorted(set(findings)):
        print(f"\n{f}")


if __name__ == "__main__":
    main()
