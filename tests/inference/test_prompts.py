"""Prompt selection (marlhf.inference.prompts) against a plain reference."""

from marlhf.inference import (
    select_prompts,
)


def test_select_prompts_reference():
    import hashlib
    from types import SimpleNamespace

    exs = [SimpleNamespace(prompt_id=f"d/{i % 7}", n=i) for i in range(20)]  # duplicates
    got = select_prompts(exs, 3, seed=1234)
    ref = sorted(
        {f"d/{i}" for i in range(7)}, key=lambda p: hashlib.sha256(f"1234:{p}".encode()).hexdigest()
    )[:3]
    assert [e.prompt_id for e in got] == ref
    assert all(e.n < 7 for e in got)  # first occurrence kept
    assert len(select_prompts(exs, 0, seed=1)) == 7
