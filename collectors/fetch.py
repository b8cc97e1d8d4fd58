"""Bounded fetches of an engine's /metrics: byte caps, one deadline, no credentials shown.

A collector scrapes engines it does not control. :class:`Fetcher` therefore

* streams the body and refuses it past ``max_body_bytes`` on the wire (a ``Content-Length``
  over the cap is refused before the body is read);
* asks for ``gzip`` only, decompresses it incrementally and refuses past
  ``max_decompressed_bytes`` of text (a gzip bomb costs at most the cap);
* gives the whole scrape -- connect, TLS, headers, body -- one deadline: every socket read
  waits at most for what is left of it, so a server trickling bytes cannot hold the round;
* never puts URL userinfo (``http://user:secret@host``) into a label or a message
  (:func:`redact_url`); credentials come from the URL (sent, never shown) or, better, from a
  ``--credentials-file`` read at every scrape (:class:`Credentials`).

A refusal raises :class:`ScrapeRefused` with a ``reason`` (:data:`REFUSAL_REASONS`); any
other failure raises :class:`ScrapeFailed` (reason ``down``, ``credentials`` or
``malformed``). Caller-side counting lives in the collectors (``fusebox.collector.scrape.
refused`` / ``.errors``).

An answer within the byte caps is then bounded in what it can make the parser hold
(:func:`bound_series`, called by :func:`scrape`): a sample line with a label set over
``max_label_chars`` characters (a 15 MiB label made prometheus-client's parser take 817 MB) and
the sample lines past ``max_series`` are dropped before parsing, each counted by reason
(:data:`DROP_REASONS`, ``fusebox.collector.scrape.dropped``); the rest of the answer is used.
So are the sample lines of every ``model_name`` value after the first ``max_models`` of the answer
(``model_limit``): each model an engine reports becomes series of the collector's output (KV
usage and limit per GPU, an alignment histogram per model), so an engine naming a new model in
every line would otherwise multiply that output up to ``max_series`` times. An engine serves one
model; the first time an endpoint's lines are dropped for it the collector says so once.
"""

from __future__ import annotations

import base64
import http.client
import math
import re
import socket
import ssl
import stat
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit, urlunsplit

MIB = 1 << 20
# A vLLM /metrics is 40-50 KB, a busy multi-LoRA one a few MB: 16 MiB is far above any real
# answer and keeps a refused scrape's memory to tens of MB.
DEFAULT_MAX_BODY_BYTES = 16 * MIB
DEFAULT_MAX_DECOMPRESSED_BYTES = 16 * MIB
DEFAULT_TIMEOUT_S = 2.0
# A vLLM /metrics holds a few hundred series, a multi-LoRA one a few thousand; label values are
# model names and paths (well under 300 characters).
DEFAULT_MAX_SERIES = 50_000
DEFAULT_MAX_LABEL_CHARS = 4096
# distinct model_name values used per scrape: an engine serves one model (vLLM and SGLang label
# their series with its served name); more is an engine, or something posing as one, to bound
DEFAULT_MAX_MODELS = 8
# A sample line may hold this much besides its label set (name, value, timestamp).
_LINE_SLACK = 512
_CHUNK = 64 * 1024
# why a sample line is dropped (fusebox.collector.scrape.dropped)
DROP_REASONS = ("label_too_long", "series_limit", "model_limit")
# the model_name label of a sample line's label set (its value as written, escapes and all)
_MODEL_LABEL = re.compile(r'[{,]\s*model_name\s*=\s*"((?:[^"\\]|\\.)*)"')

REFUSAL_REASONS = ("body_too_large", "decompressed_too_large", "deadline")
# scrape-error reason counted for each refusal reason (fusebox.collector.scrape.errors)
ERROR_REASON = {"body_too_large": "too_large", "decompressed_too_large": "too_large", "deadline": "timeout"}


class ScrapeRefused(Exception):
    """A limit was hit; ``reason`` is one of :data:`REFUSAL_REASONS`; the message names the option."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


class ScrapeFailed(Exception):
    """The scrape failed otherwise: ``reason`` is ``down`` (refused, reset, non-2xx status),
    ``credentials`` (unreadable credentials file) or ``malformed`` (an encoding not asked for)."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


def format_bytes(n: int) -> str:
    """``16777216`` -> ``"16 MiB"``; exact binary multiples get a unit, others stay bytes."""
    for unit, size in (("GiB", 1 << 30), ("MiB", MIB), ("KiB", 1024)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} B"


_SIZE = re.compile(r"^\s*([0-9]+)\s*(B|KB|MB|GB|KiB|MiB|GiB|k|K|M|G)?\s*$")
_UNITS = {None: 1, "B": 1, "KB": 1000, "MB": 1000**2, "GB": 1000**3, "k": 1024, "K": 1024, "KiB": 1024,
          "M": MIB, "MiB": MIB, "G": 1 << 30, "GiB": 1 << 30}


def parse_size(text: str) -> int:
    """``"16MiB"`` -> 16777216, ``"1000"`` -> 1000 (KB/MB/GB are decimal, K/M/G and KiB/MiB/GiB
    binary). Raises ValueError unless the result is a positive whole number of bytes."""
    m = _SIZE.match(str(text))
    if not m or int(m.group(1)) * _UNITS[m.group(2)] <= 0:
        raise ValueError(f"{text!r} is not a positive size in bytes (e.g. 16MiB, 50MB, 1048576)")
    return int(m.group(1)) * _UNITS[m.group(2)]


def redact_url(endpoint: str) -> str:
    """``endpoint`` without URL userinfo: ``http://u:p@h:9/m`` -> ``http://h:9/m``. Paths and
    URLs without userinfo come back unchanged. This is the form used in labels and messages."""
    if "://" not in endpoint or "@" not in endpoint:
        return endpoint
    parts = urlsplit(endpoint)
    netloc = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


@dataclass(frozen=True)
class FetchLimits:
    """Caps of one scrape. ``max_body_bytes`` counts the body as sent (compressed or not),
    ``max_decompressed_bytes`` the text after gzip/deflate decoding (bytes); ``max_series`` and
    ``max_label_chars`` bound what the parser is given, ``max_models`` the distinct ``model_name``
    values used (:func:`bound_series`)."""

    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES
    max_series: int = DEFAULT_MAX_SERIES  # sample lines used per scrape
    max_label_chars: int = DEFAULT_MAX_LABEL_CHARS  # characters of a sample's label set ({...})
    max_models: int = DEFAULT_MAX_MODELS  # distinct model_name label values used per scrape


class Credentials:
    """The ``Authorization`` header from a credentials file, re-read at every scrape (a rotated
    token is picked up without a restart). One line: ``user:password`` -> Basic (split at the
    first ``:``), anything else -> ``Bearer <line>``.

    A file readable by group or others is logged once per change of its mode (never its
    content). An unreadable or empty file raises :class:`ScrapeFailed` (reason
    ``credentials``) and nothing is sent.
    """

    def __init__(self, path: str | Path, log: Callable[[str], None] | None = None):
        self.path = Path(path)
        self.log = log
        self._warned_mode: int | None = None

    def header(self) -> str:
        try:
            st = self.path.stat()
            text = self.path.read_text(encoding="utf-8")
        except OSError as e:
            raise ScrapeFailed("credentials", f"cannot read credentials file {self.path} ({e.strerror})") from None
        mode = stat.S_IMODE(st.st_mode)
        if mode & 0o077 and mode != self._warned_mode and self.log:
            self.log(f"warning: credentials file {self.path} is readable by group or others "
                     f"(mode {mode:04o}); chmod 600 it")
        self._warned_mode = mode if mode & 0o077 else None
        line = text.strip().splitlines()[0].strip() if text.strip() else ""
        if not line:
            raise ScrapeFailed("credentials", f"credentials file {self.path} is empty")
        if ":" in line:
            return "Basic " + base64.b64encode(line.encode()).decode()
        return "Bearer " + line


# ------------------------------------------------------------------------- deadline sockets
def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("deadline passed")
    return left


class _DeadlineSocket(socket.socket):
    """A socket whose every read waits at most until ``_deadline`` (monotonic seconds)."""

    _deadline = math.inf

    def recv_into(self, buffer, nbytes=0, flags=0):  # http.client reads through SocketIO.readinto
        self.settimeout(_left(self._deadline))
        return super().recv_into(buffer, nbytes, flags)

    def recv(self, bufsize, flags=0):
        self.settimeout(_left(self._deadline))
        return super().recv(bufsize, flags)


class _DeadlineSSLSocket(ssl.SSLSocket):
    _deadline = math.inf

    def recv_into(self, buffer, nbytes=None, flags=0):
        self.settimeout(_left(self._deadline))
        return super().recv_into(buffer, nbytes, flags)

    def recv(self, buflen=1024, flags=0):
        self.settimeout(_left(self._deadline))
        return super().recv(buflen, flags)


def _connection(scheme: str, host: str, port: int | None, deadline: float) -> http.client.HTTPConnection:
    class Conn(http.client.HTTPConnection):
        def connect(self) -> None:
            raw = socket.create_connection((self.host, self.port), timeout=_left(deadline))
            sock = _DeadlineSocket(fileno=raw.detach())
            sock._deadline = deadline
            sock.settimeout(_left(deadline))
            if scheme == "https":
                ctx = ssl.create_default_context()
                ctx.sslsocket_class = _DeadlineSSLSocket
                tls = ctx.wrap_socket(sock, server_hostname=host)  # handshake under the socket timeout
                assert isinstance(tls, _DeadlineSSLSocket)  # ctx.sslsocket_class; wrap_socket is typed SSLSocket
                tls._deadline = deadline
                self.sock = tls
            else:
                self.sock = sock

    return Conn(host, port or (443 if scheme == "https" else 80))


# ------------------------------------------------------------------------- the fetcher
class Fetcher:
    """``fetch(endpoint, timeout_s) -> str`` for the collectors: an http(s) URL or a file path.

    ``timeout_s`` is the deadline of the whole scrape, seconds. Raises :class:`ScrapeRefused`
    (a cap or the deadline) or :class:`ScrapeFailed`; messages carry the endpoint without
    userinfo.
    """

    def __init__(self, limits: FetchLimits | None = None, credentials: Credentials | None = None):
        self.limits = limits or FetchLimits()
        self.credentials = credentials

    def __call__(self, endpoint: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> str:
        if endpoint.startswith(("http://", "https://")):
            return self._http(endpoint, timeout_s)
        return self._file(endpoint)

    def _too_large(self, declared: int | None = None) -> ScrapeRefused:
        cap = self.limits.max_body_bytes
        size = f"is {declared} bytes (Content-Length), over" if declared is not None else "is over"
        return ScrapeRefused("body_too_large", f"refused: the answer {size} --max-body-bytes {format_bytes(cap)} "
                             f"({cap} bytes); its data is not used")

    def _file(self, path: str) -> str:
        cap = self.limits.max_body_bytes
        with open(path, "rb") as f:  # OSError -> "down", as before
            data = f.read(cap + 1)
        if len(data) > cap:
            raise self._too_large()
        return data.decode("utf-8", errors="replace")

    def _http(self, url: str, timeout_s: float) -> str:
        shown = redact_url(url)
        parts = urlsplit(url)
        headers = {"Accept-Encoding": "gzip", "Accept": "text/plain;version=0.0.4;q=1,*/*;q=0.1",
                   "User-Agent": "fusebox-collector"}
        if self.credentials is not None:
            headers["Authorization"] = self.credentials.header()
        elif parts.username is not None:  # sent as the URL asks, never shown (redact_url)
            user_pass = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
            headers["Authorization"] = "Basic " + base64.b64encode(user_pass.encode()).decode()
        deadline = time.monotonic() + timeout_s
        path = urlunsplit(("", "", parts.path or "/", parts.query, ""))
        conn = _connection(parts.scheme, parts.hostname or "", parts.port, deadline)
        try:
            conn.request("GET", path, headers=headers)
            resp = conn.getresponse()
            if not 200 <= resp.status < 300:
                raise ScrapeFailed("down", f"HTTP {resp.status} {resp.reason} from {shown}")
            length = resp.getheader("Content-Length")
            if length and length.strip().isdigit() and int(length) > self.limits.max_body_bytes:
                raise self._too_large(int(length))
            return self._read_body(resp)
        except TimeoutError:  # socket.timeout is TimeoutError; _left raises it too
            raise ScrapeRefused("deadline", f"refused: the scrape took longer than its {timeout_s:g} s "
                                "deadline (--timeout); its data is not used") from None
        except (ScrapeRefused, ScrapeFailed):
            raise
        except (OSError, http.client.HTTPException, ssl.SSLError) as e:
            raise ScrapeFailed("down", f"{type(e).__name__}: {e}" if str(e) else type(e).__name__) from None
        finally:
            conn.close()

    def _read_body(self, resp: http.client.HTTPResponse) -> str:
        enc = (resp.getheader("Content-Encoding") or "identity").strip().lower()
        if enc in ("gzip", "x-gzip"):
            make = lambda: zlib.decompressobj(16 + zlib.MAX_WBITS)  # noqa: E731
        elif enc == "deflate":
            make = lambda: zlib.decompressobj()  # noqa: E731
        elif enc == "identity":
            make = None
        else:
            raise ScrapeFailed("malformed", f"Content-Encoding {enc!r} was not asked for (only gzip)")
        wire_cap, text_cap = self.limits.max_body_bytes, self.limits.max_decompressed_bytes
        wire = text = 0
        out: list[bytes] = []
        d = make() if make else None
        while True:
            chunk = resp.read1(_CHUNK)
            if not chunk:
                break
            wire += len(chunk)
            if wire > wire_cap:
                raise self._too_large()
            if d is None or make is None:  # both or neither
                out.append(chunk)
                continue
            data = chunk
            while data:
                # max_length bounds each step: a bomb never expands past the cap in memory
                try:
                    piece = d.decompress(data, text_cap - text + 1)
                except zlib.error as e:
                    raise ScrapeFailed("malformed", f"bad {enc} body: {e}") from None
                text += len(piece)
                if text > text_cap:
                    raise ScrapeRefused("decompressed_too_large",
                                        f"refused: the {enc} answer expands past --max-decompressed-bytes "
                                        f"{format_bytes(text_cap)} ({text_cap} bytes); its data is not used")
                out.append(piece)
                data = d.unconsumed_tail
                if d.eof and d.unused_data:  # concatenated gzip members
                    data, d = d.unused_data, make()
        if d is None and wire > text_cap:
            raise ScrapeRefused("decompressed_too_large", f"refused: the answer is over --max-decompressed-bytes "
                                f"{format_bytes(text_cap)} ({text_cap} bytes); its data is not used")
        return b"".join(out).decode("utf-8", errors="replace")


default_fetcher = Fetcher()


def counted_readings(counts) -> list[tuple[dict, int]]:
    """``({endpoint, reason}, count)`` per key ``(endpoint, reason)`` of a ``Counter``, sorted: what
    the pipeline's ``set_*`` self-metric setters take."""
    from fusebox import conventions as C

    a = C.ATTR
    return [({a["endpoint"]: ep, a["reason"]: reason}, n) for (ep, reason), n in sorted(counts.items())]


def bound_series(text: str, limits: FetchLimits) -> tuple[str, dict[str, int]]:
    """``text`` without the sample lines over the caps, and ``{reason: lines dropped}``.

    A sample line whose label set (``{`` to the last ``}``) is over ``limits.max_label_chars``
    characters is dropped (``label_too_long``), so is a sample line whose ``model_name`` label is
    none of the first ``limits.max_models`` values of the text (``model_limit``), and so is every
    sample line after the first ``limits.max_series`` kept (``series_limit``); comment lines that
    long are dropped uncounted. An over-long line is skipped without being copied.
    """
    out: list[str] = []
    dropped = dict.fromkeys(DROP_REASONS, 0)
    longest = limits.max_label_chars + _LINE_SLACK
    series, pos, n = 0, 0, len(text)
    models: set[str] = set()
    while pos < n:
        end = text.find("\n", pos)
        end = n if end < 0 else end
        comment = text.startswith("#", pos)
        if end - pos > longest:
            dropped["label_too_long"] += not comment
        elif end > pos:
            line = text[pos:end]
            opened = line.find("{")
            if not comment and opened >= 0 and line.rfind("}") - opened - 1 > limits.max_label_chars:
                dropped["label_too_long"] += 1
            elif comment or not line.strip():
                out.append(line)
            elif opened >= 0 and "model_name" in line and _over_models(line, opened, models, limits.max_models):
                dropped["model_limit"] += 1
            elif series >= limits.max_series:
                dropped["series_limit"] += 1
            else:
                series += 1
                out.append(line)
        pos = end + 1
    return "\n".join(out) + "\n", {k: v for k, v in dropped.items() if v}


def _over_models(line: str, opened: int, models: set[str], cap: int) -> bool:
    """Whether ``line``'s ``model_name`` is a new value past ``cap`` (else it is added to ``models``)."""
    m = _MODEL_LABEL.search(line, opened)
    if m is None or m.group(1) in models:
        return False
    if len(models) >= cap:
        return True
    models.add(m.group(1))
    return False


def scrape(fetch: Callable[[str, float], str], endpoint: str, timeout_s: float, errors, refused, dropped=None,
           log: Callable[[str], None] | None = None) -> tuple[str | None, str, str]:
    """One counted scrape: ``(text, "ok", "")`` or ``(None, error reason, message)``.

    ``errors``, ``refused`` and ``dropped`` are ``Counter`` s keyed ``(endpoint without userinfo,
    reason)``; a refusal counts in both of the first (its error reason is :data:`ERROR_REASON`);
    ``dropped`` counts the sample lines :func:`bound_series` left out (with the limits of
    ``fetch.limits``, else the defaults). Exceptions of an injected ``fetch`` count as ``timeout``
    (a ``*Timeout*`` class) or ``down``. Nothing raises. ``log`` hears, once per endpoint and
    ``dropped``, the first scrape whose lines were dropped for ``model_limit``.
    """
    label = redact_url(endpoint)
    try:
        limits = getattr(fetch, "limits", None) or FetchLimits()
        text, cut = bound_series(fetch(endpoint, timeout_s), limits)
        for reason, n in cut.items():
            if dropped is None:
                continue
            if reason == "model_limit" and not dropped[(label, reason)] and log:
                log(f"{label}: more than {limits.max_models} model_name values: {n} sample lines of the others left "
                    "out, this scrape and each one after (counted in fusebox_collector_scrape_dropped_total, reason "
                    "model_limit); an engine serves one model -- check that the endpoint is one engine's /metrics, "
                    "or raise --max-models")
            dropped[(label, reason)] += n
        return text, "ok", ""
    except ScrapeRefused as e:
        refused[(label, e.reason)] += 1
        reason, detail = ERROR_REASON[e.reason], str(e)
    except ScrapeFailed as e:
        reason, detail = e.reason, str(e)
    except Exception as e:  # noqa: BLE001 -- an injected fetch: down, refused, missing file
        reason = "timeout" if "timeout" in type(e).__name__.lower() else "down"
        detail = str(e) or type(e).__name__
    errors[(label, reason)] += 1
    return None, reason, detail.replace(endpoint, label)
