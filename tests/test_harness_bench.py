import json
import shutil
from pathlib import Path

import pytest

from sglang_specpilot.harness import bench, headline, report
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


TABLES = "# Benchmarks\n\nIntro.\n\n## Results\n\n<!-- results:begin -->\nold text\n<!-- results:end -->\n\nTail.\n"
README = "# SpecPilot\n\n## Headline results\n\n<!-- headline:begin -->\nold\n<!-- headline:end -->\n\nMore.\n"
REPO = Path(__file__).resolve().parents[1]
COMMITTED = REPO / "benchmarks" / "results"


def test_tables_regeneration_is_idempotent(tmp_path, selftest_file):
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
    tables = tmp_path / "README.md"
    tables.write_text(TABLES)
    assert report.update_tables(tables, results) is True
    first = tables.read_text()
    assert report.update_tables(tables, results) is False
    assert tables.read_text() == first
    assert "old text" not in first and first.startswith("# Benchmarks\n") and first.endswith("\nTail.\n")
    assert "| commit | `0123456` |" in first and "| gemm_speedup_geomean_m1_llama8b | 1.312 |" in first
    assert "| tokens | 128,256 |" in first and "### w12_gemm · NVIDIA H200" in first
    assert first.index("### selftest") < first.index("### w12_gemm")


def _rounds_row() -> int:
    """Index of the headline row read from a rounds file's lookup metrics."""
    return next(i for i, h in enumerate(headline.HEADLINES) if h.file.startswith("rounds") and "lookup" in h.what)


def _copies(tmp_path):
    """The committed results and fresh README / benchmarks README files with stale sections, in tmp_path."""
    results = tmp_path / "results"
    shutil.copytree(COMMITTED, results)
    readme, tables = tmp_path / "README.md", tmp_path / "tables.md"
    readme.write_text(README)
    tables.write_text(TABLES)
    return ["--readme", str(readme), "--tables", str(tables), "--results", str(results)], readme, tables, results


def test_results_command_writes_the_headline_and_the_tables(tmp_path):
    args, readme, tables, results = _copies(tmp_path)
    assert report.main([*args, "--check"]) == 1
    assert readme.read_text() == README and tables.read_text() == TABLES  # --check writes nothing
    assert report.main(args) == 0
    head, full = readme.read_text(), tables.read_text()
    assert report.main([*args, "--check"]) == 0 and report.main(args) == 0
    assert (readme.read_text(), tables.read_text()) == (head, full)  # the same bytes again
    # The headline: one row per entry, each cell from its file (GPU and commit included).
    rows = [ln for ln in head.splitlines() if ln.startswith("| ") and "---" not in ln][1:]
    assert len(rows) == len(headline.HEADLINES)
    first = _rounds_row()
    lookup = json.loads((results / headline.HEADLINES[first].file).read_text())
    gpu = headline.gpu_label(lookup["gpu"])
    assert rows[first].startswith(f"| {gpu} | SmolLM2-135M-Instruct (real weights) | 1 |")
    m, by = lookup["metrics"], lookup.get("metric_commits", {})
    cell = f"| {m['smollm2_lookup_tok_s_bs1']:,.0f} vs {m['smollm2_ar_tok_s_bs1']:,.0f} tokens/s "
    cell += f"({m['smollm2_lookup_speedup_vs_ar_bs1']:.2f}x) |"
    # The commit of the run that measured the row's metrics (a merged file holds several runs).
    commit = str(by.get("smollm2_lookup_tok_s_bs1", lookup["commit"]))[:7]
    dirty = any(r.get("dirty") for r in lookup.get("runs", []) if str(r.get("commit"))[:7] == commit)
    assert f"| `{commit}`{' (dirty)' if dirty else ''} |" in rows[first] and cell in rows[first]
    # The e2e rows lead: the lifted 8B stand-in, labelled as such, its speedup read from its e2e file.
    e2e = json.loads((results / headline.HEADLINES[0].file).read_text())
    assert headline.HEADLINES[0].file.startswith("e2e_")
    gpu = headline.gpu_label(e2e["gpu"])
    assert rows[0].startswith(f"| {gpu} | SmolLM2-135M lifted to Llama-3.1-8B shapes (stand-in, timing)")
    assert f"({e2e['metrics']['e2e_speedup_vs_ar_bs1']:.2f}x;" in rows[0]
    assert rows[-1].startswith("| CPU |") and "| 12.04 |" in rows[-1]
    assert "### rounds · NVIDIA H200" in full and "### w12_bits · cpu" in full and "| metric |" not in head
    # A changed measurement changes the generated cell.
    doc = json.loads((results / "w12_bits_cpu.json").read_text())
    doc["metrics"]["smollm2_135m.linear.bits_per_weight"] = 12.5
    (results / "w12_bits_cpu.json").write_text(json.dumps(doc))
    assert report.main([*args, "--check"]) == 1 and report.main(args) == 0 and "| 12.50 |" in readme.read_text()


def test_the_committed_readmes_are_generated_from_the_committed_results():
    args = ["--readme", str(REPO / "README.md"), "--tables", str(REPO / "benchmarks" / "README.md")]
    assert report.main([*args, "--results", str(COMMITTED), "--check"]) == 0, "run `make results`"


def test_a_headline_row_without_its_file_or_metric_is_an_error(tmp_path, capsys):
    args, readme, tables, results = _copies(tmp_path)
    tau_file = next(h.file for h in headline.HEADLINES if "MT-Bench turn 1" in h.what)
    (results / tau_file).unlink()
    assert report.main(args) == 2 and tau_file in capsys.readouterr().err
    assert readme.read_text() == README
    rounds_file = headline.HEADLINES[_rounds_row()].file
    doc = json.loads((results / rounds_file).read_text())
    del doc["metrics"]["smollm2_lookup_tok_s_bs1"]
    (results / rounds_file).write_text(json.dumps(doc))
    with pytest.raises(headline.HeadlineError, match=f"{rounds_file} has no metric 'smollm2_lookup_tok_s_bs1'"):
        headline.render_headline(results, headline.HEADLINES[_rounds_row() : _rounds_row() + 1])


def test_a_file_without_markers_is_an_error(tmp_path, capsys):
    args, readme, tables, _ = _copies(tmp_path)
    tables.write_text("# no markers\n")
    with pytest.raises(report.MarkersError, match="results:begin"):
        report.update_tables(tables, tmp_path)
    assert report.main(args) == 2
    assert "results:begin" in capsys.readouterr().err
    assert tables.read_text() == "# no markers\n" and readme.read_text() == README
    tables.write_text(TABLES)
    readme.write_text("# no headline markers\n")
    assert report.main(args) == 2 and "headline:begin" in capsys.readouterr().err


def test_gpu_labels():
    assert [headline.gpu_label(g) for g in ("NVIDIA H200", "cpu", "AMD MI300X")] == ["H200", "CPU", "AMD MI300X"]


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


def test_every_committed_result_names_its_commit_gpu_date_and_command():
    """A measurement without its provenance cannot be re-run or compared (the standard: commit, GPU, versions,
    command); two probe files once landed without a header and rendered as "commit unknown"."""
    missing = {}
    for path in sorted(COMMITTED.glob("*.json")):
        doc = json.loads(path.read_text())
        lacks = [k for k in ("commit", "gpu", "date", "command", "versions") if not doc.get(k)]
        if lacks or str(doc.get("commit")) == "unknown":
            missing[path.name] = lacks or ["commit"]
    assert not missing, missing


def test_the_batched_grid_and_the_headline_share_the_readme(tmp_path):
    args, readme, tables, results = _copies(tmp_path)
    readme.write_text(README + f"\n{report.GRID_BEGIN}\nstale\n{report.GRID_END}\ntail\n")
    assert report.main(args) == 0
    text = readme.read_text()
    assert "stale" not in text and text.endswith("tail\n")
    assert "| N | AR |" in text and "headline" in text  # both sections written, neither lost to the other
    doc = json.loads((results / report.BATCHED_GRID_FILE).read_text())
    doc["cells"] = [c for c in doc["cells"] if not (c["system"] == "ar" and c["concurrency"] == 1)]
    (results / report.BATCHED_GRID_FILE).write_text(json.dumps(doc))
    assert "| 1 | - |" in report.render_grid_section(results)  # AR not run at 1: "-", never a number
