"""Multi-turn chat against engines with a limited prefix cache: cache-aware placement compared.

``python -m benches.harness.prefix_bench [--out-md FILE] [--out-json FILE]``

The workload (seeded; the same requests in the same order for every system):

* 4 shared system prompts of ~1,240 tokens each (simulator tokenizer), chosen by
  conversations with popularity 40/30/20/10 % (system 0 is the hot prefix);
* 96 conversations of 4-8 turns; each turn appends a user message of 40-80 tokens to the
  conversation so far (the earlier turns and a fixed ~30-token assistant reply each), so a
  turn's prompt is 1,300-2,100 tokens of which all but the new turn was seen before;
* 64 one-off prompts of ~600 unique tokens;
* 32 closed-loop users; each takes the next job (a whole conversation, turn after turn, or
  one one-off prompt) from one shuffled list, 640 requests in all, streaming, 24 tokens out.

Engines: 4 simulators with a 12,288-token prefix cache each (``--kv-cache-tokens``, LRU,
16-token blocks), 20,000 prompt tokens/s (uncached 1,500 tokens: 75 ms) plus 3 ms, 4 ms per
output token (+0.05 ms per other request decoding). Fresh engines for every system (empty
caches). Narwhal: one worker, defaults (``lowest_ttft`` or ``least_loaded``), open admission,
``engines[].kv_cache_tokens`` 12288, an ``X-Session-Id`` header per conversation.
vllm-router 0.1.17: ``--policy round_robin`` or ``cache_aware`` (its default thresholds),
from the anchors venv.

Reported: TTFT p50/p99 (client side, to the first content token), output tokens/s, the
prefix-cache hit rate from the engines' ``vllm:prefix_cache_hits_total`` /
``vllm:prefix_cache_queries_total`` (during the workload), and the per-engine load spread:
the most requests any engine served ÷ the mean.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .loadgen import percentile
from .report import splice_named
from .systems import MODEL, Proc, System, free_port, start_narwhal, url_in

ENGINES = 4
KV_TOKENS = 12288
USERS = 32
OUTPUT = 24
CONVERSATIONS = 96
ONE_OFFS = 64
POPULARITY = (0.4, 0.3, 0.2, 0.1)
SYSTEM_TEXT = ("You are the support assistant of a router for language models; be brief, kind "
               "and exact, and never invent facts about the fleet. ")
WORDS = ["the", "router", "engine", "token", "stream", "batch", "prefill", "decode", "model",
         "request", "reply", "time", "water", "light", "paper", "story", "answer", "school",
         "world", "house", "night"]
REPLY = "Here is a short answer about the fleet and its engines, as you asked. " * 2
SIM_FLAGS = ("--kv-cache-tokens", str(KV_TOKENS), "--enable-prompt-tokens-details",
             "--prefill-tokens-per-s", "20000", "--prefill-overhead-ms", "3",
             "--tpot-ms", "4", "--tpot-growth-ms", "0.05", "--output-len", str(OUTPUT))
ANCHORS_VENV = Path("/tmp/narwhal-anchors")


# -- the workload --------------------------------------------------------------------------
Job = list[list[dict[str, str]]]  # the message lists of one job's requests, in order


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def workload(seed: int = 7) -> list[Job]:
    rng = random.Random(seed)
    systems = [f"[system {k}] " + SYSTEM_TEXT * 40 for k in range(len(POPULARITY))]
    jobs: list[Job] = []
    for c in range(CONVERSATIONS):
        k = rng.choices(range(len(systems)), POPULARITY)[0]
        messages = [{"role": "system", "content": systems[k]}]
        turns: Job = []
        for t in range(rng.randint(4, 8)):
            messages.append({"role": "user", "content": f"conversation {c} turn {t}: "
                             + _words(rng, rng.randint(40, 80))})
            turns.append(list(messages))
            messages.append({"role": "assistant", "content": REPLY})
        jobs.append(turns)
    for i in range(ONE_OFFS):
        jobs.append([[{"role": "user", "content": f"one-off {i}: " + _words(rng, 600)}]])
    rng.shuffle(jobs)
    return jobs


# -- the client ----------------------------------------------------------------------------
@dataclass
class Result:
    ttfts: list[float] = field(default_factory=list)
    tokens: int = 0
    errors: list[str] = field(default_factory=list)


async def _one(host: str, port: int, messages: list[dict[str, str]], result: Result,
               session: str | None) -> None:
    body = json.dumps({"model": MODEL, "messages": messages, "max_tokens": OUTPUT,
                       "stream": True}).encode()
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nhost: {host}\r\nconnection: close\r\n"
            f"content-type: application/json\r\ncontent-length: {len(body)}\r\n")
    if session is not None:
        head += f"x-session-id: {session}\r\n"
    start = time.monotonic()
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(head.encode() + b"\r\n" + body)
        status = await reader.readline()
        if b" 200 " not in status:
            result.errors.append(status.decode(errors="replace").strip())
            return
        chunked = False
        while True:
            line = await reader.readline()
            if line in (b"\r\n", b""):
                break
            if line.lower().startswith(b"transfer-encoding:") and b"chunked" in line.lower():
                chunked = True
        buffer = b""
        first: float | None = None
        tokens = 0
        while True:
            if chunked:
                size = int((await reader.readline()).strip() or b"0", 16)
                if size == 0:
                    break
                data = await reader.readexactly(size + 2)
                buffer += data[:-2]
            else:
                data = await reader.read(65536)
                if not data:
                    break
                buffer += data
            *events, buffer = buffer.replace(b"\r\n", b"\n").split(b"\n\n")
            for event in events:
                if not event.startswith(b"data: {"):
                    continue
                choices = json.loads(event[6:]).get("choices") or []
                if choices and (choices[0].get("delta") or {}).get("content"):
                    tokens += 1
                    if first is None:
                        first = time.monotonic() - start
        if first is None:
            result.errors.append("no token")
            return
        result.ttfts.append(first)
        result.tokens += tokens
    finally:
        writer.close()


async def drive(url: str, jobs: list[Job], sessions: bool) -> tuple[Result, float]:
    host, port = url[len("http://"):].rsplit(":", 1)
    queue = list(enumerate(jobs))
    result = Result()

    async def user() -> None:
        while queue:
            index, job = queue.pop(0)
            session = f"job-{index}" if sessions and len(job) > 1 else None
            for messages in job:
                try:
                    await _one(host, int(port), messages, result, session)
                except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
                    result.errors.append(repr(exc))

    start = time.monotonic()
    await asyncio.gather(*(user() for _ in range(USERS)))
    return result, time.monotonic() - start


# -- processes -----------------------------------------------------------------------------
def start_sims(logdir: Path) -> list[Proc]:
    procs = []
    for i in range(ENGINES):
        p = Proc(f"engine{i}", [sys.executable, "-m", "narwhal.sim", "--host", "127.0.0.1",
                                "--port", "0", "--model", MODEL, "--seed", str(i), *SIM_FLAGS],
                 logdir / f"prefix-engine{i}.log")
        procs.append(p)
    for p in procs:
        p.url = url_in(p.wait_line("listening on", 30))
    return procs


def engine_counters(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("vllm:"):
            name = line.split("{", 1)[0]
            out[name] = float(line.rsplit(" ", 1)[1])
    with urllib.request.urlopen(url + "/sim/stats", timeout=5) as resp:
        out["received"] = float(json.loads(resp.read())["received"])
    return out


def start_vllm_router(policy: str, engines: Sequence[str], logdir: Path) -> System:
    port = free_port()
    proc = Proc(f"vllm-router-{policy}",
                [str(ANCHORS_VENV / "bin" / "vllm-router"), "--host", "127.0.0.1", "--port",
                 str(port), "--worker-urls", *engines, "--policy", policy,
                 "--prometheus-port", str(free_port())], logdir / f"vllm-router-{policy}.log")
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as resp:
                if resp.status == 200:
                    break
        except OSError:
            time.sleep(0.3)
    else:
        proc.stop()
        raise RuntimeError(f"vllm-router {policy} did not start:\n{proc.output()[-2000:]}")
    from .loadgen import Target
    return System(f"vllm-router {policy}", [Target(url)], [proc], version="vllm-router 0.1.17")


SYSTEMS = ("narwhal lowest_ttft", "narwhal least_loaded", "vllm-router round_robin",
           "vllm-router cache_aware")


def measure(name: str, jobs: list[Job], logdir: Path) -> dict[str, Any]:
    sims = start_sims(logdir)
    urls = [s.url for s in sims]
    system: System | None = None
    try:
        if name.startswith("narwhal"):
            policy = name.split()[1]
            system = start_narwhal(f"prefix-{policy}", urls, 1, logdir, overrides=[
                f"scheduling.policy={policy}", "admission.mode=open",
                f"engines.kv_cache_tokens={KV_TOKENS}"])
        else:
            system = start_vllm_router(name.split()[1], urls, logdir)
        url = system.targets[0].url
        # Warm-up: one tiny request (and, for Narwhal, the engines' first profiles).
        warm = Result()
        deadline = time.monotonic() + 60
        while not warm.ttfts and time.monotonic() < deadline:
            warm = asyncio.run(drive(url, [[[{"role": "user", "content": "warm up"}]]],
                                     False))[0]
            if not warm.ttfts:
                time.sleep(0.5)
        time.sleep(1.0)
        before = [engine_counters(u) for u in urls]
        result, elapsed = asyncio.run(drive(url, jobs, sessions=name.startswith("narwhal")))
        after = [engine_counters(u) for u in urls]
        index = None
        if name.startswith("narwhal"):
            with urllib.request.urlopen(url + "/engines", timeout=5) as resp:
                index = [{**(e.get("prefix_index") or {}),
                          "tpot_growth_s": (e.get("learned") or {}).get("tpot_growth_s"),
                          "tpot_s": (e.get("learned") or {}).get("tpot_s"),
                          "profile": (e.get("learned") or {}).get("profile")}
                         for e in json.loads(resp.read())["engines"]]
    finally:
        if system is not None:
            system.stop()
        for s in sims:
            s.stop()
    served = [a["received"] - b["received"] for a, b in zip(after, before, strict=True)]
    hits = sum(a["vllm:prefix_cache_hits_total"] - b["vllm:prefix_cache_hits_total"]
               for a, b in zip(after, before, strict=True))
    queries = sum(a["vllm:prefix_cache_queries_total"] - b["vllm:prefix_cache_queries_total"]
                  for a, b in zip(after, before, strict=True))
    mean = sum(served) / len(served)
    return {
        "system": name, "version": system.version if system else "",
        "requests": len(result.ttfts), "errors": len(result.errors),
        "first_errors": result.errors[:3],
        "ttft_p50_ms": round(percentile(result.ttfts, 50) * 1000, 1),
        "ttft_p99_ms": round(percentile(result.ttfts, 99) * 1000, 1),
        "tokens_per_s": round(result.tokens / elapsed, 1),
        "hit_rate": round(hits / queries, 4) if queries else 0.0,
        "served_per_engine": served,
        "max_over_mean": round(max(served) / mean, 3) if mean else 0.0,
        "elapsed_s": round(elapsed, 2),
        "prefix_index": index,
    }


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| system | TTFT p50 (ms) | TTFT p99 (ms) | tokens/s | prefix-cache hit rate | "
             "requests per engine | max ÷ mean | errors |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['system']} | {r['ttft_p50_ms']} | {r['ttft_p99_ms']} | "
                     f"{r['tokens_per_s']} | {r['hit_rate']:.1%} | "
                     f"{', '.join(str(int(s)) for s in r['served_per_engine'])} | "
                     f"{r['max_over_mean']} | {r['errors']} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    global USERS, KV_TOKENS, SIM_FLAGS
    p = argparse.ArgumentParser(prog="python -m benches.harness.prefix_bench",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--systems", default=",".join(SYSTEMS),
                   help="comma-separated, of: " + ", ".join(SYSTEMS))
    p.add_argument("--users", type=int, default=USERS, help="closed-loop users")
    p.add_argument("--kv-cache-tokens", type=int, default=KV_TOKENS,
                   help="each engine's prefix cache, tokens")
    p.add_argument("--logdir", type=Path, default=Path("/tmp/narwhal-prefix-bench"))
    p.add_argument("--out-md", type=Path)
    p.add_argument("--into", type=Path, help="a document to write the table into, between "
                   "its <!-- prefix_bench:begin/end --> markers (docs/performance.md)")
    p.add_argument("--out-json", type=Path)
    args = p.parse_args(argv)
    USERS, KV_TOKENS = args.users, args.kv_cache_tokens
    SIM_FLAGS = ("--kv-cache-tokens", str(KV_TOKENS), *SIM_FLAGS[2:])
    args.logdir.mkdir(parents=True, exist_ok=True)
    jobs = workload()
    requests = sum(len(j) for j in jobs)
    print(f"workload: {len(jobs)} jobs, {requests} requests, {USERS} users", flush=True)
    rows = []
    for name in args.systems.split(","):
        row = measure(name.strip(), jobs, args.logdir)
        print(json.dumps(row), flush=True)
        rows.append(row)
    table = markdown(rows)
    print(table)
    if args.out_md:
        args.out_md.write_text(table + "\n")
    if args.into:
        splice_named(args.into, "prefix_bench",
                     f"python -m benches.harness.prefix_bench --into {args.into}", table)
    if args.out_json:
        args.out_json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
