"""Both runners run the same entrypoint and differ only in mounts, limits and network.

farm/build/steps.py is written elsewhere; these tests give the runners a tiny entrypoint
module of their own (`probe_steps`, placed on PYTHONPATH through a mount), which
imports the farm's dependencies (so the container's tools environment is real) and
then does what its arguments say.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from farm.errors import BadInput
from farm.platforms import plat_glibc
from farm.runners.base import OUT_TARGET, WORK_TARGET
from farm.runners.choose import get_runner
from farm.runners.engine import Limits, Mount, ensure_engine
from farm.runners.host import HostRunner

pytestmark = [pytest.mark.slow]

PROBE = r'''
import json, os, socket, sys, time
import yaml, packaging, filelock, elftools, auditwheel  # the farm's own dependencies

def net(port):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.connect(("192.0.2.1", 9))   # route lookup only: no packet leaves
        udp = "route"
    except OSError as e:
        udp = "blocked"
    try:
        socket.create_connection(("127.0.0.1", int(port)), timeout=3).close()
        tcp = "reached"
    except OSError:
        tcp = "refused"
    return {"udp": udp, "tcp": tcp}

verb, *rest = sys.argv[1:]
if verb == "exit":
    print("exiting", rest[0]); sys.exit(int(rest[0]))
if verb == "env":
    out = {"argv": sys.argv[1:], "cwd": os.getcwd(), "uid": os.getuid(),
           "python": "%d.%d" % sys.version_info[:2], "work_listing": sorted(os.listdir(rest[0]))}
    with open(os.path.join(rest[1], "probe.json"), "w") as fh:
        json.dump(out, fh)
    print(json.dumps(out)); sys.exit(0)
if verb == "net":
    print(json.dumps(net(rest[0]))); sys.exit(0)
if verb == "sleep":
    time.sleep(float(rest[0])); sys.exit(0)
if verb == "memmax":   # the memory limit the step runs under: cgroup v2, else v1
    v2 = "/sys/fs/cgroup/memory.max"
    path = v2 if os.path.exists(v2) else "/sys/fs/cgroup/memory/memory.limit_in_bytes"
    print("memory.max", open(path).read().strip()); sys.exit(0)
if verb == "grab":
    b = bytearray(int(rest[0]) * 1024 * 1024); print(len(b)); sys.exit(0)
sys.exit(64)
'''


@pytest.fixture(scope="module")
def probe_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("probe")
    (d / "probe_steps.py").write_text(PROBE)
    return d


@pytest.fixture(scope="module")
def container():
    ensure_engine()
    return get_runner("container", entrypoint="probe_steps")


@pytest.fixture(scope="module")
def host():
    return get_runner("host", entrypoint="probe_steps")


def _mounts(runner, tmp_path: Path, probe_dir: Path) -> tuple[list[Mount], dict[str, str]]:
    work, out = tmp_path / "work", tmp_path / "out"
    mounts = runner.standard_mounts(work=work, out=out, caches={"ccache": tmp_path / "ccache"})
    mounts.append(Mount(probe_dir, "/farm/probe", read_only=True))
    return mounts, {"PYTHONPATH": runner.inside(probe_dir, mounts)}


@pytest.fixture
def loopback_port():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    stop = threading.Event()

    def serve():
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                srv.accept()[0].close()
            except OSError:
                pass

    threading.Thread(target=serve, daemon=True).start()
    yield srv.getsockname()[1]
    stop.set()
    srv.close()


def _last_json(log: Path) -> dict:
    return json.loads([ln for ln in log.read_text().splitlines() if ln.startswith("{")][-1])


@pytest.mark.container
@pytest.mark.parametrize("kind", ["container", "host"])
def test_both_runners_run_the_same_entrypoint_with_mounts_and_exit_codes(kind, container, host, probe_dir, tmp_path):
    runner = container if kind == "container" else host
    mounts, env = _mounts(runner, tmp_path, probe_dir)
    (tmp_path / "work" / "source.txt").write_text("x")
    code, log = runner.run_step(["exit", "7"], env, mounts, network=False, log_path=tmp_path / "a.log")
    assert code == 7 and "exiting 7" in log.read_text()
    work_in, out_in = runner.inside(tmp_path / "work", mounts), runner.inside(tmp_path / "out", mounts)
    if kind == "container":
        assert (work_in, out_in) == (WORK_TARGET, OUT_TARGET)
    code, log = runner.run_step(["env", work_in, out_in], env, mounts, network=False, log_path=tmp_path / "b.log")
    assert code == 0, log.read_text()
    seen = json.loads((tmp_path / "out" / "probe.json").read_text())
    assert seen["work_listing"] == ["source.txt"] and seen["cwd"] == work_in
    assert seen == _last_json(log)


@pytest.mark.container
def test_container_sees_the_project_read_only(container, probe_dir, tmp_path):
    mounts, env = _mounts(container, tmp_path, probe_dir)
    engine, image = container.engine, container.image
    out = engine.output(image.ref, ["sh", "-c", "test -f /farm/project/farm/build/steps.py -o -f /farm/project/farm/runners/engine.py "
                                    "&& echo seen; touch /farm/project/x 2>/dev/null && echo writable || echo ro"],
                        mounts=mounts)
    assert out.split() == ["seen", "ro"]


@pytest.mark.container
def test_container_compile_phase_has_no_network(container, probe_dir, tmp_path, loopback_port):
    mounts, env = _mounts(container, tmp_path, probe_dir)
    _, log = container.run_step(["net", str(loopback_port)], env, mounts, network=True, log_path=tmp_path / "on.log")
    assert _last_json(log)["udp"] == "route"
    code, log = container.run_step(["net", str(loopback_port)], env, mounts, network=False, log_path=tmp_path / "off.log")
    assert code == 0 and _last_json(log) == {"udp": "blocked", "tcp": "refused"}
    assert "(network none)" in log.read_text()


@pytest.mark.skipif(os.geteuid() != 0, reason="a new network namespace needs root")
def test_host_runner_as_root_compiles_in_a_new_network_namespace(host, probe_dir, tmp_path, loopback_port):
    assert host.network_isolation == "namespace" and host.describe()["network_when_off"] == "namespace"
    mounts, env = _mounts(host, tmp_path, probe_dir)
    _, log = host.run_step(["net", str(loopback_port)], env, mounts, network=True, log_path=tmp_path / "on.log")
    assert _last_json(log) == {"udp": "route", "tcp": "reached"}
    _, log = host.run_step(["net", str(loopback_port)], env, mounts, network=False, log_path=tmp_path / "off.log")
    assert _last_json(log) == {"udp": "blocked", "tcp": "refused"}


@pytest.mark.skipif(os.geteuid() != 0, reason="dropping to another user needs root")
def test_host_runner_without_root_records_network_open(tmp_path):
    """As an unprivileged user (setpriv to nobody) no namespace can be made: say so."""
    code = ("from farm.runners.host import HostRunner; r = HostRunner(); "
            "print(r.network_isolation, r.describe()['network_when_off'])")
    p = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                        str(Path(os.sys.executable)), "-c", code], capture_output=True, text=True,
                       cwd=Path(__file__).resolve().parent.parent)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["open", "open"]


@pytest.mark.container
def test_container_memory_limit_gives_137(probe_dir, tmp_path):
    ensure_engine()
    runner = get_runner("container", entrypoint="probe_steps", limits=Limits(memory="256m", cpus=1))
    mounts, env = _mounts(runner, tmp_path, probe_dir)
    code, _ = runner.run_step(["grab", "600"], env, mounts, network=False, log_path=tmp_path / "oom.log")
    assert code == 137
    assert runner.describe()["limits"] == {"memory": "256m", "cpus": 1}
    assert runner.memory_cap_gb() == 0.25   # memory admission keeps a build's jobs under it


@pytest.mark.container
def test_a_container_step_runs_under_the_default_memory_limit(container, probe_dir, tmp_path):
    """No limits given: the host's memory less the reserve (farm.runners.engine.default_limits), in the cgroup."""
    from farm.runners.engine import default_limits

    want = default_limits().memory
    assert want and container.describe()["limits"]["memory"] == want
    mounts, env = _mounts(container, tmp_path, probe_dir)
    code, _ = container.run_step(["memmax"], env, mounts, network=False, log_path=tmp_path / "mem.log")
    assert code == 0
    line = next(ln for ln in (tmp_path / "mem.log").read_text().splitlines() if ln.startswith("memory.max"))
    assert int(line.split()[1]) == int(want.rstrip("g")) * 1024 ** 3
    assert container.memory_cap_gb() == int(want.rstrip("g"))


@pytest.mark.container
@pytest.mark.parametrize("kind", ["container", "host"])
def test_step_timeout_ends_the_step_with_124(kind, container, host, probe_dir, tmp_path):
    runner = container if kind == "container" else host
    mounts, env = _mounts(runner, tmp_path, probe_dir)
    t0 = time.monotonic()
    code, _ = runner.run_step(["sleep", "300"], env, mounts, network=False, log_path=tmp_path / "t.log", timeout=4)
    assert code == 124 and time.monotonic() - t0 < 90


@pytest.mark.container
def test_describe_names_runner_image_tag_and_pythons(container, host):
    d = container.describe()
    assert d["runner"] == "container" and d["engine"] in ("docker", "podman")
    assert d["image_id"].startswith("sha256:") and d["plat"] == container.image.plat
    assert "3.11" in d["pythons"] and d["network_when_off"] == "none"
    h = host.describe()
    assert h["runner"] == "host" and h["image_id"] is None and h["plat"] is None
    assert f"{os.sys.version_info[0]}.{os.sys.version_info[1]}" in h["pythons"]


@pytest.mark.container
def test_python_for_a_version_comes_with_the_mount_it_needs(container):
    path, mounts = container.python("3.11")
    assert path == "/usr/bin/python3" and mounts == []
    others = [p for p in container.image.pythons if p.get("mount")]
    if others:
        path, mounts = container.python(others[0]["version"])
        assert mounts == [Mount(others[0]["mount"], others[0]["mount"], read_only=True)]
    with pytest.raises(Exception, match="provides no Python 2.1"):
        container.python("2.1")


def test_paths_outside_every_mount_are_refused_and_host_paths_are_identity(host, tmp_path):
    from farm.errors import RunnerError
    from farm.runners.container import ContainerRunner

    mounts = [Mount(tmp_path / "w", "/farm/work"), Mount(tmp_path / "w" / "deep", "/farm/deep")]
    inside = ContainerRunner.inside
    assert inside(None, tmp_path / "w" / "a" / "b", mounts) == "/farm/work/a/b"
    assert inside(None, tmp_path / "w" / "deep" / "c", mounts) == "/farm/deep/c"
    with pytest.raises(RunnerError, match="not under any mount"):
        inside(None, tmp_path / "elsewhere", mounts)
    assert host.inside(tmp_path / "elsewhere", mounts) == str((tmp_path / "elsewhere").resolve())


def test_host_runner_refuses_another_architecture():
    with pytest.raises(BadInput, match="container runner"):
        HostRunner(arch="aarch64")
    with pytest.raises(BadInput, match="--runner"):
        get_runner("vm")


@pytest.mark.container
@pytest.mark.arm
def test_container_runner_runs_the_entrypoint_in_the_emulated_aarch64_image(probe_dir, tmp_path):
    from test_images import arm_image_or_skip

    arm = arm_image_or_skip(ensure_engine())
    runner = get_runner("container", arch="aarch64", image=arm, entrypoint="probe_steps")
    mounts, env = _mounts(runner, tmp_path, probe_dir)
    code, log = runner.run_step(["exit", "5"], env, mounts, network=False, log_path=tmp_path / "arm.log")
    assert code == 5, log.read_text()
    d = runner.describe()
    assert d["arch"] == "aarch64" and d["emulated"] is True and plat_glibc(d["plat"]) <= (2, 31)
