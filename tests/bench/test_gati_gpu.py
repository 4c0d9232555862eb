"""`benchmarks/gati/gpu.py` runs on a GPU only (its inputs packed from the early-exit benchmark's cache set): what
runs here is its command line and its plot, drawn from the committed GPU and CPU results (the format it writes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.common import RESULTS
from benchmarks.gati import gpu


def test_with_no_mode_it_says_which_to_give(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("sys.argv", ["gpu.py"])
    with pytest.raises(SystemExit) as stopped:
        gpu.main()
    assert stopped.value.code == 2 and "give --pack DIR" in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["gpu", "cpu"])
def test_the_plot_draws_every_committed_result(kind: str, tmp_path: Path) -> None:
    results = sorted(RESULTS.glob(f"gati_{kind}*.json"))
    assert results, f"no committed gati_{kind}*.json"
    gpu.plot(results, tmp_path / f"gati_{kind}.png")
    assert (tmp_path / f"gati_{kind}.png").stat().st_size > 0
