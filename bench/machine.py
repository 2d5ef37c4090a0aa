"""What a benchmark ran on: the CPU (model, family, microarchitecture where known, vector ISA),
and `--isa`, which reruns a benchmark with torch's, oneDNN's and MKL's kernels held to one
instruction set, so that one machine also measures the path an older CPU would take.

Virtual machines often report a bare "AMD EPYC" as the model name; the family and model
numbers say which generation it is (every published figure names it).
"""

from __future__ import annotations

import os
import sys

#: `--isa` choices → the environment each library reads at start-up to cap its kernels.
ISA_ENV = {
    "avx2": {
        "ONEDNN_MAX_CPU_ISA": "AVX2",
        "ATEN_CPU_CAPABILITY": "avx2",
        "MKL_ENABLE_INSTRUCTIONS": "AVX2",
    },
    "avx512": {
        "ONEDNN_MAX_CPU_ISA": "AVX512_CORE",
        "ATEN_CPU_CAPABILITY": "avx512",
        "MKL_ENABLE_INSTRUCTIONS": "AVX512",
    },
}
#: The vector extensions worth naming beside a figure (fp32 and bf16 throughput follow them).
FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_tile")


def _cpuinfo() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo (empty where there is none)."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if not line.strip():
                    break
                key, _, value = line.partition(":")
                fields[key.strip()] = value.strip()
    except OSError:
        pass
    return fields


def amd_generation(family: int, model: int) -> str | None:
    """AMD's Zen generation from the CPUID family and model (None when not known)."""
    if family == 23:
        return "Zen 2" if model >= 0x30 else "Zen / Zen+"
    if family == 25:
        return "Zen 3" if model < 0x10 or 0x20 <= model < 0x60 else "Zen 4"
    if family == 26:
        return "Zen 5"
    return None


def describe(fields: dict[str, str]) -> str:
    """One line naming the CPU of these cpuinfo `fields`: model name, family/model (with the
    Zen generation on AMD) and its vector extensions."""
    name = fields.get("model name", "unknown CPU")
    family, model = int(fields.get("cpu family", "0")), int(fields.get("model", "0"))
    generation = amd_generation(family, model) if "AMD" in fields.get("vendor_id", "") else None
    flags = set(fields.get("flags", "").split())
    isa = ", ".join(f for f in FLAGS if f in flags) or "no AVX2"
    where = f"family {family} model {model}" + (f", {generation}" if generation else "")
    return f"{name} ({where}; {isa})"


def cpu_model() -> str:
    """This machine's CPU in one line, with the ISA cap of `--isa` if one is set."""
    line = describe(_cpuinfo())
    capped = os.environ.get("ONEDNN_MAX_CPU_ISA")
    return f"{line}; kernels capped at {capped}" if capped else line


def apply_isa(argv: list[str]) -> None:
    """Handle `--isa avx2|avx512` in `argv` (sys.argv): rerun this benchmark without it, its
    kernels capped (the libraries read the cap when they load, so it is set before Python
    starts again). Does nothing without `--isa`."""
    if "--isa" not in argv:
        return
    at = argv.index("--isa")
    if at + 1 >= len(argv) or argv[at + 1] not in ISA_ENV:
        sys.exit(f"--isa takes one of {', '.join(ISA_ENV)}")
    rest = argv[:at] + argv[at + 2 :]
    os.execve(sys.executable, [sys.executable, *rest], os.environ | ISA_ENV[argv[at + 1]])
