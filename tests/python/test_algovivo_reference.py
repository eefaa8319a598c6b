"""algovivo's own creatures under their pretrained policies (examples/data/algovivo, MIT) walk in diffsoft as
far as recorded: the simulator, the algovivo readers and the policy's frame agree with algovivo's."""
from pathlib import Path

import pytest
import torch

from diffsoft.creatures import load_algovivo
from diffsoft.policy import distance_walked, load_algovivo_policy

DATA = Path(__file__).resolve().parents[2] / "examples" / "data" / "algovivo"


@pytest.mark.parametrize("creature, distance", [("biped", 2.862), ("quadruped", 3.503)])
def test_algovivo_pretrained_policies_walk_as_they_do_in_algovivo(creature, distance):
    sim = load_algovivo(str(DATA / creature / "mesh.json"), torch.float64)
    policy = load_algovivo_policy(str(DATA / creature / "policy.json"), torch.float64)
    assert distance_walked(sim, policy, 100) == pytest.approx(distance, abs=2e-3)
