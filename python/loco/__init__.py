"""loco's Python client: submit DiLoCo jobs to a loco cluster and follow them.

    import loco
    loco.connect("hostA:7070", key="~/.loco/cluster.key")
    job = loco.submit("job.yaml", set={"inner.lr": 3e-4, "workers.count": 8})
    for report in job.follow():
        print(report["round"], report["loss"], report.get("val_loss"))
    rows = job.metrics()            # one dict per round: pandas.DataFrame(rows)

What the `loco` command line does, with the same checks and messages: a job file is checked
field by field before it is sent (ConfigError names the field), and the cluster's refusals
come back as loco.Error and its kinds.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Mapping, Optional, Union

from . import _native
from ._native import (ActorDiedError, ActorNotFoundError, ClusterError, ConfigError, Error,
                      PermissionError, ProtocolError, RemoteError, SchedulingError,
                      TimeoutError)

__version__ = _native.version
__all__ = [
    "connect", "submit", "status", "jobs", "job", "Client", "Job", "Error", "ClusterError",
    "ConfigError", "TimeoutError", "PermissionError", "ActorDiedError", "ActorNotFoundError",
    "RemoteError", "SchedulingError", "ProtocolError",
]

JobFile = Union[str, os.PathLike, Mapping[str, Any]]
_ENDED = ("succeeded", "failed", "cancelled")


def _default_address() -> str:
    """As the CLI finds the head: $LOCO_ADDRESS, the address `loco start --head` or `loco up`
    left in the state folder, else 127.0.0.1:7070."""
    if os.environ.get("LOCO_ADDRESS"):
        return os.environ["LOCO_ADDRESS"]
    state = os.environ.get("LOCO_STATE_DIR") or f"/tmp/loco-{os.getuid()}"
    try:
        return Path(state, "head_address").read_text().split()[0]
    except (OSError, IndexError):
        return "127.0.0.1:7070"


def _set_value(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


class Job:
    """A submitted job. Its methods ask the cluster each time: nothing is cached but the
    position of follow()."""

    def __init__(self, client: "Client", job_id: str):
        self._client = client
        self.id = job_id

    def __repr__(self) -> str:
        return f"loco.Job({self.id!r})"

    def status(self) -> Dict[str, Any]:
        """The job's record: id, name, state (running, succeeded, failed, cancelled), message,
        owner, times."""
        return self._client._session.job(self.id)

    def _events(self) -> Iterator[Dict[str, Any]]:
        cursor = ""
        while True:
            events, cursor, _ = self._client._session.events(self.id, cursor)
            if not events:
                return
            yield from events

    def follow(self, poll_s: float = 0.5, timeout_s: Optional[float] = None
               ) -> Iterator[Dict[str, Any]]:
        """Each round's report (a dict: round, rounds, loss, val_loss, tokens_per_s,
        bytes_per_worker, workers, ...) as the job makes it, until the job ends; then
        status() holds how it ended. Raises loco.TimeoutError after `timeout_s`."""
        cursor = ""
        start = time.monotonic()
        while True:
            events, cursor, record = self._client._session.events(self.id, cursor)
            for e in events:
                if e["kind"] == "report":
                    yield {k: v for k, v in e.items() if k != "kind"}
            if not events and record["state"] in _ENDED:
                return
            if timeout_s is not None and time.monotonic() - start > timeout_s:
                raise TimeoutError(f"job {self.id}: still running after {timeout_s} s")
            if not events:
                time.sleep(poll_s)  # a poll interval: nothing new yet

    def wait(self, poll_s: float = 0.5, timeout_s: Optional[float] = None) -> Dict[str, Any]:
        """Waits for the end; the final record."""
        for _ in self.follow(poll_s, timeout_s):
            pass
        return self.status()

    def logs(self) -> List[str]:
        """The job's log lines so far."""
        return [e["line"] for e in self._events() if e["kind"] == "log"]

    def metrics(self) -> List[Dict[str, Any]]:
        """One dict per round reported so far (the figures of metrics.jsonl that the job
        reports: round, loss, val_loss, val_ppl, tokens_per_s, bytes_per_worker, ...):
        pandas.DataFrame(job.metrics()) is a table of the run."""
        return [{k: v for k, v in e.items() if k != "kind"}
                for e in self._events() if e["kind"] == "report"]

    def cancel(self) -> Dict[str, Any]:
        return self._client._session.cancel(self.id)

    def scale(self, workers: int) -> Dict[str, Any]:
        """Asks for `workers` workers from the next round on (within the job's workers.max)."""
        return self._client._session.scale(self.id, int(workers))


class Client:
    """A connection to a cluster's head. `key`: the cluster's or a user's key file (else
    $LOCO_KEY or ~/.loco/cluster.key); `insecure`: plain TCP, for a cluster started so."""

    def __init__(self, address: Optional[str] = None, key: Optional[str] = None,
                 insecure: bool = False, timeout_s: float = 10.0):
        if key is not None:
            os.environ["LOCO_KEY"] = str(Path(key).expanduser().resolve())
        if insecure:
            os.environ["LOCO_INSECURE"] = "1"
        self.address = address or _default_address()
        self._session = _native.Session(self.address, float(timeout_s))

    def submit(self, job: JobFile, set: Optional[Mapping[str, Any]] = None) -> Job:
        """Submits a DiLoCo job: a job file's path, or the job as a dict. `set` changes fields
        as `loco submit --set PATH=VALUE` does ({"inner.lr": 3e-4}). Raises loco.ConfigError
        naming the field when the job would be refused."""
        if isinstance(job, Mapping):
            text, where = json.dumps(dict(job)), "<dict>"  # JSON is YAML
        else:
            where = os.fspath(job)
            text = Path(where).read_text()
        sets = [f"{k}={_set_value(v)}" for k, v in (set or {}).items()]
        text, _, max_workers = _native.check_job(text, sets, where)
        return Job(self, self._session.submit(text, where, max_workers))

    def job(self, job_id: str) -> Job:
        return Job(self, job_id)

    def jobs(self) -> List[Dict[str, Any]]:
        return self._session.jobs()

    def status(self) -> Dict[str, Any]:
        """The cluster: head_address, nodes (id, address, hostname, state, resources, used),
        and the number of actors."""
        return self._session.status()


_client: Optional[Client] = None


def connect(address: Optional[str] = None, key: Optional[str] = None, insecure: bool = False,
            timeout_s: float = 10.0) -> Client:
    """Connects to a cluster (the module's functions use it from then on)."""
    global _client
    _client = Client(address, key=key, insecure=insecure, timeout_s=timeout_s)
    return _client


def _default() -> Client:
    return _client if _client is not None else connect()


def submit(job: JobFile, set: Optional[Mapping[str, Any]] = None) -> Job:
    return _default().submit(job, set=set)


def job(job_id: str) -> Job:
    return _default().job(job_id)


def jobs() -> List[Dict[str, Any]]:
    return _default().jobs()


def status() -> Dict[str, Any]:
    return _default().status()
