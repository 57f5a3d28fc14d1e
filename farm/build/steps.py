"""The one step entrypoint: `python -m farm.build.steps <phases> --spec SPEC.json` (design.md §6).

Both runners run this same module; they differ only in where (container or
host), mounts, limits and network. `farm build` (farm/build/cell.py) writes the
spec on the host, with every path as the step will see it, and calls:

1. `source` through the host runner (fetching needs the network the host has);
2. `env,toolkit,prebuild` with network, only when the recipe has a pre_build;
3. `env,toolkit,compile,label,repair,verify` with the network off.

env and toolkit are cache hits after their first build, so repeating them in
phase 3 costs a second or two and keeps each phase self-contained. Each phase
appends its outcome to `<out>/steps.json`; a failing step prints one line and
exits non-zero, and never leaves a wheel in `<out>/wheel/`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from farm import progress
from farm.build.spec import SourcePart, StepSpec
from farm.build.state import (
    CompileStep,
    EnvStep,
    LabelStep,
    PrebuildStep,
    RepairStep,
    StepResult,
    StepState,
    ToolkitStep,
    VerifyStep,
    need,
)
from farm.errors import CompileStalled, FarmError, StepFailed

if TYPE_CHECKING:   # imported where a step needs them: the source step runs without torch's tools
    from farm.build.environments import TorchEnv
    from farm.build.platform import BuildPlatform
    from farm.build.source.prepare import SourceResult
    from farm.build.toolkit import BuildToolkit
    from farm.build.verify.importcheck import ImportChild

PHASES = ("source", "env", "toolkit", "prebuild", "compile", "label", "repair", "verify")


class Steps:
    """The state one invocation carries from step to step."""

    def __init__(self, spec: StepSpec, log: Callable[[str], None], phases: list[str], platform: BuildPlatform | None = None):
        from farm.build.platform import for_cell

        self.spec = spec
        self.cell = spec.cell
        self.recipe = spec.recipe
        self.out = spec.paths.out
        self.work = spec.paths.work
        self.arch_list = spec.cell.arch.arch_list
        self.platform = platform or for_cell(spec.cell.platform)   # Linux, or Windows on a Windows host
        self.log = log
        self.state = StepState.read(self.out)
        self.torch_env: TorchEnv | None = None   # set by the env step
        self.toolkit: BuildToolkit | None = None   # set by the toolkit step
        self.compiler_cache: dict[str, Any] = {}
        self.nvcc_pid_namespace = False   # whether each nvcc call runs in a pid namespace of its own (§6.5)
        self.phases = phases              # what this process runs (the import child serves verify)
        self.import_child: ImportChild | None = None   # verify's child, started early (see _start_import_child)

    # ----- 1. source ------------------------------------------------------------

    def source(self) -> SourceResult:
        return fetch_source(self.spec.source, self.work / "src", where=self.recipe.where,
                            platform=self.cell.platform, cuda=self.cell.cuda)

    # ----- 2. environment ----------------------------------------------------------

    def env(self) -> EnvStep:
        from farm.build.environments import EnvRequest, base_environment, overlay_environment

        c = self.cell
        req = EnvRequest(c.python, c.torch_pin, c.cuda, c.platform, self.spec.target.glibc)
        base = base_environment(req, self.spec.python, target=self.spec.target.id, log=self.log)
        farm_wheels = [(w.file, w.sha256) for w in self.spec.farm_wheels]
        self.torch_env = overlay_environment(base, list(self.recipe.build_deps), req=req, farm_wheels=farm_wheels,
                                             log=self.log)
        return EnvStep.of(base, self.torch_env)

    # ----- 3. toolkit ------------------------------------------------------------

    def toolkit_step(self) -> ToolkitStep:
        tk = self.platform.toolkit(self.cell.cuda, arch=self.spec.target.arch, components=self.recipe.cuda_components,
                                   source=self.spec.toolkit_source, log=self.log)
        tk.require(self.arch_list, self.cell.id)
        self.toolkit = tk
        return ToolkitStep.of(tk)

    def _torch_env_built(self) -> TorchEnv:
        if self.torch_env is None:   # every phase that compiles, repairs or verifies starts with env
            raise StepFailed("the env step has not run in this phase")
        return self.torch_env

    def _toolkit_provisioned(self) -> BuildToolkit:
        if self.toolkit is None:   # every phase that compiles starts with toolkit
            raise StepFailed("the toolkit step has not run in this phase")
        return self.toolkit

    # ----- pre_build (network) --------------------------------------------------------

    def prebuild(self) -> PrebuildStep:
        script = self.recipe.pre_build
        if not script:
            return PrebuildStep(ran=False, exported={})
        env_file = self.out / "prebuild.env"
        env = {**self.compile_environment(exported={}), "FARM_ENV": str(env_file)}
        # bash from the compile PATH: on Windows a bare "bash" would be System32's WSL launcher, which
        # CreateProcess finds before PATH; Git for Windows' bash is the one meant.
        bash = shutil.which("bash", path=env.get("PATH"))
        if bash is None:
            raise StepFailed(f"pre_build needs bash, and the compile PATH has none: {env.get('PATH')}")
        from farm.build.compile import run_group

        log, limit = self.out / "prebuild.log", self.spec.stall
        with open(log, "a") as fh:   # hung, not slow, is killed: silent for the recipe's timeout (design.md §6.4)
            rc = run_group([bash, "-euo", "pipefail", "-c", script], self._source_dir(), env, fh,
                           stall=limit.seconds if limit else None)
        if rc == "stalled" and limit is not None:
            from farm.build.compilelog import last_lines
            from farm.build.stall import stalled_line

            raise StepFailed(stalled_line(limit, (last_lines(log, 1) or ["no output"])[0], what="output")
                             + f"; log {log}")
        if rc != 0:
            raise StepFailed(f"pre_build failed (exit {rc}); log {log}")
        return PrebuildStep(ran=True, exported=_read_exports(env_file))

    # ----- 4. compile ------------------------------------------------------------

    def _source_dir(self) -> Path:
        src = self.work / "src"
        return src / self.recipe.subdir if self.recipe.subdir else src

    def compile_environment(self, exported: Mapping[str, str]) -> dict[str, str]:
        """Every variable the compile gets (design.md §6.4), from the cell's platform, plus the compiler cache's."""
        from farm.build.ccache import resolve_in_step
        from farm.build.compile import nvcc_in_own_pid_namespace

        r, toolkit = self.recipe, self._toolkit_provisioned()
        env = self.platform.compile_environment(
            arch_list=self.arch_list, toolkit=toolkit, torch_env=self.torch_env, cuda=self.cell.cuda,
            max_jobs=r.max_jobs, nvcc_threads=r.nvcc_threads, nvcc_flags=r.nvcc_flags, recipe_env=r.env,
            exported=exported, source_date_epoch=self.source_date_epoch(), host_folders=self.host_folders())
        env.update(self.spec.compiler_cache_env)
        if self.cell.platform != "windows" and env.get("CPATH"):
            from farm.build.compile import linked_includes

            env["CPATH"] = os.pathsep.join(linked_includes(env["CPATH"].split(os.pathsep),
                                                           self.work / "nvidia-include"))
        torch_dir = self.torch_env.torch_package_dir() if self.torch_env is not None else None
        if self.cell.platform != "windows" and torch_dir is not None:
            from farm.build.compile import torch_at_one_path

            site = torch_at_one_path(torch_dir, self.work / "torch-site")
            env["PYTHONPATH"] = os.pathsep.join(p for p in (site, env.get("PYTHONPATH", "")) if p)
        self.compiler_cache = resolve_in_step(env, str(toolkit.nvcc), self.work)
        # §6.5: the same tmpxft names every build; a Linux build's (unshare is Linux's, and a Windows
        # compile must not get a PYTORCH_NVCC)
        self.nvcc_pid_namespace = self.cell.platform != "windows" and nvcc_in_own_pid_namespace(env, toolkit.nvcc)
        return env

    def source_date_epoch(self) -> int | None:
        """The source's SOURCE_DATE_EPOCH (design.md §6.5), as the source step recorded it."""
        return self.state.source_date_epoch

    def host_folders(self, *, home: bool = False) -> list[tuple[str, str]]:
        """The folders this step reads from with their symbolic names (farm.build.hostpaths), as the step
        sees them: the same names whichever runner it is. `home`: the home folder too (farm_build.json;
        a compiler flag never names `~`, which a shell would expand)."""
        from farm import settings
        from farm.build.hostpaths import home_folder, host_folders, python_include_dirs

        env = self.torch_env
        return host_folders(work=self.work, torch_env=env,
                            python_include=[d for e in ([env.path, env.base] if env else []) if e
                                            for d in python_include_dirs(e)],
                            toolkit_home=self.toolkit.home if self.toolkit else None, cache=settings.cache_dir(),
                            project=settings.PROJECT_ROOT, home=home_folder() if home else None)

    def compile(self) -> CompileStep:
        from farm.build.compile import (
            compile_wheel,
            flags_report,
            nvcc_objects,
            read_nvcc_calls,
            read_nvcc_cpu,
            record_nvcc_calls,
        )
        from farm.build.compilelog import CompileWatch
        from farm.build.verify.checks import forgiven_targets, missing_waiver

        self._start_import_child()
        exported = self.state.prebuild.exported if self.state.prebuild else {}
        env = self.compile_environment(exported)
        raw = self.out / "raw"
        shutil.rmtree(raw, ignore_errors=True)
        stop_after = self.spec.flags_stop_after_s   # the flags tier: record nvcc's calls, stop after a bounded time
        calls = record_nvcc_calls(env, self.out / "nvcc-calls", str(self._toolkit_provisioned().nvcc)) \
            if stop_after is not None else None
        limit = self.spec.stall   # hung, not slow, is killed: no progress for the recipe's timeout (§6.4)
        cpu_before = progress.children_cpu_s()
        with CompileWatch(self.out / "compile.log", env.get("CCACHE_STATSLOG"), calls) as watch:
            try:
                wheel = compile_wheel(self._source_dir(), self._torch_env_built().python, env, raw,
                                      self.out / "compile.log", stop_after=stop_after,
                                      stall=limit.seconds if limit else None)
            except CompileStalled:
                if limit is None:   # pragma: no cover - only a limit stalls a compile
                    raise
                from farm.build.stall import reached, stalled_line

                watch.poll()
                raise CompileStalled(stalled_line(limit, reached(watch.count))) from None
        flags = None
        if calls is not None:
            # ninja prints an object's line only once it finished: its total may never show before the stop
            argvs = read_nvcc_calls(calls)
            objects = nvcc_objects(self._source_dir(), argvs) or watch.count.total
            waiver = missing_waiver(self.spec.verify, self.cell.platform)
            flags = {**flags_report(argvs, self.arch_list, read_nvcc_cpu(calls), objects,
                                    forgiven=forgiven_targets(waiver.archs) if waiver else ()),
                     "stopped": wheel is None}
        cache = dict(self.compiler_cache)
        if cache.get("active") and env.get("CCACHE_STATSLOG"):
            from farm.build.ccache import read_stats_log

            cache["stats"] = read_stats_log(env["CCACHE_STATSLOG"])
        # The largest single process this step waited for so far (a cicc, usually): what one job peaks at.
        return CompileStep(wheel=str(wheel) if wheel else None, flags=flags,
                           env={k: env[k] for k in sorted(env) if not k.startswith("PIP_")},
                           compiler_cache=cache, nvcc_pid_namespace=self.nvcc_pid_namespace,
                           peak_process_mb=progress.peak_child_mb(), cpu_s=progress.cpu_spent_since(cpu_before))

    def failure_lines(self, phase: str) -> tuple[str, ...]:
        """What the summary shows under a failed step's error: the cause as its own tool printed it."""
        from farm.build.compilelog import last_lines
        from farm.recipes.buildoutput import first_error_lines

        if phase == "compile":
            return tuple(first_error_lines(self.out / "compile.log"))
        if phase == "prebuild":
            return tuple(last_lines(self.out / "prebuild.log"))
        return ()

    def _start_import_child(self) -> None:
        """The verify step's import check imports torch first: started now, that import runs beside the
        compile instead of after the repair (about 2.5 s of every cell). Costs one idle interpreter
        holding torch (~0.6 GB) while the compile runs. Not when verify would not use it."""
        from farm.build.verify.importcheck import ImportChild

        knobs = self.spec.verify
        if "verify" in self.phases and not knobs.skip_import and not knobs.needs_driver and self.torch_env:
            self.import_child = ImportChild.for_environment(self.torch_env.path, self.cell.links_torch)

    # ----- 5. label --------------------------------------------------------------

    def label(self) -> LabelStep:
        from farm.build.label import label_wheel
        from farm.build.record import in_wheel

        raw = Path(need(need(self.state.compile, "compile").wheel, "compile (to a wheel)"))
        info = in_wheel(self.spec.record, self.state, self.host_folders(home=True)).to_plain()
        requires = None if self.recipe.requires_dist is None else list(self.recipe.requires_dist)
        labelled = label_wheel(raw, self.out / "labelled", local_label=self.cell.local_label,
                               build_number=self.spec.build_number, requires_dist=requires, build_info=info,
                               where=self.recipe.where, source_date_epoch=self.source_date_epoch())
        return LabelStep(wheel=str(labelled))

    # ----- 6. repair -------------------------------------------------------------

    def repair(self) -> RepairStep:
        labelled = Path(need(self.state.label, "label").wheel)
        result = self.platform.repair(labelled, self.out / "repaired", torch_env=self.torch_env,
                                      plat=self.spec.plat, floor_plat=self.spec.target.plat_floor,
                                      allow_graft=self.recipe.allow_graft, wheel_abi=self.cell.wheel_abi,
                                      links_torch=self.cell.links_torch, source_date_epoch=self.source_date_epoch())
        return RepairStep.of(result)

    # ----- 7. verify -------------------------------------------------------------

    def verify(self) -> VerifyStep:
        from farm.build.verify.expectation import Expectation
        from farm.build.verify.gate import verify_wheel

        repair = need(self.state.repair, "repair")
        repaired = Path(repair.wheel)
        floor = self.spec.floor
        if floor is None and self.cell.platform != "windows":   # the host writes it once torch is downloaded
            raise StepFailed("the spec names no manylinux floor for this Linux cell (design.md §7.8)")
        exp = Expectation.for_cell(self.cell, knobs=self.spec.verify, requires_dist=self.recipe.requires_dist,
                                   version=self.recipe.version, platform_tag=repair.plat_tag,
                                   floor=floor.tag if floor else None)
        child, self.import_child = self.import_child, None
        report = verify_wheel(repaired, exp, torch_env=self._torch_env_built().path, import_child=child)
        report.write(self.out / "verify.json")
        if not report.passed:
            failed = [f"{c.name}: {c.message}" for c in report.checks if c.status == "fail"]
            raise StepFailed(f"verify failed: {'; '.join(failed)}")
        final = self.out / "wheel"
        final.mkdir(exist_ok=True)
        target = final / repaired.name
        shutil.copy2(repaired, target.with_suffix(".partial"))
        os.replace(target.with_suffix(".partial"), target)
        return VerifyStep(wheel=str(target), report=str(self.out / "verify.json"),
                          warnings=tuple(f"{c.name}: {c.message}" for c in report.checks if c.status == "warn"))


def fetch_source(part: SourcePart, dest: Path, *, where: str, platform: str, cuda: str) -> SourceResult:
    """The source step: the recipe's source, extra sources and the patches for (platform, cuda) into `dest`."""
    from farm.build.source.prepare import prepare_source

    return prepare_source(part.source, dest, platform=platform, cuda=cuda, submodules=part.submodules,
                          extra_sources=part.extra_sources, patches=part.patches, where=where)


def _read_exports(env_file: Path) -> dict[str, str]:
    exported = {}
    if env_file.is_file():
        for line in env_file.read_text().splitlines():
            if "=" in line and not line.startswith("#"):
                key, _, value = line.partition("=")
                exported[key.strip()] = value
    return exported


def run(phases: list[str], spec_path: Path, platform: BuildPlatform | None = None) -> int:
    """Run `phases` of the spec in order; platform: the cell's by default (a test may hand in the Windows
    one with recorded tool output)."""
    try:
        spec = StepSpec.read(spec_path)
    except FarmError as exc:   # BadSpec: another farm version wrote it
        print(f"farm.build.steps: {exc}", file=sys.stderr, flush=True)
        return exc.exit_code or 2
    out = spec.paths.out
    out.mkdir(parents=True, exist_ok=True)

    def log(message: str) -> None:
        print(f"[farm.build.steps] {message}", flush=True)

    steps = Steps(spec, log, phases, platform)
    methods: dict[str, Callable[[], StepResult]] = {
        "source": steps.source, "env": steps.env, "toolkit": steps.toolkit_step, "prebuild": steps.prebuild,
        "compile": steps.compile, "label": steps.label, "repair": steps.repair, "verify": steps.verify}
    before = progress.send_to(progress.FileSink(out / progress.PROGRESS_FILE))   # what `farm build` shows (§6.9)
    try:
        for phase in phases:
            log(f"{phase}: start")
            progress.emit(progress.Event(phase, "start"))
            t0 = time.monotonic()
            try:
                result = methods[phase]()
            except FarmError as exc:
                steps.state = steps.state.failing(phase, str(exc))
                steps.state.write(out)
                progress.emit(progress.Event(phase, "fail", seconds=round(time.monotonic() - t0, 2), error=str(exc),
                                             lines=steps.failure_lines(phase), peak_mb=progress.peak_child_mb()))
                print(f"farm.build.steps: {phase}: {exc}", file=sys.stderr, flush=True)
                return exc.exit_code or 1
            took = round(time.monotonic() - t0, 2)
            # env and toolkit run once per phase (design.md §6): the record adds their runs up
            steps.state = steps.state.ran(phase, result, took)
            steps.state.write(out)
            progress.emit(progress.Event(phase, "end", seconds=took, peak_mb=progress.peak_child_mb()))
            log(f"{phase}: done in {took}s")
    finally:
        progress.send_to(before)   # a test runs the steps in its own process
        if steps.import_child is not None:   # a step failed before verify used it
            steps.import_child.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m farm.build.steps", description=__doc__.splitlines()[0])
    parser.add_argument("phases", help=f"comma-separated, in order, from: {', '.join(PHASES)}")
    parser.add_argument("--spec", required=True, type=Path)
    args = parser.parse_args(argv)
    phases = [p for p in args.phases.split(",") if p]
    unknown = [p for p in phases if p not in PHASES]
    if unknown:
        print(f"farm.build.steps: unknown phase(s) {', '.join(unknown)} (known: {', '.join(PHASES)})", file=sys.stderr)
        return 2
    return run(phases, args.spec)


if __name__ == "__main__":
    sys.exit(main())
