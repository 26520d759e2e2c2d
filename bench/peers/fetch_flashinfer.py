#!/usr/bin/env python3
"""Fetch FlashInfer's bundled CUDA headers from the flashinfer-python wheel on PyPI.

Usage: fetch_flashinfer.py VERSION DEST

Downloads flashinfer-python==VERSION (the pure-Python wheel, no dependencies) with pip into a
temporary folder and extracts its flashinfer/data/include/ tree into DEST/include (so that
DEST/include/flashinfer/sampling.cuh exists). Exits non-zero with a message when pip cannot
reach PyPI or the wheel lacks the headers; nothing is left behind but DEST/include.
"""
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile

PREFIX = "flashinfer/data/include/"


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    version, dest = sys.argv[1], sys.argv[2]
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
               "--only-binary=:all:", "--disable-pip-version-check", "--timeout", "30",
               "--retries", "1", "-d", tmp, f"flashinfer-python=={version}"]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            print(f"pip download flashinfer-python=={version} failed: {r.stderr.strip()[-400:]}",
                  file=sys.stderr)
            return 1
        wheels = [f for f in os.listdir(tmp) if f.endswith(".whl")]
        if not wheels:
            print("pip download produced no wheel", file=sys.stderr)
            return 1
        include = os.path.join(dest, "include")
        staging = include + ".partial"
        shutil.rmtree(staging, ignore_errors=True)
        with zipfile.ZipFile(os.path.join(tmp, wheels[0])) as z:
            names = [n for n in z.namelist() if n.startswith(PREFIX) and not n.endswith("/")]
            if not any(n.endswith("flashinfer/sampling.cuh") for n in names):
                print("the wheel has no flashinfer/data/include/flashinfer/sampling.cuh",
                      file=sys.stderr)
                return 1
            for n in names:
                target = os.path.join(staging, n[len(PREFIX):])
                os.makedirs(os.path.dirname(target), exist_ok=True)
                with z.open(n) as src, open(target, "wb") as out:
                    shutil.copyfileobj(src, out)
        shutil.rmtree(include, ignore_errors=True)
        os.replace(staging, include)
    return 0


if __name__ == "__main__":
    sys.exit(main())
