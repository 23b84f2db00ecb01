#!/usr/bin/env python3
"""bench/serve_engine.py: the torch side of bench/serve.py (GPU machine only).

1. The in-process driver (`serve.py --inprocess MODEL_SPEC`): when
   `transformers serve` cannot run, transformers' continuous-batching
   manager (model.init_continuous_batching(), transformers 5.x) is driven
   in the load generator's own process, with the same arrival schedule and
   metrics: each request is manager.add_request(ids, streaming=True); a
   thread takes every result off manager.get_result() and hands it to the
   event loop; a streamed result carries all tokens so far, so the new ones
   are the growth of generated_tokens; a request ends with is_finished()
   (status FINISHED) or fails (status FAILED, error set). EOS is off
   (eos_token_id None, which init_continuous_batching turns into -1), so
   every request runs to max_tokens. A request the load generator closes
   (disconnect, drain timeout, request timeout) is cancel_request()ed. The
   shim's stats come from woffload.stats() in the same process. Checked
   against transformers 5.x's continuous_batching/continuous_api.py,
   requests.py and initialization.py (the API did not change over the
   versions read), and run on 5.17 in the smoke of
   bench/results/serve-smoke-20261125-h100.txt.

   CUDA graphs: with attn_implementation "paged|sdpa" transformers needs an
   attention mask and then leaves graphs off unless asked
   (decide_use_cuda_graphs): `--cb-graphs default` runs eagerly, `on`
   captures them (describe() records what it resolved to).

2. `python3 bench/serve_engine.py make-checkpoint --model moe --out DIR`:
   the random-weight model of bench/e2e.py (router and embeddings re-drawn
   as there) saved with save_pretrained, with a word-level tokenizer whose
   first words are serve.py's WORDS (one word, one token: a prompt of N
   words is N tokens) and a chat template that passes the message through,
   so `transformers serve` can load DIR with no download.

MODEL_SPEC: e2e:moe, e2e:moe8, e2e:dense (bench/e2e.py's MODELS, random
weights) or a checkpoint directory (from_pretrained).
"""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
import threading
from typing import Any, Callable, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from words import WORDS  # noqa: E402  (the words bench/serve.py's prompts are made of)

WORD_ID0 = 100  # token id of WORDS[0]; below it: specials and padding names


def word_ids(prompt: str) -> List[int]:
    index = {w: i for i, w in enumerate(WORDS)}
    return [WORD_ID0 + index[w] for w in prompt.split()]


def build_model(spec: str, cb: bool = True) -> Any:
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    attn = dict(attn_implementation="paged|sdpa") if cb else {}
    if spec.startswith("e2e:"):
        import e2e
        mi = e2e.MODELS[spec[4:]]
        cfg = getattr(transformers, mi["arch"])(**mi["cfg"])
        torch.manual_seed(0)
        with torch.device("cuda"):
            m = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16, **attn)
        g = torch.Generator("cuda").manual_seed(1234)
        with torch.no_grad():  # routing spreads over the experts, as in e2e.py
            m.get_input_embeddings().weight.normal_(0.0, 1.0, generator=g)
            for name, p in m.named_parameters():
                if name.endswith("mlp.gate.weight"):
                    p.normal_(0.0, 1.0, generator=g)
    else:
        m = AutoModelForCausalLM.from_pretrained(spec, dtype=torch.bfloat16, device_map="cuda", **attn)
    m.eval()
    return m


class Engine:
    """What serve.py calls: prepare(r), async request(args, r, on_token),
    active(), stats(), describe(), close(). One engine serves every phase of
    --rates: the model loads once."""

    def __init__(self, args: argparse.Namespace) -> None:
        import torch
        import transformers
        from transformers import GenerationConfig
        from transformers.generation import ContinuousBatchingConfig

        try:
            import woffload
            self.wo = woffload if woffload.available() else None
        except ImportError:
            self.wo = None
        self.m = build_model(args.inprocess)
        self.V = self.m.config.vocab_size
        self.gc = GenerationConfig(do_sample=False, eos_token_id=None, pad_token_id=0,
                                   max_new_tokens=max(1, int(args.output_len.mean)))
        kw: Dict[str, Any] = dict(max_batch_tokens=args.cb_max_batch_tokens)
        if args.cb_num_blocks:
            kw["num_blocks"] = args.cb_num_blocks
        if args.cb_graphs != "default":
            kw["use_cuda_graph"] = args.cb_graphs == "on"
        self.cb_kw = kw
        if self.wo is not None and not ((self.wo.stats() or {}).get("state") or {}).get("sealed"):
            # the hook seals at the first forward: make it an eager one, not
            # one inside the manager's graph capture (warm-up)
            self.m.generate_batch(inputs=[word_ids(" ".join(WORDS[:8]))],
                                  generation_config=GenerationConfig(do_sample=False, eos_token_id=None,
                                                                     pad_token_id=0, max_new_tokens=2),
                                  continuous_batching_config=ContinuousBatchingConfig(
                                      max_batch_tokens=args.cb_max_batch_tokens, use_cuda_graph=False),
                                  warmup=False, progress_bar=False)
        manager = self.m.init_continuous_batching(generation_config=self.gc,
                                                  continuous_batching_config=ContinuousBatchingConfig(**kw))
        if hasattr(manager, "warmup"):
            # builds the batch processor and its paged cache before the clock
            # starts, and captures the CUDA graphs where they are on
            manager.warmup()
        self.versions = dict(torch=torch.__version__, transformers=transformers.__version__)
        self._serve(args, manager)

    @classmethod
    def around(cls, args: argparse.Namespace, manager: Any, vocab: int = 32000) -> "Engine":
        """An engine around a manager made elsewhere, no model, no torch: the
        CPU tests drive serve.py's in-process path through a fake manager."""
        e = cls.__new__(cls)
        e.wo, e.m, e.V, e.cb_kw, e.versions = None, None, vocab, {}, {}
        e._serve(args, manager)
        return e

    def _serve(self, args: argparse.Namespace, manager: Any) -> None:
        """Start the manager's generation thread and the thread that hands
        its results to the event loop (which must be running: serve.py
        makes the engine inside it)."""
        self.args = args
        self.loop = asyncio.get_running_loop()
        self.queues: Dict[str, asyncio.Queue] = {}
        self.manager = manager
        self.manager.start()
        self.serial = 0
        self.closing = False
        self.poller = threading.Thread(target=self._poll, name="serve-results", daemon=True)
        self.poller.start()

    def _poll(self) -> None:
        while not self.closing:
            out = self.manager.get_result(timeout=0.1)
            if out is not None:
                self.loop.call_soon_threadsafe(self._deliver, out)

    def _deliver(self, out: Any) -> None:
        q = self.queues.get(out.request_id)
        if q is not None:
            q.put_nowait(out)

    def prepare(self, r: Any) -> None:
        r.ids = [i % self.V for i in word_ids(r.prompt)]

    async def request(self, args: argparse.Namespace, r: Any, on_token: Callable[[Any], None]) -> None:
        if r.kind == "bad":
            r.status = None  # no HTTP here: nothing to reject
            return
        # request ids are unique over the process: phases number their
        # requests from 0 again, and a cancelled request's late outputs
        # must not reach a later one of the same name
        self.serial += 1
        rid = f"serve-{r.kind}-{r.idx}-{self.serial}"
        q: asyncio.Queue = asyncio.Queue()
        self.queues[rid] = q
        try:
            self.manager.add_request(r.ids, request_id=rid, max_new_tokens=r.output_len, streaming=True)
            seen = 0
            while True:
                try:
                    out = await asyncio.wait_for(q.get(), 1.0)
                except asyncio.TimeoutError:
                    # a generation thread that died (transformers fails the
                    # requests it holds, not those added later) serves nothing
                    # more: fail now, not at --request-timeout
                    if not self.running():
                        raise RuntimeError("stream error: the continuous-batching generation thread has stopped")
                    continue
                # a failed request carries status FAILED and usually an error
                # text (transformers' _handle_request_error: str(exception),
                # which can be empty)
                status = getattr(getattr(out, "status", None), "name", "")
                if getattr(out, "error", None) or status == "FAILED":
                    raise RuntimeError(f"stream error: {getattr(out, 'error', None) or status}")
                # a streamed output holds every token so far (to_generation_output
                # copies generated_tokens): the new ones are its growth
                toks = list(out.generated_tokens)
                for _ in range(len(toks) - seen):
                    on_token(r)
                seen = max(seen, len(toks))
                if r.kind == "disconnect" and seen >= r.disconnect_after:
                    self.manager.cancel_request(rid)
                    r.text = toks
                    return
                if out.is_finished():
                    r.text = toks
                    r.usage = {"prompt_tokens": len(r.ids), "completion_tokens": len(toks)}
                    return
        except asyncio.CancelledError:
            # cut by the drain timeout or --request-timeout: the engine must
            # stop spending steps on it, or the next phase inherits its load
            self.manager.cancel_request(rid)
            raise
        finally:
            self.queues.pop(rid, None)

    def running(self) -> bool:
        is_running = getattr(self.manager, "is_running", None)
        return True if is_running is None else bool(is_running())

    def active(self) -> Optional[int]:
        """The engine's running batch: requests its scheduler holds (prefilling
        or decoding), None where this transformers has no such field. Read
        from the event loop while the generation thread changes the dict: a
        len() of a dict is atomic under the GIL, and a sample one step stale
        is as good as any."""
        sched = getattr(getattr(self.manager, "batch_processor", None), "scheduler", None)
        act = getattr(sched, "active_requests", None)
        try:
            return len(act) if act is not None else None
        except TypeError:
            return None

    def stats(self) -> Optional[Dict[str, Any]]:
        if self.wo is None:
            return None
        import time
        time.sleep(0.15)  # the consumer thread publishes the prefetch figures every 100 ms
        return self.wo.stats()

    def describe(self) -> Dict[str, Any]:
        """What the engine runs with, as resolved by transformers: whether it
        uses CUDA graphs (paged|sdpa needs an attention mask, and then
        transformers' default is no graphs: initialization's
        decide_use_cuda_graphs), and the paged cache it sized."""
        d: Dict[str, Any] = dict(spec=self.args.inprocess, cb=self.cb_kw, shim=self.wo is not None, **self.versions)
        cbc = getattr(self.manager, "continuous_batching_config", None)
        d["use_cuda_graph"] = str(getattr(cbc, "use_cuda_graph", "?"))
        cache = getattr(getattr(self.manager, "batch_processor", None), "cache", None)
        for k in ("num_blocks", "block_size", "max_batch_tokens"):
            v = getattr(cache, k, None)
            d[f"cache_{k}"] = v if isinstance(v, int) else None
        d["attn_implementation"] = str(getattr(getattr(self.m, "config", None), "_attn_implementation", "?"))
        return d

    def close(self) -> None:
        self.closing = True
        self.poller.join(timeout=5)
        self.manager.stop(block=True, timeout=30)


def make_checkpoint(model: str, out: str) -> None:
    """A random-weight checkpoint `transformers serve` can load from disk."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    m = build_model(f"e2e:{model}", cb=False)
    V = m.config.vocab_size
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "<pad>": 3}
    for i in range(4, WORD_ID0):
        vocab[f"<r{i}>"] = i
    for i, w in enumerate(WORDS):
        vocab[w] = WORD_ID0 + i
    for i in range(WORD_ID0 + len(WORDS), V):  # every id the model can emit decodes
        vocab[f"w{i}"] = i
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>")
    fast.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    m.generation_config.eos_token_id = 2
    m.generation_config.pad_token_id = 3
    m.save_pretrained(out, safe_serialization=True)
    fast.save_pretrained(out)
    print(f"wrote {out}: {model} (random weights), word-level tokenizer of {V} ids, pass-through chat template")


def main() -> int:
    p = argparse.ArgumentParser(description="bench/serve.py's torch side")
    sub = p.add_subparsers(dest="cmd", required=True)
    mk = sub.add_parser("make-checkpoint", help="a random-weight checkpoint with a tokenizer, for transformers serve")
    mk.add_argument("--model", default="moe", help="a key of bench/e2e.py MODELS (default moe)")
    mk.add_argument("--out", required=True)
    a = p.parse_args()
    make_checkpoint(a.model, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
