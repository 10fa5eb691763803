"""`pip install` of this checkout into a fresh virtual environment, then both
engines' stand-ins loading kvmesh's plug-ins from there (not from the build
tree): what a user does on the engine's machine.

The venv has --system-site-packages (numpy, torch and pytest from Debian);
pip runs offline (--no-build-isolation --no-index: setuptools and wheel from
the system) and setup.py brings the build of this test run
($KVMESH_BUILD_DIR, ctest's build tree) up to date instead of configuring a
new one (docs/engines.md: a build from nothing takes about 2 minutes on 2
cores)."""

import os
import subprocess
import sys

import pytest

from conftest import SOURCE_DIR, scaled

BUILD_DIR = os.environ.get("KVMESH_BUILD_DIR")


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    if not BUILD_DIR:
        pytest.skip("KVMESH_BUILD_DIR is not set (ctest sets it)")
    root = tmp_path_factory.mktemp("pip")
    env_dir = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(env_dir)], check=True,
                   timeout=scaled(120))
    py = str(env_dir / "bin" / "python")
    env = clean_env(KVMESH_BUILD_DIR=BUILD_DIR)
    r = subprocess.run([py, "-m", "pip", "install", "--no-build-isolation", "--no-index", "--quiet", SOURCE_DIR],
                       env=env, cwd=str(root), capture_output=True, text=True, timeout=scaled(600))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return py, root


def clean_env(**extra):
    """This process's environment without the build tree on the path."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(extra)
    return env


def run(py, code, cwd):
    return subprocess.run([py, "-c", code], env=clean_env(), cwd=str(cwd), capture_output=True, text=True,
                          timeout=scaled(60))


def test_the_package_is_installed_in_the_venv(venv):
    py, root = venv
    r = run(py, "import kvmesh, numpy; print(kvmesh.__file__); print(kvmesh.VERSION); "
                "print(kvmesh.chain_keys(list(range(32)), 16, b's').shape)", root)
    assert r.returncode == 0, r.stderr
    path, version, shape = r.stdout.split("\n")[:3]
    assert path.startswith(str(root / "venv")) and "site-packages" in path
    assert version and shape == "(2, 2)"


def test_importing_a_plugin_without_its_engine_says_so(venv):
    py, root = venv
    for module, engine in (("kvmesh.vllm", "vLLM"), ("kvmesh.sglang", "SGLang")):
        r = run(py, f"import {module}", root)
        assert r.returncode != 0
        last = r.stderr.strip().splitlines()[-1]
        assert last.startswith("ImportError:") and f"needs {engine}" in last, r.stderr
        assert len(r.stderr.strip().splitlines()) <= 6, r.stderr  # one frame of kvmesh, not a traceback from deep inside


@pytest.mark.parametrize("test_file,select", [
    ("test_vllm_engine.py", "VLLM_SELECT"),
    ("test_sglang_engine.py", "test_kvmesh_roundtrip and (mha-page_first or mla-page_first or mamba)"),
])
def test_the_engines_load_kvmesh_from_the_venv(venv, test_file, select):
    """The stand-ins load kvmesh.vllm / kvmesh.sglang by name from the
    installed package, store and hit (a subset of their test files)."""
    py, root = venv
    if select == "VLLM_SELECT":
        select = VLLM_SELECT
    # conftest.py checks that kvmesh comes from the venv (KVMESH_EXPECT_PACKAGE_IN).
    env = clean_env(KVMESH_SOURCE_DIR=SOURCE_DIR, PYTHONDONTWRITEBYTECODE="1",
                    KVMESH_EXPECT_PACKAGE_IN=str(root / "venv"))
    probe = os.path.join(SOURCE_DIR, "python", "tests", test_file)
    r = subprocess.run([py, "-m", "pytest", "-q", "-p", "no:cacheprovider", probe, "-k", select],
                       env=env, cwd=str(root), capture_output=True, text=True, timeout=scaled(240))
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert " passed" in r.stdout and "failed" not in r.stdout, r.stdout[-2000:]


VLLM_SELECT = "test_second_engine_loads_what_the_first_stored and (fa-NHD or mla or hybrid)"
