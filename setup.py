"""The kvmesh Python package for `pip install .` (pyproject.toml).

The compiled core (kvmesh._core) is built by the project's CMake build, the
same one scripts/build.sh runs: into $KVMESH_BUILD_DIR when set (an existing
build tree, e.g. build/: only the Python targets are brought up to date),
else into build/pip/ (configured on first use, Release, tests and benchmarks
off). The package directory CMake assembles (build/.../python/kvmesh: the
extension and the pure-Python files) is what the wheel holds.

    pip install .                                   # in the engine's environment
    pip install --no-build-isolation .              # offline: setuptools and wheel from the system
    KVMESH_BUILD_DIR=build pip install --no-build-isolation .   # reuse this checkout's build
"""

import os
import re
import shutil
import subprocess
import sys
import sysconfig

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

SOURCE = os.path.dirname(os.path.abspath(__file__))


def version():
    with open(os.path.join(SOURCE, "CMakeLists.txt")) as f:
        m = re.search(r"project\(kvmesh VERSION ([0-9.]+)", f.read())
    return m.group(1) if m else "0.0.0"


def build_dir():
    return os.path.abspath(os.environ.get("KVMESH_BUILD_DIR") or os.path.join(SOURCE, "build", "pip"))


class CMakeBuildPy(build_py):
    """Builds kvmesh._core with CMake, then copies the package CMake assembled."""

    def run(self):
        build = build_dir()
        if not os.path.exists(os.path.join(build, "CMakeCache.txt")):
            gen = ["-G", "Ninja"] if shutil.which("ninja") else []
            subprocess.check_call(["cmake", "-S", SOURCE, "-B", build, *gen, "-DCMAKE_BUILD_TYPE=Release",
                                   "-DKVMESH_BUILD_TESTS=OFF", "-DKVMESH_BUILD_BENCH=OFF",
                                   "-DKVMESH_WITH_PYTHON=ON", f"-DPython_EXECUTABLE={sys.executable}"])
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 2))
        subprocess.check_call(["cmake", "--build", build, "--target", "kvmesh_python", "kvmesh_python_files",
                               "-j", jobs])
        pkg = os.path.join(build, "python", "kvmesh")
        suffix = sysconfig.get_config_var("EXT_SUFFIX")
        if not os.path.exists(os.path.join(pkg, "_core" + suffix)):
            built = [f for f in os.listdir(pkg) if f.startswith("_core.")]
            raise RuntimeError(f"kvmesh: {build} holds {built}, not _core{suffix} for {sys.executable}: "
                               f"configure that build for this interpreter (-DPython_EXECUTABLE) or unset "
                               f"KVMESH_BUILD_DIR")
        out = os.path.join(self.build_lib, "kvmesh")
        if os.path.exists(out):
            shutil.rmtree(out)
        shutil.copytree(pkg, out, ignore=shutil.ignore_patterns("__pycache__", "sanitizer-options", "*.pyc"))


class BinaryDistribution(Distribution):
    def has_ext_modules(self):  # the wheel carries a compiled extension: tag it for this platform
        return True


setup(
    name="kvmesh",
    version=version(),
    description="kvmesh: a distributed, sharded KV cache for LLM inference (client, vLLM and SGLang plug-ins)",
    packages=["kvmesh", "kvmesh.adapters"],
    package_dir={"": "python"},
    python_requires=">=3.8",
    install_requires=["numpy"],
    cmdclass={"build_py": CMakeBuildPy},
    distclass=BinaryDistribution,
    zip_safe=False,
    options={"build": {"build_base": os.path.join(build_dir(), "pip-build")},
             "egg_info": {"egg_base": build_dir()}},
)
