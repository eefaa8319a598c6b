"""benchmarks/make_figures.py regenerates the committed sample-efficiency tables exactly, and the plots, from the
compact summaries in benchmarks/results/; benchmarks/README.md shows the headline as generated; benchmarks/
commits at most 2 MB and no full history."""
import os
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
    headline = (RESULTS / "headline.md").read_text()
    readme = (BENCHMARKS / "README.md").read_text()
    start = readme.index("<!-- headline: written by benchmarks/make_figures.py")
    assert readme[start:start + 3000].split("\n", 1)[1].startswith(headline)  # the first screen shows it as made
    assert start < 600


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
