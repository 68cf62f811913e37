"""What an input really holds, told from its first bytes rather than from its name.

A gzip piped to stdin or saved without ``.gz``, a log PowerShell's ``>`` wrote (UTF-16 with a BOM), a zstd or zip
archive, random bytes: each used to be read as garbage text in which no rule matched, so the tool said "no failure"
with exit 0. Here the magic bytes and BOMs decide: what can be decoded is decoded, the rest is refused in one line.
"""

from __future__ import annotations

import codecs
import contextlib
import errno
import os
from collections.abc import Callable

from diagnose.ingest.errors import input_error, os_error

SAMPLE_BYTES = 64 << 10
# Of the bytes that are not NUL, the share that is neither text nor a terminal escape above which a file is binary.
# Real logs hold a few invalid UTF-8 bytes or control characters (progress bars, a crashed writer's junk); random
# or compiled data holds more than half.
BINARY_SHARE = 0.30

COMPRESSED = {  # magic -> (suffix understood by gzip_bounded, name)
    b"\x1f\x8b": (".gz", "gzip"),
    b"BZh": (".bz2", "bzip2"),
    b"\xfd7zXZ\x00": (".xz", "xz"),
}
REFUSED = {  # magic -> what to tell the user
    b"\x28\xb5\x2f\xfd": "zstd-compressed: decompress it first (zstd -dc FILE | diagnose analyze -)",
    b"\x04\x22\x4d\x18": "lz4-compressed: decompress it first (lz4 -dc FILE | diagnose analyze -)",
    b"PK\x03\x04": "a zip archive: unpack it first (unzip) and name the log or its folder",
    b"7z\xbc\xaf\x27\x1c": "a 7-Zip archive: unpack it first and name the log or its folder",
}
BOMS = (  # longest first: the UTF-32 LE BOM starts with the UTF-16 LE one
    (codecs.BOM_UTF32_LE, "utf-32-le"),
    (codecs.BOM_UTF32_BE, "utf-32-be"),
    (codecs.BOM_UTF16_LE, "utf-16-le"),
    (codecs.BOM_UTF16_BE, "utf-16-be"),
)
_TEXT_CONTROLS = frozenset(b"\t\n\r\x0b\x0c\x1b\x08")


def head(path: str, display: str, size: int = SAMPLE_BYTES) -> bytes:
    try:
        with open(path, "rb") as fh:
            return fh.read(size)
    except OSError as e:
        raise os_error(display, e, "read") from None


def after_nul_hole(path: str, display: str, sample: bytes) -> bytes:
    """The first ``SAMPLE_BYTES`` after a run of NULs the file starts with, when ``sample`` (its head) is only
    NULs; else ``sample``. A log truncated while its writer kept its offset (``> train.log``, logrotate's
    copytruncate, a nohup log emptied by hand) starts with a hole of NULs as long as the old log, then the text
    written since: its head alone looked like binary data and the whole log was refused. Holes of a sparse file are
    skipped without reading them (SEEK_DATA); a file of NULs only keeps its all-NUL sample."""
    if not sample or sample.strip(b"\x00"):
        return sample
    try:
        with open(path, "rb", buffering=0) as fh:
            pos = len(sample)
            while True:
                try:
                    pos = os.lseek(fh.fileno(), pos, os.SEEK_DATA)
                except OSError as e:
                    if e.errno == errno.ENXIO:
                        return sample  # no data after pos: NULs (holes) to the end
                except AttributeError:
                    pass  # no SEEK_DATA on this platform: read on
                fh.seek(pos)
                chunk = fh.read(1 << 20)
                if not chunk:
                    return sample
                rest = chunk.lstrip(b"\x00")
                if rest:
                    fh.seek(pos + len(chunk) - len(rest))
                    return fh.read(SAMPLE_BYTES)
                pos += len(chunk)
    except OSError as e:
        raise os_error(display, e, "read") from None


def compressed_by_magic(sample: bytes) -> tuple[str, str] | None:
    return next((kind for magic, kind in COMPRESSED.items() if sample.startswith(magic)), None)


def bom_encoding(sample: bytes) -> str | None:
    """The UTF-16/32 encoding a BOM names, unless what follows it is plainly UTF-8: no NUL at all (UTF-16 of any
    ASCII holds one in every other byte) and valid UTF-8 (UTF-16 of CJK text is not). A stray FF FE in front of a
    UTF-8 log (a Windows tool's first write, then Linux appends) was decoded as UTF-16: CJK garbage in which no rule
    matched, "No failure found", exit 0."""
    found = next(((bom, encoding) for bom, encoding in BOMS if sample.startswith(bom)), None)
    if found is None:
        return None
    rest = sample[len(found[0]):4096]
    if rest and b"\x00" not in rest and _valid_utf8(rest):
        return None
    return found[1]


def _valid_utf8(data: bytes) -> bool:
    try:
        codecs.getincrementaldecoder("utf-8")("strict").decode(data, final=False)  # a character cut at the end is fine
    except UnicodeDecodeError:
        return False
    return True


def bomless_utf16(sample: bytes) -> str | None:
    """"utf-16-le" / "utf-16-be" for UTF-16 text without a BOM (``iconv -t utf-16le``, some Windows tools): a NUL
    at nearly every odd (LE) or even (BE) offset and almost none at the others. It used to be read as text with a
    NUL between letters, in which no rule matched: "no failure", exit 0. A log padded with runs of NULs has them at
    both parities and stays a log."""
    head = sample[: 4096 - 4096 % 2]
    if len(head) < 16:
        return None
    half = len(head) // 2
    even, odd = head[0::2].count(0) / half, head[1::2].count(0) / half
    if odd > 0.6 and even < 0.05:
        return "utf-16-le"
    if even > 0.6 and odd < 0.05:
        return "utf-16-be"
    return None


def refuse_unreadable(sample: bytes, display: str) -> None:
    """Raise a one-line DiagnoseError for an archive format we do not open, or for binary data."""
    for magic, reason in REFUSED.items():
        if sample.startswith(magic):
            raise input_error(display, reason)
    if sample and not sample.strip(b"\x00"):
        raise input_error(display, "binary data: only NUL bytes, no text (a file allocated but never written?)")
    if looks_binary(sample):
        raise input_error(display, "binary data, not a text log (a core dump, a checkpoint, or compressed?)")


def looks_binary(sample: bytes) -> bool:
    """True when the sample is mostly neither text nor terminal escapes (NUL padding is not counted: a log whose
    writer crashed on NFS may hold runs of NULs, and is still a log)."""
    data = sample.replace(b"\x00", b"")
    if not data:
        return bool(sample)  # only NULs
    text = data.decode("utf-8", "replace")
    if len(sample) == SAMPLE_BYTES:  # a character cut by the sample's end is not an invalid one
        text = text[:-2]
    bad = text.count("\ufffd") + sum(1 for ch in text if ord(ch) < 32 and ord(ch) not in _TEXT_CONTROLS)
    return bad > BINARY_SHARE * max(len(text), 1)


def transcode_to_utf8(src: str, dst: str, encoding: str, display: str, max_bytes: int) -> None:
    """Re-encode a UTF-16/32 file (its BOM, if any, dropped) as UTF-8, streaming; undecodable units become U+FFFD."""
    decoder = codecs.getincrementaldecoder(encoding)("replace")
    bom = next((len(b) for b, enc in BOMS if enc == encoding and head(src, display, len(b)) == b), 0)
    written = 0

    def utf8(chunk: bytes) -> bytes:
        nonlocal written
        out = decoder.decode(chunk, final=not chunk).encode("utf-8", "surrogatepass")
        written += len(out)
        if written > max_bytes:
            raise input_error(display, f"refusing to decode more than {max_bytes} bytes")
        return out

    _rewrite(src, dst, display, utf8, skip=bom)


def cr_lines(sample: bytes) -> bool:
    """True for text whose lines end in a lone carriage return (classic Mac, some serial consoles and capture
    tools): no newline in the sample, several CRs. Read as it is, the whole file was one progress-bar line whose
    last rewrite alone was kept: "No failure found", exit 0."""
    return b"\n" not in sample and sample.count(b"\r") >= 2


def cr_to_newlines(src: str, dst: str, display: str) -> None:
    """Copy ``src`` to ``dst`` with each CR turned into a newline (streaming; same size)."""
    table = bytes.maketrans(b"\r", b"\n")
    _rewrite(src, dst, display, lambda chunk: chunk.translate(table))


def _rewrite(src: str, dst: str, display: str, convert: Callable[[bytes], bytes], skip: int = 0) -> None:
    """Stream ``src`` (from byte ``skip``) into ``dst`` through ``convert``, which gets a last empty chunk at the
    end; a copy that failed half-way is removed."""
    try:
        with open(src, "rb") as fin, open(dst, "wb") as fout:
            fin.seek(skip)
            while True:
                chunk = fin.read(1 << 20)
                fout.write(convert(chunk))
                if not chunk:
                    return
    except OSError as e:
        with contextlib.suppress(OSError):
            os.unlink(dst)
        raise os_error(display, e, "decode") from None
