"""The multimodal stages of a request and the names each engine or gateway gives them: the alias table.

A multimodal request passes download (the media fetched from its URL), decode (the bytes made
pixels, frames or samples, and the processor's resize / patching), encoder (the vision or audio
encoder's forward pass), the encoder / embedding cache (a hit skips the encoder), and the
hand-off (the embeddings moved to the language model, across processes or nodes when the
encoder is disaggregated). fusebox's alignment signal measures one number for all of it
(``fusebox_alignment_duration_seconds``, docs/collectors.md); this table says which published
series time each stage, so the alignment dashboard breaks the signal down on one row and its
runbook names the stage that grew (:func:`stage_rules`, :func:`cache_rules`).

:data:`ALIASES` lists every name vLLM, SGLang, smg, Dynamo and llm-d publish or have proposed,
each with its status, version and source (docs/metrics.md section 8 is the same table for people;
``tests/spec/test_mmstages.py`` holds the two to each other). The rules read only ``published`` names
of a producer the spec has (:func:`read_aliases`): the engines of :attr:`Spec.engines`, the SGLang
Model Gateway when ``inpath.shedders`` names one, fusebox's own histogram. A ``proposed`` name is
listed so the table says where a stage will come from, never read: a record over a name nobody
publishes would stay empty and the generator would warn about it. Nothing here adds an absent
alert (the stages are optional, as the engines' other dashboard metrics are).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fusebox import conventions as C

STAGES = ("download", "decode", "encoder", "cache", "handoff")
# The stages timed by a histogram (seconds); ``cache`` is a hit ratio (two counters).
TIMED_STAGES = ("download", "decode", "encoder", "handoff")
# Label of the stage records: which stage a series times, and which cache a hit ratio is of.
STAGE_LABEL = "stage"
CACHE_LABEL = "cache"
# ... and who published it (a StageAlias.producer): two producers of one stage stay apart.
PRODUCER_LABEL = "producer"
# What the records keep: an engine's identity, as the signals' engine records do.
STAGE_BY = ("cluster", "host_name", "engine", "model")
STAGE_QUANTILE = 0.95


@dataclass(frozen=True)
class StageAlias:
    """One name for one stage.

    ``metric``: a histogram family in seconds (timed stages) or, for ``cache``, the hits counter,
    with ``total`` the lookups counter (``misses``: the misses counter instead); ``producer``:
    vllm, sglang, smg, dynamo, llm-d or fusebox; ``status``: ``published`` (in a release or on
    main) or ``proposed`` (an open pull request or issue); ``version`` and ``source``: where the
    name was read; ``cache_id``: the ``cache`` label value of its hit ratio; ``matchers``: label
    matchers the series needs (fusebox's histogram by ``source``)."""

    stage: str
    producer: str
    metric: str
    status: str
    version: str
    source: str
    note: str = ""
    total: str | None = None
    misses: str | None = None
    cache_id: str = ""
    matchers: tuple[tuple[str, str], ...] = ()


SGLANG_COLLECTOR = "sgl-project/sglang python/sglang/srt/metrics/collector.py, EncoderMetricsCollector"
SGLANG_EPD = "SGLang's EPD encoder server (--encoder-only); SGLang #38676 (2026-09) names them as published"
VLLM_PR_50875 = "vllm-project/vllm PR #50875 (open, 2026-08; closes issue #47860)"

ALIASES: tuple[StageAlias, ...] = (
    # -- download ------------------------------------------------------------------------
    StageAlias("download", "vllm", "vllm:mm_media_download_latency_seconds", "proposed", "not released", VLLM_PR_50875,
               "per media item, label media_type"),
    StageAlias("download", "sglang", "(names in the pull request)", "proposed", "not released",
               "sgl-project/sglang PR #38772 (open, 2026-09; closes issue #38676)",
               "tokenizer-manager histograms of media download, load and processor time"),
    # -- decode --------------------------------------------------------------------------
    StageAlias("decode", "vllm", "vllm:mm_media_decode_latency_seconds", "proposed", "not released", VLLM_PR_50875,
               "per media item, label media_type"),
    StageAlias("decode", "sglang", "sglang:encoder_preprocess_seconds", "published", SGLANG_EPD, SGLANG_COLLECTOR,
               "data loading and preprocessing (image decode, video frame sampling); label modality"),
    # -- encoder -------------------------------------------------------------------------
    StageAlias("encoder", "sglang", "sglang:encoder_model_forward_seconds", "published", SGLANG_EPD, SGLANG_COLLECTOR,
               "the encoder's GPU forward pass; label modality"),
    StageAlias("encoder", "vllm", "(none)", "proposed", "not released", "vllm-project/vllm issue #25377 (open, 2025-09)",
               "ViT latency asked for; vLLM publishes no encoder timing"),
    StageAlias("encoder", "fusebox", C.PROM["alignment_duration"], "published", "fusebox",
               "fusebox collect latency --encoder-metric (docs/collectors.md)", "the alignment histogram's source=encoder",
               matchers=((C.ALIGNMENT_SOURCE_LABEL, "encoder"),)),
    # -- encoder / embedding cache -------------------------------------------------------
    StageAlias("cache", "vllm", "vllm:mm_cache_hits_total", "published",
               "vLLM V1 (in the V1 families of Datadog's vLLM fixture, tests/fixtures/collectors); release not pinned",
               "docs/metrics.md section 1", "the multimodal processor cache, in items", total="vllm:mm_cache_queries_total",
               cache_id="vllm_mm"),
    StageAlias("cache", "sglang", "sglang:encoder_cache_hit_tokens_total", "published", SGLANG_EPD, SGLANG_COLLECTOR,
               "the EPD encoder server's embedding cache, in tokens; label modality",
               total="sglang:encoder_cache_total_tokens_total", cache_id="sglang_encoder"),
    StageAlias("cache", "smg", "smg_mm_pixel_cache_hits_total", "published", "smg 1.13.0",
               "the smg 1.13.0 wheel's /metrics HELP text", "the gateway's cache of preprocessed encoder inputs, by model",
               misses="smg_mm_pixel_cache_misses_total", cache_id="smg_pixel"),
    StageAlias("cache", "dynamo", "dynamo_component_embedding_cache_hits_total", "published",
               "Dynamo, merged 2026-07 (PR #11969; the family since PR #8031, 2026-04)",
               "ai-dynamo/dynamo PR #11969 and #8031", "the multimodal embedding cache of a worker",
               misses="dynamo_component_embedding_cache_misses_total", cache_id="dynamo_embedding"),
    StageAlias("cache", "llm-d", "encoder_cache_hits_total", "proposed", "not released",
               "llm-d/llm-d PR #2408 (open, 2026-08)", "the router's mm-embeddings-cache scorer (EPP); prefix not confirmed",
               total="encoder_cache_queries_total", cache_id="llm-d_encoder"),
    # -- hand-off ------------------------------------------------------------------------
    StageAlias("handoff", "sglang", "sglang:encoder_transfer_seconds", "published", SGLANG_EPD, SGLANG_COLLECTOR,
               "embeddings to the prefill node (zmq or mooncake); label backend"),
    StageAlias("handoff", "fusebox", C.PROM["alignment_duration"], "published", "fusebox",
               "alignment_timer, record_alignment (docs/collectors.md)", "the alignment histogram's source=handoff",
               matchers=((C.ALIGNMENT_SOURCE_LABEL, "handoff"),)),
)


def producers_of(spec: Any) -> set[str]:
    """The producers whose published names the rules may read for ``spec``: its engines
    (:attr:`Spec.engines`), ``smg`` when ``inpath.shedders`` names an SGLang Model Gateway, and
    ``fusebox`` (the alignment histogram the signal reads)."""
    from fusebox.spec.inpath import GATEWAY_KINDS

    out = set(spec.engines) | {"fusebox"}
    if any(s.kind in GATEWAY_KINDS for s in spec.inpath.shedders):
        out.add("smg")
    return out


def read_aliases(spec: Any) -> list[StageAlias]:
    """The published aliases of :func:`producers_of`, in table order."""
    have = producers_of(spec)
    return [a for a in ALIASES if a.status == "published" and a.producer in have]


def published_metrics() -> set[str]:
    """Every series name a published alias reads (histograms with _bucket and _count)."""
    out: set[str] = set()
    for a in ALIASES:
        if a.status != "published":
            continue
        if a.stage == "cache":
            out |= {m for m in (a.metric, a.total, a.misses) if m}
        else:
            out |= {a.metric + "_bucket", a.metric + "_count"}
    return out


def records(window: str) -> dict[str, str]:
    """The stage records by role: ``stage_p95`` (seconds, label ``stage``) and ``cache_hit``
    (ratio 0-1, label ``cache``), over the rate ``window`` (``"5m"``)."""
    return {
        "stage_p95": C.record_name("engine", "fusebox_mm_stage_duration_seconds", f"p95_rate{window}"),
        "cache_hit": C.record_name("engine", "fusebox_mm_cache_hit", f"ratio_rate{window}"),
    }
