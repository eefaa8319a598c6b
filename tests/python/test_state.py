"""State changed after it was checked (docs/parameters.md, "What the simulator keeps"): every setter checks what
the constructor checks; every tensor the simulator keeps is checked again at the first step after an in-place
change (an optimizer's step), on every path; a tensor a field was derived or converted from does not silently
leave the field stale; and ``to()`` copies with ``torch.Tensor.to``'s semantics."""
import copy

import pytest
import torch

from diffsoft import creatures, mesh
from diffsoft.body import SoftBody, Stamped
from diffsoft.colliders import Sphere
from diffsoft.simulator import Simulator
from diffsoft.terms import Term

from conftest import F32, F64, small_sim

PATHS = {"cpp": dict(backend="cpp"), "torch": dict(backend="torch"), "plain": dict(fused=False)}


@pytest.fixture(params=list(PATHS))
def path(request):
    return PATHS[request.param]


def _step(sim):
    x, v = sim.rest_state
    return sim.step(x + 0.01 * torch.sin(3 * x.flip(-1)), v + 0.1)[0]


def _optimizer_step(t, amount):
    """What an optimizer does to a parameter: an in-place update under no_grad (its version counter moves)."""
    with torch.no_grad():
        t.add_(amount)


# --- an optimizer stepping a parameter out of its range ------------------------------------------------------

@pytest.mark.parametrize("name, amount", [("dt", -1.0), ("gravity", -20.0), ("contact_stiffness", -1e9),
                                          ("friction", float("nan")), ("ground", float("inf")),
                                          ("friction_eps", -1.0)])
def test_a_constant_driven_out_of_range_in_place_raises_at_the_next_step(path, name, amount):
    sim = small_sim(**path)
    value = torch.tensor(float(getattr(sim, name)), dtype=F64, requires_grad=True)
    setattr(sim, name, value)
    optimizer = torch.optim.SGD([value], lr=1.0)
    value.grad = torch.tensor(-amount, dtype=F64)
    optimizer.step()
    with pytest.raises(ValueError, match=rf"{name} was changed in place .* out of its range: it must be"):
        _step(sim)


@pytest.mark.parametrize("name, edit", [
    ("mu", lambda t: t.mul_(-1.0)), ("lam", lambda t: t.fill_(-5.0)), ("mass", lambda t: t.__setitem__(2, float("nan"))),
    ("muscle_rest_length", lambda t: t.zero_()), ("muscle_stiffness", lambda t: t.mul_(-1.0)),
    ("Dm_inv", lambda t: t[1].copy_(t[1] @ torch.diag(torch.tensor([-1.0, 1.0], dtype=t.dtype)))),
])
def test_a_body_field_changed_in_place_out_of_range_raises_at_the_next_step(path, name, edit):
    """A negative Lame parameter, a NaN mass, an inverted rest shape, ...: the constructor's checks again."""
    sim = small_sim(**path)
    field = getattr(sim.body, name).detach().clone().requires_grad_()
    setattr(sim.body, name, field)
    _step(sim)
    with torch.no_grad():
        edit(field)
    with pytest.raises(ValueError, match=rf"body.{name}"):
        _step(sim)


def test_a_parameter_changed_in_place_within_range_takes_effect(path):
    """What an optimizer is for: the next step uses the new values, as a simulator built with them does."""
    sim = small_sim(**path)
    mu = sim.body.mu.detach().clone().requires_grad_()
    dt = torch.tensor(0.02, dtype=F64, requires_grad=True)
    sim.body.mu, sim.dt = mu, dt
    _step(sim)
    _optimizer_step(mu, mu.detach() * 0.5)
    _optimizer_step(dt, -0.005)
    fresh = small_sim(**path)
    fresh.body.mu, fresh.dt = mu.detach() * 1.0, 0.015
    torch.testing.assert_close(_step(sim), _step(fresh), rtol=0, atol=1e-12)


# --- setters check what the constructor checks ---------------------------------------------------------------

@pytest.mark.parametrize("assign, error, match", [
    (lambda s: setattr(s.body, "mu", -s.body.mu), ValueError, "body.mu must be positive: element 0"),
    (lambda s: setattr(s.body, "lam", torch.full_like(s.body.lam, -1.0)), ValueError,
     "body.lam must be >= 0 for material 'neo_hookean'"),
    (lambda s: setattr(s.body, "mass", s.body.mass * float("nan")), ValueError, "body.mass has non-finite"),
    (lambda s: setattr(s.body, "mass", 0.0), ValueError, "body.mass must be positive"),
    (lambda s: setattr(s.body, "Dm_inv", torch.zeros_like(s.body.Dm_inv)), ValueError, r"body.Dm_inv\[0\] is singular"),
    (lambda s: setattr(s.body, "Dm_inv", s.body.Dm_inv @ torch.diag(torch.tensor([-1.0, 1.0], dtype=F64))), ValueError,
     r"element 0 \[.*\] is inverted or degenerate in vertices relative to its rest shape Dm_inv"),
    (lambda s: setattr(s.body, "muscle_rest_length", s.body.muscle_rest_length[:1]), ValueError,
     r"body.muscle_rest_length has shape \(1,\), but the body has 2 muscles"),
    (lambda s: setattr(s.body, "muscle_stiffness", torch.tensor(0.0, dtype=F64)), ValueError,
     "body.muscle_stiffness must be positive"),
    (lambda s: setattr(s.body, "muscles", [[0, 0]]), ValueError, "muscle 0 joins vertex 0 to itself"),
    (lambda s: setattr(s.body, "muscles", [[0, 99]]), ValueError, "out of range for 6 vertices"),
    (lambda s: setattr(s.body, "elements", s.body.elements[:-1]), ValueError,
     "body.elements has 3 rows, but the body's per-element fields .* have 4"),
    (lambda s: setattr(s.body, "elements", s.body.elements[:, [0, 2, 1]]), ValueError,
     "is inverted or degenerate in vertices relative to its rest shape"),
    (lambda s: setattr(s.body, "elements", s.body.elements.float()), TypeError, "integer vertex indices"),
    (lambda s: setattr(s.body, "mu", s.body.mu.float()), TypeError, "body.mu has dtype torch.float32"),
    (lambda s: setattr(s.body, "rest_positions", s.body.rest_positions * 2), AttributeError, "cannot be reassigned"),
    (lambda s: setattr(s, "gravity", -9.8), ValueError, "gravity must be a non-negative number"),
    (lambda s: setattr(s, "contact_stiffness", torch.tensor(-1.0)), ValueError, "contact_stiffness must be"),
    (lambda s: setattr(s, "fused", "yes"), TypeError, "fused must be True or False"),
    (lambda s: setattr(s, "solver", "lu"), ValueError, "solver must be 'auto', 'direct' or 'cg'"),
    (lambda s: setattr(s, "body", s.body), AttributeError, "Simulator.body cannot be reassigned"),
])
def test_setters_refuse_what_the_constructor_refuses(assign, error, match):
    sim = small_sim()
    before = _step(sim)
    with pytest.raises(error, match=match):
        assign(sim)
    torch.testing.assert_close(_step(sim), before, rtol=0, atol=0)  # nothing was changed


def test_a_material_whose_energy_is_unbounded_with_these_lame_parameters_is_refused():
    v, t = mesh.rectangle(0.4, 0.2, 2, 1, dtype=F64)
    body = SoftBody(v, t, material="stable_neo_hookean", density=100.0, youngs_modulus=2e3, poisson_ratio=-0.3)
    with pytest.raises(ValueError, match="body.lam must be >= 0 for material 'neo_hookean'"):
        body.material = "neo_hookean"
    assert body.material == "stable_neo_hookean"


def test_muscles_of_another_number_need_their_rest_lengths_and_stiffnesses():
    sim = small_sim()
    sim.body.muscles = [[0, 4], [1, 5], [2, 3]]
    with pytest.raises(ValueError, match="body.muscles has 3 muscles but body.muscle_rest_length has 2 values"):
        _step(sim)
    sim.body.muscle_rest_length = torch.tensor([0.2, 0.2, 0.2], dtype=F64)
    sim.body.muscle_stiffness = torch.tensor([30.0, 40.0, 50.0], dtype=F64)
    x, v = sim.rest_state
    assert torch.isfinite(sim.step(x, v, torch.full((3,), 0.8, dtype=F64))[0]).all()


# --- what the body derived or converted, and what it keeps read-only ------------------------------------------

@pytest.mark.parametrize("argument, fields", [("youngs_modulus", "mu, lam"), ("density", "mass"),
                                              ("vertices", "rest_positions")])
def test_a_tensor_a_field_was_derived_from_changed_in_place_raises(argument, fields):
    v, t = mesh.rectangle(0.4, 0.2, 2, 1, dtype=F64)
    args = dict(vertices=v.clone(), density=torch.tensor(100.0, dtype=F64),
                youngs_modulus=torch.full((len(t),), 2e3, dtype=F64), poisson_ratio=0.3)
    sim = Simulator(SoftBody(elements=t, **args), dt=0.02)
    _step(sim)
    _optimizer_step(args[argument], args[argument].detach() * 0.1)
    match = (f"{argument} was changed in place after the body was made from it, but the body's {fields}"
             if argument != "vertices" else "body.rest_positions was changed in place")
    with pytest.raises(ValueError, match=match):
        _step(sim)
    if argument == "youngs_modulus":  # assigning the derived fields makes the body whole again
        sim.body.mu, sim.body.lam = sim.body.mu * 1.1, sim.body.lam * 1.1
        _step(sim)


def test_an_argument_kept_as_a_field_is_watched_as_that_field():
    """A tensor given in the body's dtype is the field itself: an optimizer moves it, and the field's checks
    apply (what was derived from it, here the default muscle stiffness, stays as an assignment would leave it)."""
    v, t = mesh.rectangle(0.4, 0.2, 2, 1, dtype=F64)
    mu = torch.full((len(t),), 700.0, dtype=F64, requires_grad=True)
    sim = Simulator(SoftBody(v, t, mass=1.0, mu=mu, lam=300.0, muscles=[[0, 4]]), dt=0.02)
    assert sim.body.mu is mu
    _step(sim)
    _optimizer_step(mu, 100.0)
    _step(sim)
    _optimizer_step(mu, -2000.0)
    with pytest.raises(ValueError, match="body.mu must be positive"):
        _step(sim)


def test_a_converted_argument_changed_in_place_raises():
    v, t = mesh.rectangle(0.4, 0.2, 2, 1, dtype=F64)
    mu = torch.full((len(t),), 700.0)  # float32: the float64 body keeps a converted copy
    body = SoftBody(v, t, mass=1.0, mu=mu, lam=300.0)
    sim = Simulator(body, dt=0.02)
    _step(sim)
    _optimizer_step(mu, 10.0)
    with pytest.raises(ValueError, match="^mu was changed in place .* body's mu was computed or converted from it"):
        _step(sim)


def test_derived_read_only_fields_changed_in_place_are_refused():
    sim = small_sim(fixed=[0])
    _step(sim)
    sim.body.free[0] = 0
    with pytest.raises(ValueError, match="body.free was changed in place.*assign body.fixed"):
        _step(sim)


def test_nothing_changed_costs_no_check():
    """Unchanged fields are not checked again at a step: the check compares version counters only."""
    sim = small_sim()
    _step(sim)
    calls = []
    original = sim.body._check_field
    sim.body._check_field = lambda *a: calls.append(a[0]) or original(*a)
    _step(sim)
    assert calls == []
    _optimizer_step(sim.body.mass, 0.0)
    _step(sim)
    assert calls == ["mass"]


def test_inference_tensors_are_checked_by_their_values():
    """Inference tensors have no version counter: their values tell whether they changed."""
    with torch.inference_mode():
        sim = small_sim()
        bad = sim.body.mu * -1.0
    with pytest.raises(ValueError, match="body.mu must be positive"):
        sim.body.mu = bad
    with torch.inference_mode():
        _step(sim)
        sim.body.mass.mul_(-1.0)
        with pytest.raises(ValueError, match="body.mass must be positive"):
            _step(sim)


# --- copies: Simulator.to and SoftBody.to ------------------------------------------------------------------------

def _float32(sim):
    small = sim.to(F32)
    small.solver_options.update(rtol=None, atol=1e-5)  # float32 round-off
    return small


def test_to_is_tensor_to_a_new_simulator_whose_tensors_are_differentiable_functions_of_the_original():
    sim = small_sim()
    assert sim.to(F64) is sim and sim.body.to(device="cpu") is sim.body  # nothing to change: no copy
    mu = sim.body.mu.detach().clone().requires_grad_()
    friction = torch.tensor(3.0, dtype=F64, requires_grad=True)
    sim.body.mu, sim.friction = mu, friction
    small = _float32(sim)
    assert small.body.dtype == F32 and small.body.mu.dtype == F32 and small.friction.dtype == F32
    assert small.body.mu.data_ptr() != mu.data_ptr()  # storage of its own
    loss = _step(small)[:, 0].sum()
    g_mu, g_friction = torch.autograd.grad(loss, (mu, friction))
    g64_mu, g64_friction = torch.autograd.grad(_step(sim)[:, 0].sum(), (mu, friction))
    torch.testing.assert_close(g_mu, g64_mu, rtol=2e-2, atol=1e-6 * g64_mu.abs().max().item())
    torch.testing.assert_close(g_friction, g64_friction, rtol=2e-2, atol=1e-8)


def test_a_copy_does_not_follow_the_originals_later_in_place_changes_and_says_so():
    sim = small_sim()
    mu = sim.body.mu.detach().clone()
    sim.body.mu = mu
    sim.dt = torch.tensor(0.02, dtype=F64)
    small = _float32(sim)
    before = _step(small)
    _optimizer_step(small.body.mu, 1.0)  # the copy's own: its original is untouched
    assert torch.equal(sim.body.mu, mu) and torch.equal(mu, sim.body.mu)
    small = _float32(sim)
    _optimizer_step(mu, 1.0)
    with pytest.raises(ValueError, match="the original body's mu .*copy by SoftBody.to.* was changed in place"):
        _step(small)
    small = _float32(sim)
    torch.testing.assert_close(_step(small), before, rtol=1e-3, atol=1e-4)  # to() again: follows
    _optimizer_step(sim.dt, 0.001)
    with pytest.raises(ValueError, match="sim.dt is a copy made by Simulator.to of a tensor that was changed in place"):
        _step(small)
    # the colliders' and the terms' tensors likewise (their copies followed nothing, and said nothing)
    center, target = torch.tensor([0.1, -1.0], dtype=F64), torch.zeros(2, dtype=F64)
    sim = small_sim(ground=None, colliders=[Sphere(center, 1.0)],
                    terms=[Term(lambda x, x0, h, t: (x - t).square().sum((-1, -2)), rows=[[0]], params=(target,))])
    small = _float32(sim)
    _step(small)
    for tensor, name in ((center, r"sim.colliders\[0\].center"), (target, r"sim.terms\[0\].params")):
        small = _float32(sim)
        with torch.no_grad():
            tensor.add_(0.01)
        with pytest.raises(ValueError, match=f"{name} (is|holds) a copy made by Simulator.to of a tensor that was "
                                             f"changed in place"):
            _step(small)


def test_a_copy_of_a_copy_does_not_follow_the_original_either_and_says_so():
    """``sim.to(a).to(b)``: the second copy came from the first, which nothing changes in place; what the first
    came from stays watched in the second (before, the second stepped on the original's old values, silently),
    for the body's fields, the constants, the colliders' and the terms' tensors, and from a constructor argument."""
    youngs = torch.tensor(2e3, dtype=F64)
    center, target = torch.tensor([0.1, -1.0], dtype=F64), torch.zeros(2, dtype=F64)

    def make():
        body = SoftBody(*mesh.rectangle(0.4, 0.2, 2, 1, dtype=F64), density=100.0, youngs_modulus=youngs,
                        poisson_ratio=0.3)
        sim = Simulator(body, ground=None, colliders=[Sphere(center, 1.0)],
                        terms=[Term(lambda x, x0, h, t: (x - t).square().sum((-1, -2)), rows=[[0]], params=(target,))])
        sim.body.mu = sim.body.mu.detach().clone()
        sim.dt = torch.tensor(0.02, dtype=F64)
        return sim

    edits = {"body.mu": (lambda sim: sim.body.mu, "the original body's mu .*copy by SoftBody.to.* was changed"),
             "dt": (lambda sim: sim.dt, r"sim.dt is a copy made by Simulator.to"),
             "collider": (lambda sim: center, r"sim.colliders\[0\].center is a copy made by Simulator.to"),
             "term": (lambda sim: target, r"sim.terms\[0\].params holds a copy made by Simulator.to")}
    for name, (tensor, message) in edits.items():
        sim = make()
        twice = sim.to(F32).to(F64)
        _step(twice)  # (it steps while nothing changed)
        _optimizer_step(tensor(sim), 1e-3)
        with pytest.raises(ValueError, match=message):
            _step(twice)
    sim = make()
    twice = sim.to(F32).to(F64)
    _optimizer_step(youngs, 1.0)  # what the original's lam was computed from (mu was assigned anew)
    with pytest.raises(ValueError, match="youngs_modulus was changed in place after the body was made from it"):
        _step(twice)


def test_deep_copies_and_pickles_of_copies_keep_saying_what_they_follow():
    """A deep copy's tensors have version counters of their own: a copy (by ``to``) whose original was stepped by
    an optimizer before it was deep-copied or pickled steps (before, a false alarm once the original's counter
    was past 1), and one whose original changed after it was made still raises."""
    import pickle
    center = torch.tensor([0.1, -1.0], dtype=F64)
    sim = small_sim(ground=None, colliders=[Sphere(center, 1.0)])
    for _ in range(3):
        _optimizer_step(center, 0.0)
    twice = sim.to(F32).to(F64)
    for copied in (copy.deepcopy(twice), pickle.loads(pickle.dumps(twice))):
        _step(copied)
    _optimizer_step(center, 1e-3)
    for copied in (copy.deepcopy(twice), pickle.loads(pickle.dumps(twice))):
        with pytest.raises(ValueError, match=r"sim.colliders\[0\].center is a copy made by Simulator.to .*call "
                                             r"to\(\) again from the original"):
            _step(copied)


def test_deep_copies_step_like_the_original_and_are_checked_afresh():
    sim = small_sim()
    sim.body.mu = sim.body.mu.detach().clone()
    _step(sim)
    other = copy.deepcopy(sim)
    torch.testing.assert_close(_step(other), _step(sim), rtol=0, atol=0)
    with torch.no_grad():
        other.body.mu.mul_(-1.0)
    with pytest.raises(ValueError, match="body.mu must be positive"):
        _step(other)
    _step(sim)


def test_creatures_keep_working_across_to_and_back():
    sim = creatures.biped(dtype=F64)
    back = sim.to(F32).to(F64)
    assert back is not sim
    torch.testing.assert_close(_step(back), _step(sim), rtol=1e-5, atol=1e-6)


def test_the_step_problems_constants_changed_in_place_do_not_leak_into_later_steps():
    """``step_problem`` hands out the step's parameters; a number's tensor is cached for every step: one changed
    in place by a caller is made anew, not used by the next step."""
    sim = small_sim()
    before = _step(sim)
    x, v = sim.rest_state
    params, _ = sim.step_problem(x, v, torch.full((2,), 0.8, dtype=F64))
    params.colliders[0][2].add_(1.0)  # the ground's friction_eps: a number's tensor (given as a number)
    torch.testing.assert_close(_step(sim), before, rtol=0, atol=0)


def test_the_default_atol_follows_the_body():
    """The default tolerance is a force scale of the body: made 1000x stiffer (or another material), the body's
    steps are judged by its own scale, as a fresh simulator's are; an atol the user set is kept."""
    sim = small_sim(atol=None)
    first = sim.solver_options["atol"]
    sim.body.mu, sim.body.lam = sim.body.mu * 1000, sim.body.lam * 1000
    _step(sim)
    fresh = Simulator(sim.body, dt=0.02, rtol=sim.solver_options["rtol"])
    assert sim.solver_options["atol"] == fresh.solver_options["atol"] > 100 * first
    sim.solver_options["atol"] = 1e-3
    sim.body.material = "stable_neo_hookean"
    _step(sim)
    assert sim.solver_options["atol"] == 1e-3
    sim.solver_options["atol"] = None  # the default again
    _step(sim)
    assert sim.solver_options["atol"] == Simulator(sim.body, dt=0.02).solver_options["atol"]
    small = sim.to(F32)  # a default atol becomes the new dtype's default
    small.step_problem(*small.rest_state, torch.full((2,), 0.8, dtype=F32))
    assert small.solver_options["atol"] == pytest.approx(Simulator(small.body, dt=0.02).solver_options["atol"])
    assert small.solver_options["atol"] > 100 * sim.solver_options["atol"]


def test_cache_keys_hold_their_tensors_not_their_ids():
    """The step's topology, the default atol and body.free are cached on keys of the tensors they came from.
    A key of ``id(t)`` and its version missed a reassignment whenever the new tensor reused a collected one's
    id (both at version 0): the stateful campaign met a stale body.free (a valid state refused) and a stale
    default atol. A key that holds the tensor tells the new one from the old whatever their ids."""
    old = torch.zeros(3)
    assert Stamped(old) == Stamped(old) and Stamped(old) != Stamped(torch.zeros(3))
    key = Stamped(old)
    old.add_(1.0)
    assert key != Stamped(old)
    sim = small_sim()
    body = sim.body
    with torch.no_grad():
        body.free.add_(0)  # in place: free is derived from fixed
    with pytest.raises(ValueError, match="body.free was changed in place"):
        body.free
    body.fixed = body.fixed.clone()  # a new tensor: free is made again from it
    assert torch.equal(body.free, torch.arange(body.num_vertices)[~torch.isin(torch.arange(body.num_vertices), body.fixed)])
    before = body.structure()
    body.elements = body.elements.clone()
    assert body.structure() != before


def test_on_terrain_copies_and_to_leave_the_simulators_records_as_they_were():
    # Reviews: on_terrain's exit assigned the ground again, forgetting that it was a copy of Simulator.to's
    # (the copy then ignored its original's in-place changes) and re-checking it (an invalid one left the terrain
    # installed); copy.copy shared solver_options (a copy's default atol froze the original's); to() showed the
    # old dtype's default atol until the first step.
    import copy
    from diffsoft import terrain
    sim = creatures.biped(dtype=torch.float64)
    g = torch.tensor(0.0, dtype=torch.float64, requires_grad=True)
    sim.ground = g
    s32 = sim.to(torch.float32)
    x, v = s32.rest_state
    with terrain.on_terrain(s32, terrain.random_heights(s32, 5)):
        pass
    with torch.no_grad():
        g.add_(0.01)
    with pytest.raises(ValueError, match="sim.ground is a copy made by Simulator.to"):
        s32.step(x, v)
    s = creatures.biped(dtype=torch.float64)
    gt = torch.tensor(0.0, dtype=torch.float64)
    s.ground = gt
    with terrain.on_terrain(s, terrain.random_heights(s, 5)):
        gt.fill_(float("nan"))
    assert s.ground is gt and s.colliders == ()
    c = copy.copy(sim)
    assert c.solver_options is not sim.solver_options
    assert sim.to(torch.float32).solver_options["atol"] == creatures.biped(dtype=torch.float32).solver_options["atol"]
