"""`farm build <cell>`: one cell from source to a verified wheel (SPEC 8), on the host side.

The host decides what and where: it plans the cell, keys it, fetches what
needs the network (source, torch and toolkit wheels), writes the step spec
with every path as the step will see it, then has the runner run the same
entrypoint (`python -m farm.build.steps`) for the phases. Runners differ only in
where the steps run; nothing here branches on what a step does inside.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from farm import __version__, paths
from farm.errors import BadInput, FarmError
from farm.recipes.buildkey import KeyMaker, context_for
from farm.recipes.model import Recipe
from farm.recipes.plan import cell_plan
from farm.runners import images
from farm.runners.emulation import is_emulated
from farm.yamlio import load_yaml, write_atomic


class NotBuildableHere(FarmError):
    """A cell this host cannot build (Windows on Linux, needs_patch, no toolkit for the line)."""

    exit_code = 2


class BuildFailed(FarmError):
    exit_code = 1


class NeedsFarmWheel(NotBuildableHere):
    """A build_requires_farm dependency has no wheel for the cell's coordinates in the wheelhouse."""


class BuildOOM(BuildFailed):
    """A step was killed with exit 137 (out of memory): `farm run` retries it with max_jobs halved (SPEC 8.4)."""

    exit_code = 137


@dataclass
class BuildResult:
    cell_id: str
    status: str               # built | up-to-date | flags (no wheel: nvcc's targets recorded)
    wheel: Path | None
    record: dict
    record_path: Path | None


def refusal(cell, recipe: Recipe, runner_kind: str | None) -> tuple[str, str] | None:
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
    return None


def check_buildable_here(cell, recipe: Recipe, runner_kind: str | None) -> None:
    why = refusal(cell, recipe, runner_kind)
    if why:
        raise NotBuildableHere(why[1])


def _recipe_spec(recipe: Recipe) -> dict:
    """What the steps need of the recipe, as plain JSON (steps may run in a container)."""
    raw = load_yaml(recipe.path) or {}
    return {
        "name": recipe.name, "version": recipe.version, "where": paths.display(recipe.path),
        "source": raw.get("source"), "submodules": recipe.submodules,
        "extra_sources": raw.get("extra_sources") or [], "patches": raw.get("patches") or [],
        "patches_dir": str(Path(recipe.path).parent / "patches" / recipe.name),
        "base_dir": str(Path(recipe.path).parent), "subdir": recipe.subdir,
        "build_deps": list(recipe.build_deps), "cuda_components": list(recipe.cuda_components),
        "env": dict(recipe.env), "pre_build": recipe.pre_build, "nvcc_flags": recipe.nvcc_flags or "",
        "verify": raw.get("verify") or {}, "allow_graft": list(recipe.allow_graft),
    }


def build_cell(cell_id: str, *, runner_kind: str | None = None, out: Path | None = None, force: bool = False,
               publish: bool = True, wheelhouse: Path | None = None, plat: str | None = None,
               log=print, max_jobs: int | None = None, max_jobs_reason: str | None = None,
               compiler_cache: bool = True, tier: str = "full", arch: str | None = None,
               flags_minutes: float | None = None, record: bool | None = None) -> BuildResult:
    """max_jobs: a clamp decided by the caller (memory admission, SPEC 8.4; recorded with its reason,
    never keyed); compiler_cache: ccache for the (CUDA, torch) group (farm/build/ccache.py; recorded).

    tier (see TIERS): `smoke` builds one token of the list (`arch`, default the lowest) and is never
    published; `flags` records nvcc's targets for `flags_minutes` and builds no wheel. record: write
    the recipe's build record (recipes/records/<name>.json) at the end, failed or not; None: when
    FARM_RECORD=1."""
    from farm.runners.base import get_runner

    if tier not in TIERS:
        raise BadInput("farm build", "tier", tier, f"expected one of {', '.join(TIERS)}")
    if record is None:
        record = os.environ.get("FARM_RECORD") == "1"
    started = time.time()
    cell, plan = cell_plan(cell_id)
    recipe = plan.recipes[cell.recipe_name]
    check_buildable_here(cell, recipe, runner_kind)
    check_toolkit_here(cell, recipe, runner_kind)   # before any download or image build
    house = Path(wheelhouse or paths.wheelhouse_dir())
    keys = KeyMaker(plan.defaults, plan.recipes, wheelhouse=house)
    farm_wheels = keys.farm_wheels(cell)   # the journal read once: the key below sees the same wheels
    for wheel in farm_wheels:
        if wheel.entry is None:
            from farm.build.farmdeps import missing_line

            raise NeedsFarmWheel(missing_line(cell.id, wheel, house))
    if tier == "smoke":
        cell = smoke_cell(cell, arch)   # its own arch list, so its own build key
    elif arch:
        raise BadInput("farm build", "--arch", arch, "only a --smoke build takes one token of the list")
    if tier != "full":
        publish = False
    if tier == "flags":
        compiler_cache = False   # a cache hit would skip the very nvcc call the flags tier records
    lane = "aarch64" if cell.platform == "linux_aarch64" else "x86_64"
    runner = get_runner(runner_kind, arch=lane)
    described = runner.describe()
    image = getattr(runner, "image", None)
    target = {"id": image.id if image else "host", "arch": lane,
              "glibc": image.glibc if image else described["glibc"],
              "plat_floor": image.plat if image else None}
    if plat and image is not None:
        from farm.runners.images import check_plat

        plat = check_plat(image, plat)   # refused before any work when the image cannot honestly give it
    context = context_for(cell.platform, runner.kind, plat)
    if image is not None and image.key != context.image:
        raise FarmError(f"{cell.id}: the runner's image {image.ref} has key {image.key}, the build key expects "
                        f"{context.image}; rebuild the image (farm images build)")
    key = keys.key(cell, context)

    def up_to_date(why: str) -> BuildResult | None:
        """The published wheel of this very key, unless --force."""
        done = [e for e in entries if e.build_key == key]
        if not done or force:
            return None
        log(f"{cell.id}: up to date ({why}: {done[-1].file})")
        return BuildResult(cell.id, "up-to-date", house / "files" / done[-1].project / done[-1].file, {}, None)

    entries = _cell_entries(house, cell.id)
    if result := up_to_date(f"build key {key[:12]} already in {house}"):
        return result
    with _cell_lock(cell.id, log) as waited:
        if waited:   # the other build may have published this very key meanwhile
            entries = _cell_entries(house, cell.id)
            if result := up_to_date("published by the build this one waited for"):
                return result
        out = Path(out or paths.PROJECT_ROOT / "build" / cell.id).resolve()   # steps run in the work dir
        try:
            result = _build_locked(cell, recipe, plan, runner, described, image, target, key, house, entries,
                                   farm_wheels, out=out, publish=publish, plat=plat, log=log, started=started,
                                   max_jobs=max_jobs, max_jobs_reason=max_jobs_reason,
                                   compiler_cache=compiler_cache, tier=tier, flags_minutes=flags_minutes)
        except BuildFailed as exc:
            if record:
                from farm.recipes.status import write_build_record

                write_build_record(recipe, cell, tier="failed", tier_asked=tier, out=out, key=key,
                                   runner=runner.kind, started=started, reason=str(exc))
            raise
        if record:
            from farm.recipes.status import write_build_record

            path = write_build_record(recipe, cell, tier=tier, tier_asked=tier, out=out, key=key,
                                      runner=runner.kind, started=started, build=result.record)
            log(f"{cell.id}: {tier} build recorded in {paths.display(path)}")
        return result


TIERS = ("full", "smoke", "flags")
DEFAULT_FLAGS_MINUTES = 10.0


def smoke_cell(cell, choice: str | None):
    """The cell with one token of its list: `choice` (e.g. `8.6` or `12.0+PTX`), else the lowest. The
    token keeps its own PTX, so `12.0+PTX` is smoke-built as SASS and PTX of 12.0."""
    from dataclasses import replace

    from farm.arch.archlist import ArchList, parse_token

    full = cell.arch.arch_list
    token = full.lowest()
    if choice:
        want = parse_token(choice.strip(), "farm build", "--arch")
        found = [t for t in full if (t.major, t.minor, t.variant) == (want.major, want.minor, want.variant)]
        if not found:
            raise BadInput("farm build", "--arch", choice, f"not a token of {cell.id}'s list {full.torch()}")
        token = found[0]
    return replace(cell, arch=replace(cell.arch, arch_list=ArchList.of([token]),
                                      provenance=f"smoke: {token} of {full.torch()} ({cell.arch.provenance})"))


def check_toolkit_here(cell, recipe: Recipe, runner_kind: str | None) -> None:
    """A CUDA 12.x cell needs an installed toolkit of its line (PyPI carries nvcc from 13.0 on): in
    the builder image for the container runner, on this machine for the host runner. Refused in one
    line before anything is downloaded or built."""
    from farm.build.toolkit import find_system_toolkit
    from farm.runners.base import default_kind
    from farm.versions import vtuple

    major = vtuple(cell.cuda)[0]
    if major >= 13 or os.environ.get("FARM_TOOLKIT_SOURCE") == "pypi":
        return
    if (runner_kind or default_kind()) == "container":
        image = images.load_image("aarch64" if cell.platform == "linux_aarch64" else "x86_64")
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


def _cell_entries(house: Path, cell_id: str) -> list:
    from farm.wheelhouse import read_journal

    if not (house / "manifest.jsonl").exists():
        return []
    return [e for e in read_journal(house).entries if e.cell == cell_id]


@contextmanager
def _cell_lock(cell_id: str, log):
    """One build of a cell at a time on this host: its work dir is shared (cache_dir()/work/<cell>)."""
    import fcntl

    folder = paths.cache_dir() / "work" / ".locks"
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"{cell_id}.lock", "w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            waited = False
        except BlockingIOError:
            log(f"{cell_id}: another build of this cell is running here; waiting for it")
            fcntl.flock(fh, fcntl.LOCK_EX)
            waited = True
        yield waited


def _build_locked(cell, recipe, plan, runner, described, image, target, key, house, entries, farm_wheels, *, out,
                  publish, plat, log, started, max_jobs, max_jobs_reason, compiler_cache, tier,
                  flags_minutes) -> BuildResult:
    from farm.build.ccache import cache_env, decision, group_dir, group_name

    if tier == "flags" and flags_minutes is None:
        flags_minutes = DEFAULT_FLAGS_MINUTES
    build_number = None
    if entries:
        build_number = 1 + max(int(e.build_tag or 0) for e in entries)

    work = paths.cache_dir() / "work" / cell.id
    for folder in (out, work):
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
    log_path = out / "build.log"

    toolkit_source = os.environ.get("FARM_TOOLKIT_SOURCE")
    if toolkit_source is None:
        # A container gets NVIDIA's PyPI toolkit mounted from the cache; the host runner uses an
        # installed toolkit on the line when there is one.
        toolkit_source = "pypi" if runner.kind == "container" else "auto"
    mounts = runner.standard_mounts(work=work, out=out)
    python, py_mounts = runner.python(cell.python)
    mounts += py_mounts
    recipe_jobs, nvcc_threads = recipe.parallelism(plan.defaults)
    jobs = max_jobs or recipe_jobs   # a clamp decided by the farm run (memory admission, SPEC 8.4)
    cache_dir_host = group_dir(cell.cuda, cell.torch, cell.links_torch)
    cache_dir_host.mkdir(parents=True, exist_ok=True)
    if compiler_cache and runner.kind == "host":
        from farm.build.ccache import ensure_ccache

        ensure_ccache(log=lambda m: _append(log_path, f"[host] {m}"))   # the image brings its own
    record_base = {"cell": cell.id, "build_key": key, "arch_list": cell.arch.arch_list.torch(),
                   "arch_provenance": cell.arch.provenance, "torch": cell.torch_pin, "cuda": cell.cuda,
                   "runner": runner.kind, "image": target["id"], "farm_version": __version__, "tier": tier}
    if farm_wheels:   # keyed by their sha256; recorded so a dependent's wheel says what it was built against
        record_base["build_requires_farm"] = [w.record() for w in farm_wheels]
    staged = work / "farm-wheels"

    def spec_for(where_runner, paths_fn) -> Path:
        spec = {
            "cell": {"id": cell.id, "recipe_name": cell.recipe_name, "cuda": cell.cuda, "torch": cell.torch,
                     "torch_pin": cell.torch_pin, "python": cell.python, "platform": cell.platform,
                     "links_torch": cell.links_torch, "wheel_abi": cell.wheel_abi,
                     "arch_list": cell.arch.arch_list.torch(), "provenance": cell.arch.provenance,
                     "local_label": cell.local_label},
            "recipe": {**_recipe_spec(recipe), "requires_dist": requires, "max_jobs": jobs,
                       "nvcc_threads": nvcc_threads},
            "paths": {"out": paths_fn(out), "work": paths_fn(work)},
            "python": python, "target": target, "toolkit_source": toolkit_source, "plat": plat,
            "build_number": build_number, "record": record_base,
            "farm_wheels": [{"recipe": w.recipe, "file": paths_fn(staged / w.entry.file), "sha256": w.sha256}
                            for w in farm_wheels],
            "flags": {"stop_after_s": 60.0 * flags_minutes} if tier == "flags" else None,
            "compiler_cache_env": cache_env(enabled=compiler_cache, ccache_dir=paths_fn(cache_dir_host),
                                            basedir=paths_fn(work), stats_log=paths_fn(out / "ccache-stats.log")),
        }
        path = out / f"spec-{where_runner}.json"
        write_atomic(path, json.dumps(spec, indent=2, sort_keys=True))
        return path

    from farm.build.verify.expectation import resolve_requires_dist
    from farm.runners.host import HostRunner

    requires = resolve_requires_dist(recipe, cell, plan.recipes)
    requires = None if requires is None else list(requires)
    host_spec = spec_for("host", str)
    step_spec = host_spec if runner.kind == "host" else spec_for(runner.kind, lambda p: runner.inside(p, mounts))
    inside_spec = runner.inside(step_spec, mounts)

    step_timeout = recipe_timeout(recipe)
    if tier == "flags" and step_timeout is not None:   # the stop is the compile's own; the step ends after it
        step_timeout = max(step_timeout, 60.0 * flags_minutes + 600)

    def phase(which: str, on_runner, spec: str, network: bool) -> None:
        code, _ = on_runner.run_step([which, "--spec", spec], env={}, mounts=mounts, network=network,
                                     log_path=log_path, timeout=step_timeout)
        if code != 0:
            kind = BuildOOM if code in (137, -9) else BuildFailed   # SIGKILL: what the OOM killer sends
            raise kind(f"{cell.id}: {_failure_line(log_path, code)} (log: {log_path})")

    phase("source", HostRunner(arch=images.host_arch()), str(host_spec), True)
    _download_inputs(cell, recipe, target, toolkit_source, log_path)
    _stage_farm_wheels(cell, farm_wheels, house, staged, log_path)
    if recipe.pre_build:
        phase("env,toolkit,prebuild", runner, inside_spec, True)
    if tier == "flags":
        phase("env,toolkit,compile", runner, inside_spec, False)
        return _flags_result(cell, out, record_base, started, log)
    phase("env,toolkit,compile,label,repair,verify", runner, inside_spec, False)

    state = json.loads((out / "steps.json").read_text())
    wheel = Path(out / "wheel" / Path(state["verify"]["wheel"]).name)
    record = {
        **record_base, "wheel": wheel.name, "build_number": build_number,
        "torch_measured_arch_list": state["env"].get("torch_arch_list"),
        "toolkit": {k: state["toolkit"].get(k) for k in ("version", "source", "home", "arch")},
        "image_tag": state["repair"].get("plat_tag"), "runner_info": described,
        "network": runner.network_isolation_when_off(), "steps": state.get("timings", {}),
        "source": state.get("source"), "grafted": state["repair"].get("grafted"),
        "verify_warnings": state["verify"].get("warnings"), "log": str(log_path),
        "dev_only": runner.network_isolation_when_off() == "open",
        "seconds": round(time.time() - started, 1),
        "max_jobs": jobs, "max_jobs_recipe": recipe_jobs, "max_jobs_clamp": max_jobs_reason if max_jobs else None,
        "compiler_cache": {**decision(compiler_cache, group_name(cell.cuda, cell.torch, cell.links_torch)),
                           **(state["compile"].get("compiler_cache") or {})},
        "peak_process_mb": state["compile"].get("peak_process_mb"),
    }
    record_path = out / "build.json"
    write_atomic(record_path, json.dumps(record, indent=2, sort_keys=True) + "\n")
    if publish:
        from farm.wheelhouse import publish as publish_wheels

        publish_wheels([wheel], house, record=record)
        log(f"{cell.id}: published {wheel.name} into {house}")
    return BuildResult(cell.id, "built", wheel, record, record_path)


def _flags_result(cell, out: Path, record_base: dict, started: float, log) -> BuildResult:
    """A flags run's outcome: no wheel, the nvcc targets seen against the cell's list."""
    from farm.build.compile import flags_summary

    state = json.loads((out / "steps.json").read_text())
    flags = state["compile"]["flags"]
    record = {**record_base, "wheel": None, "flags": flags, "steps": state.get("timings", {}),
              "source": state.get("source"), "seconds": round(time.time() - started, 1),
              "peak_process_mb": state["compile"].get("peak_process_mb"), "log": str(out / "build.log")}
    record_path = out / "build.json"
    write_atomic(record_path, json.dumps(record, indent=2, sort_keys=True) + "\n")
    log(f"{cell.id}: {flags_summary(flags)}")
    return BuildResult(cell.id, "flags", None, record, record_path)


def _download_inputs(cell, recipe: Recipe, target: dict, toolkit_source: str, log_path: Path) -> None:
    """Host side: torch and its closure, build deps and toolkit wheels, for the target's Python and platform."""
    from farm.build.environments import EnvRequest, download_build_deps, download_environment
    from farm.build.provision import download_toolkit_wheels, installed_toolkit

    def note(message: str) -> None:
        _append(log_path, f"[host] {message}")

    req = EnvRequest(cell.python, cell.torch_pin, cell.cuda, cell.platform, target["glibc"])
    download_environment(req, log=note)
    if recipe.build_deps:
        download_build_deps(req, recipe.build_deps, log=note)
    if toolkit_source in ("auto", "pypi") and \
            installed_toolkit(cell.cuda, target["arch"], recipe.cuda_components, toolkit_source)[0] is None:
        download_toolkit_wheels(cell.cuda, target["arch"], recipe.cuda_components, log=note)


def _stage_farm_wheels(cell, farm_wheels, house: Path, folder: Path, log_path: Path) -> None:
    """Host side: the build_requires_farm wheels into the cell's work dir, which every runner mounts, for the
    environment step's offline install. The bytes must be the ones the manifest (and so the key) names."""
    from farm.wheelhouse.maintain import file_sha256

    if not farm_wheels:
        return
    folder.mkdir(parents=True, exist_ok=True)
    for wheel in farm_wheels:
        source, target = wheel.path(house), folder / wheel.entry.file
        try:
            os.link(source, target)   # wheelhouse files are never rewritten in place
        except OSError:
            try:
                shutil.copyfile(source, target)
            except OSError as exc:
                raise BuildFailed(f"{cell.id}: cannot stage {wheel.recipe}'s wheel {source}: {exc.strerror}") from None
        found = file_sha256(target)
        if found != wheel.sha256:
            raise BuildFailed(f"{cell.id}: {source} has sha256 {found[:12]}, the manifest says {wheel.sha256[:12]}: "
                              f"`farm index verify` the wheelhouse")
        _append(log_path, f"[host] staged {wheel.recipe}'s wheel {wheel.entry.file} (sha256 {wheel.sha256[:12]})")


def recipe_timeout(recipe: Recipe) -> float | None:
    """Seconds a step may take: the recipe's `timeout` is in minutes."""
    minutes = getattr(recipe, "timeout", None)
    return minutes * 60.0 if minutes else None


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
