"""The SGLang 0.5 start-up hook without SGLang: the .pth, laziness, the off switch, idempotence."""

import importlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

import specpilot_sglang_hook as hook
from sglang_specpilot.sglang_plugin import hook_install, server_args_policy

ROOT = Path(__file__).resolve().parents[1]


def test_pth_install_status_uninstall(tmp_path, capsys):
    path = hook_install.install(tmp_path)
    assert path == tmp_path / hook_install.PTH_NAME
    assert path.read_text() == hook_install.PTH_LINE
    hook_install.install(tmp_path)  # idempotent: same single line
    assert path.read_text().count("\n") == 1
    assert hook_install.main(["status", "--site-dir", str(tmp_path)]) == 0
    assert hook_install.uninstall(tmp_path) is True
    assert not path.exists()
    assert hook_install.uninstall(tmp_path) is False
    assert hook_install.main(["status", "--site-dir", str(tmp_path)]) == 1
    assert "absent" in capsys.readouterr().out


def test_cli_sglang_hook(tmp_path, capsys):
    from sglang_specpilot.cli import main

    assert main(["sglang-hook", "install", "--site-dir", str(tmp_path)]) == 0
    assert (tmp_path / hook_install.PTH_NAME).read_text() == hook_install.PTH_LINE
    assert main(["sglang-hook", "uninstall", "--site-dir", str(tmp_path)]) == 0
    assert "removed" in capsys.readouterr().out and not (tmp_path / hook_install.PTH_NAME).exists()


def test_pth_line_is_harmless_when_the_package_is_gone():
    exec(hook_install.PTH_LINE.replace(hook_install.HOOK_MODULE, "no_such_specpilot_module"), {})


def _fresh(site_dir: Path, code: str, **env) -> str:
    """Run ``code`` in a new interpreter that processes ``site_dir``'s .pth files before the code."""
    full_env = {k: v for k, v in os.environ.items() if k != hook.ENV_SWITCH}
    full_env.update(PYTHONPATH=str(ROOT), **env)
    prog = f"import site; site.addsitedir({str(site_dir)!r})\n" + textwrap.dedent(code)
    out = subprocess.run([sys.executable, "-c", prog], env=full_env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


PROBE = """
    import sys
    finders = [type(f).__name__ for f in sys.meta_path].count("SpecPilotFinder")
    print(finders, "specpilot_sglang_hook" in sys.modules, "torch" in sys.modules, "sglang" in sys.modules)
"""


def test_hook_loads_lazily_from_the_pth(tmp_path):
    hook_install.install(tmp_path)
    # One finder, nothing heavy imported: the hook waits for sglang.
    assert _fresh(tmp_path, PROBE) == "1 True False False"


def test_hook_switched_off_by_env(tmp_path):
    hook_install.install(tmp_path)
    for off in ("0", "false", "OFF"):
        assert _fresh(tmp_path, PROBE, **{hook.ENV_SWITCH: off}) == "0 True False False"


def test_finder_patches_only_its_targets_once(tmp_path, monkeypatch):
    pkg = tmp_path / "fake_sglang_sp"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "target.py").write_text("VALUE = 1\n")
    (pkg / "other.py").write_text("VALUE = 2\n")
    calls = []
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(hook, "TARGETS", frozenset({"fake_sglang_sp.target"}))
    monkeypatch.setattr(hook, "_patch", lambda m: calls.append((m.__name__, m.VALUE)))
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    try:
        assert hook.install() and hook.install()
        assert [type(f).__name__ for f in sys.meta_path].count("SpecPilotFinder") == 1
        importlib.import_module("fake_sglang_sp.other")
        mod = importlib.import_module("fake_sglang_sp.target")
        assert calls == [("fake_sglang_sp.target", 1)]  # after the module's code ran
        assert mod.__spec__.loader.get_filename("fake_sglang_sp.target").endswith("target.py")
        hook.install()  # already loaded: patched again by name; patches.on_module_loaded dedups by a mark
        assert len(calls) == 2
    finally:
        for name in [n for n in sys.modules if n.startswith("fake_sglang_sp")]:
            del sys.modules[name]


def test_patches_run_once_per_module():
    from types import ModuleType

    from sglang_specpilot.sglang_plugin import patches

    seen = []
    mod = ModuleType("sglang.srt.speculative.spec_info")
    original = patches.PATCHES["sglang.srt.speculative.spec_info"]
    patches.PATCHES["sglang.srt.speculative.spec_info"] = seen.append
    try:
        patches.on_module_loaded(mod)
        patches.on_module_loaded(mod)
        patches.on_module_loaded(ModuleType("sglang.srt.something_else"))
    finally:
        patches.PATCHES["sglang.srt.speculative.spec_info"] = original
    assert seen == [mod]


def _args(**kw):
    base = dict(
        speculative_algorithm="specpilot",
        speculative_draft_model_path="/draft",
        speculative_num_steps=None,
        speculative_eagle_topk=None,
        speculative_num_draft_tokens=None,
    )
    return SimpleNamespace(**{**base, **kw})


def test_server_args_policy_defaults_and_checks():
    a = _args()
    server_args_policy.apply_defaults(a)
    assert (a.speculative_algorithm, a.speculative_num_steps, a.speculative_eagle_topk) == ("SPECPILOT", 5, 4)
    assert a.speculative_num_draft_tokens == 8
    with pytest.raises(ValueError, match="draft-model-path"):
        server_args_policy.apply_defaults(_args(speculative_draft_model_path=None))
    # 2 steps of top-2: 2 + 4 candidates, so at most 7 verify tokens with the root.
    server_args_policy.apply_defaults(
        _args(speculative_num_steps=2, speculative_eagle_topk=2, speculative_num_draft_tokens=7)
    )
    with pytest.raises(ValueError, match="2..7"):
        server_args_policy.apply_defaults(
            _args(speculative_num_steps=2, speculative_eagle_topk=2, speculative_num_draft_tokens=8)
        )


def test_server_args_take_the_tuned_profile(tmp_path, monkeypatch):
    # SPECPILOT_PROFILE (inherited by SGLang's worker processes) fills the tree shape the flags leave unset.
    doc = {"format": "specpilot-profile/1", "delta": {"tree_budget": 16, "tree_depth": 6, "tree_top_k": 3}}
    (tmp_path / "profile.json").write_text(json.dumps(doc))
    monkeypatch.setenv("SPECPILOT_PROFILE", str(tmp_path))
    a = _args()
    server_args_policy.apply_defaults(a)
    assert (a.speculative_num_steps, a.speculative_eagle_topk, a.speculative_num_draft_tokens) == (6, 3, 17)
    b = _args(speculative_eagle_topk=2)  # a flag on the command line wins over the profile
    server_args_policy.apply_defaults(b)
    assert (b.speculative_num_steps, b.speculative_eagle_topk, b.speculative_num_draft_tokens) == (6, 2, 17)
    doc["delta"] = {"num_speculative_tokens": 5}  # a tuned chain
    (tmp_path / "profile.json").write_text(json.dumps(doc))
    c = _args()
    server_args_policy.apply_defaults(c)
    assert (c.speculative_num_steps, c.speculative_eagle_topk, c.speculative_num_draft_tokens) == (5, 1, 6)
    monkeypatch.setenv("SPECPILOT_PROFILE", str(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError, match="no tuned profile"):
        server_args_policy.apply_defaults(_args())


def test_policy_runs_sglangs_standalone_handling_under_our_name():
    seen = []
    a = _args(disable_overlap_schedule=False)
    server_args_policy.handle_speculative_decoding(a, lambda s: seen.append(s.speculative_algorithm))
    assert seen == ["STANDALONE"] and a.speculative_algorithm == "SPECPILOT" and a.disable_overlap_schedule
    other = _args(speculative_algorithm="EAGLE", disable_overlap_schedule=False)
    server_args_policy.handle_speculative_decoding(other, lambda s: seen.append(s.speculative_algorithm))
    assert seen[-1] == "EAGLE" and other.disable_overlap_schedule is False
