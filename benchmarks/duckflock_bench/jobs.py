"""Launching a benchmark's MPI job and reading back the JSON files it wrote."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

from rich.console import Console

from duckflock.exec.hosting.launch import PER_PROCESS_ENV, mpiexec_argv

err = Console(stderr=True)


class JobFailed(RuntimeError):
    pass


def run_job(ranks: int, module: str, args: list[str], out: Path, timeout: float) -> float:
    """Run ``python -m module args`` on ``ranks`` MPI ranks, one per process, with a fresh ``out``
    directory; returns the job's wall time (including MPI start-up). Raises JobFailed with the end of
    its stderr."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    argv = mpiexec_argv(ranks, ["-m", module, *args])
    t0 = time.perf_counter()
    try:
        env = {**os.environ, PER_PROCESS_ENV: "1"}
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise JobFailed(f"{module} on {ranks} ranks did not finish within {timeout:.0f} s") from None
    seconds = time.perf_counter() - t0
    (out / "stderr.txt").write_text(done.stderr)
    if done.returncode != 0:
        raise JobFailed(f"{module} on {ranks} ranks failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return seconds


def run_json_job(ranks: int, module: str, args: list[str], out: Path, timeout: float) -> tuple[float, dict]:
    """``run_job``, then the ``job.json`` the job wrote: (wall seconds, its contents)."""
    seconds = run_job(ranks, module, args, out, timeout)
    return seconds, read_json(out / "job.json")


def read_json(path: Path) -> dict:
    return json.loads(path.read_text())


def rank_memory_kb(out: Path, ranks: int) -> tuple[list[int], list[int]]:
    """Every rank's peak RSS and file-backed RSS from the ``rank-<r>.json`` files a job wrote."""
    records = [read_json(out / f"rank-{r}.json") for r in range(ranks)]
    return [int(m["peak_kb"]) for m in records], [int(m.get("file_kb", 0)) for m in records]


def write_json(path: Path, obj: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1, default=str))
    os.replace(tmp, path)
