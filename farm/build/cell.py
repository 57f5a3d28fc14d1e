"""`farm build <cell>`: one cell from source to a verified wheel (design.md §6), on the host side.

The host decides what and where: it plans the cell, keys it, fetches what
needs the network (source, torch and toolkit wheels), writes the step spec
with every path as the step will see it, then has the runner run the same
entrypoint (`python -m farm.build.steps`) for the phases. Runners differ only in
where the steps run; nothing here branches on what a step does inside.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from farm import progress, settings
from farm.build.buildkey import KeyMaker, context_for
from farm.build.record import RecordFacts
from farm.build.request import BuildRequest
from farm.build.spec import SCHEMA, FarmWheel, StepPaths, StepSpec, Target, recipe_part, source_part
from farm.build.state import StepState, need
from farm.errors import BuildFailed, BuildOOM, FarmError, NeedsFarmWheel, NotBuildableHere
from farm.floor import Floor, cell_floor
from farm.platforms import cell_arch, host_arch
from farm.recipes.buildrecord import BuildRecord
from farm.recipes.cells import Cell, smoke_cell
from farm.recipes.model import Recipe
from farm.recipes.plan import Plan, cell_plan
from farm.runners import images
from farm.runners.admission import admit_alone
from farm.runners.base import Runner
from farm.runners.emulation import is_emulated
from farm.runners.host import HostRunner

if TYPE_CHECKING:
    from farm.archlist import ArchList
    from farm.build.buildkey import BuildContext
    from farm.build.display import Outcome
    from farm.build.farmdeps import FarmWheel as FarmWheelDep


@dataclass
class BuildResult:
    cell_id: str
    status: str               # built | up-to-date | flags (no wheel: nvcc's targets recorded)
    wheel: Path | None
    record: BuildRecord | None    # None: up to date, nothing built
    record_path: Path | None


def refusal(cell: Cell, recipe: Recipe, runner_kind: str | None) -> tuple[str, str] | None:
    """Why `cell` cannot build here with `runner_kind`, known before any work: (the reason every such
    cell shares, for `farm run`'s summary; the one line `farm build` prints for this cell), or None."""
    from farm.build import windows

    line = windows.refusal(cell.id, cell.platform)
    if line:
        return "Windows cells on a non-Windows host", line
    if recipe.needs_patch:
        return ("needs_patch (no farm patch written yet)",
                f"{cell.id}: not buildable yet: recipe {recipe.name} needs a patch nobody has written "
                "(needs_patch: true)")
    if cell.platform == "linux_aarch64" and runner_kind == "host" and is_emulated(cell.platform):
        return ("aarch64 cells with --runner host on an x86_64 host",
                f"{cell.id}: an aarch64 cell on an x86_64 host needs the container runner "
                "(QEMU emulation), not --runner host")
    if runner_kind != "host":   # the lane's Pythons are known before its image is built (design.md §8.4)
        from farm.runners.cpython import why_no_python

        why = why_no_python(cell_arch(cell.platform), cell.python)
        if why:
            return why, f"{cell.id}: cannot build here: {why}"
    return None


def check_buildable_here(cell: Cell, recipe: Recipe, runner_kind: str | None) -> None:
    why = refusal(cell, recipe, runner_kind)
    if why:
        raise NotBuildableHere(why[1])


def build_cell(request: BuildRequest, log: Callable[[str], None] = print) -> BuildResult:
    """Build the requested cell (design.md §6): up to date when the wheelhouse has its key (unless forced),
    else its steps, its record and, for the full tier, its wheel published."""
    started = time.time()
    cell, plan = cell_plan(request.cell_id)
    recipe = plan.recipes[cell.recipe_name]
    check_buildable_here(cell, recipe, request.runner_kind)
    check_toolkit_here(cell, recipe, request.runner_kind, request.toolkit_source)   # before any download or image build
    house = request.wheelhouse
    keys = KeyMaker(plan.defaults, plan.recipes, wheelhouse=house)
    farm_wheels = keys.farm_wheels(cell)   # the journal read once: the key below sees the same wheels
    for wheel in farm_wheels:
        if wheel.entry is None:
            from farm.build.farmdeps import missing_line

            raise NeedsFarmWheel(missing_line(cell.id, wheel, house))
    if request.tier == "smoke":
        cell = smoke_cell(cell, request.arch)   # its own arch list, so its own build key
    if cell.platform == "windows":
        # ccache wraps nvcc through PYTORCH_NVCC, a route only Linux builds have exercised: off on Windows,
        # and the build record says so.
        request = dataclasses.replace(request, compiler_cache=False)
    runner, described, target, plat, context = _runner_for(cell, request.runner_kind, request.plat, recipe)
    request = dataclasses.replace(request, plat=plat)   # as the image can give it
    key = keys.key(cell, context)

    def up_to_date(why: str) -> BuildResult | None:
        """The published wheel of this very key, unless --force."""
        done = [e for e in entries if e.build_key == key]
        if not done or request.force:
            return None
        log(f"{cell.id}: up to date ({why}: {done[-1].file})")
        return BuildResult(cell.id, "up-to-date", house / "files" / done[-1].project / done[-1].file, None, None)

    entries = _cell_entries(house, cell.id)
    if result := up_to_date(f"build key {key[:12]} already in {house}"):
        return result
    with _cell_lock(cell.id, log) as waited:
        if waited:   # the other build may have published this very key meanwhile
            entries = _cell_entries(house, cell.id)
            if result := up_to_date("published by the build this one waited for"):
                return result
        build_number = 1 + max(int(e.build_tag or 0) for e in entries) if entries else None
        if request.max_jobs is None:   # nobody admitted this build: it admits itself, against what is free now
            max_jobs, max_jobs_reason = admit_alone(recipe.parallelism(plan.defaults)[0], recipe.peak_gb(plan.defaults),
                                                    request.mem_budget_gb, runner.memory_cap_gb())
            request = dataclasses.replace(request, max_jobs=max_jobs, max_jobs_reason=max_jobs_reason)
            if max_jobs_reason:
                log(f"{cell.id}: {max_jobs_reason}")
        job = BuildJob(request, cell, recipe, plan, runner, described, target, key, farm_wheels, build_number,
                       log=log, started=started)
        try:
            result = _build_locked(job)
        except BuildFailed as exc:
            if request.record:
                _record_for_recipe(job, "failed", reason=str(exc))
            raise
        if request.record:
            path = _record_for_recipe(job, request.tier, build=result.record)
            log(f"{cell.id}: {request.tier} build recorded in {settings.display(path)}")
        return result


def _record_for_recipe(job: BuildJob, tier: str, *, build: BuildRecord | None = None,
                       reason: str | None = None) -> Path:
    """The recipe's record of this build (recipes/records/, design.md §4.5), failed or not."""
    from farm.build.record import for_recipe
    from farm.recipes.status import save_build

    return save_build(job.recipe, for_recipe(job.recipe.name, job.cell, tier=tier, tier_asked=job.tier, out=job.out,
                                             key=job.key, runner=job.runner.kind, started=job.started, build=build,
                                             reason=reason))


def _runner_for(cell: Cell, runner_kind: str | None, plat: str | None,
                recipe: Recipe | None = None) -> tuple[Runner, dict[str, Any], Target, str | None, BuildContext]:
    """(runner, its description, the target, --plat as the image can give it, the build key's context)
    for the cell's lane, with the recipe's system packages provided; refused before any work when the
    image cannot give `plat` or is stale, or the host lacks a system package."""
    from farm.runners.choose import get_runner

    lane = cell_arch(cell.platform)
    if cell.platform == "windows":   # the builder images are Linux: a Windows cell runs on its Windows host
        if runner_kind == "container":
            raise NotBuildableHere(f"{cell.id}: a Windows cell builds with --runner host (MSVC and the installed "
                                   "CUDA toolkit of this host); the builder images are Linux")
        runner_kind = "host"
    runner = get_runner(runner_kind, arch=lane)
    if recipe is not None and cell.platform != "windows":   # Linux packages; the key holds them (§5.4)
        runner.provide_system_packages(recipe.system_packages, settings.display(recipe.path))
    described = runner.describe()   # names the package layer the steps run in, if any
    image = getattr(runner, "image", None)   # the container runner's builder image (or its package layer)
    # The builder's id: envs made in it serve its package layers too (same Python, design.md §8.5).
    target = Target(id=image.builder_id if image else "host", arch=lane,
                    glibc=image.glibc if image else described["glibc"], plat_floor=image.plat if image else None)
    if plat and image is not None:
        from farm.runners.images import check_plat

        plat = check_plat(image, plat)
    context = context_for(cell.platform, runner.kind, plat)
    if image is not None and image.key != context.image:
        raise FarmError(f"{cell.id}: the runner's image {image.ref} has key {image.key}, the build key expects "
                        f"{context.image}; rebuild the image (farm images build)")
    return runner, described, target, plat, context


def smoke_parallelism(jobs: int, nvcc_threads: int, arch_list: ArchList) -> tuple[int, int]:
    """(max_jobs, nvcc_threads) for a smoke build: nvcc's threads run one file's codegens side by side,
    one per virtual arch, and a smoke list has one; the threads it cannot use become jobs, so the build
    keeps the recipe's jobs x threads codegens at once, the memory its peak_gb_per_job was measured at.
    flash_attn's 1 job x 2 threads would otherwise compile its smoke on one core."""
    codegens = len({(t.major, t.minor, t.variant) for t in arch_list})
    usable = max(1, min(nvcc_threads, codegens))
    return jobs * nvcc_threads // usable, usable


def check_toolkit_here(cell: Cell, recipe: Recipe, runner_kind: str | None, toolkit_source: str | None) -> None:
    """A CUDA 12.x cell needs an installed toolkit of its line (PyPI carries nvcc from 13.0 on): in
    the builder image for the container runner, on this machine for the host runner. Refused in one
    line before anything is downloaded or built."""
    from farm.build.toolkit import find_system_toolkit
    from farm.runners.choose import default_kind
    from farm.versions import vtuple

    if cell.platform == "windows":   # always an installed toolkit (design.md §6.8)
        from farm.build.windows import find_cuda_toolkit
        from farm.errors import WindowsToolchainMissing

        try:
            find_cuda_toolkit(cell.cuda, components=recipe.cuda_components)
        except WindowsToolchainMissing as exc:
            raise NotBuildableHere(f"{cell.id}: {exc}") from None
        return
    major = vtuple(cell.cuda)[0]
    if major >= 13 or toolkit_source == "pypi":
        return
    if (runner_kind or default_kind()) == "container":
        image = images.load_image(cell_arch(cell.platform))
        if image is not None and image.cuda_home and image.cuda.startswith(cell.cuda):
            return
        where = f"the builder image ({image.ref if image else 'not built yet'}) carries none"
    else:
        found, passed = find_system_toolkit(cell.cuda, tuple(recipe.cuda_components))
        if found is not None:
            return
        where = f"none is installed here ({'; '.join(passed) or 'no /usr/local/cuda*, no FARM_CUDA_HOME'})"
    raise NotBuildableHere(f"{cell.id}: needs the CUDA {cell.cuda} toolkit: PyPI has no nvcc for CUDA {major}.x "
                           f"and {where}")


def _cell_entries(house: Path, cell_id: str) -> list[Any]:
    from farm.wheelhouse import read_journal

    if not (house / "manifest.jsonl").exists():
        return []
    return [e for e in read_journal(house).entries if e.cell == cell_id]


@contextmanager
def _cell_lock(cell_id: str, log: Callable[[str], None]) -> Iterator[bool]:
    """One build of a cell at a time on this host: its work dir is shared (cache_dir()/work/<cell>)."""
    from farm.filelock import lock

    folder = settings.work_dir(".locks")
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"{cell_id}.lock", "w") as fh:
        waited = not lock(fh.fileno(), blocking=False)
        if waited:
            log(f"{cell_id}: another build of this cell is running here; waiting for it")
            lock(fh.fileno())
        yield waited


@dataclass(frozen=True)
class BuildJob:
    """What `farm build` decided before taking the cell's lock: the locked build's steps read only this.
    `request` as decided: --plat as the image gives it, the jobs admitted, the cache off on Windows."""

    request: BuildRequest
    cell: Cell
    recipe: Recipe
    plan: Plan
    runner: Runner
    described: dict[str, Any]     # runner.describe(), asked once
    target: Target
    key: str
    farm_wheels: list[FarmWheelDep]   # each with its journal entry
    build_number: int | None      # one above the cell's last published build, None for its first
    log: Callable[[str], None]
    started: float

    @property
    def out(self) -> Path:
        return self.request.out

    @property
    def house(self) -> Path:
        return self.request.wheelhouse

    @property
    def tier(self) -> str:
        return self.request.tier

    @property
    def work(self) -> Path:
        return settings.work_dir(self.cell.id)

    @property
    def log_path(self) -> Path:
        return self.out / "build.log"

    @property
    def staged(self) -> Path:
        """Where the build_requires_farm wheels are staged (inside the work mount)."""
        return self.work / "farm-wheels"


@dataclass(frozen=True)
class _Setup:
    """What the phases of one locked build share once the folders, mounts and specs exist."""

    mounts: list[Any]
    host_spec: Path               # for the source phase, which always runs on the host
    inside_spec: str              # the runner's spec, as the step sees it
    write_specs: Callable[[Floor | None], Path]   # both again once the floor is known (the step's)
    toolkit_source: str
    facts: RecordFacts            # what the build's record tells of the host's decisions
    jobs: int
    recipe_jobs: int
    relay: progress.Relay         # the steps' progress events (and, for -v, the compile log) to the display


def _build_locked(job: BuildJob) -> BuildResult:
    setup = _set_up(job)
    with setup.relay:
        return _build_phases(job, setup)


def _build_phases(job: BuildJob, setup: _Setup) -> BuildResult:
    _run_phase(job, setup, "source", HostRunner(arch=host_arch()), str(setup.host_spec), network=True)
    with progress.step("downloads"):
        torch_wheel = _download_inputs(job.cell, job.recipe, job.target, setup.toolkit_source, job.log_path)
        _stage_farm_wheels(job.cell, job.farm_wheels, job.house, job.staged, job.log_path)
    # The floor is the torch wheel's tag, known now that it is downloaded (design.md §7.8).
    floor = None if job.cell.platform == "windows" or torch_wheel is None else \
        cell_floor(torch_wheel, job.cell.platform, job.plan.defaults.grid_policy.manylinux_floor)
    if floor is not None:
        _append(job.log_path, f"[host] manylinux floor {floor.text()}")
    facts = dataclasses.replace(setup.facts, floor=floor)
    setup.write_specs(floor)
    if job.recipe.pre_build:
        _run_phase(job, setup, "env,toolkit,prebuild", job.runner, setup.inside_spec, network=True)
    if job.tier == "flags":
        _run_phase(job, setup, "env,toolkit,compile", job.runner, setup.inside_spec, network=False)
        return _flags_result(job, facts)
    _run_phase(job, setup, "env,toolkit,compile,label,repair,verify", job.runner, setup.inside_spec, network=False)
    wheel, record = _built_record(job, setup, facts)
    record_path = record.write(job.out / "build.json")   # checked when made: its readers' schema (design.md §4.5)
    if job.request.publish:
        from farm.wheelhouse import publish as publish_wheels

        with progress.step("publish"):
            publish_wheels([wheel], job.house, record=record)
        job.log(f"{job.cell.id}: published {wheel.name} into {job.house}")
    return BuildResult(job.cell.id, "built", wheel, record, record_path)


def _set_up(job: BuildJob) -> _Setup:
    """Fresh out and work folders, the runner's mounts and the two step specs."""
    from farm.build.ccache import group_dir

    for folder in (job.out, job.work):
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
    runner, cell = job.runner, job.cell
    toolkit_source = job.request.toolkit_source
    if toolkit_source is None:
        # A container gets NVIDIA's PyPI toolkit mounted from the cache; the host runner uses an
        # installed toolkit on the line when there is one.
        toolkit_source = "pypi" if runner.kind == "container" else "auto"
    mounts = runner.standard_mounts(work=job.work, out=job.out)
    python, py_mounts = runner.python(cell.python)
    mounts += py_mounts
    recipe_jobs, nvcc_threads = job.recipe.parallelism(job.plan.defaults)
    jobs = job.request.max_jobs or recipe_jobs   # as memory admission allowed (design.md §11.2)
    if job.tier == "smoke":
        jobs, nvcc_threads = smoke_parallelism(jobs, nvcc_threads, cell.arch.arch_list)
    group_dir(cell.cuda, cell.torch, cell.links_torch).mkdir(parents=True, exist_ok=True)
    if job.request.compiler_cache and runner.kind == "host":
        from farm.build.ccache import ensure_ccache

        ensure_ccache(log=lambda m: _append(job.log_path, f"[host] {m}"))   # the image brings its own
    facts = RecordFacts(cell=cell, key=job.key, runner=runner.kind, image=job.target.id, tier=job.tier,
                        nvcc_threads=nvcc_threads, farm_wheels=tuple(w.record() for w in job.farm_wheels),
                        started=job.started)

    def spec_for(where_runner: str, seen: Callable[[Path], Path], floor: Floor | None) -> Path:
        spec = _step_spec(job, seen, python=python, toolkit_source=toolkit_source, jobs=jobs,
                          nvcc_threads=nvcc_threads, record=dataclasses.replace(facts, floor=floor).common(),
                          floor=floor)
        return spec.write(job.out / f"spec-{where_runner}.json")

    def write_specs(floor: Floor | None) -> Path:
        host_spec = spec_for("host", Path, floor)
        return host_spec if runner.kind == "host" else \
            spec_for(runner.kind, lambda p: Path(runner.inside(p, mounts)), floor)

    host_spec = job.out / "spec-host.json"
    step_spec = write_specs(None)
    relay = progress.Relay(job.out / progress.PROGRESS_FILE, logs={"compile": job.out / "compile.log"})
    return _Setup(mounts, host_spec, runner.inside(step_spec, mounts), write_specs, toolkit_source, facts,
                  jobs, recipe_jobs, relay)


def _step_spec(job: BuildJob, seen: Callable[[Path], Path], *, python: str, toolkit_source: str, jobs: int,
               nvcc_threads: int, record: dict[str, Any], floor: Floor | None) -> StepSpec:
    """The spec with every path of the out and work folders (and the caches) as `seen` maps it."""
    from farm.build.ccache import cache_env, group_dir
    from farm.build.stall import stall_limit
    from farm.build.verify.expectation import resolve_requires_dist

    cell, recipe = job.cell, job.recipe
    return StepSpec(
        schema=SCHEMA, cell=cell,
        recipe=recipe_part(recipe, requires_dist=resolve_requires_dist(recipe, cell, job.plan.recipes),
                           max_jobs=jobs, nvcc_threads=nvcc_threads),
        source=source_part(recipe), verify=recipe.verify,
        paths=StepPaths(out=seen(job.out), work=seen(job.work)),
        python=python, target=job.target, toolkit_source=toolkit_source, plat=job.request.plat,
        build_number=job.build_number, record=record,
        farm_wheels=tuple(FarmWheel(w.recipe, seen(job.staged / w.published.file), w.published.sha256) for w in job.farm_wheels),
        flags_stop_after_s=job.request.flags_stop_after_s,
        stall=stall_limit(recipe, cell.platform),   # a hung compile is killed, a slow one never (design.md §6.4)
        compiler_cache_env=cache_env(enabled=job.request.compiler_cache,
                                     ccache_dir=str(seen(group_dir(cell.cuda, cell.torch, cell.links_torch))),
                                     basedir=str(seen(job.work)), stats_log=str(seen(job.out / "ccache-stats.log"))),
        floor=floor)


def _run_phase(job: BuildJob, setup: _Setup, which: str, runner: Runner, spec: str, *, network: bool) -> None:
    code, _ = runner.run_step([which, "--spec", spec], env={}, mounts=setup.mounts, network=network,
                              log_path=job.log_path)
    setup.relay.poll()   # the phase's last events are shown before the host's next step starts
    if code != 0:
        kind = BuildOOM if code in (137, -9) else BuildFailed   # SIGKILL: what the OOM killer sends
        line = _failure_line(job.log_path, code)
        setup.relay.fail_open(line)
        raise kind(f"{job.cell.id}: {line} (log: {job.log_path})")


def _built_record(job: BuildJob, setup: _Setup, facts: RecordFacts) -> tuple[Path, BuildRecord]:
    """The verified wheel and the build record, from what the steps wrote to steps.json."""
    from farm.build.ccache import decision, group_name

    cell, runner = job.cell, job.runner
    state = StepState.read(job.out)
    wheel = Path(job.out / "wheel" / Path(need(state.verify, "verify").wheel).name)
    network = runner.network_isolation_when_off()
    return wheel, facts.built(
        state, wheel=wheel, build_number=job.build_number, described=job.described, network=network,
        log_path=job.log_path, jobs=setup.jobs, recipe_jobs=setup.recipe_jobs, max_jobs_reason=job.request.max_jobs_reason,
        cache_decision=decision(job.request.compiler_cache, group_name(cell.cuda, cell.torch, cell.links_torch)))


def _flags_result(job: BuildJob, facts: RecordFacts) -> BuildResult:
    """A flags run's outcome: no wheel, the nvcc targets seen against the cell's list."""
    from farm.build.compile import flags_summary

    record = facts.flags(StepState.read(job.out), job.out / "build.log")
    record_path = record.write(job.out / "build.json")
    job.log(f"{job.cell.id}: {flags_summary(record.flags or {})}")
    return BuildResult(job.cell.id, "flags", None, record, record_path)


def _download_inputs(cell: Cell, recipe: Recipe, target: Target, toolkit_source: str, log_path: Path) -> Path | None:
    """Host side: torch and its closure, build deps and toolkit wheels, for the target's Python and platform;
    the torch wheel's file (whose tag is the cell's floor, design.md §7.8)."""
    from farm.build.environments import EnvRequest, download_build_deps, download_environment
    from farm.build.provision import download_toolkit_wheels, installed_toolkit

    def note(message: str) -> None:
        _append(log_path, f"[host] {message}")

    req = EnvRequest(cell.python, cell.torch_pin, cell.cuda, cell.platform, target.glibc)
    torch_wheel = download_environment(req, log=note).file_for("torch")
    if recipe.build_deps:
        download_build_deps(req, recipe.build_deps, log=note)
    # A Windows cell compiles with the installed toolkit of its line, never NVIDIA's Linux wheels.
    if cell.platform != "windows" and toolkit_source in ("auto", "pypi") and \
            installed_toolkit(cell.cuda, target.arch, recipe.cuda_components, toolkit_source)[0] is None:
        download_toolkit_wheels(cell.cuda, target.arch, recipe.cuda_components, log=note)
    return torch_wheel


def _stage_farm_wheels(cell: Cell, farm_wheels: Iterable[FarmWheelDep], house: Path, folder: Path,
                       log_path: Path) -> None:
    """Host side: the build_requires_farm wheels into the cell's work dir, which every runner mounts, for the
    environment step's offline install. The bytes must be the ones the manifest (and so the key) names."""
    from farm.wheelhouse.maintain import file_sha256

    if not farm_wheels:
        return
    folder.mkdir(parents=True, exist_ok=True)
    for wheel in farm_wheels:
        source, target = wheel.path(house), folder / wheel.published.file
        try:
            os.link(source, target)   # wheelhouse files are never rewritten in place
        except OSError:
            try:
                shutil.copyfile(source, target)
            except OSError as exc:
                raise BuildFailed(f"{cell.id}: cannot stage {wheel.recipe}'s wheel {source}: {exc.strerror}") from None
        found = file_sha256(target)
        if found != wheel.sha256:
            raise BuildFailed(f"{cell.id}: {source} has sha256 {found[:12]}, the manifest says {wheel.published.sha256[:12]}: "
                              f"`farm index verify` the wheelhouse")
        _append(log_path, f"[host] staged {wheel.recipe}'s wheel {wheel.published.file} (sha256 {wheel.published.sha256[:12]})")


def _append(path: Path, line: str) -> None:
    with open(path, "a") as fh:
        fh.write(line.rstrip() + "\n")


def _failure_line(log_path: Path, code: int) -> str:
    """The step's own one-line error, else the exit code (137 = killed, e.g. out of memory)."""
    lines = log_path.read_text(errors="replace").splitlines() if log_path.exists() else []
    for line in reversed(lines):
        if line.startswith("farm.build.steps: ") or line.startswith("farm: "):
            return line.split(": ", 1)[1]
    if code in (137, -9):
        return f"killed (exit {code}: out of memory?)"
    return f"step exited {code}: {lines[-1] if lines else 'no output'}"


def outcome(cell_id: str, out: Path, result: BuildResult | None = None) -> Outcome:
    """What the summary at the end of `farm build` says, from the build folder: the wheel, the arch list
    asked for and what the gate found in the binary, the compiler cache, the logs (design.md §6.9)."""
    from farm.build.compile import flags_summary
    from farm.build.display import Outcome, fmt_s
    from farm.build.record import asked_arch_list
    from farm.recipes.buildoutput import arches_found, by_arch

    record = result.record if result is not None else None
    asked = (record.arch_list if record is not None else None) or asked_arch_list(out)
    logs = [out / "build.log", out / "compile.log"]
    if result is None:
        return Outcome(f"{cell_id}: failed", arch_list=asked, logs=logs)
    if result.status == "up-to-date" or record is None:
        return Outcome(f"{cell_id}: up to date", wheel=result.wheel)
    try:
        report = json.loads((out / "verify.json").read_text())
    except (OSError, ValueError):
        report = {}
    found = arches_found(report if isinstance(report, dict) else {})
    stats = record.cache_stats
    extra = [("record", str(result.record_path))] if result.record_path else []
    if record.flags:
        extra.insert(0, ("flags", flags_summary(record.flags)))
    return Outcome(f"{cell_id}: {result.status} in {fmt_s(record.seconds)}", wheel=result.wheel,
                   arch_list=asked, sass=by_arch(found["sass"]), ptx=by_arch(found["ptx"]),
                   cache={k: stats.get(k) for k in ("hits", "misses")} if stats else None, logs=logs, extra=extra)
