"""Builds diffsoft and its C++ core diffsoft._C against the torch that is installed.

Eigen (required) and CHOLMOD (optional) are searched for as CMakeLists.txt does, in the prefixes of
CMAKE_PREFIX_PATH, CONDA_PREFIX, /usr/local and /usr, after pkg-config's directories; the environment variables
EIGEN3_INCLUDE_DIR, CHOLMOD_INCLUDE_DIR and CHOLMOD_LIBRARY_DIR name the directories instead.
"""
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import torch
from setuptools import find_packages, setup
from torch.utils.cpp_extension import BuildExtension, CppExtension, include_paths

root = Path(__file__).parent


def prefixes():
    listed = os.environ.get("CMAKE_PREFIX_PATH", "").split(os.pathsep) + [os.environ.get("CONDA_PREFIX", "")]
    return [Path(p) for p in listed if p] + [Path("/usr/local"), Path("/usr")]


def lib_dirs(prefix):
    return [prefix / "lib" / (sysconfig.get_config_var("MULTIARCH") or ""), prefix / "lib64", prefix / "lib"]


# The compiler's and linker's own directories: naming them again (-I/usr/include, -L/usr/lib/...) would put
# them ahead of torch's, and a system LibTorch could shadow the torch being built against.
DEFAULT_DIRS = {Path("/usr/include"), Path("/usr/local/include"), *lib_dirs(Path("/usr")), *lib_dirs(Path("/"))}


def pkg_config(package, option):
    """The directories pkg-config gives for ``--cflags-only-I`` or ``--libs-only-L`` (none without it)."""
    if shutil.which("pkg-config") is None:
        return []
    run = subprocess.run(["pkg-config", option, package], capture_output=True, text=True)
    return [Path(flag[2:]) for flag in run.stdout.split()] if run.returncode == 0 else []


def find(name, env, pkg, option, candidates):
    """The first directory holding ``name``: the environment variable ``env`` if set, else pkg-config's
    directories for ``pkg`` and then ``candidates``."""
    listed = [Path(os.environ[env])] if os.environ.get(env) else pkg_config(pkg, option) + candidates
    return next((d for d in listed if (d / name).exists()), None)


eigen = find("Eigen/Core", "EIGEN3_INCLUDE_DIR", "eigen3", "--cflags-only-I",
             [p / "include" / "eigen3" for p in prefixes()])
if eigen is None:
    raise RuntimeError("Eigen 3 not found: install it (Debian: libeigen3-dev, conda: eigen), or set "
                       "EIGEN3_INCLUDE_DIR to the directory that holds Eigen/Core")

# CHOLMOD (SuiteSparse), optional: the supernodal factorization of large sparse Hessians.
cholmod_include = find("cholmod.h", "CHOLMOD_INCLUDE_DIR", "cholmod", "--cflags-only-I",
                       [p / "include" / sub for p in prefixes() for sub in ("suitesparse", "")])
cholmod_lib = find("libcholmod.dylib" if sys.platform == "darwin" else "libcholmod.so", "CHOLMOD_LIBRARY_DIR",
                   "cholmod", "--libs-only-L", [d for p in prefixes() for d in lib_dirs(p)])
with_cholmod = cholmod_include is not None and cholmod_lib is not None


def named(directory, used=True):
    """[directory] if used, unless it is one of the compiler's or linker's own."""
    return [str(directory)] if used and directory not in DEFAULT_DIRS else []


# The warnings of CMakeLists.txt (-Wall -Wextra) are for our code: the headers of torch, Eigen and CHOLMOD are
# system includes, as those of CMake's imported targets are. (CppExtension also names torch's with -I, which
# -isystem overrides.)
system_includes = include_paths() + named(eigen) + named(cholmod_include, with_cholmod)

sources = ["csrc/bindings.cpp"] + sorted(str(p.relative_to(root)) for p in (root / "csrc").glob("*/*.cpp"))

# Recorded so that importing diffsoft under another torch says "rebuild" instead of "undefined symbol".
(root / "python" / "diffsoft" / "_build_info.py").write_text(
    f'"""Written by setup.py: the torch this build of diffsoft._C was compiled against."""\n'
    f'TORCH_VERSION = "{torch.__version__}"\n'
)

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
    ext_modules=[
        CppExtension(
            "diffsoft._C",
            sources,
            include_dirs=[str(root.resolve() / "csrc")],
            define_macros=[("DIFFSOFT_WITH_CHOLMOD", None)] if with_cholmod else [],
            libraries=["cholmod"] if with_cholmod else [],
            library_dirs=named(cholmod_lib, with_cholmod),
            runtime_library_dirs=named(cholmod_lib, with_cholmod),
            extra_compile_args=["-std=c++17", "-O2", "-Wall", "-Wextra"] + ["-isystem" + d for d in system_includes],
        )
    ],
    cmdclass={"build_ext": BuildExtension},
    python_requires=">=3.8",
    install_requires=["torch>=1.13.0a0", "numpy"],
    extras_require={
        "render": render,  # diffsoft.render: PNG frames and GIFs
        "io": io,  # diffsoft.mesh.read, write, write_vtk_series
        "train": train,  # diffsoft-train: progress bars, the learning curve plot, the GIF of the walk
        "rl": rl,  # diffsoft.envs: the locomotion task as Gymnasium environments (AutoresetMode: gymnasium 1.1)
        "test": ["pytest", "hypothesis"] + sorted(set(render + io + train + rl)),
    },
    entry_points={"console_scripts": ["diffsoft-train = diffsoft.cli:main"]},
)
