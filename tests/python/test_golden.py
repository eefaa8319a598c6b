"""Every torch diffsoft is tested with gives the golden float64 results stored once (``golden.py``): the same
trajectories and gradients to 1e-10 (relative to each result's size)."""
import pytest
import torch

import golden

STORED = golden.read()


def test_every_case_is_stored():
    assert sorted(STORED) == sorted(golden.CASES)


@pytest.mark.parametrize("case", sorted(golden.CASES))
def test_results_match_the_stored_ones(case):
    results = golden.CASES[case]()
    assert sorted(results) == sorted(STORED[case])
    for name, expected in STORED[case].items():
        actual = results[name]
        scale = expected.abs().max().item()
        torch.testing.assert_close(actual, expected, rtol=1e-10, atol=1e-10 * scale,
                                   msg=lambda m: f"{case}: {name} differs from the stored result: {m}")
