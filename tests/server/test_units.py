"""Pure pieces of the server: stop strings across chunks, streamed deltas, which requests are merged into
one group, and the /metrics exposition."""

from __future__ import annotations

from types import SimpleNamespace

from prometheus_client.parser import text_string_to_metric_families

from seer.models.tokenizer import Tokenizer
from seer.sampling_params import SamplingParams
from seer.server.convert import GroupSpec, OutputOptions
from seer.server.grouping import plan_groups
from seer.server.metrics import ServerMetrics
from seer.server.sequences import SampleText


def test_stop_string_spanning_chunks(tiny_model):
    tok = Tokenizer.from_dir(tiny_model)
    ids = tok.encode("hello world, bye")
    s = SampleText(tok, OutputOptions(stop=("o w",)))
    assert not s.add(ids[:4], [0.0] * 4, False, None)          # "hell"
    assert s.delta()[0] == "he"                                # "ll" held back: could start the stop string
    assert s.add(ids[4:10], [0.0] * 6, False, None)            # "o worl": the stop string completes here
    assert s.done and s.finish_reason == "stop" and s.matched_stop == "o w"
    assert s.text == "hell" and s.token_ids == ids[:7]         # cut after the token that completed it
    assert s.delta()[0] == "ll"
    assert not s.add(ids[10:], [0.0] * 6, True, "length")      # later chunks are ignored
    assert s.text == "hell"


def test_include_stop_and_plain_finish(tiny_model):
    tok = Tokenizer.from_dir(tiny_model)
    ids = tok.encode("abcdef")
    s = SampleText(tok, OutputOptions(stop=("cd",), include_stop=True))
    s.add(ids, [0.0] * 6, False, None)
    assert s.text == "abcd"
    lazy = SampleText(tok, OutputOptions(), stream=False)
    lazy.add(ids[:3], [0.0] * 3, False, None)
    assert lazy.text == ""                                      # not decoded before the end
    lazy.add(ids[3:], [0.0] * 3, True, "length")
    assert lazy.text == "abcdef" and lazy.finish_reason == "length"


def spec(prompt, n=1, seed=None, group_id=None, mergeable=True, temperature=1.0):
    return GroupSpec(tuple(prompt), SamplingParams(n=n, seed=seed, temperature=temperature), group_id, mergeable)


def test_grouping_rules():
    subs = [[spec([1, 2])], [spec([1, 2], n=3)], [spec([1, 2], seed=5)], [spec([1, 2], seed=5)],
            [spec([3], group_id="g")], [spec([3], group_id="g", seed=1)], [spec([3], group_id="h")],
            [spec([1, 2], mergeable=False)], [spec([1, 2], temperature=0.5)]]
    plan = plan_groups(subs)
    sizes = [(g.prompt_token_ids, g.size) for g in plan.groups]
    # unseeded same prompt+settings merge; seeded stay alone; explicit group ids merge only with the same id
    # and settings; /v1/rollout groups never merge; other settings make another group
    assert sizes == [((1, 2), 4), ((1, 2), 1), ((1, 2), 1), ((3,), 1), ((3,), 1), ((3,), 1), ((1, 2), 1),
                     ((1, 2), 1)]
    assert plan.locate(1, 0, 2) == (0, 3) and plan.routes[(0, 3)] == (1, 0, 2)
    assert plan.groups[0].params.n == 4


def _samples(metrics: ServerMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(metrics.render().decode()) for s in f.samples}


def test_metrics_exposition_per_server():
    """Counters keep their ``_total`` names; two servers in one process count apart (a registry each)."""
    a, b = ServerMetrics(), ServerMetrics()
    a.on_tokens(5)
    a.on_request("/v1/completions", 200)
    a.on_request("/v1/completions", 200)
    a.weight_version = 3
    got = _samples(a)
    assert got[("seer_generation_tokens_total", ())] == 5
    assert got[("seer_http_requests_total", (("code", "200"), ("path", "/v1/completions")))] == 2
    assert got[("seer_rollouts_total", ())] == 0
    assert got[("seer_weight_version", ())] == 3
    assert got[("seer_rollout_running", ())] == 0
    assert got[("seer_last_rollout_tau", ())] == 0
    assert not any(name.endswith("_created") for name, _ in got)
    assert _samples(b)[("seer_generation_tokens_total", ())] == 0


def test_metrics_of_a_running_rollout():
    class Buffer:
        num_buffered, num_finished, num_requests = 3, 1, 4

        def running_on(self, iid: int) -> list[int]:
            return [0] * (iid + 1)

    class Instance:
        def resident(self) -> list[int]:
            return [7]

    driver = SimpleNamespace(instances={0: Instance(), 1: Instance()}, buffer=Buffer(), alive={0})
    m = ServerMetrics()
    m.attach(driver)
    got = _samples(m)
    assert got[("seer_rollout_running", ())] == 1
    assert got[("seer_instance_running", (("instance", "1"),))] == 2
    assert got[("seer_instance_resident", (("instance", "0"),))] == 1
    assert got[("seer_instance_alive", (("instance", "1"),))] == 0
    assert got[("seer_queued_requests", ())] == 3 and got[("seer_batch_finished_fraction", ())] == 0.25
