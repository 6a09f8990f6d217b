"""Small real files for OSWorld tasks, built with the standard library: a PDF with a title, a
silent MP3 with an empty ID3 tag, ``.tar.xz`` and ``.zip`` archives. Nothing is downloaded."""

from __future__ import annotations

import io
import struct
import tarfile
import zipfile


def pdf(title: str, text: str) -> bytes:
    """A one-page PDF 1.4 showing ``text`` (Helvetica), with ``title`` in its Info dictionary
    (the title evince shows after the file name). ``title``/``text`` are ASCII without
    parentheses or backslashes."""
    stream = f"BT /F1 18 Tf 72 720 Td ({text}) Tj ET".encode()
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R"
        b" /Resources << /Font << /F1 5 0 R >> >> >>",
        b"<< /Length %d >>\nstream\n%s\nendstream" % (len(stream), stream),
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
        f"<< /Title ({title}) /Producer (legato tests) >>".encode(),
    ]
    out = io.BytesIO()
    out.write(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, 1):
        offsets.append(out.tell())
        out.write(b"%d 0 obj\n%s\nendobj\n" % (number, body))
    xref = out.tell()
    out.write(b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1))
    for offset in offsets:
        out.write(b"%010d 00000 n \n" % offset)
    out.write(
        b"trailer\n<< /Size %d /Root 1 0 R /Info %d 0 R >>\nstartxref\n%d\n%%%%EOF\n"
        % (len(objects) + 1, len(objects), xref)
    )
    return out.getvalue()


def mp3(seconds: float = 1.0) -> bytes:
    """A silent MPEG-1 Layer III stream (128 kbit/s, 44.1 kHz, mono; ~38 frames a second) after
    an ID3v2.3 tag holding only an encoder frame: "blank metadata" (no title, no artist) that
    mutagen's ``EasyID3`` still opens."""
    frame = b"\xff\xfb\x90\xc0" + bytes(413)  # 144 * 128000 / 44100 = 417 bytes, zero side info
    text = b"\x00legato tests"
    tsse = b"TSSE" + struct.pack(">I", len(text)) + b"\x00\x00" + text
    size = len(tsse)
    syncsafe = bytes((size >> shift) & 0x7F for shift in (21, 14, 7, 0))
    return b"ID3\x03\x00\x00" + syncsafe + tsse + frame * max(1, round(seconds * 38.28))


def tar_xz(files: dict[str, bytes]) -> bytes:
    """A ``.tar.xz`` of ``files`` (name -> bytes)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:xz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def zip_of(files: dict[str, bytes]) -> bytes:
    """A ``.zip`` of ``files`` (name -> bytes)."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return out.getvalue()
