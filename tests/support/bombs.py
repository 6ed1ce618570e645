"""Hostile files, built cheaply: zip bombs as XLSX/DOCX/PPTX, billion-laughs XML parts, and
zips whose directory declares a member far larger than its bytes.

Shared by the tests (small, quick) and ``bench/untrusted.py`` (time to refusal, peak RSS).
A real bomb is streamed through deflate (repetitive bytes compress at ~1000:1 quickly); a
"declared" one patches the sizes a zip's headers declare, so a 3.9 GB member costs nothing.
"""

from __future__ import annotations

import struct
import zipfile
from pathlib import Path

from tests.support.source_files import write_docx, write_pptx, write_xlsx

_CHUNK = b"<row><c t=\"n\"><v>0</v></c></row>" * 32768  # ~1 MB of sheet XML

LAUGHS = (b'<?xml version="1.0" encoding="UTF-8" standalone="yes"?>\n'
          b'<!DOCTYPE lolz [<!ENTITY lol "lol">'
          + b"".join(b'<!ENTITY lol%d "%s">' % (i, (b"&lol%d;" % (i - 1) if i > 1 else b"&lol;")
                                                  * 10) for i in range(1, 10))
          + b"]>\n")


def small_office(path: Path, fmt: str) -> Path:
    """A real, small document of ``fmt`` (xlsx, docx or pptx)."""
    if fmt == "xlsx":
        return write_xlsx(path, {"Prices": [["Tier", "Price"], ["Basic", 10], ["Pro", 20]]})
    if fmt == "docx":
        return write_docx(path, [("h", 1, "Title"), ("p", "A paragraph of plain text.")])
    return write_pptx(path, [{"title": "Slide", "bullets": ["one point"]}])


_MAIN_PART = {"xlsx": "xl/worksheets/sheet1.xml", "docx": "word/document.xml",
              "pptx": "ppt/slides/slide1.xml"}


def _rewrite(src: Path, dest: Path, replace: dict[str, object]) -> Path:
    """``src`` copied to ``dest`` with the named parts' bytes replaced (bytes, or a callable
    writing into an open member)."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dest, "w", zipfile.ZIP_DEFLATED) as zout:
        for info in zin.infolist():
            new = replace.get(info.filename)
            if new is None:
                zout.writestr(info, zin.read(info))
            elif callable(new):
                fresh = zipfile.ZipInfo(info.filename, date_time=info.date_time)
                fresh.compress_type = zipfile.ZIP_DEFLATED
                with zout.open(fresh, "w", force_zip64=True) as fh:
                    new(fh)
            else:
                zout.writestr(info, new)
    return dest


def zip_bomb(path: Path, fmt: str, unpacked_mb: int) -> Path:
    """A ``fmt`` document whose main part really unpacks to ``unpacked_mb`` MB."""
    base = small_office(path.with_name(path.stem + ".base." + fmt), fmt)
    part = _MAIN_PART[fmt]

    def fill(fh) -> None:
        fh.write(b'<?xml version="1.0" encoding="UTF-8"?>\n')
        for _ in range(unpacked_mb):
            fh.write(_CHUNK)
    out = _rewrite(base, path, {part: fill})
    base.unlink()
    return out


def billion_laughs(path: Path, fmt: str) -> Path:
    """A ``fmt`` document whose main part declares nested entities (10^9 "lol"s)."""
    base = small_office(path.with_name(path.stem + ".base." + fmt), fmt)
    part = _MAIN_PART[fmt]
    with zipfile.ZipFile(base) as zf:
        body = zf.read(part)
    body = body.split(b"?>", 1)[1] if body.startswith(b"<?xml") else body
    body = body.replace(b"</", b"&lol9;</", 1)
    out = _rewrite(base, path, {part: LAUGHS + body.lstrip()})
    base.unlink()
    return out


def declare_size(path: Path, member: str, size: int) -> Path:
    """Patch the zip at ``path`` so ``member`` declares ``size`` unpacked bytes (< 4 GiB) in
    both its local header and the central directory, without writing them."""
    data = bytearray(path.read_bytes())
    name = member.encode()
    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo(member)
    local = info.header_offset
    assert data[local:local + 4] == b"PK\x03\x04"
    struct.pack_into("<I", data, local + 22, size)
    pos = 0
    while True:
        pos = data.find(b"PK\x01\x02", pos)
        if pos < 0:
            raise ValueError(f"{member} not in the central directory")
        n = struct.unpack_from("<H", data, pos + 28)[0]
        if bytes(data[pos + 46:pos + 46 + n]) == name:
            struct.pack_into("<I", data, pos + 24, size)
            break
        pos += 4
    path.write_bytes(bytes(data))
    return path


def zip_with_member(path: Path, members: dict[str, bytes]) -> Path:
    """A plain zip holding ``members``."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return path


__all__ = ["LAUGHS", "billion_laughs", "declare_size", "small_office", "zip_bomb",
           "zip_with_member"]
