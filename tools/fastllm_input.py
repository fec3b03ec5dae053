"""How fastllm's Python tools open and parse the files they are given.

Shared by tools/fastllm_plot.py (`fastllm-plot`) and tools/fastllm_weights.py,
with the rules of the C++ runtime's runtime/InputFile.cpp:

  - the open never blocks: os.open with O_RDONLY | O_NONBLOCK (a FIFO would
    otherwise wait for a writer forever; O_NOCTTY and O_CLOEXEC too);
  - the opened file must be a regular file, checked with fstat on the
    descriptor (not on a name that may change): a folder, a FIFO, a device
    (/dev/zero) or a socket is refused by name, before any read;
  - its size is checked against the largest such a file may be before
    anything is read or allocated (each tool names its bounds), and exactly
    that many bytes are read, in chunks of at most CHUNK_BYTES: a file that
    grows while being read adds nothing, one that shrinks is an error;
  - JSON is parsed only after a scan of its brackets (outside strings) finds
    it nested at most MAX_JSON_DEPTH levels, so that the parser never
    recurses deeply; a RecursionError is still turned into the same error as
    a last resort. Integers of more digits than Python converts are errors,
    not tracebacks.

Every problem raises InputError (a ValueError) whose message is one line
naming the file; JsonError, a kind of InputError, also carries the line and
column where the parser stopped, when known.

Installed beside `fastllm-plot` (PREFIX/bin, and build/bin in the build
tree), which imports it from its own folder.
"""
import array
import itertools
import json
import os
import stat
import sys

CHUNK_BYTES = 4 << 20  # the most one read asks for
MAX_JSON_DEPTH = 64  # arrays and objects inside each other


class InputError(ValueError):
    """An input that cannot be read as what it should be; the message is one
    line naming the file."""


class JsonError(InputError):
    """Text that is not JSON the tools read: `msg`, and the 1-based `lineno`
    and `colno` where parsing stopped (None when not known)."""

    def __init__(self, msg, lineno=None, colno=None):
        super().__init__(msg)
        self.msg, self.lineno, self.colno = msg, lineno, colno


def kind_of(mode):
    """What a file that is not regular is, in words (as InputFile.cpp)."""
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a FIFO (a named pipe)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def size_text(nbytes):
    """A byte count for messages: 67108864 -> '64 MiB'."""
    for name, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= size and nbytes % size == 0:
            return f"{nbytes // size} {name}"
    return f"{nbytes} bytes"


class Input:
    """An opened regular file of known size; a context manager that closes
    it. Reads are positional (os.preadv) and never past `size`."""

    def __init__(self, path, fd, size):
        self.path, self.fd, self.size = path, fd, size

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def read(self, offset, length):
        """Bytes [offset, offset + length) as a bytearray, read in chunks of
        at most CHUNK_BYTES; the range must lie within `size`."""
        if offset < 0 or length < 0 or offset + length > self.size:
            raise InputError(f"'{self.path}': bytes {offset}.."
                             f"{offset + length} lie beyond its {self.size} "
                             "bytes")
        buf = bytearray(length)
        done = 0
        with memoryview(buf) as view:
            while done < length:
                with view[done:done + min(CHUNK_BYTES, length - done)] as part:
                    got = self._read_into(part, offset + done)
                if got == 0:
                    raise InputError(f"'{self.path}' changed while being "
                                     f"read: it ends at byte {offset + done}, "
                                     f"not {self.size}")
                done += got
        return buf

    def _read_into(self, part, offset):
        try:
            if hasattr(os, "preadv"):
                return os.preadv(self.fd, [part], offset)
            data = os.pread(self.fd, len(part), offset)  # not Linux
            part[:len(data)] = data
            return len(data)
        except OSError as e:
            raise InputError(
                f"cannot read '{self.path}': {e.strerror}") from None

    def _long_line(self, number, max_line_bytes):
        return InputError(f"{self.path}:{number}: the line is longer than "
                          f"{size_text(max_line_bytes)}")

    def read_all(self):
        return self.read(0, self.size)

    def lines(self, max_lines, max_line_bytes):
        """(1-based number, bytes) of each line, without its newline, read a
        chunk at a time: the file is never held whole. More than `max_lines`
        lines, or a line longer than `max_line_bytes`, is an InputError,
        raised before any line past the limit is yielded."""
        carry = b""
        number = 0
        offset = 0
        while offset < self.size:
            length = min(CHUNK_BYTES, self.size - offset)
            chunk = bytes(self.read(offset, length))
            offset += len(chunk)
            ends = chunk.count(b"\n")
            last = offset == self.size and not chunk.endswith(b"\n")
            if number + ends + (1 if last else 0) > max_lines:
                raise InputError(f"'{self.path}' has more than {max_lines} "
                                 "lines")
            parts = (carry + chunk).split(b"\n")
            carry = parts.pop()
            for part in parts:
                number += 1
                if len(part) > max_line_bytes:
                    raise self._long_line(number, max_line_bytes)
                yield number, part
            if len(carry) > max_line_bytes:
                raise self._long_line(number + 1, max_line_bytes)
        if carry:
            yield number + 1, carry


def open_input(path, max_bytes=None, kind="such a file"):
    """`path` opened for reading as an Input, after checking without
    blocking that it is a regular file of at most `max_bytes` bytes (None:
    no bound). `kind` names the file in the size error ("a trace")."""
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | \
        getattr(os, "O_NOCTTY", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise InputError(f"cannot read '{path}': it does not exist") from None
    except OSError as e:
        raise InputError(f"cannot read '{path}': {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InputError(f"'{path}' is {kind_of(st.st_mode)}, not a "
                             "regular file")
        if max_bytes is not None and st.st_size > max_bytes:
            raise InputError(f"'{path}' has {st.st_size} bytes, more than the "
                             f"{size_text(max_bytes)} {kind} may have")
        # Reads of a regular file never block; clear the flag all the same.
        try:
            import fcntl
            fcntl.fcntl(fd, fcntl.F_SETFL,
                        fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        except (ImportError, OSError):
            pass
        return Input(path, fd, st.st_size)
    except BaseException:
        os.close(fd)
        raise


def read_input(path, max_bytes, kind):
    """The whole of regular file `path` (at most `max_bytes`) as a
    bytearray, read in chunks."""
    with open_input(path, max_bytes, kind) as f:
        return f.read_all()


# --- JSON --------------------------------------------------------------------

_NOT_STRUCTURE = bytes(sorted(set(range(256)) - set(b"[]{},")))
_FOLD = bytes.maketrans(b"{}", b"[]")
_SIGNS = bytes.maketrans(b"[]", b"\x01\xff")
_SCAN_CHUNK = 1 << 20


def _structure(data):
    """The brackets and commas of JSON text `data` outside its strings, found
    a chunk at a time with bytes methods (a regular expression's pieces
    would take many times the text's size): escaped backslashes and quotes
    removed, the rest of the quotes alternate between opening and closing a
    string."""
    out = []
    inside = False
    start, n = 0, len(data)
    while start < n:
        end = min(start + _SCAN_CHUNK, n)
        while start < end < n and data[end - 1] == 0x5C:
            end -= 1  # never part backslashes from what they escape
        if end == start:  # the chunk starts with them: take them whole,
            # and the character after them
            end = min(n - len(bytes(data[start:]).lstrip(b"\\")) + 1, n)
        chunk = bytes(data[start:end]).replace(b"\\\\", b"").replace(
            b'\\"', b"")
        parts = chunk.split(b'"')
        out.append(b"".join(parts[1::2] if inside else parts[0::2])
                   .translate(None, _NOT_STRUCTURE))
        if len(parts) % 2 == 0:
            inside = not inside
        start = end
    return b"".join(out)


def too_deep(data, max_depth=MAX_JSON_DEPTH, structure=None):
    """Whether JSON text `data` (bytes, UTF-8) nests arrays and objects more
    than `max_depth` levels, counting brackets outside strings (`structure`:
    _structure(data), if at hand). Linear in the text, without recursion;
    malformed text may be over-counted (the parser refuses it anyway)."""
    if data.count(b"[") + data.count(b"{") <= max_depth:
        return False  # the common case: one count of every opening bracket
    if structure is None:
        structure = _structure(data)
    brackets = structure.translate(_FOLD, b",")
    # Each pass removes the innermost pairs, one level everywhere.
    peeled = 0
    while peeled < 4 and brackets:
        shorter = brackets.replace(b"[]", b"")
        if len(shorter) == len(brackets):
            break
        brackets = shorter
        peeled += 1
    depth, deepest = 0, 0
    signs = brackets.translate(_SIGNS)  # +1 and -1 as signed bytes
    for start in range(0, len(signs), _SCAN_CHUNK):
        steps = array.array("b", signs[start:start + _SCAN_CHUNK])
        running = list(itertools.accumulate(steps, initial=depth))
        deepest = max(deepest, max(running))
        depth = running[-1]
        if peeled + deepest > max_depth:
            return True
    return False


def loads(data, max_depth=MAX_JSON_DEPTH, object_pairs_hook=None,
          max_containers=None, max_values=None, parse_int=None):
    """The JSON value of `data` (UTF-8 bytes, or str), nested at most
    `max_depth` levels, with at most `max_containers` arrays and objects and
    `max_values` values in them (None: no bound; the bounds keep Python's
    memory in proportion, as an empty list costs it 64 bytes for 3 of text).
    Raises JsonError for text that is not UTF-8, not JSON, beyond a bound,
    or holding an integer Python will not convert; an InputError from
    `object_pairs_hook` or `parse_int` (json.loads's hooks) passes
    through."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) \
        else data
    structure = None
    opens = raw.count(b"[") + raw.count(b"{")
    if max_containers is not None and opens > max_containers or \
            max_values is not None and opens + raw.count(b",") >= max_values:
        structure = _structure(raw)  # the counts outside strings
        containers = structure.count(b"[") + structure.count(b"{")
        if max_containers is not None and containers > max_containers:
            raise JsonError(f"more than {max_containers} arrays and objects")
        # Each value but the last of an array or object is followed by a
        # comma: values <= commas + containers (+ 1 at the top).
        if max_values is not None and \
                containers + structure.count(b",") >= max_values:
            raise JsonError(f"more than {max_values} values")
    if too_deep(raw, max_depth, structure):
        raise JsonError(f"nested deeper than {max_depth} levels")
    try:
        text = data if isinstance(data, str) else raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise JsonError(f"not UTF-8 text (byte {e.start})") from None
    try:
        return json.loads(text, object_pairs_hook=object_pairs_hook,
                          parse_int=parse_int)
    except InputError:
        raise
    except json.JSONDecodeError as e:
        raise JsonError(e.msg, e.lineno, e.colno) from None
    except RecursionError:  # the scan above should make this unreachable
        raise JsonError(f"nested deeper than {max_depth} levels") from None
    except ValueError as e:  # e.g. an integer of too many digits
        limit = getattr(sys, "get_int_max_str_digits", lambda: 4300)()
        if "integer string conversion" in str(e):
            raise JsonError(
                f"an integer of more than {limit} digits") from None
        raise JsonError(str(e).split("\n")[0]) from None
