"""kernels.rerecord without a GPU: which jobs a stale results file makes, in what order,
how GPUs share them, and how their files become one."""

import json
import sys

import pytest

from kernels import measuring_modules, rerecord, results


def fresh_measurements() -> dict:
    return {name: dict(source_hash=results.measured_hash(module))
            for name, module in measuring_modules().items()}


def stale_file(tmp_path, *, stale_measurement="training", seconds=None):
    measured = fresh_measurements()
    measured[stale_measurement] = dict(source_hash="0" * 16)
    if seconds:
        for name, s in seconds.items():
            measured[name]["recording_seconds"] = s
    data = dict(records=[dict(kernel="hopper_attention", chapter=7, source_hash="0" * 16)],
                measurements=measured)
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps(data))
    return data, path


def test_a_stale_kernel_and_a_stale_measurement_make_two_jobs(tmp_path):
    data, path = stale_file(tmp_path)
    todo = rerecord.jobs(data, path, tmp_path)
    assert [j["name"] for j in todo] == ["timings", "training"]
    timings, training = todo
    assert timings["args"] == ["--chapters", "7", "--merge", str(path), "--no-measurements",
                               "--kernels", "hopper_attention"]  # chapter 7's one stale kernel
    assert training["args"] == ["--chapters", "9", "--measurements-only", str(path),
                                "--only", "training"]
    assert training["alone"] and not timings.get("alone")  # training times the host


def test_nothing_stale_makes_no_jobs(tmp_path):
    data = dict(records=[], measurements=fresh_measurements())
    assert rerecord.jobs(data, tmp_path / "gpu.json", tmp_path) == []


def test_first_and_recorded_lengths_order_the_jobs(tmp_path):
    data, path = stale_file(tmp_path)
    for name in ("models", "llama"):
        data["measurements"][name]["source_hash"] = "0" * 16
    data["measurements"]["models"]["recording_seconds"] = 40
    data["measurements"]["llama"]["recording_seconds"] = 90
    data["measurements"]["layouts"]["source_hash"] = "0" * 16
    data["measurements"]["layouts"]["recording_seconds"] = 120
    # those that time the host last; unknown lengths first, then the longest known
    assert [j["name"] for j in rerecord.jobs(data, path, tmp_path)] == [
        "timings", "layouts", "training", "llama", "models"]
    assert [j["name"] for j in rerecord.jobs(data, path, tmp_path, first=["models"])] == [
        "timings", "layouts", "models", "training", "llama"]
    with pytest.raises(ValueError, match="no stale job"):
        rerecord.jobs(data, path, tmp_path, first=["backward_pass"])


STUB = (sys.executable, "-c", """
import json, os, sys, time
args = sys.argv[1:]
out = args[args.index("--out") + 1]
start = time.time()
time.sleep(0.3)
json.dump(dict(gpu=os.environ["CUDA_VISIBLE_DEVICES"], args=args, start=start,
               end=time.time()), open(out, "w"))
sys.exit(3 if "--only" in args and args[args.index("--only") + 1] == "broken" else 0)
""")


def test_each_gpu_takes_the_next_job_and_a_failure_is_kept(tmp_path):
    todo = [dict(name=f"job{i}", out=tmp_path / f"job{i}.json", args=["--only", f"m{i}"])
            for i in range(4)]
    todo.append(dict(name="broken", out=tmp_path / "broken.json", args=["--only", "broken"]))
    rerecord.run_jobs(todo, ["0", "1"], tmp_path, command=STUB)
    assert {j["gpu"] for j in todo} == {"0", "1"}  # both GPUs worked
    for job in todo:
        ran = json.loads(job["out"].read_text())
        assert ran["gpu"] == job["gpu"] and ran["args"][:2] == job["args"]
        assert (tmp_path / f"{job['name']}.log").exists() and job["seconds"] > 0
    assert [j["returncode"] for j in todo] == [0, 0, 0, 0, 3]


def test_jobs_that_time_the_host_run_last_one_at_a_time(tmp_path):
    todo = [dict(name=name, out=tmp_path / f"{name}.json", args=["--only", name],
                 alone=name.startswith("host")) for name in ("gpu0", "gpu1", "host0", "host1")]
    rerecord.run_jobs(todo, ["0", "1"], tmp_path, command=STUB)
    ran = {j["name"]: json.loads(j["out"].read_text()) for j in todo}
    assert {ran["gpu0"]["gpu"], ran["gpu1"]["gpu"]} == {"0", "1"}
    assert ran["host0"]["gpu"] == ran["host1"]["gpu"] == "0"
    assert ran["host0"]["start"] >= max(ran["gpu0"]["end"], ran["gpu1"]["end"])
    assert ran["host1"]["start"] >= ran["host0"]["end"]


def test_combine_puts_each_finished_measurement_into_the_timings_file(tmp_path):
    base = dict(records=[dict(kernel="k")], measurements=dict(models=dict(old=True)))
    jobs = []
    for name, rc in (("models", 0), ("llama", 0), ("layouts", 1)):
        out = tmp_path / f"{name}.json"
        out.write_text(json.dumps(dict(records=[], measurements={name: dict(new=name)})))
        jobs.append(dict(name=name, measurement=name, out=out, returncode=rc, seconds=12.5))
    fresh = rerecord.combine(base, jobs)
    assert fresh["records"] == [dict(kernel="k")]
    assert fresh["measurements"] == {
        "models": dict(new="models", recording_seconds=12.5),
        "llama": dict(new="llama", recording_seconds=12.5)}  # the failed job's is not taken


def test_gpu_indices_follow_cuda_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2, 3")
    assert rerecord.gpu_indices() == ["2", "3"]


def test_the_file_of_a_gpu_is_found_by_its_runs_name():
    (path, data), = results.recorded_on("NVIDIA H200")
    assert path.name == "nvidia-h200.json" and data["provenance"]["gpu"] == "NVIDIA H200"
    assert results.recorded_on(None) == [] and results.recorded_on("Tesla T4") == []


def test_a_file_recorded_on_another_gpu_is_refused(tmp_path, monkeypatch, capsys):
    data = dict(provenance=dict(gpu="NVIDIA H200"), records=[], measurements={})
    assert results.recorded_elsewhere(data, "NVIDIA H200") is None
    assert results.recorded_elsewhere(data, "NVIDIA H100 80GB HBM3") == "NVIDIA H200"
    path = tmp_path / "nvidia-h200.json"
    path.write_text(json.dumps(data))
    monkeypatch.setattr("kernels.mode.device_name", lambda: "NVIDIA H100 80GB HBM3")
    ran = []
    monkeypatch.setattr(rerecord, "run_jobs", lambda *a, **k: ran.append(a))
    assert rerecord.main(["--results", str(path), "--out", str(tmp_path / "o.json")]) == 2
    assert not ran and "recorded on NVIDIA H200, not on this NVIDIA H100" in capsys.readouterr().err


def test_a_saved_suite_log_goes_to_the_timings_job_alone(tmp_path, monkeypatch):
    data, path = stale_file(tmp_path)
    data["provenance"] = dict(gpu="NVIDIA H200")
    path.write_text(json.dumps(data))
    monkeypatch.setattr("kernels.mode.device_name", lambda: "NVIDIA H200")
    ran = []
    monkeypatch.setattr(rerecord, "run_jobs", lambda todo, *a, **k: ran.extend(
        job.update(returncode=1) or job for job in todo))  # failed: nothing is written
    log = tmp_path / "suite.log"
    assert rerecord.main(["--results", str(path), "--out", str(tmp_path / "o.json"),
                          "--tests-log", str(log)]) == 1
    assert [job["name"] for job in ran] == ["timings"]  # training waits for it, in vain
    assert ran[0]["args"][-2:] == ["--tests-log", str(log.resolve())]
    training, = (j for j in rerecord.jobs(data, path, tmp_path) if j["name"] == "training")
    assert "--tests-log" not in training["args"]


def test_jobs_that_call_the_lean_call_run_after_the_timings_are_in_the_file(
        tmp_path, monkeypatch):
    """The lean call chooses its form by this GPU's records: a measurement through it
    starts only once the timings job's records are in the file it reads."""
    data, path = stale_file(tmp_path)  # chapter 7's timings and training stale
    data["provenance"] = dict(gpu="NVIDIA H200")
    path.write_text(json.dumps(data))
    monkeypatch.setattr("kernels.mode.device_name", lambda: "NVIDIA H200")
    new_records = [dict(kernel="hopper_attention", chapter=7, source_hash="new")]
    seen = []  # (job, the records in the results file as it started)

    def run(todo, *a, **k):
        for job in todo:
            seen.append((job["name"], json.loads(path.read_text())["records"]))
            if job["name"] == "timings":
                job["out"].write_text(json.dumps(dict(data, records=new_records)))
            else:
                job["out"].write_text(json.dumps(dict(measurements={job["name"]: {}})))
            job.update(returncode=0, seconds=1.0)

    monkeypatch.setattr(rerecord, "run_jobs", run)
    rerecord.main(["--results", str(path), "--out", str(tmp_path / "o.json")])
    assert seen == [("timings", data["records"]), ("training", new_records)]
    with pytest.raises(SystemExit):  # not without the timings before it
        rerecord.main(["--results", str(path), "--jobs", "training"])


def test_a_timings_merge_keeps_the_files_measurements(tmp_path):
    """The timings job (--no-measurements) merges chapter 7's timings into the file and
    leaves its measurements as they were: a call that splits a recording (--jobs) does
    not record them again."""
    import copy

    from kernels import record

    before, _ = stale_file(tmp_path)  # training stale, the rest fresh
    before.update(merged_runs=[])
    run = dict(records=[], measurements={}, profile=dict(status="skipped"),
               provenance={}, tests={}, ceilings={}, seconds=1)
    fresh = record.merge(copy.deepcopy(before), run, [7])
    assert set(fresh["measurements"]) - {"training"} == set(before["measurements"]) - {"training"}
    assert results.stale_measured(fresh, missing=False) == {
        "training": results.stale_measured(before)["training"]}


def test_the_plan_says_what_it_times_and_how_long_each_job_is_expected_to_take(tmp_path):
    """Before it starts: each job with its expected length (a measurement's last
    recording_seconds; the timings job's from the runs that last recorded its chapters)
    and the total, on the GPUs at hand."""
    data, path = stale_file(tmp_path, seconds={"training": 300.0, "models": 100.0})
    data["measurements"]["models"]["source_hash"] = "0" * 16
    data.update(seconds=500.0, merged_runs=[dict(chapters=[7, 8], seconds=200.0,
                                                 provenance={})])
    todo = rerecord.jobs(data, path, tmp_path)
    lines = rerecord.plan_lines(data, todo, 2)
    assert any(line.startswith("  timings (chapters 7") and "about 100 s" in line
               for line in lines)
    assert any(line.startswith("  training") and "about 300 s" in line for line in lines)
    assert lines[-1].startswith("  expected: about 500 s of GPU time")
    assert rerecord.expected_seconds({}, dict(name="llama", seconds=None)) is None


def test_one_changed_kernel_is_timed_again_alone(tmp_path):
    """A stale record of one kernel of a chapter whose other kernels are fresh makes a
    timings job for that kernel only (--kernels); a chapter all of whose kernels are
    stale is timed whole."""
    import kernels

    ch07 = [name for c, name, _ in kernels.all_kernels() if c == 7]
    assert rerecord.changed_kernels([(7, "hopper_dynamic_items")]) == [
        "--kernels", "hopper_dynamic_items"]
    assert rerecord.changed_kernels([(7, name) for name in ch07]) == []
    assert rerecord.changed_kernels([(7, "hopper_dynamic_items"), (7, "gone")]) == []
    data, path = stale_file(tmp_path)  # one stale record: hopper_attention's
    timings = rerecord.jobs(data, path, tmp_path)[0]
    assert timings["args"][-2:] == ["--kernels", "hopper_attention"]
