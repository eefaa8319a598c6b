"""The examples on small cases: system identification and trajectory optimisation reduce their losses."""
import importlib.util
import os

import pytest

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


def test_locomotion_example_help():
    with pytest.raises(SystemExit) as e:
        _load("locomotion").main(["--help"])
    assert e.value.code == 0
