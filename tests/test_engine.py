"""The engine layer against real podman (and the docker CLI against podman's service).

Needs a working engine: `make setup-engine` is run by ensure_engine() when none answers.
The image used is the cached builder image (built once per machine, see test_images.py).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from farm.errors import EngineUnavailable
from farm.platforms import host_arch
from farm.runners import images
from farm.runners.engine import Engine, Limits, Mount, ensure_engine

pytestmark = [pytest.mark.slow, pytest.mark.container]
PROJECT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def engine() -> Engine:
    return ensure_engine()


@pytest.fixture(scope="module")
def image(engine) -> str:
    return images.ensure_builder(host_arch(), engine, quiet=True).ref


def test_setup_engine_script_is_idempotent():
    first = subprocess.run(["sh", str(PROJECT / "scripts/setup-engine.sh")], capture_output=True, text=True)
    assert first.returncode == 0, first.stdout + first.stderr
    second = subprocess.run(["sh", str(PROJECT / "scripts/setup-engine.sh")], capture_output=True, text=True)
    assert second.returncode == 0
    assert "installing" not in second.stdout and "wrote" not in second.stdout, second.stdout
    assert "podman answers info" in second.stdout
    conf = Path("/etc/containers/containers.conf").read_text()
    assert 'runtime = "runc"' in conf and "nofile=20000:20000" in conf


def test_farm_engine_selects_and_names_a_missing_engine(monkeypatch):
    monkeypatch.setenv("FARM_ENGINE", "podman")
    assert Engine.detect().name == "podman"
    monkeypatch.setenv("FARM_ENGINE", "no-such-engine")
    with pytest.raises(EngineUnavailable) as exc:
        Engine.detect()
    assert "no-such-engine: not installed" in str(exc.value)
    assert "\n" not in str(exc.value)


def test_nonzero_exit_code_comes_back_faithfully(engine, image):
    assert engine.run(image, ["sh", "-c", "exit 7"]).exit_code == 7
    assert engine.run(image, ["sh", "-c", "exit 0"]).exit_code == 0
    # A child killed by SIGKILL (PID 1 itself would be immune to it inside its namespace).
    assert engine.run(image, ["sh", "-c", "sh -c 'kill -9 $$'; exit $?"]).exit_code == 137


def test_container_output_goes_to_the_log_and_the_container_is_removed(engine, image, tmp_path):
    log = tmp_path / "step.log"
    res = engine.run(image, ["sh", "-c", "echo out; echo err >&2; exit 3"], log_path=log)
    assert res.exit_code == 3
    assert log.read_text().splitlines() == ["out", "err"]
    assert engine.inspect(res.container_id, kind="container") is None


def test_docker_cli_against_podman_service_keeps_the_exit_code(image, tmp_path):
    """The docker CLI talking to podman's API: create/start/wait still reads 7.

    (`docker run --rm` against podman 4.3's service reports 0 here; that is why
    the farm never uses it. The run below prints what it reported.)
    """
    docker = shutil.which("docker")
    if not docker:
        pytest.skip("no docker CLI on this machine")
    sock = tmp_path / "podman.sock"
    svc = subprocess.Popen(["podman", "system", "service", "--time=0", f"unix://{sock}"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            if sock.exists():
                break
            time.sleep(0.1)
        eng = Engine(docker, env={"DOCKER_HOST": f"unix://{sock}"})
        assert eng.name == "docker"
        ok, why = eng.answers()
        assert ok, why
        assert eng.run(image, ["sh", "-c", "exit 7"]).exit_code == 7
        rm = subprocess.run([docker, "run", "--rm", image, "sh", "-c", "exit 7"],
                            env={**os.environ, "DOCKER_HOST": f"unix://{sock}"}, capture_output=True)
        print(f"docker run --rm reported exit {rm.returncode} for `exit 7`")
    finally:
        svc.terminate()
        svc.wait(timeout=30)


def _udp_probe(network: bool, engine: Engine, image: str) -> str:
    # A UDP connect() sends no packet: it only asks the kernel for a route. With
    # --network=none there is none (ENETUNREACH); with a network there is.
    code = ("import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
            "try:\n    s.connect(('192.0.2.1', 9)); print('route')\n"
            "except OSError as e:\n    print('blocked', e.errno)\n")
    return engine.output(image, ["python3", "-c", code], network=network).strip()


def test_network_none_makes_socket_connect_fail(engine, image):
    assert _udp_probe(True, engine, image) == "route"
    assert _udp_probe(False, engine, image).startswith("blocked")


def test_network_none_cannot_reach_a_server_on_the_host_loopback(engine, image):
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]
    threading.Thread(target=lambda: srv.accept(), daemon=True).start()
    code = (f"import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=3); print('reached')\n"
            "except OSError:\n    print('refused')\n")
    try:
        assert engine.output(image, ["python3", "-c", code], network=False).strip() == "refused"
        # Control: the same connect from this host succeeds.
        socket.create_connection(("127.0.0.1", port), timeout=3).close()
    finally:
        srv.close()


def test_mounts_are_visible_and_read_only_when_asked(engine, image, tmp_path):
    ro, rw = tmp_path / "ro", tmp_path / "rw"
    ro.mkdir()
    rw.mkdir()
    (ro / "in.txt").write_text("hello from the host\n")
    script = "cat /m/ro/in.txt; echo made > /m/rw/out.txt; touch /m/ro/nope 2>/dev/null && echo ro-writable || echo ro-denied"
    out = engine.output(image, ["sh", "-c", script], mounts=[Mount(ro, "/m/ro", read_only=True), Mount(rw, "/m/rw")])
    assert out.splitlines() == ["hello from the host", "ro-denied"]
    assert (rw / "out.txt").read_text() == "made\n"
    assert not (ro / "nope").exists()


def test_memory_limit_kills_with_137_and_cpus_are_capped(engine, image):
    grab = ["python3", "-c", "b = bytearray(400 * 1024 * 1024); print(len(b))"]
    assert engine.run(image, grab, limits=Limits(memory="128m")).exit_code == 137
    assert engine.run(image, grab, limits=Limits(memory="1g")).exit_code == 0
    quota = engine.output(image, ["sh", "-c", "cat /sys/fs/cgroup/cpu.max 2>/dev/null || "
                                  "cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us"], limits=Limits(cpus=0.5))
    assert quota.split()[0] == "50000"


def test_a_build_container_is_limited_to_the_hosts_memory_less_a_reserve(monkeypatch):
    """Without a limit, a compile that outgrows the host pages it to a standstill; with one it is killed (137)."""
    from farm.errors import BadInput
    from farm.runners.engine import HOST_RESERVE_GB, default_limits

    monkeypatch.delenv("FARM_CONTAINER_MEMORY", raising=False)
    total_gb = next(int(ln.split()[1]) for ln in Path("/proc/meminfo").read_text().splitlines()
                    if ln.startswith("MemTotal:")) / (1024 * 1024)
    assert default_limits() == Limits(memory=f"{int(total_gb - HOST_RESERVE_GB)}g")
    assert "--memory-swap=" + default_limits().memory in default_limits().as_args()
    monkeypatch.setenv("FARM_CONTAINER_MEMORY", "12G")
    assert default_limits() == Limits(memory="12g")
    monkeypatch.setenv("FARM_CONTAINER_MEMORY", "0")
    assert default_limits() == Limits()
    monkeypatch.setenv("FARM_CONTAINER_MEMORY", "lots")
    with pytest.raises(BadInput, match="FARM_CONTAINER_MEMORY: 'lots'"):
        default_limits()


@pytest.mark.parametrize("memory,gb", [("21g", 21.0), ("512m", 0.5), ("262144k", 0.25), ("1073741824", 1.0),
                                       (None, None)])
def test_a_limit_reads_as_gb_for_memory_admission(memory, gb):
    assert Limits(memory=memory).memory_gb == gb


def test_timeout_kills_the_container_and_reports_124(engine, image):
    t0 = time.monotonic()
    res = engine.run(image, ["sleep", "120"], timeout=3)
    assert res.timed_out and res.exit_code == 124
    assert time.monotonic() - t0 < 60
    assert engine.inspect(res.container_id, kind="container") is None


def test_an_image_survives_save_and_load_with_its_id_and_tag(engine, tmp_path):
    """What CI's images job hands the row jobs (`podman save` -> artifact -> `podman load`), on a tiny image of
    this test's own (the builder image is shared with other builds here and is never removed)."""
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "farm-handoff").write_text(f"{os.getpid()}\n")
    tarball = tmp_path / "root.tar"
    subprocess.run(["tar", "-C", str(root), "-cf", str(tarball), "."], check=True)
    ref = f"localhost/farm-test-handoff:{os.getpid()}"
    image_id = engine.import_tarball(tarball, ref, host_arch())
    try:
        archive = tmp_path / "handoff.tar"
        engine.save(ref, archive)
        assert archive.stat().st_size > 0
        subprocess.run([engine.exe, "rmi", "-f", ref], capture_output=True, check=True)
        assert engine.image_id(ref) is None
        engine.load(archive)
        assert engine.image_id(ref) == image_id          # the same image, under the same tag
        engine.tag(ref, ref + "-again")
        assert engine.image_id(ref + "-again") == image_id
    finally:
        subprocess.run([engine.exe, "rmi", "-f", ref, ref + "-again"], capture_output=True)


# ---------------------------------------------------------------- orphans of a SIGKILLed build

def _ours(engine: Engine, tag: str) -> dict[str, str]:
    """Full id -> state of the containers this test made (labelled farm.test=<tag>), and no others."""
    p = subprocess.run([engine.exe, "ps", "-aq", "--filter", f"label=farm.test={tag}"], capture_output=True,
                       text=True, check=True)
    if not p.stdout.split():
        return {}
    # `ps` spells the state differently per engine and version; inspect's State.Status is `running` in both
    p = subprocess.run([engine.exe, "inspect", "--type", "container", "--format", "{{.Id}} {{.State.Status}}",
                        *p.stdout.split()], capture_output=True, text=True)
    return dict(line.split(" ", 1) for line in p.stdout.splitlines() if line.strip())


def _create_raw(engine: Engine, image: str, tag: str, *labels: str) -> str:
    """A container made with the engine's own CLI, not the farm's: only the labels given."""
    args = [a for label in (f"farm.test={tag}", *labels) for a in ("--label", label)]
    p = subprocess.run([engine.exe, "create", *args, image, "sleep", "600"], capture_output=True, text=True,
                       check=True)
    return p.stdout.strip().splitlines()[-1]


CONTAINER_CHILD = """
import sys
from farm.runners.engine import Engine
Engine(sys.argv[1]).run(sys.argv[2], ["sleep", "600"], labels={"farm.role": "build", "farm.test": sys.argv[3]})
"""


def test_a_sigkilled_owners_container_is_reaped_by_the_next_start_and_nothing_else(engine, image):
    """SIGKILL cannot be caught, so a killed build cannot remove its container: the next start removes the
    labelled containers whose owner process is gone, and leaves an unlabelled one, a live owner's, another
    host's. An owner label naming a live pid with another start time is a reused pid: gone too."""
    import signal
    import sys
    import uuid

    tag = f"orphans-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    child = subprocess.Popen([sys.executable, "-c", CONTAINER_CHILD, engine.exe, image, tag], cwd=PROJECT,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while "running" not in _ours(engine, tag).values() and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert list(_ours(engine, tag).values()) == ["running"], child.stderr.read() if child.poll() else ""
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
        (orphan,) = _ours(engine, tag)
        assert _ours(engine, tag)[orphan] == "running"   # the kill left it compiling on
        labels = engine.inspect(orphan, kind="container")["Config"]["Labels"]
        host, pid, start = labels["farm.owner"].rsplit(":", 2)
        assert (host, pid, labels["farm.role"]) == (socket.gethostname(), str(child.pid), "build") and start.isdigit()

        unlabelled = _create_raw(engine, image, tag)
        other_host = _create_raw(engine, image, tag, "farm.owner=build-host-2.example:1:1")
        reused_pid = _create_raw(engine, image, tag, f"farm.owner={socket.gethostname()}:{os.getpid()}:1")
        live = engine.create(image, ["sleep", "600"], labels={"farm.test": tag})   # owned by this test
        assert set(_ours(engine, tag)) == {orphan, unlabelled, other_host, reused_pid, live}

        # The next start of a container build (a fresh process: it reaps once per process).
        start = subprocess.run([sys.executable, "-c", "from farm.runners.container import ContainerRunner\n"
                                "try:\n    ContainerRunner(build_image=False)\nexcept Exception:\n    pass"],
                               cwd=PROJECT, capture_output=True, text=True, timeout=120)
        assert start.returncode == 0, start.stderr
        assert set(_ours(engine, tag)) == {unlabelled, other_host, live}
        assert f"removed container {orphan[:12]}" in start.stdout
    finally:
        if child.poll() is None:
            child.kill()
        for cid in _ours(engine, tag):
            engine.rm(cid)
