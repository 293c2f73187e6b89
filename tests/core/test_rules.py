"""doq_lib/rules.py: each domain rule defined once, checked alike by both transports."""
from __future__ import annotations

from typing import Any

import grpc
import pytest

from doq_lib import rules
from doq_lib.http.schema import SCHEMAS
from doq_lib.pb import doq_pb2 as pb
from doq_lib.pb import doq_pb2_grpc as pb_grpc
from doq_lib.rules import NameProblem
from tests.harness import NodeProc


def test_the_rules() -> None:
    assert rules.name_problem("") is NameProblem.EMPTY
    assert rules.name_problem("x" * rules.MAX_NAME) is None
    assert rules.name_problem("x" * (rules.MAX_NAME + 1)) is NameProblem.TOO_LONG
    assert rules.name_problem("a/b") is NameProblem.SLASH
    assert [rules.ack_timeout_allowed(s) for s in (0, 9, 10, 2 ** 32 - 1, 2 ** 32)] == \
        [True, False, True, True, False]
    assert not rules.ack_timeout_allowed(59, rules.HTTP_MIN_ACK_TIMEOUT)


@pytest.mark.parametrize(("text", "problem"), [
    (".", NameProblem.DOTS), ("..", NameProblem.DOTS), ("...", None), (" ", NameProblem.BLANK),
    ("\u3000", NameProblem.BLANK), ("a\x00", NameProblem.CONTROL), ("a\x7f", NameProblem.CONTROL),
    ("a\x9f", NameProblem.CONTROL), ("a\xa0", None), ("a\udc80", NameProblem.NOT_TEXT),
    ("a\ud800b", NameProblem.NOT_TEXT), ("\U0001f600", None), ("é ü", None),
])
def test_the_label_rules_of_new_names_groups_and_keys(text: str,
                                                      problem: NameProblem | None) -> None:
    assert rules.name_problem(text, new=True) is problem
    group = NameProblem.EMPTY_LABEL if text == "..." else problem    # a path of no labels
    assert rules.group_problem(text) is group
    assert rules.group_problem(text, stored=True) is problem
    assert rules.key_problem(text) is problem


def test_a_group_is_a_path_of_at_most_16_labels_and_256_bytes() -> None:
    """1,024-level groups cost a node megabytes each; a group is a dot path of at
    most 16 non-empty labels and 256 bytes of UTF-8 (what a store already holds keeps
    loading, backing up and restoring: the stored rule)."""
    assert rules.group_problem(".".join(["l"] * 16)) is None
    assert rules.group_problem(".".join(["l"] * 17)) is NameProblem.TOO_DEEP
    assert rules.group_problem("g" * 256) is None
    assert rules.group_problem("g" * 257) is NameProblem.TOO_LONG
    assert rules.group_problem("é" * 128) is None                    # 256 bytes
    assert rules.group_problem("é" * 129) is NameProblem.TOO_LONG    # 258 bytes, 129 chars
    for bad in ("a..b", ".a", "a."):
        assert rules.group_problem(bad) in (NameProblem.EMPTY_LABEL, NameProblem.BLANK,
                                            NameProblem.DOTS), bad
    assert rules.group_problem("a..b") is NameProblem.EMPTY_LABEL
    legacy = ".".join(["level"] * 150)
    assert rules.group_problem(legacy) is NameProblem.TOO_LONG
    assert rules.group_problem(legacy, stored=True) is None
    assert rules.group_message("a..b", "http") == \
        "expected a group without empty labels (as in a..b, .a or a.)"
    assert rules.group_message(".".join(["l"] * 17), "grpc") == \
        "group has more than 16 dot-separated labels"


def test_names_of_queues_that_exist_are_held_to_the_old_rules_only() -> None:
    """A queue created before the label rules keeps working under its name."""
    for old in (".", "  ", "a\x00b"):
        assert rules.name_problem(old) is None
    assert rules.name_problem("a\udfff") is NameProblem.NOT_TEXT      # could never be stored


def test_group_and_metadata_limits() -> None:
    assert rules.group_problem("") is None
    assert rules.group_problem("g" * rules.MAX_GROUP) is None
    assert rules.group_problem("g" * (rules.MAX_GROUP + 1)) is NameProblem.TOO_LONG
    full = {f"k{i}": "v" * rules.MAX_METADATA_VALUE for i in range(rules.MAX_METADATA)}
    assert rules.metadata_problems(full) == []
    assert rules.metadata_problems({**full, "one": "more"}) == [(None, "count",
                                                                 rules.MAX_METADATA)]
    assert rules.metadata_problems({"": "v", "k": "v" * (rules.MAX_METADATA_VALUE + 1),
                                    "s": "\udfff", "fine": "\x00 any text"}) == [
        ("", "key", NameProblem.EMPTY), ("k", "value", rules.MAX_METADATA_VALUE),
        ("s", "value", NameProblem.NOT_TEXT)]
    assert rules.lone_surrogate("plain") is None and rules.lone_surrogate("ab\udfff") == 2


def test_a_long_key_is_cut_where_a_message_quotes_it() -> None:
    key = "k" * (rules.MAX_METADATA_KEY + 1)
    text = rules.metadata_message(key, "key", NameProblem.TOO_LONG, "grpc")
    assert text.endswith(f"is longer than {rules.MAX_METADATA_KEY} characters")
    assert len(text) < 120


def test_the_http_schema_takes_its_limits_from_the_rules() -> None:
    create = SCHEMAS["CreateQueueInputBody"]["properties"]
    settings = create["settings"]["properties"]
    assert create["name"]["maxLength"] == rules.MAX_NAME
    assert create["type"]["enum"] == list(rules.QUEUE_TYPES)
    assert settings["ack_timeout"]["minimum"] == rules.HTTP_MIN_ACK_TIMEOUT
    assert settings["ack_timeout"]["maximum"] == rules.MAX_ACK_TIMEOUT
    assert settings["max_unacked"]["maximum"] == rules.MAX_UNACKED


def _grpc(node: NodeProc) -> Any:
    return grpc.insecure_channel(str(node.status()["grpc_addr"]))


def test_the_ack_timeout_rule_on_both_transports(grpc_node: NodeProc) -> None:
    """SPEC: the original accepts ack timeouts from 10 s over gRPC (0: the default), and from
    60 s over HTTP, where an explicit 0 is refused; the state machine accepts what gRPC does.
    A refused request creates nothing."""
    node = grpc_node
    http = node.http()

    def over_http(name: str, seconds: int) -> int:
        return http.post("/API/v1/queues", {"name": name, "type": "delayed",
                                            "settings": {"ack_timeout": seconds}}).status

    assert [over_http(f"h{s}", s) for s in (0, 9, 10, 59)] == [422] * 4
    assert over_http("h60", 60) == 200
    with _grpc(node) as channel:
        stub = pb_grpc.DOQStub(channel)

        def over_grpc(name: str, seconds: int) -> grpc.StatusCode:
            try:
                stub.CreateQueue(pb.CreateQueueRequest(
                    name=name, type="delayed", settings=pb.QueueSettings(ack_timeout=seconds)),
                    timeout=10)
            except grpc.RpcError as exc:
                return exc.code()  # type: ignore[no-any-return]
            return grpc.StatusCode.OK

        assert over_grpc("g9", 9) == grpc.StatusCode.INVALID_ARGUMENT
        assert over_grpc("g10", 10) == grpc.StatusCode.OK
        assert over_grpc("g0", 0) == grpc.StatusCode.OK
        timeouts = {q.name: q.settings.ack_timeout
                    for q in stub.GetQueues(pb.GetQueuesRequest(), timeout=10).queues}
    assert timeouts == {"h60": 60, "g10": 10, "g0": rules.FALLBACK_ACK_TIMEOUT}


def test_queue_names_follow_one_rule_on_both_transports(grpc_node: NodeProc) -> None:
    node = grpc_node
    http = node.http()
    too_long = "n" * (rules.MAX_NAME + 1)
    for name in ("", "a/b", too_long):
        answer = http.post("/API/v1/queues", {"name": name, "type": "delayed"})
        assert answer.status == 422, name[:20]
    with _grpc(node) as channel:
        stub = pb_grpc.DOQStub(channel)
        for name in ("", "a/b", too_long):
            with pytest.raises(grpc.RpcError) as refused:
                stub.CreateQueue(pb.CreateQueueRequest(
                    name=name, type="delayed", settings=pb.QueueSettings()), timeout=10)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        names = {q.name for q in stub.GetQueues(pb.GetQueuesRequest(), timeout=10).queues}
    assert not names & {"", "a/b", too_long}
