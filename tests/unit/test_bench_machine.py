"""bench/machine.py: the CPU line every benchmark prints, and `--isa`'s rerun with capped
kernels."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.machine import ISA_ENV, amd_generation, describe

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.mark.parametrize(
    ("family", "model", "generation"),
    [
        (23, 0x31, "Zen 2"),
        (25, 0x01, "Zen 3"),
        (25, 0x11, "Zen 4"),
        (25, 0x61, "Zen 4"),
        (26, 0x02, "Zen 5"),
        (21, 0x02, None),
    ],
)
def test_amd_generation_from_family_and_model(
    family: int, model: int, generation: str | None
) -> None:
    assert amd_generation(family, model) == generation


def test_describe_names_the_generation_only_on_amd_and_the_vector_extensions() -> None:
    amd = describe(
        {
            "vendor_id": "AuthenticAMD",
            "model name": "AMD EPYC",
            "cpu family": "26",
            "model": "2",
            "flags": "fpu avx2 avx512f avx512_bf16 sha_ni",
        }
    )
    assert amd == "AMD EPYC (family 26 model 2, Zen 5; avx2, avx512f, avx512_bf16)"
    intel = describe(
        {
            "vendor_id": "GenuineIntel",
            "model name": "Intel(R) Xeon(R) Gold 6338",
            "cpu family": "6",
            "model": "106",
            "flags": "avx2",
        }
    )
    assert intel == "Intel(R) Xeon(R) Gold 6338 (family 6 model 106; avx2)"
    assert describe({}) == "unknown CPU (family 0 model 0; no AVX2)"


def test_isa_reruns_the_script_with_the_kernels_capped(tmp_path: Path) -> None:
    script = tmp_path / "probe.py"
    script.write_text(
        f"import os, sys\nsys.path.insert(0, {str(BENCH)!r})\n"
        "from machine import apply_isa\napply_isa(sys.argv)\n"
        "print(sys.argv[1:], os.environ.get('ONEDNN_MAX_CPU_ISA'),"
        " os.environ.get('ATEN_CPU_CAPABILITY'))\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ISA_ENV["avx2"]}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, str(script), *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    capped = run("--repeats", "3", "--isa", "avx2")
    assert capped.stdout.strip() == "['--repeats', '3'] AVX2 avx2"
    assert run("--repeats", "3").stdout.strip() == "['--repeats', '3'] None None"
    wrong = run("--isa", "sse9")
    assert wrong.returncode != 0 and "--isa takes one of avx2, avx512" in wrong.stderr
