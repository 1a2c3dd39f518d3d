"""`score_records`: stored records → each method's choice → predictions and metrics, the one loop
every caller goes through (`lad eval`, `lad score`, the harness, `lad ablate`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lad.core.audit import DEFAULT_BOOTSTRAP, Bootstrap
from lad.core.calibrate import Calibration
from lad.core.methods import METHODS, MethodOptions, choose
from lad.core.metrics import compute_metrics
from lad.core.predictions import Prediction, predictions_for
from lad.core.records import RecordSet


@dataclass
class Scored:
    """What `score_records` made: per method, the (R, N) scores and (R,) chosen positions (-1:
    an unparseable reply), the predictions (one per record and method) and metrics.json."""

    scores: dict[str, np.ndarray] = field(default_factory=dict)
    chosen: dict[str, np.ndarray] = field(default_factory=dict)
    predictions: list[Prediction] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)


def score_records(
    records: RecordSet,
    methods: Sequence[str],
    calibration: Calibration | None = None,
    options: MethodOptions | None = None,
    *,
    stages: Mapping[str, RecordSet] | None = None,
    bootstrap: Bootstrap | None = DEFAULT_BOOTSTRAP,
) -> Scored:
    """Score `records` with each method, on its stage's records (`stages`: the records of the
    generation, SoFA, perm-avg and blank stages by stage name; lad.core.methods.Method.stage
    and .extra), and measure them.

    bootstrap: the position audit's resampling (lad.core.audit; None: no audit, for sweeps).
    """
    options = options or MethodOptions()
    stages = {"records": records, **(stages or {})}
    out = Scored()
    tokens = {}
    for method in methods:
        stage = stages[METHODS[method].stage]
        passes = stages.get(METHODS[method].extra)  # None: the method has no extra passes
        out.scores[method], out.chosen[method] = choose(method, stage, calibration, options, passes)
        out.predictions += predictions_for(records, method, out.scores[method], out.chosen[method])
        if METHODS[method].parse is not None:  # tokens per record (all its paths), averaged
            counts = [sum(extra.get("generated_tokens", [])) for extra in stage.extra]
            tokens[method] = float(np.mean(counts)) if counts else 0.0
    out.metrics = compute_metrics(records, out.chosen, bootstrap=bootstrap)
    for method, count in tokens.items():
        out.metrics["methods"][method]["generated_tokens_per_item"] = count
    return out
