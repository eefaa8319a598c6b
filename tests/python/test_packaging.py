"""Packaging: ``import diffsoft`` and every module of the package need only torch and numpy; the optional modules
(the extras of setup.py) are imported where used, and their absence is reported with the extra to install; the
test tools (pytest, hypothesis) are never imported by the package."""
import os
import pkgutil
import subprocess
import sys
import textwrap

import diffsoft

OPTIONAL = ["PIL", "matplotlib", "meshio", "tqdm", "scipy", "pytest", "hypothesis", "gymnasium"]
"""The extras' modules and the test tools: none of them may be needed to import the package."""


def _run_without_optional(code, tmp_path):
    """Runs ``code`` in a fresh interpreter where importing any OPTIONAL module fails as if it were missing;
    the list ``attempts`` holds the names of those imports that were tried. It runs from tmp_path so that
    nothing is imported from the working directory; diffsoft comes from where this process imported it."""
    poison = f"""
        import importlib.abc, sys

        attempts = []

        class Missing(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in {OPTIONAL!r}:
                    attempts.append(name)
                    raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
                return None

        sys.meta_path.insert(0, Missing())
        sys.path.insert(0, {os.path.dirname(os.path.dirname(diffsoft.__file__))!r})
    """
    script = textwrap.dedent(poison) + textwrap.dedent(code)
    return subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)


def test_import_and_step_need_only_torch_and_numpy(tmp_path):
    run = _run_without_optional("""
        import torch
        attempts.clear()  # torch tries tqdm (torch.hub); what follows is diffsoft's
        import diffsoft

        verts, tris = diffsoft.mesh.rectangle(0.4, 0.2, 2, 1, dtype=torch.float64)
        sim = diffsoft.Simulator(diffsoft.SoftBody(verts, tris, density=100.0, youngs_modulus=2e3,
                                                   poisson_ratio=0.3))
        x, v = sim.step(*sim.rest_state)
        assert torch.isfinite(x).all() and (x[:, 1] < verts[:, 1]).any()  # gravity pulled it down
        assert not attempts, attempts
        print("stepped")
    """, tmp_path)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "stepped"


def test_every_module_of_the_package_imports_with_only_torch_and_numpy(tmp_path):
    # diffsoft.envs is the rl extra's module: a gymnasium.Env needs gymnasium (its ImportError: below)
    modules = sorted(m.name for m in pkgutil.walk_packages(diffsoft.__path__, "diffsoft.") if m.name != "diffsoft.envs")
    assert {"diffsoft.simulator", "diffsoft.training", "diffsoft.render", "diffsoft.cli"} <= set(modules)
    run = _run_without_optional(f"""
        import importlib
        import torch
        attempts.clear()  # torch tries tqdm (torch.hub); what follows is diffsoft's
        for name in {modules!r}:
            importlib.import_module(name)
        assert not attempts, attempts
        print(len({modules!r}))
    """, tmp_path)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == str(len(modules))


def test_missing_extras_are_named(tmp_path):
    run = _run_without_optional("""
        import torch
        import diffsoft

        verts, tris = diffsoft.mesh.rectangle(dtype=torch.float64)
        sim = diffsoft.Simulator(diffsoft.SoftBody(verts, tris, density=100.0, youngs_modulus=2e3,
                                                   poisson_ratio=0.3))
        for call, extra in [(lambda: diffsoft.render.render_frame(sim, verts), "render"),
                            (lambda: diffsoft.mesh.read("mesh.vtu"), "io"),
                            (lambda: diffsoft.mesh.write("mesh.vtu", verts, tris), "io"),
                            (lambda: __import__("diffsoft.envs"), "rl")]:
            try:
                call()
            except ImportError as e:
                print(e)
            else:
                raise AssertionError(f"no ImportError for diffsoft[{extra}]")
    """, tmp_path)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert len(lines) == 4
    for line, module, extra in zip(lines, ["PIL", "meshio", "meshio", "gymnasium"], ["render", "io", "io", "rl"]):
        assert module in line and f"pip install 'diffsoft[{extra}]'" in line, line


def test_the_cpp_docs_show_the_consumer_as_it_is():
    root = os.path.join(os.path.dirname(__file__), "..", "..")
    with open(os.path.join(root, "docs", "cpp.md")) as f:
        doc = f.read()
    for name, lang in [("CMakeLists.txt", "cmake"), ("main.cpp", "cpp")]:
        with open(os.path.join(root, "examples", "cpp", name)) as f:
            assert f"```{lang}\n{f.read()}```" in doc, f"docs/cpp.md does not show examples/cpp/{name} as it is"
