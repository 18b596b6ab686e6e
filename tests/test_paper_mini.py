"""presets/paper_mini.yaml: the paper preset in miniature (a tiny random Qwen3 target with Qwen3's own tokenizer
and chat template), its plan, and the plan-time errors of that path."""

import json
import shutil

import pytest
import yaml

from dscout import config as dcfg
from tests.workflow import DATA, PAPER_DATA_ENV, ROOT, snakemake

PRESETS = (ROOT / "config.yaml", ROOT / "presets" / "paper.yaml", ROOT / "presets" / "paper_mini.yaml")
QWEN3_TOK = DATA / "tokenizers" / "qwen3"
needs_qwen3 = pytest.mark.skipif(not (QWEN3_TOK / "tokenizer_config.json").exists(),
                                 reason=f"Qwen3's tokenizer is not mirrored at {QWEN3_TOK}")


def _mini_cfg():
    return dcfg.load_config(*PRESETS)


def _yaml(path):
    return yaml.safe_load(path.read_text()) or {}


def test_mini_changes_sizes_not_kinds():
    """What the mini preset overrides beyond sizes is the documented CPU set; the shape the issue asks for holds."""
    paper, mini = _yaml(PRESETS[1]), _yaml(PRESETS[2])
    cfg = _mini_cfg()
    t = cfg["target"]
    assert t["source"].startswith("tiny-qwen3") and t["enable_thinking"] is False
    assert t["vocab_size"] == paper["target"]["vocab_size"] == 151936 and t["mask_token_id"] == 151669
    assert cfg["features"]["mode"] == "online" and cfg["training"]["max_steps"] is None
    assert cfg["training"]["deepspeed_config"] == "configs/deepspeed/zero2_bf16.json"
    assert cfg["training"]["warmup_ratio"] > 0 and cfg["training"]["epochs"] >= 1
    L = t["num_layers"]
    ds = dcfg.resolved_layer_ids(dcfg.drafter_variant(cfg, "dscout"), L)
    assert ds == list(range(L - 1)) and cfg["drafters"]["dscout"]["num_layers"] == 6  # every conditioning layer
    df = dcfg.resolved_layer_ids(dcfg.drafter_variant(cfg, "dflash"), L)
    assert len(df) == 5 and cfg["drafters"]["dflash"]["num_layers"] == 5
    for k in ("eagle3", "pard2"):
        assert cfg["drafters"][k]["pretrained"] and cfg["drafters"][k]["kind"] == paper["drafters"][k]["kind"]
    assert [m["kind"] for m in cfg["methods"]] == [m["kind"] for m in paper["methods"]]
    assert cfg["temperatures"] == [0.0, 1.0] and cfg["repeats"] >= 2
    assert all(cfg[s]["enabled"] for s in ("study", "depth_search", "serving"))
    # kinds the mini preset replaces: the named CPU set only (each explained in the preset's header)
    assert (cfg["responses"]["backend"], cfg["serving"]["backend"]) == ("transformers", "batched")
    assert (paper["responses"]["backend"], paper["serving"]["backend"]) == ("sglang", "sglang")


@needs_qwen3
def test_tiny_qwen3_target_has_qwen3s_traits(tmp_path):
    from transformers import Qwen3ForCausalLM

    from dscout.models.target import TargetModel, prepare_target

    t = TargetModel.load(prepare_target("tiny-qwen3:3", tmp_path, DATA))
    assert isinstance(t.model, Qwen3ForCausalLM) and t.num_layers == 3
    c = t.config
    assert c.head_dim != c.hidden_size // c.num_attention_heads
    assert t.lm_head.weight.data_ptr() != t.embed_tokens.weight.data_ptr() and not c.tie_word_embeddings
    assert hasattr(t.layers[0].self_attn, "q_norm") and hasattr(t.layers[0].self_attn, "k_norm")
    assert t.vocab_size == 151936 and len(t.tokenizer) == 151669  # the mask row 151669: inside, above regular ids
    assert t.tokenizer.convert_tokens_to_ids("<|im_end|>") in t.model.generation_config.eos_token_id \
        if isinstance(t.model.generation_config.eos_token_id, list) \
        else t.tokenizer.convert_tokens_to_ids("<|im_end|>") == t.model.generation_config.eos_token_id


@needs_qwen3
def test_thinking_off_gives_the_same_ids_at_all_three_stages(tmp_path):
    """Response generation, training and benchmarking tokenize one conversation to the same ids: Qwen3's
    template with enable_thinking false, i.e. the assistant turn opens with an empty think block."""
    from transformers import AutoTokenizer

    from dscout.data.prompts import chat_prompt_ids
    from dscout.data.responses import generate_responses, training_sequences
    from dscout.jsonl import read_jsonl
    from dscout.models.target import TargetModel, prepare_target

    cfg = _mini_cfg()
    L = cfg["target"]["num_layers"]
    target = TargetModel.load(prepare_target("tiny-qwen3:2", tmp_path / "t", DATA))
    text = "Natalia sold clips to 48 of her friends. How many clips did she sell?"
    # stage 1: response generation, with the responses stage's chat settings (as `dscout generate`)
    rs = dcfg.responses_stage(cfg)
    out = generate_responses(target, [{"id": "q0", "source": "gsm8k_train", "prompt": text}], tmp_path / "r.jsonl",
                             max_new_tokens=3, system_prompt=rs["chat"]["system_prompt"],
                             enable_thinking=rs["chat"]["enable_thinking"])
    row = read_jsonl(out)[0]
    # stage 2: the training sequence built from that row
    seq = training_sequences([row], max_length=64, min_response_tokens=1)[0]
    # stage 3: the benchmark's prompt, with the bench stage's chat settings (as run_benchmark)
    bs = dcfg.bench_stage(cfg, L)
    bench = chat_prompt_ids(target.tokenizer, [{"role": "user", "content": text}], bs["chat"]["system_prompt"],
                            bs["chat"]["enable_thinking"])
    n = len(bench)
    assert row["prompt_ids"] == bench == seq["input_ids"][:n]
    assert seq["loss_mask"][:n] == [0] * n and seq["loss_mask"][n:] == [1] * (len(seq["input_ids"]) - n)
    # ... and they are what the real Qwen3 tokenizer gives with thinking off: the empty think block closes the prompt
    real = AutoTokenizer.from_pretrained(str(QWEN3_TOK))
    ref = real.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True,
                                   enable_thinking=False)
    ref = list(ref["input_ids"] if hasattr(ref, "keys") else ref)
    assert bench == ref
    assert real.decode(bench).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    thinking_on = chat_prompt_ids(target.tokenizer, [{"role": "user", "content": text}], None, True)
    assert thinking_on != bench  # the switch changes the ids: the check above can fail


def test_paper_mini_plans_every_rule_of_the_paper_dag():
    """`snakemake -n` with paper.yaml + paper_mini.yaml: the same rules as the paper preset's plan, plus only the
    writer of the local published checkpoints."""
    def jobs(*presets):
        r = snakemake("-n", "--cores", "2", "--configfile", *presets, env=PAPER_DATA_ENV)
        table = r.stdout.split("Job stats:")[1].split("total")[0]
        return {ln.split()[0] for ln in table.splitlines()[3:] if ln.strip()}
    paper = jobs("presets/paper.yaml")
    mini = jobs("presets/paper.yaml", "presets/paper_mini.yaml")
    assert paper <= mini and mini - paper <= {"write_published"}
    assert {"study_table1", "study_fig7", "depth_search", "fig5", "table4", "fig_online", "benchmark_sampled"} <= mini


def _mirror_with_template(tmp_path, template):
    root = tmp_path / "data"
    shutil.copytree(DATA, root, ignore=shutil.ignore_patterns("tokenizers"))
    tok = root / "tokenizers" / "qwen3"
    tok.mkdir(parents=True)
    conf = json.loads((QWEN3_TOK / "tokenizer_config.json").read_text())
    if template is not None:
        conf["chat_template"] = template
    (tok / "tokenizer_config.json").write_text(json.dumps(conf))
    return root


@needs_qwen3
def test_plan_refuses_a_qwen3_template_without_the_thinking_switch(tmp_path, monkeypatch):
    cfg = _mini_cfg()
    monkeypatch.delenv("DSCOUT_DATA_ROOT", raising=False)
    no_switch = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}" \
                "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    bad = _mirror_with_template(tmp_path / "bad", no_switch)
    with pytest.raises(ValueError, match=r"target.enable_thinking: False is set for Qwen3 target 'tiny-qwen3:8', "
                                         r"but its chat template \(.*tokenizers/qwen3\) has no enable_thinking switch"):
        dcfg.check_plan({**cfg, "data_root": str(bad), "responses": {**cfg["responses"], "sources": []}}, "mini")
    # the same template is fine once the switch is not asked for
    off = {**cfg, "data_root": str(bad), "responses": {**cfg["responses"], "sources": []},
           "target": {**cfg["target"], "enable_thinking": None}}
    dcfg.check_plan(off, "mini")


def test_plan_refuses_taps_outside_the_target():
    cfg = _mini_cfg()
    cfg["drafters"]["dscout"]["target_layer_ids"] = [0, 3, 8, 9]
    with pytest.raises(ValueError, match=r"drafters.dscout.target_layer_ids: \[8, 9\] outside the target's layers "
                                         r"\[0, 8\) \(target.num_layers\)"):
        dcfg.check_plan(cfg, "mini")
