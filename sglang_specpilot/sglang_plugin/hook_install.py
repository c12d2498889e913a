"""``specpilot sglang-hook install | uninstall | status``: the ``.pth`` that loads the SGLang 0.5 hook.

setuptools installs no ``.pth`` from pyproject.toml (``data-files`` land under ``sys.prefix``, and
editable installs skip them), so the command writes it: ``specpilot_sglang.pth`` in the current
interpreter's site-packages (or ``--site-dir``). Its one line imports ``specpilot_sglang_hook`` only if
that module can be found, so uninstalling the package without removing the ``.pth`` leaves a harmless
line, never a start-up error. Importing neither torch nor sglang, this module runs in about a millisecond.
"""

from __future__ import annotations

import argparse
import importlib.util
import sysconfig
from pathlib import Path

PTH_NAME = "specpilot_sglang.pth"
HOOK_MODULE = "specpilot_sglang_hook"
# A .pth line that starts with "import" is executed by site; everything must fit on that one line.
PTH_LINE = f"import importlib.util as _u; _u.find_spec({HOOK_MODULE!r}) is not None and __import__({HOOK_MODULE!r})\n"


def default_site_dir() -> Path:
    """The current interpreter's site-packages (the venv's, inside a venv)."""
    return Path(sysconfig.get_paths()["purelib"])


def install(site_dir: Path | None = None) -> Path:
    """Write the ``.pth`` (idempotent: the same content every time); returns its path."""
    site_dir = Path(site_dir or default_site_dir())
    if importlib.util.find_spec(HOOK_MODULE) is None:
        raise RuntimeError(f"{HOOK_MODULE} is not importable here: install sglang-specpilot first")
    site_dir.mkdir(parents=True, exist_ok=True)
    path = site_dir / PTH_NAME
    path.write_text(PTH_LINE, encoding="utf-8")
    return path


def uninstall(site_dir: Path | None = None) -> bool:
    """Remove the ``.pth``; True if there was one."""
    path = Path(site_dir or default_site_dir()) / PTH_NAME
    if path.exists():
        path.unlink()
        return True
    return False


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="specpilot sglang-hook",
        description="Register SpecPilot (--speculative-algorithm specpilot, --quantization w12) into "
        "SGLang 0.5.x in every Python process of this environment, through a .pth start-up hook. "
        "Switch it off for one run with SPECPILOT_SGLANG_PLUGIN=0.",
    )
    p.add_argument("action", choices=["install", "uninstall", "status"])
    p.add_argument("--site-dir", type=Path, default=None, help="default: this interpreter's site-packages")
    args = p.parse_args(argv)
    site_dir = args.site_dir or default_site_dir()
    if args.action == "install":
        print(f"installed {install(site_dir)}")
    elif args.action == "uninstall":
        print(f"removed {site_dir / PTH_NAME}" if uninstall(site_dir) else f"no {PTH_NAME} in {site_dir}")
    else:
        present = (site_dir / PTH_NAME).exists()
        print(f"{PTH_NAME} {'present' if present else 'absent'} in {site_dir}")
        return 0 if present else 1
    return 0
