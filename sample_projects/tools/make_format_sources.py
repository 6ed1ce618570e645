"""Write five ME-042 sources in the formats consultants get them, into the pack's sources/.

    .venv/bin/python sample_projects/tools/make_format_sources.py [--out DIR] [--check]

The output is committed (sample_projects/market-entry/sources/), so `make demo` needs no
generation step. Each file is made from its Markdown original (sample_projects/tools/
originals/, no longer part of the pack) with the same sentences, so every sentence that holds
a figure converts back as the same sentence (the offline extractor's prose evidence stays the
same); front matter goes into the document's own properties, as a real file carries it:

    A1-market-overview.md     -> A1-market-overview.pdf        (2 pages, headings by size)
    D1-interview-ostmark.md   -> D1-interview-ostmark.docx     (Heading styles, bullets)
    E1-brightwell-price-list  -> E1-brightwell-price-list.xlsx (cells; + a tier table)
    L3-pilot-proposal.md      -> L3-pilot-proposal.pptx        (3 slides)
    C1-aquilon-product-page   -> C1-aquilon-product-page.html  (a saved product page)

The one addition: the XLSX has a "Volume tiers" sheet whose table holds a figure found
nowhere else (the Framework tier's 12% discount above 50,000 meters), so the pack has a
figure that only a table-aware extractor can turn into evidence. Its three data rows each
become an evidence item citing their row, which is why the pack now holds 163 statements
(160 sentences + 3 table rows).

Output is byte-deterministic (fixed dates, fixed ZIP entry times): run it twice, compare
hashes. ``--check`` converts each output and fails if a figure sentence of the original is
missing or different. Needs the dev extra (fpdf2, python-docx, python-pptx, openpyxl).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script from anywhere: tests.support is in the repo
    sys.path.insert(0, str(ROOT))

from tests.support.source_files import (  # noqa: E402
    Bold,
    Percent,
    Thousands,
    write_docx,
    write_html,
    write_pdf,
    write_pptx,
    write_xlsx,
)

PACK_SOURCES = Path(__file__).resolve().parent / "originals"  # the Markdown originals
DEFAULT_OUT = ROOT / "sample_projects" / "market-entry" / "sources"
TABLE_ONLY_FIGURE = "12%"  # in E1's "Volume tiers" sheet, Framework row


def parse_markdown(text: str) -> tuple[dict[str, str], list[tuple]]:
    """(front matter fields, blocks) of one pack source: headings, paragraphs, list items."""
    meta: dict[str, str] = {}
    lines = text.splitlines()
    if lines and lines[0].strip() == "---":
        end = lines.index("---", 1)
        for line in lines[1:end]:
            key, _, value = line.partition(":")
            meta[key.strip()] = value.strip()
        lines = lines[end + 1:]
    blocks: list[tuple] = []
    para: list[str] = []

    def flush() -> None:
        if para:
            blocks.append(("p", " ".join(para)))
            para.clear()

    for raw in lines:
        line = raw.strip()
        if not line:
            flush()
        elif line.startswith("#"):
            flush()
            level = len(line) - len(line.lstrip("#"))
            blocks.append(("h", level, line[level:].strip()))
        elif line.startswith("- "):
            flush()
            blocks.append(("li", line[2:].strip()))
        else:
            para.append(line)
    flush()
    return meta, blocks


def _read(name: str) -> tuple[dict[str, str], list[tuple]]:
    return parse_markdown((PACK_SOURCES / name).read_text(encoding="utf-8"))


def make_pdf(out: Path) -> Path:
    meta, blocks = _read("A1-market-overview.md")
    # The report's second section starts on page 2, so its figures cite "p. 2".
    second = [i for i, b in enumerate(blocks) if b[0] == "h" and b[1] == 2][1]
    blocks = blocks[:second] + [("break",)] + blocks[second:]
    return write_pdf(out / "A1-market-overview.pdf", blocks, title=blocks[0][2],
                     author=meta["publisher"],
                     subject=f"Published {meta['published']}; {meta['pages']} pages")


def make_docx(out: Path) -> Path:
    meta, blocks = _read("D1-interview-ostmark.md")
    return write_docx(out / "D1-interview-ostmark.docx", blocks, title=blocks[0][2],
                      author=meta["interviewer"],
                      comments=f"Interviewee: {meta['interviewee']}; date: {meta['date']}")


def make_xlsx(out: Path) -> Path:
    meta, blocks = _read("E1-brightwell-price-list.md")
    rows: list[list[object]] = []
    for block in blocks:
        if block[0] == "h":
            if rows:
                rows.append([])
            rows.append([Bold(block[2])])
        elif block[0] == "li":
            rows.append(["- " + block[1]])
        else:
            rows.append([block[1]])
    tiers: list[list[object]] = [
        [Bold("Volume discount tiers")],
        [],
        ["Tier", "Minimum order (meters)", "Discount"],
        ["Standard", Thousands(1), Percent(0)],
        ["Volume", Thousands(20000), Percent(0.08)],
        ["Framework", Thousands(50000), Percent(0.12)],
    ]
    return write_xlsx(out / "E1-brightwell-price-list.xlsx",
                      {"Price list": rows, "Volume tiers": tiers},
                      title=f"{meta['document']}, valid from {meta['valid-from']}",
                      creator="Brightwell Metering")


def make_pptx(out: Path) -> Path:
    _, blocks = _read("L3-pilot-proposal.md")
    title = blocks[0][2]
    paragraphs = [b[1] for b in blocks if b[0] == "p"]
    slide_titles = [title, "What the pilot tests", "Before any meters ship"]
    slides = [{"title": t, "paragraphs": [p]} for t, p in zip(slide_titles, paragraphs,
                                                               strict=True)]
    return write_pptx(out / "L3-pilot-proposal.pptx", slides)


def make_html(out: Path) -> Path:
    _, blocks = _read("C1-aquilon-product-page.md")
    return write_html(out / "C1-aquilon-product-page.html", blocks,
                      title="Aquilon Hydro-X | Aquilon Metering",
                      extra_head='<meta name="description" content="Smart water meter">')


MAKERS = {"A1-market-overview.md": make_pdf, "D1-interview-ostmark.md": make_docx,
          "E1-brightwell-price-list.md": make_xlsx, "L3-pilot-proposal.md": make_pptx,
          "C1-aquilon-product-page.md": make_html}


def generate(out: Path) -> dict[str, Path]:
    """Write every format source into ``out``; original Markdown name -> written file."""
    out.mkdir(parents=True, exist_ok=True)
    return {name: make(out) for name, make in MAKERS.items()}


def figure_sentences(text: str) -> list[str]:
    """The prose sentences the offline extractor turns into evidence (those holding a digit;
    table rows, which it also turns into evidence, are left out: the originals have none)."""
    from keepstep.engine.gateway.offline_rules import statements

    return [quote for kind, quote, _ in statements(text)
            if kind == "sentence" and any(ch.isdigit() for ch in quote)]


def check(written: dict[str, Path]) -> list[str]:
    """Problems found converting the outputs back (empty when every figure sentence is kept)."""
    from keepstep.engine.files.convert import convert, find_quote

    problems = []
    for name, path in written.items():
        original = figure_sentences((PACK_SOURCES / name).read_text(encoding="utf-8"))
        converted = figure_sentences(convert(path).text)
        if converted != original:
            problems.append(f"{path.name}: figure sentences differ from {name}:\n"
                            f"  original:  {original}\n  converted: {converted}")
    xlsx = convert(written["E1-brightwell-price-list.md"])
    if find_quote(xlsx, f"Framework | 50,000 | {TABLE_ONLY_FIGURE}") is None:
        problems.append("the table-only figure is missing from the XLSX")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--check", action="store_true",
                        help="convert the outputs back and compare their figure sentences")
    args = parser.parse_args(argv)
    written = generate(args.out)
    for path in written.values():
        print(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
    if args.check:
        problems = check(written)
        for problem in problems:
            print(problem, file=sys.stderr)
        if problems:
            return 1
        print("check: every figure sentence survives conversion")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
