"""A benchmark's source line names the commit the diffsoft it ran was built from, where that is not the
checkout's: an installed copy (the pip leg's venv) runs the code of when it was installed."""
import sys
from pathlib import Path

import diffsoft

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import provenance  # noqa: E402


def test_the_build_records_its_torch_and_its_commit():
    from diffsoft import _build_info

    assert _build_info.TORCH_VERSION
    assert _build_info.SOURCE_COMMIT is None or isinstance(_build_info.SOURCE_COMMIT, str)


def test_the_source_line_names_a_build_from_another_commit(monkeypatch):
    monkeypatch.setattr(provenance, "checkout_commit", lambda: "1111111")
    monkeypatch.setattr(provenance, "built_commit", lambda: "1111111")
    # an editable install, whatever this venv's is (the pip leg's is a copy)
    monkeypatch.setattr(diffsoft, "__file__", str(Path(provenance.ROOT) / "python" / "diffsoft" / "__init__.py"))
    assert provenance.commit() == "commit 1111111"
    monkeypatch.setattr(provenance, "built_commit", lambda: "2222222 with uncommitted changes")
    assert provenance.commit() == "commit 1111111 (diffsoft's compiled core built at 2222222 with uncommitted changes)"
    installed = "/somewhere/site-packages/diffsoft/__init__.py"  # not this checkout's python/: an installed copy
    monkeypatch.setattr(diffsoft, "__file__", installed)
    assert provenance.commit() == (f"commit 1111111 (diffsoft installed from 2222222 with uncommitted changes, "
                                   f"{installed})")
    monkeypatch.setattr(provenance, "built_commit", lambda: None)
    assert "installed from an unrecorded commit" in provenance.commit()
