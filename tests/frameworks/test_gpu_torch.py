"""GPU timing with the real torch (Sample Factory's venv: torch from PyPI, no GPU here): the
option must be a no-op with one warning, never an error, and otel_rl must never import torch
itself. Where that venv has CUDA, the same program gets GPU time instead."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Callable
from pathlib import Path

from tests.frameworks.conftest import Venv

PROGRAM = textwrap.dedent(
    """
    import json, sys
    import otel_rl
    from otel_rl.timers import hierarchical_timer, get_timer_tree

    otel_rl.configure(output_dir=sys.argv[1], gpu_blocks="forward,back*")
    if sys.argv[2] == "torch":
        import torch
        x = torch.randn(256, 256)
        if torch.cuda.is_available():
            x = x.cuda()
    for _ in range(5):
        with hierarchical_timer("forward"):
            y = x @ x if sys.argv[2] == "torch" else None
        with hierarchical_timer("backward"):
            pass
        with hierarchical_timer("update", gpu=True):
            pass
    otel_rl.shutdown()
    print(json.dumps({"torch_imported": "torch" in sys.modules,
                      "cuda": sys.argv[2] == "torch" and torch.cuda.is_available(),
                      "legacy": get_timer_tree()}))
    """
)


def _run(venv: Venv, tmp_path: Path, mode: str) -> tuple[dict, dict, str]:
    (tmp_path / "prog.py").write_text(PROGRAM)
    out = tmp_path / f"out-{mode}"
    result = venv.run(venv.python, "prog.py", out, mode, cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    return report, json.loads((out / "timers.json").read_text()), result.stderr


def test_gpu_option_with_real_torch_is_a_no_op_with_one_warning_without_cuda(
    venvs: Callable[[str], Venv], tmp_path: Path
) -> None:
    venv = venvs("sf")
    report, tree, stderr = _run(venv, tmp_path, "torch")
    children = tree["children"]
    assert all(children[name]["count"] == 5 for name in ("forward", "backward", "update"))
    assert "gpu_total" not in json.dumps(report["legacy"])  # ML-Agents' own tree: unchanged
    if report["cuda"]:
        assert children["forward"]["gpu_count"] == 5 and children["update"]["gpu_count"] == 5
    else:
        assert stderr.count("CUDA is not available") == 1, stderr
        assert "gpu_total" not in json.dumps(tree)
        assert "Traceback" not in stderr


def test_otel_rl_never_imports_torch_for_the_program(
    venvs: Callable[[str], Venv], tmp_path: Path
) -> None:
    report, tree, stderr = _run(venvs("sf"), tmp_path, "plain")
    assert report["torch_imported"] is False
    assert tree["children"]["forward"]["count"] == 5
    assert stderr.count("torch is not imported") == 1, stderr
