"""`--model lad` for lm-evaluation-harness 0.4.x (imported only where lm-eval is installed).

Importing this module registers the model `lad` in lm-eval's registry (so, in Python,
`lm_eval.simple_evaluate(model="lad", ...)` works after `import lad.harness.lm_eval`).
lm-eval 0.4.13 finds no model outside its own source tree from the command line (its plugin
discovery, PR #4013, came after that release), so `lad harness lm-eval ARGS` is lm-eval's own
command line with `lad` registered: every flag is lm-eval's (docs/harness.md).
"""

from __future__ import annotations

import sys
from typing import Any

# lm-eval fills its registry with its own models on first use only if the registry is empty, so
# they are registered before `lad` is (else `--model hf` would be unknown beside it).
import lm_eval.models  # noqa: F401
from lm_eval.api.instance import Instance
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model

from lad.errors import LadError
from lad.harness.args import read_model_args
from lad.harness.contexts import questions
from lad.harness.text_scorer import ChoiceOptions, ContextScorer

ONLY_MULTIPLE_CHOICE = (
    "--model lad scores multiple_choice tasks whose prompt lists the options (MMLU's form); "
    "task {task!r} asks for {kind}"
)


@register_model("lad")
class LadLM(LM):
    """lad's debiased N-way choice inside lm-eval (docs/harness.md)."""

    def __init__(self, pretrained: str = ChoiceOptions.model, **model_args: Any) -> None:
        super().__init__()
        batch = str(model_args.get("batch_size") or 1)
        if not batch.isdigit():  # lm-eval's "auto" / "auto:4"
            raise LadError(f"--batch_size {batch}: --model lad takes a whole number")
        self.options = read_model_args(
            ChoiceOptions, model_args, model_as="pretrained", model=str(pretrained)
        )
        self.scorer = ContextScorer(self.options)

    def loglikelihood(
        self, requests: list[Instance], disable_tqdm: bool = False
    ) -> list[tuple[float, bool]]:
        """Per request, the method's score of its choice and whether it is the method's choice
        (lad.harness.text_scorer)."""
        grouped = questions(requests)
        scored = self.scorer.score([g.question for g in grouped])
        out: list[tuple[float, bool]] = [(0.0, False)] * len(requests)
        for group, (scores, chosen) in zip(grouped, scored, strict=True):
            for k, r in enumerate(group.requests):
                out[r] = (float(scores[k]), k == chosen)
        return out

    def loglikelihood_rolling(self, requests: list[Instance], disable_tqdm: bool = False) -> list:
        task = requests[0].task_name if requests else "?"
        raise LadError(ONLY_MULTIPLE_CHOICE.format(task=task, kind="rolling loglikelihoods"))

    def generate_until(self, requests: list[Instance], disable_tqdm: bool = False) -> list:
        task = requests[0].task_name if requests else "?"
        raise LadError(ONLY_MULTIPLE_CHOICE.format(task=task, kind="generated text"))

    def apply_chat_template(self, chat_history: list, add_generation_prompt: bool = True) -> str:
        raise LadError(
            "--apply_chat_template: --model lad scores the prompt as lm-eval writes it without a "
            "chat template (lad's plain template, lad/harness/lm_eval_files/plain.jinja)"
        )

    @property
    def tokenizer_name(self) -> str:
        return f"lad-plain-{self.options.model}".replace("/", "__")


def main(argv: list[str]) -> int:
    """lm-eval's command line, with `--model lad` registered (this module's import)."""
    from lm_eval.__main__ import cli_evaluate

    saved = sys.argv
    sys.argv = ["lm-eval", *argv]
    try:
        cli_evaluate()
    except (LadError, KeyboardInterrupt, SystemExit):
        raise
    except Exception as e:  # lm-eval's own (an unknown task, a bad YAML): one line, named
        detail = " ".join(str(e).split())[:300]
        raise LadError(f"lm-eval stopped: {type(e).__name__}: {detail}") from None
    finally:
        sys.argv = saved
    return 0
