"""The Python client against a live cluster: run under `loco up --workers 2 --` (ctest
python_client), which sets $LOCO_ADDRESS; the working directory is the nodes' data root."""
import os
import random
import uuid
from pathlib import Path

import pytest

import loco


@pytest.fixture(scope="module")
def corpus() -> str:
    folder = Path("data") / f"py-{uuid.uuid4().hex[:8]}"
    (folder / "corpus").mkdir(parents=True)
    words = "in the beginning god created the heaven and the earth and it was good".split()
    rng = random.Random(5)
    with open(folder / "corpus" / "a.txt", "w") as f:
        for _ in range(6000):
            f.write(" ".join(rng.choice(words) for _ in range(10)) + "\n")
    return str(folder)


def tiny_job(corpus: str, **over) -> dict:
    job = {
        "name": "py-tiny", "seed": 1, "threads": 1,
        "model": {"layers": 2, "width": 32, "heads": 2, "context": 32},
        "data": {"dir": corpus, "tokenizer": "byte", "shards": 8, "val_fraction": 0.05},
        "workers": {"count": 2, "min": 2, "max": 4},
        "inner": {"steps": 5, "batch_size": 4, "lr": 0.003, "warmup": 2},
        "outer": {"lr": 0.7, "momentum": 0.9, "nesterov": True},
        "rounds": 3,
        "checkpoint": {"dir": f"ck/{uuid.uuid4().hex[:8]}", "every": 100},
        "eval": {"every": 5, "batches": 1},
    }
    job.update(over)
    return job


@pytest.fixture(scope="module")
def client() -> loco.Client:
    assert os.environ.get("LOCO_ADDRESS"), "run under `loco up --workers 2 --`"
    return loco.connect()


def test_a_job_from_a_dict_runs_to_the_end_and_its_figures_come_back(client, corpus):
    job = loco.submit(tiny_job(corpus), set={"rounds": 3})
    reports = list(job.follow(poll_s=0.2, timeout_s=300))
    assert [r["round"] for r in reports if r["round"] > 0] == [1, 2, 3]
    assert all(r["rounds"] == 3 for r in reports)
    assert job.status()["state"] == "succeeded"
    rows = job.metrics()
    assert [r["round"] for r in rows] == [r["round"] for r in reports]
    last = rows[-1]
    assert 0 < last["val_loss"] < rows[0]["val_loss"], rows  # it learned something
    assert last["workers"] == 2 and isinstance(last["workers"], int)
    assert last["bytes_per_worker"] > 0
    lines = job.logs()
    assert lines and all(isinstance(l, str) for l in lines)
    assert job.id in [j["id"] for j in loco.jobs()]


def test_a_job_file_with_set_overrides_is_checked_before_it_is_sent(client, corpus, tmp_path):
    path = tmp_path / "job.yaml"
    import json
    path.write_text(json.dumps(tiny_job(corpus)))
    before = {j["id"] for j in loco.jobs()}
    with pytest.raises(loco.ConfigError) as refused:
        loco.submit(path, set={"inner.lr": -1})
    assert "inner.lr" in str(refused.value) and str(path) in str(refused.value)
    assert isinstance(refused.value, ValueError)
    with pytest.raises(loco.ConfigError, match="inner.steps"):
        loco.submit(tiny_job(corpus, inner={"steps": 0, "batch_size": 4, "lr": 0.003}))
    assert {j["id"] for j in loco.jobs()} == before  # nothing reached the cluster


def test_scale_and_cancel_a_running_job(client, corpus):
    job = loco.submit(tiny_job(corpus, rounds=200))
    first = next(iter(job.follow(poll_s=0.2, timeout_s=120)))
    assert first["rounds"] == 200
    assert job.scale(3)["scale"] == 3
    with pytest.raises(loco.Error, match="workers.max"):
        job.scale(9)
    job.cancel()
    assert job.wait(poll_s=0.2, timeout_s=120)["state"] == "cancelled"


def test_status_shows_the_two_nodes(client):
    s = loco.status()
    alive = [n for n in s["nodes"] if n["state"] == "alive"]
    assert len(alive) == 2
    assert all(n["resources"].get("cpu", 0) > 0 for n in alive)


def test_no_head_at_an_address_is_a_cluster_error():
    with pytest.raises(loco.ClusterError):
        loco.Client("127.0.0.1:9", timeout_s=1.0)
