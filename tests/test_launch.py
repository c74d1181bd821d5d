"""The reader's other ways in: JupyterLab from the project's environment, Colab, Binder.

- JupyterLab: the documented command (`make lab`) starts a server whose file browser lists
  the chapters and whose kernel imports the course package. Started headless on localhost
  with a random token, checked through its REST and kernel protocols, then stopped.
- Colab: a chapter copied into an empty directory outside the repository runs in a fresh
  virtual environment that lacks `attention`: its first cell installs the package (here
  from this checkout, through ATTENTION_COURSE_SOURCE) and every cell then executes.
- Binder: its configuration installs this package.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, token: str, *, method: str = "GET", body: dict | None = None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Authorization": f"token {token}"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read() or b"null")


def _execute(port: int, token: str, kernel_id: str, code: str) -> list[dict]:
    """Run ``code`` in a kernel through the server's websocket; return its iopub messages."""
    import websocket  # websocket-client, installed with JupyterLab

    ws = websocket.create_connection(
        f"ws://127.0.0.1:{port}/api/kernels/{kernel_id}/channels?token={token}", timeout=60)
    msg_id = secrets.token_hex(8)
    ws.send(json.dumps({
        "header": {"msg_id": msg_id, "msg_type": "execute_request", "username": "test",
                   "session": secrets.token_hex(8), "version": "5.3"},
        "parent_header": {}, "metadata": {}, "channel": "shell",
        "content": {"code": code, "silent": False, "store_history": False,
                    "user_expressions": {}, "allow_stdin": False, "stop_on_error": True},
    }))
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


def test_jupyterlab_lists_the_chapters_and_its_kernel_imports_the_package(tmp_path):
    assert (BIN / "jupyter-lab").exists(), "JupyterLab is not installed in this environment"
    port, token = _free_port(), secrets.token_hex(16)
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"),
           "JUPYTER_CONFIG_DIR": str(tmp_path / "config"), "JUPYTER_DATA_DIR": str(tmp_path / "data")}
    server = subprocess.Popen(
        [str(BIN / "jupyter-lab"), "--no-browser", "--ip=127.0.0.1", f"--port={port}",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={ROOT / 'chapters'}",
         "--ServerApp.open_browser=False", "--LabApp.news_url=", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
         *(["--allow-root"] if os.geteuid() == 0 else [])],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(120):
            try:
                _get(f"{base}/api/status", token)
                break
            except OSError:
                if server.poll() is not None:
                    raise AssertionError(server.stderr.read().decode()[-2000:]) from None
                time.sleep(0.5)
        else:
            raise AssertionError("JupyterLab did not answer within 60 s")
        with urllib.request.urlopen(f"{base}/lab?token={token}", timeout=30) as r:
            assert r.status == 200 and b"JupyterLab" in r.read()
        listed = {item["name"] for item in _get(f"{base}/api/contents/", token)["content"]}
        chapters = {p.name for p in (ROOT / "chapters").glob("[0-9][0-9]_*.ipynb")}
        assert chapters and chapters <= listed
        kernel = _get(f"{base}/api/kernels", token, method="POST", body={"name": "python3"})
        replies = _execute(port, token, kernel["id"], "import attention\nprint(attention.__name__)")
        status = [m for m in replies if m["msg_type"] == "execute_reply"][0]["content"]["status"]
        printed = "".join(m["content"].get("text", "") for m in replies if m["msg_type"] == "stream")
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
    makefile = (ROOT / "Makefile").read_text()
    assert "lab:" in makefile and "jupyter lab chapters" in makefile.replace("/jupyter-lab", " jupyter lab")


def test_a_chapter_runs_on_a_fresh_environment_without_the_package(tmp_path):
    """Colab, simulated: a bare environment, the notebook alone, its first cell installs."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("colab_cell", ROOT / "scripts" / "colab_cell.py")
    colab_cell = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(colab_cell)
    SOURCE = colab_cell.SOURCE

    chapter = ROOT / "chapters" / "13_memory_efficient.ipynb"  # small, and plots saved results
    nb = json.loads(chapter.read_text())
    first = next(c for c in nb["cells"] if c["cell_type"] == "code")
    assert "".join(first["source"]) == SOURCE, "the chapter's first code cell is not the install cell"

    work = tmp_path / "colab"
    work.mkdir()
    shutil.copy(chapter, work / chapter.name)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    # The fresh environment sees this environment's third-party packages (torch, pip,
    # Jupyter) through a path entry, but not the course package: an editable install is
    # activated by a .pth file, and .pth files are read only in site directories.
    purelib = Path(sysconfig.get_paths()["purelib"])
    site = next((venv / "lib").glob("python3*/site-packages"))
    (site / "course-deps.pth").write_text(str(purelib) + "\n")
    python = venv / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV"}}
    # pip builds a local source in place (a build/ folder): give it a copy of the package.
    source = tmp_path / "checkout"
    shutil.copytree(ROOT / "src", source / "src",
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    env.update(ATTENTION_COURSE_SOURCE=str(source), PIP_NO_INDEX="1",
               PIP_NO_BUILD_ISOLATION="0", PYTHONNOUSERSITE="1")
    probe = subprocess.run([str(python), "-c", "import importlib.util as u; print(u.find_spec('attention'))"],
                           cwd=work, env=env, capture_output=True, text=True, check=True)
    assert probe.stdout.strip() == "None", "the fresh environment must start without the package"
    run = subprocess.run(
        [str(python), "-m", "nbconvert", "--to", "notebook", "--execute",
         "--ExecutePreprocessor.timeout=300", "--output", "executed.ipynb", chapter.name],
        cwd=work, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    executed = json.loads((work / "executed.ipynb").read_text())
    errors = [o for c in executed["cells"] if c["cell_type"] == "code"
              for o in c.get("outputs", []) if o["output_type"] == "error"]
    assert not errors, errors
    installed = subprocess.run([str(python), "-c", "import attention; print(attention.__file__)"],
                               cwd=work, env=env, capture_output=True, text=True, check=True)
    assert str(venv) in installed.stdout, "the package was not installed into the fresh environment"


def test_binder_installs_the_package():
    reqs = (ROOT / "binder" / "requirements.txt").read_text().splitlines()
    lines = [r.strip() for r in reqs if r.strip() and not r.startswith("#")]
    assert any(r.startswith("-e .") or r.startswith(".[") or r == "." for r in lines), lines
    assert any("download.pytorch.org/whl/cpu" in r for r in lines), "Binder should get the CPU wheel"
    # torch's version comes from pyproject.toml's exact pin, never a second, drifting one
    assert not any(r.startswith("torch") for r in lines), lines
