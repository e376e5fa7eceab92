"""The acceptance run's outputs: ``gpu_check.json`` (everything measured) and ``gpu_check.md`` (one
markdown table: each check, its figure and whether it passed)."""

from __future__ import annotations

import json
from pathlib import Path


def _fmt(x, digits: int = 3) -> str:
    if x is None:
        return "–"
    if isinstance(x, float):
        return f"{x:.{digits}g}"
    return str(x)


def rows(result: dict) -> list[tuple[str, str, str]]:
    """(check, figure, status) of the markdown table."""
    out = []
    env = result.get("environment", {})
    if env:
        gpu = env.get("gpu") or "no GPU (CPU size)"
        out.append(("environment", f"{gpu}; torch {env.get('torch')} (CUDA "
                    f"{env.get('cuda_runtime')}), driver {env.get('driver')}, deepspeed "
                    f"{env.get('deepspeed')}, transformers {env.get('transformers')}, attention "
                    f"{env.get('attn_implementation')}", "info"))  # fmt: skip
    for run in result.get("pipeline", []):
        figure = f"{run['wall_s']:.0f} s"
        peak = run.get("peak", {})
        if "peak_cuda_allocated_mb" in peak:
            figure += f", peak {peak['peak_cuda_allocated_mb'] / 1024:.1f} GiB allocated"
        elif "peak_rss_mb" in peak:
            figure += f", peak RSS {peak['peak_rss_mb'] / 1024:.1f} GiB"
        status = "ok" if run["ok"] else "FAIL: " + "; ".join(run["problems"])[:300]
        out.append((f"pipeline: {run['name']}", figure, status))
    dec = result.get("decode")
    if dec and "hf_generate" in dec:
        base = dec["hf_generate"]["tokens_per_s"]
        for name in ("hf_generate", "static_eager", "static_compiled"):
            if name in dec and "error" in dec[name]:
                out.append((f"decode: {name}", "–", f"FAIL: {dec[name]['error']}"[:300]))
            elif name in dec:
                d = dec[name]
                frac = d.get("bound_fraction")
                fig = (f"{d['tokens_per_s']:.0f} tok/s ({d['ms_per_step']:.2f} ms/step, "
                       f"{d['tokens_per_s'] / base:.1f}x generate"
                       + (f", {100 * frac:.0f} % of the bandwidth bound)" if frac else ")"))  # fmt: skip
                status = "info"
                if name == "static_compiled" and frac is not None:
                    status = "goal met" if frac >= 0.5 else "goal (>= 50 %) not met"
                out.append((f"decode {dec['batch']}x{dec['new_tokens']}: {name}", fig, status))
    ppo = result.get("ppo_update")
    if ppo and "seconds_per_update" in ppo:
        fig = f"{ppo['seconds_per_update']:.2f} s/update at {ppo['params'] / 1e6:.1f} M"
        status = "info"
        if "trl_seconds" in ppo:
            fig += f" (TRL 1.12: {ppo['trl_seconds']} s, {ppo['speedup_vs_trl']:.1f}x)"
            status = "goal met" if ppo["goal_met"] else f"goal (<= {ppo['goal_seconds']} s) not met"
        if ppo.get("run", {}).get("problems"):
            status += "; " + "; ".join(ppo["run"]["problems"])[:200]
        out.append(("PPO update", fig, status))
    mm = result.get("mismatch")
    if mm and "rollout/logprob_diff_mean" in mm:
        fig = (f"{mm['dtype']}: |Δ log p| mean {_fmt(mm['rollout/logprob_diff_mean'])}, max "
               f"{_fmt(mm['rollout/logprob_diff_max'])}, k3 KL {_fmt(mm['rollout/k3_kl'])}, "
               f"sequence ratio [{_fmt(mm['rollout/ratio_min_seq'], 4)}, "
               f"{_fmt(mm['rollout/ratio_max_seq'], 4)}]")  # fmt: skip
        out.append(("rollout-trainer mismatch", fig, "info"))
    for part, err in result.get("errors", {}).items():
        out.append((part, "–", f"FAIL: {err}"[:300]))
    return out


def write(result: dict, out_dir: Path) -> tuple[Path, Path]:
    """Writes ``gpu_check.json`` and ``gpu_check.md`` into ``out_dir``; returns their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    js, md = out_dir / "gpu_check.json", out_dir / "gpu_check.md"
    js.write_text(json.dumps(result, indent=1, default=str) + "\n")
    lines = ["| check | figure | status |", "|---|---|---|"]
    lines += [f"| {a} | {b} | {c} |" for a, b, c in rows(result)]
    total = result.get("wall_s")
    lines.append("")
    if "ok" not in result:  # written after a part, the run still going
        done = ", ".join(result.get("part_seconds", {}))
        lines.append(f"Part-way: {total:.0f} s so far; parts done: {done}." if total else "")
    else:
        lines.append(f"Total {total:.0f} s; all checks passed: {result['ok']}." if total else "")
    md.write_text("\n".join(lines) + "\n")
    return js, md
