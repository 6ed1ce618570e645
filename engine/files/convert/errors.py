"""Why a source cannot be converted. Each error names the file and what the person can do.

All derive from ``keepstep.engine.errors.SourceError``, so a caller that refuses a source at
add or validate time catches one class; the subclass says which case it was. Conversion never
lets a library's own exception escape: an unexpected one becomes ``UnreadableSourceError``.
"""

from __future__ import annotations

from pathlib import Path

from keepstep.engine.errors import SourceError

SUPPORTED_FORMATS_TEXT = "PDF, DOCX, XLSX, CSV, PPTX, HTML, TXT or MD"
SIZE_SETTING = "max_source_mb"


class ConversionError(SourceError):
    """Base of every conversion refusal; ``path`` is the file concerned."""

    def __init__(self, path: Path | str, message: str, *, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.path = str(path)


class EmptySourceError(ConversionError):
    """The file has no bytes at all."""

    def __init__(self, path: Path | str) -> None:
        super().__init__(path, f"{path} is empty (0 bytes)",
                         hint="check that you picked the right file, or export it again")


class NoTextError(ConversionError):
    """The file is well-formed but yields no text (a scanned PDF, a deck of pictures...)."""

    def __init__(self, path: Path | str, fmt: str) -> None:
        if fmt == "pdf":
            message = f"{path} has no text layer (it looks like a scanned PDF)"
            hint = "OCR it, or export it with a text layer, then add it again"
        else:
            message = f"{path} contains no text ({fmt.upper()} with nothing to read)"
            hint = "check that you picked the right file, or export it with its text"
        super().__init__(path, message, hint=hint)


class EncryptedSourceError(ConversionError):
    """The file is password-protected."""

    def __init__(self, path: Path | str, what: str = "PDF") -> None:
        super().__init__(path, f"{path} is an encrypted (password-protected) {what}",
                         hint="remove the password, or export an unprotected copy, then add "
                         "that copy")


class SourceTooLargeError(ConversionError):
    """The file (or what it expands to) is over the configured size limit."""

    def __init__(self, path: Path | str, size_bytes: int, max_bytes: int,
                 what: str = "is") -> None:
        super().__init__(
            path, f"{path} {what} {_mb(size_bytes)}, over the {_mb(max_bytes)} limit for a "
            "source",
            hint=f"raise `{SIZE_SETTING}` in keepstep.toml, or split the file into smaller "
            "ones")
        self.size_bytes = size_bytes
        self.max_bytes = max_bytes


class UnsupportedFormatError(ConversionError):
    """The file is of a type keepstep cannot convert."""

    def __init__(self, path: Path | str, what: str) -> None:
        super().__init__(path, f"{path} is {what}, which keepstep cannot read as a source",
                         hint=f"export it as {SUPPORTED_FORMATS_TEXT}, then add that file")


class UndecodableTextError(ConversionError):
    """A text file (TXT, MD, CSV, HTML) is not valid in the encoding it was read with."""

    def __init__(self, path: Path | str, encoding: str, byte_offset: int | None) -> None:
        where = f" at byte {byte_offset}" if byte_offset is not None else ""
        super().__init__(path, f"{path} is not valid {encoding} text (undecodable bytes{where})",
                         hint="save it as UTF-8 (in most editors: Save as → Encoding → UTF-8), "
                         "then add it again")
        self.encoding = encoding
        self.byte_offset = byte_offset


class UnreadableSourceError(ConversionError):
    """The file claims a supported format but is damaged or not what it claims."""

    def __init__(self, path: Path | str, fmt: str, detail: str) -> None:
        super().__init__(path, f"{path} could not be read as {fmt.upper()} ({detail})",
                         hint="open it in its application and save or export it again, then "
                         "add the new file")


def _mb(n: int) -> str:
    return f"{n / (1024 * 1024):.1f} MB"


__all__ = ["SIZE_SETTING", "SUPPORTED_FORMATS_TEXT", "ConversionError", "EmptySourceError",
           "EncryptedSourceError", "NoTextError", "SourceTooLargeError", "UndecodableTextError",
           "UnreadableSourceError", "UnsupportedFormatError"]
