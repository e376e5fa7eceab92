"""A tiny model with a chat template: the bundled tiny tokenizer with a ``chat_template`` set (a
Zephyr-like template over words the tokenizer splits into its own pieces)."""

from __future__ import annotations

from pathlib import Path

TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

CORPUS = [
    "My cat Tom is ten years old and gained weight. What should I feed him?",
    "Feed him less and play more.",
    "Our dog Rex barks at night. How do I stop it?",
    "Walk him in the evening.",
] * 10


def build_chat_model(path: Path) -> Path:
    """A tiny random causal LM at ``path`` whose tokenizer carries :data:`TEMPLATE`."""
    from transformers import AutoTokenizer

    from marlhf.models.zoo import build_tiny

    out = build_tiny(path, CORPUS)
    tok = AutoTokenizer.from_pretrained(out)
    tok.chat_template = TEMPLATE
    tok.save_pretrained(out)
    return out


def write_hh(path: Path, n: int = 24) -> Path:
    """A dataset directory of HH-style rows (``\n\nHuman: ...\n\nAssistant:`` prompts, answers
    after a space): ``n`` train rows and ``n`` eval rows."""
    import json

    path.mkdir(parents=True, exist_ok=True)
    for split in ("train", "eval"):
        rows = []
        for i in range(n):
            q, a, b = (
                ("My cat gained weight.", " Feed him less.", " Ignore it.")
                if i % 2
                else ("Our dog barks at night.", " Walk him.", " Shout.")
            )
            prompt = f"\n\nHuman: Hello {split} {i}\n\nAssistant: Hi!\n\nHuman: {q}\n\nAssistant:"
            rows.append({"prompt": prompt, "response": a, "chosen": a, "rejected": b})
        (path / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path
