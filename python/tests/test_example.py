"""examples/torch_prefix_reuse.py runs as a user runs it (small sizes), on an
embedded cluster and against daemons: it reuses the whole prefix and its
logits with and without reuse are identical (it exits 1 otherwise)."""

import os
import re
import subprocess
import sys

import pytest

from conftest import SOURCE_DIR, scaled

EXAMPLE = os.path.join(SOURCE_DIR, "examples", "torch_prefix_reuse.py")
SMALL = ["--runs", "2", "--prefix-tokens", "256", "--suffix-tokens", "24", "--chunk-tokens", "128",
         "--layers", "2", "--d-model", "128"]


def run(extra):
    p = subprocess.run([sys.executable, EXAMPLE] + SMALL + extra, capture_output=True, text=True, timeout=scaled(120),
                       env=dict(os.environ))
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


@pytest.mark.parametrize("where", ["embedded", "daemons"])
def test_example_reuses_the_prefix_with_identical_logits(where, request):
    extra = [] if where == "embedded" else ["--coordinator", request.getfixturevalue("daemons").address]
    out = run(extra)
    rows = [line.split() for line in out.splitlines() if re.match(r"^\s+\d+\s", line)]
    assert len(rows) == 2
    assert all(r[5] == "256" and r[-1] == "yes" for r in rows)  # every prefix token reused
    assert "logits with reuse == logits without reuse (torch.equal) in all 2 runs" in out
    m = re.search(r"median TTFT: without reuse ([\d.]+) ms, with reuse ([\d.]+) ms", out)
    assert m and float(m.group(1)) > 0 and float(m.group(2)) > 0
