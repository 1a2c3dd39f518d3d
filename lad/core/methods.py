"""Methods (paper §4.3 and the readouts of Tables 4, 7, 8): pure functions of records.

Each maps (records, calibration, options) to (R, N) scores, vectorised over records; the
prediction is the argmax. docs/methods.md states what each computes.

    scores = score("lad", records, calibration, MethodOptions())
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lad.core.blank import ENTROPY, blank_scores
from lad.core.calibrate import (
    OBS_MEANS,
    Calibration,
    check_symmetrised,
    log_attention,
    log_softmax,
    logsumexp,
)
from lad.core.labels import get_scheme
from lad.core.parsing import UNPARSEABLE, majority_vote, parse_answer, parse_answer_is, parse_cot
from lad.core.records import RecordSet
from lad.errors import (
    CalibrationError,
    LadError,
    RecordError,
    SettingError,
    bad_parameter,
    check_choice,
)

LAYER_STRATEGIES = ("top-k", "all")
# The values MethodOptions' named choices allow (the CLI's flags offer these).
CHOICES = {
    "obs_mean": OBS_MEANS,
    "mixture": ("prob", "log"),
    "attn_mean": ("log", "raw"),
}
# log of the smallest positive normal double: where a score would be log 0 (attn-purified at τ = ∞).
LOG_ZERO = math.log(np.finfo(np.float64).tiny)


def flag(default: Any, help: str, **cli: Any) -> Any:
    """A setting declared once: its default, and its flag's help and argparse options (`flags`:
    its option strings; `minimum` or `above`: a number's bound; `flag_default`: the flag's, where
    it is not the setting's), which lad.cli.flags.add_settings reads; `limit`: an EvalConfig
    setting's lad.io.limits.Limit. The settings of RecordSpec, EvalConfig and MethodOptions are
    declared so."""
    return field(default=default, metadata={"help": help, **cli})


def broken_bound(value: Any, metadata: Mapping[str, Any]) -> str | None:
    """The bound a setting's flag() declares (`minimum`, `above`) that a number `value` is
    outside (NaN is outside both), as ">= 1" or "> 0"; None for a value inside, or no number."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return None
    low, above = metadata.get("minimum"), metadata.get("above")
    if low is not None and not value >= low:
        return f">= {low:g}"
    if above is not None and not value > above:
        return f"> {above:g}"
    return None


@dataclass(frozen=True)
class MethodOptions:
    """Options of the attention-guided methods (defaults: the paper's); each field's help (its
    metadata, the CLI's flag) says what it sets.

    tau:         math.inf gives the limit τ → ∞ (π one-hot at argmax π̃).
    layers:      "top-k" (Eq. 9, per record), "all", or a tuple of 0-based layer indices.
    use_prior:   divide attention by the attention prior (Eq. 11); off = Table 4's "no prior".
    obs_mean:    applies when a calibration is fitted, and must match a given calibration.
    layer_range: (first, last) 0-based inclusive, clipped to the records' layers as the official
                 code's hooks are.
    labels:      the label scheme the records were made with; generated replies are parsed in it.
    """

    top_k: int = flag(2, "K layers selected by Eq. 9", minimum=1)
    tau: float = flag(5.0, "τ of Eq. 12, >= 0; inf for the limit", minimum=0.0)
    layers: str | tuple[int, ...] = flag(
        "top-k", "top-k (Eq. 9), all, or comma-separated 0-based layer indices"
    )
    use_prior: bool = True
    obs_mean: str = flag(
        "prob", "Eq. 1 over probabilities (paper, default) or logits (official code)"
    )
    mixture: str = flag(
        "prob", "Eq. 13 in probability space (paper, default) or log space (official code)"
    )
    attn_mean: str = flag(
        "log",
        "Eq. 11 mean of log attention (paper, default) or log of mean attention (official)",
    )
    layer_range: tuple[int, int] | None = flag(
        None,
        "0-based layers Eq. 9 searches (those with softmax attention: all but on a hybrid model "
        "such as Qwen3.5); an end past the model's last is cut to it, a start past it is refused "
        "before model work (default: all; official: 21,35)",
        metavar="FIRST,LAST",
    )
    labels: str = "digits"
    blank_alpha: float | str = flag(
        1.0,
        "α of the blank method (CapCal): a number >= 0, or entropy for α = H(P(·|x)) / log N "
        "(default: %(default)s)",
    )

    def __post_init__(self) -> None:
        get_scheme(self.labels)
        alpha = self.blank_alpha
        real = isinstance(alpha, numbers.Real) and not isinstance(alpha, bool)
        if alpha != ENTROPY and not (real and 0 <= alpha < math.inf):
            raise bad_parameter("blank_alpha", "a finite number >= 0 or 'entropy'", alpha)
        for name, allowed in CHOICES.items():
            check_choice(name, getattr(self, name), allowed)
        if isinstance(self.layers, str):
            check_choice("layers", self.layers, LAYER_STRATEGIES)
        elif not self.layers or not all(isinstance(i, int) for i in self.layers):
            must = "'top-k', 'all' or a non-empty tuple of layer indices"
            raise bad_parameter("layers", must, self.layers, instead=True)
        if not isinstance(self.top_k, int) or self.top_k < 1:
            raise bad_parameter("top_k", "an integer >= 1", self.top_k)
        if not (isinstance(self.tau, numbers.Real) and self.tau >= 0):  # NaN fails `>= 0`
            raise bad_parameter("tau", "a number >= 0 (math.inf for the limit)", self.tau)
        if self.layer_range is not None and (
            len(self.layer_range) != 2 or not 0 <= self.layer_range[0] <= self.layer_range[1]
        ):
            must = "(first, last) with 0 <= first <= last"
            raise bad_parameter("layer_range", must, self.layer_range, instead=True)


# ---------------------------------------------------------------------------------------------
# Layer selection and the attention posterior (Eqs. 8-12).


def selected_layers(records: RecordSet, options: MethodOptions = MethodOptions()) -> np.ndarray:
    """(R, K') 0-based layer indices L* used for each record (K' = K, L or the fixed list)."""
    r, nl = len(records), records.num_layers
    if options.layers == "all":
        return np.broadcast_to(np.arange(nl), (r, nl))
    if not isinstance(options.layers, str):
        bad = [i for i in options.layers if not 0 <= i < nl]
        if bad:
            raise LadError(f"layers {bad} are out of range: the records have L = {nl} layers")
        return np.broadcast_to(np.array(options.layers, dtype=np.int64), (r, len(options.layers)))
    first, last = options.layer_range or (0, nl - 1)
    check_layer_range(options.layer_range, nl)
    last = min(last, nl - 1)  # a range past the last layer is clipped, as in the official code
    check_top_k(options.top_k, nl, "the records")
    strength = records.attention[:, first : last + 1, :].sum(axis=2)  # Eq. 8, (R, L')
    k = min(options.top_k, last - first + 1)
    # Stable sort of −S: ties go to the lower layer, so selection is deterministic (Eq. 9).
    return np.argsort(-strength, axis=1, kind="stable")[:, :k] + first


def check_top_k(top_k: int, num_layers: int | None, what: object) -> None:
    """K of Eq. 9 cannot exceed the L layers of `what` (the records, a calibration, a model): an
    error, not a silent cut (inside a layer_range K is capped). num_layers None: not known yet."""
    if num_layers is not None and top_k > num_layers:
        raise SettingError(f"top_k {top_k} is more than the {num_layers} layers of {what}")


def check_layer_range(layer_range: tuple[int, int] | None, num_layers: int) -> None:
    """A layer range must start at one of the model's L layers (its end is clipped to them)."""
    if layer_range is not None and layer_range[0] >= num_layers:
        raise LadError(
            f"layer_range {tuple(layer_range)} starts past the last layer: the model has "
            f"L = {num_layers} attention layers (0..{num_layers - 1}); pass --layer-range "
            "FIRST,LAST within them"
        )


def _mean_log_attention(attention: np.ndarray, layers: np.ndarray, attn_mean: str) -> np.ndarray:
    """(R, N): mean over the selected layers (R, K) of log a, or log of the mean a ("raw")."""
    picked = np.take_along_axis(attention, layers[:, :, None], axis=1)  # (R, K, N)
    if attn_mean == "raw":
        return log_attention(picked.mean(axis=1))
    return log_attention(picked).mean(axis=1)


def lad_log_posterior(
    records: RecordSet, calibration: Calibration | None, options: MethodOptions = MethodOptions()
) -> np.ndarray:
    """(R, N) log π = log softmax(τ · log π̃) (Eqs. 11-12).

    τ = ∞ gives the limit: π uniform over the positions where π̃ is largest (one-hot without a
    tie), log 0 = -inf elsewhere. τ = 0 gives the uniform π.
    """
    layers = selected_layers(records, options)
    log_pt = _mean_log_attention(records.attention, layers, options.attn_mean)  # log π̃ + const
    if options.use_prior:
        _need_calibration(calibration, records, "the attention prior")
        prior = np.broadcast_to(calibration.attention_prior, records.attention.shape)
        # Eq. 11: minus the mean over L* of log â_prior (also so in the official "raw" variant).
        log_pt = log_pt - _mean_log_attention(prior, layers, "log")
    if math.isinf(options.tau):
        top = log_pt == log_pt.max(axis=1, keepdims=True)
        return np.where(top, -np.log(top.sum(axis=1, keepdims=True)), -np.inf)
    return log_softmax(options.tau * log_pt, axis=1)


def lad_posterior(
    records: RecordSet, calibration: Calibration | None, options: MethodOptions = MethodOptions()
) -> np.ndarray:
    """(R, N) the visual posterior π of Eq. 12; rows sum to 1."""
    return np.exp(lad_log_posterior(records, calibration, options))


def log_mixture_prior(
    records: RecordSet, calibration: Calibration, options: MethodOptions = MethodOptions()
) -> np.ndarray:
    """(R, N) log P_prior(j|x) = log Σ_k π_k P̂_bias(j|k) (Eq. 13), or Σ_k π_k log P̂_bias(j|k)
    with mixture="log"."""
    _need_calibration(calibration, records, "the bias matrix")
    log_pi = lad_log_posterior(records, calibration, options)  # (R, N) over k
    if options.mixture == "log":
        return np.exp(log_pi) @ calibration.log_bias
    # (R, K=N, 1) + (1, N, N) -> logsumexp over k -> (R, N)
    return logsumexp(log_pi[:, :, None] + calibration.log_bias[None, :, :], axis=1)


# ---------------------------------------------------------------------------------------------
# The methods.


def _vanilla(records: RecordSet, calibration, options, extra) -> np.ndarray:
    return records.logprobs.copy()


def _pride(records: RecordSet, calibration, options, extra) -> np.ndarray:
    _need_calibration(calibration, records, "PriDe's prior")
    return records.logprobs - calibration.pride_log_prior[None, :]


def _lad(records: RecordSet, calibration, options, extra) -> np.ndarray:
    return records.logprobs - log_mixture_prior(records, calibration, options)  # Eq. 14


def _attn(records: RecordSet, calibration, options, extra) -> np.ndarray:
    layers = selected_layers(records, options)
    return _mean_log_attention(records.attention, layers, options.attn_mean)


def _attn_purified(records: RecordSet, calibration, options, extra) -> np.ndarray:
    log_pi = lad_log_posterior(records, calibration, options)
    # At τ = ∞, log π is -inf off the argmax; scores stay finite (the argmax is unchanged).
    return np.maximum(log_pi, LOG_ZERO) if math.isinf(options.tau) else log_pi


def _perm_avg(records: RecordSet, calibration, options, perm_records) -> np.ndarray:
    """Mean log P per image identity over the item's N cyclic shifts, read at each position."""
    n = records.num_candidates
    check_symmetrised(perm_records, what="perm-avg records")
    names, inverse = np.unique(perm_records.items, return_inverse=True)
    by_image = np.zeros((len(names), n))
    rows = np.repeat(inverse, n)
    np.add.at(by_image, (rows, perm_records.order.reshape(-1)), perm_records.logprobs.reshape(-1))
    by_image /= np.bincount(inverse, minlength=len(names))[:, None]
    k = np.minimum(np.searchsorted(names, records.items), len(names) - 1)
    missing = names[k] != records.items
    if missing.any():
        item = str(records.items[np.flatnonzero(missing)[0]])
        raise RecordError(f"perm-avg records lack item {item!r} ({missing.sum()} records affected)")
    answered = np.zeros(len(names), dtype=np.int64)
    answered[inverse] = perm_records.answer_image()  # each item's, the same under every shift
    other = answered[k] != records.answer_image()
    if other.any():  # same ids, other items: another --items, --seed or data
        item = str(records.items[np.flatnonzero(other)[0]])
        raise RecordError(
            f"perm-avg records of item {item!r} answer another image than the records do: "
            "they were made for other items under the same ids"
        )
    return np.take_along_axis(by_image[k], records.order, axis=1)


# ---------------------------------------------------------------------------------------------
# Generation-based baselines (§5.1): replies in `extra["replies"]`, parsed by lad.core.parsing.


def parsed_paths(method: str, records: RecordSet, labels: list[str]) -> list[list[int]]:
    """Per record, the position each generated path names (-1 = unparseable)."""
    parse = METHODS[method].parse
    assert parse is not None, method
    out = []
    for i, extra in enumerate(records.extra):
        replies = extra.get("replies")
        if not isinstance(replies, list) or not all(isinstance(r, str) for r in replies):
            raise RecordError(
                f"'{method}' reads generated replies, but record {i + 1} (item "
                f"{str(records.items[i])!r}) has no list of strings extra['replies']; make its "
                f"records with lad eval --methods {method}"
            )
        out.append([parse(reply, labels) for reply in replies])
    return out


def _generated_choice(
    method: str, records: RecordSet, options: MethodOptions
) -> tuple[np.ndarray, np.ndarray]:
    """(R, N) votes per position and (R,) the majority (a single path: its own answer, or -1)."""
    labels = get_scheme(options.labels).labels(records.num_candidates)
    paths = parsed_paths(method, records, labels)
    votes = np.zeros((len(records), records.num_candidates))
    counted = [(r, p) for r, positions in enumerate(paths) for p in positions if p != UNPARSEABLE]
    np.add.at(votes, tuple(np.array(counted, dtype=np.int64).reshape(-1, 2).T), 1)
    return votes, np.array([majority_vote(p) for p in paths], dtype=np.int64)


@dataclass(frozen=True)
class Method:
    """A scoring method: `scores(records, calibration, options, extra) -> (R, N)` (None for a
    generation method, whose scores are its parsed replies' votes).

    stage: which records it reads: "records" (the vanilla prompt's), or its own stage's records
    ("instruction", "cot", "self-consistency", "sofa"), made for the same (item, ordering) keys.
    parse: for generation methods, reply -> position (-1 unparseable).
    extra: the stage of its extra passes' records, handed to `scores` as its fourth argument
    (`choose` checks they are there, of the records' N); None: no extra passes.
    extra_records: what those records are, as a refusal of their absence names them.
    """

    name: str
    scores: Callable[..., np.ndarray] | None
    description: str
    passes: str = "1"  # forward passes per prediction: "1", "2" or "N"
    stage: str = "records"
    parse: Callable[[str, list[str]], int] | None = None
    extra: str | None = None
    extra_records: str = ""

    def forward_passes(self, num_candidates: int) -> float:
        return float(num_candidates if self.passes == "N" else int(self.passes))


def _generation(name: str, description: str, parse: Callable[[str, list[str]], int]) -> Method:
    """A generation baseline: its own stage's replies, parsed; `choose` counts their votes."""
    return Method(name, None, description, stage=name, parse=parse)


METHODS: dict[str, Method] = {
    m.name: m
    for m in (
        Method("vanilla", _vanilla, "argmax of log P(c_j|x)"),
        Method("pride", _pride, "log P(c_j|x) minus PriDe's global log prior"),
        Method("lad", _lad, "attention-guided debiasing, Eqs. 8-14"),
        Method("attn", _attn, "raw attention readout: mean over L* of log a_k"),
        Method("attn-purified", _attn_purified, "purified attention: log π (Eq. 12)"),
        Method(
            "perm-avg",
            _perm_avg,
            "log P averaged per image over N cyclic shifts",
            "N",
            extra="perm-avg",
            extra_records="cyclic shifts (perm_records.jsonl): each evaluated item under all N "
            "cyclic shifts",
        ),
        Method(
            "blank",
            lambda records, _, options, blank: blank_scores(records, blank, options.blank_alpha),
            "P(c_j|x) minus α (P(c_j|x_blank) − 1/N), candidates blanked (CapCal)",
            "2",
            extra="blank",
            extra_records="blank prompts (blank_records.jsonl): each evaluated (item, ordering) "
            "asked with every candidate blanked",
        ),
        _generation(
            "instruction", "fairness-instruction prompt, greedy reply parsed", parse_answer
        ),
        _generation("cot", "chain-of-thought prompt, greedy, the index after </think>", parse_cot),
        _generation(
            "self-consistency", "sampled paths, majority of 'The answer is <k>'", parse_answer_is
        ),
        Method(
            "sofa", _vanilla, "vanilla readout of records made under the SoFA mask", stage="sofa"
        ),
    )
}


def _need_calibration(calibration: Calibration | None, records: RecordSet, what: str) -> None:
    if calibration is None:
        raise CalibrationError(
            f"{what} comes from a calibration: fit one on calibration records "
            "(--calibration-records) or load a calibration.json (--calibration)"
        )
    calibration.check_compatible(records)


def choose(
    method: str,
    records: RecordSet,
    calibration: Calibration | None = None,
    options: MethodOptions = MethodOptions(),
    perm_records: RecordSet | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """((R, N) scores, (R,) chosen positions) of `method`: the scores are finite, higher is
    better; the choice is their argmax (the first on ties), for generation methods the parsed
    reply (majority for self-consistency), -1 where unparseable.
    perm_records: the records of the method's extra passes (Method.extra, .extra_records)."""
    if method not in METHODS:
        raise LadError(f"Unknown method {method!r}. Methods computed from records: {list(METHODS)}")
    if calibration is not None:
        calibration.check_compatible(obs_mean=options.obs_mean)  # Eq. 1 as the options say
    if not len(records):
        return np.zeros((0, records.num_candidates)), np.zeros(0, dtype=np.int64)
    if METHODS[method].parse is not None:  # votes and majority from one parse of the replies
        return _generated_choice(method, records, options)
    if METHODS[method].extra is not None:
        _check_extra(method, records, perm_records)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):  # checked below, once
        scores = METHODS[method].scores(records, calibration, options, perm_records)
    if not np.isfinite(scores).all():  # e.g. tau = 1e308 overflows Eq. 12
        raise LadError(
            f"method {method!r}: its scores overflow to infinity or NaN with tau = {options.tau:g}"
            f" and top_k = {options.top_k}; use a smaller --tau"
        )
    return scores, scores.argmax(axis=1)


def _check_extra(method: str, records: RecordSet, extra: RecordSet | None) -> None:
    """The records of `method`'s extra passes (Method.extra) are given, of the records' N."""
    if extra is None or not len(extra):
        raise LadError(
            f"{method} needs the records of its {METHODS[method].extra_records}; make them with "
            f"lad eval --methods {method}"
        )
    if extra.num_candidates != records.num_candidates:
        raise RecordError(
            f"{method} records have N = {extra.num_candidates}, the records N = "
            f"{records.num_candidates}"
        )


def score(method: str, records: RecordSet, *args: Any, **kwargs: Any) -> np.ndarray:
    """(R, N) scores of `method` for every record (`choose`'s arguments)."""
    return choose(method, records, *args, **kwargs)[0]


def predict(method: str, records: RecordSet, *args: Any, **kwargs: Any) -> np.ndarray:
    """(R,) chosen positions of `method` (`choose`'s arguments)."""
    return choose(method, records, *args, **kwargs)[1]
