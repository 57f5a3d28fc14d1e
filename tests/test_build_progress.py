"""What a person sees while a cell builds (design.md §6.9, issue 19): the steps' progress events, the
display that renders them on a terminal and in a CI log, the summary, and the compiler's first error.

The end-to-end tests run the real `farm build` of the demo cell in the real builder image (podman),
once under a pseudo-terminal and once into a pipe, with the shared compiler cache warm, and a real
failing compile (nvcc on a .cu file with two syntax errors) through the host runner: between them,
both runners carry the stream.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import select
import struct
import subprocess
import sys
import termios
import time
from io import StringIO
from pathlib import Path

import pytest
from farmcli import PROJECT, run_farm

from farm import progress
from farm.build.compilelog import Count, read_progress_line
from farm.build.display import Outcome, StepDisplay, Throttle, describe
from farm.build.downloads import DownloadProgress
from farm.progress import Event
from farm.recipes.buildoutput import first_error, first_error_lines

CELL = "farm_demo-cu130-torch2.13-py311"
CELL_STEPS = ("source", "downloads", "env", "toolkit", "compile", "label", "repair", "verify", "publish")
ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[()][0-9A-B]")


# ---------------------------------------------------------------- recorded compiler output

# nvcc 13.0 on a .cu file with a missing ';' (line 3) and an undefined name (line 5), as recorded here.
NVCC_OUTPUT = '''bad.cu(3): error: expected a ";"
      x[i] = 2.0f * x[i];
      ^

bad.cu(5): error: identifier "undefined_thing" is undefined
  int f() { return undefined_thing; }
                   ^

2 errors detected in the compilation of "bad.cu".
'''
GCC_OUTPUT = '''bad.cpp: In function \u2018int main()\u2019:
bad.cpp:4:3: error: expected initializer before \u2018return\u2019
    4 |   return v.size();
      |   ^~~~~~
'''
NVCC_FATAL = "nvcc fatal   : Unsupported gpu architecture 'sm_20'\n"
LINKER_OUTPUT = '''/usr/bin/ld: /tmp/ccBZrxCJ.o: in function `main':
link.cpp:(.text+0x5): undefined reference to `f()'
collect2: error: ld returned 1 exit status
'''
# torch's BuildExtension through ninja, cut down: the command ninja echoes (with -Werror and *error* paths),
# the compiler's error, ninja's and setuptools' summaries, then the traceback whose last line names no cause.
TORCH_NINJA_LOG = '''$ cd /farm/work/src && python -c '<farm.build.compile.PEP517_BUILD>'
#   TORCH_CUDA_ARCH_LIST=8.0
farm: PEP 517 build_wheel of setuptools.build_meta
[1/2] c++ -MMD -MF binding.o.d -Werror=format -I/farm/include/error_handling -c /farm/work/src/csrc/binding.cpp -o binding.o
FAILED: /farm/work/src/build/temp.linux-x86_64-cpython-311/csrc/kernel.o
ccache nvcc -c /farm/work/src/csrc/kernel.cu -o kernel.o -Werror=all-warnings
/farm/work/src/csrc/kernel.cu(12): error: identifier "blockDimm" is undefined
      int i = blockIdx.x * blockDimm.x + threadIdx.x;
                           ^

/farm/work/src/csrc/kernel.cu(20): error: expected a ";"

2 errors detected in the compilation of "/farm/work/src/csrc/kernel.cu".
ninja: build stopped: subcommand failed.
Traceback (most recent call last):
  File "torch/utils/cpp_extension.py", line 2600, in _run_ninja_build
    subprocess.run(
subprocess.CalledProcessError: Command '['ninja', '-v', '-j', '2']' returned non-zero exit status 1.

The above exception was the direct cause of the following exception:

Traceback (most recent call last):
  File "<string>", line 11, in <module>
RuntimeError: Error compiling objects for extension
# exit 1 after 9.3s
'''


def test_the_first_error_is_the_compilers_first_with_its_source_excerpt():
    assert first_error_lines(NVCC_OUTPUT) == ['bad.cu(3): error: expected a ";"', "      x[i] = 2.0f * x[i];",
                                              "      ^"]
    assert first_error_lines(GCC_OUTPUT) == ["bad.cpp:4:3: error: expected initializer before \u2018return\u2019",
                                             "    4 |   return v.size();", "      |   ^~~~~~"]
    assert first_error(NVCC_FATAL) == "nvcc fatal   : Unsupported gpu architecture 'sm_20'"
    assert first_error(LINKER_OUTPUT) == "link.cpp:(.text+0x5): undefined reference to `f()'"   # not collect2's


def test_the_first_error_skips_command_lines_summaries_and_the_traceback():
    lines = first_error_lines(TORCH_NINJA_LOG)
    assert lines[0] == '/farm/work/src/csrc/kernel.cu(12): error: identifier "blockDimm" is undefined'
    assert lines[1].strip().startswith("int i = blockIdx.x")
    assert len(lines) == 3 and not any("kernel.cu(20)" in ln for ln in lines)


def test_without_a_compiler_error_the_tools_own_error_line_or_nothing():
    backend = 'Traceback (most recent call last):\n    raise ValueError("error: no nvcc")\nValueError: error: no nvcc\n'
    assert first_error(backend) == "ValueError: error: no nvcc"
    assert first_error("running build_ext\nwarning: no -Werror here\n") is None


# ---------------------------------------------------------------- counting a compile

def test_ninja_cmake_and_plain_compiler_lines_count_the_compile():
    count = Count()
    assert read_progress_line("[1/3] ccache nvcc -MD -c /farm/work/src/csrc/elementwise.cu -o /x/elementwise.o", count)
    assert (count.done, count.total, count.current) == (1, 3, "csrc/elementwise.cu")
    assert not read_progress_line("/farm/work/src/csrc/reduce.cu(3): warning: unused", count)
    cmake = Count()
    assert read_progress_line("[ 42%] Building CUDA object CMakeFiles/ops.dir/src/ops/gemm.cu.o", cmake)
    assert (cmake.done, cmake.total, cmake.unit, cmake.current) == (42, 100, "%", "ops/gemm.cu")
    plain = Count()
    for name in ("a.cpp", "b.cu"):
        compiler = "gcc -pthread -fPIC" if name.endswith(".cpp") else "/usr/local/cuda/bin/nvcc"
        assert read_progress_line(f"{compiler} -I/inc -c src/{name} -o build/{name}.o", plain)
    assert (plain.done, plain.total, plain.current) == (2, None, "src/b.cu")


# ccache 4.7's stats log of a build with one miss then two hits, as CCACHE_STATSLOG writes it.
CCACHE_STATS = """# ../../csrc/elementwise.cu
cache_miss
local_storage_miss
local_storage_write
# ../../csrc/binding.cpp
direct_cache_hit
local_storage_hit
local_storage_read_hit
local_storage_read_hit
# ../../csrc/reduce.cu
preprocessed_cache_hit
direct_cache_hit
local_storage_hit
"""


def test_the_compile_watch_emits_every_count_with_the_cache_hits_so_far(tmp_path):
    from farm.build.ccache import read_stats_log
    from farm.build.compilelog import CompileWatch

    log, stats = tmp_path / "compile.log", tmp_path / "ccache-stats.log"
    seen: list[Event] = []
    with progress.using(seen.append), CompileWatch(log, str(stats), interval=3600) as watch:   # polled by hand
        with open(log, "a") as fh, open(stats, "a") as st:
            for n, (name, block) in enumerate(zip(("elementwise.cu", "binding.cpp", "reduce.cu"),
                                                  CCACHE_STATS.split("# ")[1:], strict=True), start=1):
                st.write("# " + block)
                st.flush()
                fh.write(f"[{n}/3] ccache nvcc -c /farm/work/src/csrc/{name} -o {name}.o\nsome warning\n")
                fh.flush()
                watch.poll()
    assert [(e.done, e.total, e.current, e.hits) for e in seen] == [
        (1, 3, "csrc/elementwise.cu", 0), (2, 3, "csrc/binding.cpp", 1), (3, 3, "csrc/reduce.cu", 2)]
    assert watch.hits == read_stats_log(stats)["hits"] == 2


def test_pip_raw_progress_becomes_bytes_done_of_the_files_started():
    seen: list[Event] = []
    reader = DownloadProgress()
    with progress.using(seen.append):
        for line in ("Collecting numpy", "  Downloading numpy-2.4.6-cp311-cp311-manylinux_2_28_x86_64.whl (16.9 MB)",
                     "Progress 0 of 16918164", "Progress 262144 of 16918164", "Progress 16918164 of 16918164",
                     "Saved ./d/numpy-2.4.6-cp311-cp311-manylinux_2_28_x86_64.whl",
                     "  Downloading six-1.17.0-py2.py3-none-any.whl (11 kB)", "Progress 11050 of 11050"):
            reader(line)
    assert [(e.done, e.total) for e in seen] == [(0, 16918164), (262144, 16918164), (16918164, 16918164),
                                                 (16918164 + 11050, 16918164 + 11050)]
    assert seen[0].current.startswith("numpy-2.4.6") and seen[-1].current == "six-1.17.0-py2.py3-none-any.whl"
    assert describe(seen[1]) == "262.1 KB of 16.9 MB, numpy-2.4.6-cp311-cp311-manylinux_2_28_x86_64.whl"


def test_a_downloads_step_of_two_pip_runs_totals_both_and_the_next_step_run_starts_at_zero():
    """The env's torch closure, then the recipe's deps: the step's end line must count both runs."""
    def pip_run(name: str, size: int) -> None:
        reader = DownloadProgress()
        for line in (f"  Downloading {name} (x)", f"Progress {size} of {size}", f"Saved ./d/{name}"):
            reader(line)

    seen: list[Event] = []
    with progress.using(seen.append):
        with progress.step("downloads"):
            pip_run("torch-2.13.0-cp311-cp311-manylinux_2_28_x86_64.whl", 5000)
            pip_run("numpy-2.4.6-cp311-cp311-manylinux_2_28_x86_64.whl", 700)
        with progress.step("downloads"):
            pip_run("six-1.17.0-py2.py3-none-any.whl", 11)
    counts = [(e.done, e.total) for e in seen if e.kind == "progress"]
    assert counts == [(5000, 5000), (5700, 5700), (11, 11)]


def test_image_set_up_counts_debootstraps_packages_and_the_image_builds_steps():
    from farm.runners.images import debootstrap_progress, image_build_progress

    seen: list[Event] = []
    with progress.using(seen.append):
        reader = debootstrap_progress()
        for line in ("I: Retrieving InRelease ", "I: Checking Release signature", "I: Retrieving Packages ",
                     "I: Retrieving base-files 12.4+deb12u15", "I: Validating base-files 12.4+deb12u15",
                     "I: Retrieving bash 5.2.15-2+b13", "I: Unpacking apt...", "I: Configuring libc-bin..."):
            reader(line)
        for line in ("STEP 4/9: COPY install-deps.sh /usr/local/sbin/farm-install-deps",
                     "STEP 5/9: RUN sh /usr/local/sbin/farm-install-deps", "Get:1 http://deb.debian.org ...",
                     "#7 [builder 3/6] RUN apt-get update"):
            image_build_progress(line)
    boot = [(e.done, e.current) for e in seen if e.step == "debootstrap"]
    assert boot == [(0, "Retrieving InRelease"), (0, "Retrieving Packages"), (1, "Retrieving base-files 12.4+deb12u15"),
                    (1, "Validating base-files 12.4+deb12u15"), (2, "Retrieving bash 5.2.15-2+b13"),
                    (2, "Unpacking apt"), (2, "Configuring libc-bin")]
    assert describe(seen[4]) == "2 packages fetched, Retrieving bash 5.2.15-2+b13"
    build = [describe(e) for e in seen if e.step == "image build"]
    assert build == ["3/9 steps, COPY install-deps.sh /usr/local/sbin/farm-install-deps",
                     "4/9 steps, RUN sh /usr/local/sbin/farm-install-deps", "2/6 steps, RUN apt-get update"]


# ---------------------------------------------------------------- the event stream and the plain display

def test_events_survive_the_file_and_foreign_lines_are_skipped(tmp_path):
    path = tmp_path / progress.PROGRESS_FILE
    sink = progress.FileSink(path)
    sink(Event("compile", "progress", done=2, total=3, unit="objects", current="csrc/a.cu", hits=1))
    sink(Event("compile", "fail", seconds=1.5, error="compile failed", lines=("a.cu(1): error: x", "  ^")))
    with open(path, "a") as fh:
        fh.write('not json\n{"step": 3, "kind": "start"}\n{"step": "x", "kind": "explode"}\n{"step": "verify", "ki')
    got: list[Event] = []
    progress.follow_events(path, got.append).poll()
    assert [(e.step, e.kind) for e in got] == [("compile", "progress"), ("compile", "fail")]
    assert got[0].done == 2 and got[0].hits == 1 and got[1].lines == ("a.cu(1): error: x", "  ^")
    with open(path, "a") as fh:   # the torn last line, completed later, is read then
        fh.write('nd": "start"}\n')
    tail = progress.follow_events(path, got.append)
    tail.poll()
    assert [(e.step, e.kind) for e in got[2:]] == [("compile", "progress"), ("compile", "fail"), ("verify", "start")]


def test_a_step_whose_child_died_silently_fails_with_the_hosts_line(tmp_path):
    path = tmp_path / progress.PROGRESS_FILE
    sink = progress.FileSink(path)
    for event in (Event("env", "start"), Event("env", "end", seconds=0.1), Event("compile", "start")):
        sink(event)
    (tmp_path / "compile.log").write_text("[1/9] nvcc -c a.cu\n")
    seen: list[Event] = []
    with progress.using(seen.append):
        relay = progress.Relay(path, logs={"compile": tmp_path / "compile.log"})
        relay.fail_open("killed (exit 137: out of memory?)")   # the child wrote no end for compile
    assert [(e.step, e.kind) for e in seen] == [("env", "start"), ("env", "end"), ("compile", "start"),
                                                ("compile", "log"), ("compile", "fail")]
    assert seen[3].text == "[1/9] nvcc -c a.cu" and seen[-1].error == "killed (exit 137: out of memory?)"


def test_the_throttle_lets_a_key_through_once_per_interval():
    now = [100.0]
    throttle = Throttle(10.0, clock=lambda: now[0])
    assert throttle.ready("compile") and not throttle.ready("compile")
    assert throttle.ready("downloads")   # per step
    now[0] += 9.9
    assert not throttle.ready("compile")
    now[0] += 0.1
    assert throttle.ready("compile")


def test_plain_lines_keep_every_start_and_end_and_one_progress_line_per_interval():
    now = [0.0]
    out = StringIO()
    display = StepDisplay(plain=True, stream=out, clock=lambda: now[0])
    display(Event("compile", "start"))
    for n in range(1, 301):   # a compile of 300 objects, one a second
        now[0] = float(n)
        display(Event("compile", "progress", done=n, total=300, unit="objects", current=f"src/f{n}.cu", hits=n // 2))
    display(Event("compile", "end", seconds=300.0, peak_mb=2100))
    lines = out.getvalue().splitlines()
    assert lines[0] == "[farm build] compile: start"
    assert lines[1] == "[farm build] compile: 1/300 objects, src/f1.cu, 0 cache hits"   # the first at once
    assert lines[2] == "[farm build] compile: 11/300 objects, src/f11.cu, 5 cache hits"
    assert len(lines) == 2 + 30
    assert lines[-1] == "[farm build] compile: done in 5m00s (300/300 objects, 150 cache hits)"


def test_a_plain_step_that_says_nothing_for_a_while_says_it_still_runs():
    out = StringIO()
    display = StepDisplay(plain=True, stream=out, heartbeat=0.2)
    display(Event("env", "start"))
    deadline = time.monotonic() + 10
    while "env: running for" not in out.getvalue() and time.monotonic() < deadline:
        time.sleep(0.05)
    display(Event("env", "end", seconds=0.5))
    display.close()
    lines = out.getvalue().splitlines()
    assert lines[0] == "[farm build] env: start" and lines[-1] == "[farm build] env: done in 0.5s"
    assert all(re.fullmatch(r"\[farm build\] env: running for \d+\.\ds", ln) for ln in lines[1:-1]) and lines[1:-1]
    # quiet: no heartbeat either, for as long as a display beside it has given two (a condition, not a sleep)
    silent, beside = StringIO(), StringIO()
    quiet = StepDisplay(plain=True, stream=silent, heartbeat=0.2, quiet=True)
    loud = StepDisplay(plain=True, stream=beside, heartbeat=0.2)
    quiet(Event("env", "start"))
    loud(Event("env", "start"))
    deadline = time.monotonic() + 10
    while beside.getvalue().count("env: running for") < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    quiet.close()
    loud.close()
    assert beside.getvalue().count("env: running for") >= 2
    assert silent.getvalue() == ""


def test_quiet_shows_nothing_and_a_failure_summary_shows_the_first_error(tmp_path):

    out = StringIO()
    display = StepDisplay(plain=True, stream=out, quiet=True)
    display(Event("compile", "start"))
    display(Event("compile", "fail", seconds=12.0, error="compile failed (exit 1)", lines=tuple(first_error_lines(NVCC_OUTPUT))))
    assert out.getvalue() == ""
    summary = StepDisplay(plain=True, stream=StringIO())
    for event in (Event("source", "start"), Event("source", "end", seconds=0.1), Event("compile", "start"),
                  Event("compile", "progress", done=1, total=2, unit="objects", hits=1),
                  Event("compile", "fail", seconds=12.0, error="compile failed (exit 1)", peak_mb=900,
                        lines=tuple(first_error_lines(NVCC_OUTPUT)))):
        summary(event)
    text = summary.summary_lines(Outcome("x: failed", arch_list="8.0", logs=[tmp_path / "build.log"]))
    assert text[0] == "x: failed" and "  arch list:    8.0" in text
    assert "  steps:        source 0.1s, compile 12.0s (failed)" in text
    assert "  peak memory:  900 MB (the largest process)" in text and "  cache:        1 hit" in text
    assert text[-4:] == ["  failed:       compile after 12.0s",
                         '    bad.cu(3): error: expected a ";"', "          x[i] = 2.0f * x[i];", "          ^"]


def test_a_step_run_in_two_phases_keeps_its_place_and_sums_its_runs_in_the_summary():
    # A recipe with a pre_build runs env and toolkit in the pre_build phase and again in the build phase.
    out = StringIO()
    display = StepDisplay(plain=True, stream=out)
    runs = [("source", 0.2), ("env", 80.0), ("toolkit", 12.0), ("prebuild", 5.0), ("env", 1.5), ("toolkit", 0.5),
            ("compile", 30.0)]
    for step, seconds in runs:
        display(Event(step, "start"))
        display(Event(step, "end", seconds=seconds))
    display.close()
    assert "[farm build] env: done in 1.5s" in out.getvalue().splitlines()   # each run's line says its own time
    text = display.summary_lines(Outcome("x: built"))
    assert "  steps:        source 0.2s, env 1m21s, toolkit 12.5s, prebuild 5.0s, compile 30.0s" in text


# ---------------------------------------------------------------- end to end: farm build of the demo cell

def strip_ansi(text: str) -> str:
    return ANSI.sub("", text).replace("\r", "\n")


def run_farm_in_pty(*args: str, env: dict, timeout: float) -> tuple[int, str]:
    """The real `farm` with a pseudo-terminal (160 columns) as stdin, stdout and stderr: what a person sees."""
    import pty

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 160, 0, 0))
    proc = subprocess.Popen([sys.executable, "-m", "farm", *args], stdin=slave, stdout=slave, stderr=slave,
                            env={**os.environ, "TERM": "xterm-256color", **env}, cwd=PROJECT, close_fds=True)
    os.close(slave)
    chunks, deadline = [], time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 1.0)
            if not ready:
                if proc.poll() is not None:
                    break
                continue
            try:
                data = os.read(master, 65536)
            except OSError:   # EIO: the child's side is closed
                break
            if not data:
                break
            chunks.append(data)
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
    return proc.wait(), b"".join(chunks).decode("utf-8", "replace")


def check_steps_and_counts(text: str, prefix: str) -> None:
    """Every step's start and its end with an elapsed time, in order, and a compile count below its
    total before the compile's end line."""
    position = 0
    for step in CELL_STEPS:
        start = re.compile(rf"^{re.escape(prefix)}{step}: start$", re.M).search(text, position)
        assert start, f"no start line of {step} after position {position}:\n{text[-3000:]}"
        end = re.compile(rf"^{re.escape(prefix)}{step}: done in \d+(?:\.\d)?s\b", re.M).search(text, start.end())
        assert end, f"no end line of {step} with its time:\n{text[-3000:]}"
        position = end.end()
    compile_start = text.index(f"{prefix}compile: start")
    compile_end = text.index(f"{prefix}compile: done in")
    counts = [(int(a), int(b)) for a, b in re.findall(r"\b(\d+)/(\d+) objects", text[compile_start:compile_end])]
    assert any(done < total for done, total in counts), text[compile_start:compile_end]
    assert re.search(r"compile: done in \S+ \(3/3 objects, \d+ cache hits?\)", text)


def check_summary(text: str, prefix: str, out: Path) -> None:
    wheel = next((out / "wheel").glob("*.whl"))
    assert f"{prefix}{CELL}: built in " in text
    assert re.search(rf"wheel: +{re.escape(str(wheel))} \(\d+\.\d KB\)", text)
    assert re.search(r"arch list: +7\.5 8\.0 8\.6 9\.0\+PTX 10\.0 12\.0\+PTX", text)
    assert re.search(r"found: +SASS sm_75 sm_80 sm_86 sm_90 sm_100 sm_120; PTX compute_90 compute_120", text)
    steps = re.search(r"steps: +(.*)", text)
    assert steps and [s.split()[0] for s in steps.group(1).split(", ")] == list(CELL_STEPS)
    assert re.search(r"peak memory: +\d+ MB", text) and re.search(r"cache: +\d+ hits?", text)
    assert f"{out / 'build.log'}, {out / 'compile.log'}" in text


@pytest.mark.slow
@pytest.mark.container
def test_farm_build_shows_each_step_and_compile_counts_on_a_terminal_and_in_a_log(tmp_path):
    env = {"FARM_WHEELHOUSE": str(tmp_path / "house")}
    common = ("--runner", "container", "--force")
    out = tmp_path / "pty"
    code, raw = run_farm_in_pty("build", CELL, *common, "--out", str(out), env=env, timeout=1800)
    text = strip_ansi(raw)
    assert code == 0, text[-3000:]
    assert "[farm build]" not in text and "\x1b[" in raw   # the rich view, not the plain lines
    check_steps_and_counts(text, "")
    check_summary(text, "", out)
    assert (out / progress.PROGRESS_FILE).is_file()

    out = tmp_path / "pipe"
    res = run_farm("build", CELL, *common, "--out", str(out), env=env, timeout=1800)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "\x1b[" not in res.stdout
    check_steps_and_counts(res.stdout, "[farm build] ")
    check_summary(res.stdout, "[farm build] ", out)
    # a plain log stays short: start and end per step, at most one progress line per 10 s of a step
    events = [json.loads(ln) for ln in (out / progress.PROGRESS_FILE).read_text().splitlines()]
    seconds = {e["step"]: e["seconds"] for e in events if e["kind"] == "end"}
    progress_lines = [ln for ln in res.stdout.splitlines() if re.match(r"\[farm build\] \w+: \d", ln)]
    assert len(progress_lines) <= sum(1 + int(s // 10) for s in seconds.values())

    quiet = run_farm("build", CELL, "--runner", "container", "--quiet", "--out", str(tmp_path / "quiet"),
                     env=env, timeout=600)   # published above: up to date, and only the result is printed
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stdout.splitlines()[0].startswith("wheel:") and ": start" not in quiet.stdout


BAD_SETUP = '''from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CUDAExtension

setup(name="badcu", version="0.1.0", ext_modules=[CUDAExtension("badcu._C", ["bad.cu"])],
      cmdclass={"build_ext": BuildExtension})
'''
BAD_CU = '''__global__ void twice(float *x) {
    int i = threadIdx.x
    x[i] = 2.0f * x[i];
}
int later() { return undefined_thing; }
'''


@pytest.mark.slow
def test_a_failing_compile_shows_the_compilers_first_error_in_the_summary(tmp_path):
    src = tmp_path / "badcu"
    src.mkdir()
    (src / "setup.py").write_text(BAD_SETUP)
    (src / "bad.cu").write_text(BAD_CU)
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    (recipes / "badcu.yml").write_text(f"name: badcu\nsource:\n  path: {src}\nversion: '0.1.0'\nlinks_torch: true\n"
                                       "platforms: [linux]\nmin_torch: '2.13'\narch_list: '8.0'\n")
    out = tmp_path / "out"
    res = run_farm("build", "badcu-cu130-torch2.13-py311", "--runner", "host", "--no-publish", "--out", str(out),
                   "-v", env={"FARM_RECIPES": str(recipes)}, timeout=1800)
    assert res.returncode == 1, res.stdout + res.stderr
    stderr = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(stderr) == 1 and 'bad.cu(3): error: expected a ";"' in stderr[0], res.stderr
    text = res.stdout
    # -v: the compile log streams under the step lines, unprefixed, before the compile's end
    assert re.search(r"^\[1/1\] .*nvcc.* -c \S*bad\.cu", text, re.M) and "2 errors detected" in text
    assert text.index("2 errors detected") < text.index("[farm build] compile: failed after")
    assert re.search(r"^\[farm build\] compile: failed after \d+(\.\d)?s: compile failed", text, re.M), text
    summary = text[text.index("[farm build] badcu-cu130-torch2.13-py311: failed"):]
    failed = re.search(r"failed: +compile after \S+\n\[farm build\]     (.*)\n", summary)
    assert failed and failed.group(1).endswith('bad.cu(3): error: expected a ";"'), summary
    assert "undefined_thing" not in summary   # the second error follows from nothing: only the first
    assert re.search(r"steps: +source \S+, downloads \S+, env \S+, toolkit \S+, compile \S+ \(failed\)", summary)
    assert "arch list:    8.0" in summary and str(out / "compile.log") in summary
    assert not list(out.rglob("*.whl"))


def test_the_cpu_a_waited_for_child_spent_is_counted_and_a_sleeping_one_costs_nothing():
    """compile_cpu_s is the rusage of what the compile waited for: a busy child counts, a sleep does not."""
    before = progress.children_cpu_s()
    subprocess.run([sys.executable, "-c", "sum(i * i for i in range(3_000_000))"], check=True)
    busy = progress.cpu_spent_since(before)
    assert busy is not None and busy >= 0.1, busy
    before = progress.children_cpu_s()
    subprocess.run(["sleep", "0.5"], check=True)
    idle = progress.cpu_spent_since(before)
    assert idle is not None and idle < 0.1, idle
