"""The tree model and timers.json I/O, with ML-Agents' own timers as the oracle."""

from __future__ import annotations

import copyreg
import io
import json
import math
import os
import pickle
import random
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from mlagents_envs import timers as ml

from otel_rl._internal import recorder
from otel_rl._internal.errors import UserError
from otel_rl._internal.tree import Gauge, Tree, TreeNode, WorkerInfo


def _mlagents_workload() -> ml.TimerStack:
    """A real ML-Agents timer stack: nesting, repeats, gauges, metadata, a merged worker."""
    stack = ml.TimerStack()
    for i in range(3):
        with ml.hierarchical_timer("env_step", stack):
            with ml.hierarchical_timer("communicator.exchange", stack):
                sum(range(200))
            if i % 2 == 0:
                with ml.hierarchical_timer("process_trajectory", stack):
                    sum(range(100))
    ml.set_gauge("reward.mean", 1.5, stack)
    ml.set_gauge("reward.mean", -0.25, stack)
    ml.set_gauge("steps", 7, stack)
    ml.add_metadata("run_id", "ppo-1", stack)
    worker = ml.TimerStack()
    with ml.hierarchical_timer("trainer_advance", worker):
        with ml.hierarchical_timer("update_policy", worker):
            sum(range(300))
    # What ML-Agents' trainer threads do with their stacks.
    stack.root.get_child("env_step").merge(worker.root, root_name="thread_root", is_parallel=True)
    return stack


def test_mlagents_timer_tree_round_trips_exactly() -> None:
    original = ml.get_timer_tree(_mlagents_workload())
    rebuilt = Tree.from_dict(original).to_dict()
    assert rebuilt == original
    # Same key order everywhere, recursively (json text compares order).
    assert json.dumps(rebuilt) == json.dumps(original)


def test_mlagents_tree_round_trips_through_json_text() -> None:
    original = ml.get_timer_tree(_mlagents_workload())
    text = Tree.from_dict(original).to_json()
    assert json.loads(text) == original
    assert Tree.from_json(text).to_dict() == original
    assert text.startswith('{\n  "name": "root"')


def test_parallel_flag_read_from_mlagents_tree() -> None:
    tree = Tree.from_dict(ml.get_timer_tree(_mlagents_workload()))
    thread_root = tree.find(["env_step", "thread_root"])
    assert thread_root is not None and thread_root.is_parallel
    update = tree.find(["env_step", "thread_root", "trainer_advance", "update_policy"])
    assert update is not None and update.is_parallel and update.count == 1
    exchange = tree.find(["env_step", "communicator.exchange"])
    assert exchange is not None and not exchange.is_parallel and exchange.count == 3


def test_self_time_is_total_minus_children_and_never_negative() -> None:
    node = TreeNode("a", total=1.0, count=1)
    node.child("b").add(0.25)
    node.child("c").add(0.5)
    assert node.self_time == pytest.approx(0.25)
    parallel = TreeNode("p", total=1.0, count=1)
    parallel.child("x").add(3.0)
    assert parallel.self_time == 0.0


def test_self_is_recomputed_on_read_not_trusted() -> None:
    data = {
        "name": "root",
        "total": 2.0,
        "count": 1,
        "self": 99.0,
        "children": {"a": {"total": 0.5, "count": 2, "self": -4}},
    }
    out = Tree.from_dict(data).to_dict()
    assert out["self"] == 1.5
    assert out["children"]["a"]["self"] == 0.5


def test_unknown_keys_are_ignored_and_optional_keys_default() -> None:
    data = {
        "name": "root",
        "total": 1.0,
        "count": 1,
        "format": "from-the-future",
        "children": {"a": {"total": 0.5, "count": 1, "colour": "red"}},
    }
    tree = Tree.from_dict(data)
    assert tree.gauges == {} and tree.metadata == {} and tree.workers == []
    assert tree.complete and tree.notes == []
    assert tree.to_dict() == {
        "name": "root",
        "total": 1.0,
        "count": 1,
        "self": 0.5,
        "children": {"a": {"total": 0.5, "count": 1, "self": 0.5}},
    }


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([1, 2], "root: expected a JSON object, got a list"),
        ({"count": 1}, "root: 'total' must be a number"),
        ({"total": "1.0", "count": 1}, "root: 'total' must be a number"),
        ({"total": True, "count": 1}, "root: 'total' must be a number"),
        ({"total": -1.0, "count": 1}, "root: 'total' must be a finite, non-negative number"),
        ({"total": math.nan, "count": 1}, "root: 'total' must be a finite, non-negative number"),
        ({"total": 1.0}, "root: 'count' must be an integer"),
        ({"total": 1.0, "count": 1.5}, "root: 'count' must be an integer"),
        ({"total": 1.0, "count": 1, "children": []}, "root.children: expected an object"),
        (
            {"total": 1.0, "count": 1, "children": {"advance": {"total": 1.0, "count": "3"}}},
            "root.children.advance: 'count' must be an integer",
        ),
        (
            {
                "total": 1.0,
                "count": 1,
                "children": {"a": {"total": 1.0, "count": 1, "children": {"b": 7}}},
            },
            "root.children.a.children.b: expected an object, got a number",
        ),
        (
            {
                "total": 1.0,
                "count": 1,
                "children": {"a": {"total": 1, "count": 1, "is_parallel": 1}},
            },
            "root.children.a: 'is_parallel' must be true or false",
        ),
        ({"total": 1.0, "count": 1, "gauges": {"g": {"min": 1}}}, "root.gauges.g: 'value'"),
        ({"total": 1.0, "count": 1, "metadata": ["x"]}, "root.metadata: expected an object"),
        ({"total": 1.0, "count": 1, "workers": [{"role": "w"}]}, "root.workers[0].tree"),
        ({"total": 1.0, "count": 1, "name": 3}, "root: 'name' must be a string"),
    ],
)
def test_not_mlagents_schema_is_a_one_line_user_error(data: object, message: str) -> None:
    with pytest.raises(UserError) as info:
        Tree.from_dict(data)
    assert str(info.value).startswith(message)
    assert "\n" not in str(info.value)


def test_invalid_json_text_is_a_one_line_user_error() -> None:
    with pytest.raises(UserError, match=r"^not a timers.json: invalid JSON \(") as info:
        Tree.from_json('{"name": "root", "total": 1.0,\n "count": ')
    assert "\n" not in str(info.value)


def test_metadata_scalars_from_other_writers_read_as_text() -> None:
    tree = Tree.from_dict({"total": 1.0, "count": 1, "metadata": {"a": "x", "n": 3, "b": True}})
    assert tree.metadata == {"a": "x", "n": "3", "b": "true"}


def test_merge_matches_mlagents_timernode_merge() -> None:
    main, other = ml.TimerStack(), ml.TimerStack()
    for stack, names in ((main, ("a", "b")), (other, ("b", "c"))):
        for name in names:
            with ml.hierarchical_timer("loop", stack):
                with ml.hierarchical_timer(name, stack):
                    sum(range(50))
    ours = Tree.from_dict(ml.get_timer_tree(main))
    ours.merge(Tree.from_dict(ml.get_timer_tree(other)).root.children["loop"], path=["loop", "w"])
    main.root.get_child("loop").merge(other.root.get_child("loop"), root_name="w")
    expected = ml.get_timer_tree(main)["children"]
    assert ours.to_dict()["children"] == expected
    merged = ours.find(["loop", "w"])
    assert merged is not None and merged.is_parallel
    assert all(node.is_parallel for _, node in merged.walk())
    assert not ours.root.children["loop"].is_parallel


def test_merge_of_trees_combines_gauges_metadata_workers_and_notes() -> None:
    left = Tree(gauges={"g": Gauge(1.0, 0.5, 2.0, 3)}, metadata={"run": "a"})
    left.root.add(1.0)
    right = Tree(
        gauges={"g": Gauge(5.0, 5.0, 5.0, 1), "h": Gauge(1, 1, 1)},
        metadata={"run": "b", "host": "x"},
        workers=[WorkerInfo("env", 0, 42, ["step"], TreeNode("env"))],
        complete=False,
        notes=["cut"],
    )
    right.root.add(2.0)
    right.root.child("step").add(0.5)
    left.merge(right, path=["remote"], is_parallel=False)
    assert left.gauges["g"] == Gauge(5.0, 0.5, 5.0, 4)
    assert left.gauges["h"] == Gauge(1, 1, 1, 1)
    assert left.metadata == {"run": "a", "host": "x"}
    assert left.workers[0].path == ["remote", "step"]
    assert not left.complete and left.notes == ["cut"]
    remote = left.find(["remote"])
    assert remote is not None and remote.total == 2.0 and not remote.is_parallel
    assert left.find(["remote", "step"]) == TreeNode("step", 0.5, 1)


def test_find_returns_node_at_path_or_none() -> None:
    tree = Tree()
    tree.root.child("a").child("b").add(1.0)
    assert tree.find(()) is tree.root
    found = tree.find(["a", "b"])
    assert found is not None and found.total == 1.0
    assert tree.find(["a", "x"]) is None
    assert tree.find(["b"]) is None


def test_workers_and_incompleteness_are_written_after_children_and_read_back() -> None:
    tree = Tree(complete=False, notes=["3 spans lost"])
    tree.root.add(2.0)
    tree.root.child("step").add(1.0)
    worker_node = TreeNode("env")
    worker_node.child("reset").add(0.25, 2)
    tree.workers.append(WorkerInfo("env", 1, 4242, ["step"], worker_node))
    data = tree.to_dict()
    assert list(data) == [
        "name",
        "total",
        "count",
        "self",
        "children",
        "workers",
        "complete",
        "notes",
    ]
    assert data["workers"] == [
        {
            "role": "env",
            "index": 1,
            "pid": 4242,
            "path": ["step"],
            "tree": {
                "total": 0.0,
                "count": 0,
                "self": 0.0,
                "children": {"reset": {"total": 0.25, "count": 2, "self": 0.25}},
            },
        }
    ]
    back = Tree.from_json(tree.to_json())
    assert back.to_dict() == data
    assert not back.complete and back.notes == ["3 spans lost"]
    assert back.workers[0].node.children["reset"].count == 2


def test_complete_tree_has_no_otel_rl_completeness_keys() -> None:
    tree = Tree()
    tree.root.add(1.0)
    assert "complete" not in tree.to_dict() and "notes" not in tree.to_dict()


def test_gauge_and_metadata_come_before_total_like_mlagents() -> None:
    tree = Tree(gauges={"g": Gauge(1.0, 1.0, 1.0)}, metadata={"k": "v"})
    assert list(tree.to_dict()) == ["name", "gauges", "metadata", "total", "count", "self"]
    assert list(tree.to_dict()["gauges"]["g"]) == ["value", "min", "max", "count"]


def test_tree_arithmetic_is_node_methods_merge_lift_subtract() -> None:
    # The whole-run view's arithmetic on the one node type: place a subtree (merge_children),
    # move a forked child's blocks up out of the blocks open at the fork (lifted), and take
    # workers' blocks back out (subtract_children).
    child = TreeNode("root")
    child.child("train").add(0.0, 1)  # the parent's block, open at the fork
    child.child("train").child("rollout").add(2.0, 4)
    child.child("train").child("rollout").child("step").add(1.0, 40)
    child.child("after").add(0.5, 1)  # a plain os.fork() child returning from `train`
    lifted = child.lifted(["train"])
    assert set(lifted.children) == {"after", "rollout"}
    assert lifted.children["rollout"].children["step"].count == 40
    assert "train" not in child.children  # taken out of the tree it was lifted from

    run = TreeNode("root")
    run.child("train").add(10.0, 1)
    run.child("train").merge_children(lifted, is_parallel=True)
    rollout = run.children["train"].children["rollout"]
    assert (rollout.total, rollout.count, rollout.is_parallel) == (2.0, 4, True)
    assert not run.children["train"].is_parallel  # the host node keeps its own flag

    run.children["train"].subtract_children(lifted)
    assert run.children["train"].children == {}  # nothing of the worker's blocks is left
    assert run.children["train"].total == 10.0


def test_merge_children_on_live_timer_nodes_is_the_plain_sum() -> None:
    # A live stack's nodes are `TimerNode`s, whose own `merge` is ML-Agents' (counted as
    # merged in, no GPU time): placing a subtree must not take that one.
    from otel_rl._internal.recorder import TimerNode

    source = TimerNode("root")
    node = source.get_child("forward")
    node.add_time(0.5)
    node.gpu_total, node.gpu_count = 0.25, 1
    into = TimerNode("root")
    into.merge_children(source)
    placed = into.children["forward"]
    assert (placed.total, placed.count, placed.gpu_total, placed.gpu_count) == (0.5, 1, 0.25, 1)
    assert (placed.merged_total, placed.merged_count) == (0.0, 0)
    own = TimerNode("root")
    into.add_own_to(own)
    assert own.children["forward"].count == 1


def _live_tree(rng: random.Random) -> recorder.TimerNode:
    """A live stack's root as ML-Agents programs leave it: blocks run or only entered (count
    0), subtrees merged in from other stacks (merged totals and counts), GPU time."""
    root = recorder.TimerNode("root")
    nodes = [root]
    for _ in range(rng.randrange(1, 25)):
        parent = rng.choice(nodes)
        node = parent.get_child(rng.choice("abcde"))
        if node not in nodes:
            nodes.append(node)
        if rng.random() < 0.7:
            node.add_time(rng.random())
        if rng.random() < 0.2:
            node.gpu_total += rng.random()
            node.gpu_count += 1
        if rng.random() < 0.25:
            other = _live_tree(rng) if rng.random() < 0.3 else recorder.TimerNode("root")
            other.get_child(rng.choice("abx")).add_time(rng.random())
            node.merge(other, root_name=rng.choice([None, "worker_root"]),
                       is_parallel=rng.random() < 0.5)
    return root


def _shape(node: TreeNode) -> list[Any]:
    return [node.name, node.total, node.count, node.gpu_total, node.gpu_count, node.is_parallel,
            [_shape(child) for child in node.children.values()]]


def _own_part(node: recorder.TimerNode) -> TreeNode | None:
    """The reference, by definition: `node` less what `merge` brought in, kept where it has
    runs of its own or something below it has; None when nothing is left."""
    kept = [part for part in map(_own_part, node.children.values()) if part is not None]
    count = node.count - node.merged_count
    if count <= 0 and not kept:
        return None
    return TreeNode(node.name, max(0.0, node.total - node.merged_total), max(0, count), False,
                    {part.name: part for part in kept}, node.gpu_total, node.gpu_count)


@pytest.mark.parametrize("seed", range(300))
def test_adding_a_live_trees_own_part_in_place(seed: int) -> None:
    # `reset_timers` adds a stack's own blocks to what it retired, in place: the same tree,
    # node order and floats as adding the reference's own part with the plain merge, on trees
    # with merged-in subtrees, blocks entered but never run, GPU time, and a retired tree that
    # already holds some of the same blocks.
    live = _live_tree(random.Random(seed))
    expected = _live_tree(random.Random(seed + 1000))
    actual = _live_tree(random.Random(seed + 1000))
    reference = TreeNode("root", children={})
    for part in filter(None, map(_own_part, live.children.values())):
        reference.children[part.name] = part
    expected.merge_children(reference)
    live.add_own_to(actual)
    assert _shape(actual) == _shape(expected)
    assert [(n.merged_total, n.merged_count) for _, n in actual.walk()] == [
        (n.merged_total, n.merged_count) for _, n in expected.walk()]


def test_a_live_node_pickles_whole_and_older_pickles_still_load() -> None:
    # ML-Agents' env workers pickle their stack's root to the parent every step; the parent
    # merges it and places the worker's blocks by its `origin`.
    root = _live_tree(random.Random(7))
    root.origin = (4242, 17)
    back = pickle.loads(pickle.dumps(root))
    assert type(back) is recorder.TimerNode and back.origin == (4242, 17)
    assert _shape(back) == _shape(root)
    assert [(n.merged_total, n.merged_count) for _, n in back.walk()] == [
        (n.merged_total, n.merged_count) for _, n in root.walk()]

    class OldPickler(pickle.Pickler):  # the default form of a slotted object, as before
        def reducer_override(self, obj: Any) -> Any:
            if type(obj) is not recorder.TimerNode:
                return NotImplemented
            slots = ("children", "count", "gpu_count", "gpu_total", "is_parallel", "name",
                     "total", "merged_count", "merged_total", "origin")
            return copyreg.__newobj__, (type(obj),), (None, {k: getattr(obj, k) for k in slots})

    buffer = io.BytesIO()
    OldPickler(buffer, protocol=4).dump(root)
    old = pickle.loads(buffer.getvalue())
    assert _shape(old) == _shape(root) and old.origin == (4242, 17)


def _eager_contribution(roots: list[recorder.TimerNode],
                        live: recorder.TimerNode) -> recorder.TimerNode:
    """The whole run of a stack that retired `roots` and now holds `live`, each root added to
    the retired tree at its reset (what `reset_timers` did before roots were queued)."""
    retired = recorder.TimerNode("root")
    for root in roots:
        root.add_own_to(retired)
    result = recorder.TimerNode("root")
    result.merge_children(retired)
    live.add_own_to(result)
    return result


@pytest.mark.parametrize("seed", range(4))
def test_queued_resets_give_the_whole_run_of_resets_retired_at_once(seed: int) -> None:
    # An ML-Agents env worker resets every step: its old roots wait in a queue and are added
    # to the retired tree in batches. Read before, at and after each batch, and with fewer
    # than a batch waiting, the whole run is the same tree, order and floats as adding each
    # root at its reset, with what `merge` brought in left out.
    rng = random.Random(seed)
    stack = recorder.TimerStack()
    roots: list[recorder.TimerNode] = []
    checks = {1, 5, recorder.SETTLE_AT - 1, recorder.SETTLE_AT, recorder.SETTLE_AT + 1,
              2 * recorder.SETTLE_AT + 3}
    for step in range(1, 2 * recorder.SETTLE_AT + 4):
        stack.root = _live_tree(rng)
        roots.append(stack.root)
        stack.reset()
        assert not stack.root.children
        if step in checks or rng.random() < 0.02:
            stack.root = _live_tree(rng)
            expected = _eager_contribution(roots, stack.root)
            assert _shape(recorder.stack_contribution(stack)) == _shape(expected)
            assert not stack.unretired  # a read settles the queue
    assert len(stack.unretired) < recorder.SETTLE_AT


def test_a_reader_thread_and_the_resetting_thread_count_each_root_once() -> None:
    # Flush threads read a worker's whole run while the worker's main thread resets: each
    # queued root is added to the retired tree exactly once, whoever adds it.
    stack = recorder.TimerStack()
    done = threading.Event()
    reads = 0

    def read() -> None:
        nonlocal reads
        while not done.is_set():
            recorder.stack_contribution(stack)
            reads += 1

    steps = 16 * recorder.SETTLE_AT + 11
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    readers = [threading.Thread(target=read) for _ in range(2)]  # (two add at once, unlocked)
    for reader in readers:
        reader.start()
    try:
        for _ in range(steps):
            stack.root.get_child("step").add_time(0.25)
            stack.root.get_child("step").get_child("inner").add_time(0.125)
            stack.reset()
    finally:
        done.set()
        for reader in readers:
            reader.join()
        sys.setswitchinterval(interval)
    whole = recorder.stack_contribution(stack).children["step"]
    assert reads > 0
    assert (whole.count, whole.total) == (steps, steps * 0.25)
    assert (whole.children["inner"].count, whole.children["inner"].total) == (steps,
                                                                               steps * 0.125)


_WORKER_LOOP = """
import gc, sys
if sys.argv[1] == "mlagents":
    from mlagents_envs import timers
else:
    from otel_rl import timers
gc.set_threshold(700, 10, 10)  # CPython's default before 3.13 (which starts young ones later)
gc.collect()
before = gc.get_stats()[0]["collections"]
responses = []
for _ in range(30000):  # ML-Agents' env worker, one step each
    with timers.hierarchical_timer("env_step"):
        pass
    responses.append(timers.get_timer_root())  # its response, until the feeder sends it
    if len(responses) > 2:
        responses.pop(0)
    timers.reset_timers()
print(gc.get_stats()[0]["collections"] - before)
"""


def test_an_env_workers_resets_leave_the_collector_no_more_work_than_mlagents_own() -> None:
    # Queued roots must die young: a queue that outlives the young collections makes an env
    # worker collect more often, and promotes roots into the oldest generation, whose full
    # collections walk the whole heap the worker inherited from the trainer.
    def young_collections(timers: str) -> int:
        done = subprocess.run(
            [sys.executable, "-c", _WORKER_LOOP, timers], capture_output=True, text=True,
            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
            timeout=120, check=True)
        return int(done.stdout)

    assert young_collections("otel_rl") <= young_collections("mlagents")
