"""Calibration (paper §4.2): the conditional bias matrix, the attention prior and PriDe's prior,
estimated from a symmetrised calibration set and saved as `calibration.json`.

Calibration records hold each calibration item under all N cyclic left-shifts: record `ordering`
is the shift s and `order[p]` = base[(p + s) mod N], so the answer visits every position once.

    cal = Calibration().fit(read_records("run/calibration.jsonl"))
    cal.save("run/calibration.json")
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from lad.core.fingerprint import UNKNOWN, Fingerprint, check_fingerprint, located
from lad.core.records import Record, RecordSet
from lad.errors import CalibrationError, check_choice
from lad.io.files import read_json, write_text

FORMAT = "lad-calibration/1"
OBS_MEANS = ("prob", "logit")
# calibration.json's keys after "format", in the order written (then "preprocessing" if known).
FILE_KEYS = (
    "model", "num_candidates", "labels", "prompt_sha256", "num_items", "num_layers",
    "log_obs", "gamma", "log_bias", "attention_prior", "pride_log_prior", "obs_mean",
)  # fmt: skip

# Attention mass below this is treated as this (before taking logs), so zero or tiny attention
# never gives -inf / NaN scores. Far below any real mass spread over an image's tokens.
ATTENTION_FLOOR = 1e-12

# log γ̂ is capped so γ̂ stays a finite float in JSON even for a degenerate calibration set.
MAX_LOG_GAMMA = 700.0


def logsumexp(x: np.ndarray, axis: int) -> np.ndarray:
    """log Σ exp(x) along `axis`, stable; finite whenever some entry is finite."""
    m = np.max(x, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    return np.squeeze(m, axis=axis) + np.log(np.sum(np.exp(x - m), axis=axis))


def log_softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    return x - np.expand_dims(logsumexp(x, axis=axis), axis)


def log_attention(attention: np.ndarray) -> np.ndarray:
    """log a, with a floored at ATTENTION_FLOOR."""
    return np.log(np.maximum(attention, ATTENTION_FLOOR))


def check_symmetrised(records: RecordSet, *, allow_partial: bool = False, what: str = "") -> None:
    """Each item must appear under all N cyclic shifts s = 0..N-1 (`ordering`) of one base
    order, order[p] = base[(p + s) mod N]; with `allow_partial` some shifts may be missing."""
    what = what or "calibration records"
    if not len(records):
        raise CalibrationError(f"no {what}: need each item under all cyclic shifts")
    num = records.num_candidates
    bad = (records.ordering < 0) | (records.ordering >= num)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise CalibrationError(
            f"{what}: item {str(records.items[i])!r} has ordering {records.ordering[i]}, but a "
            f"calibration record's ordering is its cyclic shift 0..{num - 1}"
        )
    # base[q] = order_s[(q - s) mod N]: undo each record's shift.
    idx = (np.arange(num)[None, :] - records.ordering[:, None]) % num
    base = np.take_along_axis(records.order, idx, axis=1)
    names, first, inverse = np.unique(records.items, return_index=True, return_inverse=True)
    bad = (base != base[first[inverse]]).any(axis=1)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise CalibrationError(
            f"{what}: item {str(records.items[i])!r}, shift {records.ordering[i]}: order "
            f"{records.order[i].tolist()} is not a cyclic left-shift by {records.ordering[i]} "
            f"of the item's shift-0 order {base[first[inverse[i]]].tolist()}"
        )
    if allow_partial:
        return
    present = np.zeros((len(names), num), dtype=bool)
    present[inverse, records.ordering] = True
    missing = np.argwhere(~present)
    if missing.size:
        k, s = missing[0]
        raise CalibrationError(
            f"{what}: item {str(names[k])!r} lacks cyclic shift {s} ({len(missing)} (item, shift) "
            f"pairs missing); a symmetrised set has every item under all {num} shifts, or pass "
            "allow_partial / --allow-partial"
        )


class Calibration:
    """Fitted quantities of §4.2 (sklearn-like: options here, numbers from `fit`).

    obs_mean: "prob" averages probabilities in Eq. 1 (the paper); "logit" averages log-probs
              and renormalises (the official code).

    Fitted fields (None until `fit` or `load`):
    log_obs (N, N):          log P̂_obs(j|i), row i = answer position (Eq. 1).
    gamma:                   γ̂ (Eq. 4), >= 1.
    log_bias (N, N):         log P̂_bias(j|i) = log P̂_obs(j|i) − [j = i] log γ̂ (Eq. 5).
    attention_prior (L, N):  â^(l)_prior,k, the mean attention over the set (Eq. 7).
    pride_log_prior (N,):    PriDe's log p_prior(j): log-softmax of the mean log P(c_j|x).
    num_items, num_candidates, num_layers; model, labels, prompt_sha256 ("" / [] when unknown).
    preprocessing:           how the records' chat and pictures were prepared (PREPROCESSING;
                             docs/formats.md); None when unknown, and then not checked.
    """

    def __init__(self, *, obs_mean: str = "prob"):
        check_choice("obs_mean", obs_mean, OBS_MEANS, CalibrationError)
        self.obs_mean = obs_mean
        self.log_obs: np.ndarray | None = None
        self.gamma: float | None = None
        self.log_bias: np.ndarray | None = None
        self.attention_prior: np.ndarray | None = None
        self.pride_log_prior: np.ndarray | None = None
        self.num_items: int | None = None
        self.num_candidates: int | None = None
        self.num_layers: int | None = None
        self.model = ""
        self.labels: list[str] = []
        self.prompt_sha256 = ""
        self.preprocessing: dict[str, Any] | None = None

    # -- fitting -------------------------------------------------------------------------------

    def fit(
        self,
        records: RecordSet | list[Record],
        fingerprint: Fingerprint = UNKNOWN,
        *,
        allow_partial: bool = False,
    ) -> Calibration:
        """Estimate Eqs. 1, 4, 5, 7 and PriDe's prior from calibration records made as
        `fingerprint` says (kept in calibration.json); returns self."""
        if not isinstance(records, RecordSet):
            records = RecordSet.from_records(records)
        check_symmetrised(records, allow_partial=allow_partial)
        if not np.isfinite(records.logprobs).all() or not np.isfinite(records.attention).all():
            raise CalibrationError("calibration records hold NaN or infinite values")
        num, labels = records.num_candidates, fingerprint.labels
        if labels and len(labels) != num:
            raise CalibrationError(
                f"{len(labels)} labels given for calibration records with N = {num} candidates"
            )
        self.log_obs = self._log_obs(records)
        log_gamma = _log_gamma(self.log_obs)
        self.gamma = math.exp(log_gamma)
        self.log_bias = self.log_obs - log_gamma * np.eye(num)  # Eq. 5
        self.attention_prior = records.attention.mean(axis=0)  # Eq. 7
        self.pride_log_prior = log_softmax(records.logprobs.mean(axis=0))
        self.num_items = len(np.unique(records.items))
        self.num_candidates = num
        self.num_layers = records.num_layers
        self.model = fingerprint.model or ""
        self.labels = list(labels)
        self.prompt_sha256 = fingerprint.prompt_sha256 or ""
        made = fingerprint.preprocessing
        self.preprocessing = None if made is None else dict(made)
        return self

    @property
    def fingerprint(self) -> Fingerprint:
        """What the calibration was fitted on."""
        return Fingerprint(self.model, tuple(self.labels), self.prompt_sha256, self.preprocessing)

    def _log_obs(self, records: RecordSet) -> np.ndarray:
        """Eq. 1: row i averages the prompts whose answer is at position i."""
        rows = []
        for i in range(records.num_candidates):
            lp = records.logprobs[records.answer == i]
            if len(lp) == 0:
                raise CalibrationError(
                    f"no calibration record has its answer at position {i}; P̂_obs(·|{i}) "
                    "(Eq. 1) cannot be estimated"
                )
            if self.obs_mean == "prob":
                rows.append(logsumexp(log_softmax(lp, axis=1), axis=0) - math.log(len(lp)))
            else:
                rows.append(log_softmax(lp.mean(axis=0)))
        return np.stack(rows)

    # -- use -----------------------------------------------------------------------------------

    def check_fitted(self) -> None:
        if self.log_bias is None:
            raise CalibrationError(
                "This Calibration is not fitted yet; call fit(calibration_records) or "
                "Calibration.load(path) first"
            )

    def check_compatible(
        self,
        records: RecordSet | None = None,
        fingerprint: Fingerprint | None = None,
        *,
        obs_mean: str | None = None,
        strict: bool = True,
        require_fingerprint: bool = False,
        whose: str = "the records'",
        where: object = None,
    ) -> None:
        """The one check that this calibration fits `records` (or, before any exist, records of
        `fingerprint`, whose labels give N): always their N and layer count L, and Eq. 1's
        average `obs_mean` where given; with `strict`, their model, label scheme, prompt, chat
        template and image preprocessing where both sides know them.

        require_fingerprint: with `strict`, also refuse a calibration that does not know its
        model, labels or prompt (one fitted on bare records), since nothing then shows it fits.
        whose: what the calibration is applied to, possessive ("this query's"). A refusal that
        `strict` False would skip is a CalibrationMismatch.
        where: where the calibration is (its file), if known: each refusal then begins with it.
        """
        try:
            self.check_fitted()
            num_candidates = num_layers = None
            if fingerprint is not None and fingerprint.labels:
                num_candidates = len(fingerprint.labels)
            if records is not None and len(records):
                num_candidates, num_layers = records.num_candidates, records.num_layers
            if num_candidates is not None and num_candidates != self.num_candidates:
                raise CalibrationError(
                    f"the calibration is for N = {self.num_candidates} candidates but the records "
                    f"have N = {num_candidates}; calibrate with records of the same N"
                )
            if num_layers is not None and num_layers != self.num_layers:
                raise CalibrationError(
                    f"the calibration has L = {self.num_layers} attention layers but the records "
                    f"have L = {num_layers}; was it made with another model?"
                )
            if obs_mean is not None and obs_mean != self.obs_mean:
                raise CalibrationError(
                    f"the calibration was fitted with obs_mean {self.obs_mean!r} (Eq. 1), not "
                    f"{obs_mean!r}; refit it with obs_mean {obs_mean!r} (lad calibrate --obs-mean "
                    f"{obs_mean}), or leave obs_mean out to use the calibration's"
                )
            if strict:
                check_fingerprint(
                    self.fingerprint, fingerprint or UNKNOWN, whose, require_fingerprint
                )
        except CalibrationError as e:
            if where is None:
                raise
            raise located(e, where) from None

    # -- files ---------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        self.check_fitted()
        out: dict[str, Any] = {"format": FORMAT}
        for key in FILE_KEYS:
            value = getattr(self, key)
            out[key] = value.tolist() if isinstance(value, np.ndarray) else value
        if self.preprocessing is not None:  # unknown: left out, as in files from before it
            out["preprocessing"] = self.preprocessing
        return out

    def save(self, path: str | Path) -> None:
        write_text(path, json.dumps(self.to_dict(), indent=1) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> Calibration:
        """Read a "lad-calibration/1" file (the one place old versions would be handled)."""
        obj = read_json(path, CalibrationError, "calibration file")
        if not isinstance(obj, dict) or obj.get("format") != FORMAT:
            got = obj.get("format") if isinstance(obj, dict) else type(obj).__name__
            raise CalibrationError(f"{path}: expected format {FORMAT!r}, got {got!r}")
        if obj.get("obs_mean", "prob") not in OBS_MEANS:
            raise CalibrationError(f"{path}: 'obs_mean' must be one of {list(OBS_MEANS)}")
        cal = cls(obs_mean=obj.get("obs_mean", "prob"))
        try:
            num, nl = int(obj["num_candidates"]), int(obj["num_layers"])
            cal.log_obs = _matrix(obj, "log_obs", (num, num), path)
            cal.log_bias = _matrix(obj, "log_bias", (num, num), path)
            cal.attention_prior = _matrix(obj, "attention_prior", (nl, num), path)
            cal.pride_log_prior = _matrix(obj, "pride_log_prior", (num,), path)
            cal.gamma = float(obj["gamma"])
            cal.num_items = int(obj["num_items"])
            cal.model = str(obj.get("model") or "")
            cal.labels = [str(x) for x in obj.get("labels") or []]
            cal.prompt_sha256 = str(obj.get("prompt_sha256") or "")
            cal.preprocessing = _read_preprocessing(obj.get("preprocessing"), path)
        except KeyError as e:
            raise CalibrationError(f"{path}: missing key {e.args[0]!r}") from None
        except (TypeError, ValueError) as e:
            raise CalibrationError(f"{path}: malformed calibration ({e})") from None
        _check_plausible(cal, path)
        cal.num_candidates, cal.num_layers = num, nl
        return cal

    @classmethod
    def from_arrays(
        cls,
        log_bias: np.ndarray,
        attention_prior: np.ndarray,
        pride_log_prior: np.ndarray | None = None,
    ) -> Calibration:
        """A calibration made from given matrices (tests). log_obs = log_bias."""
        cal = cls()
        cal.log_bias = np.asarray(log_bias, dtype=np.float64)
        cal.log_obs = cal.log_bias.copy()
        cal.gamma = 1.0
        cal.attention_prior = np.asarray(attention_prior, dtype=np.float64)
        num = cal.log_bias.shape[0]
        cal.pride_log_prior = (
            np.full(num, -math.log(num)) if pride_log_prior is None else np.asarray(pride_log_prior)
        )
        cal.num_items = 0
        cal.num_candidates, cal.num_layers = num, cal.attention_prior.shape[0]
        return cal


def _check_plausible(cal: Calibration, source: object) -> None:
    """Refuse values lad's fit cannot give: the file was edited or damaged (it would otherwise
    shift every score without a word)."""

    def refuse(rule: str) -> None:
        raise CalibrationError(f"{source}: {rule}; recalibrate (the file was edited or damaged)")

    tol = 1e-6
    if (cal.log_obs > tol).any() or (cal.pride_log_prior > tol).any():
        refuse("'log_obs' and 'pride_log_prior' are log-probabilities and must be <= 0")
    if (np.abs(logsumexp(cal.log_obs, axis=1)) > 1e-4).any():
        refuse("each row of exp('log_obs') must sum to 1 (Eq. 1)")
    if abs(logsumexp(cal.pride_log_prior, axis=0)) > 1e-4:
        refuse("exp('pride_log_prior') must sum to 1")
    if not (math.isfinite(cal.gamma) and 1 <= cal.gamma <= math.exp(MAX_LOG_GAMMA)):
        refuse(f"'gamma' must be a number from 1 to e^{MAX_LOG_GAMMA:g} (Eq. 4), got {cal.gamma}")
    expected = cal.log_obs - math.log(cal.gamma) * np.eye(len(cal.log_obs))
    if (np.abs(cal.log_bias - expected) > tol * (1 + np.abs(expected))).any():
        refuse("'log_bias' must equal log_obs - [j = i] log gamma (Eq. 5)")
    prior = cal.attention_prior
    if (prior < 0).any() or (prior.sum(axis=1) > 1 + 1e-3).any():
        refuse("'attention_prior' is attention mass: each entry in [0, 1], each layer's sum <= 1")


def _read_preprocessing(value: Any, source: object) -> dict[str, Any] | None:
    """calibration.json's "preprocessing", checked; None when absent (a file from before lad
    recorded it, accepted unchecked)."""
    if value is None:
        return None
    get = value.get if isinstance(value, dict) else {}.get
    sha, size, penalty = get("chat_template_sha256"), get("image_size"), get("repetition_penalty")
    if (
        not isinstance(value, dict)
        or not (sha is None or (isinstance(sha, str) and len(sha) == 64))
        or not (size is None or (type(size) is int and size >= 1))
        or not isinstance(value.get("image_options", {}), dict)
        or not (penalty is None or (type(penalty) in (int, float) and 0 < penalty < math.inf))
    ):
        raise CalibrationError(
            f"{source}: 'preprocessing' must be an object of chat_template_sha256 (a SHA-256 or "
            f"null), image_size (pixels or null), image_options (an object) and, where used, "
            f"repetition_penalty (a number > 0); got {value!r}"
        )
    return value


def _log_gamma(log_obs: np.ndarray) -> float:
    """Eq. 4 in log space: max over i, j≠i of log P̂_obs(i|i) − log P̂_obs(j|i), at least 0."""
    margin = np.diag(log_obs)[:, None] - log_obs
    np.fill_diagonal(margin, -np.inf)
    return float(min(max(margin.max(), 0.0), MAX_LOG_GAMMA))


def _matrix(obj: dict, key: str, shape: tuple[int, ...], source: object) -> np.ndarray:
    arr = np.asarray(obj[key], dtype=np.float64)
    if arr.shape != shape:
        raise CalibrationError(f"{source}: {key!r} must have shape {shape}, got {arr.shape}")
    if not np.isfinite(arr).all():
        raise CalibrationError(f"{source}: {key!r} holds NaN or infinite values")
    return arr
