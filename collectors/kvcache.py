"""KV-cache collector: engine /metrics (vLLM, SGLang, TGI) + model config.json -> bytes.

No engine exposes KV bytes. This module derives them:

* **bytes per token** (:func:`kv_geometry`) = 2 (K and V) x attention layers x KV heads x
  head dim x element size, from the model's ``config.json`` (top level, ``text_config`` or
  ``llm_config``; ``dtype`` or ``torch_dtype``; ``num_key_value_heads`` for GQA, defaulting
  to the attention heads; ``head_dim`` or hidden / heads; only ``full_attention`` entries of
  ``layer_types`` for hybrid models; transformers' class defaults (:data:`_MODEL_DEFAULTS`:
  llama, mistral, qwen2, qwen2_vl_text, qwen2_5_vl_text) when a sub-config such as
  llava-hf's ``text_config`` omits its geometry; Mllama ``cross_attention_layers`` excluded because they cache image tokens,
  not text tokens) and a KV-cache dtype override (``fp8`` -> 1 byte);
* **vLLM**: usage fraction from ``vllm:kv_cache_usage_perc`` or, before 0.10,
  ``vllm:gpu_cache_usage_perc`` (a fraction 0-1 despite the name; docs/pitfalls.md P4: a dump may
  carry both, read one, never add them), pool = ``kv_cache_size_tokens`` (vLLM >= 0.33, the
  group-aware capacity its docs prefer) or else ``num_gpu_blocks`` x ``block_size`` tokens
  from ``vllm:cache_config_info`` (``cache_dtype`` other than ``auto`` overrides the dtype);
* **SGLang** (``sglang:`` or ``sglang_`` prefix): usage = ``token_usage`` x
  ``max_total_num_tokens`` tokens (when the capacity is missing it is taken as
  ``num_used_tokens / token_usage`` and reported as derived); data-parallel ranks (``dp_rank``)
  hold separate pools, so their capacities and tokens in use are summed (:func:`sum_dp_ranks`);
* **TGI**: ``tgi_batch_current_max_tokens`` tokens in use; TGI exposes no capacity, so the
  limit needs ``max_total_tokens`` (its ``--max-batch-total-tokens``).

Several API-server processes reporting the same engine (same model and ``engine`` label,
or the same SGLang engine across ``tp_rank``) are one engine: the **max** is taken, never a
sum or an average.

Each engine is exported as ``fusebox.kv_cache.usage`` / ``.limit`` (By) with ``engine``,
``model`` and, per GPU it runs on, ``hw.id``: with tensor parallelism tp the pool is split
evenly, one series per GPU carrying pool / tp, so ``sum by (hw_id) (limit - usage)`` is the
pool's free bytes on each GPU.

An endpoint that is down, slow or malformed is counted (:attr:`KvCollector.errors`) and
reported; it never raises out of :meth:`KvCollector.collect`. Fetches are bounded
(:mod:`fusebox.collectors.fetch`: byte caps, one deadline per scrape; refusals counted in
:attr:`KvCollector.refused`) and endpoints are labelled and logged without URL userinfo.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from fusebox import conventions as C

# The geometry lives in the spec's layer (kubernetes.engines.models reads it too); re-exported here.
from fusebox.spec.kvgeometry import _MODEL_DEFAULTS as _MODEL_DEFAULTS
from fusebox.spec.kvgeometry import DTYPE_BYTES as DTYPE_BYTES
from fusebox.spec.kvgeometry import ConfigError as ConfigError
from fusebox.spec.kvgeometry import KvGeometry as KvGeometry
from fusebox.spec.kvgeometry import _dtype_bytes
from fusebox.spec.kvgeometry import kv_geometry as kv_geometry
from fusebox.spec.kvgeometry import load_model_config as load_model_config

from ._model import Reading
from .fetch import DEFAULT_TIMEOUT_S, counted_readings, default_fetcher, redact_url, scrape

A = C.ATTR

# The most memory one GPU has (bytes): NVIDIA B300 and AMD Instinct MI355X, 288 GB of HBM3e. The
# KV collector's model-config check compares against it when NVML does not give the GPU's own.
LARGEST_GPU_MEMORY_BYTES = 288e9


# ------------------------------------------------------------------------- /metrics parsing
@dataclass
class EngineKv:
    """One engine's KV state as read from /metrics. Token counts, fraction 0-1."""

    kind: str  # vllm | sglang | tgi
    key: str  # engine identity within the endpoint set
    model: str
    usage_fraction: float | None = None
    used_tokens: float | None = None
    capacity_tokens: float | None = None
    cache_dtype: str | None = None
    # vLLM's gpu_memory_utilization (cache_config_info): the share of each GPU's memory the
    # engine takes for weights, activations and the KV pool together, fraction 0-1
    memory_fraction: float | None = None
    notes: list[str] = field(default_factory=list)
    source_metric: str = ""


class MalformedMetrics(ValueError):
    """The exposition text could not be parsed."""


def parse_families(text: str) -> list:
    """Parse exposition text with prometheus-client's parser.

    Raises:
        MalformedMetrics: for any parse failure (the parser raises ValueError, IndexError,
            TypeError ... on bad input); nothing else escapes.
    """
    from prometheus_client.parser import text_string_to_metric_families

    try:
        return list(text_string_to_metric_families(text))
    except Exception as e:  # noqa: BLE001 -- the parser's errors are not one class
        raise MalformedMetrics(f"{type(e).__name__}: {e}") from None


# The families the KV collector reads. Only their lines go to the parser: a vLLM /metrics is
# 40-50 KB of histograms we do not need, and parsing it all costs ~8 ms per engine and round.
KV_FAMILIES = (
    *C.VLLM_KV_USAGE, C.VLLM_CACHE_CONFIG,
    *(p + n for p in C.SGLANG_PREFIXES for n in ("token_usage", "max_total_num_tokens", "num_used_tokens")),
    "tgi_batch_current_max_tokens",
)  # fmt: skip


def relevant_lines(text: str, families: tuple[str, ...] = KV_FAMILIES) -> str:
    """The lines of ``text`` (samples, HELP and TYPE) belonging to ``families``."""
    keep = []
    for line in text.splitlines():
        s = line.lstrip()
        if s.startswith("#"):
            parts = s.split(None, 3)
            if len(parts) >= 3 and parts[1] in ("HELP", "TYPE") and parts[2].startswith(families):
                keep.append(s)
        elif s.startswith(families):
            keep.append(s)
    return "\n".join(keep) + "\n"


def _fmax(a: float | None, b: float) -> float | None:
    """The larger of ``a`` (None: none yet) and ``b``; a NaN ``b`` from the engine is ignored."""
    if b != b:
        return a
    return b if a is None else max(a, b)


class _Engines(dict[tuple, EngineKv]):
    """The engines of one dump by (kind, model, engine label, SGLang dp_rank), in the order met."""

    def of(self, kind: str, labels: dict) -> EngineKv:
        model = labels.get("model_name", "")
        # SGLang's data-parallel ranks hold separate pools: one entry per rank, summed below
        ekey = (kind, model, labels.get("engine", ""), labels.get("dp_rank", "") if kind == "sglang" else "")
        if ekey not in self:
            self[ekey] = EngineKv(kind, labels.get("engine", ""), model)
        return self[ekey]


def _vllm_usage(samples: dict[str, list], out: _Engines) -> None:
    """vLLM's KV usage: the new name wins; the old one only where the new one is absent (docs/pitfalls.md P4)."""
    for name in C.VLLM_KV_USAGE:
        got = False
        for s in samples.get(name, ()):
            e = out.of("vllm", s.labels)
            if e.source_metric and e.source_metric != name:
                continue
            e.source_metric = name
            e.usage_fraction = _fmax(e.usage_fraction, s.value)
            got = True
        if got:
            break


def _vllm_capacity(labels: dict) -> float:
    """Tokens of KV capacity a cache_config_info sample states.

    Raises:
        KeyError, ValueError: it states none ("None" before the engine has profiled memory).
    """
    # vLLM >= 0.33: kv_cache_size_tokens, the capacity its docs prefer (group-aware: right
    # for hybrid models, where num_gpu_blocks x block_size is not); else the blocks.
    if _number(labels.get("kv_cache_size_tokens")):
        return float(labels["kv_cache_size_tokens"])
    return float(labels["num_gpu_blocks"]) * float(labels["block_size"])


def _vllm_configs(samples: dict[str, list], out: _Engines) -> None:
    """cache_config_info carries no model_name; it belongs to the engine core with the same
    `engine` label (or to every engine of the dump when it has none)."""
    cfgs: dict[str, tuple[float, str | None, float | None]] = {}
    for s in samples.get(C.VLLM_CACHE_CONFIG, ()):
        try:
            cap = _vllm_capacity(s.labels)
        except (KeyError, ValueError):
            continue
        prev = cfgs.get(s.labels.get("engine", ""))
        if prev is None or cap > prev[0]:
            util = s.labels.get(C.VLLM_MEMORY_SHARE_LABEL)
            cfgs[s.labels.get("engine", "")] = (cap, s.labels.get("cache_dtype"),
                                                float(util) if _number(util) and float(util) <= 1 else None)
    for e in [e for e in out.values() if e.kind == "vllm"]:
        cfg = cfgs.get(e.key) or cfgs.get("") or (next(iter(cfgs.values())) if len(cfgs) == 1 else None)
        if cfg:
            e.capacity_tokens, e.cache_dtype, e.memory_fraction = cfg


def _sglang(samples: dict[str, list], out: _Engines) -> None:
    """SGLang, either prefix; tp ranks of one engine carry the same values -> max."""
    for prefix in C.SGLANG_PREFIXES:
        for s in samples.get(prefix + "token_usage", ()):
            e = out.of("sglang", s.labels)
            e.usage_fraction = _fmax(e.usage_fraction, s.value)
            e.source_metric = prefix + "token_usage"
        for s in samples.get(prefix + "max_total_num_tokens", ()):
            e = out.of("sglang", s.labels)
            e.capacity_tokens = _fmax(e.capacity_tokens, s.value)
        for s in samples.get(prefix + "num_used_tokens", ()):
            e = out.of("sglang", s.labels)
            e.used_tokens = _fmax(e.used_tokens, s.value)


def _tgi(samples: dict[str, list], out: _Engines) -> None:
    for s in samples.get("tgi_batch_current_max_tokens", ()):
        e = out.of("tgi", s.labels)
        e.used_tokens = _fmax(e.used_tokens, s.value)
        e.source_metric = "tgi_batch_current_max_tokens"


def _merge_ranks(out: _Engines) -> None:
    """Each SGLang engine's data-parallel ranks as one engine (:func:`sum_dp_ranks`), after the others."""
    ranks: dict[tuple, list[EngineKv]] = {}
    for ekey in [k for k in out if k[3]]:
        ranks.setdefault(ekey[:3], []).append(out.pop(ekey))
    for ekey, rs in ranks.items():
        out[ekey + ("",)] = sum_dp_ranks(rs)


def engines_from_text(text: str) -> list[EngineKv]:
    """Every engine whose KV state ``text`` exposes (vLLM, SGLang, TGI).

    Only the lines of :data:`KV_FAMILIES` are parsed (prometheus-client's parser); a
    malformed line elsewhere in the text does not concern the KV signal.

    Raises:
        MalformedMetrics: unparsable text in those families.
    """
    fams = parse_families(relevant_lines(text))
    samples: dict[str, list] = {}
    for fam in fams:
        for s in fam.samples:
            samples.setdefault(s.name, []).append(s)
    out = _Engines()
    _vllm_usage(samples, out)
    _vllm_configs(samples, out)
    _sglang(samples, out)
    _tgi(samples, out)
    _merge_ranks(out)
    # drop engines that only had config info and no usage (e.g. a partial dump)
    return [e for e in out.values() if e.usage_fraction is not None or e.used_tokens is not None]


def _number(text: str | None) -> bool:
    """Whether a label value is a finite positive number ("None" before vLLM profiled memory)."""
    try:
        return text is not None and 0 < float(text) < math.inf
    except ValueError:
        return False


def sum_dp_ranks(ranks: list[EngineKv]) -> EngineKv:
    """One SGLang engine of several data-parallel ranks (label ``dp_rank``), each with its own KV
    pool: capacity and tokens in use are the ranks' sums (never their max: a max would count one
    rank's pool), the usage fraction their ratio. A rank's tokens in use are its ``token_usage``
    x ``max_total_num_tokens`` (or ``num_used_tokens``). Where a rank lacks its capacity, no
    capacity is summed (the collector then derives or reports it as for one rank)."""
    first = ranks[0]
    merged = EngineKv(first.kind, first.key, first.model, source_metric=first.source_metric)
    used = [r.usage_fraction * r.capacity_tokens if r.usage_fraction is not None and r.capacity_tokens is not None
            else r.used_tokens for r in ranks]
    if all(u is not None for u in used):
        merged.used_tokens = sum(u for u in used if u is not None)
    caps = [r.capacity_tokens for r in ranks]
    if all(c is not None for c in caps):
        merged.capacity_tokens = sum(c for c in caps if c is not None)
        if merged.used_tokens is not None and merged.capacity_tokens:
            merged.usage_fraction = merged.used_tokens / merged.capacity_tokens
    return merged


# ------------------------------------------------------------------------- the collector
# fetch(endpoint, timeout_s) -> text: http(s) with byte caps and one deadline, or a file
# (collectors/fetch.py). Kept under this name for callers of the old httpx fetch.
default_fetch = default_fetcher


class KvCollector:
    """Turns the /metrics of one engine deployment into KV bytes per GPU.

    Args:
        endpoints: http URLs or file paths; several = API-server processes of the same
            deployment (the max is taken per engine).
        geometry: the model's :class:`KvGeometry` (from :func:`kv_geometry`); None: looked up
            per engine by its ``model_name`` in ``models``.
        models: served model name -> :class:`KvGeometry`, used when ``geometry`` is None (engine
            discovery: the engines file). An engine whose model is not in it gets no bytes: it is
            counted (reason ``unknown_model``) and said once, never guessed.
        gpus: GPU (or MIG) UUIDs the engine runs on; with ``tp`` > 1 one per rank.
        tp: tensor-parallel size (default ``len(gpus)`` or 1). Pool bytes are split evenly.
        engine_id: the ``engine`` attribute (default: the model name, plus ``/<engine>``
            when the dump distinguishes several vLLM engine cores).
        model: the ``model`` attribute when the dump has no ``model_name`` label (TGI).
        max_total_tokens: TGI's pool capacity in tokens (it is not exposed).
        kv_dtype: KV dtype override; otherwise vLLM's ``cache_dtype`` or the model dtype.
        gpu_memory_bytes: total memory of the smallest of ``gpus``, bytes (NVML), for the
            model-config check (:meth:`_check_model_config`); None: :data:`LARGEST_GPU_MEMORY_BYTES`.
        timeout_s: deadline of one endpoint's whole scrape, seconds.
        fetch: ``fetch(endpoint, timeout_s) -> text``, raising on failure (default: a
            :class:`~fusebox.collectors.fetch.Fetcher` with the default caps); injectable for
            tests and the scenario.
        log: where state changes of an endpoint are reported (endpoint without userinfo).

    Errors are counted in :attr:`errors` and refusals (a cap or the deadline) in
    :attr:`refused`, both ``Counter`` s keyed ``(endpoint without userinfo, reason)``.

    Raises:
        ValueError: ``gpus`` given and ``tp`` disagrees with their number.
    """

    def __init__(
        self,
        endpoints: Sequence[str],
        geometry: KvGeometry | None,
        *,
        models: Mapping[str, KvGeometry] | None = None,
        gpus: Sequence[str] = (),
        tp: int | None = None,
        engine_id: str | None = None,
        model: str | None = None,
        max_total_tokens: float | None = None,
        kv_dtype: str | None = None,
        gpu_memory_bytes: float | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        fetch: Callable[[str, float], str] = default_fetcher,
        log: Callable[[str], None] | None = None,
    ):
        self.endpoints = list(endpoints)
        self.geometry = geometry
        self.models = dict(models or {})
        if geometry is None and models is None:
            raise ValueError("KvCollector needs a geometry or a models table")
        # how to fix a missing hw_id, said with the no_gpu reason (engine discovery says its own)
        self.no_gpu_fix = "pass --gpu GPU-UUID, one per tensor-parallel rank (nvidia-smi -L lists them)"
        self.gpus = list(gpus)
        self.tp = tp or (len(self.gpus) or 1)
        if self.gpus and self.tp != len(self.gpus):
            raise ValueError(f"--tp {self.tp} but {len(self.gpus)} --gpu given: give one GPU per tensor-parallel rank")
        self.engine_id = engine_id
        self.model = model
        self.max_total_tokens = max_total_tokens
        self.kv_dtype = kv_dtype
        self.gpu_memory_bytes = gpu_memory_bytes
        self.timeout_s = timeout_s
        self.fetch = fetch
        self.log = log
        self.errors: Counter = Counter()  # (endpoint without userinfo, reason) -> count
        self.refused: Counter = Counter()  # (endpoint without userinfo, refusal reason) -> count
        self.dropped: Counter = Counter()  # (endpoint without userinfo, drop reason) -> sample lines
        self._last_state: dict[str, str] = {}
        self.notes: set[str] = set()
        self.incomplete: Counter = Counter()  # (engine, reason) -> rounds
        self._told: set[tuple[str, str]] = set()

    def _incomplete(self, engine: str, reason: str, message: str) -> None:
        """Count a round whose output lacks something; say so once per engine and reason."""
        self.incomplete[(engine, reason)] += 1
        if (engine, reason) not in self._told:
            self._told.add((engine, reason))
            if self.log:
                self.log(f"kv: engine {engine}: {message}")

    def _log_kv(self, message: str) -> None:
        if self.log:
            self.log(f"kv: {message}")

    def _report(self, endpoint: str, state: str, detail: str = "") -> None:
        if self._last_state.get(endpoint) != state:
            self._last_state[endpoint] = state
            if self.log and state != "ok":
                self.log(f"kv: {endpoint}: {state}{': ' + detail if detail else ''}")
            elif self.log and state == "ok" and detail == "recovered":
                self.log(f"kv: {endpoint}: ok again")

    def poll(self) -> list[EngineKv]:
        """Fetch and parse every endpoint; merge engines by identity with max."""
        merged: dict[tuple, EngineKv] = {}
        for raw in self.endpoints:
            text, state, detail = scrape(self.fetch, raw, self.timeout_s, self.errors, self.refused, self.dropped,
                                         log=self._log_kv if self.log else None)
            ep = redact_url(raw)  # labels and messages never carry userinfo
            if text is None:
                self._report(ep, state, detail)
                continue
            try:
                engines = engines_from_text(text)
            except MalformedMetrics as err:
                self.errors[(ep, "malformed")] += 1
                self._report(ep, "malformed", str(err))
                continue
            if not engines:
                self.errors[(ep, "no_kv_metric")] += 1
                self._report(ep, "no_kv_metric", "no vLLM/SGLang/TGI KV metric in the text")
                continue
            self._report(ep, "ok", "recovered" if self._last_state.get(ep, "ok") != "ok" else "")
            for e in engines:
                k = (e.kind, e.model, e.key)
                m = merged.get(k)
                if m is None:
                    merged[k] = e
                    continue
                for f in ("usage_fraction", "used_tokens", "capacity_tokens"):
                    a, b = getattr(m, f), getattr(e, f)
                    setattr(m, f, b if a is None else a if b is None else max(a, b))
        return list(merged.values())

    def engine_bytes(self, e: EngineKv, geo: KvGeometry | None = None) -> tuple[float | None, float | None]:
        """(usage bytes, limit bytes) of a whole engine (before the tp split), with ``geo`` (default
        :attr:`geometry`)."""
        geo = geo or self.geometry
        assert geo is not None
        dtype = self.kv_dtype or (e.cache_dtype if e.cache_dtype not in (None, "auto") else None)
        bpt = geo.bytes_per_token
        if dtype:
            try:
                bpt = 2 * geo.layers * geo.kv_heads * geo.head_dim * _dtype_bytes(dtype, "cache_dtype")
            except ConfigError as err:
                self.notes.add(str(err))
        cap = e.capacity_tokens
        if e.kind == "tgi":
            cap = self.max_total_tokens
        if cap is None and e.kind == "sglang" and e.used_tokens and e.usage_fraction:
            cap = e.used_tokens / e.usage_fraction
            self.notes.add("sglang: max_total_num_tokens missing; capacity derived as num_used_tokens / token_usage")
        used = None
        if e.usage_fraction is not None and cap is not None:
            used = e.usage_fraction * cap
        elif e.used_tokens is not None:
            used = e.used_tokens
        return (None if used is None else used * bpt, None if cap is None else cap * bpt)

    def collect(self) -> list[Reading]:
        """One round: usage and limit readings per engine and GPU (pool / tp each)."""
        engines = self.poll()
        multi = len({e.key for e in engines if e.kind == "vllm"}) > 1
        out: list[Reading] = []
        for e in engines:
            model = e.model or self.model or ""
            engine = self.engine_id or model or "engine"
            if multi and e.key:
                engine = f"{engine}/{e.key}"
            geo = self.geometry or self.models.get(model)
            if geo is None:
                known = ", ".join(sorted(self.models)) or "none"
                self._incomplete(engine, "unknown_model",
                                 f"serves model {model or '(no model_name label)'!r}, which the engines file does not "
                                 f"name (it knows: {known}), so no KV bytes are exported for it -- add the model to "
                                 "kubernetes.engines.models in the spec (its config.json or its geometry) and run "
                                 "`fusebox generate`")
                continue
            usage, limit = self.engine_bytes(e, geo)
            base = {A["engine"]: engine, A["model"]: model}
            self._check_complete(e, engine, usage, limit)
            self._check_model_config(e, engine, limit, geo)
            targets: Sequence[str | None] = self.gpus or [None]
            for gpu in targets:
                attrs = dict(base)
                if gpu:
                    attrs[A["gpu_id"]] = gpu
                if usage is not None and math.isfinite(usage):
                    out.append(Reading("kv_cache_usage", usage / self.tp, attrs))
                if limit is not None and math.isfinite(limit):
                    out.append(Reading("kv_cache_limit", limit / self.tp, attrs))
        return out

    def _check_complete(self, e: EngineKv, engine: str, usage: float | None, limit: float | None) -> None:
        if limit is None:
            missing = {
                "vllm": f"{C.VLLM_CACHE_CONFIG} with num_gpu_blocks and block_size (absent, or 'None' before the "
                        "engine has profiled its memory)",
                "sglang": "sglang:max_total_num_tokens (and num_used_tokens, from which it could be derived)",
                "tgi": "any pool size (TGI exposes none)",
            }[e.kind]
            fix = {"vllm": "scrape a vLLM that exports cache_config_info, once the engine has profiled its memory",
                   "sglang": "scrape an SGLang that exports max_total_num_tokens or num_used_tokens",
                   "tgi": "pass --max-total-tokens (TGI's --max-batch-total-tokens)"}[e.kind]
            cost = ("only the usage bytes are emitted, without fusebox_kv_cache_limit_bytes" if usage is not None
                    else "neither fusebox_kv_cache_usage_bytes nor _limit_bytes is emitted, so the KV signals see nothing")
            self._incomplete(engine, "no_capacity",
                             f"no KV pool capacity in the engine's /metrics (missing: {missing}): {cost}, and the "
                             f"GPU-memory signal cannot subtract the free KV pool -- {fix}")
        if not self.gpus and (usage is not None or limit is not None):
            self._incomplete(engine, "no_gpu",
                             "no --gpu given, so its KV series carry no hw_id: the GPU-memory signal cannot subtract "
                             "this engine's free KV pool and reads device memory alone (an engine that pre-allocates "
                             f"its pool, as vLLM does, keeps it near the warning) -- {self.no_gpu_fix}")

    def _check_model_config(self, e: EngineKv, engine: str, limit: float | None, geo: KvGeometry) -> None:
        """Count and say (reason ``model_config``) when ``--model-config`` plainly is not the
        model the engine serves: vLLM sizes its pool to fit in ``gpu_memory_utilization`` of each
        GPU's memory with the weights, so pool bytes / tp / gpu_memory_utilization is a lower
        bound of each GPU's memory; a bound above the GPU's memory (``gpu_memory_bytes``, else
        the largest GPU made, :data:`LARGEST_GPU_MEMORY_BYTES`) means the bytes per token are
        too large (a 7B config for a 1.1B engine: 23x). A config too small is not caught."""
        if e.kind != "vllm" or not e.memory_fraction or limit is None or not e.capacity_tokens:
            return
        per_gpu = limit / self.tp
        needs = per_gpu / e.memory_fraction
        gpu = self.gpu_memory_bytes or LARGEST_GPU_MEMORY_BYTES
        if needs <= gpu:
            return
        what = ("the GPU's" if self.gpu_memory_bytes else "the largest GPU's")
        self._incomplete(
            engine, "model_config",
            f"--model-config ({geo.source}: {limit / e.capacity_tokens:.0f} bytes per token) does not "
            f"match the model the engine serves ({e.model or 'unnamed'}): its pool of {e.capacity_tokens:.0f} tokens "
            f"would be {per_gpu / 1e9:.1f} GB per GPU, and vLLM's gpu_memory_utilization {e.memory_fraction:g} "
            f"then needs a GPU of {needs / 1e9:.0f} GB or more, over {what} {gpu / 1e9:.0f} GB, so the KV bytes exported "
            f"are too large -- pass the config.json of the model the engine serves")

    def incomplete_readings(self) -> Iterable[tuple[dict, int]]:
        """``({engine, reason}, rounds)`` per incomplete-output reason (``no_gpu``, ``no_capacity``,
        ``model_config``, ``unknown_model``)."""
        for (engine, reason), n in sorted(self.incomplete.items()):
            yield {A["engine"]: engine, A["reason"]: reason}, n

    def error_readings(self) -> Iterable[tuple[dict, int]]:
        """``({endpoint, reason}, count)`` per failed-scrape reason (scrape errors)."""
        for (ep, reason), n in sorted(self.errors.items()):
            yield {A["endpoint"]: ep, A["reason"]: reason}, n

    def dropped_readings(self) -> Iterable[tuple[dict, int]]:
        """``({endpoint, reason}, count)`` of sample lines dropped at a cap (:func:`fetch.bound_series`)."""
        return counted_readings(self.dropped)

    def refused_readings(self) -> Iterable[tuple[dict, int]]:
        """``({endpoint, reason}, count)`` per refusal reason (a cap or the deadline)."""
        for (ep, reason), n in sorted(self.refused.items()):
            yield {A["endpoint"]: ep, A["reason"]: reason}, n
