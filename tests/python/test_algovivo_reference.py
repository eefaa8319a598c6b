"""algovivo's own creatures under their pretrained policies (examples/data/algovivo, MIT) walk in diffsoft as
far as recorded: the simulator, the algovivo readers and the policy's frame agree with algovivo's; and, where
node is installed, algovivo itself (its release build, examples/data/algovivo/engine) runs a policy that
diffsoft trained and wrote."""
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from diffsoft import training
from diffsoft.creatures import load_algovivo
from diffsoft.policy import center_of_mass_x, distance_walked, load_algovivo_policy, run_policy
from diffsoft.training import TrainConfig

DATA = Path(__file__).resolve().parents[2] / "examples" / "data" / "algovivo"


@pytest.mark.parametrize("creature, distance", [("biped", 2.862), ("quadruped", 3.503)])
def test_algovivo_pretrained_policies_walk_as_they_do_in_algovivo(creature, distance):
    sim = load_algovivo(str(DATA / creature / "mesh.json"), torch.float64)
    policy = load_algovivo_policy(str(DATA / creature / "policy.json"), torch.float64)
    assert distance_walked(sim, policy, 100) == pytest.approx(distance, abs=2e-3)


ENGINE = DATA / "engine" / "walk.mjs"  # algovivo's release build, run by node
needs_node = pytest.mark.skipif(shutil.which("node") is None, reason="node (to run algovivo itself) is not installed")


def _walk_in_algovivo(mesh, policy, steps, tmp_path):
    """Vertex positions ``(steps + 1, N, 2)`` of ``policy`` run from rest in algovivo itself (walk.mjs writes
    them to a file and prints one line: the distance its centre of mass moved)."""
    positions = tmp_path / "positions.json"
    out = subprocess.run(["node", str(ENGINE), str(mesh), str(policy), str(steps), str(positions)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    with open(positions) as f:
        pos = torch.tensor(json.load(f)["pos"], dtype=torch.float64)
    moved = float(re.fullmatch(rf"{steps} steps: the centre of mass moved (\S+) along \+x; positions in .*\n",
                               out.stdout).group(1))
    assert moved == pytest.approx((pos[-1, :, 0].mean() - pos[0, :, 0].mean()).item(), abs=1e-4)
    return pos


@needs_node
def test_algovivo_itself_walks_its_pretrained_biped_as_recorded(tmp_path):
    mesh = DATA / "biped" / "mesh.json"
    pos = _walk_in_algovivo(mesh, DATA / "biped" / "policy.json", 100, tmp_path)
    com = center_of_mass_x(load_algovivo(str(mesh), torch.float64), pos)
    assert (com[-1] - com[0]).item() == pytest.approx(2.742, abs=1e-3)


@needs_node
def test_a_policy_trained_in_diffsoft_runs_unchanged_in_algovivo(tmp_path):
    # A few iterations of training on algovivo's biped write policy.json in algovivo's format; algovivo's own
    # engine runs that file as it is. The two simulators agree to about 1e-2 over the first steps (algovivo
    # stops its gradient descent at |g|_inf < 5e-6, so one step already differs by about 2e-4, and the walk,
    # chaotic through contacts, drifts from there) and on the distance walked; a policy read in another frame
    # or with its weights laid out otherwise would not.
    mesh = DATA / "biped" / "mesh.json"
    # (The noise and termination pinned: with them these 3 iterations give a policy that moves its body.)
    cfg = TrainConfig(creature=str(mesh), window=8, episode=8, batch=2, iterations=3, lr=0.05, critic_iterations=2,
                      action_noise=0.2, noise_decay_iterations=0, terminate_upright=-1, eval_every=100,
                      checkpoint_every=100, out_dir=str(tmp_path))
    training.train(cfg, progress=False)
    theirs = _walk_in_algovivo(mesh, tmp_path / "policy.json", 100, tmp_path)
    sim = load_algovivo(str(mesh), torch.float64)
    ours = run_policy(sim, load_algovivo_policy(str(tmp_path / "policy.json"), torch.float64), 100)[0][:, 0]
    assert (ours[:11] - theirs[:11]).abs().max() < 0.02
    walked = [(c[-1] - c[0]).item() for c in (center_of_mass_x(sim, theirs), center_of_mass_x(sim, ours))]
    assert abs(walked[0]) > 0.05 and walked[0] == pytest.approx(walked[1], abs=0.1)
