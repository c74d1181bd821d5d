"""The reader's ways in: JupyterLab from the project's environment, Colab, Binder, the
published book, and `pip install` beside the reader's own PyTorch.

- JupyterLab: the documented command (`make lab`) starts a server whose file browser
  lists the chapters and the workbook and whose kernel imports the course package.
  Started headless on localhost with a random token, checked through its REST and kernel
  protocols, then stopped.
- Colab: a chapter copied into an empty directory outside the repository runs in a fresh
  virtual environment that lacks `attention` but sees a PyTorch (this environment's, and
  the newer one of the second-PyTorch environment): its first cell installs the package
  (here from a copy of this checkout, through ATTENTION_COURSE_SOURCE), the PyTorch it
  started with is still the one imported afterwards (same version, same file), and every
  output matches the stored one under nbval.
- pip beside a newer PyTorch: in the second-PyTorch environment
  (scripts/torch_next_env.sh, made by `make test`), `pip install --dry-run` of the
  package would not install torch.
- The one repository URL (`repository.url` in _config.yml) is the one the install cell
  names; the GitHub Pages workflow builds with the README's command; Binder installs
  this package with the locked versions.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
LOCK = ROOT / "requirements" / "ci-lock.txt"
LOCK_NEXT = ROOT / "requirements" / "ci-lock-torch-next.txt"


def _locked(path: Path) -> dict[str, str]:
    """name -> exact version, from a lock file of `name==version` lines."""
    pins = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version, f"{path.name}: not an exact pin: {line!r}"
            pins[name.strip().lower().replace("_", "-")] = version.strip()
    return pins


def _torch_next_python() -> Path:
    """The second-PyTorch environment's python; skipped (failed under `make test`) if
    absent."""
    venv = ROOT / os.environ.get("COURSE_TORCH_NEXT_VENV", ".venv/torch-next")
    python = venv / "bin" / "python"
    if not python.exists():
        reason = (
            f"no second-PyTorch environment at {venv}: `make test` makes it "
            "(scripts/torch_next_env.sh)"
        )
        if os.environ.get("COURSE_REQUIRE_TORCH_NEXT") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    return python


def _pyproject() -> dict:
    tomllib = pytest.importorskip(
        "tomllib", reason="tomllib is in the standard library from Python 3.11"
    )
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _clean_env() -> dict[str, str]:
    return {
        k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV"}
    }


def _torch_of(python: Path, cwd: Path, env: dict[str, str]) -> tuple[str, str]:
    """(version, file) of the torch that ``python`` imports."""
    out = subprocess.run(
        [
            str(python),
            "-c",
            "import torch; print(torch.__version__); print(torch.__file__)",
        ],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    version, file = out.stdout.split()
    return version, file


def _copy_of_package(dest: Path) -> Path:
    """pip builds a local source in place (build/, *.egg-info): give it a copy of the
    package."""
    shutil.copytree(
        ROOT / "src",
        dest / "src",
        ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"),
    )
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, dest / name)
    return dest


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, token: str, *, method: str = "GET", body: dict | None = None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(
        url, data=data, method=method, headers={"Authorization": f"token {token}"}
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read() or b"null")


def _execute(port: int, token: str, kernel_id: str, code: str) -> list[dict]:
    """Run ``code`` in a kernel through the server's websocket; return its iopub
    messages."""
    import websocket  # websocket-client, installed with JupyterLab

    ws = websocket.create_connection(
        f"ws://127.0.0.1:{port}/api/kernels/{kernel_id}/channels?token={token}",
        timeout=60,
    )
    msg_id = secrets.token_hex(8)
    ws.send(
        json.dumps(
            {
                "header": {
                    "msg_id": msg_id,
                    "msg_type": "execute_request",
                    "username": "test",
                    "session": secrets.token_hex(8),
                    "version": "5.3",
                },
                "parent_header": {},
                "metadata": {},
                "channel": "shell",
                "content": {
                    "code": code,
                    "silent": False,
                    "store_history": False,
                    "user_expressions": {},
                    "allow_stdin": False,
                    "stop_on_error": True,
                },
            }
        )
    )
    replies: list[dict] = []
    deadline = time.monotonic() + 90
    try:
        while time.monotonic() < deadline:
            msg = json.loads(ws.recv())
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            replies.append(msg)
            if msg["channel"] == "shell" and msg["msg_type"] == "execute_reply":
                return replies
    finally:
        ws.close()
    raise AssertionError(f"no execute_reply within 90 s: {replies}")


def test_jupyterlab_lists_the_chapters_and_workbook_and_its_kernel_imports_the_package(
    tmp_path,
):
    assert (BIN / "jupyter-lab").exists(), (
        "JupyterLab is not installed in this environment"
    )
    port, token = _free_port(), secrets.token_hex(16)
    env = {
        **os.environ,
        "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"),
        "JUPYTER_CONFIG_DIR": str(tmp_path / "config"),
        "JUPYTER_DATA_DIR": str(tmp_path / "data"),
    }
    server = subprocess.Popen(
        [
            str(BIN / "jupyter-lab"),
            "--no-browser",
            "--ip=127.0.0.1",
            f"--port={port}",
            f"--IdentityProvider.token={token}",
            f"--ServerApp.root_dir={ROOT}",
            "--ServerApp.open_browser=False",
            "--LabApp.news_url=",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
            *(["--allow-root"] if os.geteuid() == 0 else []),
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(120):
            try:
                _get(f"{base}/api/status", token)
                break
            except OSError:
                if server.poll() is not None:
                    raise AssertionError(
                        server.stderr.read().decode()[-2000:]
                    ) from None
                time.sleep(0.5)
        else:
            raise AssertionError("JupyterLab did not answer within 60 s")
        with urllib.request.urlopen(f"{base}/lab?token={token}", timeout=30) as r:
            assert r.status == 200 and b"JupyterLab" in r.read()
        top = {
            item["name"]: item["type"]
            for item in _get(f"{base}/api/contents/", token)["content"]
        }
        assert top.get("chapters") == top.get("workbook") == "directory", top
        listed = {
            item["name"]
            for item in _get(f"{base}/api/contents/chapters", token)["content"]
        }
        chapters = {p.name for p in (ROOT / "chapters").glob("[0-9][0-9]_*.ipynb")}
        assert chapters and chapters <= listed
        listed = {
            item["name"]
            for item in _get(f"{base}/api/contents/workbook", token)["content"]
        }
        assert {p.name for p in (ROOT / "workbook").glob("*.ipynb")} <= listed
        kernel = _get(
            f"{base}/api/kernels", token, method="POST", body={"name": "python3"}
        )
        replies = _execute(
            port, token, kernel["id"], "import attention\nprint(attention.__name__)"
        )
        status = [m for m in replies if m["msg_type"] == "execute_reply"][0]["content"][
            "status"
        ]
        printed = "".join(
            m["content"].get("text", "") for m in replies if m["msg_type"] == "stream"
        )
        assert status == "ok" and printed.strip() == "attention", replies
        _get(f"{base}/api/kernels/{kernel['id']}", token, method="DELETE")
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def test_makefile_documents_the_lab_command():
    """`make lab` serves the repository's root, where chapters/ and workbook/ both
    are."""
    makefile = (ROOT / "Makefile").read_text()
    recipe = makefile.split("\nlab:", 1)[1].split("\n\n", 1)[0]
    assert "jupyter lab --ServerApp.root_dir=. " in recipe
    assert (ROOT / "chapters").is_dir() and (ROOT / "workbook").is_dir()


@pytest.mark.parametrize("base", ["this", "torch-next"])
def test_a_chapter_installs_beside_the_readers_torch_and_reproduces_its_outputs(
    tmp_path, base
):
    """Colab, simulated: a bare environment that already has a PyTorch, the notebook
    alone; its first cell installs the package without touching that PyTorch, and nbval
    finds every output equal to the stored one."""
    import importlib.util

    base_python = Path(sys.executable) if base == "this" else _torch_next_python()
    spec = importlib.util.spec_from_file_location(
        "colab_cell", ROOT / "scripts" / "colab_cell.py"
    )
    colab_cell = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(colab_cell)
    SOURCE = colab_cell.SOURCE

    chapter = (
        ROOT / "chapters" / "14_memory_efficient.ipynb"
    )  # small, and plots saved results
    nb = json.loads(chapter.read_text())
    first = next(c for c in nb["cells"] if c["cell_type"] == "code")
    assert "".join(first["source"]) == SOURCE, (
        "the chapter's first code cell is not the install cell"
    )

    work = tmp_path / "colab"
    work.mkdir()
    shutil.copy(chapter, work / chapter.name)
    (work / "pytest.ini").write_text(
        "[pytest]\n"
    )  # no project settings: only what is passed
    venv = tmp_path / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True
    )
    # The fresh environment sees the base environment's third-party packages (torch,
    # pip, Jupyter, nbval) through a path entry, but not the course package: an editable
    # install is activated by a .pth file, and .pth files are read only in site
    # directories.
    env = _clean_env()
    purelib = subprocess.run(
        [
            str(base_python),
            "-c",
            "import sysconfig; print(sysconfig.get_paths()['purelib'])",
        ],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    site = next((venv / "lib").glob("python3*/site-packages"))
    (site / "course-deps.pth").write_text(purelib + "\n")
    python = venv / "bin" / "python"
    source = _copy_of_package(tmp_path / "checkout")
    env.update(
        ATTENTION_COURSE_SOURCE=str(source),
        PIP_NO_INDEX="1",
        PIP_NO_BUILD_ISOLATION="0",
        PYTHONNOUSERSITE="1",
        PYTHONHASHSEED="0",
    )
    probe = subprocess.run(
        [
            str(python),
            "-c",
            "import importlib.util as u; print(u.find_spec('attention'))",
        ],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert probe.stdout.strip() == "None", (
        "the fresh environment must start without the package"
    )
    torch_before = _torch_of(python, work, env)
    assert torch_before[1].startswith(purelib), torch_before

    run = subprocess.run(
        [
            str(python),
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--nbval",
            "--nbval-current-env",
            "--nbval-sanitize-with",
            str(ROOT / "tests" / "sanitize.cfg"),
            chapter.name,
        ],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert " passed" in run.stdout and "failed" not in run.stdout, run.stdout[-2000:]

    installed = subprocess.run(
        [str(python), "-c", "import attention; print(attention.__file__)"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert str(venv) in installed.stdout, (
        "the package was not installed into the fresh environment"
    )
    assert _torch_of(python, work, env) == torch_before, (
        "the install cell replaced the reader's torch"
    )
    assert not list(site.glob("torch*")), (
        "the install cell put a second torch into the environment"
    )


def test_installing_the_package_keeps_a_newer_torch_in_range(tmp_path):
    """pip beside a newer PyTorch, in range: it would install the package and not
    torch."""
    python = _torch_next_python()
    env = _clean_env()
    version, _ = _torch_of(python, tmp_path, env)
    assert Version(version) != Version(_locked(LOCK)["torch"]), (
        "the second environment must hold another torch"
    )
    source = _copy_of_package(tmp_path / "checkout")
    report = tmp_path / "report.json"
    # no build isolation: the package's metadata is built with the environment's
    # setuptools, so nothing at all is fetched when every dependency is already there
    run = subprocess.run(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--quiet",
            "--no-build-isolation",
            "--report",
            str(report),
            f"{source}[pretrained]",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    would_install = {
        item["metadata"]["name"].lower(): item["metadata"]["version"]
        for item in json.loads(report.read_text())["install"]
    }
    assert "attention-course" in would_install, would_install
    assert "torch" not in would_install, (
        f"pip would replace torch {version} with {would_install.get('torch')}"
    )


def test_the_torch_range_starts_at_the_oldest_tested_release():
    pyproject = _pyproject()
    torch_req = next(
        Requirement(r)
        for r in pyproject["project"]["dependencies"]
        if Requirement(r).name == "torch"
    )
    floors = [Version(s.version) for s in torch_req.specifier if s.operator == ">="]
    assert len(floors) == 1 and all(
        s.operator in {">=", "<", "<=", "!="} for s in torch_req.specifier
    ), f"torch must be a range with one floor, got {torch_req}"
    oldest, newer = (
        Version(_locked(LOCK)["torch"]),
        Version(_locked(LOCK_NEXT)["torch"]),
    )
    assert floors[0] == oldest, (
        f"the floor {floors[0]} is not the oldest tested torch {oldest}"
    )
    assert (
        newer > oldest
        and newer in torch_req.specifier
        and oldest in torch_req.specifier
    )
    readme = " ".join((ROOT / "README.md").read_text().split())  # line breaks as spaces
    assert f"`torch>={floors[0]}`" in readme and f"PyTorch {oldest}" in readme
    assert f"PyTorch {newer}" in readme and "the floor is the oldest tested" in readme


def test_both_locks_pin_everything_and_agree_outside_torch():
    first, second = _locked(LOCK), _locked(LOCK_NEXT)
    for name in (
        "torch",
        "triton",
        "pip",
        "setuptools",
        "jupyter-book",
        "nbval",
        "transformers",
    ):
        assert name in first, f"{LOCK.name} does not pin {name}"
    # the second environment differs only in PyTorch and what PyTorch brings
    differ = {n for n in first.keys() & second.keys() if first[n] != second[n]}
    assert differ == {"torch"}, differ
    pyproject = _pyproject()
    triton_req = Requirement(pyproject["project"]["optional-dependencies"]["triton"][0])
    assert Version(first["triton"]) in triton_req.specifier


def test_the_second_torch_runs_the_chapters_the_readme_lists():
    script = (ROOT / "scripts" / "test.sh").read_text()
    listed = re.search(r'^TORCH_NEXT_CHAPTERS="([^"]+)"', script, re.M).group(1).split()
    assert listed and all((ROOT / p).exists() for p in listed), listed
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Supported PyTorch") :]
    section = section[: section.index("\n## ", 4)]
    named = re.findall(r"`(chapters/\d\d_\w+\.ipynb)`", section)
    assert named == listed, (named, listed)


def test_the_repository_url_is_named_once():
    import importlib.util

    url = yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]["url"]
    spec = importlib.util.spec_from_file_location(
        "colab_cell", ROOT / "scripts" / "colab_cell.py"
    )
    colab_cell = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(colab_cell)
    assert (
        colab_cell.REPOSITORY == url.rstrip("/")
        and f'repository = "{url.rstrip("/")}"' in colab_cell.SOURCE
    )
    # the install cell is written by the script, so every chapter names the same URL
    for path in (ROOT / "chapters").glob("[0-9][0-9]_*.ipynb"):
        first = next(
            c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"
        )
        assert "".join(first["source"]) == colab_cell.SOURCE, (
            f"{path.name}: run scripts/colab_cell.py"
        )
    assert "repository.url" in (ROOT / "README.md").read_text()


def test_the_pages_workflow_builds_with_the_readmes_command():
    workflow = yaml.safe_load(
        (ROOT / ".github" / "workflows" / "pages.yml").read_text()
    )
    steps = [s for job in workflow["jobs"].values() for s in job["steps"]]
    commands = [s["run"].strip() for s in steps if "run" in s]
    assert commands == ["make book"], commands
    readme = (ROOT / "README.md").read_text()
    assert re.search(r"^make book\s+#", readme, re.M), (
        "the README's build command is not `make book`"
    )
    uploads = [
        s["with"]["path"]
        for s in steps
        if s.get("uses", "").startswith("actions/upload-pages-artifact")
    ]
    assert uploads == ["_build/html"] and "_build/html" in readme
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^book:", makefile, re.M)


def test_binder_installs_the_package_with_the_lock():
    reqs = (ROOT / "binder" / "requirements.txt").read_text().splitlines()
    lines = [r.strip() for r in reqs if r.strip() and not r.startswith("#")]
    assert any(r.startswith("-e .") or r.startswith(".[") or r == "." for r in lines), (
        lines
    )
    assert any("download.pytorch.org/whl/cpu" in r for r in lines), (
        "Binder should get the CPU wheel"
    )
    # every version, torch's included, comes from the lock, never a second, drifting pin
    constraints = [r.split(None, 1)[1] for r in lines if r.startswith("-c ")]
    assert [(ROOT / "binder" / c).resolve() for c in constraints] == [LOCK.resolve()], (
        lines
    )
    assert not any(r.startswith("torch") for r in lines), lines
    runtime = (ROOT / "binder" / "runtime.txt").read_text().strip()
    assert (
        f"Python {runtime.removeprefix('python-')}" in LOCK.read_text().splitlines()[0]
    )
