"""Record GPU results: ``python -m kernels.record`` on a machine with a GPU.

One command does everything the GPU must check and measure:

1. runs the test suite on the GPU (kernels for real, warp functions against the
   hardware) and stops if anything fails;
2. measures the chip's ceilings: a large device-to-device copy and a large fp16
   matmul (torch);
3. checks every kernel of every chapter at full size and times it on the
   standard suite, the journey's shapes and a sweep over S, with SDPA's default
   and flash backends timed in the same run;
4. counts DRAM and L2 bytes of each kernel with Nsight Compute, where ncu is
   installed;
5. runs what a chapter measures beyond timings (its ``gpu_measurements()``);
6. writes ``results/<gpu>.json`` (or ``--out``) and prints a short table last.

``--chapters 5 --merge results/<gpu>.json`` records some chapters only and puts
their records into an earlier run's file, with this run's provenance kept beside
them (``merged_runs``): a way to fit a recording into several shorter calls.
"""

from __future__ import annotations

import argparse
import copy
import csv
import datetime as dt
import inspect
import io
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from . import CHAPTERS, all_kernels, chapter_module, measuring_modules, results
from .bench import (JOURNEY_SHAPES, ON_REQUEST_SHAPES, SHAPE_SETS, STANDARD_SUITE, SWEEP_S,
                    Shape, copy_bandwidth, device_inputs, run_suite, time_gpu)
from .mode import MODE
from .results import STALL_REASONS

PROFILE_SHAPE = Shape(1, 8, 2048, 2048, 64)


def _version(module: str) -> str:
    try:
        from importlib.metadata import version

        return version(module)
    except Exception:
        return "not installed"


def provenance() -> dict:
    from numba import cuda

    dev = cuda.get_current_device()
    name = dev.name.decode() if isinstance(dev.name, bytes) else dev.name
    driver = "unknown"
    if shutil.which("nvidia-smi"):
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version",
                              "--format=csv,noheader"], capture_output=True, text=True)
        driver = out.stdout.strip().splitlines()[0] if out.returncode == 0 else driver
    try:
        import torch

        cudnn = str(torch.backends.cudnn.version())
        torch_version = torch.__version__
        torch_cuda = torch.version.cuda
    except ImportError:
        cudnn = torch_version = torch_cuda = "not installed"
    commit = os.environ.get("FA_GIT_COMMIT")
    if not commit:
        git = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True,
                             text=True, cwd=results.ROOT)
        commit = git.stdout.strip() if git.returncode == 0 else "unknown"
    return dict(
        gpu=name, compute_capability=".".join(map(str, dev.compute_capability)),
        multiprocessors=dev.MULTIPROCESSOR_COUNT, driver=driver,
        cuda_runtime=".".join(map(str, cuda.runtime.get_version())),
        torch=torch_version, torch_cuda=torch_cuda, cudnn=cudnn,
        numba=_version("numba"), numba_cuda=_version("numba-cuda"),
        cupy=next((v for v in map(_version, ("cupy-cuda13x", "cupy-cuda12x", "cupy"))
                   if v != "not installed"), "not installed"),
        numpy=np.__version__, python=platform.python_version(),
        date=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        git_commit=commit)


def ceilings() -> dict:
    """Measured ceilings of this GPU: copy bandwidth and fp16 matmul rate."""
    out = copy_bandwidth()
    try:
        import torch

        m = 8192
        x = torch.randn(m, m, device="cuda", dtype=torch.float16)
        y = torch.randn(m, m, device="cuda", dtype=torch.float16)
        t = time_gpu(lambda: x @ y, budget_s=0.5)
        out.update(matmul_shape=[m, m, m], matmul_ms=t.median_ms,
                   matmul_tflops=2 * m ** 3 / (t.median_ms * 1e-3) / 1e12)
    except ImportError:
        out["matmul_tflops"] = None
    return out


#: pytest-xdist workers for the GPU suite where xdist is installed: most of a cold run
#: is compiling kernels on the CPU (12 workers ran it in 155 s on an H100 machine with
#: 16 cores and a cold cache; one process took over 570 s)
TEST_WORKERS = 12


def pytest_command() -> list:
    """The GPU suite's command: in TEST_WORKERS processes where pytest-xdist is
    installed (at most one a CPU core), else in one."""
    import importlib.util

    workers = min(TEST_WORKERS, os.cpu_count() or 1)
    parallel = ["-n", str(workers)] if importlib.util.find_spec("xdist") and workers > 1 else []
    return [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *parallel,
            "-m", "not recorded_results", "tests"]


def run_tests() -> dict:
    """The whole pytest suite, on the GPU."""
    t0 = time.perf_counter()
    proc = subprocess.run(pytest_command(), cwd=results.ROOT, capture_output=True, text=True,
                          env={**os.environ, "FA_BOOK_MODE": "gpu"})
    print(proc.stdout[-4000:], proc.stderr[-2000:], sep="\n")
    summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    return dict(returncode=proc.returncode, summary=summary,
                seconds=round(time.perf_counter() - t0, 1))


def tests_from_log(path: str) -> dict:
    """The summary of a GPU test run made by an earlier call on the same commit (its
    pytest output, saved), for a recording that has no time to run the tests itself."""
    lines = [l for l in Path(path).read_text().splitlines() if l.strip()]
    summary = next((l.strip("= ") for l in reversed(lines)
                    if re.search(r"\d+ (passed|failed)", l)), "")
    if not summary:
        raise ValueError(f"{path}: no pytest summary line")
    return dict(summary=summary, returncode=int(bool(re.search(r"\d+ (failed|error)", summary))),
                note=f"run by an earlier call on the same commit ({Path(path).name})")


def profile_target(kernel: str, shape: Shape = PROFILE_SHAPE) -> None:
    """Run one kernel once on ``shape`` (for ncu; compilation happens first).
    ``sdpa_<backend>`` runs PyTorch's SDPA with that backend instead."""
    from numba import cuda

    if kernel.startswith("sdpa_"):
        from .reference import sdpa

        def fn(q, k, v, causal, out):
            return sdpa(q, k, v, causal, None, kernel[len("sdpa_"):])
    else:
        fn = {name: f for _, name, f in all_kernels()}[kernel]
    dq, dk, dv, out = device_inputs(shape)
    fn(dq, dk, dv, causal=shape.causal, out=out)  # compile
    cuda.synchronize()
    cuda.profile_start()
    fn(dq, dk, dv, causal=shape.causal, out=out)
    cuda.synchronize()
    cuda.profile_stop()


#: bytes at each level, and what the SMs did: instructions, fp32-pipe instructions,
#: shared-memory load wavefronts and bank conflicts, resident warps, and the average
#: stall cycles per issued instruction by reason
METRICS = ("dram__bytes_read.sum", "dram__bytes_write.sum", "lts__t_bytes.sum",
           "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum",
           "smsp__inst_executed.sum", "smsp__inst_executed_pipe_fma.sum",
           "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum",
           "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",
           # every shared-memory access (ldmatrix and cp.async's writes too)
           "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum",
           "l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum",
           "sm__warps_active.avg.pct_of_peak_sustained_active") + tuple(
    f"smsp__average_warps_issue_stalled_{r}_per_issue_active.ratio" for r in STALL_REASONS)


def profile_bytes(only=None) -> dict:
    """DRAM and L2 bytes of each kernel's launches on PROFILE_SHAPE, from ncu
    (``only``: the kernel names to profile)."""
    variants = set(shape_sets()) - profiled_variants()
    names = [name for _, name, _ in all_kernels() if name not in variants
             and (only is None or name in only)]  # variants are timed, not profiled
    return ncu_counts(names, PROFILE_SHAPE, METRICS)


def ncu_counts(names, shape: Shape, metrics) -> dict:
    """Nsight Compute's ``metrics`` for each launch of the named kernels on ``shape``."""
    ncu = shutil.which("ncu") or next(
        (p for p in ("/usr/local/cuda/bin/ncu",) if os.path.exists(p)), None)
    if ncu is None:
        return dict(status="ncu not found")
    out = dict(shape=shape.as_dict(), metrics=list(metrics), kernels={})
    for name in names:
        cmd = [ncu, "--csv", "--profile-from-start", "off", "--metrics", ",".join(metrics),
               sys.executable, "-m", "kernels.record", "--profile-target", name,
               "--profile-shape", json.dumps(shape.as_dict())]
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=results.ROOT,
                              env={**os.environ, "FA_BOOK_MODE": "gpu"}, timeout=300)
        rows = [r for r in csv.DictReader(io.StringIO(
            "\n".join(l for l in proc.stdout.splitlines() if l.startswith('"'))))]
        if proc.returncode != 0 or not rows:
            out["kernels"][name] = dict(status="failed", log=(proc.stdout + proc.stderr)[-800:])
            continue
        launches = {}
        for r in rows:
            key = (r["ID"], r["Kernel Name"].split("[")[0].split("(")[0])  # no mangling
            unit = r["Metric Unit"].lower()
            scale = {"byte": 1, "kbyte": 1e3, "mbyte": 1e6, "gbyte": 1e9}.get(unit, 1)
            try:
                value = float(r["Metric Value"].replace(",", "")) * scale
            except ValueError:  # "n/a": a counter this launch does not have
                value = None
            launches.setdefault(key, {})[r["Metric Name"]] = value
        out["kernels"][name] = dict(status="ok", launches=[
            dict(id=k[0], kernel=k[1], **v) for k, v in sorted(launches.items())])
    return out


def profiled_variants() -> set:
    """Variants a chapter wants Nsight Compute counts of (its PROFILE list)."""
    return {name for chapter in CHAPTERS
            for name in getattr(chapter_module(chapter), "PROFILE", ())}


def chapters_setting(name: str) -> dict:
    """{kernel: value}: every chapter's dict ``name`` (RECORD_SHAPES, RECORD_ALSO,
    RECORD_DTYPES), merged."""
    out = {}
    for chapter in CHAPTERS:
        out.update(getattr(chapter_module(chapter), name, {}))
    return out


def shape_sets() -> dict:
    """{kernel: shape set} for the variants that chapters time on fewer shapes."""
    return chapters_setting("RECORD_SHAPES")


def also_shape_sets() -> dict:
    """{kernel: shape set} for the kernels that chapters time on a set of
    kernels.bench.ON_REQUEST_SHAPES as well as on their own shapes."""
    return chapters_setting("RECORD_ALSO")


def record_dtypes() -> dict:
    """{kernel: dtypes} for the kernels that chapters time in more than fp16."""
    return chapters_setting("RECORD_DTYPES")


def asked_shapes() -> list[Shape]:
    """The shapes of kernels.bench.ON_REQUEST_SHAPES that some kernel asks for, as its
    own set or as one beside its own (only the kernels that ask are timed there)."""
    asked = {shape for key in [*shape_sets().values(), *also_shape_sets().values()]
             for shape in SHAPE_SETS[key]}
    return [shape for shape in ON_REQUEST_SHAPES if shape in asked]


def measurements(chapters, only=None) -> dict:
    """What the chapters measure beyond their kernels' timings (each measuring module's
    ``gpu_measurements()``, :func:`kernels.measuring_modules`), by name (``only``: these
    names alone). A module's function that takes ``progress`` is given one that prints
    each line it reports."""
    out = {}
    modules = measuring_modules(chapters)
    unknown = set(only or ()) - set(modules)
    if unknown:
        raise ValueError(f"no measurements named {sorted(unknown)} in chapters {chapters}: "
                         f"{sorted(modules)}")
    for name, module in modules.items():
        if only and name not in only:
            continue
        print(f"measurements: {name} ...", flush=True)
        measure = module.gpu_measurements
        kw = {}
        if "progress" in inspect.signature(measure).parameters:  # one line a stage
            kw["progress"] = lambda line: print(f"  {line}", flush=True)
        try:
            out[name] = measure(**kw)
            out[name]["source_hash"] = results.measured_hash(module)  # results.stale_measured
        except Exception as e:  # recorded, not fatal: the timings stand
            out[name] = dict(status="failed", note=f"{type(e).__name__}: {e}")
    return out


def recorded_elsewhere(records: list[dict], chapters, names, head_dims=None,
                       shape_set=None) -> list[dict]:
    """The records a merge keeps: none of these chapters' (a kernel they no longer
    have included) and none of these kernels', but for those at other head dims than
    ``head_dims`` where it is given (a recording split by head dim), and those at shapes
    outside ``shape_set`` (a key of SHAPE_SETS) where it is given (a set recorded alone)."""
    outside = set(SHAPE_SETS[shape_set]) if shape_set else None
    return [r for r in records if (r["kernel"] not in names and r.get("chapter") not in chapters)
            or (head_dims and r.get("D") not in head_dims)
            or (outside is not None and record_shape(r) not in outside)]


def record_shape(record: dict) -> Shape:
    """The shape a record was timed at."""
    return Shape(*(record[key] for key in ("B", "H", "S_q", "S_k", "D", "causal")))


def merge(base: dict, run: dict, chapters, head_dims=None, shape_set=None,
          kernels=None) -> dict:
    """``base`` with the records of ``chapters``' kernels (of ``kernels`` alone, where
    given: what changed of a chapter) replaced by ``run``'s (at ``head_dims`` only, and at
    ``shape_set``'s shapes only, where given); the run's provenance, tests, ceilings and
    measurements go to ``merged_runs``."""
    names = set(kernels) if kernels else {name for c, name, _ in all_kernels() if c in chapters}
    index = len(base.get("merged_runs", []))
    new = [dict(r, merged_run=index) for r in run["records"] if r["kernel"] in names]
    base["records"] = recorded_elsewhere(base["records"], () if kernels else chapters, names,
                                         head_dims, shape_set) + new
    base.setdefault("merged_runs", []).append(dict(
        chapters=sorted(chapters), **({"head_dims": sorted(head_dims)} if head_dims else {}),
        **({"shape_set": shape_set} if shape_set else {}),
        **({"kernels": sorted(kernels)} if kernels else {}),
        **{k: run[k] for k in ("provenance", "tests", "ceilings", "seconds")}))
    measured = base.setdefault("measurements", {})
    if run.get("measurements"):  # (a run that measured nothing leaves the file's as they are)
        for chapter in chapters:  # a chapter's measurements, under any name they had, are its run's
            measured.pop(CHAPTERS.get(chapter), None)
        measured.update(run["measurements"])
    if run["profile"].get("kernels"):
        profile = base.setdefault("profile", {})
        profile.setdefault("kernels", {})
        profile["kernels"] = {k: v for k, v in profile["kernels"].items() if k not in names}
        profile["kernels"].update(run["profile"]["kernels"])
    return base


def short_table(records: list[dict]) -> str:
    rows = [r for r in records if r["status"] == "ok" and not r["causal"]
            and (r["B"], r["H"], r["S_q"], r["D"]) in {(16, 16, 2048, 64), (1, 8, 512, 64)}]
    lines = [f"{'kernel':<26}{'shape':<28}{'ms':>10}{'TFLOPS':>9}{'rel err':>10}"]
    for r in sorted(rows, key=lambda r: (r["S_q"], r["chapter"], r["kernel"])):
        shape = f"{r['B']}x{r['H']}x{r['S_q']}x{r['D']}"
        rel = f"{r['rel_err']:.1e}" if "rel_err" in r else ""
        lines.append(f"{r['kernel']:<26}{shape:<28}{r['median_ms']:>10.3f}"
                     f"{r['tflops']:>9.2f}{rel:>10}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--skip-tests", action="store_true", help="do not run pytest first")
    ap.add_argument("--tests-log", metavar="LOG",
                    help="instead of running pytest, record the summary of this saved "
                         "pytest output of the GPU suite, run on the same commit")
    ap.add_argument("--quick", action="store_true", help="journey shapes only")
    ap.add_argument("--no-profile", action="store_true", help="skip Nsight Compute")
    ap.add_argument("--no-measurements", action="store_true",
                    help="skip the chapters' measurements: a recording split over two "
                         "calls, the second with --measurements-only")
    ap.add_argument("--limit-s", type=float, default=0.3,
                    help="skip shapes a kernel is predicted to take longer than this on")
    ap.add_argument("--out", help="results file (default results/<gpu>.json)")
    ap.add_argument("--profile-only", metavar="RESULTS",
                    help="add Nsight Compute counts to an existing results file")
    ap.add_argument("--measurements-only", metavar="RESULTS",
                    help="with --chapters: run these chapters' own measurements (ceilings, "
                         "counters) again, into an existing results file")
    ap.add_argument("--only", nargs="+", metavar="NAME",
                    help="with --measurements-only: these measurements alone (e.g. training)")
    ap.add_argument("--chapters", type=int, nargs="+", metavar="N",
                    help="record these chapters' kernels only")
    ap.add_argument("--merge", metavar="RESULTS",
                    help="with --chapters: put the records into this earlier run's file")
    ap.add_argument("--head-dims", type=int, nargs="+", metavar="D",
                    help="with --merge: time the shapes of these head dims only, keeping "
                         "the file's records at the others (a recording too long for one "
                         "call, split by head dim so that each shape's kernels and both "
                         "dtypes are still timed in one run)")
    ap.add_argument("--shape-set", metavar="NAME",
                    help="with --merge: time the shapes of this set of "
                         "kernels.bench.SHAPE_SETS only (e.g. few_heads), keeping the "
                         "file's records at the others")
    ap.add_argument("--kernels", nargs="+", metavar="NAME",
                    help="with --merge: time these kernels of --chapters only, keeping the "
                         "file's records of the chapters' other kernels (what a change made "
                         "stale: kernels.rerecord passes it); no measurements")
    ap.add_argument("--profile-target", help=argparse.SUPPRESS)
    ap.add_argument("--profile-shape", help=argparse.SUPPRESS)  # Shape.as_dict() as JSON
    args = ap.parse_args(argv)
    if MODE != "gpu":
        print(f"kernels.record needs a GPU; kernels.mode is {MODE!r}", file=sys.stderr)
        return 2
    if args.profile_target:
        shape = Shape(**json.loads(args.profile_shape)) if args.profile_shape else PROFILE_SHAPE
        profile_target(args.profile_target, shape)
        return 0
    if args.merge and not args.chapters:
        ap.error("--merge needs --chapters")
    if args.head_dims and not args.merge:
        ap.error("--head-dims needs --merge: the other head dims' records come from there")
    if args.shape_set and not args.merge:
        ap.error("--shape-set needs --merge: the other shapes' records come from there")
    if args.kernels and not args.merge:
        ap.error("--kernels needs --merge: the chapters' other kernels' records come from there")
    if args.kernels:
        theirs = {name for c, name, _ in all_kernels() if c in (args.chapters or ())}
        if unknown := sorted(set(args.kernels) - theirs):
            ap.error(f"--kernels: {', '.join(unknown)} not among the kernels of --chapters")
        args.no_measurements = True  # a chapter's measurements are recorded on their own
    if args.shape_set and args.shape_set not in SHAPE_SETS:
        ap.error(f"--shape-set: no set {args.shape_set!r} in kernels.bench.SHAPE_SETS")
    if args.merge and args.profile_only:
        ap.error("--profile-only writes into its own file: no --merge")
    if args.only and not args.measurements_only:
        ap.error("--only needs --measurements-only")
    into = [path for path in (args.merge, args.measurements_only) if path]
    here = provenance()["gpu"] if into else None
    for path in into:
        if elsewhere := results.recorded_elsewhere(results.load(Path(path)), here):
            ap.error(f"{path} was recorded on {elsewhere}, not on this {here}")
    if args.measurements_only:  # each keeps its own provenance: not the timings' run
        if not args.chapters:
            ap.error("--measurements-only needs --chapters")
        data = results.load(Path(args.measurements_only))
        prov = provenance()
        for module, measured in measurements(args.chapters, args.only).items():
            data.setdefault("measurements", {})[module] = dict(measured, provenance=prov)
        print(f"wrote {results.save(data, args.out or args.measurements_only)}")
        return 0
    if args.profile_only:  # a recording split over two calls: the timings are there
        data = results.load(Path(args.profile_only))
        if args.chapters:  # these chapters' kernels only, into the file's profile
            names = {name for c, name, _ in all_kernels() if c in args.chapters}
            profile = data.setdefault("profile", {})
            profile.setdefault("kernels", {}).update(profile_bytes(names)["kernels"])
        else:
            data["profile"] = profile_bytes()
        print(f"wrote {results.save(data, args.out or args.profile_only)}")
        return 0
    t0 = time.perf_counter()
    prov = provenance()
    print(f"recording on {prov['gpu']} (driver {prov['driver']})", flush=True)
    tests = (tests_from_log(args.tests_log) if args.tests_log else
             dict(summary="skipped") if args.skip_tests else run_tests())
    if tests.get("returncode", 0) != 0:
        print(f"tests failed: {tests['summary']}; nothing recorded", file=sys.stderr)
        return 1
    print("ceilings ...", flush=True)
    ceil = ceilings()
    print(f"  copy {ceil['copy_tb_s']:.2f} TB/s, fp16 matmul {ceil['matmul_tflops']:.0f} "
          "TFLOPS", flush=True)
    chapters = args.chapters or sorted(CHAPTERS)
    kernels = [k for k in all_kernels() if k[0] in chapters
               and (not args.kernels or k[1] in args.kernels)]
    shapes = JOURNEY_SHAPES + ([] if args.quick else STANDARD_SUITE + SWEEP_S)
    shapes = shapes + asked_shapes()
    if args.head_dims:
        shapes = [s for s in shapes if s.D in args.head_dims]
    if args.shape_set:
        shapes = list(SHAPE_SETS[args.shape_set])
    records = run_suite(kernels, shapes, limit_s=args.limit_s, shape_sets=shape_sets(),
                        also_shape_sets=also_shape_sets(), dtypes=record_dtypes(),
                        progress=lambda s: print(s, flush=True))
    hashes = {name: results.source_hash(fn) for _, name, fn in kernels}
    for r in records:
        if r["kernel"] in hashes:
            r["source_hash"] = hashes[r["kernel"]]
    data = dict(provenance=prov, tests=tests, ceilings=ceil,
                profile=dict(status="not run yet"), records=records,
                seconds=round(time.perf_counter() - t0, 1))
    # kept if the measurements or the profiling do not finish (a call past its time
    # limit): the timings, merged where they are to be (into a copy: the file merged
    # into may be the one written)
    base = results.load(Path(args.merge)) if args.merge else None
    results.save(merge(copy.deepcopy(base), data, chapters, args.head_dims, args.shape_set,
                       args.kernels) if base else data,
                 args.out)
    data["measurements"] = {} if args.no_measurements else measurements(chapters)
    data["profile"] = dict(status="skipped") if args.no_profile else profile_bytes(
        {name for _, name, _ in kernels})
    data["seconds"] = round(time.perf_counter() - t0, 1)
    seconds = data["seconds"]  # this run's (a merge returns the base file, with its own)
    if base:
        data = merge(base, data, chapters, args.head_dims, args.shape_set, args.kernels)
    path = results.save(data, args.out)
    print(f"\nwrote {path} in {seconds} s; tests: {tests['summary']}")
    print(short_table(records))
    return 0


if __name__ == "__main__":
    code = main()
    # The file is written; skip the CUDA libraries' teardown at exit (torch's profiler,
    # CuPy, Numba), which once ended a complete recording in a double free (H100,
    # 2026-11-27) and made kernels.rerecord discard it.
    sys.stdout.flush(), sys.stderr.flush()
    os._exit(code)
