import json
import os
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]


def shared_dir():
    env = os.environ.get("FFKIT_SHARED")
    if env:
        return Path(env)
    return REPO.parent / "shared"


@pytest.fixture(scope="session")
def vectors():
    """Files written by HFAiLab's FFRecord (a copy of shared/testdata/ffrecord
    kept in the repository, so a fresh clone runs these tests)."""
    d = REPO / "ffrecord" / "testdata" / "golden"
    return d, json.loads((d / "expected.json").read_text())


def sample_bytes(i):
    """Deterministic generated sample i: varied lengths, recognisable bytes."""
    n = 17 + (i * 7919) % 300
    return ((np.arange(n, dtype=np.uint32) * 31 + i) % 251).astype(np.uint8).tobytes()


@pytest.fixture(scope="session")
def gen(tmp_path_factory):
    """A generated dataset of 3000 samples in one file."""
    from ffkit.ffrecord import FileWriter

    p = tmp_path_factory.mktemp("gen") / "gen.ffr"
    n = 3000
    with FileWriter(p, n) as w:
        for i in range(n):
            w.write_one(sample_bytes(i))
    return str(p), n
