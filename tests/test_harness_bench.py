import json

import pytest

from sglang_specpilot.harness import bench, report
from sglang_specpilot.harness.bench import gpu_slug, main, register_suite, run_suite

SCHEMA = {"suite", "commit", "dirty", "date", "gpu", "versions", "command", "peaks", "metrics", "rows"}
SMALL = ["--size", "32", "--blocks", "4", "--device", "cpu"]


@pytest.fixture(scope="module")
def selftest_file(tmp_path_factory):
    return run_suite("selftest", ["--results-dir", str(tmp_path_factory.mktemp("results")), *SMALL])


def test_selftest_writes_every_schema_field(selftest_file):
    assert selftest_file.name == "selftest_cpu.json"
    doc = json.loads(selftest_file.read_text())
    assert set(doc) == SCHEMA
    assert doc["suite"] == "selftest" and doc["gpu"] == "cpu"
    assert isinstance(doc["dirty"], bool)
    assert len(doc["commit"]) == 40 or doc["commit"] == "unknown"
    assert doc["date"].endswith("Z") and doc["date"][4] == "-"
    assert {"python", "torch", "cuda"} <= set(doc["versions"])
    assert doc["command"].startswith("specpilot bench selftest --results-dir ")
    assert doc["peaks"]["device"] == "cpu" and doc["peaks"]["hbm_TBps"] > 0
    assert all(isinstance(v, (int, float)) for v in doc["metrics"].values())
    assert doc["metrics"]["speedup_ci_low"] <= doc["metrics"]["speedup_ci_high"]
    # Rows hold every repeat: 4 blocks x 2 occurrences of "mm" in the block mm mm_t mm_again (mirrored).
    mm = next(r for r in doc["rows"] if r["variant"] == "mm")
    assert len(mm["times_us"]) == 4 and len(mm["times_us"][0]) == 2


def test_main_runs_a_suite_and_lists_suites(tmp_path, capsys):
    assert main(["selftest", "--results-dir", str(tmp_path), *SMALL]) == 0
    out = capsys.readouterr().out.strip()
    assert out.endswith("selftest_cpu.json")
    assert json.loads((tmp_path / "selftest_cpu.json").read_text())["command"].startswith("specpilot bench selftest")
    assert main(["--list"]) == 0 and "selftest" in capsys.readouterr().out
    assert main(["no_such_suite"]) == 2


def test_registered_suite_gets_its_own_options(tmp_path):
    def add_args(parser):
        parser.add_argument("--m", type=int, default=1)

    @register_suite("tmp_toy", add_args=add_args)
    def toy(args):
        return {"metrics": {"m": args.m}, "rows": [{"case": "toy", "M": args.m}], "weights": "synthetic"}

    try:
        doc = json.loads(run_suite("tmp_toy", ["--m", "7", "--results-dir", str(tmp_path)]).read_text())
        assert doc["metrics"] == {"m": 7} and doc["weights"] == "synthetic" and doc["peaks"] == {}
    finally:
        bench._SUITES.pop("tmp_toy")


def test_bad_suite_results_are_refused(tmp_path):
    @register_suite("tmp_bad")
    def bad(args):
        return {"metrics": {"note": "fast"}}

    try:
        with pytest.raises(TypeError):
            run_suite("tmp_bad", ["--results-dir", str(tmp_path)])
    finally:
        bench._SUITES.pop("tmp_bad")


@pytest.mark.parametrize(
    "name, slug",
    [
        ("NVIDIA H200", "h200"),
        ("NVIDIA GeForce RTX 5090", "rtx-5090"),
        ("cpu", "cpu"),
        ("NVIDIA H100 80GB HBM3", "h100-80gb-hbm3"),
    ],
)
def test_gpu_slug(name, slug):
    assert gpu_slug(name) == slug


README = "# SpecPilot\n\nIntro.\n\n## Results\n\n<!-- results:begin -->\nold text\n<!-- results:end -->\n\nTail.\n"


def test_readme_regeneration_is_idempotent(tmp_path, selftest_file):
    results = selftest_file.parent
    (results / "w12_gemm_h200.json").write_text(
        json.dumps(
            {
                "suite": "w12_gemm",
                "commit": "0123456789abcdef0123456789abcdef01234567",
                "dirty": False,
                "date": "2026-12-01T10:00:00Z",
                "gpu": "NVIDIA H200",
                "versions": {},
                "command": "specpilot bench w12_gemm",
                "peaks": {},
                "metrics": {"gemm_speedup_geomean_m1_llama8b": 1.3125, "tokens": 128256},
                "rows": [],
            }
        )
    )
    readme = tmp_path / "README.md"
    readme.write_text(README)
    assert report.update_readme(readme, results) is True
    first = readme.read_text()
    assert report.update_readme(readme, results) is False
    assert report.main(["--readme", str(readme), "--results", str(results)]) == 0
    assert readme.read_text() == first
    assert report.main(["--readme", str(readme), "--results", str(results), "--check"]) == 0
    assert "old text" not in first and first.startswith("# SpecPilot\n") and first.endswith("\nTail.\n")
    assert "| commit | `0123456` |" in first and "| gemm_speedup_geomean_m1_llama8b | 1.312 |" in first
    assert "| tokens | 128,256 |" in first and "### w12_gemm · NVIDIA H200" in first
    assert first.index("### selftest") < first.index("### w12_gemm")


def test_readme_without_markers_is_an_error(tmp_path, capsys):
    readme = tmp_path / "README.md"
    readme.write_text("# no markers\n")
    with pytest.raises(report.MarkersError, match="results:begin"):
        report.update_readme(readme, tmp_path)
    assert report.main(["--readme", str(readme), "--results", str(tmp_path)]) == 2
    assert "results:begin" in capsys.readouterr().err
    assert readme.read_text() == "# no markers\n"


def test_check_flags_a_stale_readme(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(README)
    assert report.main(["--readme", str(readme), "--results", str(tmp_path), "--check"]) == 1
    assert readme.read_text() == README


@pytest.mark.parametrize(
    "value, text",
    [
        (1.31, "1.31"),
        (0.000123, "1.23e-04"),
        (852.14, "852.1"),
        (128256, "128,256"),
        (12, "12"),
        (0.0, "0"),
        (None, "–"),
    ],
)
def test_format_metric(value, text):
    assert report.format_metric(value) == text
