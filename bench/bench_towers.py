"""Benchmark of the two-towers decomposition (docs/towers.md): time per (head, position) and the
memory it adds on top of the capture.

1. SmolLM2-135M on CPU, a 62-token prompt, head L23H1 at its most attended label: the
   decomposition from a capture it already holds (target ≤ 0.5 s), interleaved with one forward
   pass of the same prompt (the ratio is measured in this one run), with torch's default threads
   and with one thread; and `towers()` end to end (tokenize, capture, decompose, summarise).
2. "Decompose" as the head panel asks for it, SmolLM2 at 62 tokens on the embedded server
   (the app over its embedded backend, in process): the analysis, then a head's decomposition
   polled through the panel's JSON twin until it is there (target ≤ 1 s), for top heads (the
   panel's head is detailed by the time its Decompose is pressed); after (the worker's recent
   analysis: the head's detail kept, one forward pass through its layer only) and before (the
   recent analyses forgotten: a whole analysis again, as every decomposition ran until issue
   40), interleaved.
3. A 1B-shaped random Llama (Llama-3.2-1B's attention: 16 layers, 32 heads of 64, 8 K/V heads,
   d_model 2048; FFN width 2048 and vocabulary 32,000 to spare the shared machine's memory: the
   decomposition does not read them) at 512 tokens, its last layer's head 0 to a position:
   the peak resident memory the decomposition adds (Linux: VmHWM reset via clear_refs), against
   the capture's tensors.

    .venv/bin/python bench/bench_towers.py [--repeats 5] [--sections 123]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from bench_analysis import prompt_of
from machine import cpu_model
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerBase

from model_worker.analysis.icl import detect_structure
from model_worker.model.capture import RunCache, run_with_cache
from model_worker.model.loading import LoadedModel, load_model, wrap_model
from model_worker.model.prompting import encode_prompt
from model_worker.towers.run import decompose, default_position, towers

if TYPE_CHECKING:
    from fastapi.testclient import TestClient


def median_s(run: Callable[[], object], repeats: int) -> float:
    run()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def capture(loaded: LoadedModel, ids: torch.Tensor) -> RunCache:
    return run_with_cache(
        loaded.model, loaded.adapter, loaded.geometry, ids, logits_to_keep=1, record_qk=True
    )


def smollm2(repeats: int) -> LoadedModel:
    loaded = load_model(None, device="cpu")
    prompt = prompt_of(loaded, 62)
    ids = encode_prompt(loaded, prompt).ids[None]
    n = ids.shape[1]
    cache = capture(loaded, ids)
    labels = detect_structure(prompt, encode_prompt(loaded, prompt).offsets).labels
    position = default_position(cache, 23, 1, [span.position for span in labels])
    last = n - 1

    def decomposition() -> None:
        decompose(loaded, cache, 23, 1, last, [position])

    def forward() -> None:
        with torch.inference_mode():
            loaded.model(input_ids=ids, use_cache=False, logits_to_keep=1)

    threads = torch.get_num_threads()
    for label, count in ((f"{threads} threads", threads), ("1 thread", 1)):
        torch.set_num_threads(count)
        times = {"decompose": [], "forward": []}
        for _ in range(repeats):  # interleaved: a shared machine's noise hits both alike
            times["decompose"].append(median_s(decomposition, 1))
            times["forward"].append(median_s(forward, 1))
        d, f = (statistics.median(times[k]) for k in ("decompose", "forward"))
        print(
            f"SmolLM2 {n} tokens, L23H1 → position {position}, {label}: decomposition "
            f"{d * 1000:.0f} ms (target ≤ 500), forward pass {f * 1000:.0f} ms, ratio {d / f:.2f}"
        )
    torch.set_num_threads(threads)
    end_to_end = median_s(lambda: towers(loaded, prompt, head="L23H1"), repeats)
    print(f"towers() end to end (capture + decomposition + summary): {end_to_end * 1000:.0f} ms")
    return loaded


def poll_head(client: TestClient, job: str, head: str) -> None:
    """Ask for `head`'s decomposition as the panel does (a POST where the server takes one,
    else the GET of before), then poll the JSON twin until the head is there."""
    url = f"/api/analyses/{job}/heads/{head}?towers=true"
    response = client.post(url)
    if response.status_code == 405:  # GETs computed then
        response = client.get(url)
    while response.status_code == 202:
        time.sleep(0.02)  # the page polls every 250 ms: this times the server, not the page
        response = client.get(f"{url}&job={response.json()['job']}")
    assert response.status_code == 200, response.text
    assert response.json()["detail"]["towers"], "no decomposition"


def decompose_in_the_panel(loaded: LoadedModel, repeats: int) -> None:
    from model_worker.analysis.kernels import recheck_now
    from model_worker.common.settings import Settings
    from model_worker.service.recent import RECENT
    from tests.app_clients import embedded_client

    prompt = prompt_of(loaded, 62)
    os.environ.setdefault("ICL_ALLOWED_HOSTS", '["testserver"]')  # TestClient's Host
    store = tempfile.mkdtemp(prefix="bench-towers-")  # a fresh store: nothing served from disk
    settings = Settings(model=loaded.name, warm_up=False, data_dir=store)
    with embedded_client(settings, loader=lambda: loaded) as client:
        while not all(m["ready"] for m in client.get("/api/models").json()):
            time.sleep(0.05)
        job = client.post("/api/analyses", json={"prompt": prompt}).json()["id"]
        while (state := client.get(f"/api/analyses/{job}").json())["status"] != "done":
            assert state["status"] != "failed", state
            time.sleep(0.05)
        top = state["result"]["top_heads"]
        # the kernels' rechecks due (what a served worker's warm-up and idle work do between
        # jobs; this server starts without its warm-up): not inside the timed decompositions
        recheck_now()
        n_tokens = len(state["result"]["tokens"])
        # the top heads (detailed: a panel's head is, before its Decompose), each decomposed once
        heads = iter(top)
        times: dict[str, list[float]] = {"after": [], "before": [], "forward": []}
        kept = dict(RECENT._kept)
        ids = encode_prompt(loaded, prompt).ids[None]

        def forward() -> None:
            with torch.inference_mode():
                loaded.model(input_ids=ids, use_cache=False, logits_to_keep=1)

        for _ in range(repeats):
            for label in ("after", "before"):
                head = next(heads)
                if label == "before":
                    RECENT.clear()
                start = time.perf_counter()
                poll_head(client, job, head)
                times[label].append(time.perf_counter() - start)
                print(f"  {label} {head}: {times[label][-1] * 1000:.0f} ms")
                RECENT._kept.update(kept)
                times["forward"].append(median_s(forward, 1))  # the load's yardstick
    after, before, one = (statistics.median(times[k]) for k in ("after", "before", "forward"))
    print(
        f"Decompose in the head panel, embedded server, SmolLM2 {n_tokens} tokens: "
        f"{after * 1000:.0f} ms (target ≤ 1000) from the worker's recent analysis, "
        f"{before * 1000:.0f} ms as a whole analysis (before); before/after {before / after:.1f}×; "
        f"after = {after / one:.1f} forward passes of the prompt ({one * 1000:.0f} ms, "
        "interleaved)"
    )


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field):
                return int(line.split()[1])
    raise KeyError(field)


def one_billion_shaped(tokenizer: PreTrainedTokenizerBase) -> None:
    """(The tokenizer is any: the decomposition reads token ids only.)"""
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=32000,
        hidden_size=2048,
        intermediate_size=2048,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=64,
        max_position_embeddings=1024,
        attn_implementation="eager",
        tie_word_embeddings=True,
    )
    loaded = wrap_model(LlamaForCausalLM(config).eval(), tokenizer, name="1b-shaped")
    ids = torch.randint(0, config.vocab_size, (1, 512))
    cache = capture(loaded, ids)
    held = sum(
        t.numel() * t.element_size()
        for t in (cache.resid_pre, cache.normalized, cache.attn_out, cache.mlp_out, cache.z)
        + (cache.v, cache.pattern, cache.attn_scale)
    )
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")  # reset VmHWM (peak RSS) to the current RSS
    before = _status_kb("VmRSS")
    start = time.perf_counter()
    (found,) = decompose(loaded, cache, 15, 0, 511, [300])
    seconds = time.perf_counter() - start
    peak = _status_kb("VmHWM")
    print(
        f"1B-shaped (16 × 32 heads of 64, d 2048), 512 tokens, L15H0 → 300: decomposition "
        f"{seconds:.2f} s, {len(found.names)} components per side, adds "
        f"{(peak - before) / 1024:.0f} MiB peak RSS over the capture's "
        f"{held / 2**20:.0f} MiB of tensors"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--sections", default="123", help="which sections to run, e.g. 2")
    args = parser.parse_args()
    print(f"CPU: {cpu_model()}; {os.cpu_count()} cores; load average {os.getloadavg()[0]:.1f}")
    loaded = smollm2(args.repeats) if "1" in args.sections else load_model(None, device="cpu")
    if "2" in args.sections:
        decompose_in_the_panel(loaded, args.repeats)
        print(f"(load average {os.getloadavg()[0]:.1f})")
    if "3" in args.sections:
        one_billion_shaped(loaded.tokenizer)


if __name__ == "__main__":
    main()
