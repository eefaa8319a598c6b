"""Builds diffsoft against the torch that is installed: the C++ core once, by CMake, then the Python extension.

1. CMake (CMakeLists.txt) configures and builds the core's two static libraries, ``diffsoft_core`` and
   ``diffsoft_physics``, in the build folder ``$DIFFSOFT_BUILD_DIR`` (default ``build``). It finds LibTorch (this
   torch's own), Eigen and CHOLMOD, and writes what the extension needs to link them to ``python_link.json``.
   The C++ test suite and the installed C++ package are built from the same folder, so ``scripts/test.sh``
   compiles no source twice.
2. setuptools compiles the pybind11 bindings (``csrc/bindings.cpp``) and the operators ``torch.ops.diffsoft.*``
   (``csrc/ops.cpp``) with torch's ``BuildExtension`` and links them with those libraries into ``diffsoft._C``.

CMake 3.18 or later is needed (``apt-get install cmake ninja-build``, or ``pip install cmake ninja``); Ninja is
used when found. CMake finds Eigen and CHOLMOD as usual (``CMAKE_PREFIX_PATH``, ``EIGEN3_INCLUDE_DIR`` via
``Eigen3_DIR``, ``CHOLMOD_INCLUDE_DIR``, ``CHOLMOD_LIBRARY``); ``CMAKE_ARGS`` adds arguments to its command line.
"""
import json
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import torch
import torch.utils
from setuptools import find_packages, setup
from setuptools.command.build_py import build_py
from torch.utils.cpp_extension import BuildExtension, CppExtension, include_paths

root = Path(__file__).parent.resolve()
# CMake's build folder, and setuptools' too (its objects and wheel contents in subfolders): one per torch.
BUILD_DIR = root / os.environ.get("DIFFSOFT_BUILD_DIR", "build")
TORCH_VERSION = tuple(int(n) for n in re.findall(r"\d+", torch.__version__)[:2])


def cmake_prefixes():
    """Where CMake finds this torch's LibTorch: a pip torch's ``share/cmake`` (TorchConfig.cmake) and its folder,
    so that find_library finds its ``lib/libtorch.so`` ahead of a system LibTorch. Debian's python3-torch has no
    ``share/cmake``, and CMake finds its libtorch-dev, the same build, on the default path."""
    share = Path(getattr(torch.utils, "cmake_prefix_path", ""))
    return [str(share), str(Path(torch.__file__).parent)] if (share / "Torch").is_dir() else []


def source_commit():
    """The commit the sources being built are at ("abc1234", "abc1234 with uncommitted changes" where csrc/,
    python/ or the build's files differ from it), or None outside a git checkout (an sdist)."""
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "diff", "--quiet", "HEAD", "--", "csrc", "python",
                                "CMakeLists.txt", "setup.py"], capture_output=True).returncode
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + (" with uncommitted changes" if dirty else "")


def build_core(build_dir):
    """Configures (when needed) and builds the core's libraries in ``build_dir``; returns python_link.json."""
    cmake = shutil.which("cmake")
    if cmake is None:
        raise RuntimeError("diffsoft's build needs CMake >= 3.18: apt-get install cmake ninja-build (Debian), or "
                           "pip install cmake ninja")
    cache = build_dir / "CMakeCache.txt"
    configured_for = re.search(r"^DIFFSOFT_BUILT_FOR_TORCH:STRING=(.*)$", cache.read_text(), re.M) \
        if cache.exists() else None
    if configured_for is None or configured_for.group(1) != torch.__version__:
        if cache.exists():  # configured for another torch: its cached LibTorch paths would be stale
            print(f"diffsoft: {build_dir} was configured for torch {configured_for and configured_for.group(1)}; "
                  f"configuring it again for torch {torch.__version__}", flush=True)
            cache.unlink()
            shutil.rmtree(build_dir / "CMakeFiles", ignore_errors=True)
        args = [cmake, "-S", str(root), "-B", str(build_dir), "-DCMAKE_BUILD_TYPE=Release",
                f"-DDIFFSOFT_BUILT_FOR_TORCH={torch.__version__}"]
        if shutil.which("ninja"):
            args += ["-G", "Ninja"]
        prefixes = cmake_prefixes()
        if prefixes:
            args.append("-DCMAKE_PREFIX_PATH=" + ";".join(prefixes))
        subprocess.run(args + shlex.split(os.environ.get("CMAKE_ARGS", "")), check=True)
    jobs = os.environ.get("MAX_JOBS")
    subprocess.run([cmake, "--build", str(build_dir), "--target", "diffsoft_core", "diffsoft_physics"]
                   + (["-j", jobs] if jobs else []), check=True)
    return json.loads((build_dir / "python_link.json").read_text())


class BuildWithCore(BuildExtension):
    """torch's BuildExtension, after CMake has built the core: the extension links the core's libraries."""

    def run(self):
        link = build_core(BUILD_DIR)
        # The warnings (-Wall -Wextra) are for our code: torch's, Eigen's and CHOLMOD's headers are system
        # includes, as those of CMake's imported targets are. (CppExtension also names torch's with -I, which
        # -isystem overrides.) torch before 2.1 compiles extensions as C++14, older than ours.
        std = ["-std=c++17"] if TORCH_VERSION < (2, 1) else []
        system = include_paths() + link["system_include_dirs"]
        for ext in self.extensions:
            ext.extra_objects = link["libraries"]  # static: physics before core
            ext.extra_compile_args = std + ["-O2", "-Wall", "-Wextra"] + ["-isystem" + d for d in system]
            ext.runtime_library_dirs = link["runtime_library_dirs"]
        super().run()
        # Beside the extension (the source tree in an editable install, else the wheel), so that importing it
        # under another torch says "rebuild" instead of "undefined symbol", and so that a benchmark run with an
        # installed (not editable) copy names the commit it was built at, not the checkout's.
        for ext in self.extensions:
            (Path(self.get_ext_fullpath(ext.name)).parent / "_build_info.py").write_text(
                f'"""Written by setup.py: the torch this build of diffsoft._C was compiled against, and the commit\n'
                f'of the sources it was built from (None outside a git checkout)."""\n'
                f'TORCH_VERSION = "{torch.__version__}"\n'
                f'SOURCE_COMMIT = {source_commit()!r}\n')


class FreshBuildPy(build_py):
    """setuptools' build_py, into an emptied package folder: the build folder outlives builds, and a module since
    removed from the source would otherwise still ship in the next wheel."""

    def run(self):
        shutil.rmtree(Path(self.build_lib) / "diffsoft", ignore_errors=True)
        super().run()


sources = ["csrc/bindings.cpp", "csrc/ops.cpp"]

render = ["pillow"]
io = ["meshio"]
train = ["tqdm", "matplotlib", "pillow"]
rl = ["gymnasium>=1.1"]
setup(
    name="diffsoft",
    version="0.1.0",
    description="Differentiable implicit soft-body physics for PyTorch",
    package_dir={"": "python"},
    packages=find_packages("python"),
    ext_modules=[CppExtension("diffsoft._C", sources, include_dirs=[str(root / "csrc")])],
    cmdclass={"build_py": FreshBuildPy, "build_ext": BuildWithCore},
    options={"build": {"build_base": str(BUILD_DIR)}},
    python_requires=">=3.8",
    install_requires=["torch>=1.13.0a0", "numpy"],
    extras_require={
        "render": render,  # diffsoft.render: PNG frames and GIFs
        "io": io,  # diffsoft.mesh.read, write, write_vtk_series
        "train": train,  # diffsoft-train: progress bars, the learning curve plot, the GIF of the walk
        "rl": rl,  # diffsoft.envs: the locomotion task as Gymnasium environments (AutoresetMode: gymnasium 1.1)
        "test": ["pytest", "hypothesis", "sphinx"] + sorted(set(render + io + train + rl)),  # sphinx: the API docs' test
    },
    entry_points={"console_scripts": ["diffsoft-train = diffsoft.cli:main"]},
)
