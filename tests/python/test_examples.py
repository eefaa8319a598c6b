"""The examples on small cases: system identification and trajectory optimisation reduce their losses; each
example's docstring gives the command that runs it with the project's interpreter."""
import ast
import dataclasses
import importlib.util
import os
import re
import subprocess
import sys

import pytest

from diffsoft.cli import field_help
from diffsoft.training import TrainConfig

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "examples")


def _load(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(EXAMPLES, name + ".py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_system_identification_recovers_all_five_values():
    out = _load("system_identification").main(["--steps", "8", "--iterations", "40"])
    assert out["losses"][-1] < 1e-12 * out["losses"][0]
    assert max(out["relative_errors"].values()) < 1e-5, out["relative_errors"]


def test_trajectory_optimization_gets_closer_to_the_target(tmp_path):
    gif = str(tmp_path / "t.gif")
    out = _load("trajectory_optimization").main(["--steps", "10", "--iterations", "5", "--gif", gif])
    assert out["losses"][-1] < out["losses"][0]
    assert out["final_distance"] < out["initial_distance"]
    assert os.path.getsize(gif) > 0


def test_locomotion_example_help_gives_every_option_a_sentence(capsys):
    with pytest.raises(SystemExit) as e:
        _load("locomotion").main(["--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    # argparse's help: "  --name TYPE   description" with the description wrapped on indented lines.
    options = re.split(r"\n  (?=--)", text.split("options:\n", 1)[1])[1:]
    names = {re.match(r"--([\w-]+)", o).group(1).replace("-", "_") for o in options}
    assert {f.name for f in dataclasses.fields(TrainConfig)} | {"quick", "resume", "no_progress", "threads"} <= names
    for option in options:
        description = re.sub(r"\(default [^)]*\)", "", re.sub(r"^--[\w-]+( [A-Z_]+)?", "", " ".join(option.split())))
        assert len(description.split()) >= 3, f"--help gives no sentence for: {option}"
    flat = " ".join(text.split())
    assert "The actor's learning rate at the start" in flat  # from TrainConfig's docstring
    assert "(default 300, 120 with --quick)" in flat  # --iterations


def _spin_counts(command, env):
    """The ``GOMP_SPINCOUNT`` that each libgomp started by ``command`` reports (``OMP_DISPLAY_ENV=VERBOSE``), in
    order: 0 when ``OMP_WAIT_POLICY=PASSIVE`` (idle threads sleep), 300000 when it is unset (they spin first)."""
    out = subprocess.run(command, env=dict(env, OMP_DISPLAY_ENV="VERBOSE"), capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    counts = re.findall(r"GOMP_SPINCOUNT = '(\d+)'", out.stderr)
    if not counts:
        pytest.skip("torch's OpenMP runtime is not libgomp (no OMP_DISPLAY_ENV report)")
    return counts


@pytest.mark.parametrize("entry", ["diffsoft-train", "-m diffsoft.cli"])
def test_the_training_command_lets_idle_openmp_threads_sleep(entry):
    # Issue 26: the installed command was 10x slower than examples/locomotion.py at --threads 2, because only the
    # example set OMP_WAIT_POLICY, which libgomp reads once, when torch is imported.
    if entry == "diffsoft-train":
        script = os.path.join(os.path.dirname(sys.executable), "diffsoft-train")
        if not os.path.exists(script):
            pytest.skip(f"no {script}: diffsoft is not installed with its console script in this interpreter")
        command = [sys.executable, script]
    else:
        command = [sys.executable, "-m", "diffsoft.cli"]
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    assert _spin_counts(command + ["--help"], env)[-1] == "0"
    if entry != "diffsoft-train":  # a setting of the user's own is kept, without re-executing
        assert _spin_counts(command + ["--help"], dict(env, OMP_WAIT_POLICY="ACTIVE")) == ["30000000000"]


def test_every_trainconfig_field_is_described_once_in_its_docstring():
    described = field_help(TrainConfig)  # a KeyError names a field without a description
    assert set(described) == {f.name for f in dataclasses.fields(TrainConfig)}
    assert all(len(text.split()) >= 3 for text in described.values()), described


@pytest.mark.parametrize("name", sorted(f[:-3] for f in os.listdir(EXAMPLES) if f.endswith(".py")))
def test_each_example_says_how_to_run_it_with_the_venvs_python(name):
    # A bare "python" is the system's, which does not see Debian's torch or the venv's diffsoft.
    with open(os.path.join(EXAMPLES, name + ".py")) as f:
        doc = ast.get_docstring(ast.parse(f.read()))
    assert re.search(rf"^\s*\.venv/bin/python examples/{name}\.py", doc, flags=re.M), doc
    assert not re.search(r"(?<![/\w])python3? (examples|-m)", doc), doc


def test_the_training_command_called_from_a_users_script_does_not_run_it_again(tmp_path):
    # Re-executing the command line to set OMP_WAIT_POLICY ran the caller's own script twice (or, from stdin,
    # replaced the process by an empty one): from another script, main() warns instead.
    script = tmp_path / "mine.py"
    script.write_text("open('count.txt', 'a').write('x')\nimport sys\nsys.argv = ['mine', '--help']\n"
                      "from diffsoft.cli import main\ntry:\n    main()\nexcept SystemExit:\n    pass\n")
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    out = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "count.txt").read_text() == "x"
    assert "OMP_WAIT_POLICY is not set" in out.stderr and "usage:" in out.stdout
