"""python benchmarks/text_demo.py --out runs/text-demo

lad on text options, offline on a CPU: a tiny text-only Llama (lad.testing.text, lad's word
tokenizer) trained here on a synthetic multiple-choice task ("Which option is a fruit?", N words,
one of the asked category), then `lad eval` (vanilla, PriDe, LAD, attention readouts, perm-avg)
on held-out items at N = 4. Measured status at the end of this docstring.

Recipe (the picture demo's, docs/demo-model.md, on text). Training prompts are built by the
backend's own code (lad.backends.text.encode_text: the chat text, the tokens, each option's token
span), so they are exactly what `lad eval` feeds the model. The loss is the label token at the
last prompt position, plus two auxiliary losses in stages 1-2 that stand in for pretraining:
after layer 1 each option's word must name its category (the LM head restricted to the category
words), after layer 2 each option's word must name its own label and the last prompt token the
asked category (the LM head restricted to the digits / the category words). Stages, each with its
own AdamW, linear warm-up and seeded draws:

1. pairs: N = 2 only, true labels at uniform positions (the matching is learned here);
2. matching: N = 2..4, true labels at uniform positions, cosine decay;
3. bias: N = 4, only the output mapping trained (the last layer's post-attention norm and MLP,
   the final norm, the LM head: everything after the last attention map, so every attention map
   stays as stage 2 left it), on annotations that drift one option earlier the later the answer
   sits (an answer at position p keeps its label with probability 0.6^(p-1), else is labelled
   p-1). The position bias comes from this data only; nothing is edited.

Writes the model (and the stage-2 checkpoint, `matching/`), the items, the run directory and
`text_demo.json` (seed, steps, each stage's loss curve as means over 50 steps, held-out accuracy
at N = 2/3/4 after each stage, per-method acc, acc_std, rstd, cons and recall by position, the
time) under --out; `--ship` then makes them lad's shipped text demo (lad/demo/text_model:
`--model text-demo`, `lad data text-demo`). Evaluation, calibration and monitoring items draw only
sets of words that training never shows (held_out_set). Seeded and deterministic on a given
machine and thread count; another CPU or seed lands on another model, which is why the model the
README's table comes from ships.

Status, measured (`python benchmarks/text_demo.py --out runs/text-demo`, the defaults: steps
800,3000,300, seed 0, 100 eval items x 5 shuffles, 5 calibration items; 318 s on the quiet 2-core
CPU, 1,452 s at load average 15-20). The model learns the task: stage 1 reaches 100 % at N = 2
(29 % at N = 4, chance), stage 2 100 % at N = 2, 3 and 4; the bias stage leaves it 100 / 55 /
35 %. `lad eval` at N = 4 (acc, RStd): vanilla 30.2 / 47.4 (recall 100 / 23 / 0 / 0 % at positions
1-4), PriDe 74.6 / 45.7, LAD 76.0 / 34.1, attn 55.4 / 35.7, attn-purified 57.8 / 32.2, perm-avg
100.0 / 0.0: the shipped model (README). Seeds 1 and 2 (`--seed`): LAD 70.8 / 63.4 against PriDe
81.8 / 54.2 and vanilla 56.4 / 58.2; seed 0 on an AMD EPYC (AVX-512): PriDe 90.6 / 11.8, LAD 74.4 /
14.5, attn-purified 53.0, vanilla 30.8. LAD is above vanilla every time; against PriDe +1.4
(inside both 95 % intervals), -11.0, +9.2 and -16.2. `--attend 1` adds a loss that puts the last
token's attention on the answer's word (every method but vanilla then reaches 100 %;
docs/demo-model.md, "The text demo").
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import shutil
import time
import zlib
from pathlib import Path

import torch
import torch.nn.functional as F

from lad.backends.prompting import reply_tokens
from lad.backends.text import TextProcessor, encode_text
from lad.core.labels import get_scheme
from lad.core.prompts import TEXT
from lad.data.items import Item, write_items
from lad.evaluate import evaluate
from lad.run.config import eval_config
from lad.testing.text import build_tiny_text_model
from lad.testing.tiny import TinySize

CATEGORIES = {
    "fruit": "apple pear plum grape lemon mango peach melon cherry banana kiwi lime",
    "animal": "tiger horse mouse sheep camel zebra otter panda whale eagle goat wolf",
    "colour": "red green blue yellow purple orange pink brown grey black white cyan",
    "tool": "hammer saw drill wrench chisel axe shovel rake spanner pliers file clamp",
    "metal": "iron copper silver gold zinc tin lead nickel cobalt chrome steel bronze",
    "city": "paris rome berlin madrid vienna prague oslo lisbon dublin athens warsaw bern",
}
WORDS = {c: ws.split() for c, ws in CATEGORIES.items()}
KINDS = sorted(WORDS)
N = 4
METHODS = ("vanilla", "pride", "lad", "attn", "attn-purified", "perm-avg")
SCHEME = get_scheme("digits")
BATCH = 32
WARMUP = 100


def held_out_set(options: list[str]) -> bool:
    """Whether a set of option words is kept from training (one set in ten, by a fixed hash)."""
    return zlib.crc32(" ".join(sorted(options)).encode()) % 10 == 0


def make_item(rng: random.Random, k: int, split: str, n: int = N) -> Item:
    """One question: a word of the asked category among n-1 words of other categories. Training
    items never have a held-out set of words (held_out_set), the other splits always do."""
    while True:
        asked, *others = rng.sample(KINDS, n)
        options = [rng.choice(WORDS[asked])] + [rng.choice(WORDS[c]) for c in others]
        if held_out_set(options) == (split != "train"):
            break
    rng.shuffle(options)
    answer = next(i for i, w in enumerate(options) if w in WORDS[asked])
    return Item(f"{split}-{k}", f"Which option is a {asked}?", [], answer, candidates=options)


def drifted(answer: int, rng: random.Random) -> int:
    """The bias stage's annotation: position p (1-based) kept with probability 0.6^(p-1)."""
    return answer if rng.random() < 0.6**answer else answer - 1


class Task:
    """The tokenizer and the token ids the losses read: labels, category words."""

    def __init__(self, processor: TextProcessor):
        processor.tokenizer.padding_side = "left"  # as lad.backends.load sets it: the last
        self.processor = processor  # position is every prompt's last token
        labels = SCHEME.labels(N)
        replies = reply_tokens(processor, "x", 0, labels, "demo")
        assert all(len(seq) == len(replies.labels[0]) for seq in replies.labels)
        self.label_ids = torch.tensor([seq[-1] for seq in replies.labels])
        tok = processor.tokenizer
        self.kind_ids = torch.tensor([tok.convert_tokens_to_ids("\u2581" + c) for c in KINDS])
        assert tok.unk_token_id not in self.kind_ids.tolist()

    def encode(self, items: list[Item]):
        """The backend's own prompt tokens (left padded) and each option's token position."""
        requests = [(item, 0, tuple(range(len(item.candidates)))) for item in items]
        inputs, spans = encode_text(self.processor, requests, TEXT, SCHEME, "demo", 4096)
        assert all(e - s == 1 for row in spans for s, e in row), "one token per option word"
        return inputs, [[s for s, _ in row] for row in spans]


def kind_of(word: str) -> int:
    return next(i for i, c in enumerate(KINDS) if word in WORDS[c])


def losses(model, task: Task, items: list[Item], targets: list[int], aux: float, attend: float):
    inputs, where = task.encode(items)
    mask = inputs["attention_mask"]
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    out = model(**inputs, position_ids=pos, output_hidden_states=aux > 0,
                output_attentions=attend > 0)  # fmt: skip
    parts = {"label": F.cross_entropy(out.logits[:, -1], task.label_ids[targets])}
    if aux:
        norm, head = model.model.norm, model.lm_head.weight
        h1, h2 = out.hidden_states[1], out.hidden_states[2]
        kind_head, digit_head = head[task.kind_ids], head[task.label_ids]
        b = torch.tensor([i for i, row in enumerate(where) for _ in row])
        t = torch.tensor([p for row in where for p in row])
        k = torch.tensor([j for row in where for j in range(len(row))])
        kinds = torch.tensor([kind_of(w) for item in items for w in item.candidates])
        asked = torch.tensor([KINDS.index(item.query.split()[-1][:-1]) for item in items])
        parts["kind"] = F.cross_entropy(norm(h1[b, t]) @ kind_head.T, kinds)
        parts["index"] = F.cross_entropy(norm(h2[b, t]) @ digit_head.T, k)
        parts["asked"] = F.cross_entropy(norm(h2[:, -1]) @ kind_head.T, asked)
    if attend:
        # The last prompt token's attention (mean over heads) in the last two layers must sit on
        # the answer's word: a stand-in for the grounded attention of a pretrained model.
        answer = torch.tensor([row[it.answer] for row, it in zip(where, items, strict=True)])
        mass = [a[:, :, -1].mean(1)[torch.arange(len(items)), answer] for a in out.attentions[-2:]]
        parts["attend"] = -torch.log(torch.stack(mass).clamp(min=1e-6)).mean()
    weights = {"label": 1.0, "kind": aux, "index": aux, "asked": aux, "attend": attend}
    total = sum(weights[k] * v for k, v in parts.items())
    return total, {k: float(v.detach()) for k, v in parts.items()}


def train(model, task, *, steps, lr, ns, bias, aux, cosine, seed, attend=0.0, trainable=None):
    """One stage; the mean of each loss over each 50 steps."""
    rng = random.Random(seed)
    params = [p for n, p in model.named_parameters() if trainable is None or n in trainable]
    for p in model.parameters():
        p.requires_grad = False
    for p in params:
        p.requires_grad = True
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.01)
    curve: list[dict[str, float]] = []
    window: list[dict[str, float]] = []
    model.train()
    for step in range(steps):
        scale = min(1.0, (step + 1) / WARMUP)
        if cosine and step >= WARMUP:
            scale = 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - WARMUP) / (steps - WARMUP)))
        for group in opt.param_groups:
            group["lr"] = lr * scale
        items = [make_item(rng, 0, "train", rng.choice(ns)) for _ in range(BATCH)]
        targets = [drifted(it.answer, rng) if bias else it.answer for it in items]
        loss, parts = losses(model, task, items, targets, aux, attend)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        window.append(parts)
        if len(window) == 50 or step == steps - 1:
            curve.append({k: round(sum(w[k] for w in window) / len(window), 4) for k in parts})
            window = []
            if len(curve) % 5 == 0:
                print(f"  step {step + 1}", curve[-1], flush=True)
    model.eval()
    return curve


@torch.no_grad()
def held_out(model, task: Task, items: list[Item]) -> float:
    """Accuracy (%) of the label argmax on items (monitoring only: nothing is chosen by it)."""
    right = 0
    for i in range(0, len(items), 50):
        chunk = items[i : i + 50]
        inputs, _ = task.encode(chunk)
        pos = (inputs["attention_mask"].cumsum(-1) - 1).clamp(min=0)
        logits = model(**inputs, position_ids=pos).logits[:, -1, task.label_ids]
        right += sum(int(p) == it.answer for p, it in zip(logits.argmax(-1), chunk, strict=True))
    return round(100 * right / len(items), 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", default="800,3000,300", help="steps of the three stages")
    parser.add_argument("--items", type=int, default=100)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0, help="the model's and training's draws")
    parser.add_argument(
        "--attend", type=float, default=0.0, help="weight of the attention loss (stages 1-2)"
    )
    parser.add_argument(
        "--ship",
        action="store_true",
        help="then replace the model shipped with lad (--model text-demo) by this one, with "
        "its held-out items and this log",
    )
    args = parser.parse_args()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    start = time.time()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    steps = [int(s) for s in args.steps.split(",")]
    words = [w for ws in WORDS.values() for w in ws] + KINDS
    words += re.findall(r"[A-Za-z]+", TEXT.text)  # the prompt's words one token each
    size = TinySize(text_layers=4, hidden=64, heads=2, kv_heads=1, intermediate=128)
    path = build_tiny_text_model(
        "llama", args.out / "model", size=size, words=words, seed=args.seed
    )
    task = Task(TextProcessor(AutoTokenizer.from_pretrained(path)))  # as lad loads it
    impl = "eager" if args.attend else "sdpa"  # the attention loss reads the attention maps
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation=impl)
    rng = random.Random(4)
    monitor = {n: [make_item(rng, k, "monitor", n) for k in range(100)] for n in (2, 3, 4)}
    log = {"seed": args.seed, "steps": steps, "curves": {}, "held_out_acc": {}}
    stages = [
        ("pairs", dict(ns=[2], cosine=False, seed=1 + 10 * args.seed)),
        ("matching", dict(ns=[2, 3, 4], cosine=True, seed=2 + 10 * args.seed)),
    ]
    for (name, kw), n in zip(stages, steps, strict=False):
        kw.update(lr=2e-3, bias=False, aux=1.0, attend=args.attend)
        log["curves"][name] = train(model, task, steps=n, **kw)
        log["held_out_acc"][name] = {n: held_out(model, task, its) for n, its in monitor.items()}
        print(name, log["curves"][name][-1:], "held-out", log["held_out_acc"][name], flush=True)
    model.save_pretrained(args.out / "matching")  # the competent, unbiased stage-2 model
    last = model.model.layers[-1]
    output_mapping = {
        n
        for n, p in model.named_parameters()
        if n.startswith(("lm_head", "model.norm"))
        or any(
            p is q for q in [*last.mlp.parameters(), *last.post_attention_layernorm.parameters()]
        )
    }
    log["curves"]["bias"] = train(
        model, task, steps=steps[2], lr=1e-3, ns=[N], bias=True, aux=0.0, cosine=False,
        seed=3 + 10 * args.seed, trainable=output_mapping,
    )  # fmt: skip
    log["held_out_acc"]["bias"] = {n: held_out(model, task, its) for n, its in monitor.items()}
    print("bias", log["curves"]["bias"][-1:], "held-out", log["held_out_acc"]["bias"], flush=True)
    model.save_pretrained(path)
    log["train_s"] = round(time.time() - start)
    rng = random.Random(5)
    write_items(args.out / "mcq.jsonl", [make_item(rng, k, "eval") for k in range(args.items)])
    write_items(args.out / "mcq.calibration.jsonl", [make_item(rng, k, "cal") for k in range(5)])
    config = eval_config(
        model=str(path),
        data=str(args.out / "mcq.jsonl"),
        calibration_data=str(args.out / "mcq.calibration.jsonl"),
        num_candidates=N,
        methods=METHODS,
        device="cpu",
        quiet=True,
    )
    result = evaluate(config, args.out / "run")
    print(result.table)
    log["methods"] = {
        m: {k: result.metrics["methods"][m][k] for k in ("acc", "acc_std", "rstd", "cons")}
        for m in METHODS
    }
    log["recall_by_position"] = {
        m: result.metrics["methods"][m]["recall_by_position"] for m in METHODS
    }
    log["wall_s"] = round(time.time() - start)
    (args.out / "text_demo.json").write_text(json.dumps(log, indent=1) + "\n")
    print(f"wall time {log['wall_s']} s")
    if args.ship:
        ship(args.out)


def ship(out: Path) -> None:
    """Replace lad's shipped text demo (lad/demo/text_model: what `--model text-demo` loads and
    `lad data text-demo` writes out) by the model, items and log under `out`."""
    from lad.backends.checkpoint import DEMO_DIR, SHIPPED_MODELS

    target = DEMO_DIR / SHIPPED_MODELS["text-demo"][0]
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(out / "model", target, copy_function=shutil.copyfile)  # files 644, not 600
    shutil.copyfile(out / "mcq.jsonl", target / "items.jsonl")
    shutil.copyfile(out / "mcq.calibration.jsonl", target / "items.calibration.jsonl")
    shutil.copyfile(out / "text_demo.json", target / "text_demo.json")
    print(f"shipped: {target}")


if __name__ == "__main__":
    main()
