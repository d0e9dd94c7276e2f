"""Step-time model of the simulated SGLang engine (TP3 DeepSeek-V4.1-Flash with DSpark speculative decoding).

Standard library only: it runs inside the testbed's engine container with a bare Python.
docs/simulator.md explains every term with a worked example; this docstring is the reference.

One decode step of the fleet (all ranks in lockstep, joined by collectives) takes, in milliseconds::

    step(b, t) = [ f(b) * (dense + b12x_off + wo_a(b) + block(k)) - prefetch + check - cap(t) ]
                 + max over ranks r of [ f(b) * engram(r) + contention[r] + poll(r) ]
    step      *= clock * (1 + jitter),  jitter ~ N(0, 1%) seeded, clipped to +-4%

with b the running requests in the batch, k = ``dspark_block_size`` (draft tokens per step), t the batch's
prompt type. The second line is the straggler: every rank waits for the slowest one. Defaults, each cited
from docs/reference.md section 10 (numbers measured on real fleets, used as defaults, not as truths):

- ``dense`` 67.0 ms: what is left of the ~98 ms TP3 c1 step at k=3 "after packed worker shards and b12x"
  once Engram (0.5), ``wo_a`` einsum (11) and the block term (19.5) are taken out.
- ``b12x_off`` 11.5 ms when ``flags['b12x']`` is False: the rest of the gap to the ~120 ms step "before
  packed worker shards and b12x" (120 - 98 - (11 - 0.5)).
- ``wo_a`` 11.0 ms on the bf16 einsum (TP3 always falls back to it, docs/reference.md section 5), 3.5 ms on the fp8
  twin path ("runs the 40 TP3 wo_a calls of a step in ~3.5 ms"). Path by rows M = b * (k + 1) of the target
  verify: ``w8`` serves 2..8 rows, ``w8_mid`` 2..192 rows, anything else stays on einsum.
- ``block(k)`` = 4.5 ms per draft forward * k + 1.5 ms per verified token * (k + 1) (inferred split, 19.5 ms
  at k=3): shorter blocks accept less but verify cheaper.
- ``engram(r)`` 11.0 ms on an unpacked rank, 0.5 ms on a packed one ("~11 ms per step unpacked, ~0.5 ms
  packed"); a rank counts as packed only when all its layers are.
- ``poll(r)`` = 1200 / gpu_poll_ms ms ("a 2 s nvidia-smi poll costs ~0.6 ms per step"; 10 s -> 0.12 ms).
- ``contention[r]``: extra ms per step from background load on rank r (a busy node is the straggler).
- ``prefetch`` 2.2 ms saved with ``engram_prefetch`` ("prefetch saved ~2.2 ms per step, 51.7 -> 49.5 ms"),
  nothing when ``prefetch_check`` is on; ``check`` adds 1.5 ms (inferred: the synchronous path runs again).
- ``cap(t)``: a confidence cap (``verify_cap`` 'conf:X') stops drafting early on hard text: half the draft
  and verify work spent past the first rejection is saved (inferred; gives +5.9 % prose c1 at k=5, close to
  "the confidence cap moved prose c1 66.0 -> 69.7 tok/s").
- ``f(b)`` = 1 + 0.14 * (b - 1) ** 0.9: sub-linear in concurrency (c2 x1.14, c4 x1.38, c8 x1.81, c16 x2.61),
  so aggregate throughput grows with slots while each stream slows ("more slots raise aggregate
  throughput while each stream slows").
- ``clock`` 0.989 when ``flags['clock_lock']`` is False (the 2200 MHz cap cost 0.7-1.5 %), else 1.

Every other key of ``flags`` has no modelled effect: it is listed in ``describe()['unmodelled_flags']``
and leaves the step time unchanged, so an A/B of it measures noise only.

Accepted (committed) tokens per speculative step: each of the k draft tokens is accepted with probability
``ACCEPT_PROB[t]`` until the first rejection, plus the bonus token, so 1..k+1 tokens with mean
(1 - a^(k+1)) / (1 - a). At k=5: prose 3.0, structured 3.7, json 4.7, code 5.7 ("~3 on prose, ~6 on code
(k=5)"); at k=3: prose 2.57, code 3.88. Varied prompts are typed by ``classify_prompt``; a prompt made of a
few repeated words is typed ``repetitive`` and accepts nearly everything (docs/reference.md section 11: a
repetitive code prompt maxes acceptance).

Calibration at the defaults (TP3, k=3, einsum, b12x on, no contention, seed jitter off):
c1 all ranks packed 98.0 ms; one or more ranks unpacked 108.5 ms; unpacked and b12x off 120.0 ms.
"""
from __future__ import annotations

import random
import re
import threading
from dataclasses import asdict, dataclass, field

# docs/reference.md section 10 defaults (see the module docstring for the derivation of each).
DENSE_MS = 67.0
B12X_OFF_MS = 11.5
WO_A_EINSUM_MS = 11.0
WO_A_FP8_MS = 3.5
WO_A_PATH_ROWS = {"einsum": (0, -1), "w8": (2, 8), "w8_mid": (2, 192)}
DRAFT_MS_PER_TOKEN = 4.5
VERIFY_MS_PER_TOKEN = 1.5
ENGRAM_UNPACKED_MS = 11.0
ENGRAM_PACKED_MS = 0.5
POLL_COST_MS_SECONDS = 1200.0  # cost per step = this / poll interval in ms (2000 ms -> 0.6 ms)
PREFETCH_SAVING_MS = 2.2
PREFETCH_CHECK_MS = 1.5
VERIFY_CAP_WASTE_SAVED = 0.5
BATCH_SLOPE = 0.14
BATCH_EXPONENT = 0.9
CLOCK_UNLOCKED_FACTOR = 0.989
JITTER_SIGMA = 0.01
JITTER_CLIP = 0.04
# Prefill (inferred; docs/reference.md gives no prefill figure): a fixed launch cost plus a per-token cost.
PREFILL_BASE_MS = 25.0
PREFILL_MS_PER_TOKEN = 0.05

# Per-draft-token acceptance probability by prompt type (gives ~3 prose / ~6 code committed at k=5).
ACCEPT_PROB = {"prose": 0.71, "structured": 0.80, "json": 0.90, "code": 0.98, "repetitive": 0.995}
PROMPT_TYPES = ("prose", "code", "structured", "json")
KNOWN_FLAGS = {"b12x": True, "clock_lock": True}

_CODE_WORDS = re.compile(
    r"\b(python|function|code|implement|class|def|sql|script|bash|rust|golang|javascript|typescript|"
    r"regex|algorithm|unit test|refactor|compile)\b", re.IGNORECASE)
_JSON_WORDS = re.compile(r"\bjson\b", re.IGNORECASE)
_STRUCTURED_WORDS = re.compile(
    r"\b(table|bullet|bulleted|list|yaml|csv|outline|numbered|columns|markdown|checklist|schedule)\b",
    re.IGNORECASE)


def classify_prompt(text: str) -> str:
    """The prompt type the engine's acceptance depends on: json, code, structured, prose or repetitive."""
    words = re.findall(r"\w+", text.lower())
    if len(words) >= 12 and len(set(words)) / len(words) < 0.3:
        return "repetitive"
    if _JSON_WORDS.search(text):
        return "json"
    if _CODE_WORDS.search(text):
        return "code"
    if _STRUCTURED_WORDS.search(text):
        return "structured"
    return "prose"


@dataclass
class SimConfig:
    """Everything the simulated engine needs; the boot simulator builds it from the container's env and files.

    Per-rank lists left empty are filled for ``tp`` ranks (packed, no contention, no poll); a list of
    another length is an error.
    """
    tp: int = 3
    engram_packed: list[bool] = field(default_factory=list)
    contention_ms: list[float] = field(default_factory=list)
    gpu_poll_ms: list[int] = field(default_factory=list)
    wo_a_path: str = "einsum"
    dspark_block_size: int = 3
    max_running_requests: int = 4
    engram_prefetch: bool = False
    prefetch_check: bool = False
    verify_cap: str | None = None
    flags: dict = field(default_factory=dict)
    time_scale: float = 1.0
    faults: dict = field(default_factory=dict)
    enable_metrics: bool = False
    api_key: str | None = None
    served_model_name: str = "DeepSeek-V4.1-Flash"
    seed: int = 0
    model_path: str = "/models/DeepSeek-V4.1-Flash"
    chunked_prefill_size: int = 1024
    log_interval_steps: int = 40

    def __post_init__(self) -> None:
        if self.tp < 1:
            raise ValueError(f"tp must be at least 1, not {self.tp}")
        for name, default in (("engram_packed", True), ("contention_ms", 0.0), ("gpu_poll_ms", 0)):
            values = getattr(self, name)
            if not values:
                setattr(self, name, [default] * self.tp)
            elif len(values) != self.tp:
                raise ValueError(f"{name} has {len(values)} entries for tp={self.tp}: give one per rank")
        if self.wo_a_path not in WO_A_PATH_ROWS:
            raise ValueError(f"wo_a_path must be one of {sorted(WO_A_PATH_ROWS)}, not {self.wo_a_path!r}")
        if self.dspark_block_size < 1:
            raise ValueError(f"dspark_block_size must be at least 1, not {self.dspark_block_size}")
        if self.max_running_requests < 1:
            raise ValueError(f"max_running_requests must be at least 1, not {self.max_running_requests}")
        if self.time_scale <= 0:
            raise ValueError(f"time_scale must be positive, not {self.time_scale}")
        unknown = set(self.faults) - {"slow_start_s", "drop_stream_after_tokens", "http_500_every",
                                      "omit_usage", "nondeterministic", "nccl_hang_after_requests"}
        if unknown:
            raise ValueError(f"unknown fault keys {sorted(unknown)}")

    def public(self) -> dict:
        """The configuration without the API key (safe to log or serve)."""
        data = asdict(self)
        data["api_key"] = "(set)" if self.api_key else None
        return data


def batch_factor(batch: int) -> float:
    return 1.0 + BATCH_SLOPE * max(0, batch - 1) ** BATCH_EXPONENT


def expected_accepted(alpha: float, block_size: int) -> float:
    """Mean committed tokens per step when each of ``block_size`` drafts is accepted with ``alpha``."""
    if alpha >= 1.0:
        return float(block_size + 1)
    return (1.0 - alpha ** (block_size + 1)) / (1.0 - alpha)


class StepModel:
    """Step time and acceptance of the simulated fleet for one SimConfig (thread-safe)."""

    def __init__(self, config: SimConfig):
        self.config = config
        self._rng = random.Random(config.seed)
        self._lock = threading.Lock()

    # --- terms -----------------------------------------------------------------------------------
    def wo_a_path_for(self, batch: int) -> str:
        rows = batch * (self.config.dspark_block_size + 1)
        lo, hi = WO_A_PATH_ROWS[self.config.wo_a_path]
        return "fp8" if lo <= rows <= hi else "einsum"

    def _cap_saving_ms(self, prompt_type: str) -> float:
        cap = self.config.verify_cap
        if not cap or not str(cap).startswith("conf:"):
            return 0.0
        k = self.config.dspark_block_size
        alpha = ACCEPT_PROB.get(prompt_type, ACCEPT_PROB["prose"])
        drafted_until_reject = (1.0 - alpha ** k) / (1.0 - alpha) if alpha < 1 else float(k)
        wasted = max(0.0, k - drafted_until_reject)
        return VERIFY_CAP_WASTE_SAVED * wasted * (DRAFT_MS_PER_TOKEN + VERIFY_MS_PER_TOKEN)

    def _flag(self, name: str) -> bool:
        value = self.config.flags.get(name, KNOWN_FLAGS[name])
        return str(value).strip().lower() not in ("0", "", "off", "false", "no")

    def terms(self, batch: int = 1, prompt_type: str = "prose") -> dict:
        """The step's terms in ms (no jitter), the straggler rank and the total."""
        cfg = self.config
        k = cfg.dspark_block_size
        factor = batch_factor(batch)
        wo_a_path = self.wo_a_path_for(batch)
        common = {
            "dense_ms": DENSE_MS,
            "b12x_off_ms": 0.0 if self._flag("b12x") else B12X_OFF_MS,
            "wo_a_ms": WO_A_FP8_MS if wo_a_path == "fp8" else WO_A_EINSUM_MS,
            "block_ms": DRAFT_MS_PER_TOKEN * k + VERIFY_MS_PER_TOKEN * (k + 1),
        }
        prefetch = PREFETCH_SAVING_MS if cfg.engram_prefetch and not cfg.prefetch_check else 0.0
        check = PREFETCH_CHECK_MS if cfg.engram_prefetch and cfg.prefetch_check else 0.0
        cap = self._cap_saving_ms(prompt_type)
        per_rank = []
        for rank in range(cfg.tp):
            engram = ENGRAM_PACKED_MS if cfg.engram_packed[rank] else ENGRAM_UNPACKED_MS
            poll = POLL_COST_MS_SECONDS / cfg.gpu_poll_ms[rank] if cfg.gpu_poll_ms[rank] > 0 else 0.0
            per_rank.append({"rank": rank, "engram_ms": engram * factor,
                             "contention_ms": float(cfg.contention_ms[rank]), "poll_ms": poll})
        for entry in per_rank:
            entry["total_ms"] = entry["engram_ms"] + entry["contention_ms"] + entry["poll_ms"]
        straggler = max(per_rank, key=lambda e: e["total_ms"])
        clock = 1.0 if self._flag("clock_lock") else CLOCK_UNLOCKED_FACTOR
        common_total = factor * sum(common.values()) - prefetch + check - cap
        total = clock * (common_total + straggler["total_ms"])
        return {
            "batch": batch, "prompt_type": prompt_type, "block_size": k, "batch_factor": factor,
            "wo_a_path": wo_a_path, **common, "prefetch_saving_ms": prefetch, "prefetch_check_ms": check,
            "verify_cap_saving_ms": cap, "clock_factor": clock, "per_rank": per_rank,
            "straggler_rank": straggler["rank"], "step_ms": total,
        }

    def mean_step_ms(self, batch: int = 1, prompt_type: str = "prose") -> float:
        return self.terms(batch, prompt_type)["step_ms"]

    # --- the interface the engine uses ------------------------------------------------------------
    def step_ms(self, batch: int, prompt_type: str) -> float:
        """One decode step in simulated ms, with the seeded ~1 % jitter."""
        mean = self.mean_step_ms(max(1, batch), prompt_type)
        with self._lock:
            noise = self._rng.gauss(0.0, JITTER_SIGMA)
        return mean * (1.0 + max(-JITTER_CLIP, min(JITTER_CLIP, noise)))

    def prefill_ms(self, new_tokens: int) -> float:
        return PREFILL_BASE_MS + PREFILL_MS_PER_TOKEN * max(0, new_tokens)

    def accept_prob(self, prompt_type: str) -> float:
        return ACCEPT_PROB.get(prompt_type, ACCEPT_PROB["prose"])

    def accepted_tokens(self, prompt_type: str, rng: random.Random) -> int:
        """Committed tokens of one speculative step for one request: 1 (bonus) + accepted drafts, <= k + 1."""
        alpha = self.accept_prob(prompt_type)
        accepted = 0
        while accepted < self.config.dspark_block_size and rng.random() < alpha:
            accepted += 1
        return accepted + 1

    def expected_accepted(self, prompt_type: str) -> float:
        return expected_accepted(self.accept_prob(prompt_type), self.config.dspark_block_size)

    def describe(self, batch: int = 1, prompt_type: str = "prose") -> dict:
        """The terms of the step time, the acceptance per type and the unmodelled flags, for the record."""
        terms = self.terms(batch, prompt_type)
        return {
            "model": "sparkfleet engine step model v1 (docs/simulator.md)",
            "terms": terms,
            "step_ms_by_batch": {b: round(self.mean_step_ms(b, prompt_type), 3) for b in (1, 2, 4, 8, 16)},
            "accepted_per_step": {t: round(self.expected_accepted(t), 3) for t in ACCEPT_PROB},
            "tok_s_c1": {t: round(1000.0 * self.expected_accepted(t) / self.mean_step_ms(1, t), 2)
                         for t in PROMPT_TYPES},
            "jitter_sigma": JITTER_SIGMA,
            "time_scale": self.config.time_scale,
            "unmodelled_flags": sorted(k for k in self.config.flags if k not in KNOWN_FLAGS),
            "straggler_rank": terms["straggler_rank"],
        }


def accept_rate(accept_len: float, block_size: int) -> float:
    """SGLang's accept rate: the share of draft tokens accepted, from the mean committed per step."""
    return max(0.0, (accept_len - 1.0) / block_size) if block_size else 0.0


__all__ = ["SimConfig", "StepModel", "classify_prompt", "batch_factor", "expected_accepted", "accept_rate",
           "PROMPT_TYPES", "ACCEPT_PROB", "KNOWN_FLAGS"]
