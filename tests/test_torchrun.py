"""torchrun's command line as `otel-rl run` reads it (no torch needed): which runs are
multi-node, the run id from the rendezvous id, which node joins, the ranks' role. The real
torchrun runs are in tests/frameworks/test_torchrun.py."""

from __future__ import annotations

from otel_rl._internal import aggregates, carrier, torchrun

TWO_NODES = ["--nnodes", "2", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
             "--rdzv-endpoint", "localhost:29400", "--rdzv-id", "job 7/a", "train.py", "--lr",
             "3", "--node-rank", "9"]


def test_torchrun_is_recognised_in_its_spellings() -> None:
    assert torchrun.is_torchrun(["torchrun", "train.py"])
    assert torchrun.is_torchrun(["/venv/bin/torchrun", "train.py"])
    assert torchrun.is_torchrun(["python3", "-u", "-m", "torch.distributed.run", "t.py"])
    assert torchrun.is_torchrun(["python", "-m", "torch.distributed.launch", "t.py"])
    assert not torchrun.is_torchrun(["python", "train.py", "-m", "torch.distributed.run"])
    assert not torchrun.is_torchrun(["python", "-m", "torch.utils.bottleneck", "t.py"])
    assert not torchrun.is_torchrun(["mytorchrun", "t.py"])


def test_options_stop_at_the_training_script_and_fall_back_to_pet_variables() -> None:
    argv = ["torchrun", "--node_rank=1", *TWO_NODES]
    # --node-rank 9 belongs to train.py, not to torchrun.
    assert torchrun.options(argv, {}) == {"node_rank": "1", "nnodes": "2", "rdzv_id": "job 7/a"}
    env = {"PET_NNODES": "1:4", "PET_RDZV_ID": "from-env", "PET_NODE_RANK": "2"}
    assert torchrun.options(["torchrun", "--standalone", "t.py"], env) == \
        {"nnodes": "1:4", "rdzv_id": "from-env", "node_rank": "2", "standalone": "1"}
    assert torchrun.training_program(["torchrun", "--nnodes=2", "-m", "pkg.train", "x"]) == \
        ["python", "-m", "pkg.train", "x"]
    assert torchrun.training_program(argv) == ["train.py", "--lr", "3", "--node-rank", "9"]


def test_node_zero_owns_a_run_named_after_the_rendezvous_id() -> None:
    env: dict[str, str] = {}
    assert torchrun.launch_environment(["torchrun", "--node-rank", "0", *TWO_NODES], env) is None
    assert env == {"OTEL_RL_RUN_ID": "torchrun-job_7_a"}
    given = {"OTEL_RL_RUN_ID": "mine"}
    torchrun.launch_environment(["torchrun", "--node-rank", "0", *TWO_NODES], given)
    assert given == {"OTEL_RL_RUN_ID": "mine"}


def test_without_a_node_rank_the_agent_learns_it_from_its_first_rank() -> None:
    """No ``--node-rank`` (c10d ranks the nodes at the rendezvous): the agent starts as the
    run's main process, marked; the first rank's ``GROUP_RANK`` decides, once."""
    env: dict[str, str] = {}
    assert torchrun.launch_environment(["torchrun", *TWO_NODES], env) is None
    assert env == {"OTEL_RL_RUN_ID": "torchrun-job_7_a", torchrun.AUTO_NODE: "1"}
    from otel_rl._internal import runtime
    from otel_rl.testing import capture_spans

    rank = {"RANK": "2", "LOCAL_RANK": "0", "TORCHELASTIC_RUN_ID": "j", "GROUP_RANK": "1"}
    with capture_spans(run_id="torchrun-job_7_a"):
        rt = runtime.active()
        assert rt is not None and not rt.is_worker
        torchrun._decided = False
        try:
            torchrun.on_rank_started(rt, rank, {})  # not marked: nothing changes
            assert not rt.is_worker
            torchrun.on_rank_started(rt, rank, env)
            assert rt.is_worker and (rt.role, rt.index) == ("node", 1)
            assert rt.ctx is not None and rt.ctx.span_id == rt.run_span_id == rt.root_run[1]
            torchrun.on_rank_started(rt, dict(rank, GROUP_RANK="0"), env)  # decided once
            assert (rt.role, rt.index) == ("node", 1)
        finally:
            torchrun._decided = False


def test_another_node_joins_the_run_under_its_derived_run_span() -> None:
    env: dict[str, str] = {}
    argv = ["python", "-m", "torch.distributed.run", "--node-rank", "1", *TWO_NODES]
    assert torchrun.launch_environment(argv, env) == 1
    ctx = carrier.parse(carrier.from_env(env))
    assert ctx is not None and not ctx.external
    run_id = "torchrun-job_7_a"
    assert (ctx.trace_id, ctx.span_id) == (aggregates.run_trace_id(run_id),
                                           aggregates.run_span_id(run_id))
    assert (ctx.role, ctx.index, ctx.run_id, ctx.relay) == ("node", 1, run_id, None)
    # Nothing about the other node's clock: this node measures its own.
    assert ctx.offset_ns is None and ctx.t0_ns is None


def test_single_node_and_standalone_runs_keep_their_own_run_id() -> None:
    for argv in (["torchrun", "--nproc-per-node", "2", "train.py"],
                 ["torchrun", "--standalone", "--nnodes", "2", "--rdzv-id", "j", "t.py"],
                 ["torchrun", "--nnodes", "1", "--rdzv-id", "j", "t.py"],
                 ["torchrun", "--nnodes", "2", "t.py"],  # rdzv id "none": nothing to share
                 ["python", "train.py", "--nnodes", "2", "--rdzv-id", "j"]):
        env: dict[str, str] = {}
        assert torchrun.launch_environment(argv, env) is None
        assert env == {}, argv


def test_a_rank_is_started_by_the_agent_not_by_a_rank() -> None:
    rank_env = {"RANK": "3", "LOCAL_RANK": "1", "TORCHELASTIC_RUN_ID": "j", "PATH": "/bin"}
    assert torchrun.child_role(rank_env, environ={}) == ("rank", 3)
    assert torchrun.child_role(rank_env, environ={"LOCAL_RANK": "1"}) is None
    assert torchrun.child_role({"RANK": "3", "LOCAL_RANK": "1"}, environ={}) is None
