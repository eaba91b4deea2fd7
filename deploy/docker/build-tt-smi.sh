#!/bin/sh
# Builds the self-contained tt-smi (PyInstaller onefile) inside a throw-away Debian 11 root made
# by mmdebstrap (`cargo xtask image agent` runs it there; nothing of that root reaches an image).
# tt-smi is copied to nodes and runs against their glibc, so it is built against the oldest one
# it must run on (Debian 11's 2.31); Debian 11's Python is too old for tt-smi, so the pinned
# CPython source is built here first, with the root's compiler and libraries.
# Input (environment): TT_SMI_VERSION, PYINSTALLER_VERSION, PIP_CONSTRAINT (a constraints file),
# PIP_CERT (the CA bundle the host's pip trusts, copied in: PyPI may sit behind a proxy);
# $out/python.tar.gz (the CPython source, checked by the caller).
# Output: /opt/tt-smi-build/dist/tt-smi and /opt/tt-smi-build/freeze.txt (`pip freeze`).
set -eu
out=/opt/tt-smi-build
python=/opt/python
mkdir "$out/python-src"
tar -xzf "$out/python.tar.gz" -C "$out/python-src" --strip-components=1
cd "$out/python-src"
# shared: PyInstaller bundles libpython; the rpath lets the build's own python find it
./configure --quiet --prefix="$python" --enable-shared LDFLAGS="-Wl,-rpath,$python/lib"
make --quiet -j"$(nproc)" >"$out/python-make.log" 2>&1 || { tail -n 50 "$out/python-make.log"; exit 1; }
make --quiet install >>"$out/python-make.log" 2>&1 || { tail -n 50 "$out/python-make.log"; exit 1; }
"$python/bin/python3" -c 'import ssl, ctypes, zlib, bz2, lzma'
"$python/bin/python3" -m venv "$out/venv"
"$out/venv/bin/pip" install --no-cache-dir --disable-pip-version-check --quiet \
  "tt-smi==$TT_SMI_VERSION" "pyinstaller==$PYINSTALLER_VERSION"
"$out/venv/bin/pip" freeze >"$out/freeze.txt"
cd "$out"
# The modules tt-smi loads by name at run time (tt-smi's own PyInstaller recipe, plus tt_smi's
# data files).
"$out/venv/bin/pyinstaller" --clean --noconfirm --onefile --log-level WARN --name tt-smi \
  --copy-metadata tt-smi --collect-all tt_smi --collect-all textual --collect-all rich \
  --collect-all pydantic --collect-all tt_tools_common --collect-all tt_umd \
  --collect-all pyluwen "$out/venv/bin/tt-smi"
"$out/dist/tt-smi" --version
