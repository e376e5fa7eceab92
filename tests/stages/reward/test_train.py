"""Stage 2 (reward model): pair/response layout and scores against plain loops, the LoRA checkpoint
round trip, config validation, and (slow) end-to-end runs of ``python -m marlhf.stages.reward`` in
subprocesses: learning on the bundled synthetic data, save -> load, resume, segment RM."""

import doctest
import json
import math
import shutil
import sys
from pathlib import Path

import pytest
import torch

import marlhf.stages.reward.scorer as scorer
import marlhf.stages.reward.train as reward_stage
from marlhf.cli import parse_config
from marlhf.macro import MacroConfig, TerminationInputs, build_termination
from marlhf.models.reward_model import RewardModel, end_scores, load_reward_model
from marlhf.models.save import save_reward_checkpoint
from marlhf.stages.reward.config import RewardConfig, RewardStageConfig
from marlhf.stages.reward.scorer import Scorer, pair_responses, response_scores
from tests.support.forked import run_python
from tests.support.stage_env import stage_env
from tests.support.tiny_models import tiny_gemma_config

transformers = pytest.importorskip("transformers")

VOCAB = 64
PAD, EOS, BOS = 0, 1, 2


def test_doctests():
    for module in (reward_stage, scorer):
        assert doctest.testmod(module, raise_on_error=False).failed == 0


def _pair_batch():
    """B = 2 pairs, right-padded to T = 9; prompt lengths 3 and 2 (bos included); EOS = 1."""
    rows = [
        [BOS, 10, 11, 20, 21, 22, 23, EOS],  # pair 0 chosen: response 20 21 22 23 EOS
        [BOS, 12, 30, 31, EOS],  # pair 1 chosen
        [BOS, 10, 11, 40, EOS],  # pair 0 rejected
        [BOS, 12, 50, 51, 52, 53, 54],  # pair 1 rejected, truncated (no EOS)
    ]
    T = 9
    ids = torch.full((4, T), PAD)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
    mask = (torch.arange(T) < torch.tensor([len(r) for r in rows])[:, None]).long()
    return rows, ids, mask, torch.tensor([3, 2])


def test_pair_responses_matches_a_loop():
    rows, ids, mask, prompt_len = _pair_batch()
    r = pair_responses(ids, mask, prompt_len, pad_id=PAD, eot_id=EOS)
    starts = [3, 2, 3, 2]
    A = max(len(row) - s for row, s in zip(rows, starts, strict=True))
    assert r.response_ids.shape == (4, A) and r.action_mask.dtype == torch.bool
    for i, (row, s) in enumerate(zip(rows, starts, strict=True)):
        resp = row[s:]
        assert int(r.response_start[i]) == s
        assert r.response_ids[i, : len(resp)].tolist() == resp
        assert r.response_ids[i, len(resp) :].eq(PAD).all()
        assert r.action_mask[i].tolist() == [j < len(resp) for j in range(A)]
        assert bool(r.ends_with_eos[i]) == (resp[-1] == EOS)


def test_segment_scores_are_means_of_values_at_segment_ends():
    rows, ids, mask, prompt_len = _pair_batch()
    resp = pair_responses(ids, mask, prompt_len, pad_id=PAD, eot_id=EOS)
    macro_end = build_termination(MacroConfig(termination_condition="fixed", ngram=2))(
        TerminationInputs(resp.response_ids, resp.action_mask, resp.ends_with_eos)
    ).macro_end
    values = torch.randn(ids.shape, generator=torch.Generator().manual_seed(0))
    scores, seg_mask = response_scores(values, mask, resp, macro_end)
    # a plain loop: fixed 2-grams with the final EOS alone; read the value at each segment's end
    for i, row in enumerate(rows):
        s = int(resp.response_start[i])
        n = len(row) - s
        eos_alone = row[-1] == EOS and n >= 2
        body = n - 1 if eos_alone else n
        ends = [j for j in range(body) if (j + 1) % 2 == 0 or j == body - 1]
        if eos_alone:
            ends.append(n - 1)
        expected = sum(float(values[i, s + j]) for j in ends) / len(ends)
        assert math.isclose(float(scores[i]), expected, rel_tol=1e-6, abs_tol=1e-6)
        assert int(seg_mask[i].sum()) == len(ends)
    # the end RM reads the last real token
    end, none = response_scores(values, mask)
    assert none is None
    assert end.tolist() == [float(values[i, len(r) - 1]) for i, r in enumerate(rows)]


def _tiny_causal_lm(seed=0):
    torch.manual_seed(seed)
    cfg = tiny_gemma_config(VOCAB, PAD, EOS, BOS)
    return transformers.GemmaForCausalLM(cfg).eval()


def test_entropy_rule_reads_reference_entropy_of_each_response_token():
    """Segment boundaries of the `entropy` rule come from the reference model's next-token entropy
    at the position that predicts each response token (checked with a per-token loop)."""
    rows, ids, mask, prompt_len = _pair_batch()
    ref = _tiny_causal_lm()
    with torch.no_grad():
        logits = ref(input_ids=ids, attention_mask=mask).logits
    ent = -(logits.log_softmax(-1).exp() * logits.log_softmax(-1)).sum(-1)  # (2B, T)
    resp = pair_responses(ids, mask, prompt_len, pad_id=PAD, eot_id=EOS)
    cands = [
        float(ent[i, int(resp.response_start[i]) + j - 1])
        for i in range(4)
        for j in range(1, int(resp.action_mask[i].sum()))
    ]
    tau = sorted(cands)[len(cands) // 2]  # a threshold that splits somewhere
    cfg = RewardStageConfig(
        macro=MacroConfig(
            termination_condition="entropy", entropy_threshold=tau, eos_own_macro=False
        )
    )
    rule = build_termination(cfg.macro)
    scorer = Scorer(cfg.reward, cfg.optim, cfg.batching.packing, PAD, EOS, rule=rule, ref=ref)
    batch = {"input_ids": ids, "attention_mask": mask, "prompt_len": prompt_len}
    macro_end = scorer.macro_end(batch, resp, None)
    for i in range(4):
        s, n = int(resp.response_start[i]), int(resp.action_mask[i].sum())
        # token j starts a segment when H(p_ref(. | tokens < s + j)) > tau; then token j-1 ends one
        expected = [(j + 1 < n and float(ent[i, s + j]) > tau) or j == n - 1 for j in range(n)]
        assert macro_end[i, :n].tolist() == expected
        assert not macro_end[i, n:].any()


def _tiny_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<pad>": PAD, "<eos>": EOS, "<bos>": BOS, "<unk>": 3}
    vocab.update({f"w{i}": i for i in range(4, VOCAB)})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        eos_token="<eos>",
        bos_token="<bos>",
        unk_token="<unk>",
    )


@pytest.mark.parametrize("lora", [False, True])
def test_saved_checkpoint_loads_with_identical_end_scores(tmp_path, lora):
    """Save (LoRA merged into the backbone) -> load_reward_model -> the in-memory model's scores."""
    from marlhf.config import ModelConfig
    from marlhf.models.lora import apply_lora

    torch.manual_seed(1)
    model = RewardModel(_tiny_causal_lm().model)
    if lora:
        model.backbone = apply_lora(model.backbone, ModelConfig(lora_dim=4, lora_alpha=8.0))
        with torch.no_grad():  # peft initialises B = 0; make the adapters matter
            for n, p in model.named_parameters():
                if "lora_B" in n:
                    p.normal_(0, 0.3)
    model.eval()
    _, ids, mask, _ = _pair_batch()
    with torch.no_grad():
        expected = end_scores(model(ids, mask), mask)
    save_reward_checkpoint(
        model,
        _tiny_tokenizer(),
        tmp_path / "rm",
        zero_stage=0,
        rm_type="end",
        run_config={"a": 1},
        ds_config={"b": 2},
        score_stats={"mean": 0.5, "std": 2.0},
    )
    loaded, info = load_reward_model(tmp_path / "rm")
    with torch.no_grad():
        got = end_scores(loaded.eval()(ids, mask), mask)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert info["score_stats"].std == 2.0 and info["rm_type"] == "end"
    assert json.loads((tmp_path / "rm" / "run_config.json").read_text()) == {"a": 1}


def test_cli_flags_and_validation():
    cfg = parse_config(
        RewardStageConfig,
        [
            "--rm_type",
            "segment",
            "--termination_condition",
            "fixed",
            "--ngram",
            "3",
            "--use_margin",
            "--center_rewards_coef",
            "0.01",
            "--num_padding_at_beginning",
            "1",
            "--zero_stage",
            "3",
        ],
    )
    assert cfg.reward.rm_type == "segment" and cfg.macro.ngram == 3 and cfg.reward.use_margin
    assert cfg.reward.num_padding_at_beginning == 1 and cfg.ds.zero_stage == 3
    with pytest.raises(ValueError, match="--center_rewards_coef"):
        RewardConfig(center_rewards_coef=-1.0)
    with pytest.raises(ValueError, match="--rm_type"):
        RewardConfig(rm_type="dense")
    with pytest.raises(SystemExit):
        parse_config(RewardStageConfig, ["--normalizer_max_samples", "-1"])


def _build(cfg):
    """The stage's reward model of ``cfg``, built from the parts the stage passes."""
    args = (cfg.model, cfg.ds.zero_stage, cfg.optim, cfg.reward.init_value_head)
    return reward_stage.build_reward_model(*args)


def test_init_value_head_starts_from_the_saved_head(tmp_path):
    """--init_value_head: build_reward_model copies value_head.safetensors of the base (a fresh,
    random head otherwise); a base without one, or with a head of another width, is refused."""
    from safetensors.torch import save_file

    from marlhf.models.zoo import ensure_tiny_base

    base = tmp_path / "base"
    shutil.copytree(ensure_tiny_base(), base)
    head = torch.linspace(-1, 1, 128).unsqueeze(0)
    save_file({"weight": head}, base / "value_head.safetensors")
    cfg = parse_config(RewardStageConfig, ["--model_name_or_path", str(base), "--init_value_head"])
    assert cfg.reward.init_value_head
    assert torch.equal(_build(cfg).v_head.weight.detach(), head)
    fresh = parse_config(RewardStageConfig, ["--model_name_or_path", str(base)])
    assert not torch.equal(_build(fresh).v_head.weight.detach(), head)
    save_file({"weight": torch.zeros(1, 64)}, base / "value_head.safetensors")
    with pytest.raises(
        ValueError, match=r"value_head.safetensors must hold 'weight' of shape \(1, 128\)"
    ):
        _build(cfg)
    (base / "value_head.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="--init_value_head: .*value_head.safetensors"):
        _build(cfg)


# --------------------------------------------------------------------------------------------------
# end to end (subprocesses: DeepSpeed sets its process group up once per process)

ROOT = Path(__file__).resolve().parents[3]
SEQ = "192"


def _run(module: str, args: list[str], cache: Path) -> None:
    env = stage_env()
    cmd = [
        sys.executable,
        "-m",
        module,
        "--data_output_path",
        str(cache),
        "--max_seq_len",
        SEQ,
        "--disable_progress_bar",
        "--enable_tensorboard",
        "false",
        "--seed",
        "1234",
        *args,
    ]
    proc = run_python(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("rm_stage")


@pytest.fixture(scope="module")
def sft_dir(workdir):
    """A briefly SFT-trained tiny model (1 epoch, 23 steps): the RM learns faster from it than from
    the random `tiny` (0.61 vs 0.56 eval accuracy after 40 steps in our runs)."""
    out = workdir / "sft"
    _run(
        "marlhf.stages.sft",
        [
            "--model_name_or_path",
            "tiny",
            "--output_dir",
            str(out),
            "--per_device_train_batch_size",
            "16",
            "--learning_rate",
            "2e-3",
            "--warmup_ratio",
            "0.05",
            "--num_train_epochs",
            "1",
        ],
        workdir / "cache",
    )
    return out


STEPS, SAVE = 36, 18
RM_ARGS = [
    "--per_device_train_batch_size",
    "16",
    "--per_device_eval_batch_size",
    "32",
    "--learning_rate",
    "1e-3",
    "--warmup_ratio",
    "0.1",
    "--max_steps",
    str(STEPS),
    "--eval_interval",
    str(SAVE),
    "--save_steps",
    str(SAVE),
]


@pytest.fixture(scope="module")
def rm_dir(workdir, sft_dir):
    out = workdir / "rm"
    _run(
        "marlhf.stages.reward",
        ["--model_name_or_path", str(sft_dir), "--output_dir", str(out), *RM_ARGS],
        workdir / "cache",
    )
    return out


def _texts_scores(model, tokenizer, prompts, responses, batch=32):
    """End scores of bos + prompt + response + eos, tokenised independently of the stage."""
    seqs = [
        [tokenizer.bos_token_id]
        + tokenizer(p, add_special_tokens=False)["input_ids"]
        + tokenizer(r, add_special_tokens=False)["input_ids"]
        + [tokenizer.eos_token_id]
        for p, r in zip(prompts, responses, strict=True)
    ]
    out = []
    with torch.no_grad():
        for i in range(0, len(seqs), batch):
            chunk = seqs[i : i + batch]
            T = max(len(s) for s in chunk)
            ids = torch.tensor([s + [tokenizer.pad_token_id] * (T - len(s)) for s in chunk])
            mask = torch.tensor([[1] * len(s) + [0] * (T - len(s)) for s in chunk])
            out += end_scores(model(ids, mask), mask).tolist()
    return out


@pytest.mark.slow
def test_rm_learns_preferences_and_tracks_gold_score(rm_dir):
    """Measured after 36 steps (576 pairs) from a 1-epoch SFT tiny model: eval accuracy 0.59 on the
    RM eval split (120 pairs) and 0.587 on all 300 eval comparisons scored from text by the saved
    model (the labels agree with the gold score on 87 %); Pearson r with the gold score 0.066 over
    the 600 eval summaries and 0.115 between score gaps and gold gaps of the 300 pairs. The tiny RM
    is weak but clearly better than chance; the thresholds leave a margin."""
    from marlhf.data.sources import load_examples
    from marlhf.data.synthetic import gold_score
    from marlhf.runtime.tracking import read_metrics

    rows = read_metrics(rm_dir / "metrics.jsonl")
    final = [r for r in rows if r["step"] == STEPS and "eval/accuracy" in r][-1]
    assert final["eval/accuracy"] >= 0.55
    for key in ("train/loss", "train/accuracy", "lr"):
        assert any(key in r for r in rows)
    for key in ("eval/chosen_mean", "eval/rejected_mean", "eval/score_std", "eval/loss"):
        assert key in final
    assert final["eval/chosen_mean"] > final["eval/rejected_mean"]

    model, info = load_reward_model(rm_dir)
    model.eval()
    tok = transformers.AutoTokenizer.from_pretrained(rm_dir)
    exs, _ = load_examples("synthetic-tldr", "eval")
    prompts = [e.prompt for e in exs]
    chosen = _texts_scores(model, tok, prompts, [e.chosen for e in exs])
    rejected = _texts_scores(model, tok, prompts, [e.rejected for e in exs])
    acc = sum((c > r) + 0.5 * (c == r) for c, r in zip(chosen, rejected, strict=True)) / len(exs)
    assert acc >= 0.54, acc  # chance is 0.5; sd of the estimate at 300 pairs is 0.03
    gc = torch.tensor([gold_score(e.prompt, e.chosen) for e in exs], dtype=torch.float64)
    gr = torch.tensor([gold_score(e.prompt, e.rejected) for e in exs], dtype=torch.float64)
    c = torch.tensor(chosen, dtype=torch.float64)
    rj = torch.tensor(rejected, dtype=torch.float64)
    r_all = float(torch.corrcoef(torch.stack([torch.cat([c, rj]), torch.cat([gc, gr])]))[0, 1])
    r_gap = float(torch.corrcoef(torch.stack([c - rj, gc - gr]))[0, 1])
    assert r_all > 0.0, r_all
    assert r_gap > 0.05, r_gap


@pytest.mark.slow
def test_saved_score_stats_match_the_loaded_model(rm_dir, workdir):
    """score_stats were computed by the in-memory engine at the end of training; recomputing them with
    the model loaded from output_dir gives the same numbers (so the saved model is that model)."""
    from marlhf.data.collate import PairCollator
    from marlhf.data.config import DataConfig
    from marlhf.data.tokenize import build_pair_dataset

    model, info = load_reward_model(rm_dir)
    model.eval()
    tok = transformers.AutoTokenizer.from_pretrained(rm_dir)
    ds = build_pair_dataset(
        DataConfig(data_output_path=str(workdir / "cache"), max_seq_len=int(SEQ)), tok, "eval", 1234
    )
    collate = PairCollator(tok.pad_token_id)
    scores = []
    with torch.no_grad():
        for i in range(0, len(ds), 32):
            b = collate([ds[j] for j in range(i, min(i + 32, len(ds)))])
            scores.append(
                end_scores(model(b["input_ids"], b["attention_mask"]), b["attention_mask"])
            )
    s = torch.cat(scores).double()
    assert s.numel() == 2 * len(ds)
    assert math.isclose(info["score_stats"].mean, float(s.mean()), rel_tol=1e-4, abs_tol=1e-4)
    assert math.isclose(
        info["score_stats"].std, float(s.std(unbiased=False)), rel_tol=1e-4, abs_tol=1e-4
    )
    assert info["global_step"] == STEPS
    # the intermediate checkpoint is a loadable reward-model directory too
    mid, mid_info = load_reward_model(rm_dir / "checkpoints" / f"step-{SAVE}")
    assert mid_info["global_step"] == SAVE
    for name in ("run_config.json", "ds_config.json"):
        assert (rm_dir / name).is_file()


@pytest.mark.slow
def test_resume_continues_the_same_run(rm_dir, sft_dir, workdir):
    """Kill after step 18 (latest.json pointed back at step-18 in a copy), rerun: steps 19..36 log the
    same metrics as the uninterrupted run."""
    from marlhf.runtime.tracking import read_metrics

    copy = workdir / "rm_resumed"
    shutil.copytree(rm_dir, copy)
    latest = copy / "train_state" / "latest.json"
    state = json.loads(latest.read_text())
    assert (copy / "train_state" / "model" / f"step-{SAVE}").is_dir()
    latest.write_text(json.dumps({**state, "tag": f"step-{SAVE}", "step": SAVE}))
    before = read_metrics(copy / "metrics.jsonl")  # the whole run's rows: steps after SAVE too
    _run(
        "marlhf.stages.reward",
        ["--model_name_or_path", str(sft_dir), "--output_dir", str(copy), *RM_ARGS],
        workdir / "cache",
    )
    after = read_metrics(copy / "metrics.jsonl")
    kept = [r for r in before if r["step"] <= SAVE]
    assert after[: len(kept)] == kept  # the rows up to the checkpoint, untouched
    resumed = after[len(kept) :]  # the rows the first attempt logged after it are gone: no doubles
    original = [r for r in read_metrics(rm_dir / "metrics.jsonl") if r["step"] > SAVE]
    assert resumed and min(r["step"] for r in resumed) == SAVE + 1
    keys = ("train/loss", "train/accuracy", "lr", "eval/accuracy", "eval/loss", "eval/chosen_mean")
    assert len(resumed) == len(original)
    for a, b in zip(original, resumed, strict=True):
        assert a["step"] == b["step"]
        for k in keys:
            if k in a:
                assert math.isclose(a[k], b[k], rel_tol=1e-4, abs_tol=1e-5), (
                    a["step"],
                    k,
                    a[k],
                    b[k],
                )


@pytest.mark.slow
def test_segment_rm_saves_normalizer_and_termination(workdir):
    out = workdir / "rm_segment"
    _run(
        "marlhf.stages.reward",
        [
            "--model_name_or_path",
            "tiny",
            "--output_dir",
            str(out),
            "--rm_type",
            "segment",
            "--termination_condition",
            "fixed",
            "--ngram",
            "3",
            "--max_steps",
            "3",
            "--per_device_train_batch_size",
            "8",
            "--per_device_eval_batch_size",
            "32",
            "--eval_iters",
            "1",
            "--normalizer_max_samples",
            "64",
            "--learning_rate",
            "1e-4",
        ],
        workdir / "cache",
    )
    model, info = load_reward_model(out)
    assert info["rm_type"] == "segment"
    assert (
        info["termination"]["termination_condition"] == "fixed"
        and info["termination"]["ngram"] == 3
    )
    MacroConfig(
        **{k: tuple(v) if isinstance(v, list) else v for k, v in info["termination"].items()}
    )
    norm = info["normalizer"]
    assert all(math.isfinite(x) for x in (norm.a, norm.b, norm.c, norm.d)) and norm.d > 0
    from marlhf.runtime.tracking import read_metrics

    rows = read_metrics(out / "metrics.jsonl")
    seg = [r for r in rows if "macro/mean_len" in r]
    # 3-grams with the EOS alone: the mean segment length lies between 1 and 3
    assert seg and all(1.0 < r["macro/mean_len"] <= 3.0 for r in seg)


@pytest.mark.slow
def test_resumed_run_saves_the_score_stats_of_the_uninterrupted_one(workdir):
    """An intermediate checkpoint holds the end-score statistics of the latest evaluation. Evaluate
    at step 5, save every 2 steps, resume from step 6: the step-8 checkpoint must hold the step-5
    statistics, as in the run never stopped (not `score_stats: null`)."""
    args = [
        "--model_name_or_path", "tiny", "--max_steps", "10", "--eval_interval", "5",
        "--save_steps", "2", "--keep_checkpoints", "5", "--eval_iters", "2",
        "--per_device_train_batch_size", "4", "--per_device_eval_batch_size", "16",
        "--learning_rate", "1e-3",
    ]  # fmt: skip
    full = workdir / "rm_stats_full"
    _run("marlhf.stages.reward", [*args, "--output_dir", str(full)], workdir / "cache")
    resumed = workdir / "rm_stats_resumed"
    shutil.copytree(full, resumed)
    latest = resumed / "train_state" / "latest.json"
    latest.write_text(json.dumps({**json.loads(latest.read_text()), "tag": "step-6", "step": 6}))
    shutil.rmtree(resumed / "checkpoints" / "step-8")
    _run("marlhf.stages.reward", [*args, "--output_dir", str(resumed)], workdir / "cache")

    def stats(run: Path, step: int):
        return json.loads(
            (run / "checkpoints" / f"step-{step}" / "reward_config.json").read_text()
        )["score_stats"]

    assert stats(full, 4) is None  # before the first evaluation: nothing to hold
    assert stats(full, 6) is not None and stats(full, 8) == stats(full, 6)
    assert stats(resumed, 8) == stats(full, 8)
