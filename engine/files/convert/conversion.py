"""The entry points: ``convert`` a file, ``inspect_source`` before approval, and the
``converter_versions`` a cached conversion (and a typed ``tool`` change) is keyed by.

Every failure a person can cause is a ConversionError subclass (a SourceError) naming the file
and what to do; cancellation raises RunCancelled; no library exception escapes.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from functools import cache
from importlib import metadata
from pathlib import Path

from keepstep.engine.files.convert.builder import Converted
from keepstep.engine.files.convert.detect import detect_format
from keepstep.engine.files.convert.errors import (
    ConversionError,
    EmptySourceError,
    NoTextError,
    SourceTooLargeError,
    UnreadableSourceError,
)
from keepstep.engine.files.convert.model import (
    DEFAULT_MAX_BYTES,
    FORMATS,
    MEDIA_TYPES,
    PREVIEW_CHARS,
    ConvertedSource,
    SourceInfo,
)

ZIP_FORMATS = ("docx", "xlsx", "pptx")
# Bump a format's revision whenever keepstep's own code for it would turn the same bytes into
# different text or locators: the version string changes, so cached conversions are redone
# and the engine sees a `tool` change for units that read that format.
CONVERTER_REVISIONS: dict[str, int] = {fmt: 1 for fmt in FORMATS}
# Format -> (converter name, library distribution whose version it depends on; None = the
# standard library, versioned by the Python minor release).
CONVERTERS: dict[str, tuple[str, str | None]] = {
    "pdf": ("pypdf", "pypdf"),
    "xlsx": ("openpyxl", "openpyxl"),
    "docx": ("ooxml-docx", None),
    "pptx": ("ooxml-pptx", None),
    "html": ("html-parser", None),
    "csv": ("csv", None),
    "txt": ("text", None),
    "md": ("markdown", None),
}


@cache
def _library_version(dist: str | None) -> str:
    if dist is None:
        return f"python-{sys.version_info.major}.{sys.version_info.minor}"
    try:
        return f"{dist}-{metadata.version(dist)}"
    except metadata.PackageNotFoundError:
        return f"{dist}-missing"


def converter_versions() -> dict[str, str]:
    """Format -> ``"<library>-<version>+keepstep-<revision>"`` of the converter used for it.

    Two conversions of the same bytes with equal version strings give equal results; a
    changed string is what the engine compares to raise a typed ``tool`` change.
    """
    return {fmt: converter_version(fmt) for fmt in FORMATS}


def converter_version(fmt: str) -> str:
    """The version string of one format's converter (see ``converter_versions``)."""
    return f"{_library_version(CONVERTERS[fmt][1])}+keepstep-{CONVERTER_REVISIONS[fmt]}"


def converter_name(fmt: str) -> str:
    """The converter's name for a format, e.g. ``pypdf`` for ``pdf``."""
    return CONVERTERS[fmt][0]


def check_file(path: Path, max_bytes: int) -> int:
    """The file's size; raises for a missing, non-regular, empty or over-limit file."""
    try:
        stat = path.stat()
    except FileNotFoundError:
        raise UnreadableSourceError(path, path.suffix.lstrip(".") or "file",
                                    "no such file") from None
    except OSError as exc:
        raise UnreadableSourceError(path, path.suffix.lstrip(".") or "file",
                                    exc.strerror or str(exc)) from None
    if not path.is_file():
        raise UnreadableSourceError(path, path.suffix.lstrip(".") or "file", "not a file")
    if stat.st_size == 0:
        raise EmptySourceError(path)
    if stat.st_size > max_bytes:
        raise SourceTooLargeError(path, stat.st_size, max_bytes)
    return stat.st_size


def _dispatch(fmt: str) -> Callable[..., Converted]:
    # Imported per format so a caller that only reads text never imports pypdf or openpyxl.
    if fmt == "pdf":
        from keepstep.engine.files.convert.pdf import convert_pdf
        return convert_pdf
    if fmt == "xlsx":
        from keepstep.engine.files.convert.sheets import convert_xlsx
        return convert_xlsx
    if fmt == "docx":
        from keepstep.engine.files.convert.word import convert_docx
        return convert_docx
    if fmt == "pptx":
        from keepstep.engine.files.convert.slides import convert_pptx
        return convert_pptx
    if fmt == "html":
        from keepstep.engine.files.convert.web import convert_html
        return convert_html
    if fmt == "csv":
        from keepstep.engine.files.convert.delimited import convert_csv
        return convert_csv
    from keepstep.engine.files.convert.plain import convert_markdown, convert_plain
    return convert_markdown if fmt == "md" else convert_plain


def convert(path: Path, *, max_bytes: int = DEFAULT_MAX_BYTES,
            cancel: threading.Event | None = None) -> ConvertedSource:
    """Convert the file at ``path`` to Markdown with locators.

    Raises (all ConversionError, a SourceError): EmptySourceError, SourceTooLargeError
    (``max_bytes``, the ``max_source_mb`` setting), UnsupportedFormatError,
    EncryptedSourceError, NoTextError, UndecodableTextError, UnreadableSourceError. Raises
    RunCancelled soon (well under a second of work) after ``cancel`` is set.
    """
    path = Path(path)
    check_file(path, max_bytes)
    fmt = detect_format(path)
    func = _dispatch(fmt)
    kwargs: dict = {"cancel": cancel}
    if fmt in ZIP_FORMATS:  # their zip is checked for bombs before any parser reads it
        kwargs["max_bytes"] = max_bytes
    try:
        result = func(path, **kwargs)
    except ConversionError:
        raise
    except MemoryError:
        raise
    except Exception as exc:  # a library failing on a damaged file must not surface raw
        raise UnreadableSourceError(path, fmt, type(exc).__name__) from None
    # A spilled text is millions of characters with has_text set: no need to strip it.
    if not result.has_text or (isinstance(result.text, str) and not result.text.strip()):
        raise NoTextError(path, fmt)
    return ConvertedSource.model_construct(
        text=result.text, format=fmt, converter=converter_name(fmt),
        converter_version=converter_version(fmt), segments=result.segments,
        pages=result.pages, sheets=list(result.sheets), slides=result.slides,
        warnings=list(result.warnings))


def from_markdown(text: str, fmt: str = "md") -> ConvertedSource:
    """Markdown already in memory as a ConvertedSource (sections and table rows located as
    for a ``.md`` file): for callers that hold text, not a file."""
    from keepstep.engine.files.convert.plain import markdown_segments

    if text and not text.endswith("\n"):
        text += "\n"
    return ConvertedSource.model_construct(
        text=text, format=fmt, converter=converter_name(fmt),
        converter_version=converter_version(fmt), segments=markdown_segments(text),
        pages=None, sheets=[], slides=None, warnings=[])


def summarize(path: Path, conv: ConvertedSource, size_bytes: int | None = None) -> SourceInfo:
    """The SourceInfo of an already converted source."""
    path = Path(path)
    if size_bytes is None:
        size_bytes = path.stat().st_size
    preview = conv.text[:PREVIEW_CHARS]
    if len(conv.text) > PREVIEW_CHARS:
        cut = preview.rfind(" ")
        preview = (preview[:cut] if cut > PREVIEW_CHARS // 2 else preview).rstrip() + " …"
    return SourceInfo(path=str(path), format=conv.format, media_type=MEDIA_TYPES[conv.format],
                      size_bytes=size_bytes, pages=conv.pages, sheets=list(conv.sheets),
                      slides=conv.slides, chars=len(conv.text), preview=preview,
                      converter=conv.converter, converter_version=conv.converter_version,
                      warnings=list(conv.warnings))


def inspect_source(path: Path, *, max_bytes: int = DEFAULT_MAX_BYTES,
                   cancel: threading.Event | None = None, cache=None,
                   sha256: str | None = None) -> SourceInfo:
    """What to show before a source is approved: type, size, pages/sheets/slides, a preview.

    It converts the whole file, so a file that would fail mid-run fails here, with the same
    errors as ``convert``. Given a ConversionCache (and optionally the file's sha256), the
    conversion is cached and the run will not convert it again.
    """
    path = Path(path)
    size = check_file(path, max_bytes)
    if cache is not None:
        conv = cache.get_or_convert(path, sha256, max_bytes=max_bytes, cancel=cancel)
    else:
        conv = convert(path, max_bytes=max_bytes, cancel=cancel)
    return summarize(path, conv, size)


__all__ = ["CONVERTERS", "CONVERTER_REVISIONS", "check_file", "convert", "converter_name",
           "from_markdown",
           "converter_version", "converter_versions", "inspect_source", "summarize"]
