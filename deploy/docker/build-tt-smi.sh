#!/bin/sh
# Builds the self-contained tt-smi (PyInstaller onefile) inside a throw-away Debian root made by
# mmdebstrap (`cargo xtask image agent` runs it there; nothing of that root reaches an image).
# Input (environment): TT_SMI_VERSION, PYINSTALLER_VERSION, PIP_CONSTRAINT (a constraints file),
# PIP_CERT (the CA bundle the host's pip trusts, copied in: PyPI may sit behind a proxy).
# Output: /opt/tt-smi-build/dist/tt-smi and /opt/tt-smi-build/freeze.txt (`pip freeze`).
set -eu
out=/opt/tt-smi-build
python3 -m venv "$out/venv"
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
