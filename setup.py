"""Builds strata's Python package: the pure-Python part from python/strata/ and the compiled
module strata._C, built by CMake from this clone (scripts/build.sh, target strata_python) for the
interpreter running this build. Environment:
  STRATA_BUILD_DIR       the CMake build directory (default: build/ in this clone)
  STRATA_PYTHON_MODULE   an already built strata._C to package instead (the test suite's)
"""
import glob
import os
import shutil
import subprocess
import sys
import sysconfig

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

ROOT = os.path.dirname(os.path.abspath(__file__))


def _built_module():
    prebuilt = os.environ.get("STRATA_PYTHON_MODULE")
    if prebuilt:
        return prebuilt
    build_dir = os.environ.get("STRATA_BUILD_DIR", os.path.join(ROOT, "build"))
    # This interpreter's torch, not the project venv's (scripts/setup.sh is then not asked to
    # fill one).
    args = [os.path.join(ROOT, "scripts", "build.sh"), "--build-dir", build_dir,
            "--python", sys.executable, "-DSTRATA_WITH_PYTHON=ON"]
    subprocess.run(args + ["strata_python"], check=True, stdout=sys.stderr)
    found = glob.glob(os.path.join(build_dir, "python", "strata",
                                   "_C" + sysconfig.get_config_var("EXT_SUFFIX")))
    if not found:
        sys.exit(f"strata: the build in {build_dir} made no strata._C module")
    return found[0]


class BuildWithEngine(build_py):
    def run(self):
        super().run()
        module = _built_module()
        suffix = sysconfig.get_config_var("EXT_SUFFIX")
        if not module.endswith(suffix):
            sys.exit(f"strata: {module} was built for another Python than {sys.executable} "
                     f"(expected a *{suffix} module); build with this interpreter "
                     f"(STRATA_BUILD_DIR=<a new directory>)")
        target = os.path.join(self.build_lib, "strata", "_C" + suffix)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(module, target)


class BinaryDistribution(Distribution):
    def has_ext_modules(self):
        return True


# setuptools' scratch files go under the CMake build directory, not into the clone.
_scratch = os.path.join(os.environ.get("STRATA_BUILD_DIR", os.path.join(ROOT, "build")),
                        "python-package")
os.makedirs(_scratch, exist_ok=True)
setup(cmdclass={"build_py": BuildWithEngine}, distclass=BinaryDistribution,
      options={"build": {"build_base": _scratch}, "egg_info": {"egg_base": _scratch}})
