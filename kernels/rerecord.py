"""Record again what a change made stale, on every GPU of one machine at once:
``python -m kernels.rerecord [--out record.json]`` on a machine with one or more GPUs of
one kind.

It reads this GPU's results file (``results/<gpu>.json``, or ``--results``), finds what
:func:`kernels.results.stale_records` and :func:`~kernels.results.stale_measured` call
stale, and splits the recording into jobs of ``python -m kernels.record``:

- the chapters with stale kernel records: the GPU suite, then the stale kernels' timings
  merged into the file (``--chapters ... --merge ... --no-measurements``, with
  ``--kernels`` naming them where their chapters have fresh kernels too: a change to one
  kernel times that kernel again, not its chapter), one job, so that nothing is timed
  unless the suite passed (or, with ``--tests-log``, the suite's output saved by an
  earlier call on the same commit says it passed);
- each stale measurement on its own (``--measurements-only ... --only NAME``); those
  that go through the lean call (a measuring module's ``USES_THE_LEAN_CALL``), whose
  choice of form reads this GPU's records, after the timings job, once its records are
  written into the results file.

Each GPU takes the next job as soon as it is free (one process a GPU, through
``CUDA_VISIBLE_DEVICES``), the longest known first; each job writes its own file and
log. The jobs that time the host as well as the GPU (a measuring module's
``TIMES_THE_HOST``: a call's Python, eager training steps) run afterwards, one at a
time, with nothing beside them: other jobs' processes (the suite's compiles, above all)
slow the host they time. Last, one file is made of them all: the timings job's file,
with each measurement job's measurement put in. The GPU-timed jobs on four GPUs take
about as long as the longest of them, where one GPU takes them one after another. Each
job's records and measurements keep the provenance of the job that made them, as a
merge does. Before any job starts, it prints them, each with how long it is expected to
take (:func:`plan_lines`), and the total.
"""

from __future__ import annotations

import argparse
import os
import queue
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from . import CHAPTERS, measuring_modules, results


def gpu_indices() -> list[str]:
    """The GPUs this process may use: CUDA_VISIBLE_DEVICES's list where it is set, else
    every GPU nvidia-smi lists."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        return [i.strip() for i in visible.split(",") if i.strip()]
    out = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"],
                         capture_output=True, text=True) if shutil.which("nvidia-smi") else None
    return out.stdout.split() if out and out.returncode == 0 and out.stdout.strip() else ["0"]


def jobs(data: dict, path: Path, scratch: Path, first=()) -> list[dict]:
    """The recording jobs that make ``data`` (read from ``path``) fresh again (``alone``:
    the job times the host; see the module's text), in the order they are to start: those
    named in ``first`` ("timings" for the timings job) in that order, then those whose
    length is not known (the timings job, which runs the suite first, and measurements
    recorded before this module timed them), then the longest first by the
    ``recording_seconds`` each measurement was last recorded in."""
    out = []
    stale = [(c, kernel) for c, kernel, _ in results.stale_records(data) if c is not None]
    chapters = sorted({c for c, _ in stale})
    if chapters:
        out.append(dict(name="timings", chapters=chapters,
                        out=scratch / "timings.json", seconds=None,
                        args=["--chapters", *map(str, chapters), "--merge", str(path),
                              "--no-measurements", *changed_kernels(stale)]))
    chapter_of = {name: c for c in CHAPTERS for name in measuring_modules([c])}
    modules = measuring_modules()
    host_timed = {name for name, module in modules.items()
                  if getattr(module, "TIMES_THE_HOST", False)}
    lean = {name for name, module in modules.items()
            if getattr(module, "USES_THE_LEAN_CALL", False)}
    recorded = data.get("measurements", {})
    for name in results.stale_measured(data):
        out.append(dict(name=name, measurement=name, out=scratch / f"{name}.json",
                        alone=name in host_timed, after_timings=bool(chapters) and name in lean,
                        seconds=recorded.get(name, {}).get("recording_seconds"),
                        args=["--chapters", str(chapter_of[name]), "--measurements-only",
                              str(path), "--only", name]))
    unknown = set(first) - {j["name"] for j in out}
    if unknown:
        raise ValueError(f"--first names no stale job: {sorted(unknown)}")
    order = list(first)
    return sorted(out, key=lambda j: (j.get("alone", False),
                                      order.index(j["name"]) if j["name"] in order
                                      else len(order), j["seconds"] is not None,
                                      -(j["seconds"] or 0)))


def expected_seconds(data: dict, job: dict) -> float | None:
    """How long ``job`` is expected to take: a measurement's ``recording_seconds`` when
    it was last recorded; the timings job's, for each of its chapters, the length of the
    run that last recorded it (:func:`kernels.results.chapter_run`), shared equally
    among that run's chapters, added up. None where a length is not known."""
    if "chapters" not in job:
        return job["seconds"]
    total = 0.0
    for chapter in job["chapters"]:
        run = results.chapter_run(data, chapter)
        if not run.get("seconds"):
            return None
        total += run["seconds"] / max(len(run.get("chapters") or CHAPTERS), 1)
    return total


def plan_lines(data: dict, todo: list[dict], gpus: int) -> list[str]:
    """What a call will time and how long each job is expected to take
    (:func:`expected_seconds`), then the total: the sum over the jobs, and what it comes
    to on ``gpus`` GPUs (no less than the longest job, nor the jobs that run alone)."""
    lines, known, alone = [], [], 0.0
    for job in todo:
        what = ([f"chapters {', '.join(map(str, job['chapters']))}"] if "chapters" in job
                else []) + (["after the timings"] if job.get("after_timings") else []) \
            + (["alone, last"] if job.get("alone") else [])
        what = f" ({'; '.join(what)})" if what else ""
        seconds = expected_seconds(data, job)
        length = f"about {seconds:.0f} s" if seconds is not None else "length not known"
        lines.append(f"  {job['name']}{what}, {length}: python -m kernels.record "
                     f"{' '.join(job['args'])}")
        if seconds is not None:
            known.append(seconds)
            alone += seconds if job.get("alone") else 0.0
    if known:
        spread = max(max(known), (sum(known) - alone) / max(gpus, 1)) + alone
        lines.append(f"  expected: about {sum(known):.0f} s of GPU time, about {spread:.0f} s "
                     f"on {gpus} GPU{'s' * (gpus != 1)}"
                     + (f" ({len(todo) - len(known)} jobs of unknown length besides)"
                        if len(known) < len(todo) else ""))
    return lines


def changed_kernels(stale: list[tuple[int, str]]) -> list[str]:
    """``--kernels`` and the names of the stale kernels (``stale``: (chapter, kernel) of
    each stale record) where some chapter has fresh kernels too: what changed is timed
    again, not its chapter. Nothing where every kernel of the chapters is stale, or a
    record names a kernel the chapter no longer has (recorded whole, the chapter's run
    drops it)."""
    from . import all_kernels

    chapters = {c for c, _ in stale}
    theirs = {name for c, name, _ in all_kernels() if c in chapters}
    names = {kernel for _, kernel in stale}
    if names == theirs or names - theirs:
        return []
    return ["--kernels", *sorted(names)]


RECORD = (sys.executable, "-m", "kernels.record")


def run_jobs(todo: list[dict], gpus: list[str], logs: Path, command=RECORD) -> None:
    """Run ``todo`` (``command`` with each job's arguments): the jobs that are not
    ``alone`` on ``gpus`` at once, each GPU taking the next job when it is free; then the
    others one at a time on the first GPU, with nothing beside them. Each job gets
    ``returncode``, ``seconds`` and ``gpu``."""
    t0 = time.perf_counter()
    for batch, on in (([j for j in todo if not j.get("alone")], gpus),
                      ([j for j in todo if j.get("alone")], gpus[:1])):
        pending = queue.Queue()
        for job in batch:
            pending.put(job)
        threads = [threading.Thread(target=_take_jobs, args=(pending, gpu, logs, command, t0))
                   for gpu in on]
        for t in threads:
            t.start()
        for t in threads:
            t.join()


def _take_jobs(pending: queue.Queue, gpu: str, logs: Path, command, t0: float) -> None:
    """One GPU's worker: run the next pending job on ``gpu`` until none is left."""
    while True:
        try:
            job = pending.get_nowait()
        except queue.Empty:
            return
        start = time.perf_counter()
        print(f"[{start - t0:6.0f} s] GPU {gpu}: {job['name']} ...", flush=True)
        log = logs / (job["out"].stem + ".log")
        with log.open("w") as f:
            proc = subprocess.run(
                [*command, *job["args"], "--out", str(job["out"])], cwd=results.ROOT,
                stdout=f, stderr=subprocess.STDOUT,
                env={**os.environ, "CUDA_VISIBLE_DEVICES": gpu, "PYTHONUNBUFFERED": "1"})
        job.update(returncode=proc.returncode, gpu=gpu,
                   seconds=round(time.perf_counter() - start, 1))
        print(f"[{time.perf_counter() - t0:6.0f} s] GPU {gpu}: {job['name']} "
              f"{'done' if proc.returncode == 0 else 'FAILED'} in {job['seconds']} s "
              f"(log: {log.name})", flush=True)


def combine(base: dict, done: list[dict]) -> dict:
    """``base`` (the timings job's file where it ran) with each finished measurement
    job's measurement put in, with the job's length (``recording_seconds``)."""
    for job in done:
        if "measurement" in job and job.get("returncode") == 0 and job["out"].exists():
            measured = results.load(job["out"])["measurements"][job["measurement"]]
            base.setdefault("measurements", {})[job["measurement"]] = dict(
                measured, recording_seconds=job["seconds"])
    return base


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", help="the results file to make fresh "
                                      "(default: the one recorded on this GPU)")
    ap.add_argument("--out", help="where the fresh file goes (default: over --results); "
                                  "each job's file and log go beside it")
    ap.add_argument("--first", nargs="+", default=(), metavar="JOB",
                    help="start these jobs first, in this order (a measurement's name, or "
                         "'timings'): the longest, where their lengths are not recorded yet")
    ap.add_argument("--jobs", nargs="+", metavar="JOB",
                    help="run these stale jobs only (the rest for a later call, which "
                         "finds them stale still): a recording split over calls")
    ap.add_argument("--tests-log", metavar="LOG",
                    help="the GPU suite's saved output from an earlier call on this commit: "
                         "the timings job records its summary instead of running the suite "
                         "(a timings job too long for one call with the suite before it)")
    ap.add_argument("--dry-run", action="store_true", help="list the jobs, run none")
    args = ap.parse_args(argv)
    from .mode import device_name

    gpu = device_name()
    mine = [path for path, _ in results.recorded_on(gpu)]
    path = Path(args.results) if args.results else mine[0] if mine else None
    if path is None or not path.exists():
        print(f"no results file {args.results or f'recorded on {gpu}'}: record it whole "
              "(python -m kernels.record)", file=sys.stderr)
        return 2
    out = Path(args.out or path)
    scratch = out.parent / "rerecord"
    scratch.mkdir(parents=True, exist_ok=True)
    data = results.load(path)
    if gpu and (elsewhere := results.recorded_elsewhere(data, gpu)):
        print(f"{path} was recorded on {elsewhere}, not on this {gpu}", file=sys.stderr)
        return 2
    try:
        todo = jobs(data, path.resolve(), scratch.resolve(), args.first)
    except ValueError as e:
        ap.error(str(e))
    if args.tests_log:
        for job in todo:
            if job["name"] == "timings":
                job["args"] += ["--tests-log", str(Path(args.tests_log).resolve())]
    if args.jobs:
        unknown = set(args.jobs) - {job["name"] for job in todo}
        if unknown:
            ap.error(f"--jobs names no stale job: {sorted(unknown)}")
        waiting = [job["name"] for job in todo if job["name"] in args.jobs
                   and job.get("after_timings") and "timings" not in args.jobs]
        if waiting:
            ap.error(f"{', '.join(waiting)} call{'s' * (len(waiting) == 1)} the lean call, "
                     "which would read the stale timings: add 'timings' to --jobs, or run "
                     "it in an earlier call")
        todo = [job for job in todo if job["name"] in args.jobs]
    gpus = gpu_indices()
    print(f"{path}: {len(todo)} jobs on {len(gpus)} GPUs ({gpu})")
    print("\n".join(plan_lines(data, todo, len(gpus))), flush=True)
    if args.dry_run or not todo:
        return 0
    run_jobs([job for job in todo if not job.get("after_timings")], gpus, scratch)
    timings = next((j for j in todo if j["name"] == "timings"), None)
    if timings and timings["returncode"] != 0:
        print(f"the timings job failed ({scratch / 'timings.log'}): nothing written",
              file=sys.stderr)
        return 1
    after = [job for job in todo if job.get("after_timings")]
    if after:  # the lean call reads this GPU's file: the new timings go there first
        results.save(combine(results.load(timings["out"]), todo), path)
        print(f"{path}: the new timings, for the jobs that call the lean call")
        run_jobs(after, gpus, scratch)
    base = results.load(timings["out"]) if timings else data
    fresh = combine(base, todo)
    results.save(fresh, out)
    left = results.stale(fresh) + results.stale_measurements(fresh)
    print(f"\nwrote {out}; still stale: {len(left)}")
    for line in left:
        print(f"  {line}")
    print(f"\n{'job':<36}{'GPU':>5}{'seconds':>9}  status")
    for job in todo:
        print(f"{job['name']:<36}{job.get('gpu', '-'):>5}{job.get('seconds') or 0:>9.0f}  "
              f"{'ok' if job.get('returncode') == 0 else 'FAILED'}")
    return 0 if not left else 1


if __name__ == "__main__":
    sys.exit(main())
