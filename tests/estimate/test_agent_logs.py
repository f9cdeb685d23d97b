"""Chat transcripts with tool calls: the category table, both line layouts, malformed input.

Every expected category, decision count and error line below was counted by hand from the
transcripts written in this file.
"""

import json

import numpy as np
import pytest

from harnax.estimate import agent_logs
from harnax.estimate import proxy

TABLE = {
    "edit_file": "edit",
    "write_todos": "plan",
    "bash": {"arg": "command", "prefix": {"pytest": "test", "python -m pytest": "test",
                                          "git": "vcs"}, "default": "run_command"},
    "task": "subagent",
    "*": "other",
}


def _call(cid, name, **args):
  return {"id": cid, "type": "function",
          "function": {"name": name, "arguments": json.dumps(args)}}


def _assistant(*calls, content=None, proxy_samples=None, policy_samples=None):
  msg = {"role": "assistant", "content": content, "tool_calls": list(calls)}
  if proxy_samples is not None:
    msg["proxy_samples"] = proxy_samples
  if policy_samples is not None:
    msg["policy_samples"] = policy_samples
  return msg


def _sample(name, content=None, **args):
  if name is None:
    return {"role": "assistant", "content": content}
  return {"role": "assistant", "content": content, "tool_calls": [_call("s", name, **args)]}


# Five decisions (assistant messages 2, 4, 6, 8, 9); the policy's category and the
# proxy's samples at each, by hand:
#   write_todos -> plan          proxy: bash "pytest -q" -> test, text "I will ..." -> plan
#   edit_file -> edit            proxy: edit_file -> edit
#   bash "git diff" -> vcs       proxy: "python -m pytest -x" -> test, "python x.py" -> run_command
#   task -> subagent             proxy: an unnamed tool -> other ("*")
#   text "Done." -> other        proxy: text "Plan: ..." -> plan
MESSAGES = [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "user", "content": [{"type": "text", "text": "Fix the failing test."}]},
    _assistant(_call("c1", "write_todos", todos=["read", "fix"]),
               proxy_samples=[_sample("bash", command="pytest -q"),
                              _sample(None, "I will read the test first")]),
    {"role": "tool", "tool_call_id": "c1", "content": "ok"},
    _assistant(_call("c2", "edit_file", path="a.py", old="x", new="y"),
               proxy_samples=[_sample("edit_file", path="a.py")]),
    {"role": "tool", "tool_call_id": "c2", "content": "edited"},
    _assistant(_call("c3", "bash", command="git diff"),
               proxy_samples=[_sample("bash", command="python -m pytest -x"),
                              _sample("bash", command="python x.py")]),
    {"role": "tool", "tool_call_id": "c3", "content": "diff ..."},
    _assistant(_call("c4", "task", description="review the patch"),
               proxy_samples=[_sample("mystery_tool", x=1)]),
    _assistant(content="Done.", proxy_samples=[_sample(None, "Plan: run the tests again")]),
]
POLICY = [("plan",), ("edit",), ("vcs",), ("subagent",), ("other",)]
PROXY = [("test", "plan"), ("edit",), ("test", "run_command"), ("other",), ("plan",)]


def test_category_table_on_a_hand_made_transcript():
  line = json.dumps({"episode_id": "a", "harness": "deep", "outcome": 1.0,
                     "messages": MESSAGES})
  parsed = agent_logs.read_transcripts([line], TABLE)
  assert parsed.errors == []
  (ep,) = parsed.episodes
  assert (ep.episode_id, ep.harness, ep.actor, ep.outcome, ep.line) == ("a", "deep", "policy",
                                                                        1.0, 1)
  assert [s.policy_samples for s in ep.steps] == POLICY
  assert [s.proxy_samples for s in ep.steps] == PROXY
  assert [s.state for s in ep.steps] == [(1, 2), (1, 4), (1, 6), (1, 8), (1, 9)]
  table = agent_logs.category_table(TABLE)
  assert table.categories == tuple(sorted({"edit", "plan", "test", "vcs", "run_command",
                                           "subagent", "other", "inspect_file"}))


def test_message_per_line_layout_reads_the_same_episode_and_estimates_by_hand():
  lines = [json.dumps({"episode_id": "a", "harness": "deep", "outcome": 1.0})]
  lines += [json.dumps({"episode_id": "a", **m}) for m in MESSAGES]
  # A second, interleaved episode of another harness: one decision, the proxy agrees.
  lines.insert(3, json.dumps({"episode_id": "b", "role": "assistant", "content": None,
                              "tool_calls": [_call("k", "edit_file", path="b.py")],
                              "proxy_samples": [_sample("edit_file")] * 3}))
  lines.append(json.dumps({"episode_id": "b", "harness": "mini", "outcome": 0.0}))
  lines.append(json.dumps({"episode_id": "p", "harness": "deep", "actor": "proxy",
                           "outcome": 1.0}))
  parsed = agent_logs.read_transcripts("\n".join(lines), TABLE)
  assert parsed.errors == []
  a, b, p = parsed.episodes
  assert [s.policy_samples for s in a.steps] == POLICY
  assert [s.proxy_samples for s in a.steps] == PROXY
  # Lines: 1 header, 2-3 context, 4 episode b, then the messages of a from line 5.
  assert a.line == 1 and [s.state[0] for s in a.steps] == [5, 7, 9, 11, 12]
  assert len(b.steps) == 1 and p.actor == "proxy" and p.steps == ()

  est = agent_logs.estimate_transcripts(parsed.episodes, TABLE, smoothing=0.5)
  k = 8                                        # categories of the table, counted above
  # One policy sample per decision: KL(one-hot c || q~) = -log q~(c); Miller–Madow adds 0.
  q = lambda n_c, n: (n_c + 0.5) / (n + 0.5 * k)  # noqa: E731
  want = -sum(np.log([q(1, 2), q(1, 1), q(0, 2), q(0, 1), q(0, 1)]))
  assert est["deep"].mismatch == pytest.approx(want, rel=1e-12)
  assert est["deep"].decisions_per_episode == 5 and est["deep"].ceiling == 1.0
  assert est["mini"].mismatch == pytest.approx(-np.log(q(3, 3)), rel=1e-12)
  assert np.isnan(est["mini"].ceiling)


def test_extra_policy_samples_join_the_executed_decision():
  msg = _assistant(_call("c", "bash", command="pytest"),
                   policy_samples=[_sample("bash", command="ls"), _sample("edit_file")],
                   proxy_samples=[_sample("bash", command="pytest tests/")])
  (ep,) = agent_logs.read_transcripts(
      [json.dumps({"episode_id": 1, "harness": "h", "outcome": True, "messages": [msg]})],
      TABLE).episodes
  assert ep.episode_id == "1" and ep.outcome == 1.0
  assert ep.steps[0].policy_samples == ("test", "run_command", "edit")
  assert ep.steps[0].proxy_samples == ("test",)


@pytest.mark.parametrize("command,category", [
    ("pytest -q", "test"), ("  pytest", "test"), ("pytest-cov run", "run_command"),
    ("python -m pytest tests", "test"), ("python -m pip install x", "run_command"),
    ("git status", "vcs"), ("gitk", "run_command"), ("", "run_command"),
])
def test_prefixes_match_whole_leading_words_longest_first(command, category):
  table = agent_logs.category_table(TABLE)
  assert table.call_category("bash", {"command": command}) == category
  assert table.call_category("bash", {"command": 3}) == "run_command"   # not a string
  assert table.call_category("bash", {}) == "run_command"
  assert table.call_category("unknown", {}) == "other"


def test_a_rule_without_default_falls_back_to_the_star_category():
  table = agent_logs.category_table({"bash": {"arg": "command", "prefix": {"ls": "inspect"}},
                                     "*": "misc"})
  assert table.call_category("bash", {"command": "make"}) == "misc"
  assert table.call_category("bash", {"command": "ls -la"}) == "inspect"
  assert agent_logs.category_table({}).call_category("x", {}) == "other"


def _ep(eid, messages, **extra):
  return json.dumps({"episode_id": eid, "harness": "h", "outcome": 1.0, "messages": messages,
                     **extra})


def test_malformed_lines_are_reported_with_line_numbers_and_the_rest_is_read(tmp_path):
  ok = _assistant(_call("c1", "edit_file", path="a"), proxy_samples=[_sample("edit_file")])
  bad_args = {"role": "assistant", "content": None, "tool_calls": [
      {"id": "c9", "type": "function", "function": {"name": "bash", "arguments": "{bad"}}]}
  lines = [
      _ep("e1", [ok]),                                                       # 1 good
      "{not json",                                                           # 2
      _ep("e2", [ok, bad_args]),                                             # 3
      json.dumps({"episode_id": "m1", "harness": "h", "outcome": 0.5}),      # 4 header
      json.dumps({"episode_id": "m1", **ok}),                                # 5
      json.dumps({"episode_id": "m1", "role": "tool", "tool_call_id": "zz"}),  # 6 no such call
      json.dumps({"episode_id": "m1", **ok}),                                # 7 (m1 unusable)
      json.dumps({"episode_id": "e3", "harness": "h", "messages": [ok]}),    # 8 no outcome
      json.dumps({"episode_id": "m2", **ok}),                                # 9 no header ever
      _ep("e4", [{"content": "hi"}]),                                        # 10 no role
      _ep("e5", [{"role": "assistant"}]),                                    # 11 nothing said
      "",                                                                    # blank: skipped
      json.dumps({"episode_id": "m3", "harness": "h", "outcome": 0.0}),      # 13 header
      json.dumps({"episode_id": "m3", **ok}),                                # 14 good
      _ep("e6", [{"role": "assistant", "tool_calls": [
          {"function": {"name": "bash", "arguments": "[1, 2]"}}]}]),        # 15 args not object
      json.dumps(["a list"]),                                                # 16
      _ep("e7", [ok], actor="teacher"),                                      # 17
  ]
  path = tmp_path / "chat.jsonl"
  path.write_text("\n".join(lines) + "\n")
  parsed = agent_logs.read_transcripts(path, TABLE)
  assert [e.episode_id for e in parsed.episodes] == ["e1", "m3"]
  assert [len(e.steps) for e in parsed.episodes] == [1, 1]
  assert [e.line for e in parsed.errors] == [2, 3, 6, 8, 9, 10, 11, 15, 16, 17]
  msgs = dict(parsed.errors)
  assert "invalid JSON" in msgs[2]
  assert "messages[1].tool_calls[0].function.arguments: invalid JSON" in msgs[3]
  assert "'e2' is not used" in msgs[3]
  assert "tool_call_id" in msgs[6] and "'m1' is not used" in msgs[6]
  assert "outcome" in msgs[8] and "no header" in msgs[9]
  assert "messages[0].role" in msgs[10]
  assert "messages[0]: missing field 'content' or 'tool_calls'" in msgs[11]
  assert "expected a JSON object" in msgs[15] and "JSON object" in msgs[16]
  assert "actor" in msgs[17]
  with pytest.raises(ValueError, match=r"10 malformed line\(s\): line 2: .*line 17: actor"):
    agent_logs.read_transcripts(str(path), TABLE, strict=True)


def test_estimates_name_a_policy_decision_without_proxy_samples():
  eps = agent_logs.read_transcripts([_ep("e", [_assistant(content="ls")])], TABLE).episodes
  with pytest.raises(ValueError, match=r"episode 'e' \(line 1\), decision 0 has no policy "
                                       r"samples .* or no proxy samples"):
    agent_logs.estimate_transcripts(eps, TABLE)
  with pytest.raises(ValueError, match="categorizer: set by the table"):
    agent_logs.estimate_transcripts(eps, TABLE, categorizer=str)


@pytest.mark.parametrize("spec,match", [
    (["edit_file"], r"table: expected a mapping"),
    ({"edit_file": 3}, r"table\['edit_file'\]: expected a category name or an object"),
    ({"edit_file": ""}, r"table\['edit_file'\]: expected a non-empty category name"),
    ({"bash": {"prefix": {"ls": "inspect"}}}, r"table\['bash'\]\.arg: expected the name"),
    ({"bash": {"arg": "command", "prefixes": {}}}, r"table\['bash'\]: unknown keys \['prefixes'\]"),
    ({"bash": {"arg": "command", "prefix": ["ls"]}},
     r"table\['bash'\]\.prefix: expected an object"),
    ({"bash": {"arg": "command", "prefix": {" ": "x"}}}, r"prefix: expected non-blank"),
    ({"bash": {"arg": "command", "prefix": {"ls": None}}},
     r"table\['bash'\]\.prefix\['ls'\]: expected a non-empty category name"),
    ({"bash": {"arg": "command", "prefix": {"git  log": "a", "git log": "b"}}},
     r"same words"),
    ({"bash": {"arg": "command", "default": 1}}, r"table\['bash'\]\.default"),
    ({"*": ""}, r"table\['\*'\]: expected a non-empty category name"),
])
def test_bad_category_tables_raise_naming_the_entry(spec, match):
  with pytest.raises(ValueError, match=match):
    agent_logs.category_table(spec)
  with pytest.raises(ValueError, match=match):
    agent_logs.read_transcripts([], spec)


def test_a_text_categorizer_outside_its_declared_categories_raises():
  table = agent_logs.category_table({}, text_categorizer=lambda t: "chat",
                                    text_categories=("plan", "other"))
  with pytest.raises(ValueError, match="text_categorizer: returned 'chat'"):
    agent_logs.read_transcripts([_ep("e", [_assistant(content="hi")])], table)
  with pytest.raises(ValueError, match="text_categories"):
    agent_logs.category_table({}, text_categories=())


def test_the_text_categorizer_still_reads_plain_outputs():
  # Decisions without tool calls go through the old rule-based categorizer.
  table = agent_logs.category_table(TABLE)
  msgs = [_assistant(content=t) for t in ("cat src/a.py", "sed -i s/a/b/ x.py", "pytest -q",
                                          "Plan: read first", "sure")]
  (ep,) = agent_logs.read_transcripts([_ep("e", msgs)], table).episodes
  assert [s.policy_samples[0] for s in ep.steps] == [proxy.coding_agent_category(m["content"])
                                                     for m in msgs]
  assert [s.policy_samples[0] for s in ep.steps] == ["inspect_file", "edit", "run_command",
                                                     "plan", "other"]
