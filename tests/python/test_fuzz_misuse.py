"""Fuzzing the public entry points with wrong values (seeded hypothesis; benchmarks/fuzz_report.py runs 10,000
cases of the same): every value is either accepted with a finite result (a valid value) or refused with an
error that names the argument (an invalid one). See check_misuse in
tests/python/fuzzing.py for the classes."""
import itertools

import pytest
import torch
from hypothesis import given

from conftest import DTYPES
from fuzzing import _LOOK_ALIKES, _MISTAKES, MISUSE_TARGETS, check_misuse, fuzz, misuse_cases


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_target_with_every_listed_mistake(dtype):
    findings = []
    for target, value in itertools.product(range(len(MISUSE_TARGETS)), _MISTAKES + _LOOK_ALIKES):
        outcome, detail = check_misuse(target, value, dtype)
        if outcome not in ("right answer", "clear error"):
            findings.append(f"{outcome}: {detail}")
    assert not findings, "\n".join(findings)


@fuzz(150)
@given(case=misuse_cases)
def test_random_values_are_accepted_or_refused_by_name(case):
    outcome, detail = check_misuse(**case)
    assert outcome in ("right answer", "clear error"), detail


def test_the_classifier_catches_silence():
    """An invalid value that is accepted is 'silent' (the harness is not vacuous)."""
    target = next(i for i, t in enumerate(MISUSE_TARGETS) if t[:2] == ("minimize", "max_iter"))
    assert check_misuse(target, 5)[0] == "right answer"
    assert check_misuse(target, -1)[0] == "clear error"
    entry, name, call, valid = MISUSE_TARGETS[target]
    assert not valid(2.5, torch.float64)
