"""torch.compile around diffsoft (torch 2.x): a compiled rollout (a policy MLP, then ``sim.step``, for a few steps)
gives what eager gives, in float64 to 1e-12, forward and backward. The step itself runs eagerly (a graph break,
``docs/design.md``: its solve is a C++ Newton loop with data-dependent iteration counts that calls back into
the energy); the policy around it compiles."""
import pytest
import torch

import diffsoft

pytestmark = pytest.mark.skipif(not hasattr(torch, "compile"), reason="torch.compile needs torch 2.x")


def _rollout(sim, policy, x, v, a, steps):
    for _ in range(steps):
        a = policy.act(x, v, a)
        x, v = sim.step(x, v, a)
    return x, v


@pytest.mark.parametrize("backend", ["cpp", "torch"])
def test_a_compiled_rollout_matches_eager(backend):
    torch._dynamo.reset()
    sim = diffsoft.creatures.biped(dtype=torch.float64)
    sim.backend = backend
    policy = diffsoft.FramePolicy.for_simulator(sim)
    x, v = sim.rest_state
    x, v = x.expand(2, -1, -1).clone(), v.expand(2, -1, -1).clone()
    a = torch.ones(2, sim.body.num_muscles, dtype=torch.float64)
    results = []
    for run in (_rollout, torch.compile(_rollout)):
        policy.zero_grad()
        x1, v1 = run(sim, policy, x, v, a, 4)
        loss = x1[..., 0].mean() + 0.1 * v1.square().mean()
        loss.backward()
        results.append([x1.detach(), v1.detach()] + [p.grad.clone() for p in policy.parameters()])
    for eager, compiled in zip(*results):
        torch.testing.assert_close(compiled, eager, rtol=1e-12, atol=1e-12)
