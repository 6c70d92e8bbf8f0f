"""Builds the dlcp Python package with the prebuilt ``libdlcp_client.so`` inside.

The library is the Rust client's cdylib; build it first::

    cargo build --release -p dlcp-client
    pip install ./client/python        # or: pip wheel ./client/python

It is taken from ``$DLCP_CLIENT_LIB`` if set, else from
``target/release/libdlcp_client.so`` of this source tree (or of
``$CARGO_TARGET_DIR``), and copied next to the package's ``__init__.py``, where
``dlcp`` looks first. The wheel is tagged for this platform (it holds a native
library) but not for a Python version or ABI (the library is loaded with ctypes).
"""

import os
import re
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
LIB = "libdlcp_client.so"


def version() -> str:
    """The workspace's version (Cargo.toml [workspace.package])."""
    text = (ROOT / "Cargo.toml").read_text() if (ROOT / "Cargo.toml").is_file() else ""
    m = re.search(r'^\[workspace\.package\][^\[]*?^version\s*=\s*"([^"]+)"', text, re.M | re.S)
    return m.group(1) if m else "0.0.0"


def client_lib() -> Path:
    """The prebuilt library to bundle; a clear error if there is none."""
    env = os.environ.get("DLCP_CLIENT_LIB")
    if env:
        tried = [Path(env)]
    else:
        target = Path(os.environ.get("CARGO_TARGET_DIR") or ROOT / "target")
        tried = [target / "release" / LIB]
    for p in tried:
        if p.is_file():
            return p
    raise SystemExit(
        f"dlcp: {LIB} not found at {', '.join(str(p) for p in tried)}: build it first with "
        "`cargo build --release -p dlcp-client` (or set DLCP_CLIENT_LIB to a built one)"
    )


class BuildWithLib(build_py):
    """build_py that also copies the prebuilt library into the built package."""

    def run(self):
        super().run()
        src = client_lib()
        dst = Path(self.build_lib) / "dlcp" / LIB
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dst)
        print(f"dlcp: bundling {src}")


cmdclass = {"build_py": BuildWithLib}
try:
    from wheel.bdist_wheel import bdist_wheel

    class PlatformWheel(bdist_wheel):
        """A platform wheel (native library inside), any Python 3 (ctypes)."""

        def finalize_options(self):
            super().finalize_options()
            self.root_is_pure = False

        def get_tag(self):
            _, _, plat = super().get_tag()
            return "py3", "none", plat

    cmdclass["bdist_wheel"] = PlatformWheel
except ImportError:  # no wheel package: `setup.py install` style builds still work
    pass

setup(
    name="dlcp",
    version=version(),
    description="Python client of the dlcp transport daemon (dlcpd): shared-memory tensors, bounded-loss allreduce",
    long_description=(HERE / "dlcp" / "__init__.py").read_text().split('"""')[1],
    long_description_content_type="text/x-rst",
    license="Apache-2.0",
    python_requires=">=3.9",
    packages=["dlcp"],
    install_requires=["numpy"],
    extras_require={"torch": ["torch"]},
    zip_safe=False,
    cmdclass=cmdclass,
)
