"""lm-eval model ``dscout``: any lm-eval generation task decoded through our speculative engine, with τ and the
speedup over AR reported beside the task's metric.

    dscout-lm-eval --model dscout \\
        --model_args target=results/target/<id>,drafter=results/drafters/<id>,block_size=16 \\
        --tasks gsm8k --limit 20 [--apply_chat_template] [--output_path out/]

``dscout-lm-eval`` is lm-eval's own command line (``lm_eval.__main__.cli_evaluate``: every flag as documented
there) run after this module registered the model; lm-eval 0.4 has no plugin entry point for models, so the
plain ``lm_eval`` executable cannot see it. The same works from Python: ``import dscout.lmeval_model`` then
``lm_eval.simple_evaluate(model="dscout", model_args=...)``.

Each request is decoded by the speculative engine and, with ``compare_ar=True`` (default), by plain AR on the
same prompt right after it (paired timing). Greedy requests must produce identical tokens (counted); the speed
table printed after lm-eval's results (and written to ``<output_path>/dscout_speed.json`` or ``stats_path``) gives
per task: requests, decoded tokens, τ (mean accepted tokens per draft round), TPOT and speedup = AR decode time /
speculative decode time over the same requests.

``until`` stop strings: the engine stops at the target's stop tokens; text after the first stop string is cut
off (as lm-eval's own backends do), and both decoders run the same token budget, so the pairing stays fair.
Loglikelihood requests are refused: this model decodes.
"""

from __future__ import annotations

import json
from pathlib import Path

from lm_eval.api.model import LM
from lm_eval.api.registry import register_model

SPEED_FILE = "dscout_speed.json"
KIND_LABELS = {"dflash": "DFlash", "dscout": "DScout", "eagle3": "EAGLE-3", "pard2": "PARD-2"}
# lm-eval tasks whose dataset is one of our mirror files: ``<task>_mirror`` reads it through datasets' JSON builder
MIRROR_TASKS = {
    "gsm8k": ("gsm8k/gsm8k.yaml", {"train": "gsm8k/train.jsonl", "test": "gsm8k/test.jsonl"}),
    "minerva_math500": ("minerva_math/minerva_math500.yaml", {"test": "math500/test.jsonl"}),
}


def _bool(v) -> bool:
    return v if isinstance(v, bool) else str(v).strip().lower() in ("1", "true", "yes", "on")


def drafter_method_kind(drafter_dir: str | Path) -> str:
    """The method kind of a trained or imported drafter folder (``dflash``, ``dscout``, ``eagle3``, ``pard2``).

    Read from its ``config.resolved.json`` (block-diffusion drafters store ``kind: dflash`` and their recipe).

    Raises:
        FileNotFoundError: the folder has no ``config.resolved.json`` (pass ``kind=`` explicitly).
    """
    path = Path(drafter_dir) / "config.resolved.json"
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: pass kind=dflash|dscout|eagle3|pard2 in --model_args")
    from .kinds import drafter_kind

    st = json.loads(path.read_text())["stage_config"]
    kinds = drafter_kind(st.get("kind") or "dflash").method_kinds  # the method kinds this drafter serves
    return st.get("recipe") if st.get("recipe") in kinds else kinds[0]


@register_model("dscout")
class DScoutLM(LM):
    """lm-eval ``LM`` whose ``generate_until`` runs :class:`dscout.decoding.engine.SpeculativeEngine`.

    Args (``--model_args`` keys):
        target: a prepared target folder (``results/target/<id>``, holds ``target.json``) or a transformers model
            folder / hub id.
        drafter: a drafter folder (``results/drafters/<id>``); omitted = AR only.
        kind: method kind (default: read from the drafter folder).
        block_size: bs, tokens verified per draft round (default 16); ``online`` = the online block-size controller
            (DFlash/DScout drafters; docs/online_controller.md) picks bs every round.
        topk, depth: EAGLE-3 tree shape (defaults 4 and 4).
        compare_ar: also decode each request with AR for the paired speedup (default true).
        max_gen_toks: token budget when a task gives none (default 256).
        dtype: target dtype for a model folder (default float32); device: cpu / cuda (default: auto).
        stop_tokens: extra stop tokens, ``|``-separated (default: the tokenizer's end of turn / eos).
        threads: torch CPU threads; stats_path: where to write the speed table (JSON).
        system_prompt: a system turn for ``--apply_chat_template``.
    Raises:
        NotImplementedError: for loglikelihood requests.
    """

    instances: list["DScoutLM"] = []

    def __init__(self, target: str, drafter: str | None = None, kind: str | None = None, block_size: int | str = 16,
                 topk: int = 4, depth: int = 4, compare_ar=True, max_gen_toks: int = 256, dtype: str = "float32",
                 device: str = "auto", stop_tokens: str | None = None, threads: int | None = None,
                 stats_path: str | None = None, system_prompt: str | None = None, seed: int = 0, **_ignored):
        super().__init__()
        import torch

        from .evaluation.methods import build_methods
        from .models.target import load_prepared_target as load_target, process_device as _device
        from .models.target import TargetModel

        if threads:
            torch.set_num_threads(int(threads))
        tdir = Path(target)
        if (tdir / "target.json").exists():
            self.target = load_target(str(tdir))
        else:
            self.target = TargetModel.load(target, dtype=getattr(torch, dtype), device=_device(device))
        tok = self.target.tokenizer
        stops = {tok.eos_token_id} - {None}
        for s in ([t for t in stop_tokens.split("|") if t] if stop_tokens else ["<|im_end|>", "<|eot_id|>"]):
            i = tok.convert_tokens_to_ids(s)
            if isinstance(i, int) and i != tok.unk_token_id:
                stops.add(i)
        specs = []
        if drafter:
            kind = kind or drafter_method_kind(drafter)
            bs = "online" if str(block_size) == "online" else int(block_size)
            specs = [{"name": f"{KIND_LABELS.get(kind, kind)}({bs})", "kind": kind, "drafter": "drafter",
                      "block_size": bs, "topk": int(topk), "depth": int(depth)}]
        methods = build_methods(self.target, specs, {"drafter": drafter} if drafter else {}, sorted(stops))
        self.ar, self.method = methods[0], (methods[1] if drafter else methods[0])
        self.block_size = self.method.max_block_size if drafter else 1  # online: the controller's upper bound
        self.compare_ar = _bool(compare_ar) and drafter is not None
        self.max_gen_toks = int(max_gen_toks)
        self.stats_path = stats_path
        self.system_prompt = system_prompt
        self.seed = int(seed)
        self.stats: dict[str, dict] = {}
        DScoutLM.instances.append(self)  # main() prints each model's speed table after lm-eval's results
        warm = tok("Warm-up.", add_special_tokens=False)["input_ids"]  # first calls pay one-off costs: not timed
        for m in {id(self.ar): self.ar, id(self.method): self.method}.values():
            m.engine.generate(warm, 4, block_size=self.block_size if m is self.method else 1)

    # ---------------------------------------------------------------------------------------- chat templates
    @property
    def tokenizer_name(self) -> str:
        return str(getattr(self.target.tokenizer, "name_or_path", "dscout")).replace("/", "__")

    def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        msgs = ([{"role": "system", "content": self.system_prompt}] if self.system_prompt else []) + list(chat_history)
        return self.target.tokenizer.apply_chat_template(msgs, tokenize=False,
                                                         add_generation_prompt=add_generation_prompt)

    # ------------------------------------------------------------------------------------------- requests
    def loglikelihood(self, requests):
        raise NotImplementedError("the dscout model decodes (generate_until tasks); score loglikelihood tasks with "
                                  "lm-eval's hf model on the same target")

    def loglikelihood_rolling(self, requests):
        raise NotImplementedError("the dscout model decodes (generate_until tasks)")

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Decode each request (context, gen_kwargs) speculatively (and with AR, paired); cut at ``until``."""
        from tqdm import tqdm

        tok = self.target.tokenizer
        out = []
        for req in tqdm(requests, desc="dscout", disable=disable_tqdm):
            context, gen_kwargs = req.args
            gen_kwargs = dict(gen_kwargs or {})
            until = gen_kwargs.get("until") or []
            until = [until] if isinstance(until, str) else list(until)
            max_new = int(gen_kwargs.get("max_gen_toks", self.max_gen_toks))
            temperature = float(gen_kwargs.get("temperature", 0.0) or 0.0)
            if not gen_kwargs.get("do_sample", temperature > 0):
                temperature = 0.0
            ids = tok(context, add_special_tokens=False)["input_ids"]
            r = self.method.engine.generate(ids, max_new, block_size=self.block_size, temperature=temperature,
                                            seed=self.seed)
            text = tok.decode(r.output_ids, skip_special_tokens=True)
            cut = min([text.find(s) for s in until if s and s in text], default=-1)
            if cut >= 0:
                text = text[:cut]
            s = self.stats.setdefault(getattr(req, "task_name", None) or "task", {
                "requests": 0, "new_tokens": 0, "rounds": 0, "accepted_tokens": 0, "decode_seconds": 0.0,
                "ar_decode_seconds": 0.0, "ar_new_tokens": 0, "greedy_compared": 0, "greedy_mismatches": 0})
            s["requests"] += 1
            s["new_tokens"] += len(r.output_ids)
            s["rounds"] += len(r.accept_lengths)
            s["accepted_tokens"] += sum(r.accept_lengths)
            s["decode_seconds"] += r.decode_seconds
            if self.compare_ar:
                a = self.ar.engine.generate(ids, max_new, block_size=1, temperature=temperature, seed=self.seed)
                s["ar_decode_seconds"] += a.decode_seconds
                s["ar_new_tokens"] += len(a.output_ids)
                if temperature == 0:
                    s["greedy_compared"] += 1
                    s["greedy_mismatches"] += int(a.output_ids != r.output_ids)
            out.append(text)
            self.cache_hook.add_partial("generate_until", (context, gen_kwargs), text)
        return out

    # --------------------------------------------------------------------------------------------- report
    def speed_table(self) -> dict[str, dict]:
        """Per task: the sums above plus ``tau``, ``tpot_ms``, ``ar_tpot_ms`` and ``speedup`` (None where absent)."""
        table = {}
        for task, s in self.stats.items():
            row = dict(s, method=self.method.name, block_size=self.method.block_size or 1)
            row["tau"] = s["accepted_tokens"] / s["rounds"] if s["rounds"] else None
            row["tpot_ms"] = 1000 * s["decode_seconds"] / max(s["new_tokens"] - s["requests"], 1)
            row["ar_tpot_ms"] = (1000 * s["ar_decode_seconds"] / max(s["ar_new_tokens"] - s["requests"], 1)
                                 if s["ar_new_tokens"] else None)
            row["speedup"] = (row["ar_tpot_ms"] / row["tpot_ms"]) if row["ar_tpot_ms"] and row["tpot_ms"] else None
            table[task] = row
        return table


def format_speed_table(table: dict[str, dict]) -> str:
    """Markdown of :meth:`DScoutLM.speed_table`."""
    lines = ["| task | method | requests | tokens | τ | TPOT ms | AR TPOT ms | speedup | greedy ≠ AR |",
             "|---|---|---|---|---|---|---|---|---|"]
    f = lambda v, p=2: "–" if v is None else f"{v:.{p}f}"  # noqa: E731
    for task, r in table.items():
        lines.append(f"| {task} | {r['method']} | {r['requests']} | {r['new_tokens']} | {f(r['tau'])} | "
                     f"{f(r['tpot_ms'], 1)} | {f(r['ar_tpot_ms'], 1)} | {f(r['speedup'])}× | "
                     f"{r['greedy_mismatches']}/{r['greedy_compared']} |")
    return "\n".join(lines)


def write_mirror_tasks(root: str | Path, out_dir: str | Path) -> list[str]:
    """lm-eval task files ``<task>_mirror`` (gsm8k, minerva_math500) that read our data mirror under ``root``.

    Each includes lm-eval's own task file and replaces only its dataset (``dataset_path: json`` with the mirror
    files), lm-eval's documented way to point a task at local data. Returns the task names written.
    """
    import lm_eval

    tasks_dir = Path(lm_eval.__file__).parent / "tasks"
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    names = []
    for task, (yaml_rel, files) in MIRROR_TASKS.items():
        data_files = {split: str((Path(root) / rel).resolve()) for split, rel in files.items()}
        if not all(Path(f).exists() for f in data_files.values()):
            continue
        lines = [f"include: {tasks_dir / yaml_rel}", f"task: {task}_mirror", "dataset_path: json",
                 "dataset_name: null", "dataset_kwargs:", "  data_files:"]
        lines += [f"    {split}: {path}" for split, path in data_files.items()]
        if "train" not in files:
            lines += ["training_split: null"]
        (out_dir / f"{task}_mirror.yaml").write_text("\n".join(lines) + "\n")
        names.append(f"{task}_mirror")
    return names


def main(argv=None) -> None:
    """``dscout-lm-eval``: lm-eval's command line with the ``dscout`` model registered, then the speed table.

    One extra flag, ``--mirror DATA_ROOT``: add ``<task>_mirror`` tasks reading our data mirror (offline machines).
    """
    import sys
    import tempfile

    from lm_eval.__main__ import cli_evaluate

    args = list(sys.argv[1:] if argv is None else argv)
    with tempfile.TemporaryDirectory() as tasks:
        if "--mirror" in args:
            i = args.index("--mirror")
            root = args[i + 1]
            del args[i:i + 2]
            write_mirror_tasks(root, tasks)
            args += ["--include_path", tasks]
        sys.argv = ["dscout-lm-eval", *args]
        cli_evaluate()
    for lm in DScoutLM.instances:
        table = lm.speed_table()
        print("\ndscout speed (speculative vs AR on the same requests)\n" + format_speed_table(table))
        out = lm.stats_path
        if out is None and "--output_path" in args:
            out = str(Path(args[args.index("--output_path") + 1]) / SPEED_FILE)
        if out:
            Path(out).parent.mkdir(parents=True, exist_ok=True)
            Path(out).write_text(json.dumps(table, indent=1))
            print(f"speed table written to {out}")


if __name__ == "__main__":
    main()


__all__ = ["DScoutLM", "drafter_method_kind", "format_speed_table", "main", "write_mirror_tasks"]
