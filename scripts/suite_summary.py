"""The closing lines of ``scripts/test.sh``: the host, every failed test again, then the sum.

``python scripts/suite_summary.py LOG...`` reads the logs of the lanes (lines may carry a lane
prefix such as ``[A] ``), collects pytest's ``FAILED <id> - <reason>`` / ``ERROR <id>`` lines and
sums each log's last ``N passed, N failed, N skipped`` line. It prints the host (CPU model, cores,
the vector features the kernels depend on), the failed tests, and last the summed line, so that the
tail of a CI log says what failed and on which machine.
"""

import os
import platform
import re
import sys


def host() -> str:
    """``"<CPU model>, <N> cores, <features>"``: the features are those the kernels' speed and
    rounding depend on (AVX-512, AVX512-BF16, AMX-BF16)."""
    cpu, flags = platform.processor() or "?", set()
    try:
        info = open("/proc/cpuinfo").read()
        cpu = re.search(r"model name\s*:\s*(.*)", info).group(1)
        flags = set(re.search(r"flags\s*:\s*(.*)", info).group(1).split())
    except (OSError, AttributeError):
        pass
    features = [f for f in ("avx512f", "avx512_bf16", "amx_bf16") if f in flags]
    return f"{cpu}, {len(os.sched_getaffinity(0))} cores, " + (" ".join(features) or "no AVX-512")


def summarize(paths) -> list:
    """The closing lines for the logs at ``paths``."""
    total = {"passed": 0, "failed": 0, "skipped": 0}
    failed = []
    for path in paths:
        lines = [re.sub(r"^\[[A-Z]\] ", "", l.strip()) for l in open(path, errors="replace")]
        failed += [l for l in lines if re.match(r"(FAILED|ERROR) \S", l)]
        last = [l for l in lines if re.fullmatch(r"\d+ passed, \d+ failed, \d+ skipped", l)]
        if last:
            for n, what in re.findall(r"(\d+) (passed|failed|skipped)", last[-1]):
                total[what] += int(n)
    out = [f"== host: {host()}"]
    if failed:
        out += [f"== failed ({len(failed)}):"] + [line[:300] for line in failed]
    return out + [f"{total['passed']} passed, {total['failed']} failed, {total['skipped']} skipped"]


if __name__ == "__main__":
    print("\n".join(summarize(sys.argv[1:])))
