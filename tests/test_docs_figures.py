"""The figures the pages repeat agree with the records they come from, and no page says a GPU never ran beside
figures a GPU measured.

The records: `benchmarks/README.md` (the benchmark suite's text and tables, which docs/benchmarks.md includes
whole), docs/benchmarks.md's own tables and paragraphs, and the figure sections of the guides (`[start:figures]`,
included into docs/benchmarks.md with pymdownx.snippets). A docs page that repeats a whole record includes it
(checked here: every guide's figure section is included, and no paragraph of the suite's text is copied into
docs/benchmarks.md beside its inclusion); a page that cannot include (README.md renders on GitHub) or that
quotes single figures keeps them, and each such figure is read here from the page and from its record (tables
by row and column, prose by a pattern) and compared.

How figures compare: a printed figure stands for every value that rounds to it, half a unit of its last digit
either way (4.81 for 4.805..4.815, 4,081 MiB for 4080.5..4081.5). The record's interval goes through the unit
conversion (MiB -> GiB: / 1024; a fraction -> %: x 100; a ratio recomputed from two printed times: the quotient
of their intervals' ends), and the page's figure agrees when its own interval overlaps the result. So a page may
print a record with fewer decimals (0.966 -> 0.97x; 4,081 MiB -> 4.0 GiB) but not a different figure (4.1 GiB,
4,081 / 1000), and a ratio must follow from the two times printed beside it. `test_the_comparison_catches_*`
feed wrong figures through the same functions. No model, no subprocess: files are read as text.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NUMBER = r"(\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?)"
GIB = 1 / 1024  # MiB -> GiB
PERCENT = 100  # a fraction -> %
FILES = ("README.md", "benchmarks/README.md", "docs/benchmarks.md", "docs/getting-started.md", "docs/guides/examples.md",
         "docs/guides/watching.md", "docs/guides/grpo.md", "docs/guides/vllm.md", "docs/guides/verifiers.md", "docs/guides/gpu.md",
         "textenv/engine/fast_path.py")


def load() -> dict[str, str]:
    return {name: (ROOT / name).read_text(encoding="utf-8") for name in FILES}


# ---- reading figures -------------------------------------------------------------------------------------------

def span(printed: str, scale: float = 1.0) -> tuple[float, float]:
    """The values a printed figure stands for (half a unit of its last digit either way), times `scale`."""
    text = printed.replace(",", "")
    half = 0.5 * 10.0 ** -len(text.partition(".")[2])
    return (float(text) - half) * scale, (float(text) + half) * scale


def ratio(numerator: str, denominator: str) -> tuple[float, float]:
    """What the quotient of two printed figures can be."""
    (a, b), (c, d) = span(numerator), span(denominator)
    return a / d, b / c


def agrees(page: str, record: tuple[float, float]) -> bool:
    low, high = span(page)
    return record[0] <= high * (1 + 1e-12) and low * (1 - 1e-12) <= record[1]


def numbers(text: str) -> list[str]:
    return re.findall(NUMBER, text.replace("*", ""))


def find(text: str, pattern: str) -> list[str]:
    """The figures at the `#`s of `pattern`, matched in `text` with runs of whitespace as one space; `…` matches
    anything short. Fails when the page no longer says it: a figure that moved must be re-pointed, not dropped."""
    regex = re.escape(" ".join(pattern.split())).replace("\\#", NUMBER).replace("#", NUMBER).replace("…", ".{0,200}?")
    match = re.search(regex, " ".join(text.split()))
    assert match, f"not found: {pattern!r}"
    return list(match.groups())


def section(text: str, start: str, end: str | None = None) -> str:
    """From the line `start` (a heading) to the next heading of its level or above; or from `start` to `end`."""
    if end is not None:
        begin = text.index(start)
        return text[begin:text.index(end, begin)]
    level, kept, inside = len(start) - len(start.lstrip("#")), [], False
    for heading, body in sections(text):
        if inside and len(heading) - len(heading.lstrip("#")) <= level:
            break
        inside = inside or heading == start
        kept += [heading, body] if inside else []
    assert kept, f"no heading {start!r}"
    return "\n".join(kept)


def figures_section(text: str) -> str:
    return section(text, "<!-- --8<-- [start:figures] -->", "<!-- --8<-- [end:figures] -->")


def row(text: str, first: str, header: str | None = None) -> dict[str, str]:
    """The one table row whose first cell starts with `first` (in tables whose first header cell starts with
    `header`), as {column header: cell}; `first` ending in " |" asks for the whole cell."""
    found = []
    for block in re.findall(r"(?:^\|.*\n?)+", text, re.M):
        lines = [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in block.splitlines()]
        if header is None or lines[0][0].startswith(header):
            found += [dict(zip(lines[0], cells)) for cells in lines[2:] if (cells[0] + " |").startswith(first)]
    assert len(found) == 1, f"{len(found)} table rows start with {first!r} (header {header!r})"
    return found[0]


Claim = tuple[str, str, tuple[float, float]]  # what, the page's printed figure, the record's interval


def pairs(what: str, page: list[str], record: list[str], scale: float = 1.0) -> list[Claim]:
    """The page's figures against the record's, in order, the record's times `scale`."""
    assert len(page) == len(record), f"{what}: page {page} against record {record}"
    return [(f"{what} #{i + 1}", p, span(r, scale)) for i, (p, r) in enumerate(zip(page, record))]


def disagreements(claims: list[Claim]) -> list[str]:
    return [f"{what}: the page says {page}, the record gives {low:.5g}..{high:.5g}"
            for what, page, (low, high) in claims if not agrees(page, (low, high))]


# ---- what each page repeats ------------------------------------------------------------------------------------

HEADLINE = (  # README row -> (record, its row, its table's first header, its columns (name, scale), ratio (num, den, at))
    ("32 calculator episodes", ("docs/benchmarks.md", "rollout (32 calculator", "workload"),
     (("reference s", 1), ("textenv s", 1), ("speed-up", 1)), (0, 1, 2)),
    ("32 episodes of up to 8 turns", ("docs/benchmarks.md", "turns (32 episodes, max_turns 8), against", "workload"),
     (("reference s", 1), ("textenv s", 1), ("speed-up", 1)), (0, 1, 2)),
    ("32 Gym episodes x 6 turns |", ("docs/benchmarks.md", "gym (32 episodes x 6 turns, `chat` env), Gym", "workload"),
     (("reference s", 1), ("textenv s", 1), ("speed-up", 1)), (0, 1, 2)),
    ("a PPO step", ("docs/benchmarks.md", "ppo-step (8 episodes", "workload"),
     (("legacy s", 1), ("legacy peak RSS MiB", GIB), ("textenv s", 1), ("speed-up", 1), ("textenv peak RSS MiB", GIB)),
     (0, 2, 3)),
    ("the same on 8 prompts", ("docs/benchmarks.md", "ppo-step-varied", "workload"),
     (("legacy s", 1), ("legacy peak RSS MiB", GIB), ("textenv s", 1), ("speed-up", 1), ("textenv peak RSS MiB", GIB)),
     (0, 2, 3)),
    ("32 Gym episodes x 6 turns on one vLLM server", ("benchmarks/README.md", "32 episodes x 6 turns, chat", "gym shape"),
     (("client loop s", 1), ("textenv GymScheduler s", 1), ("ratio", 1)), (1, 0, 2)),
)


def headline_claims(t: dict[str, str]) -> list[Claim]:
    """README's "Headline figures" table against docs/benchmarks.md's and the suite's tables."""
    claims: list[Claim] = []
    readme = section(t["README.md"], "## Headline figures")
    for label, (record, first, header), columns, (num, den, at) in HEADLINE:
        page_row = row(readme, label, "what")
        page = numbers(page_row["reference"]) + numbers(page_row["textenv"])
        source = row(t[record], first, header)
        assert len(page) == len(columns), f"README {label}: {page}"
        for (column, scale), figure in zip(columns, page):
            claims.append((f"README {label.rstrip(' |')}: {column}" + (" / 1024" if scale == GIB else ""), figure,
                           span(numbers(source[column])[0], scale)))
        claims.append((f"README {label.rstrip(' |')}: ratio of its times", page[at], ratio(page[num], page[den])))
    return claims


def demo_claims(t: dict[str, str]) -> list[Claim]:
    """The first run's figures (getting started's figure section) where the README and the guides repeat them."""
    started = figures_section(t["docs/getting-started.md"])
    record = find(started, "sampled accuracy #% -> #%, greedy #% -> #%, # PPO steps of # episodes, # minutes in all, "
                           "# GiB peak memory")
    readme = find(t["README.md"], "**#% -> #% sampled, #% -> #% greedy**, # PPO steps of # episodes, # minutes, # GiB")
    examples = t["docs/guides/examples.md"]
    demo = row(examples, "`textenv demo` (calculator)", "example")
    in_table = [n for column in ("sampled before -> after", "greedy before -> after", "wall time", "peak memory")
                for n in numbers(demo[column])]
    watching = find(t["docs/guides/watching.md"], "#% -> #% sampled and #% -> #% greedy, in # minutes")
    one_thread = find(examples, "(the demo took # minutes that way")
    grpo = find(t["docs/guides/grpo.md"], "the PPO demo's # min here against the # min on")
    return (pairs("README's first run", readme, record) + pairs("examples' demo row", in_table, record[:4] + record[6:])
            + pairs("watching's demo run", watching, record[:4] + one_thread)
            + pairs("GRPO guide's demo time", grpo[1:], record[6:7]))


def grpo_claims(t: dict[str, str]) -> list[Claim]:
    """The GRPO guide's tables and sentences against the examples' table and the suite's grpo-vs-trl tables."""
    grpo, examples, suite = t["docs/guides/grpo.md"], t["docs/guides/examples.md"], t["benchmarks/README.md"]
    claims: list[Claim] = []
    columns = ("sampled before -> after", "greedy before -> after", "wall time", "peak memory")
    for mine, theirs in (("`textenv demo --algorithm grpo`", "`textenv demo --algorithm grpo`"),
                         ("`examples/gym_env.py` (guess", "`examples/gym_env.py` again"),
                         ("`examples/gym_env.py --algorithm grpo`", "`examples/gym_env.py --algorithm grpo`")):
        page, record = row(grpo, mine, "run"), row(examples, theirs, "example")
        claims += pairs(f"GRPO guide's {mine}", [n for c in columns for n in numbers(page[c])],
                        [n for c in columns for n in numbers(record[c])])
    trl, mine_col = "TRL 1.16.0 GRPOTrainer", "textenv GRPO"
    for page_first, first, scale in (("wall s per step", "wall s per step", 1), ("... of which playing", "... of which", 1),
                                     ("peak RSS after training", "peak RSS MiB after", GIB),
                                     ("held-out greedy accuracy", "held-out greedy accuracy", PERCENT),
                                     ("mean training reward", "mean reward", 1)):
        page, record = row(grpo, page_first), row(suite, first, "grpo-vs-trl")
        claims += pairs(f"GRPO guide's {page_first}, TRL", numbers(page["TRL 1.16 GRPOTrainer"]), numbers(record[trl]), scale)
        claims += pairs(f"GRPO guide's {page_first}, textenv", numbers(page[mine_col]), numbers(record[mine_col]), scale)
        if page["textenv / TRL"]:
            claims += pairs(f"GRPO guide's {page_first}, ratio", numbers(page["textenv / TRL"])[:1],
                            numbers(record["textenv / TRL"]))
    step = row(suite, "wall s per step", "grpo-vs-trl")
    claims.append(("GRPO guide's speed against TRL", find(grpo, "0.58x (#x the speed)")[0],
                   ratio(numbers(step[trl])[0], numbers(step[mine_col])[0])))
    packed, padded = "textenv GRPO (packed)", "textenv GRPO, padded"
    per_step, training = row(suite, "per step", "wall s (median"), row(suite, "... training", "wall s (median")
    memory = row(suite, "peak RSS MiB after training", "wall s (median")
    page = find(grpo, "a step took # s packed against # s with `share_prompt_prefix=False` (#x the speed; training # s "
                      "against # s) and # s in TRL 1.16's `GRPOTrainer` (#x), at # GiB peak memory against # and # GiB")
    record = [per_step[packed], per_step[padded], numbers(per_step["packed / padded"])[1], training[packed],
              training[padded], per_step[trl]]
    claims += pairs("GRPO guide's shared prefixes", page[:6], [numbers(r)[0] for r in record])
    claims.append(("GRPO guide's shared prefixes against TRL", page[6], ratio(per_step[trl], per_step[packed])))
    claims += pairs("GRPO guide's shared-prefix memory", page[7:], [memory[packed], memory[padded], memory[trl]], GIB)
    smallest = row(suite, "`--grpo-shots 0", "shape")["speed-up (step / training)"]
    claims += pairs("GRPO guide's smallest gain", find(grpo, "The smallest gain measured: #x"), numbers(smallest)[:1])
    largest = row(suite, "`--grpo-shots 4", "shape")["peak RSS packed / padded"]
    claims += pairs("GRPO guide's 924-token step", find(grpo, "the packed one took # GiB"), numbers(largest)[:1], GIB)
    return claims


def vllm_claims(t: dict[str, str]) -> list[Claim]:
    """The vLLM guide's figures (and the engine's GPU warning) against the suite's and docs/benchmarks.md's."""
    guide, suite, bench = t["docs/guides/vllm.md"], t["benchmarks/README.md"], t["docs/benchmarks.md"]
    figures = figures_section(guide)
    claims: list[Claim] = []
    page = find(figures, "the naive per-turn `generate` loop # s; textenv's in-process engine # s (#x); vLLM's own offline "
                         "loop # s in float32 (#x) and # s in bfloat16 (#x); textenv colocated # s in float32 (#x, #x "
                         "vLLM's loop) and # s in bfloat16 (#x, #x); a vLLM server # s in float32 (#x)")
    wide, narrow, own = "32 episodes x 6 turns", "8 episodes x 3 turns", "x vLLM's own loop, same dtype"
    record = [numbers(row(suite, "naive", wide)["s (runs)"])[0]]
    for side, columns in (("in-process", ("x naive",)), ("vllm-loop float32", ("x naive",)),
                          ("vllm-loop bfloat16", ("x naive",)), ("colocated float32", ("x naive", own)),
                          ("colocated bfloat16", ("x naive", own)), ("server float32", ("x naive",))):
        cells = row(suite, side, wide)
        record += [numbers(cells["s (runs)"])[0]] + [numbers(cells[c])[0] for c in columns]
    claims += pairs("vLLM guide's colocated 32 x 6", page, record)
    claims += pairs("vLLM guide's colocated 8 x 3", find(figures, "colocated textenv took #x (float32) and #x (bfloat16)"),
                    [numbers(row(suite, side, narrow)[own])[0] for side in ("colocated float32", "colocated bfloat16")])
    for first, pattern in (("rollout, 32 calculator", "rollout 32 episodes legacy # s, in-process # s, vLLM # s"),
                           ("gym, 32 episodes x 6", "gym 32 x 6 naive # s, in-process # s, vLLM # s")):
        cells = row(figures, first, "workload")
        ref, (inproc, inproc_x), (served, served_x) = (numbers(cells[c]) for c in ("reference s", "in-process engine s",
                                                                                   "on vLLM s"))
        claims += pairs(f"vLLM guide's {first}", ref + [inproc, served], find(suite, pattern))
        claims += [(f"vLLM guide's {first}: in-process ratio", inproc_x, ratio(ref[0], inproc)),
                   (f"vLLM guide's {first}: vLLM ratio", served_x, ratio(ref[0], served))]
    (gym, naive, gym_x, inproc, inproc_x, same, episodes, turns, turns_vllm, legacy, turns_x, turns_inproc, turns_inproc_x,
     turns_same) = find(figures, "gym 32 x 6 on vLLM # s against the naive loop's # s (#x; in-process engine, fp32: # s, "
                                 "#x), #/32 episodes token-identical to fp32 (bf16 rounding); turns (# episodes, max_turns "
                                 "#) on vLLM # s against legacy's # s (#x; in-process # s, #x), #/32 identical")
    bf16 = find(suite, "gym on vLLM # s (#x the naive loop, #/32 identical to fp32), turns on vLLM # s against legacy's # "
                       "s (#/32 identical)")
    claims += pairs("vLLM guide's bf16 server", [gym, gym_x, same, turns_vllm, legacy, turns_same], bf16)
    claims += pairs("vLLM guide's naive loop", [naive], find(suite, "gym 32 x 6 naive # s"))
    claims += [("vLLM guide's bf16 in-process ratio", inproc_x, ratio(naive, inproc)),
               ("vLLM guide's bf16 turns ratio", turns_x, ratio(legacy, turns_vllm)),
               ("vLLM guide's bf16 turns in-process ratio", turns_inproc_x, ratio(legacy, turns_inproc))]
    claims += pairs("vLLM guide's best", find(figures, "not reached on this CPU (#x at best)"), [bf16[1]])
    loop = {shape: row(suite, shape, "gym shape") for shape in ("32 episodes x 6", "8 x 3", "16 x 4")}
    ratios = [numbers(r["ratio"])[0] for r in loop.values()] + [numbers(loop["32 episodes x 6"]["TextEnvironment s"])[1]]
    low, high = find(figures, "textenv's episodes take #-#x the loop's time")
    claims += [("vLLM guide's client-loop range, low", low, span(min(ratios, key=float))),
               ("vLLM guide's client-loop range, high", high, span(max(ratios, key=float)))]
    page = find(figures, "32 x 6, the loop # s, GymScheduler # s, TextEnvironment # s; 8 x 3, # against # s; ms-swift's "
                         "math prompts 16 x 4, 64 tokens, # against # s")
    record = [numbers(loop["32 episodes x 6"][c])[0] for c in ("client loop s", "textenv GymScheduler s", "TextEnvironment s")]
    record += [numbers(loop[s][c])[0] for s in ("8 x 3", "16 x 4") for c in ("client loop s", "textenv GymScheduler s")]
    claims += pairs("vLLM guide's client loop", page, record)
    gpu = section(t["docs/guides/gpu.md"], "## What ran on a GPU, and what did not")
    page = find(gpu, "GymScheduler on the engine # s against # s for a plain per-turn `generate` loop (# episodes x # "
                     "turns, #x), # s against # s (64 x 6, # engine runs, #x) and # s against # s (8 x 3, #x); an "
                     "earlier H100 run gave # s against # s (32 x 6)")
    h200 = find(bench, "32 x 6: # s (# tok/s) against # s (# tok/s), #x; 64 x 6: # s (# runs) against # s (# tok/s), #x; "
                       "8 x 3, the worst case (a second call, # runs per side): # s against # s, #x")
    h100 = find(bench, "32 x 6 chat: # s against # s")
    claims += pairs("GPU page's H200 figures", [page[i] for i in (0, 1, 4, 5, 6, 7, 8, 9, 10, 11)],
                    [h200[i] for i in (0, 2, 4, 5, 7, 6, 9, 11, 12, 13)])
    claims += pairs("GPU page's H100 figures", page[12:], [h100[1], h100[0]])
    claims += [(f"GPU page's H200 ratio {i}", page[x], ratio(page[b], page[a])) for i, (a, b, x) in
               enumerate(((0, 1, 4), (5, 6, 8), (9, 10, 11)))]
    h200_ratios = [h200[4], h200[9], h200[13]]
    warning = find(t["textenv/engine/fast_path.py"], "measured #-#x the speed")
    return claims + pairs("the engine's GPU warning", warning, [min(h200_ratios, key=float), max(h200_ratios, key=float)])


def other_claims(t: dict[str, str]) -> list[Claim]:
    """The verifiers guide's and docs/benchmarks.md's own quotes of the suite's figures."""
    guide, suite, bench = t["docs/guides/verifiers.md"], t["benchmarks/README.md"], t["docs/benchmarks.md"]
    claims: list[Claim] = []
    for name in ("arithmetic", "alphabet_sort"):
        page, record = row(guide, f"`{name}`", "environment"), row(suite, name, "environment")
        claims += pairs(f"verifiers guide's {name}",
                        [numbers(page[c])[0] for c in ("verifiers", "textenv")] + numbers(page["textenv / verifiers"])
                        + numbers(page["same reward"]),
                        [numbers(record[c])[-1] for c in ("verifiers", "textenv")] + numbers(record["textenv / verifiers"])
                        + numbers(record["same reward"]))
    spread = "(arithmetic: verifiers #-# s, textenv #-# s"
    claims += pairs("verifiers guide's spread", find(guide, spread), find(suite, spread))
    first = row(suite, "rollout (32 episodes, max_turns 4)", "workload")
    page = find(bench, "lower than the #x of the 5.23 table below mainly because legacy ran faster that day (# s against # s)")
    claims += pairs("benchmarks page's 5.23 rollout", page, [numbers(first["speed-up"])[0], first["legacy s"],
                                                            row(bench, "rollout (32 calculator", "workload")["reference s"]])
    page = find(bench, "legacy's rollout took # s against # s")
    gym_run = row(bench, "rollout (32 episodes, max_turns 4), legacy TRL against", "workload")
    return claims + pairs("benchmarks page's slower day", page, [gym_run["naive loop s"], first["legacy s"]])


GROUPS = {"README headline table": headline_claims, "the first run": demo_claims, "GRPO guide": grpo_claims,
          "vLLM guide and engine warning": vllm_claims, "verifiers guide and benchmarks page": other_claims}


@pytest.mark.parametrize("group", GROUPS)
def test_repeated_figures_agree_with_their_records(group):
    claims = GROUPS[group](load())
    assert claims and disagreements(claims) == []


def test_the_comparison_catches_wrong_figures():
    assert agrees("4.0", span("4,081", GIB)) and not agrees("4.1", span("4,081", GIB))  # MiB / 1000 is not GiB
    assert agrees("0.97", span("0.966")) and not agrees("0.96", span("0.966"))
    assert agrees("2.48", ratio("20.8", "8.40")) and not agrees("2.49", ratio("20.8", "8.40"))
    assert agrees("56", span("0.56", PERCENT)) and not agrees("5.6", span("0.56", PERCENT))
    texts = load()
    texts["README.md"] = texts["README.md"].replace("legacy TRL 42.5 s, 4.0 GiB", "legacy TRL 42.5 s, 4.1 GiB")
    assert [line for line in disagreements(headline_claims(texts)) if "4.1" in line]
    texts = load()
    texts["README.md"] = texts["README.md"].replace("8.40 s (2.48x)", "8.40 s (2.6x)")
    assert len(disagreements(headline_claims(texts))) == 2  # the record's ratio and the ratio of the two times
    texts = load()
    texts["docs/guides/grpo.md"] = texts["docs/guides/grpo.md"].replace("the packed one took 7.6 GiB", "the packed one "
                                                                        "took 7.8 GiB")
    assert disagreements(grpo_claims(texts))
    texts["docs/guides/grpo.md"] = texts["docs/guides/grpo.md"].replace("The smallest gain", "The least gain")
    with pytest.raises(AssertionError, match="not found"):
        grpo_claims(texts)


def test_every_figure_section_is_included_and_the_suite_is_not_copied():
    bench = (ROOT / "docs/benchmarks.md").read_text(encoding="utf-8")
    for page in sorted((ROOT / "docs").rglob("*.md")):
        if "<!-- --8<-- [start:figures] -->" in page.read_text(encoding="utf-8"):
            assert f'--8<-- "{page.relative_to(ROOT).as_posix()}:figures"' in bench
    assert '--8<-- "benchmarks/README.md"' in bench
    own = " ".join(bench.split())
    suite = (ROOT / "benchmarks/README.md").read_text(encoding="utf-8")
    copied = [p[:80] for p in re.split(r"\n\s*\n", suite) if len(p) > 300 and " ".join(p.split()) in own]
    assert copied == [], "paragraphs of benchmarks/README.md copied into docs/benchmarks.md, which includes it whole"


# ---- GPU wording -----------------------------------------------------------------------------------------------

CARD = re.compile(r"\b(?:H100|H200|A100|B200)\b")
SECTION_SAYS = re.compile(r"untested|no GPU figures|no GPU was (?:available|lent)", re.I)
PAGE_SAYS = re.compile(r"no GPU figures|no GPU was (?:available|lent)", re.I)


def sections(text: str) -> list[tuple[str, str]]:
    """(heading, body) of each Markdown section, fenced code kept inside its section (its `#` lines are no headings)."""
    found, heading, body, fenced = [], "(top)", [], False
    for line in text.splitlines():
        fenced ^= line.lstrip().startswith("```")
        if not fenced and re.match(r"#{1,6} ", line):
            found.append((heading, "\n".join(body)))
            heading, body = line, []
        else:
            body.append(line)
    return found + [(heading, "\n".join(body))]


def gpu_wording_problems(text: str) -> list[str]:
    """A section that gives a GPU card's figures must not call the GPU path untested or say no GPU was there; a page
    with such a section must not say so anywhere."""
    problems, gives = [], False
    for heading, body in sections(text):
        if CARD.search(body) and re.search(rf"{NUMBER} ?(?:s|ms|x)\b", body):
            gives = True
            problems += [f"{heading}: {m.group(0)!r} beside GPU figures" for m in SECTION_SAYS.finditer(body)]
    return problems + ([f"the page says {m.group(0)!r} and gives GPU figures" for m in PAGE_SAYS.finditer(text)]
                       if gives else [])


def pages() -> list[Path]:
    return [ROOT / "README.md", ROOT / "benchmarks/README.md", *sorted((ROOT / "docs").rglob("*.md"))]


@pytest.mark.parametrize("page", pages(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_page_says_untested_beside_gpu_figures(page):
    assert gpu_wording_problems(page.read_text(encoding="utf-8")) == []


def test_the_gpu_wording_rule_catches_what_the_issue_found():
    untested = "## On a GPU\n\nUntested: no GPU was available.\n\nMeasured on an NVIDIA H200: 6.20 s against 4.80 s.\n"
    assert len(gpu_wording_problems(untested)) == 3
    beside = ("## Results\n\nOn an H200: 6.20 s against 4.80 s.\n\n## PPO\n\n| a | b |\n|---|---|\n| 1 s | 2 s |\n\n"
              "- No GPU figures: no GPU was lent to this work.\n")
    assert gpu_wording_problems(beside) == ["the page says 'No GPU figures' and gives GPU figures",
                                            "the page says 'no GPU was lent' and gives GPU figures"]
    assert gpu_wording_problems("## CPU\n\nuntested on GPUs; 6.20 s\n\n```bash\n# H200 1 s\n```\n") != []
    assert gpu_wording_problems("## CPU\n\nthe GPU path is untested; 6.20 s on the CPU.\n") == []
