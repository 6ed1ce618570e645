"""keepstep.engine.files.convert: sources as consultants have them (PDF, DOCX, XLSX, CSV, PPTX,
HTML, TXT, MD) turned into Markdown that keeps structure, with locators back to the original.

Typical use by the engine::

    cache = ConversionCache(project_root / ".keepstep" / "converted")
    conv = cache.get_or_convert(path, sha256, max_bytes=cfg_mb * 1024 * 1024, cancel=event)
    conv.text                      # Markdown: headings, "- " items, pipe tables
    conv.locator_at(offset)        # "p. 4", "Prices!A3:D3", "slide 2", "Pricing > Tiers"
    find_quote(conv, quote)        # where a quote occurs (None: nowhere)
    quote_at(conv, locator, quote) # does a citation's quote occur at its locator
    for row in iter_table_rows(conv): row.locator, row.header, row.cells, row.quote
    converter_versions()           # {"pdf": "pypdf-7.1.1+keepstep-1", ...}

``inspect_source(path)`` gives what add-source shows before approval (type, pages or sheets or
slides, a preview). Every refusal is a ConversionError (a SourceError) naming the file and
what to do; ``cancel`` set → RunCancelled within a fraction of a second of work.
"""

from keepstep.engine.files.convert.cache import ConversionCache, file_sha256
from keepstep.engine.files.convert.conversion import (
    check_file,
    convert,
    converter_name,
    converter_version,
    converter_versions,
    from_markdown,
    inspect_source,
    summarize,
)
from keepstep.engine.files.convert.detect import detect_format
from keepstep.engine.files.convert.errors import (
    SIZE_SETTING,
    SUPPORTED_FORMATS_TEXT,
    ConversionError,
    EmptySourceError,
    EncryptedSourceError,
    NoTextError,
    SourceTooLargeError,
    UndecodableTextError,
    UnreadableSourceError,
    UnsupportedFormatError,
)
from keepstep.engine.files.convert.model import (
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_SOURCE_MB,
    FORMATS,
    MEDIA_TYPES,
    ConvertedSource,
    Segment,
    SegmentKind,
    SourceInfo,
    TableRow,
)
from keepstep.engine.files.convert.quotes import (
    find_occurrence,
    find_quote,
    quote_at,
)
from keepstep.engine.files.convert.tables import iter_table_rows, table_rows

__all__ = [
    "DEFAULT_MAX_BYTES", "DEFAULT_MAX_SOURCE_MB", "FORMATS", "MEDIA_TYPES", "SIZE_SETTING",
    "SUPPORTED_FORMATS_TEXT", "ConversionCache", "ConversionError", "ConvertedSource",
    "EmptySourceError", "EncryptedSourceError", "NoTextError", "Segment", "SegmentKind",
    "SourceInfo", "SourceTooLargeError", "TableRow", "UndecodableTextError",
    "UnreadableSourceError", "UnsupportedFormatError", "check_file", "convert",
    "converter_name", "converter_version", "converter_versions", "detect_format",
    "file_sha256", "find_occurrence", "find_quote", "from_markdown", "inspect_source",
    "iter_table_rows", "quote_at", "summarize",
    "table_rows",
]
