"""The prefix cache through the server (docs/DESIGN.md §4.8), against a real model only (the fake engine has none).

bench/agent_replay.py's agent transcript with fewer turns and shorter tool results than its bench record: every
turn after the first prefills only its new tokens (usage.prompt_tokens_details.cached_tokens), and the outputs,
greedy and seeded, equal those of a server with --prefix-cache off. The Anthropic API reports the same hit as
usage.cache_read_input_tokens; /metrics counts hits, misses and bytes within the budget.
"""

import subprocess
import sys
from pathlib import Path

import pytest

from conftest import FAKE, Server

ROOT = Path(__file__).resolve().parents[2]
real_only = pytest.mark.skipif(FAKE, reason="the fake engine has no prefix cache")


@pytest.fixture(scope="module")
def server_off():
    s = Server("--prefix-cache", "off")
    yield s
    assert s.stop() == 0, s.log_text()[-4000:]


def replay(server, server_off, model, *extra):
    cmd = [sys.executable, str(ROOT / "bench" / "agent_replay.py"), "--url", server.url, "--url-off", server_off.url,
           "--model-name", model, "--scale", "0.05", "--max-tokens", "8", "--check", *extra]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"{' '.join(cmd)}\n{r.stdout}\n{r.stderr}"
    return r.stdout


@real_only
def test_agent_replay_prefills_only_new_tokens_and_matches_cache_off(server, server_off, model):
    before = server.metrics()
    out = replay(server, server_off, model, "--turns", "4")
    assert "turn 4:" in out
    m = server.metrics()
    assert m["puredrive_prefix_cache_hits_total"] - before["puredrive_prefix_cache_hits_total"] >= 3
    assert m["puredrive_prefix_cache_lookups_total"] > m["puredrive_prefix_cache_hits_total"]
    assert m["puredrive_prefix_cache_misses_total"] >= 1
    assert 0 < m['puredrive_prefix_cache_bytes{tier="device"}'] <= m['puredrive_prefix_cache_budget_bytes{tier="device"}']
    assert server_off.metrics()["puredrive_prefix_cache_lookups_total"] == 0


@real_only
def test_seeded_sampling_matches_cache_off(server, server_off, model):
    replay(server, server_off, model, "--turns", "3", "--seed", "5", "--temperature", "0.8")


@real_only
def test_anthropic_usage_reports_cache_reads(server, claude, model):
    system = "You review Python code.\n" + "".join(f"def helper_{i}(x):\n    return x + {i}\n" for i in range(60))
    messages = [{"role": "user", "content": "Which helper adds 7?"}]
    first = claude.messages.create(model=model, system=system, messages=messages, max_tokens=4,
                                   extra_body={"temperature": 0})
    second = claude.messages.create(model=model, system=system, messages=messages, max_tokens=4,
                                    extra_body={"temperature": 0})
    assert first.usage.cache_read_input_tokens == 0
    cached = second.usage.cache_read_input_tokens
    assert cached > 0 and cached % 64 == 0
    assert second.usage.input_tokens + cached == first.usage.input_tokens
    assert second.content == first.content
