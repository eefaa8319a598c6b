"""benchmarks/make_figures.py regenerates the committed sample-efficiency tables exactly, and the plots, from the
compact summaries in benchmarks/results/; benchmarks/README.md shows the headline as generated; benchmarks/
commits at most 2 MB and no full history."""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"
RESULTS = BENCHMARKS / "results" / "sample_efficiency"


def test_make_figures_regenerates_every_committed_table_and_the_plots(tmp_path):
    pytest.importorskip("matplotlib")
    run = subprocess.run([sys.executable, str(BENCHMARKS / "make_figures.py"), "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    made = {p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file()}
    committed = {p.relative_to(RESULTS) for p in RESULTS.rglob("*") if p.suffix in (".md", ".png")}
    assert made == committed  # nothing committed that it does not make, nothing made that is not committed
    for name in sorted(p for p in made if p.suffix == ".md"):
        assert (tmp_path / name).read_text() == (RESULTS / name).read_text(), f"{name} differs from what it makes"
    for name in (p for p in made if p.suffix == ".png"):
        assert 10_000 < (tmp_path / name).stat().st_size < 150_000, name
    readme = (BENCHMARKS / "README.md").read_text()
    for name in ("headline", "budgets"):  # the README shows each as made, the headline on its first screen
        start = readme.index(f"<!-- {name}: written by benchmarks/make_figures.py")
        assert readme[start:].split("\n", 1)[1].startswith((RESULTS / f"{name}.md").read_text()), name
        assert name != "headline" or start < 600


def test_budgets_reads_each_method_at_its_last_evaluation_within_the_budget(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import make_figures as mf

    run = {"evaluations": [[0, 0.0, 0.0], [3072, 1.0, 0.5], [6144, 2.0, 1.5], [9216, 3.0, 1.0]]}
    assert [mf.at_budget(run, b) for b in (3071, 3072, 6400, 10**6)] == [0.0, 0.5, 1.5, 1.0]


def test_time_to_a_distance_is_wall_clock_and_cpu_seconds_with_evaluations_excluded(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import sample_efficiency as se

    def run(wall, cpu, distances):
        # A trainer's history: an evaluation before each update (not timed), then the update's cumulative times;
        # then the final evaluation, after the last update.
        history = [{"eval_distance": d, "eval_sim_steps": 100 * k, "sim_steps": 100 * (k + 1),
                    "seconds": wall * (k + 1), "cpu_seconds": cpu * (k + 1)} for k, d in enumerate(distances[:-1])]
        history.append({"eval_distance": distances[-1], "eval_sim_steps": 100 * (len(distances) - 1)})
        return {"config": {}, "history": history, "wall_seconds": 1e3, "train_seconds": history[-2]["seconds"],
                "sim_steps": history[-2]["sim_steps"], "machine": {"start": se.machine(1), "end": se.machine(1)}}

    results = {"creature": "biped", "sources": ["test"],
               "runs": {"differentiable": {"0": se.summarize(run(3.0, 2.0, [0.0, 1.0, 3.0, 3.5]))},
                        "ppo": {"0": se.summarize(run(1.0, 0.5, [0.0, 0.6, 1.2, 2.5, 3.0]))}}}
    diff = results["runs"]["differentiable"]["0"]
    assert diff["evaluations"][2] == [200, 6.0, 3.0, 4.0] and diff["train_cpu_seconds"] == 6.0
    assert se.first_reaching(diff, 2.0) == (200, 6.0, 4.0)  # the seconds before the evaluation that reached
    text = se.table(results, targets=(2.0,))
    assert "| differentiable | 0 | 200 / 6 / 4 CPU | 200 / 6 / 4 CPU | 3.50 |" in text  # PPO's final: 3.0
    assert "| ppo | 0 | 300 / 3 / 2 CPU | 400 / 4 / 2 CPU | 3.00 |" in text
    assert "| PPO / differentiable | medians' ratio | 1.5x / 0.5x / 0.4x CPU | 2.0x / 0.7x / 0.5x CPU |" in text
    assert "every evaluation excluded" in text and "Machines: differentiable (1 of 1 runs recorded)" in text
    pytest.importorskip("matplotlib")
    se.plot(results, str(tmp_path / "plot.png"))
    assert (tmp_path / "plot.png").stat().st_size > 10_000


def test_the_differentiable_runs_final_is_the_final_policys(tmp_path, monkeypatch):
    # As PPO's: keep_best's choice among the evaluations (the furthest that lasts) would be an optimistic final.
    import types
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import sample_efficiency as se

    class Trained(Exception):
        pass

    seen = []

    def train(cfg, progress):
        seen.append(cfg)
        raise Trained

    monkeypatch.setattr(se.training, "train", train)
    args = types.SimpleNamespace(threads=1, steps=1024, batch=32, window=32, creature="biped", horizon=100,
                                 lr_decay_iterations=None, eval_every=1, device="cpu", out=str(tmp_path),
                                 diff_set=[], no_progress=True)
    with pytest.raises(Trained):
        se.run_differentiable(args, 0)
    assert seen[0].keep_best is False
    with pytest.raises(SystemExit, match="--diff-set keep_best"):
        se.run_differentiable(types.SimpleNamespace(**dict(vars(args), diff_set=["keep_best=1"])), 0)


def _committed(*paths):
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    out = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", *paths], capture_output=True, text=True, check=True)
    return [ROOT / p for p in out.stdout.split("\0") if p]


def test_benchmarks_commit_at_most_2_mb_and_no_full_history():
    files = _committed("benchmarks")
    assert sum(p.stat().st_size for p in files if p.exists()) <= 2 * 2**20
    histories = [p for p in _committed() if p.name in ("results.json", "history.json", "checkpoint.pt")]
    assert not histories, histories
    for path in ("benchmarks/results/sample_efficiency/x/results.json", "runs/biped/history.json",
                 "benchmarks/results/x/checkpoint.pt"):
        ignored = subprocess.run(["git", "-C", str(ROOT), "check-ignore", "-q", path])
        assert ignored.returncode == 0, f"{path} is not git-ignored"


def test_side_by_side_runs_each_method_and_seed_as_a_process_and_reports_them_together(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import sample_efficiency as se
    assert se._passed_on(["--side-by-side", "2", "--methods", "ppo", "differentiable", "--steps", "64", "--seed",
                          "0", "1", "--out=x", "--sb3-set", "normalize=1", "--only", "ppo"]) == \
        ["--steps", "64", "--sb3-set", "normalize=1"]
    script = str(BENCHMARKS / "sample_efficiency.py")
    common = ["--side-by-side", "2", "--methods", "differentiable", "ppo", "--seed", "0", "--threads", "1",
              "--no-progress", "--ppo-envs", "4", "--horizon", "8", "--batch", "4", "--window", "8"]
    run = subprocess.run([sys.executable, script, *common, "--steps", "64", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    import json
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert set(summary["runs"]) == {"differentiable", "ppo"}  # one run each, every one its own process's
    assert len(summary["sources"]) == 1 and "--side-by-side 2" in summary["sources"][0]
    for method in ("differentiable", "ppo"):
        assert (tmp_path / f"{method}_seed0" / "summary.json").exists()
        assert (tmp_path / f"{method}_seed0" / "log.txt").exists()
    # a run that fails is named, with its log
    bad = subprocess.run([sys.executable, script, *common, "--creature", "no_such_creature", "--out",
                          str(tmp_path / "bad")], capture_output=True, text=True, timeout=600)
    assert bad.returncode != 0 and "log.txt" in bad.stderr and "failed" in bad.stderr
