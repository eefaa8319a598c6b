"""Regenerates every sample-efficiency table and plot that the docs show, from the compact summaries committed
in ``benchmarks/results/`` (no training: a few seconds).

    .venv/bin/python benchmarks/make_figures.py              # in place, and the headline in benchmarks/README.md
    .venv/bin/python benchmarks/make_figures.py --out DIR    # the same files under DIR (README.md untouched)

From ``results/sample_efficiency/``:

* every run's ``NAME/summary.json`` (written by ``sample_efficiency.py``) gives ``NAME/results.md``, its table;
* ``NAME/ppo_seeds_3-5.json``, where there is one, gives ``NAME/results_ppo_six_seeds.md`` (the same table
  with PPO's extra seeds);
* the runs of :data:`PLOTS` give ``NAME/sample_efficiency.png``;
* ``NAME/tuning.json`` gives ``NAME/tuning.md`` (PPO's settings search), ``NAME/tuning_sb3.json``
  ``NAME/tuning_sb3.md`` (Stable-Baselines3's);
* the runs of :data:`HEADLINE` give ``headline.md``, the table in the first screen of ``benchmarks/README.md``
  (between its ``<!-- headline -->`` markers, which the in-place run rewrites);
* the runs of :data:`SIDE_BY_SIDE` give ``budgets.md``, each method's distance at equal budgets of
  creature-steps (between the README's ``<!-- budgets -->`` markers).

The speed tables of ``benchmarks/README.md`` are printed by their scripts as shown there, with the command and
commit beside each; ``results/screens/`` holds the lever screens as recorded (``screen.md``) with every run's
evaluations (``screen.json``).
"""
import argparse
import glob
import json
import math
import os

from sample_efficiency import _median, evaluations, first_reaching, plot, table, tuning_table

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results", "sample_efficiency")
README = os.path.join(HERE, "README.md")
PLOTS = ("biped_side_by_side", "algovivo_biped_side_by_side", "biped_noise_decay", "algovivo_biped_noise_decay")
"""The runs whose plots benchmarks/README.md shows or links (``TrainConfig``'s defaults beside both PPOs at one
load, and the eighth run)."""
CORRECTED = "`diffsoft.ppo`"
BEFORE = "`diffsoft.ppo` before `2a9a89a`"
SB3 = "SB3 (tuned)"
MIRRORED = "`diffsoft.ppo`, mirrored"
HEADLINE = (("procedural biped, side by side", "biped_side_by_side", "ppo", CORRECTED),
            ("algovivo's biped, side by side", "algovivo_biped_side_by_side", "ppo", CORRECTED),
            ("procedural biped, side by side", "biped_side_by_side", "sb3", SB3),
            ("algovivo's biped, side by side", "algovivo_biped_side_by_side", "sb3", SB3),
            ("worm, side by side", "worm_side_by_side", "ppo", CORRECTED),
            ("worm, side by side", "worm_side_by_side", "sb3", SB3),
            ("quadruped, side by side", "quadruped_side_by_side", "ppo", CORRECTED),
            ("quadruped, side by side", "quadruped_side_by_side", "sb3", SB3),
            ("3D tetrapod (5e4 Pa, `min_a` 0.5), not mirrored", "tetrapod_defaults_8160023", "ppo", BEFORE),
            ("3D tetrapod, not mirrored", "tetrapod_defaults_b4555a4", "ppo", BEFORE),
            ("3D tetrapod, side by side", "tetrapod_side_by_side", "ppo", MIRRORED),
            ("3D tetrapod, side by side", "tetrapod_side_by_side", "sb3", SB3),
            ("3D caterpillar, side by side", "caterpillar_side_by_side", "ppo", MIRRORED),
            ("3D caterpillar, side by side", "caterpillar_side_by_side", "sb3", SB3))
"""The headline's rows: (creature, run, the PPO it is against, that PPO's name). The differentiable trainer with
``TrainConfig``'s defaults against ``diffsoft.ppo`` (as corrected at ``2a9a89a``: before it, its observation
statistics changed between a rollout and the update on it; the tetrapods' PPO runs are from before) and
Stable-Baselines3's tuned PPO, on every creature (issue 32, item 6). The rows marked side by side (all but the
older tetrapod rows) are one ``sample_efficiency.py --side-by-side 2`` run each: the three methods' nine runs two at
a time, at one load (issue 26). The tetrapod's rows marked not mirrored are from before its policy was mirrored by
default (``ac92ae2``); in the 3D rows side by side both methods' policies are mirrored (``diffsoft.ppo``'s actor
since ``0bd08ca``)."""
SIDE_BY_SIDE = (("procedural biped", "biped_side_by_side"), ("algovivo's biped", "algovivo_biped_side_by_side"),
                ("worm", "worm_side_by_side"), ("quadruped", "quadruped_side_by_side"),
                ("3D tetrapod", "tetrapod_side_by_side"), ("3D caterpillar", "caterpillar_side_by_side"))
"""The runs of ``sample_efficiency.py --side-by-side 2`` (the three methods at one load), whose distances at equal
budgets :func:`budgets` tabulates."""
BUDGETS = (51_200, 102_400, 204_800, 409_600)
"""Creature-steps at which :func:`budgets` reads each method's distance: an eighth, a quarter, half and all of the
sample-efficiency runs' budget."""
BLOCKS = {"headline.md": ("<!-- headline: written by benchmarks/make_figures.py from results/sample_efficiency -->\n",
                          "<!-- end of headline -->\n"),
          "budgets.md": ("<!-- budgets: written by benchmarks/make_figures.py from results/sample_efficiency -->\n",
                         "<!-- end of budgets -->\n")}
"""The generated files that benchmarks/README.md shows, each between its markers."""


def with_more_ppo_seeds(summary, path):
    """``summary`` with the PPO runs of the summary at ``path`` added."""
    more = _load(path)
    runs = dict(summary["runs"], ppo={**summary["runs"]["ppo"], **more["runs"]["ppo"]})
    return dict(summary, sources=summary["sources"] + more["sources"], runs=runs)


def staying(run, target):
    """``(creature-steps, training seconds, training CPU seconds or None)`` of the first evaluation from which
    every later one is at or past ``target`` (the distance stays there), or None: unlike
    :func:`~sample_efficiency.first_reaching`, a curve that touches the target and falls back does not count."""
    evals = evaluations(run)
    for k, (s, t, d, c) in enumerate(evals):
        if all(e[2] >= target for e in evals[k:]):
            return s, t, c
    return None


def headline_rows(creature, summary, peer="ppo", peer_name=CORRECTED, link=None):
    """One row of the headline: the PPO ``peer``'s (a method of ``summary``) mean final distance over its
    seeds, and what each method needs to reach it (medians over seeds) with their ratios: creature-steps to the
    first evaluation at or past it and to the first from which it stays there (:func:`staying`), and the
    training seconds to the first, in CPU time (the process's, evaluations excluded: the runs did not train side
    by side, and wall-clock follows each one's load) and in wall-clock; then both methods' final distances
    (medians) and ``link``, the row's table (whose first line holds its runs' commands and commits)."""
    runs = {"differentiable": summary["runs"]["differentiable"], "ppo": summary["runs"][peer]}
    finals = {m: [evaluations(r)[-1][2] for r in rs.values()] for m, rs in runs.items()}
    target = sum(finals["ppo"]) / len(finals["ppo"])

    def measure(rule, k):
        """Each method's median of ``rule``'s k-th value (``None``: never; CPU seconds, k = 2, fall back to
        wall-clock where a run lacks them), how many seeds reached, and the ratio cell."""
        hits = {m: [rule(r, target) for r in rs.values()] for m, rs in runs.items()}
        values = {m: [h and (h[k] if h[k] is not None else h[1]) for h in hs] for m, hs in hits.items()}
        mid = {m: _median(v) for m, v in values.items()}
        reached = {m: [v for v in vs if v is not None] for m, vs in values.items()}
        if mid["differentiable"] is None:
            ratio = "never"
        elif mid["ppo"] is not None:
            ratio = f"**{mid['ppo'] / mid['differentiable']:.1f}x**"
        else:  # PPO's median is never: the median of the PPO seeds that reached bounds it from below
            bound = math.floor(10 * _median(reached["ppo"]) / mid["differentiable"]) / 10 if reached["ppo"] else None
            ratio = "> (PPO never)" if bound is None else f"**> {bound:.1f}x**"  # (a lower bound: rounded down)
        return mid, {m: len(reached[m]) for m in runs}, ratio

    def cell(mid, count, fmt):
        seeds = {len(rs) for rs in runs.values()}
        of = f"{seeds.pop()}" if len(seeds) == 1 else f"{len(runs['differentiable'])}, {len(runs['ppo'])}"
        return " / ".join("never" if mid[m] is None else fmt.format(mid[m]) for m in runs) + \
            f" ({count['differentiable']} / {count['ppo']} of {of})"

    first, first_n, first_ratio = measure(first_reaching, 0)
    stay, stay_n, stay_ratio = measure(staying, 0)
    cpu, cpu_n, cpu_ratio = measure(first_reaching, 2)
    wall, _, wall_ratio = measure(first_reaching, 1)
    ppo_seeds = sorted(runs["ppo"], key=int)
    return (f"| {creature} | {peer_name}, {ppo_seeds[0]}-{ppo_seeds[-1]} | {target:.2f} | "
            f"{cell(first, first_n, '{:,.0f}')} | {first_ratio} | {cell(stay, stay_n, '{:,.0f}')} | {stay_ratio} | "
            f"{' / '.join('never' if cpu[m] is None else f'{cpu[m]:.0f}' for m in runs)} | {cpu_ratio} | "
            f"{' / '.join('never' if wall[m] is None else f'{wall[m]:.0f}' for m in runs)} | {wall_ratio} | "
            f"{_median(finals['differentiable']):.2f} / {_median(finals['ppo']):.2f} |" + (f" {link} |" if link else ""))


def headline(results):
    """The headline table: a row per :data:`HEADLINE` entry, each linking its run's table, where its commands,
    commits and machine are."""
    rows = []
    for creature, name, peer, peer_name in HEADLINE:
        summary = _load(os.path.join(results, name, "summary.json"))
        rows.append(headline_rows(creature, summary, peer, peer_name,
                                  link=f"[{name}](results/sample_efficiency/{name}/results.md)"))
    return "\n".join([
        "| creature | PPO, its seeds | PPO's final distance (mean over its seeds) | creature-steps to first reach "
        "it: differentiable / PPO (medians; seeds that did) | PPO / differentiable | creature-steps until it stays "
        "there | PPO / differentiable | training CPU seconds to first reach it | PPO / differentiable | wall-clock "
        "seconds (side by side: at one load; else each run's own) | PPO / differentiable | distance at 409,600: "
        "differentiable / PPO (medians) | runs: commands, commits |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |", *rows])


def at_budget(run, budget):
    """The distance of ``run``'s last evaluation at or before ``budget`` creature-steps (the differentiable runs
    are evaluated every 3,072, the PPOs every 3,200: each is read at its own last one, never past the budget)."""
    return [d for s, _, d, _ in evaluations(run) if s <= budget][-1]


def budgets(results):
    """The table of :data:`SIDE_BY_SIDE`'s runs: for each creature and budget of :data:`BUDGETS`, each method's
    median distance over its seeds at that budget (:func:`at_budget`), the furthest in bold."""
    methods = ("differentiable", "ppo", "sb3")
    rows = []
    for creature, name in SIDE_BY_SIDE:
        runs = _load(os.path.join(results, name, "summary.json"))["runs"]
        cells = []
        for budget in BUDGETS:
            mid = [_median([at_budget(r, budget) for r in runs[m].values()]) for m in methods]
            cells.append(" / ".join(f"**{d:.2f}**" if d == max(mid) else f"{d:.2f}" for d in mid))
        link = f"[{name}](results/sample_efficiency/{name}/results.md)"
        rows.append(f"| {creature} | " + " | ".join(cells) + f" | {link} |")
    return "\n".join([
        "| creature | " + " | ".join(f"{b:,} creature-steps" for b in BUDGETS) + " | runs (3 seeds each) |",
        "| --- | " + "---: | " * len(BUDGETS) + "--- |", *rows])


def make(out):
    """Writes every table and plot under ``out`` (a copy of ``results/sample_efficiency``'s layout); returns
    the paths written."""
    written = []

    def write(name, text):
        path = os.path.join(out, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text + "\n")
        written.append(path)

    for path in sorted(glob.glob(os.path.join(RESULTS, "*", "summary.json"))):
        name = os.path.basename(os.path.dirname(path))
        summary = _load(path)
        write(os.path.join(name, "results.md"), table(summary))
        more = os.path.join(RESULTS, name, "ppo_seeds_3-5.json")
        if os.path.exists(more):
            write(os.path.join(name, "results_ppo_six_seeds.md"), table(with_more_ppo_seeds(summary, more)))
        if name in PLOTS:
            os.makedirs(os.path.join(out, name), exist_ok=True)
            plot(summary, os.path.join(out, name, "sample_efficiency.png"))
            written.append(os.path.join(out, name, "sample_efficiency.png"))
    for suffix, label in (("", "PPO"), ("_sb3", "SB3")):
        for path in sorted(glob.glob(os.path.join(RESULTS, "*", f"tuning{suffix}.json"))):
            write(os.path.join(os.path.basename(os.path.dirname(path)), f"tuning{suffix}.md"),
                  tuning_table(_load(path), label))
    write("headline.md", headline(RESULTS))
    write("budgets.md", budgets(RESULTS))
    return written


def update_readme(name, text, readme=README):
    """Puts ``text`` between the markers of the block ``name`` (of :data:`BLOCKS`) in ``readme``."""
    with open(readme) as f:
        doc = f.read()
    first, last = BLOCKS[name]
    start, end = doc.index(first) + len(first), doc.index(last)
    with open(readme, "w") as f:
        f.write(doc[:start] + text + "\n" + doc[end:])


def _load(path):
    with open(path) as f:
        return json.load(f)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=None, help="write here instead of in place (README.md is then left alone)")
    args = p.parse_args()
    written = make(args.out or RESULTS)
    if args.out is None:
        for name in BLOCKS:
            with open(os.path.join(RESULTS, name)) as f:
                update_readme(name, f.read().rstrip("\n"))
        written.append(README)
    print("\n".join(written))


if __name__ == "__main__":
    main()
