"""scripts/unit_mix.py reads libtpu's per-bundle utilisation table correctly."""

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "unit_mix.py"


def _module():
    spec = importlib.util.spec_from_file_location("unit_mix", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_shares_are_per_bundle_and_per_slot():
    # The table as libtpu 0.0.42.1 writes it (its header misspells CAPACITY).
    text = ("== CAPACTIY:\nMXU, VALU, VSTORE\n    4     4     1\n== UTILIZATION:\n"
            "0 0 0\n4 2 1\n2 0 1\n0 4 0\n")
    out = _module().parse_utilisation(text)
    assert out["bundles"] == 4
    assert out["units"]["MXU"] == (0.5, 6 / 16)
    assert out["units"]["VALU"] == (0.5, 6 / 16)
    assert out["units"]["VSTORE"] == (0.5, 0.5)


def test_a_missing_kernel_file_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("sys.argv", ["unit_mix.py", str(tmp_path / "nope.py")])
    assert _module().main() == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "is not a file" in err
