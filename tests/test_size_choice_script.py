"""scripts/size_choice.py: the leave-one-size-out choice alone; a bank of one size is refused."""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _module():
    spec = importlib.util.spec_from_file_location("size_choice", REPO / "scripts" / "size_choice.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def test_one_model_size_has_nothing_to_choose(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    assert _module().main(["configs/calibration/constant_lr.yaml", "--out", str(tmp_path / "c.json")]) == 2
    assert "one model size" in capsys.readouterr().err and not (tmp_path / "c.json").exists()
