"""The stateful campaign's first sequences, in the suite (tests/python/stateful_campaign.py runs 10,000 of them;
docs/reliability.md has the counts): no unclear error and no silent answer."""
import stateful_campaign


def test_stateful_campaign_finds_nothing():
    counts, findings = stateful_campaign.run_sequences(0, stateful_campaign.PYTEST_SEQUENCES)
    assert not findings, "\n".join(findings[:20])
    outcomes = {o for _, o in counts}
    assert {"right answer", "clear error"} <= outcomes  # both kinds were tried


def test_the_campaign_catches_silence(monkeypatch):
    """A library that stopped checking an in-place change would be caught (the harness is not vacuous)."""
    from diffsoft.body import SoftBody
    monkeypatch.setattr(SoftBody, "check", lambda self: None)
    findings = []
    for k in range(25):
        findings += [o for o in stateful_campaign.Sequence(k).run() if o[1] == "silent"]
    assert any(rule.startswith("in_place/") for rule, _, _ in findings)
