"""docs/adding-a-package.md's own-package commands, run as written (issue 37): the fenced block after the
`newcomer-commands` marker is read from the page and run line by line in bash, with the farm's demo packaged
as a real sdist on a simple index served on 127.0.0.1 (FARM_PYPI_URL) standing in for `my-ext`. So a changed
command, option or output the page relies on fails here instead of misleading the next newcomer."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from farmcli import PROJECT
from local_pypi import demo_sdist, simple_index
from replay_server import serve

PAGE = PROJECT / "docs" / "adding-a-package.md"
MARKER = "<!-- newcomer-commands:"
CELL = "farm_demo-cu130-torch2.13-py312"


def page_commands() -> list[str]:
    """The lines of the first ```sh block after the marker."""
    text = PAGE.read_text()
    assert MARKER in text, f"{PAGE.name} lost its {MARKER} block"
    block = re.search(r"```sh\n(.*?)```", text[text.index(MARKER):], re.S)
    assert block, "no ```sh block after the marker"
    return [line for line in block.group(1).splitlines() if line.strip()]


def as_here(line: str, recipes: Path) -> str:
    """The page's command for the demo: its sdist for my-ext's, a folder of this test for ~/my-recipes."""
    return (line.replace("~/my-recipes", str(recipes)).replace("my-ext==1.4.0", "farm-demo==0.1.0")
            .replace("my_ext", "farm_demo"))


def run_block(tmp_path: Path, url: str, *, build: bool) -> dict[str, subprocess.CompletedProcess]:
    """Run the page's lines in order (the `farm build` line only with `build`); every one must succeed."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "FARM_PYPI_URL": url, "FARM_WHEELHOUSE": str(tmp_path / "wheelhouse")}
    env.pop("FARM_RECIPES", None)
    done = {}
    for line in page_commands():
        command = as_here(line, tmp_path / "my-recipes")
        if command.startswith("farm build "):
            if not build:
                continue
            command += f" --out {tmp_path / 'out'}"   # the page's default is the project's build/: keep to ours
        res = subprocess.run(["bash", "-c", command], capture_output=True, text=True, env=env, cwd=tmp_path,
                             timeout=3600)
        assert res.returncode == 0, f"{command}\n{res.stdout[-2000:]}{res.stderr[-2000:]}"
        done[" ".join(line.split()[:3])] = res   # by the page's words: "farm recipes new", "farm plan --package"
    return done


@pytest.fixture
def local_pypi(tmp_path):
    root = tmp_path / "pypi"
    simple_index(root, demo_sdist(tmp_path / "dist"))
    with serve(root) as url:
        yield url.rstrip("/")


def test_the_page_block_names_the_commands_a_newcomer_needs():
    verbs = [" ".join(line.split()[:3]) for line in page_commands()]
    assert verbs == ["mkdir -p ~/my-recipes", "farm recipes new", "farm recipes check", "farm recipes scan",
                     "farm plan --package", "farm build my_ext-cu130-torch2.13-py312"]


def test_the_page_commands_up_to_the_build_run_and_agree_with_each_other(tmp_path, local_pypi):
    done = run_block(tmp_path, local_pypi, build=False)
    new = done["farm recipes new"].stdout
    build_line = as_here(page_commands()[-1], tmp_path / "my-recipes")
    assert f"build first: {build_line}" in new, new   # the cell the page builds is the one `new` names
    assert "farm recipes check: 1 valid" in new
    assert "1 recipes valid" in done["farm recipes check"].stdout
    assert "hazard scan (design.md section 4.7): 0 in 5 files" in done["farm recipes scan"].stdout
    assert done["farm plan --package"].stdout.split()[0] == CELL


@pytest.mark.slow
@pytest.mark.container
def test_the_page_commands_give_a_verified_wheel(tmp_path, local_pypi):
    run_block(tmp_path, local_pypi, build=True)
    wheels = list((tmp_path / "out" / "wheel").glob("farm_demo-0.1.0+cu130torch2.13-cp312-cp312-*.whl"))
    assert len(wheels) == 1, list((tmp_path / "out").rglob("*.whl"))
    record = json.loads((tmp_path / "out" / "build.json").read_text())
    assert record["cell"] == CELL and record["arch_list"] == "7.5 8.0 8.6 9.0+PTX 10.0 12.0+PTX"
    assert json.loads((tmp_path / "out" / "verify.json").read_text())["passed"] is True
    published = [json.loads(line)["file"] for line in (tmp_path / "wheelhouse" / "manifest.jsonl").open()]
    assert published == [wheels[0].name]
