"""Builds diffsoft and its C++ core diffsoft._C against the torch that is installed."""
import ctypes.util
from pathlib import Path

import torch
from setuptools import find_packages, setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

root = Path(__file__).parent

# CHOLMOD (SuiteSparse), optional: the supernodal factorization of large sparse Hessians.
cholmod_include = next((d for d in ("/usr/include/suitesparse", "/usr/local/include/suitesparse")
                        if (Path(d) / "cholmod.h").exists()), None)
with_cholmod = cholmod_include is not None and ctypes.util.find_library("cholmod") is not None
sources = ["csrc/bindings.cpp"] + sorted(str(p.relative_to(root)) for p in (root / "csrc").glob("*/*.cpp"))

# Recorded so that importing diffsoft under another torch says "rebuild" instead of "undefined symbol".
(root / "python" / "diffsoft" / "_build_info.py").write_text(
    f'"""Written by setup.py: the torch this build of diffsoft._C was compiled against."""\n'
    f'TORCH_VERSION = "{torch.__version__}"\n'
)

setup(
    name="diffsoft",
    version="0.1.0",
    description="Differentiable implicit soft-body physics for PyTorch",
    package_dir={"": "python"},
    packages=find_packages("python"),
    package_data={"diffsoft": ["data/*"]},
    ext_modules=[
        CppExtension(
            "diffsoft._C",
            sources,
            include_dirs=[str(root.resolve() / "csrc"), "/usr/include/eigen3"] + [cholmod_include] * with_cholmod,
            define_macros=[("DIFFSOFT_WITH_CHOLMOD", None)] if with_cholmod else [],
            libraries=["cholmod"] if with_cholmod else [],
            extra_compile_args=["-std=c++17", "-O2"],
        )
    ],
    cmdclass={"build_ext": BuildExtension},
    python_requires=">=3.8",
    install_requires=["torch>=1.13.0a0", "numpy"],
)
