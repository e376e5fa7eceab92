"""Diagnostics of policies and reward models on the bundled synthetic TL;DR task (held-out split).

    python benchmarks/synthetic_eval.py policy MODEL_DIR [--temperatures 1.0 0.7 0] [--prompts 200]
    python benchmarks/synthetic_eval.py rm RM_DIR --policy MODEL_DIR [--prompts 128]
    python benchmarks/synthetic_eval.py binding MODEL_DIR [--prompts 150]

``policy``: mean gold score (``marlhf.data.synthetic.gold_score``) and mean words of the responses to
the first ``--prompts`` held-out prompts, per sampling temperature (0 = greedy), seeded.
``rm``: the reward model's pairwise accuracy on the held-out comparisons (against the noisy labels,
and against the gold order), its accuracy per pair of summary kinds (complete, missing, verbose, ...),
and, on responses sampled from ``--policy`` at temperature 1, the Pearson correlation of its score
with the gold score and with the response length. ``binding``: how well a causal LM binds events to
people: on the correct (``complete``/``reordered``) summaries of the first ``--prompts`` held-out
comparisons, teacher-forced, the share of event words that are the model's top-1 prediction right
after their entity ("my sister" -> "borrowed"). A reward model cannot check a summary's facts
better than its base binds them. ``MODEL_DIR`` may be ``tiny-base``.
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from marlhf.data.synthetic import gold_score, prompt_of  # noqa: E402
from marlhf.models.load import resolve_model_path  # noqa: E402
from marlhf.models.zoo import bundled_corpus_path  # noqa: E402
from marlhf.stats import pearson  # noqa: E402


def held_out() -> list[dict]:
    with open(bundled_corpus_path()) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [r for r in rows if r["split"] != "train"]


def sample(model_dir: str, prompts: list[str], temperature: float, max_new_tokens: int = 40):
    """Responses (text) of a causal LM to `prompts`; temperature 0 is greedy. Seeded (0)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_model_path(model_dir)
    tok = AutoTokenizer.from_pretrained(path)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    torch.manual_seed(0)
    texts = []
    for i in range(0, len(prompts), 32):
        enc = tok(prompts[i : i + 32], return_tensors="pt", padding=True)
        kwargs = {"do_sample": False}
        if temperature > 0:
            kwargs = {"do_sample": True, "temperature": temperature, "top_k": 0}
        with torch.no_grad():
            out = model.generate(
                **enc, max_new_tokens=max_new_tokens, pad_token_id=tok.pad_token_id, **kwargs
            )
        texts += tok.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    return texts


def eval_policy(model_dir: str, n: int, temperatures: list[float]) -> dict:
    prompts = [prompt_of(r) for r in held_out()[:n]]
    out = {}
    for t in temperatures:
        texts = sample(model_dir, prompts, t)
        out[f"T={t:g}"] = {
            "gold": statistics.fmean(gold_score(p, s) for p, s in zip(prompts, texts, strict=True)),
            "words": statistics.fmean(len(s.split()) for s in texts),
        }
    return out


def eval_rm(rm_dir: str, policy: str, n: int) -> dict:
    from transformers import AutoTokenizer

    from marlhf.models.reward_model import load_reward_model

    tok = AutoTokenizer.from_pretrained(rm_dir)
    rm, _ = load_reward_model(rm_dir)
    rm.eval()

    from marlhf.inference import TextScorer

    # the encoding of inference and the RM stage: bos + prompt + response + eos, tokenised apart
    scorer = TextScorer(rm, tok, tok(tok.eos_token, add_special_tokens=False)["input_ids"], 512)

    def score(prompts: list[str], responses: list[str]) -> list[float]:
        out: list[float] = []
        for i in range(0, len(prompts), 32):
            out += scorer(prompts[i : i + 32], responses[i : i + 32])[0].tolist()
        return out

    rows = held_out()
    prompts = [prompt_of(r) for r in rows]
    first = score(prompts, [r["summaries"][0]["text"] for r in rows])
    second = score(prompts, [r["summaries"][1]["text"] for r in rows])
    label_hits, gold_hits, kinds = [], [], collections.defaultdict(list)
    for r, p, s0, s1 in zip(rows, prompts, first, second, strict=True):
        label_hits.append((s0 > s1) == (r["choice"] == 0))
        g0, g1 = (gold_score(p, s["text"]) for s in r["summaries"])
        if g0 != g1:
            hit = (s0 > s1) == (g0 > g1)
            gold_hits.append(hit)
            kinds[
                " vs ".join(sorted(s["policy"].removeprefix("synthetic_") for s in r["summaries"]))
            ].append(hit)
    sampled_prompts = prompts[:n]
    responses = sample(policy, sampled_prompts, 1.0)
    rm_scores = score(sampled_prompts, responses)
    golds = [gold_score(p, s) for p, s in zip(sampled_prompts, responses, strict=True)]
    words = [float(len(s.split())) for s in responses]
    return {
        "accuracy_vs_labels": statistics.fmean(label_hits),
        "accuracy_vs_gold_order": statistics.fmean(gold_hits),
        "by_kind": {
            k: [round(statistics.fmean(v), 2), len(v)]
            for k, v in sorted(kinds.items(), key=lambda kv: -len(kv[1]))
        },
        "policy_samples": {
            "pearson_rm_gold": pearson(rm_scores, golds),
            "pearson_rm_words": pearson(rm_scores, words),
            "gold": statistics.fmean(golds),
        },
    }


def eval_binding(model_dir: str, n: int) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from marlhf.data.synthetic import ENTITIES, EVENTS

    path = resolve_model_path(model_dir)
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    hits = []
    for r in held_out()[:n]:
        prompt = tok(prompt_of(r), add_special_tokens=False)["input_ids"]
        prompt = [tok.bos_token_id, *prompt]
        for s in r["summaries"]:
            if s["policy"] not in ("synthetic_complete", "synthetic_reordered"):
                continue
            ids = tok(s["text"], add_special_tokens=False)["input_ids"]
            with torch.no_grad():
                pred = model(torch.tensor([prompt + ids])).logits[0].argmax(-1)
            words = [t.lstrip("\u0120") for t in tok.convert_ids_to_tokens(ids)]
            for j in range(1, len(ids)):
                if words[j] in EVENTS and words[j - 1] in ENTITIES:
                    # the logit at position t predicts token t + 1
                    hits.append(int(pred[len(prompt) + j - 1]) == ids[j])
    return {"event_after_entity_top1": statistics.fmean(hits), "events": len(hits)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="what", required=True)
    p = sub.add_parser("policy")
    p.add_argument("model")
    p.add_argument("--prompts", type=int, default=200)
    p.add_argument("--temperatures", type=float, nargs="+", default=[1.0, 0.7, 0.0])
    r = sub.add_parser("rm")
    r.add_argument("rm")
    r.add_argument("--policy", required=True)
    r.add_argument("--prompts", type=int, default=128)
    b = sub.add_parser("binding")
    b.add_argument("model")
    b.add_argument("--prompts", type=int, default=150)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    if args.what == "policy":
        result = eval_policy(args.model, args.prompts, args.temperatures)
    elif args.what == "binding":
        result = eval_binding(args.model, args.prompts)
    else:
        result = eval_rm(args.rm, args.policy, args.prompts)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
