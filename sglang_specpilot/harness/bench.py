"""Benchmark runner: a registry of suites and the writer of ``benchmarks/results/<suite>_<gpu>.json``.

A suite is a function ``(args) -> dict`` registered by name::

    @register_suite("w12_gemm", add_args=lambda p: p.add_argument("--m", type=int, default=1))
    def w12_gemm(args):
        ...
        return {"metrics": {...}, "rows": [...], "peaks": measure_peaks().to_dict()}

``run_suite`` runs it and writes one file in the format of BENCHMARKS.md: the suite's ``metrics``,
``rows`` and ``peaks`` (and any other keys it returns, e.g. ``"weights": "synthetic"``) under a header
that records what was measured where: commit, dirty flag, UTC date, GPU, versions and command line.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import os
import platform
import re
import shlex
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from .jsonable import to_jsonable

SuiteFn = Callable[[argparse.Namespace], dict]
# Modules whose import registers suites; main() imports them before looking a suite up.
BUILTIN_SUITE_MODULES = (
    "sglang_specpilot.harness.selftest_suite",
    "sglang_specpilot.suites.batched",
    "sglang_specpilot.suites.colocate",
    "sglang_specpilot.suites.e2e",
    "sglang_specpilot.suites.foundation",
    "sglang_specpilot.suites.hybrid",
    "sglang_specpilot.suites.noise",
    "sglang_specpilot.suites.rounds",
    "sglang_specpilot.suites.tlv",
    "sglang_specpilot.suites.trees",
    "sglang_specpilot.suites.tune",
    "sglang_specpilot.suites.w12_bits",
    "sglang_specpilot.suites.w12_gemm",
    "sglang_specpilot.suites.w12_ar",
)
RESULTS_SUBDIR = Path("benchmarks") / "results"  # the committed results: written only with --results-dir
RUNS_DIR = Path("specpilot-runs")  # a user's runs, by default: ./specpilot-runs/<suite>-<UTC time>/
HEADER_KEYS = ("suite", "commit", "dirty", "date", "gpu", "versions", "command")


@dataclass
class Suite:
    name: str
    fn: SuiteFn
    add_args: Callable[[argparse.ArgumentParser], None] | None = None
    help: str = ""


_SUITES: dict[str, Suite] = {}


def register_suite(
    name: str, *, add_args: Callable[[argparse.ArgumentParser], None] | None = None, help: str = ""
) -> Callable[[SuiteFn], SuiteFn]:
    """Decorator registering ``fn(args) -> {"metrics": .., "rows": .., "peaks": ..}`` as suite ``name``.

    ``add_args(parser)`` adds the suite's own command-line options; ``help`` defaults to the first
    line of the function's docstring.
    """
    if not re.fullmatch(r"[a-z0-9_]+", name):
        raise ValueError(f"suite name {name!r} must be lowercase letters, digits and underscores")

    def wrap(fn: SuiteFn) -> SuiteFn:
        if name in _SUITES and _SUITES[name].fn is not fn:
            raise ValueError(f"suite {name!r} is already registered by {_SUITES[name].fn.__module__}")
        doc = help or (fn.__doc__ or "").strip().split("\n")[0]
        _SUITES[name] = Suite(name=name, fn=fn, add_args=add_args, help=doc)
        return fn

    return wrap


_UNAVAILABLE: dict[str, ModuleNotFoundError] = {}  # built-in suite modules whose imports are not installed


def suites() -> dict[str, Suite]:
    """The registered suites by name (after importing the built-in suite modules). A module whose optional
    dependency is missing (triton, without the kernels extra) is skipped and remembered in
    ``_UNAVAILABLE``; running one of its suites raises that ModuleNotFoundError."""
    for module in BUILTIN_SUITE_MODULES:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name is None or e.name.split(".")[0] in ("sglang_specpilot", "w12", "tree_verify"):
                raise  # our own code is missing: a real error
            _UNAVAILABLE[module] = e
    return dict(_SUITES)


def _unavailable_suite(name: str) -> ModuleNotFoundError | None:
    return next((e for m, e in _UNAVAILABLE.items() if m.rsplit(".", 1)[-1] == name), None)


def gpu_name(device: str | torch.device | None = None) -> str:
    """Name of the device measured: ``torch.cuda.get_device_name`` of a CUDA device, else ``"cpu"``.

    ``device=None`` means the current CUDA device when there is one.
    """
    if device is None:
        return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def gpu_slug(name: str) -> str:
    """File-name form of a device name: ``"NVIDIA H200"`` -> ``"h200"``, ``"cpu"`` -> ``"cpu"``."""
    words = re.sub(r"\b(nvidia|geforce|tesla)\b", " ", name.lower())
    return re.sub(r"[^a-z0-9]+", "-", words).strip("-") or "unknown"


def _git(repo: Path, *args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def repo_root(start: Path | None = None) -> Path:
    """The git work tree containing ``start`` (default the current directory), else ``start``."""
    start = Path.cwd() if start is None else start
    top = _git(start, "rev-parse", "--show-toplevel")
    return Path(top.strip()) if top else start


def provenance(repo: Path | None = None, device: str | torch.device | None = None) -> dict:
    """Commit, dirty flag, UTC date, GPU (of ``device``, see ``gpu_name``) and versions for a header.

    ``dirty`` ignores ``benchmarks/results/`` (rewriting a result must not make the next run dirty).
    Without git or a commit, ``commit`` is ``"unknown"`` and ``dirty`` is true: such a run cannot be
    reproduced from a commit.
    """
    repo = repo_root(repo)
    head = _git(repo, "rev-parse", "HEAD")
    status = _git(repo, "status", "--porcelain", "--", ".", f":(exclude){RESULTS_SUBDIR.as_posix()}")
    if os.environ.get("SPECPILOT_COMMIT"):
        # A GPU machine that gets a copy of the work tree: whoever sends the copy states its commit and whether
        # the tree was clean (SPECPILOT_DIRTY=0). This wins over git there: the device's copy carried a stale
        # .git of an older commit, and its header named that commit, dirty (H200, 2026-11-29).
        head = os.environ["SPECPILOT_COMMIT"]
        status = "" if os.environ.get("SPECPILOT_DIRTY") == "0" else None
    versions = {"python": platform.python_version(), "torch": torch.__version__}
    try:
        import triton

        versions["triton"] = triton.__version__
    except ImportError:
        pass
    versions["cuda"] = torch.version.cuda
    return {
        "commit": head.strip() if head else "unknown",
        "dirty": head is None or status is None or bool(status.strip()),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "gpu": gpu_name(device),
        "versions": versions,
    }


def _check_result(name: str, result: dict) -> None:
    if not isinstance(result, dict) or "metrics" not in result:
        raise TypeError(f"suite {name!r} must return a dict with 'metrics'")
    clash = set(result) & set(HEADER_KEYS)
    if clash:
        raise ValueError(f"suite {name!r} returned header keys {sorted(clash)}; the runner writes those")
    for key, value in result["metrics"].items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"metric {key!r} of suite {name!r} is {value!r}; metrics are flat numbers")


def _parser(suite: Suite) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"specpilot bench {suite.name}", description=suite.help)
    parser.add_argument(
        "--results-dir",
        type=Path,
        default=None,
        help=f"where to write the JSON file (default: a new run folder ./{RUNS_DIR.as_posix()}/SUITE-TIME; the "
        f"committed results live in <repo>/{RESULTS_SUBDIR.as_posix()}, written only when named here)",
    )
    if suite.add_args is not None:
        suite.add_args(parser)
    return parser


def run_suite(name: str, argv: Sequence[str] = (), *, command: str | None = None) -> Path:
    """Run suite ``name`` with its options ``argv`` and write its results file.

    Parameters
    ----------
    name : str
        A registered suite.
    argv : sequence of str
        The suite's options, e.g. ``["--blocks", "20", "--results-dir", "/tmp/r"]``.
    command : str, optional
        The command line recorded in the file; default ``specpilot bench NAME ARGV..``.

    Returns
    -------
    Path
        ``<results-dir>/<name>_<gpu-slug>.json``.
    """
    table = suites()
    if name not in table:
        raise KeyError(f"unknown suite {name!r}; known: {', '.join(sorted(table)) or 'none'}")
    suite = table[name]
    args = _parser(suite).parse_args(list(argv))
    # A suite with a --device option names the device it measured (a CPU run on a GPU host is "cpu").
    header = {"suite": name, **provenance(device=getattr(args, "device", None))}
    header["command"] = command or shlex.join(["specpilot", "bench", name, *argv])
    result = suite.fn(args)
    _check_result(name, result)
    record = {**header, "peaks": result.get("peaks", {}), "metrics": result["metrics"]}
    record["rows"] = result.get("rows", [])
    record.update({k: v for k, v in result.items() if k not in record})
    out_dir = args.results_dir or default_run_dir(name)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}_{gpu_slug(record['gpu'])}.json"
    path.write_text(json.dumps(to_jsonable(record), indent=2) + "\n")
    return path


def default_run_dir(name: str) -> Path:
    """A fresh folder for one run of suite ``name`` under ``./specpilot-runs`` (never the committed results)."""
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M%S")
    out, n = RUNS_DIR / f"{name}-{stamp}", 1
    while out.exists():
        n += 1
        out = RUNS_DIR / f"{name}-{stamp}-{n}"
    return out


def _suite_position(argv: list[str]) -> int:
    # Options before the suite name belong to the runner; everything after it to the suite.
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        i += 2 if argv[i] == "--import" else 1
    return min(i, len(argv))


def main(argv: Sequence[str] | None = None) -> int:
    """``specpilot bench [--import MODULE].. SUITE [suite options]``; ``--list`` names the suites.

    Also ``python -m sglang_specpilot.harness ...`` with the same arguments.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    top = argparse.ArgumentParser(prog="specpilot bench", add_help=False)
    top.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE")
    top.add_argument("--list", action="store_true")
    top.add_argument("-h", "--help", action="store_true")
    split = _suite_position(argv)
    opts = top.parse_args(argv[:split])
    for module in opts.imports:
        importlib.import_module(module)
    table = suites()
    if split == len(argv):
        print(top.format_usage().rstrip() + " SUITE [suite options]")
        for name, suite in sorted(table.items()):
            print(f"  {name:<20} {suite.help}")
        for module, e in sorted(_UNAVAILABLE.items()):
            print(f"  {module.rsplit('.', 1)[-1]:<20} (not available: needs {e.name!r}; "
                  "pip install 'sglang-specpilot[kernels]')")  # fmt: skip
        return 0 if (opts.list or opts.help) else 2
    name, suite_argv = argv[split], argv[split + 1 :]
    if name not in table and _unavailable_suite(name) is not None:
        raise _unavailable_suite(name)  # the CLI names the extra in one line
    if name not in table:
        print(f"specpilot bench: unknown suite {name!r}; known: {', '.join(sorted(table))}", file=sys.stderr)
        return 2
    path = run_suite(name, suite_argv, command=shlex.join(["specpilot", "bench", *argv]))
    print(path)
    return 0
